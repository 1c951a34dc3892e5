"""The checks of exercise 11. Run them with `python -m exercises check positions`."""
import math

import numpy as np

import microtensor as mt
import microtensor.functional as F
from exercises.checking import expect, expect_close, expect_equal, float64_arithmetic, gradcheck, random_tensor
from microtensor.nn import sinusoidal_positions


def test_table_matches_microtensor(impl):
    """the sinusoidal table equals microtensor's sinusoidal_positions, in float64 and float32"""
    for T, C, dtype, atol in [(6, 8, np.float64, 1e-12), (4, 2, np.float64, 1e-12), (5, 6, np.float32, 1e-7)]:
        expect_close(
            f"sinusoidal_table({T}, {C}) in {np.dtype(dtype).name}", impl.sinusoidal_table(T, C, dtype),
            sinusoidal_positions(0, T, C, dtype), "microtensor's sinusoidal_positions", atol=atol, rtol=1e-6,
        )  # fmt: skip


def test_table_interleaves_sines_and_cosines(impl):
    """row 0 is [0, 1, 0, 1, ...], and columns 0 and 1 are sin t and cos t (one radian a position)"""
    table = impl.sinusoidal_table(5, 6)
    expect_close("row 0 (position 0: sin 0 = 0, cos 0 = 1)", table[0], np.array([0.0, 1, 0, 1, 0, 1]), "[0, 1, 0, 1, 0, 1]", atol=1e-15)
    t = np.arange(5.0)
    expect_close("column 0 (the fastest sine, ω_0 = 1)", table[:, 0], np.sin(t), "sin(t)", atol=1e-12)
    expect_close("column 1 (its cosine, beside it)", table[:, 1], np.cos(t), "cos(t)", atol=1e-12)


def test_a_shift_is_a_rotation_of_each_pair(impl):
    """PE[t + k] is PE[t] with each pair (sin, cos) turned by the angle k ω_i, the same for every t"""
    T, C = 9, 8
    table = impl.sinusoidal_table(T, C)
    frequency = 10000.0 ** (-np.arange(0, C, 2) / C)  # (C/2,)
    for k in (1, 3):
        for i, w in enumerate(frequency):
            c, s = math.cos(k * w), math.sin(k * w)
            turn = np.array([[c, s], [-s, c]])  # sin(a + b) = sin a cos b + cos a sin b; cos(a + b) = cos a cos b - sin a sin b
            pairs = table[:, 2 * i : 2 * i + 2]  # (T, 2): rows (sin t ω_i, cos t ω_i)
            expect_close(
                f"pair {i} (columns {2 * i}, {2 * i + 1}) of rows k = {k} .. {T - 1}", pairs[k:],
                pairs[:-k] @ turn.T, f"rows 0 .. {T - 1 - k} turned by k ω_{i} = {k * w:.4g} rad", atol=1e-12,
            )  # fmt: skip


def test_slopes_match_microtensor(impl):
    """the slopes: 1/2, 1/4, ..., 1/256 for 8 heads, and F.alibi_slopes for every H from 1 to 16"""
    expect_close("alibi_slopes(8)", impl.alibi_slopes(8), 0.5 ** np.arange(1, 9), "2^-1 .. 2^-8", atol=0)
    for H in range(1, 17):
        rule = "a power of two" if H & (H - 1) == 0 else "not a power of two: P slopes, then every other one of 2P"
        expect_close(f"alibi_slopes({H}) ({rule})", impl.alibi_slopes(H), F.alibi_slopes(H), "F.alibi_slopes", atol=0, rtol=1e-15)


def reference_bias(slopes, T):
    """The bias written with numpy: −m (i − j) below and on the diagonal, −inf above it."""
    distance = np.arange(T)[:, None] - np.arange(T)[None, :]  # (T, T): i − j
    return np.where(distance >= 0, -slopes[:, None, None] * distance, -np.inf).astype(slopes.dtype)


