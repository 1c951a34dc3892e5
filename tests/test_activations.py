"""GELU's erf (microtensor/ops/gelu.py) against math.erf, in both float types, and the
activations (GELU in both forms, SiLU) in float32 against float64 evaluations of their formulas,
forward and backward."""
import math

import numba
import numpy as np
import pytest

import microtensor as mt
import microtensor.functional as F
from microtensor.ops import gelu as gelu_module

JIT_DISABLED = numba.config.DISABLE_JIT
N = 300 if JIT_DISABLED else 50_000  # plain Python is slow: fewer points without the JIT


@numba.njit
def _erf(x):
    """erf over an array, from compiled code, as the kernels call it."""
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = gelu_module.erf(x[i])
    return out


def _points(rng, n):
    return np.concatenate([
        rng.uniform(-7, 7, n), rng.uniform(-1, 1, n // 4), rng.uniform(-1e-3, 1e-3, n // 8),
        [0.0, -0.0, 1e-30, -1e-30, 0.84375, 1.25, 1 / 0.35, 3.92, 6.0, -6.0, 30.0, -30.0, 1e30, np.inf, -np.inf],
    ])  # fmt: skip


@pytest.mark.parametrize("dtype, max_ulps", [(np.float32, 6), (np.float64, 1)])
def test_erf_is_accurate_to_a_few_ulps(dtype, max_ulps):
    """Error in units of the spacing of floats at erf x (its ulp), against math.erf in float64 of
    the same (rounded) input."""
    x = _points(np.random.default_rng(0), N).astype(dtype)
    got = _erf(x)
    assert got.dtype == dtype
    exact = np.array([math.erf(float(v)) for v in x])
    ulp = np.spacing(np.abs(exact).astype(dtype)).astype(np.float64)
    ulps = np.abs(got.astype(np.float64) - exact) / ulp
    assert ulps.max() <= max_ulps, (ulps.max(), x[ulps.argmax()])


def test_erf_keeps_its_range_symmetry_and_nan():
    for dtype in (np.float32, np.float64):
        x = np.linspace(-8, 8, 1601).astype(dtype)
        y = _erf(x)
        np.testing.assert_array_equal(_erf(-x), -y)  # odd
        assert np.all(np.abs(y) <= 1)
        assert np.isnan(_erf(np.array([np.nan], dtype=dtype))[0])


def test_erf_compiles_to_the_float_type_it_is_given():
    if JIT_DISABLED:
        pytest.skip("needs numba's type inference")
    for dtype in (np.float32, np.float64):
        assert _erf(np.zeros(3, dtype)).dtype == dtype
    fresh = numba.njit(gelu_module.erf_float32.py_func)
    fresh(np.float32(0.5))
    overload = fresh.overloads[fresh.signatures[0]]
    names = [n for n, t in overload.type_annotation.typemap.items() if t == numba.float64 and (not n.startswith("$") or n.startswith("$binop"))]
    assert not names, f"float64 arithmetic in erf_float32: {names}"


def _gelu_tanh64(x):
    u = math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
    y = 0.5 * x * (1 + np.tanh(u))
    dy = 0.5 * (1 + np.tanh(u)) + 0.5 * x * (1 - np.tanh(u) ** 2) * math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * x**2)
    return y, dy


def _gelu_erf64(x):
    cdf = 0.5 * (1 + np.array([math.erf(v / math.sqrt(2)) for v in x]))
    return x * cdf, cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _silu64(x):
    with np.errstate(over="ignore"):  # e^-x overflows to inf for x << 0, and s is 0 as it should be
        s = 1 / (1 + np.exp(-x))
    return x * s, s * (1 + x * (1 - s))


@pytest.mark.parametrize(
    "fn, exact",
    [
        (lambda t: F.gelu(t, approximate="tanh"), _gelu_tanh64),
        (lambda t: F.gelu(t, approximate="none"), _gelu_erf64),
        (F.silu, _silu64),
    ],
    ids=["gelu_tanh", "gelu_erf", "silu"],
)
def test_float32_activations_forward_and_backward_against_float64(fn, exact):
    """float32 kernels (the training dtype, where the fast forms are used) against the float64
    formula, value and derivative; errors measured against max(|value|, 1) in units of float32's
    eps, since near 0 the value itself is small."""
    rng = np.random.default_rng(3)
    x32 = np.concatenate([rng.uniform(-10, 10, N // 10), rng.standard_normal(N // 10), [0.0, 1e-20, -1e-20, 88.0, -88.0, 1e4, -1e4]]).astype(np.float32)
    g32 = rng.standard_normal(x32.shape).astype(np.float32)
    t = mt.tensor(x32, requires_grad=True)
    fn(t).backward(g32)
    with mt.no_grad():
        y32 = fn(mt.tensor(x32)).numpy()
    x = x32.astype(np.float64)
    y, dy = exact(x)
    eps = np.finfo(np.float32).eps
    assert y32.dtype == np.float32 and t.grad.dtype == np.float32
    assert np.all(np.isfinite(y32)) and np.all(np.isfinite(t.grad))
    assert (np.abs(y32 - y) / np.maximum(np.abs(y), 1)).max() <= 8 * eps
    assert (np.abs(t.grad - g32 * dy) / np.maximum(np.abs(g32 * dy), 1)).max() <= 16 * eps
