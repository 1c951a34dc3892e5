"""The checks of exercise 3. Run them with `python -m exercises check softmax`."""
import numpy as np

import microtensor as mt
import microtensor.functional as F
from exercises.checking import expect, expect_close, float64_arithmetic, gradcheck, random_tensor


def softmax_numpy(x):
    """softmax over the last dim, in numpy (shifted by the row max, as it must be)."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def jacobian_by_finite_differences(x_row, h=1e-6):
    """(C, C): column j is (softmax(x + h e_j) - softmax(x - h e_j)) / 2h, that is dy/dx_j."""
    columns = [(softmax_numpy(x_row + h * e) - softmax_numpy(x_row - h * e)) / (2 * h) for e in np.eye(x_row.size)]
    return np.stack(columns, axis=1)


def test_forward_matches_numpy(impl):
    """the forward equals a numpy softmax over the last dim"""
    x = random_tensor((3, 5), seed=1)
    expect_close("softmax(x) of shape (3, 5)", impl.softmax(x), softmax_numpy(x.numpy()), "numpy's softmax")


def test_jacobian_matches_finite_differences(impl):
    """softmax_jacobian(y) equals the Jacobian measured by finite differences"""
    for seed, size in enumerate((4, 5, 1)):
        x_row = np.random.default_rng(seed).uniform(-2, 2, size=size)
        y_row = softmax_numpy(x_row)
        expect_close(
            f"softmax_jacobian(y) for C = {size} (entry [i, j] is dy_i/dx_j)", impl.softmax_jacobian(y_row),
            jacobian_by_finite_differences(x_row), "finite differences of softmax in numpy", atol=1e-8, rtol=1e-6,
        )  # fmt: skip


def test_jacobian_matches_microtensor(impl):
    """softmax_jacobian(y) equals microtensor's F.softmax_jacobian, in float64 and in float32"""
    for dtype, atol in ((np.float64, 1e-15), (np.float32, 1e-7)):
        y_row = softmax_numpy(np.random.default_rng(3).uniform(-2, 2, size=6)).astype(dtype)
        expect_close(
            f"softmax_jacobian(y) of a {np.dtype(dtype).name} y of 6 numbers", impl.softmax_jacobian(y_row),
            F.softmax_jacobian(y_row), "F.softmax_jacobian", atol=atol, rtol=1e-6,
        )  # fmt: skip


def test_gradient_matches_finite_differences(impl):
    """gradcheck: the backward against finite differences, random upstream gradient"""
    for seed, shape in enumerate([(2, 5), (4,), (2, 3, 4), (3, 1)]):
        gradcheck(impl.softmax, [random_tensor(shape, seed=seed)])


def test_backward_is_jacobian_transposed_times_g(impl):
    """each row of the gradient is Jᵀ g, with J from your softmax_jacobian"""
    x = random_tensor((3, 5), seed=4)
    upstream = np.random.default_rng(5).normal(size=(3, 5))
    y = impl.softmax(x)
    y.backward(mt.tensor(upstream))
    for r in range(3):
        jacobian = np.asarray(impl.softmax_jacobian(y.numpy()[r]))
        expect(jacobian.shape == (5, 5), f"softmax_jacobian of a row of 5 numbers has shape {jacobian.shape}, expected (5, 5)")
        expect_close(
            f"row {r} of dL/dx of shape (3, 5)", x.grad[r], jacobian.T @ upstream[r],
            "softmax_jacobian(y[r]).T @ g[r]", atol=1e-12, rtol=1e-9,
        )  # fmt: skip


def test_float32_gradient_matches_microtensor(impl):
    """in float32 the gradient equals microtensor's own F.softmax"""
    x_values = np.random.default_rng(6).uniform(-3, 3, size=(4, 6)).astype(np.float32)
    upstream = np.random.default_rng(7).normal(size=(4, 6)).astype(np.float32)
    x = mt.tensor(x_values, requires_grad=True)
    impl.softmax(x).backward(mt.tensor(upstream))
    reference = mt.tensor(x_values, requires_grad=True)
    F.softmax(reference, dim=-1).backward(mt.tensor(upstream))
    expect_close("dL/dx of shape (4, 6) in float32", x.grad, reference.grad, "F.softmax's backward", atol=1e-6, rtol=1e-5)


def test_float32_arithmetic_stays_float32(impl):
    """compiled, the backward kernel computes in float32 for float32 arrays (no bare 0.0)"""
    y = softmax_numpy(np.random.default_rng(8).uniform(-2, 2, size=(3, 4))).astype(np.float32)
    grad_y = np.random.default_rng(9).normal(size=(3, 4)).astype(np.float32)
    grad_x = np.empty_like(y)
    impl.softmax_backward(y, grad_y, grad_x)  # runs at all (not a TODO any more)
    promoted = float64_arithmetic(impl.softmax_backward, y, grad_y, grad_x)
    expect(not promoted, f"softmax_backward computes {', '.join(promoted)} in float64 for float32 arrays: "
           "a bare Python number such as 0.0 is a float64 to Numba; start the sum at y.dtype.type(0)")


def test_large_logits(impl):
    """logits near ±1000 (the forward is given; this checks that your backward stays finite and correct there)"""
    rows = np.array([[1000.0, 1001.0, 999.0, 1000.5], [-1000.0, -1002.0, -999.0, -1001.0]])
    upstream = np.array([[0.5, -1.0, 2.0, 0.0], [1.0, 0.3, -0.7, 0.2]])
    for dtype, atol in ((np.float64, 1e-12), (np.float32, 1e-6)):
        x = mt.tensor(rows.astype(dtype), requires_grad=True)
        y = impl.softmax(x)
        y.backward(mt.tensor(upstream.astype(dtype)))
        y_expected = softmax_numpy(rows)
        grad_expected = y_expected * (upstream - (upstream * y_expected).sum(axis=-1, keepdims=True))
        name = np.dtype(dtype).name
        expect_close(f"softmax of logits near ±1000 in {name}", y, y_expected.astype(dtype), "numpy's shifted softmax", atol=atol, rtol=1e-5)
        expect_close(
            f"dL/dx at logits near ±1000 in {name}", x.grad, grad_expected.astype(dtype),
            "y (g - <g, y>) in numpy, float64", atol=atol, rtol=1e-5,
        )  # fmt: skip
