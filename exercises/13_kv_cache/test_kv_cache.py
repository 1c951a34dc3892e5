"""The checks of exercise 13. Run them with `python -m exercises check kv_cache`."""
import re

import numpy as np

import microtensor as mt
import microtensor.functional as F
from microtensor.errors import InputError
from exercises.checking import CheckFailed, expect, expect_close, expect_equal, expect_raises

B, T, C, H = 2, 6, 8, 2  # batch, positions, width, heads (D = 4)


def sequence(seed, length=T, dtype=np.float64):
    return np.random.default_rng(seed).normal(size=(B, length, C)).astype(dtype)


def full_forward(attention, x):
    """The whole sequence at once, without a cache: the module's projections around microtensor's
    F.scaled_dot_product_attention (causal). The reference every cached run must equal."""
    q, k, v = attention.project(x)
    y = F.scaled_dot_product_attention(mt.tensor(q), mt.tensor(k), mt.tensor(v), causal=True).numpy()
    return attention.merge(y)


def run_cached(impl, attention, x, chunks, capacity=T):
    """Feed x (B, T, C) through a fresh cache in chunks of the given sizes; the outputs side by side."""
    cached = impl.CachedSelfAttention(attention, B, capacity, dtype=x.dtype)
    outputs, start = [], 0
    for size in chunks:
        outputs.append(cached.step(x[:, start : start + size]))
        start += size
    return np.concatenate(outputs, axis=1), cached


def test_attend_masks_new_queries_at_their_positions(impl):
    """attend: 3 new queries over 5 cached keys each see the keys up to their own position"""
    rng = np.random.default_rng(5)
    q, keys, values = rng.normal(size=(B, H, 3, 4)), rng.normal(size=(B, H, 5, 4)), rng.normal(size=(B, H, 5, 4))
    expected = F.scaled_dot_product_attention(mt.tensor(q), mt.tensor(keys), mt.tensor(values), causal=True).numpy()
    yours = impl.attend(q, keys, values)
    expect(np.shape(yours) == (B, H, 3, 4), f"attend: yours has shape {np.shape(yours)}, expected {(B, H, 3, 4)} (B, H, Tn, D)")
    reference = "F.scaled_dot_product_attention with Tq = 3, Tk = 5"
    for i in range(3):
        what = f"attend's output for new query {i} (at position {2 + i}, seeing keys 0..{2 + i})"
        expect_close(what, yours[:, :, i], expected[:, :, i], reference, atol=1e-10)


def test_one_token_at_a_time_equals_full_forward(impl):
    """one token per step, through the cache, equals one full causal forward (to 1e-10)"""
    attention = impl.SelfAttention(C, H, seed=1)
    x = sequence(seed=2)
    cached, _ = run_cached(impl, attention, x, [1] * T)
    expected = full_forward(attention, x)
    reference = "one full forward with F.scaled_dot_product_attention"
    expect_close(f"the outputs (B, T, C) = {(B, T, C)}, one token per step", cached, expected, reference, atol=1e-10)


def test_prefill_then_steps_equals_full_forward(impl):
    """a prompt of 3 tokens at once (prefill), then one token per step, equals the full forward"""
    attention = impl.SelfAttention(C, H, seed=3)
    x = sequence(seed=4)
    cached, _ = run_cached(impl, attention, x, [3, 1, 1, 1])
    expected = full_forward(attention, x)
    reference = "one full forward with F.scaled_dot_product_attention"
    expect_close("the outputs after a prefill of 3, then 3 single steps", cached, expected, reference, atol=1e-10)