def test_bias_is_zero_on_the_diagonal_and_masked_above(impl):
    """the bias is 0 on the diagonal, −inf above it (the mask), −m (i − j) below, for 3 heads"""
    slopes, T = np.array([0.5, 0.25, 0.125]), 5
    bias = impl.alibi_bias(slopes, T)
    expect(bias.shape == (3, T, T), f"alibi_bias(3 slopes, T={T}) has shape {bias.shape}, expected (3, {T}, {T}) = (H, T, T)")
    expect_equal("the diagonal bias[h, i, i] (a query and itself: distance 0)", np.diagonal(bias, axis1=1, axis2=2), np.zeros((3, T)), "0")
    above = np.triu(np.ones((T, T), dtype=bool), 1)  # keys after the query
    expect(np.all(np.isneginf(bias[:, above])), "above the diagonal (j > i: a key after the query) every bias must be -inf (the causal mask)")
    expect_close(
        "the bias of 3 heads, 5 positions, on and below the diagonal (shown with 0 above it)", np.where(above, 0.0, bias),
        np.where(above, 0.0, reference_bias(slopes, T)), "−m_h (i − j) in numpy", atol=1e-15,
    )  # fmt: skip


def test_bias_in_float32(impl):
    """float32 slopes give a float32 bias with the same values"""
    slopes = F.alibi_slopes(6).astype(np.float32)
    bias, expected = impl.alibi_bias(slopes, 4), reference_bias(slopes, 4)
    expect(bias.dtype == np.float32, f"alibi_bias of float32 slopes gave {bias.dtype}; keep the slopes' dtype")
    expect(np.array_equal(np.isneginf(bias), np.isneginf(expected)), "alibi_bias in float32: the −inf entries must be exactly those with j > i")
    expect_close("alibi_bias of 6 float32 slopes, 4 positions (−inf shown as 0)", np.where(np.isneginf(expected), 0, bias),
                 np.where(np.isneginf(expected), 0, expected), "−m_h (i − j) in numpy", atol=1e-7)  # fmt: skip


def test_float32_arithmetic_stays_float32(impl):
    """compiled, the bias kernel computes in float32 for float32 slopes (i − j and −inf converted)"""
    slopes, bias = F.alibi_slopes(3).astype(np.float32), np.empty((3, 4, 4), dtype=np.float32)
    impl.alibi_bias_kernel(slopes, bias)  # runs at all (not a TODO any more)
    promoted = float64_arithmetic(impl.alibi_bias_kernel, slopes, bias)
    named = [name for name in promoted if not name.startswith("$")]
    what = ", ".join(named + ([f"{len(promoted) - len(named)} intermediate result(s)"] if len(named) < len(promoted) else []))
    expect(not promoted, f"alibi_bias_kernel computes {what} in float64 for float32 slopes: to Numba the distance i - j is "
           "an int64 (float32 times int64 is float64) and -np.inf a float64; write bias.dtype.type(i - j) and "
           "bias.dtype.type(-np.inf)")


def attention_with_bias(bias):
    """softmax(q kᵀ / √D + bias) v through microtensor's ops, for q, k, v (B, H, T, D)."""

    def attention(q, k, v):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + mt.tensor(bias)  # (B, H, T, T)
        return F.softmax(scores, dim=-1) @ v  # (B, H, T, D)

    return attention


def test_attention_with_your_bias_matches_microtensor(impl):
    """attention with your bias added equals F.scaled_dot_product_attention with ALiBi, causal"""
    H, T = 4, 5
    slopes = impl.alibi_slopes(H)
    q, k, v = (random_tensor((2, H, T, 3), seed=seed, requires_grad=False) for seed in (1, 2, 3))
    expected = F.scaled_dot_product_attention(q, k, v, causal=True, alibi_slopes=F.alibi_slopes(H))
    expect_close(
        "softmax(q kᵀ / √D + alibi_bias) v of shape (2, 4, 5, 3)", attention_with_bias(impl.alibi_bias(slopes, T))(q, k, v),
        expected, "F.scaled_dot_product_attention(causal=True, alibi_slopes=F.alibi_slopes(4))", atol=1e-12,
    )  # fmt: skip


def test_gradients_flow_unchanged_through_the_constant_bias(impl):
    """gradcheck: attention scores with your bias added, wrt q, k and v (the bias is a constant)"""
    slopes, T = np.array([0.5, 0.125, 2.0 ** -5]), 4
    bias = impl.alibi_bias(slopes, T)
    inputs = [random_tensor((1, 3, T, 2), seed=seed) for seed in (4, 5, 6)]
    gradcheck(attention_with_bias(bias), inputs)
