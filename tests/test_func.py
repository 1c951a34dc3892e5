"""mt.func: grad, vjp, jvp, jacobian and finite_difference_hvp, checked against finite differences
and against each other, in float64, in both kernel sets; and their errors, one test each.

The identities: grad(f)(x) = vjp(f, x)[1](1)[0]; jacobian(f, mode="rev") = jacobian(f,
mode="fwd") = the finite-difference Jacobian; jvp(f, x, v) = J v and vjp_fn(u) = Jᵀ u with that J;
H v by finite differences of the gradient = a dense Hessian from second differences of f, times v.
"""
import numpy as np
import pytest

import microtensor as mt
import microtensor.functional as F
from microtensor.errors import GraphError, InputError, InputIndexError, InputTypeError


def _array(shape, seed, low=-1.5, high=1.5):
    return np.random.default_rng(seed).uniform(low, high, size=shape)


def numeric_jacobian(f, args, argnum, eps=1e-6):
    """∂f/∂args[argnum] by central differences, shape out.shape + x.shape (the oracle)."""
    args = [np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in args]
    x = args[argnum]
    with mt.no_grad():
        out_shape = f(*[mt.tensor(a) if isinstance(a, np.ndarray) else a for a in args]).shape
        columns = []
        for j in range(x.size):
            values = []
            for sign in (1, -1):
                moved = x.copy()
                moved.flat[j] += sign * eps
                call = [mt.tensor(moved if k == argnum else a) if isinstance(a, np.ndarray) else a for k, a in enumerate(args)]
                values.append(f(*call).numpy().reshape(-1))
            columns.append((values[0] - values[1]) / (2 * eps))
    return np.stack(columns, axis=1).reshape(out_shape + x.shape)


def mlp(x, w1, b1, w2, b2):
    """A two-layer perceptron: (N, 3) -> (N, 2), GELU between."""
    return F.gelu(x @ w1 + b1) @ w2 + b2


TARGETS = np.array([1, 0, 2])
CASES = {  # name: (f, its float64 arguments), f of Tensors
    "softmax": (lambda x: F.softmax(x, dim=-1), [_array((2, 4), 1)]),
    "log_softmax, dim 0": (lambda x: F.log_softmax(x, dim=0), [_array((3, 2), 2)]),
    "layer_norm with weight and bias": (lambda x, w, b: F.layer_norm(x, w, b), [_array((2, 5), 3), _array((5,), 4, 0.5), _array((5,), 5)]),
    "matmul": (lambda a, b: a @ b, [_array((2, 3), 6), _array((3, 4), 7)]),
    "tanh of a broadcast product": (lambda x, y: (x * y).tanh(), [_array((3, 1), 8), _array((4,), 9)]),
    "cross_entropy (scalar)": (lambda logits: F.cross_entropy(logits, mt.tensor(TARGETS)), [_array((3, 4), 10)]),
    "transpose and sum": (lambda x: x.transpose(0, 1).sum(dim=0), [_array((2, 3), 11)]),
    "mlp": (mlp, [_array((4, 3), 12), _array((3, 5), 13), _array((5,), 14), _array((5, 2), 15), _array((2,), 16)]),
}


