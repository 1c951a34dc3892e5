"""The checks of exercise 6. Run them with `python -m exercises check gelu`."""
import math

import numpy as np

import microtensor as mt
import microtensor.functional as F
from exercises.checking import expect, expect_close, float64_arithmetic, gradcheck, random_tensor


def gelu_numpy(x):
    """GELU's tanh form in numpy: x/2 (1 + tanh(√(2/π) (x + 0.044715 x³)))."""
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def test_forward_matches_numpy(impl):
    """the forward equals GELU's tanh form in numpy, and F.gelu (it is given)"""
    x = random_tensor((3, 5), seed=1, low=-4, high=4)
    expect_close("gelu(x) of shape (3, 5)", impl.gelu(x), gelu_numpy(x.numpy()), "numpy's tanh-form GELU")
    expect_close("gelu(x) of shape (3, 5)", impl.gelu(x), F.gelu(x), "F.gelu")


def test_gradient_matches_finite_differences(impl):
    """gradcheck: the backward against finite differences, random upstream gradient"""
    for seed, shape in enumerate([(7,), (3, 4), (2, 3, 2)]):
        gradcheck(impl.gelu, [random_tensor(shape, seed=seed, low=-4, high=4)])


def test_gradient_matches_microtensor(impl):
    """the gradient equals microtensor's own F.gelu, in float64 and in float32"""
    # float32: 1 - tanh² u loses digits as tanh saturates, differently for each way of writing it (F.gelu's
    # fast kernels compute tanh another way), hence atol 1e-5 there
    for dtype, atol, rtol in ((np.float64, 1e-12, 1e-10), (np.float32, 1e-5, 1e-5)):
        x_values = np.linspace(-5, 5, 24).reshape(4, 6).astype(dtype)
        upstream = np.random.default_rng(3).normal(size=(4, 6)).astype(dtype)
        x = mt.tensor(x_values, requires_grad=True)
        impl.gelu(x).backward(mt.tensor(upstream))
        reference = mt.tensor(x_values, requires_grad=True)
        F.gelu(reference).backward(mt.tensor(upstream))
        name = np.dtype(dtype).name
        expect_close(f"dL/dx of shape (4, 6) in {name}", x.grad, reference.grad, "F.gelu's backward", atol=atol, rtol=rtol)


def in_words(promoted):
    """Numba's names of the float64 values: your variables by name, its unnamed intermediate results counted."""
    named = [name for name in promoted if not name.startswith("$")]
    unnamed = len(promoted) - len(named)
    parts = named + ([f"{unnamed} intermediate result{'s' * (unnamed > 1)}"] if unnamed else [])
    return " and ".join([", ".join(parts[:-1]), parts[-1]]) if len(parts) > 1 else "".join(parts)


def test_float32_arithmetic_stays_float32(impl):
    """compiled, the backward kernel computes in float32 for float32 arrays (no bare 0.5 or 3)"""
    grad_y, x, grad_x = (np.linspace(-3, 3, 5).astype(np.float32) for _ in range(3))
    impl.gelu_backward(grad_y, x, grad_x)  # runs at all (not a TODO any more)
    promoted = float64_arithmetic(impl.gelu_backward, grad_y, x, grad_x)
    expect(not promoted, f"gelu_backward computes {in_words(promoted)} in float64 for float32 arrays: a bare Python number "
           "such as 0.5 or 3 is a float64 or an int64 to Numba; write real = x.dtype.type, then real(0.5), real(3)")


def test_large_inputs(impl):
    """large |x| (tanh saturates): the gradient is finite, 1 far right and 0 far left"""
    x_values = np.array([-1000.0, -50.0, -10.0, 0.0, 10.0, 50.0, 1000.0])
    expected = np.array([0.0, 0.0, 0.0, 0.5, 1.0, 1.0, 1.0])
    for dtype in (np.float64, np.float32):
        x = mt.tensor(x_values.astype(dtype), requires_grad=True)
        impl.gelu(x).backward(mt.tensor(np.ones(7, dtype=dtype)))
        name = np.dtype(dtype).name
        expect(np.all(np.isfinite(x.grad)), f"dL/dx at x = {x_values.tolist()} in {name}: yours {x.grad!r} is not finite everywhere")
        expect_close(f"dL/dx at x = -1000, -50, -10, 0, 10, 50, 1000 in {name}", x.grad, expected.astype(dtype),
                     "the limits of dy/dx (0 far left, 1/2 at 0, 1 far right)", atol=1e-6, rtol=0)