def test_cache_grows_by_one_per_step(impl):
    """the cache's length grows by one per step, and it holds each position's keys and values"""
    attention = impl.SelfAttention(C, H, seed=6)
    x = sequence(seed=7)
    cached = impl.CachedSelfAttention(attention, B, T, dtype=x.dtype)
    expect_equal("the cache's length before any step", cached.cache.length, 0, "an empty cache")
    for t in range(T):
        cached.step(x[:, t : t + 1])
        expect_equal(f"the cache's length after step {t + 1}", cached.cache.length, t + 1, "one position per step")
    _, k, v = attention.project(x)  # (B, H, T, D): every position's keys and values
    expect_close("cache.keys (B, H, T, D) after T steps", cached.cache.keys, k, "the projections of all T tokens")
    expect_close("cache.values (B, H, T, D) after T steps", cached.cache.values, v, "the projections of all T tokens")
    cache = impl.KVCache(B, H, 4, 4)
    keys, values = cache.append(k[:, :, :3], v[:, :, :3])
    expect(
        np.shape(keys) == (B, H, 3, 4) and np.shape(values) == (B, H, 3, 4),
        f"KVCache.append returns the keys and values so far, (B, H, length, D) = {(B, H, 3, 4)}; "
        f"yours have shapes {np.shape(keys)} and {np.shape(values)}",
    )


def test_full_cache_refuses_more_and_says_why(impl):
    """appending past the capacity raises InputError naming the op and the sizes, and changes nothing"""
    rng = np.random.default_rng(8)
    cache = impl.KVCache(1, H, 5, 2)  # capacity 5, D = 2
    k, v = rng.normal(size=(1, H, 3, 2)), rng.normal(size=(1, H, 3, 2))
    cache.append(k, v)  # 3 of 5 positions used
    keys_before, values_before = cache.keys.copy(), cache.values.copy()
    more = rng.normal(size=(1, H, 4, 2))
    error = expect_raises("KVCache.append of 4 positions after 3, capacity 5", InputError, cache.append, more, more)
    named = (("the new positions (4)", 4), ("the cached length (3)", 3), ("the capacity (5)", 5))
    missing = [what for what, n in named if not re.search(rf"\b{n}\b", str(error))]
    missing = (["the op (append)"] if "append" not in str(error).lower() else []) + missing
    if missing:
        raise CheckFailed(f"the error says {str(error)!r}; it should name {', '.join(missing)}")
    expect_equal("the cache's length after the refused append", cache.length, 3, "the length before it")
    expect_equal("cache.keys after the refused append", cache.keys, keys_before, "the keys before it (check before writing)")
    expect_equal("cache.values after the refused append", cache.values, values_before, "the values before it (check before writing)")
    cache.append(k[:, :, :2], v[:, :, :2])  # exactly fills the cache: allowed
    expect_equal("the cache's length after filling it exactly", cache.length, 5, "its capacity")


def test_reset_starts_a_new_sequence(impl):
    """after reset the cache is empty, and a new sequence gives what a fresh cache gives"""
    attention = impl.SelfAttention(C, H, seed=9)
    first, second = sequence(seed=10), sequence(seed=11, length=4)
    _, cached = run_cached(impl, attention, first, [2, 1, 1, 1, 1])
    cached.cache.reset()
    expect_equal("the cache's length after reset", cached.cache.length, 0, "an empty cache")
    outputs = np.concatenate([cached.step(second[:, t : t + 1]) for t in range(4)], axis=1)
    expected = full_forward(attention, second)
    expect_close("the outputs of a second sequence after reset", outputs, expected, "its full forward", atol=1e-10)


def test_float32_stays_float32(impl):
    """in float32 the outputs stay float32 (no float64 scalar crept in) and equal the full forward's"""
    attention = impl.SelfAttention(C, H, seed=12, dtype=np.float32)
    x = sequence(seed=13, dtype=np.float32)
    cached, state = run_cached(impl, attention, x, [2, 1, 1, 1, 1])
    expect(state.cache.keys.dtype == np.float32, f"the cache's keys are {state.cache.keys.dtype}; expected float32")
    expected = full_forward(attention, x)  # float32 throughout
    expect_close("the outputs in float32", cached, expected, "the full forward in float32", atol=1e-5, rtol=1e-4)
