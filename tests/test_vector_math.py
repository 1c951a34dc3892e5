"""The fast set's vectorizable math (microtensor/fast/vector_math.py): e^t, tanh, the sigmoid,
erf and the row max, against numpy in extended precision (math.erf for erf), at edge values, and
in the input's own float type. Skipped under NUMBA_DISABLE_JIT=1: the fast set is only ever
compiled, so its helpers are tested as the fast kernels run them."""
import math

import numba
import numpy as np
import pytest

from microtensor.fast import vector_math as vm

pytestmark = pytest.mark.skipif(numba.config.DISABLE_JIT, reason="the fast kernels need Numba's compiler")

N = 50_000


@numba.njit
def _apply(helper_index, x):
    """Each helper over an array, from compiled code, as the kernels call them."""
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        if helper_index == 0:
            out[i] = vm.exp_of_nonpositive(x[i])
        elif helper_index == 1:
            out[i] = vm.tanh(x[i])
        elif helper_index == 2:
            out[i] = vm.sigmoid(x[i])
        else:
            out[i] = vm.erf(x[i])
    return out


def exp_of_nonpositive(x):
    return _apply(0, x)


def tanh(x):
    return _apply(1, x)


def sigmoid(x):
    return _apply(2, x)


def erf(x):
    return _apply(3, x)


@pytest.mark.parametrize("dtype, low, ulps", [(np.float32, -87.0, 2), (np.float64, -707.0, 8)])
def test_exp_is_accurate_to_a_few_ulps(dtype, low, ulps):
    rng = np.random.default_rng(0)
    t = np.concatenate([rng.uniform(low, 0, N), rng.uniform(-1, 0, N // 4), [0.0, -1e-30, low]]).astype(dtype)
    got = exp_of_nonpositive(t)
    exact = np.exp(t.astype(np.longdouble))
    assert got.dtype == dtype
    relative_error = np.abs(got - exact) / exact
    assert relative_error.max() <= ulps * np.finfo(dtype).eps, relative_error.max() / np.finfo(dtype).eps


def test_exp_edge_values():
    for dtype in (np.float32, np.float64):
        got = exp_of_nonpositive(np.array([0.0, -np.inf, np.nan, -708.5, -800.0, -1e30], dtype=dtype))
        assert got[0] == 1 and got[1] == 0 and np.isnan(got[2]) and np.all(got[3:] == 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tanh_and_sigmoid_are_accurate_to_a_few_ulps_of_one(dtype):
    # The kernels add tanh to 1 (GELU) and multiply by σ; their error is measured against 1.
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-20, 20, N), rng.uniform(-1e-3, 1e-3, N // 4), [0.0, -0.0, 1e-30, 50.0, -50.0, 1e4, -1e4]]).astype(dtype)
    wide = x.astype(np.longdouble)
    eps = np.finfo(dtype).eps
    got_tanh, got_sigmoid = tanh(x), sigmoid(x)
    assert got_tanh.dtype == dtype and got_sigmoid.dtype == dtype
    assert np.abs(got_tanh - np.tanh(wide)).max() <= 4 * eps
    assert np.abs(got_sigmoid - 1 / (1 + np.exp(-wide))).max() <= 4 * eps
    assert np.all(np.abs(got_tanh) <= 1) and np.all((got_sigmoid >= 0) & (got_sigmoid <= 1))
    assert np.all(np.sign(got_tanh) * np.sign(x) >= 0)  # never the wrong sign


def test_tanh_and_sigmoid_keep_their_symmetries_and_nan():
    x = np.linspace(-30, 30, 601)
    np.testing.assert_array_equal(tanh(-x), -tanh(x))  # odd
    np.testing.assert_allclose(sigmoid(x) + sigmoid(-x), 1, atol=2e-16)
    assert np.isnan(tanh(np.array([np.nan]))[0]) and np.isnan(sigmoid(np.array([np.nan]))[0])
    np.testing.assert_array_equal(tanh(np.array([np.inf, -np.inf])), [1, -1])
    np.testing.assert_array_equal(sigmoid(np.array([np.inf, -np.inf])), [1, 0])


def _erf_points(rng, n):
    return np.concatenate([
        rng.uniform(-7, 7, n), rng.uniform(-1, 1, n // 4), rng.uniform(-1e-3, 1e-3, n // 8),
        [0.0, -0.0, 1e-30, -1e-30, 0.84375, 1.25, 1 / 0.35, 3.92, 6.0, -6.0, 30.0, -30.0, 1e30, np.inf, -np.inf],
    ])  # fmt: skip


@pytest.mark.parametrize("dtype, max_ulps", [(np.float32, 6), (np.float64, 1)])
def test_erf_is_accurate_to_a_few_ulps(dtype, max_ulps):
    """Error in units of the spacing of floats at erf x (its ulp), against math.erf in float64 of
    the same (rounded) input. float64 is math.erf itself, held to 1 ulp all the same."""
    x = _erf_points(np.random.default_rng(0), N).astype(dtype)
    got = erf(x)
    assert got.dtype == dtype
    exact = np.array([math.erf(float(v)) for v in x])
    ulp = np.spacing(np.abs(exact).astype(dtype)).astype(np.float64)
    ulps = np.abs(got.astype(np.float64) - exact) / ulp
    assert ulps.max() <= max_ulps, (ulps.max(), x[ulps.argmax()])


def test_erf_keeps_its_range_symmetry_and_nan():
    for dtype in (np.float32, np.float64):
        x = np.linspace(-8, 8, 1601).astype(dtype)
        y = erf(x)
        np.testing.assert_array_equal(erf(-x), -y)  # odd
        assert np.all(np.abs(y) <= 1)
        assert np.isnan(erf(np.array([np.nan], dtype=dtype))[0])


def test_max_of_row_orders_floats_like_their_values():
    values = [-np.inf, -3e38, -1.0, -1e-45, -0.0, 0.0, 1e-45, 2.5, 3e38, np.inf]
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        for _ in range(20):
            row = rng.permutation(np.array(values, dtype=dtype))[: rng.integers(1, len(values) + 1)]
            found = vm.max_of_row(row.reshape(1, -1), 0)
            assert found == row.max(), (row, found)


def test_helpers_compute_in_the_input_float_type():
    """A bare literal (`1 + e`) would make the float32 versions compute in float64: compile each
    helper for float32 and look at the types numba inferred."""
    f = np.float32
    for helper, args in [
        (vm.exp_of_nonpositive, (f(-1.5),)), (vm.tanh, (f(0.3),)), (vm.sigmoid, (f(-0.3),)),
        (vm.erf_float32, (f(0.7),)), (vm.exp_taylor_float32, (f(0.2),)),
        (vm.times_two_to_the_float32, (f(1.1), f(-3.0))), (vm.max_of_row, (np.ones((2, 3), f), 0)),
    ]:  # fmt: skip
        fresh = numba.njit(helper.py_func)
        fresh(*args)
        overload = fresh.overloads[fresh.signatures[0]]
        names = [
            n for n, t in overload.type_annotation.typemap.items()
            if t == numba.float64 and (not n.startswith("$") or n.startswith("$binop"))
        ]  # fmt: skip
        assert not names, f"{helper.__name__}: float64 arithmetic in the float32 version: {names}"
        assert overload.signature.return_type == numba.float32, helper.__name__
