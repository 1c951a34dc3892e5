"""The checks of exercise 14. Run them with `python -m exercises check online_attention`."""
import math
import tracemalloc

import numba
import numpy as np

import microtensor as mt
import microtensor.functional as F
from exercises.checking import CheckFailed, CheckSkipped, expect, expect_close, float64_arithmetic, gradcheck, random_tensor

SHAPE = (1, 2, 5, 4)  # (B, H, T, D): T = 5, so tiles of 2 and 3 leave a shorter last tile
TILES = (1, 2, 3, 5, 8)  # one key per tile, tiles that do not divide T, one tile, a tile longer than T


def inputs(seed, shape=SHAPE, dtype=np.float64, size=2.0):
    return [random_tensor(shape, seed=seed + n, dtype=dtype, low=-size, high=size) for n in range(3)]


def standard_attention(q, k, v, causal):
    """microtensor's own F.scaled_dot_product_attention: all of P at once, the reference."""
    return F.scaled_dot_product_attention(q, k, v, causal=causal)


def numpy_scores(q, k, causal):
    """S (B, H, T, T) = q kᵀ / √D in numpy, -inf where a causal query may not look."""
    T, D = q.shape[-2], q.shape[-1]
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(D)
    return np.where(np.tril(np.ones((T, T), dtype=bool)), scores, -np.inf) if causal else scores


def numpy_log_sum_exp(q, k, causal):
    """L (B, H, T) = log sum_j e^(S_ij) over the keys each row sees, in numpy."""
    scores = numpy_scores(q, k, causal)
    row_max = scores.max(axis=-1, keepdims=True)
    return (row_max + np.log(np.exp(scores - row_max).sum(axis=-1, keepdims=True)))[..., 0]


def run_kernel(impl, q, k, v, causal, tile):
    """The student's forward kernel called directly: (out, log_sum_exp)."""
    B, H, T, D = q.shape
    out, log_sum_exp = np.empty(q.shape, dtype=q.dtype), np.empty((B, H, T), dtype=q.dtype)
    impl.online_attention_forward(q, k, v, q.dtype.type(1 / math.sqrt(D)), causal, tile, out, log_sum_exp)
    return out, log_sum_exp


def test_log_sum_exp_is_saved(impl):
    """the kernel's L = m + log ℓ equals log sum_j e^(S_ij) of each row (causal and not)"""
    q, k, v = (t.numpy() for t in inputs(seed=7))
    for causal in (True, False):
        expected = numpy_log_sum_exp(q, k, causal)
        row_max = numpy_scores(q, k, causal).max(axis=-1)  # (B, H, T): m once every key is seen
        for tile in (1, 2, 3):
            _, log_sum_exp = run_kernel(impl, q, k, v, causal, tile)
            what = f"log_sum_exp {log_sum_exp.shape}, {'causal' if causal else 'non-causal'}, tile {tile}"
            expect(
                not np.allclose(log_sum_exp, expected - row_max),
                f"{what} equals log ℓ: ℓ sums e^(S_ij - m), so log sum_j e^(S_ij) = m + log ℓ",
            )
            expect_close(what, log_sum_exp, expected, "log sum_j e^(S_ij) in numpy")


def test_accumulator_is_rescaled(impl):
    """the output accumulator acc is rescaled by e^(m - m_new) whenever the running max grows"""
    # Judged only where it alone can be wrong: O right with one tile (no rescale happens) and m, ℓ right.
    q, k, v = (t.numpy() for t in inputs(seed=29))
    T = q.shape[-2]
    for causal in (True, False):
        expected = standard_attention(mt.tensor(q), mt.tensor(k), mt.tensor(v), causal=causal).numpy()
        log_sum_exp_expected = numpy_log_sum_exp(q, k, causal)
        one_tile, _ = run_kernel(impl, q, k, v, causal, T)  # no rescale ever happens: m starts at -inf
        if not np.allclose(one_tile, expected):
            return  # the tile's own terms or the division are wrong: the O checks name that
        for tile in (1, 2):
            out, log_sum_exp = run_kernel(impl, q, k, v, causal, tile)
            if not np.allclose(log_sum_exp, log_sum_exp_expected):
                return  # m or ℓ is wrong: the L check names that
            # Right with one tile, and m and ℓ right with several: what is left between tiles is acc.
            expect(
                np.allclose(out, expected),
                f"{'causal' if causal else 'non-causal'} O {q.shape} is right with one tile (tile = T = {T}) but wrong "
                f"with tile {tile}, while L, so m and ℓ, is right: the output accumulator acc (out's row) must be "
                "rescaled by e^(m - m_new) each time the max grows, as ℓ is, before the tile's terms are added",
            )


def test_causal_output_matches_standard_attention(impl):
    """causal: O equals F.scaled_dot_product_attention for tiles of 1, 2, 3, 5 and 8 keys (T = 5)"""
    q, k, v = inputs(seed=1)
    expected = standard_attention(q, k, v, causal=True)
    for tile in TILES:
        yours = impl.online_attention(q, k, v, causal=True, tile=tile)
        expect_close(f"causal O {SHAPE} with tile {tile}", yours, expected, "F.scaled_dot_product_attention")


