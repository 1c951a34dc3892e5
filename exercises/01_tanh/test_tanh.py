"""The checks of exercise 1. Run them with `python -m exercises check tanh`."""
import numpy as np

import microtensor as mt
import microtensor.functional as F
from exercises.checking import expect, expect_close, float64_arithmetic, gradcheck, random_tensor


def test_forward_matches_numpy(impl):
    """the forward equals numpy's tanh"""
    x = random_tensor((3, 5), seed=1)
    expect_close("tanh(x) of shape (3, 5)", impl.tanh(x), np.tanh(x.numpy()), "np.tanh")


def test_gradient_matches_finite_differences(impl):
    """gradcheck: the backward against finite differences, random upstream gradient"""
    for seed, shape in enumerate([(7,), (3, 4), (2, 3, 2)]):
        gradcheck(impl.tanh, [random_tensor(shape, seed=seed)])


def test_float32_gradient_matches_microtensor(impl):
    """in float32 the gradient equals microtensor's own F.tanh"""
    x_values = np.random.default_rng(2).uniform(-3, 3, size=(4, 6)).astype(np.float32)
    upstream = np.random.default_rng(3).normal(size=(4, 6)).astype(np.float32)
    x = mt.tensor(x_values, requires_grad=True)
    impl.tanh(x).backward(mt.tensor(upstream))
    reference = mt.tensor(x_values, requires_grad=True)
    F.tanh(reference).backward(mt.tensor(upstream))
    expect_close("dL/dx in float32", x.grad, reference.grad, "F.tanh's backward", atol=1e-6, rtol=1e-5)


def test_float32_arithmetic_stays_float32(impl):
    """compiled, the backward kernel computes in float32 for float32 arrays (no bare 1.0)"""
    y, grad_y, grad_x = (np.linspace(-0.9, 0.9, 5).astype(np.float32) for _ in range(3))
    impl.tanh_backward(y, grad_y, grad_x)  # runs at all (not a TODO any more)
    promoted = float64_arithmetic(impl.tanh_backward, y, grad_y, grad_x)
    expect(not promoted, f"tanh_backward computes {', '.join(promoted)} in float64 for float32 arrays: "
           "a bare Python number such as 1.0 is a float64 to Numba; write one = y.dtype.type(1)")


def test_saturated_inputs(impl):
    """large |x| (tanh saturates): the gradient is finite and equals 1 - y^2"""
    x = mt.tensor(np.array([-20.0, -8.0, 0.0, 8.0, 20.0]), requires_grad=True)
    impl.tanh(x).backward(mt.tensor(np.ones(5)))
    expected = 1 - np.tanh(x.numpy()) ** 2
    expect_close("dL/dx at x = -20, -8, 0, 8, 20", x.grad, expected, "1 - tanh(x)^2 in numpy", atol=1e-12)
