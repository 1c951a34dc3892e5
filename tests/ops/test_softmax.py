"""softmax and log_softmax: forward against plain loops, identities and PyTorch (float64), float32
accuracy and dtype, any dim and layout, numerical stability, e^t inside the kernels, the readable
and fast kernels against each other, the explicit Jacobian against the JVP backward, and the
errors. Tests taking `kernel_set` run once with each kernel set."""
import math

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from microtensor.gradcheck import GradcheckError, gradcheck
from microtensor.kernels import active
from microtensor.ops import softmax as sm
from microtensor.ops.softmax import LogSoftmax, Softmax, log_softmax, softmax, softmax_jacobian
from microtensor.tensor import Tensor
from helpers import JIT_DISABLED, fast_twin_of

# kernel_set switches the kernels once for all of a test's examples, which is what it should do.
ONE_FIXTURE_FOR_ALL_EXAMPLES = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


def layout(array, rng):
    """The same values, stored contiguously, transposed, or as a strided view (as kernels may meet them)."""
    kind = rng.integers(0, 3)
    if kind == 1 and array.ndim >= 2:
        return np.ascontiguousarray(array.T).T
    if kind == 2:
        padded = np.zeros(array.shape[:-1] + (2 * array.shape[-1],), dtype=array.dtype)
        padded[..., ::2] = array
        return padded[..., ::2]
    return array.copy()


def softmax_by_loops(x, dim):
    """Softmax of a float64 array by explicit loops over every row along `dim` (with the max shift)."""
    moved = np.moveaxis(x, dim, -1)
    out = np.empty_like(moved)
    for index in np.ndindex(moved.shape[:-1]):
        row = moved[index]
        m = max(row)
        exps = [math.exp(v - m) for v in row]
        total = math.fsum(exps)
        out[index] = [e / total for e in exps]
    return np.moveaxis(out, -1, dim)


shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple)


