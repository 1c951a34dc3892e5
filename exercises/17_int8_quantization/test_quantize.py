"""The checks of exercise 17. Run them with `python -m exercises check int8_quantization`."""
import numpy as np

import microtensor as mt
from exercises.checking import expect, expect_close, expect_equal
from microtensor.ops.electives.quantize import quantize as microtensor_quantize
from microtensor.ops.electives.quantize import quantized_matmul


def weight(seed, shape=(6, 4), dtype=np.float64):
    """A weight (K, M) whose columns have very different sizes (each gets its own scale)."""
    rng = np.random.default_rng(seed)
    return (rng.normal(size=shape) * 10.0 ** rng.integers(-2, 2, size=shape[1])).astype(dtype)


def test_codes_are_int8_in_range(impl):
    """the codes lie in [−127, 127] and each column's largest weight gets ±127"""
    for dtype in (np.float64, np.float32):
        w = weight(1, dtype=dtype)
        q, scale = impl.quantize(w)
        name = np.dtype(dtype).name
        expect(q.dtype == np.int8 and q.shape == w.shape, f"the codes of a {name} W {w.shape}: {q.dtype} {q.shape}, expected int8 {w.shape}")
        expect(scale.dtype == dtype and scale.shape == (w.shape[1],),
               f"the scales of a {name} W {w.shape}: {scale.dtype} {scale.shape}, expected {name} ({w.shape[1]},): one per output column")  # fmt: skip
        expect(q.min() >= -127 and q.max() <= 127, f"codes must lie in [-127, 127], found {q.min()} .. {q.max()}")
        quotients = w.astype(np.float64) / scale.astype(np.float64)  # (K, M): w / s, the scales are > 0 here
        expect(
            not (np.array_equal(q, np.trunc(quotients)) and not np.array_equal(q, np.rint(quotients))),
            f"the codes of a {name} W are w / s truncated towards 0 (int() does that): round to the nearest "
            "integer with np.rint, so that no weight is further than s / 2 from q s",
        )
        expect_equal(f"the largest |code| of each column ({name})", np.abs(q.astype(np.int64)).max(axis=0),
                     np.full(w.shape[1], 127), "127: the largest weight maps to ±127")  # fmt: skip


def test_error_is_at_most_half_a_step(impl):
    """|W − q s| <= s / 2 for every weight (rounding moves a number by at most half a step)"""
    for seed, shape in [(2, (6, 4)), (3, (5, 7)), (4, (40, 3))]:
        w = weight(seed, shape)
        q, scale = impl.quantize(w)
        error = np.abs(w - q.astype(np.float64) * scale)  # (K, M)
        allowed = scale / 2 * (1 + 1e-12)  # (M,): the half step, and float64's rounding of q s
        bad = error > allowed
        if bad.any():
            k, m = np.argwhere(bad)[0]
            expect(False, f"W {shape}: {int(bad.sum())} weights are further than s/2 from q s; at [{k}, {m}] W = {w[k, m]!r}, "
                          f"q = {q[k, m]}, s = {scale[m]!r}: error {error[k, m]:.3g} > s/2 = {scale[m] / 2:.3g}")  # fmt: skip


def test_an_all_zero_column(impl):
    """an all-zero column gets scale 0 and codes 0 (no division by zero), and dequantizes to 0"""
    w = weight(5)
    w[:, 2] = 0.0
    q, scale = impl.quantize(w)
    expect(scale[2] == 0, f"the scale of an all-zero column is {scale[2]!r}, expected 0")
    expect_equal("the codes of the all-zero column 2", q[:, 2], np.zeros(6, dtype=np.int8), "zeros")
    expect_equal("Ŵ's all-zero column 2", impl.dequantize(q, scale)[:, 2], np.zeros(6), "zeros")


def test_codes_and_scales_match_microtensor(impl):
    """the codes and scales equal microtensor's quantize(W, bits=8), in float64 and float32"""
    for seed, shape, dtype in [(6, (6, 4), np.float64), (7, (3, 5), np.float64), (8, (6, 4), np.float32)]:
        w = weight(seed, shape, dtype)
        q, scale = impl.quantize(w)
        reference = microtensor_quantize(w, bits=8)
        name = np.dtype(dtype).name
        expect_close(f"the scales of W {shape} in {name}", scale, reference.scale, "microtensor's quantize", atol=0, rtol=1e-6)
        expect_equal(f"the codes of W {shape} in {name}", q, reference.codes(), "microtensor's quantize")