def test_non_causal_output_matches_standard_attention(impl):
    """non-causal: O equals F.scaled_dot_product_attention for tiles of 1, 2, 3, 5 and 8 keys"""
    q, k, v = inputs(seed=4)
    expected = standard_attention(q, k, v, causal=False)
    for tile in TILES:
        yours = impl.online_attention(q, k, v, causal=False, tile=tile)
        expect_close(f"non-causal O {SHAPE} with tile {tile}", yours, expected, "F.scaled_dot_product_attention(causal=False)")


def test_gradcheck_through_the_given_backward(impl):
    """gradcheck: dq, dk, dv through the given backward, which reads your O and L (P = e^(S - L), D_i = dO_i · O_i)"""
    q, k, v = inputs(seed=10, shape=(1, 2, 4, 3))
    gradcheck(lambda q, k, v: impl.online_attention(q, k, v, causal=True, tile=3), [q, k, v])
    q, k, v = inputs(seed=13, shape=(1, 1, 3, 2))
    gradcheck(lambda q, k, v: impl.online_attention(q, k, v, causal=False, tile=2), [q, k, v])


def test_kernel_scratch_is_one_tile(impl):
    """your kernel holds no T × T array: its scratch stays below T² / 2 numbers (measured as plain Python, T = 32)"""
    if not numba.config.DISABLE_JIT:
        raise CheckSkipped("it measures the arrays numpy allocates, which only the plain-Python run shows")
    B, H, T, D = 1, 1, 32, 2
    q, k, v = (t.numpy() for t in inputs(seed=16, shape=(B, H, T, D)))
    out, log_sum_exp = np.empty(q.shape, dtype=q.dtype), np.empty((B, H, T), dtype=q.dtype)
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    try:
        impl.online_attention_forward(q, k, v, q.dtype.type(1 / math.sqrt(D)), True, 3, out, log_sum_exp)
        peak = tracemalloc.get_traced_memory()[1] - before  # the most bytes the kernel held at once
    finally:
        if not tracing:
            tracemalloc.stop()
    square = T * T * q.itemsize
    expect(
        peak < square // 2,
        f"with T = {T} and tile 3, your kernel held {peak} bytes of new arrays at once, at least half of a T × T "
        f"array ({square} bytes): keep one tile of scores, np.empty(tile, dtype=q.dtype), m and ℓ as numbers, "
        "and acc in out's own row",
    )


def test_large_scores_do_not_overflow(impl):
    """scores above 1000 (e^S overflows float64): O and L are still finite and right"""
    q, k, v = (t.numpy() for t in inputs(seed=17, size=40.0))  # S up to about 1200: e^S is inf
    for causal, tile in ((True, 1), (False, 2)):
        out, log_sum_exp = run_kernel(impl, q, k, v, causal, tile)
        bad = int((~np.isfinite(out)).sum() + (~np.isfinite(log_sum_exp)).sum())
        if bad:
            largest = np.abs(numpy_log_sum_exp(q, k, causal)).max()
            raise CheckFailed(
                f"{bad} values of O and L are inf or NaN, with scores up to about {largest:.0f}: take e^x only of "
                "S - m, with m_new = max(m, the tile's max), so that every exponent, e^(m - m_new) included, is <= 0"
            )
        expected = standard_attention(mt.tensor(q), mt.tensor(k), mt.tensor(v), causal=causal).numpy()
        expect_close(f"O with large scores, tile {tile}", out, expected, "F.scaled_dot_product_attention", atol=1e-9)
        expect_close(f"L with large scores, tile {tile}", log_sum_exp, numpy_log_sum_exp(q, k, causal), "numpy", atol=1e-9)


def test_float32_matches_standard_attention(impl):
    """in float32, O and L match F.scaled_dot_product_attention and numpy to float32 precision"""
    q, k, v = inputs(seed=20, dtype=np.float32)
    for causal in (True, False):
        yours = impl.online_attention(q, k, v, causal=causal, tile=2)
        expected = standard_attention(q, k, v, causal=causal)
        expect_close(f"O in float32, causal={causal}", yours, expected, "F.scaled_dot_product_attention", atol=1e-5, rtol=1e-4)
    _, log_sum_exp = run_kernel(impl, q.numpy(), k.numpy(), v.numpy(), True, 2)
    expected = numpy_log_sum_exp(q.numpy().astype(np.float64), k.numpy().astype(np.float64), True).astype(np.float32)
    expect_close("L in float32", log_sum_exp, expected, "log sum_j e^(S_ij) in numpy", atol=1e-5, rtol=1e-5)


def test_float32_arithmetic_stays_float32(impl):
    """compiled, your kernel computes in float32 for float32 arrays (no bare 0.0 or -np.inf)"""
    q, k, v = (t.numpy() for t in inputs(seed=23, shape=(1, 1, 3, 2), dtype=np.float32))
    out, log_sum_exp = run_kernel(impl, q, k, v, True, 2)  # runs at all (not a TODO any more)
    promoted = float64_arithmetic(impl.online_attention_forward, q, k, v, np.float32(1 / math.sqrt(2)), True, 2, out, log_sum_exp)
    expect(not promoted, f"online_attention_forward computes {', '.join(promoted)} in float64 for float32 arrays: "
           "a bare Python number such as 0.0 or -np.inf is a float64 to Numba; write q.dtype.type(0), q.dtype.type(-np.inf)")