@ONE_FIXTURE_FOR_ALL_EXAMPLES
@given(shape=shapes, data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_forward_matches_loops_identities_and_reference(shape, data, seed, kernel_set):
    rng = np.random.default_rng(seed)
    dim = data.draw(st.integers(-len(shape), len(shape) - 1), label="dim")
    x = layout(rng.uniform(-5, 5, shape), rng)
    y = softmax(Tensor(x), dim).numpy()
    z = log_softmax(Tensor(x), dim).numpy()
    assert y.shape == z.shape == shape and y.dtype == z.dtype == np.float64
    np.testing.assert_allclose(y, softmax_by_loops(x, dim), rtol=1e-13, atol=1e-16)
    np.testing.assert_allclose(y, sm.softmax_reference(x, dim), rtol=1e-13, atol=1e-16)
    np.testing.assert_allclose(z, sm.log_softmax_reference(x, dim), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(y.sum(axis=dim), 1.0, rtol=1e-14)  # each row sums to 1
    assert np.all(y > 0)
    np.testing.assert_allclose(np.exp(z), y, rtol=1e-13)  # log_softmax = log(softmax)
    shifted = softmax(Tensor(x + 7.5), dim).numpy()  # adding a constant to a row changes nothing
    np.testing.assert_allclose(shifted, y, rtol=1e-12, atol=1e-16)


@settings(max_examples=10, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=shapes, data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_forward_and_backward_against_torch_float64(shape, data, seed, kernel_set):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    dim = data.draw(st.integers(-len(shape), len(shape) - 1), label="dim")
    x = layout(rng.uniform(-5, 5, shape), rng)
    g = rng.standard_normal(shape)
    for ours, theirs in ((softmax, torch.softmax), (log_softmax, torch.log_softmax)):
        xt = Tensor(x, requires_grad=True)
        out = ours(xt, dim)
        out.backward(g)
        tx = torch.tensor(x, requires_grad=True)
        tout = theirs(tx, dim)
        tout.backward(torch.tensor(g))
        np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(xt.grad, tx.grad.numpy(), rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("function", [softmax, log_softmax])
def test_float32_stays_float32_and_matches_float64(function, kernel_set):
    rng = np.random.default_rng(1)
    x64 = rng.uniform(-8, 8, (6, 3, 17))
    g64 = rng.standard_normal(x64.shape)
    for dim in (-1, 1, 0):
        x32 = Tensor(x64.astype(np.float32), requires_grad=True)
        out = function(x32, dim)
        out.backward(g64.astype(np.float32))
        assert out.dtype == np.float32 and x32.grad.dtype == np.float32
        x = Tensor(x64.astype(np.float32).astype(np.float64), requires_grad=True)  # the same inputs, in float64
        expected = function(x, dim)
        expected.backward(g64.astype(np.float32).astype(np.float64))
        # float32 has ~6e-8 relative precision; a few roundings per element (exp, sum, divide). Near 0
        # a log_softmax output is (x - m) - log s with s ~ 1, whose rounding is absolute: ~1e-7.
        atol = 1e-7 if function is softmax else 5e-7
        np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=2e-6, atol=atol)
        np.testing.assert_allclose(x32.grad, x.grad, rtol=1e-5, atol=2e-6)


KERNELS = [sm.softmax_forward, sm.log_softmax_forward, sm.softmax_backward, sm.log_softmax_backward]


@pytest.mark.parametrize("kernel_set_name", ["readable", "fast"])
def test_kernels_do_their_arithmetic_in_the_input_dtype(kernel_set_name):
    """A Python float literal (`total = 0.0`) would silently make float64 arithmetic in a float32 kernel.

    Compile each kernel's Python source for float32 arrays and look at the types numba inferred:
    no named variable and no arithmetic result may be float64 (the helpers the fast kernels call:
    tests/test_vector_math.py).
    """
    if JIT_DISABLED:
        pytest.skip("needs numba's type inference")
    a = np.ones((2, 3), np.float32)
    arguments = [(a, a.copy()), (a, a.copy()), (a, a.copy(), a.copy()), (-a, a.copy(), a.copy())]
    for readable, args in zip(KERNELS, arguments):
        kernel = readable if kernel_set_name == "readable" else fast_twin_of(readable)
        fresh = numba.njit(kernel.py_func)
        fresh(*args)
        overload = fresh.overloads[fresh.signatures[0]]
        float64_names = [
            name
            for name, typ in overload.type_annotation.typemap.items()
            if typ == numba.float64 and (not name.startswith("$") or name.startswith("$binop"))
        ]
        where = f"{kernel_set_name} {kernel.__name__}"
        assert not float64_names, f"{where}: float64 arithmetic in the float32 version: {float64_names}"


def rows_to_compare(dtype, seed):
    """(R, C) rows as the kernels meet them: ordinary, wide, far from 0, and with -inf masks."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-6, 6, (37, 65))
    x[3] += 1e3  # far from 0: the max shift must cancel
    x[4] -= 1e3
    x[5, ::3] = -np.inf  # masked positions, as causal attention writes them
    x[6, 0] = 40.0  # one dominant logit: the others' probabilities are ~e^-40
    return x.astype(dtype)


@pytest.mark.parametrize("dtype, rtol, atol", [(np.float64, 1e-13, 1e-300), (np.float32, 4e-6, 1e-30)])
def test_readable_and_fast_kernels_agree(dtype, rtol, atol):
    """Called directly on the same rows, each fast twin writes what the readable kernel writes, up to
    the order of the sums and the last few bits of e^t (rtol: a few ulp of the dtype)."""
    x = rows_to_compare(dtype, seed=0)
    g = np.random.default_rng(1).standard_normal(x.shape).astype(dtype)
    eps = np.finfo(dtype).eps
    outputs = {}
    # a log-softmax output near 0 is (x - m) - log s with s ~ 1: its rounding error is absolute, ~eps
    for kernel, forward_atol in zip(KERNELS[:2], (atol, 4 * eps)):  # forward: x -> y or z
        readable_out, fast_out = np.empty_like(x), np.empty_like(x)
        kernel(x, readable_out)
        fast_twin_of(kernel)(x, fast_out)
        np.testing.assert_allclose(fast_out, readable_out, rtol=rtol, atol=forward_atol, err_msg=kernel.__name__)
        outputs[kernel] = readable_out
    for kernel, saved in zip(KERNELS[2:], outputs.values()):  # backward: (y or z, g) -> grad_x
        readable_grad, fast_grad = np.empty_like(x), np.empty_like(x)
        kernel(saved, g, readable_grad)
        fast_twin_of(kernel)(saved, g, fast_grad)
        # grad_x = y (g - <g, y>) and g - e^z sum(g) subtract nearly equal numbers where y is small:
        # their error is relative to the terms, |g| ~ 1, not to the result.
        np.testing.assert_allclose(fast_grad, readable_grad, rtol=rtol, atol=8 * eps, err_msg=kernel.__name__)


def test_size_one_dims_and_one_dim_input():
    x = Tensor(np.array([[0.3], [-2.0]]), requires_grad=True)
    y = softmax(x, dim=1)  # a softmax over one element is 1, and its gradient is 0
    y.backward(np.array([[2.0], [-1.0]]))
    np.testing.assert_array_equal(y.numpy(), [[1.0], [1.0]])
    np.testing.assert_array_equal(x.grad, [[0.0], [0.0]])
    np.testing.assert_array_equal(log_softmax(x, dim=-1).numpy(), [[0.0], [0.0]])
    np.testing.assert_allclose(softmax(x, dim=0).numpy(), sm.softmax_reference(x.numpy(), 0), rtol=1e-14)
    v = np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(softmax(Tensor(v)).numpy(), np.exp(v) / np.exp(v).sum(), rtol=1e-14)
    empty = softmax(Tensor(np.zeros((0, 3))), dim=0)
    assert empty.shape == (0, 3)


def test_dim_last_on_contiguous_input_does_not_copy():
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    rows = sm.as_rows(x, 2)
    assert rows.shape == (6, 4) and np.shares_memory(rows, x)
    moved = sm.as_rows(x, 1)  # dim in the middle: moved last and copied once, contiguously
    assert moved.shape == (8, 3) and moved.flags.c_contiguous and not np.shares_memory(moved, x)
    np.testing.assert_array_equal(sm.from_rows(moved, x.shape, 1), x)
    transposed = sm.as_rows(x.transpose(0, 2, 1), 2)  # a non-contiguous input is copied
    assert transposed.flags.c_contiguous and not np.shares_memory(transposed, x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stable_at_large_inputs(dtype, kernel_set):
    x = np.array([[1e4, 1e4 - 1.0, -1e4, 0.0], [-1e4, -1e4, -1e4, -1e4], [1e4, -1e4, 1e4, -1e4]], dtype=dtype)
    y = softmax(Tensor(x)).numpy()
    z = log_softmax(Tensor(x)).numpy()
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(z))
    e = math.exp(-1.0)
    np.testing.assert_allclose(y[0], [1 / (1 + e), e / (1 + e), 0.0, 0.0], rtol=1e-6, atol=1e-30)
    np.testing.assert_allclose(y[1], [0.25] * 4, rtol=1e-6)
    np.testing.assert_allclose(y[2], [0.5, 0.0, 0.5, 0.0], rtol=1e-6)
    log_total = math.log1p(e)
    np.testing.assert_allclose(z[0], [-log_total, -1 - log_total, -2e4 - log_total, -1e4 - log_total], rtol=1e-6)
    xt = Tensor(x, requires_grad=True)
    softmax(xt).backward(np.ones_like(x))
    assert np.all(np.isfinite(xt.grad))


def test_minus_infinity_masks_and_nan_propagates(kernel_set):
    x = np.array([[0.0, -np.inf, 1.0], [-np.inf, 2.0, -np.inf], [0.0, np.nan, 1.0], [1.0, 2.0, 3.0]])
    y = softmax(Tensor(x)).numpy()
    z = log_softmax(Tensor(x)).numpy()
    np.testing.assert_allclose(y[0], [1 / (1 + math.e), 0.0, math.e / (1 + math.e)], rtol=1e-14)
    np.testing.assert_array_equal(y[1], [0.0, 1.0, 0.0])
    assert z[0, 1] == -np.inf and z[1, 1] == 0.0
    assert np.all(np.isnan(y[2])) and np.all(np.isnan(z[2]))  # a NaN spoils its own row only
    np.testing.assert_allclose(y[3], sm.softmax_reference(x[3]), rtol=1e-14)
    negative_nan = np.copysign(np.nan, -1.0)  # the fast row max compares bit patterns: both signs of NaN
    for row in ([1.0, negative_nan, 2.0], [np.nan, 1.0, 2.0], [negative_nan, 1.0, 2.0], [1.0, 2.0, np.nan]):
        assert np.all(np.isnan(softmax(Tensor(np.array([row]))).numpy())), row


@pytest.mark.parametrize("dtype, low, ulps", [(np.float32, -87.0, 2), (np.float64, -707.0, 8)])
def test_exp_inside_the_kernels_is_accurate(dtype, low, ulps, kernel_set):
    # log_softmax_backward computes grad_z - e^z * sum(grad_z); with grad_z = (0, ..., 0, -1) every
    # output but the last is exactly e^z, as the kernel computes it (np.exp in the readable set,
    # vector_math's in the fast set).
    rng = np.random.default_rng(0)
    n = 200 if JIT_DISABLED else 20000
    t = np.concatenate([rng.uniform(low, 0, n), rng.uniform(-1, 0, n // 4), [0.0, -1e-30, low]]).astype(dtype)
    z = np.append(t, 0).reshape(1, -1).astype(dtype)
    grad_z = np.zeros_like(z)
    grad_z[0, -1] = -1
    out = np.empty_like(z)
    active(sm.log_softmax_backward)(z, grad_z, out)
    exact = np.exp(t.astype(np.longdouble))
    relative_error = np.abs(out[0, :-1] - exact) / exact
    assert out.dtype == dtype
    assert relative_error.max() <= ulps * np.finfo(dtype).eps, relative_error.max() / np.finfo(dtype).eps


def test_exp_edge_values(kernel_set):
    cases = np.array([0.0, -np.inf, np.nan, -708.5, -800.0, -1e30, -100.0, -104.0])
    for dtype in (np.float32, np.float64):
        z = cases.astype(dtype).reshape(1, -1)
        grad_z = np.zeros_like(z)
        grad_z[0, 0] = -1  # the first output is -1 + e^0 = 0; the others are e^z
        out = np.empty_like(z)
        active(sm.log_softmax_backward)(z, grad_z, out)
        assert out[0, 0] == 0 and out[0, 1] == 0 and np.isnan(out[0, 2])
        # e^-708.5 ~ 2.4e-308 is a float64 subnormal, which the fast set's e^t rounds to 0: either is fine
        assert 0 <= out[0, 3] <= 2.5e-308 and out[0, 4] == 0 and out[0, 5] == 0
        if dtype == np.float32:  # float32 subnormals: e^-100 ~ 3.7e-44 and e^-104 ~ 6.8e-46 (rounds to 0 or 1.4e-45)
            assert abs(out[0, 6] - math.exp(-100)) <= 1.5e-45 and abs(out[0, 7] - math.exp(-104)) <= 1.5e-45
        else:
            np.testing.assert_allclose(out[0, 6:], np.exp(cases[6:]), rtol=1e-14)


def test_jacobian_is_diag_minus_outer_product_and_contracts_to_the_backward(kernel_set):
    rng = np.random.default_rng(3)
    x = Tensor(rng.standard_normal((4, 5)), requires_grad=True)
    y = softmax(x)
    g = rng.standard_normal((4, 5))
    y.backward(g)
    jacobian = softmax_jacobian(y)
    assert isinstance(jacobian, Tensor) and jacobian.shape == (4, 5, 5)
    for row in range(4):
        p = y.numpy()[row]
        by_entries = np.array([[p[i] * ((i == j) - p[j]) for j in range(5)] for i in range(5)])
        np.testing.assert_allclose(jacobian.numpy()[row], by_entries, rtol=1e-14, atol=1e-17)
        np.testing.assert_allclose(softmax_jacobian(p), by_entries, rtol=1e-14, atol=1e-17)  # 1-D y, numpy in and out
        # backward is the vector-Jacobian product gᵀJ (J is symmetric, so also J g)
        np.testing.assert_allclose(g[row] @ jacobian.numpy()[row], x.grad[row], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(jacobian.numpy().sum(axis=-1), 0.0, atol=1e-15)  # rows sum to 0: softmax sums to 1


def test_jacobian_matches_finite_differences():
    x = np.random.default_rng(4).standard_normal(4)
    eps = 1e-6
    numeric = np.empty((4, 4))
    for j in range(4):
        step = np.zeros(4)
        step[j] = eps
        numeric[:, j] = (sm.softmax_reference(x + step) - sm.softmax_reference(x - step)) / (2 * eps)
    np.testing.assert_allclose(softmax_jacobian(sm.softmax_reference(x)), numeric, atol=1e-9)


def test_gradcheck_catches_a_wrong_backward(monkeypatch):
    x = Tensor(np.random.default_rng(5).uniform(-2, 2, (3, 4)), requires_grad=True)
    assert gradcheck(softmax, [x])
    assert gradcheck(log_softmax, [x])

    def forgets_the_dot_product(ctx, grad_out):
        (y,) = ctx.saved_tensors
        return sm.from_rows(y * sm.as_rows(grad_out, ctx.dim), ctx.shape, ctx.dim), None

    def forgets_the_sum(ctx, grad_out):
        return grad_out.copy(), None

    monkeypatch.setattr(Softmax, "backward", staticmethod(forgets_the_dot_product))
    monkeypatch.setattr(LogSoftmax, "backward", staticmethod(forgets_the_sum))
    with pytest.raises(GradcheckError):
        gradcheck(softmax, [x])
    with pytest.raises(GradcheckError):
        gradcheck(log_softmax, [x])


@pytest.mark.parametrize("function, name", [(softmax, "softmax"), (log_softmax, "log_softmax")])
def test_errors_name_the_op(function, name):
    x = Tensor(np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match=f"^{name}: expected a Tensor"):
        function(np.zeros((2, 3)))
    with pytest.raises(TypeError, match=f"^{name}: expected a float32 or float64 tensor, got int64"):
        function(Tensor(np.zeros((2, 3), np.int64)))
    with pytest.raises(IndexError, match=f"^{name}: dim 2 is out of range"):
        function(x, 2)
    with pytest.raises(IndexError, match=f"^{name}: dim -3 is out of range"):
        function(x, -3)
    with pytest.raises(TypeError, match=f"^{name}: dim must be an int"):
        function(x, 1.0)
    with pytest.raises(IndexError, match=f"^{name}: dim -1 is out of range for a tensor with 0 dims"):
        function(Tensor(np.float32(1.0)))


@pytest.mark.slow
def test_attention_sized_scores_against_torch(kernel_set):
    torch = pytest.importorskip("torch")
    if JIT_DISABLED:
        pytest.skip("too slow without the JIT")
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((12, 4, 64, 64)) * 3).astype(np.float32)
    g = rng.standard_normal(x.shape).astype(np.float32)
    xt = Tensor(x, requires_grad=True)
    y = softmax(xt)
    y.backward(g)
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    torch.softmax(tx, -1).backward(torch.tensor(g, dtype=torch.float64))
    np.testing.assert_allclose(y.numpy(), torch.softmax(tx, -1).detach().numpy(), rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(xt.grad, tx.grad.numpy(), rtol=1e-4, atol=1e-6)