def test_float32_codes_near_a_tie_match_microtensor(impl):
    """in float32, codes a hair from a rounding tie equal microtensor's (quotient in float64, by the stored s)"""
    # row 1 is a hair from a tie: 0.515 / s_0 = 51.4999997 and 0.28 / s_1 = 63.5000002, with s = largest / 127
    # rounded to float32 (the scale that is stored); the last digits decide which way they round
    w = np.array([[1.27, 0.56], [0.515, 0.28], [-0.3, -0.1]], dtype=np.float32)  # (K, M) = (3, 2)
    q, scale = impl.quantize(w)
    expected = microtensor_quantize(w, bits=8).codes()  # (3, 2): [[127, 127], [51, 64], [-30, -23]]
    stored = (np.abs(w).max(axis=0) / np.float32(127)).astype(np.float32)  # (M,) the scales in float32
    in_float32 = np.rint(w / stored)  # the quotient divided in float32: 51.5 exactly, which rounds to 52
    by_unrounded = np.rint(w.astype(np.float64) / (np.abs(w).max(axis=0).astype(np.float64) / 127))  # s kept in float64
    if np.array_equal(q, in_float32) and not np.array_equal(q, expected):
        expect(False, f"the codes of W (3, 2) in float32: yours {q.tolist()}, microtensor's {expected.tolist()}: code [1, 0] "
                      "is 52 where 0.515 / s = 51.4999997; you divided in float32, where the quotient rounds to 51.5 "
                      "(then to 52); divide in float64: np.float64(w[k, m]) / np.float64(s)")  # fmt: skip
    if np.array_equal(q, by_unrounded) and not np.array_equal(q, expected):
        expect(False, f"the codes of W (3, 2) in float32: yours {q.tolist()}, microtensor's {expected.tolist()}: code [1, 1] "
                      "is 63 where 0.28 / s = 63.5000002 with the stored scale s; you divided by a float64 scale of your "
                      "own; compute s = largest / w.dtype.type(Q_MAX) in w's dtype, store it, divide by it")  # fmt: skip
    expect_equal("the codes of W (3, 2) in float32 (row 1 a hair from a tie)", q, expected, "microtensor's quantize")
    expect_close("the scales of W (3, 2) in float32", scale, microtensor_quantize(w, bits=8).scale, "microtensor's quantize", atol=0, rtol=0)


def test_dequantize_matches_microtensor(impl):
    """Ŵ = q s equals microtensor's QuantizedMatrix.dequantize(), and keeps the scales' dtype"""
    for dtype in (np.float64, np.float32):
        reference = microtensor_quantize(weight(9, dtype=dtype), bits=8)
        w_hat = impl.dequantize(reference.codes(), reference.scale)
        expect_close(f"Ŵ (6, 4) in {np.dtype(dtype).name}", w_hat, reference.dequantize(), "QuantizedMatrix.dequantize", atol=0, rtol=1e-7)


def test_int8_matmul_matches_numpy(impl):
    """the int8 matmul equals numpy's x @ (q s), for K > M and K < M"""
    for seed, (N, K, M) in [(10, (3, 6, 4)), (11, (2, 3, 5)), (12, (1, 4, 1))]:
        q = microtensor_quantize(weight(seed, (K, M)), bits=8).codes()  # (K, M) int8
        scale = np.abs(np.random.default_rng(seed).normal(size=M)) / 100  # (M,): any positive scales
        x = np.random.default_rng(seed + 1).normal(size=(N, K))
        expected = x @ (q.astype(np.float64) * scale)
        expect_close(f"int8_matmul of x ({N}, {K}) and codes ({K}, {M})", impl.int8_matmul(x, q, scale), expected,
                     "numpy's x @ (q * scale)", atol=1e-12, rtol=1e-10)  # fmt: skip


def test_float32_matmul_matches_microtensor(impl):
    """in float32, the product equals microtensor's quantized_matmul"""
    reference = microtensor_quantize(weight(13, (5, 3), np.float32), bits=8)
    x = np.random.default_rng(14).normal(size=(4, 5)).astype(np.float32)
    with mt.no_grad():
        expected = quantized_matmul(mt.tensor(x), reference)
    expect_close("int8_matmul in float32, x (4, 5), codes (5, 3)", impl.int8_matmul(x, reference.codes(), reference.scale),
                 expected, "microtensor's quantized_matmul", atol=1e-5, rtol=1e-5)  # fmt: skip


def test_output_error_bound(impl):
    """each output is within (s_c / 2) Σ_i |x_i| of the float product x W (quantize, then multiply)"""
    w = weight(15, (8, 5))
    x = np.random.default_rng(16).normal(size=(3, 8))
    q, scale = impl.quantize(w)
    error = np.abs(impl.int8_matmul(x, q, scale) - x @ w)  # (3, 5)
    allowed = scale[None, :] / 2 * np.abs(x).sum(axis=1, keepdims=True) * (1 + 1e-9)  # (3, 5)
    bad = ~(error <= allowed)
    if bad.any():
        n, c = np.argwhere(bad)[0]
        expect(False, f"x (3, 8) @ W (8, 5): {int(bad.sum())} of 15 outputs are further from x W than (s_c / 2) Σ_i |x_i|; "
                      f"at [{n}, {c}] the error is {error[n, c]:.3g}, the bound {allowed[n, c]:.3g}")  # fmt: skip