@pytest.mark.parametrize("name", CASES)
def test_jacobian_by_rows_equals_by_columns_equals_finite_differences(name, kernel_set):
    f, args = CASES[name]
    every = tuple(range(len(args)))
    rows = mt.func.jacobian(f, argnums=every, mode="rev")(*args)
    columns = mt.func.jacobian(f, argnums=every, mode="fwd")(*args)
    for argnum, (by_rows, by_columns) in enumerate(zip(rows, columns)):
        assert isinstance(by_rows, mt.Tensor) and by_rows.dtype == np.float64
        np.testing.assert_allclose(by_rows.numpy(), by_columns.numpy(), rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(by_rows.numpy(), numeric_jacobian(f, args, argnum), rtol=1e-6, atol=1e-8)


def test_forward_mode_carries_the_tangent_through_indexing():
    """x[0] of an argument: forward mode's column is the unit vector, as reverse mode's row is."""
    x = _array((4,), 17)
    f = lambda x: F.log_softmax(x, dim=-1)[0]
    np.testing.assert_allclose(mt.func.jacobian(f, mode="fwd")(x).numpy(), mt.func.jacobian(f)(x).numpy(), rtol=1e-12)
    _, tangent = mt.func.jvp(lambda x: x[1], (x,), (np.arange(4.0),))
    assert tangent.item() == 1.0


@pytest.mark.parametrize("name", ["softmax", "layer_norm with weight and bias", "mlp"])
def test_jvp_is_jacobian_times_v_and_vjp_is_jacobian_transposed_times_u(name, kernel_set):
    f, args = CASES[name]
    rng = np.random.default_rng(20)
    tangents = tuple(rng.standard_normal(a.shape) for a in args)
    out, tangent_out = mt.func.jvp(f, tuple(args), tangents)
    jacobians = mt.func.jacobian(f, argnums=tuple(range(len(args))))(*args)
    expected = sum(np.tensordot(J.numpy(), v, axes=v.ndim) for J, v in zip(jacobians, tangents))  # sum_i J_i v_i
    np.testing.assert_allclose(tangent_out.numpy(), expected, rtol=1e-12, atol=1e-13)
    u = rng.standard_normal(out.shape)
    value, vjp_fn = mt.func.vjp(f, *args)
    np.testing.assert_array_equal(value.numpy(), out.numpy())
    for J, pulled in zip(jacobians, vjp_fn(u)):
        np.testing.assert_allclose(pulled.numpy(), np.tensordot(u, J.numpy(), axes=u.ndim), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("name", ["cross_entropy (scalar)", "mlp"])
def test_grad_is_vjp_with_cotangent_one_and_agrees_with_finite_differences(name, kernel_set):
    f, args = CASES[name]
    loss = (lambda *a: f(*a).sum()) if name == "mlp" else f
    every = tuple(range(len(args)))
    gradients = mt.func.grad(loss, argnums=every)(*args)
    _, vjp_fn = mt.func.vjp(loss, *args)
    for argnum, (gradient, pulled) in enumerate(zip(gradients, vjp_fn(1.0))):
        assert gradient.shape == args[argnum].shape and gradient.dtype == np.float64
        np.testing.assert_array_equal(gradient.numpy(), pulled.numpy())
        np.testing.assert_allclose(gradient.numpy(), numeric_jacobian(loss, args, argnum).reshape(gradient.shape), rtol=1e-6, atol=1e-8)
    only_first = mt.func.grad(loss)(*args)
    np.testing.assert_array_equal(only_first.numpy(), gradients[0].numpy())
    np.testing.assert_array_equal(mt.func.grad(loss, argnums=-1)(*args).numpy(), gradients[-1].numpy())


def test_the_callers_tensors_and_their_grads_are_untouched():
    x = mt.tensor(_array((2, 3), 30), requires_grad=True)
    w = mt.tensor(_array((3,), 34), requires_grad=True)  # an argument not differentiated
    before = x.numpy().copy()
    mt.func.grad(lambda x, w: (x * w).sum())(x, w)
    mt.func.jacobian(lambda x, w: x * w, mode="fwd")(x, w)
    assert w.grad is None
    mt.func.grad(lambda x: (x * x).sum())(x)
    mt.func.jacobian(lambda x: x.exp())(x)
    mt.func.vjp(lambda x: x.tanh(), x)[1](np.ones((2, 3)))
    assert x.grad is None and np.array_equal(x.numpy(), before)


def test_vjp_fn_can_be_called_again_and_an_unused_argument_gets_zeros():
    x, y = _array((3,), 31), _array((2,), 32)
    _, vjp_fn = mt.func.vjp(lambda x, y: x * x, x, y)
    first, second = vjp_fn(np.ones(3)), vjp_fn(2 * np.ones(3))
    np.testing.assert_allclose(second[0].numpy(), 2 * first[0].numpy())  # no accumulation between calls
    np.testing.assert_array_equal(second[1].numpy(), np.zeros(2))


def test_jacobian_of_a_scalar_is_the_gradient_and_float32_keeps_its_dtype():
    x = _array((2, 3), 33)
    f = lambda x: (x.tanh() * x).sum()
    for mode in ("rev", "fwd"):
        J = mt.func.jacobian(f, mode=mode)(x)
        assert J.shape == (2, 3)
        np.testing.assert_allclose(J.numpy(), mt.func.grad(f)(x).numpy(), rtol=1e-12)
        assert mt.func.jacobian(f, mode=mode)(x.astype(np.float32)).dtype == np.float32


# --------------------------------------------------------------------------------- the Hessian-vector product


def dense_hessian(f, x, eps=1e-4):
    """H of a scalar f by second differences of f itself: (f(+,+) - f(+,-) - f(-,+) + f(-,-)) / 4 eps²."""
    n = x.size
    H = np.empty((n, n))
    value = lambda moved: float(f(mt.tensor(moved)).item())
    for i in range(n):
        for j in range(n):
            total = 0.0
            for si, sj, sign in ((1, 1, 1), (1, -1, -1), (-1, 1, -1), (-1, -1, 1)):
                moved = x.copy().reshape(-1)
                moved[i] += si * eps
                moved[j] += sj * eps
                total += sign * value(moved.reshape(x.shape))
            H[i, j] = total / (4 * eps * eps)
    return H


def test_finite_difference_hvp_equals_a_dense_hessian_times_v(kernel_set):
    w = _array((4, 3), 40)
    f = lambda x: F.log_softmax(x @ mt.tensor(w), dim=-1)[:, 0].sum() + (x * x * x).sum()
    x, v = _array((2, 4), 41), _array((2, 4), 42)
    gradient, (product,) = mt.func.finite_difference_hvp(f, (x,), (v,))
    np.testing.assert_allclose(gradient[0].numpy(), mt.func.grad(f)(x).numpy(), rtol=1e-14)
    H = dense_hessian(f, x)
    np.testing.assert_allclose(H, H.T, atol=1e-5)
    np.testing.assert_allclose(product.numpy().reshape(-1), H @ v.reshape(-1), rtol=1e-5, atol=1e-6)


def test_finite_difference_hvp_of_a_quadratic_is_exact_to_rounding():
    A = _array((5, 5), 43)
    f = lambda x: 0.5 * (x @ mt.tensor(A) @ x)  # H = (A + Aᵀ) / 2
    x, v = _array((5,), 44), 1e3 * _array((5,), 45)  # a large v: the step is scaled by |v|
    _, (product,) = mt.func.finite_difference_hvp(f, (x,), (v,))
    np.testing.assert_allclose(product.numpy(), (A + A.T) / 2 @ v, rtol=1e-8)
    _, (zero,) = mt.func.finite_difference_hvp(f, (x,), (np.zeros(5),))
    assert np.array_equal(zero.numpy(), np.zeros(5))


def test_finite_difference_hvp_against_torch_when_installed():
    torch = pytest.importorskip("torch")
    args = CASES["mlp"][1]
    tangents = tuple(_array(a.shape, 50 + i) for i, a in enumerate(args))
    loss = lambda *a: (mlp(*a) * mlp(*a)).sum()
    _, products = mt.func.finite_difference_hvp(loss, tuple(args), tangents)

    def torch_loss(x, w1, b1, w2, b2):
        h = torch.nn.functional.gelu(x @ w1 + b1, approximate="tanh") @ w2 + b2
        return (h * h).sum()

    as_torch = lambda arrays: tuple(torch.tensor(a) for a in arrays)
    _, expected = torch.autograd.functional.hvp(torch_loss, as_torch(args), as_torch(tangents))
    for product, reference in zip(products, expected):
        np.testing.assert_allclose(product.numpy(), reference.numpy(), rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------------- errors


def test_a_non_scalar_output_passed_to_grad_is_named():
    with pytest.raises(InputError, match=r"grad: f must return a scalar \(a one-element Tensor\), got shape \(2, 3\); .* mt.func.vjp"):
        mt.func.grad(lambda x: x * 2)(_array((2, 3), 60))


def test_an_unknown_mode_is_named():
    with pytest.raises(InputError, match=r"jacobian: mode must be 'rev' \(rows, by reverse mode\) or 'fwd' .*, got 'forward'"):
        mt.func.jacobian(lambda x: x, mode="forward")


def test_argnums_out_of_range_or_of_the_wrong_type_is_named():
    f = lambda x, y: (x * y).sum()
    with pytest.raises(InputIndexError, match=r"grad: argnums 2 names argument 2, but f was called with 2 arguments \(valid: -2 to 1\)"):
        mt.func.grad(f, argnums=2)(_array((2,), 61), _array((2,), 62))
    with pytest.raises(InputIndexError, match=r"jacobian: argnums \(0, -3\) names argument -3"):
        mt.func.jacobian(f, argnums=(0, -3))(_array((2,), 61), _array((2,), 62))
    with pytest.raises(InputTypeError, match=r"grad: argnums must be an int or a tuple of ints, got '0'"):
        mt.func.grad(f, argnums="0")
    with pytest.raises(InputError, match=r"grad: argnums \(0, -2\) names the same argument twice"):
        mt.func.grad(f, argnums=(0, -2))(_array((2,), 61), _array((2,), 62))


@pytest.mark.parametrize("transform", ["grad", "vjp", "jvp", "jacobian rev", "jacobian fwd"])
def test_f_returning_something_that_is_not_a_tensor_is_named(transform):
    f, x = (lambda x: x.numpy().sum()), _array((3,), 63)
    name = transform.split()[0]
    with pytest.raises(InputTypeError, match=rf"^{name}: f must return (one Tensor|a Tensor or a tuple of Tensors), got float64"):
        if transform == "grad":
            mt.func.grad(f)(x)
        elif transform == "vjp":
            mt.func.vjp(f, x)
        elif transform == "jvp":
            mt.func.jvp(f, (x,), (np.ones(3),))
        else:
            mt.func.jacobian(f, mode=transform.split()[1])(x)


def test_inputs_that_are_not_float_arrays_or_tensors_are_named():
    f = lambda x: x.sum()
    with pytest.raises(InputTypeError, match=r"grad: argument 0 must be a float Tensor or a float numpy array, got list"):
        mt.func.grad(f)([1.0, 2.0])
    with pytest.raises(InputTypeError, match=r"vjp: argument 0 has dtype int64; only float32 and float64 values have derivatives"):
        mt.func.vjp(f, np.arange(3))
    with pytest.raises(InputTypeError, match=r"jvp: primals\[0\] must be a float Tensor or a float numpy array, got float"):
        mt.func.jvp(f, (2.0,), (1.0,))
    with pytest.raises(InputTypeError, match=r"jacobian: argument 0 has dtype int64"):
        mt.func.jacobian(f, mode="fwd")(mt.tensor(np.arange(3)))
    with pytest.raises(InputTypeError, match=r"finite_difference_hvp: primals\[0\] is float32; central differences need float64"):
        mt.func.finite_difference_hvp(f, (np.ones(3, dtype=np.float32),), (np.ones(3, dtype=np.float32),))


def test_tangents_and_cotangents_of_the_wrong_shape_or_dtype_are_named():
    f, x = (lambda x: x.tanh()), _array((2, 3), 64)
    with pytest.raises(InputError, match=r"jvp: tangents\[0\] has shape \(3,\) and dtype float64, but its primal has shape \(2, 3\)"):
        mt.func.jvp(f, (x,), (np.ones(3),))
    with pytest.raises(InputError, match=r"jvp: tangents\[0\] has shape \(2, 3\) and dtype float32, but its primal has shape \(2, 3\) and dtype float64"):
        mt.func.jvp(f, (x,), (np.ones((2, 3), dtype=np.float32),))
    with pytest.raises(InputError, match=r"jvp: 2 tangents for 1 primals"):
        mt.func.jvp(f, (x,), (np.ones((2, 3)), np.ones(1)))
    _, vjp_fn = mt.func.vjp(f, x)
    with pytest.raises(InputError, match=r"vjp_fn: the cotangent has shape \(3, 2\) and dtype float64, but f's output has shape \(2, 3\)"):
        vjp_fn(np.ones((3, 2)))
    with pytest.raises(InputError, match=r"vjp_fn: the cotangent has shape \(2, 3\) and dtype float32"):
        vjp_fn(np.ones((2, 3), dtype=np.float32))
    with pytest.raises(InputError, match=r"vjp_fn: a number is a cotangent only for a one-element output"):
        vjp_fn(1.0)
    with pytest.raises(InputError, match=r"finite_difference_hvp: tangents\[0\] has shape \(3,\) and dtype float64, but its primal has shape \(2, 3\)"):
        mt.func.finite_difference_hvp(lambda x: x.sum(), (x,), (np.ones(3),))


def test_transforms_do_not_nest_and_say_why():
    f = lambda x: (x * x * x).sum()
    x = _array((3,), 65)
    with pytest.raises(GraphError, match=r"grad: called while grad runs its f; transforms do not nest here"):
        mt.func.grad(lambda x: mt.func.grad(f)(x).sum())(x)
    with pytest.raises(GraphError, match=r"grad: called while mt.jvp runs its f"):
        mt.jvp(mt.func.grad(f), mt.tensor(x), np.ones(3))
    with pytest.raises(GraphError, match=r"jvp: called while jacobian runs its f"):
        mt.func.jacobian(lambda x: mt.func.jvp(f, (x,), (np.ones(3),))[1], mode="rev")(x)
    with pytest.raises(GraphError, match=r"grad: f's output \(shape \(\)\) does not depend on the differentiated arguments"):
        mt.func.grad(lambda x: mt.jvp(f, x, mt.tensor(np.ones(3)))[1])(x)  # a derivative has no graph
    mt.func.grad(f)(x)  # a refused nesting leaves nothing behind


def test_no_grad_and_callables_are_named():
    with pytest.raises(InputTypeError, match=r"jacobian: f must be callable"):
        mt.func.jacobian(3)
    with mt.no_grad(), pytest.raises(InputError, match=r"grad: gradients are disabled \(inside mt.no_grad\(\)\)"):
        mt.func.grad(lambda x: x.sum())(_array((2,), 66))
    with pytest.raises(InputError, match=r"finite_difference_hvp: eps must be a number between 0 and 1, got 0"):
        mt.func.finite_difference_hvp(lambda x: x.sum(), (_array((2,), 67),), (_array((2,), 68),), eps=0)
