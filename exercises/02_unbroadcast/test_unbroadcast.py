"""The checks of exercise 2. Run them with `python -m exercises check unbroadcast`."""
import numpy as np

import microtensor as mt
import microtensor.functional as F
from exercises.checking import CheckFailed, expect, expect_close, gradcheck, random_tensor

# (the gradient's shape, the input's shape it must be summed down to)
UNBROADCAST_CASES = [
    ((3, 4), (4,)),  # a leading dim added
    ((3, 4), (3, 1)),  # a size-1 dim stretched
    ((3, 4), (1, 4)),
    ((2, 4, 3), (4, 1)),  # both: a leading dim added and a size-1 dim stretched
    ((2, 4, 3), (2, 1, 3)),
    ((2, 4, 3), (1, 1)),
    ((2, 3), ()),  # a 0-d input: everything summed
    ((2, 3), (1,)),
    ((4, 1), (1,)),  # the size-1 dim of the gradient itself stays
    ((3, 1, 2), (3, 1, 2)),  # nothing broadcast: the gradient as it is
    ((), ()),
]

# pairs of input shapes for add and mul
BROADCAST_PAIRS = [
    ((3, 4), (4,)),
    ((2, 1, 3), (4, 1)),
    ((), (2, 3)),
    ((1,), (3, 2)),
    ((3, 1), (1, 4)),
    ((2, 3), (2, 3)),
]


def unbroadcast_by_loops(grad, shape):
    """Each element of grad added into the one element of `shape` it was a copy of."""
    result = np.zeros(shape, dtype=grad.dtype)
    added = grad.ndim - len(shape)
    for index in np.ndindex(*grad.shape):
        source = tuple(0 if n == 1 else i for i, n in zip(index[added:], shape))
        result[source] += grad[index]
    return result


def test_unbroadcast_keeps_the_exact_shape(impl):
    """unbroadcast returns a numpy array of exactly the shape asked for: size-1 dims kept, () stays ()"""
    for grad_shape, shape in UNBROADCAST_CASES:
        grad = np.ones(grad_shape)
        result = impl.unbroadcast(grad, shape)
        expect(
            isinstance(result, (np.ndarray, np.generic)),
            f"unbroadcast(grad of shape {grad_shape}, {shape}) returned {type(result).__name__}, expected a numpy array "
            "(the engine accepts no other gradient)",
        )
        expect(
            result.shape == shape,
            f"unbroadcast(grad of shape {grad_shape}, {shape}) has shape {result.shape}, expected {shape} exactly "
            "(sum with keepdims=True where `shape` has a 1, or reshape at the end)",
        )


def test_unbroadcast_matches_loops(impl):
    """unbroadcast adds every copy back into the element it came from (against loops in numpy)"""
    for seed, (grad_shape, shape) in enumerate(UNBROADCAST_CASES):
        grad = np.random.default_rng(seed).normal(size=grad_shape)
        expected = unbroadcast_by_loops(grad, shape)
        expect_close(
            f"unbroadcast(grad of shape {grad_shape}, {shape})", impl.unbroadcast(grad, shape), expected,
            "a loop adding each element of grad into the element it was copied from",
        )  # fmt: skip
    grad32 = np.random.default_rng(0).normal(size=(2, 4, 3)).astype(np.float32)
    expect_close(
        "unbroadcast(float32 grad of shape (2, 4, 3), (4, 1))", impl.unbroadcast(grad32, (4, 1)),
        unbroadcast_by_loops(grad32, (4, 1)), "the loops, in float32", atol=1e-5, rtol=1e-5,
    )  # fmt: skip


def _gradients_of(function, a, b, upstream):
    """a.grad and b.grad after function(a, b).backward(upstream), with the engine's shape check in a student's words."""
    try:
        function(a, b).backward(upstream)
    except mt.GraphError as error:
        raise CheckFailed(f"{function.__name__}(a of shape {a.shape}, b of shape {b.shape}): {error}") from None
    return a.grad, b.grad


def test_gradients_have_their_inputs_shapes(impl):
    """the gradients of add and mul have exactly their inputs' shapes"""
    for function in (impl.add, impl.mul):
        for seed, (a_shape, b_shape) in enumerate(BROADCAST_PAIRS):
            a, b = random_tensor(a_shape, seed=2 * seed), random_tensor(b_shape, seed=2 * seed + 1)
            out_shape = np.broadcast_shapes(a_shape, b_shape)
            grad_a, grad_b = _gradients_of(function, a, b, np.ones(out_shape))
            for name, x, grad in (("a", a, grad_a), ("b", b, grad_b)):
                expect(
                    grad is not None and np.shape(grad) == x.shape,
                    f"{function.__name__}(a of shape {a_shape}, b of shape {b_shape}): dL/d{name} has shape "
                    f"{None if grad is None else np.shape(grad)}, expected {x.shape}, the shape of {name}",
                )


def test_add_gradient_matches_finite_differences(impl):
    """gradcheck: add's backward against finite differences, random upstream, several broadcast pairs"""
    for seed, (a_shape, b_shape) in enumerate(BROADCAST_PAIRS):
        gradcheck(impl.add, [random_tensor(a_shape, seed=2 * seed), random_tensor(b_shape, seed=2 * seed + 1)])
        gradcheck(impl.add, [random_tensor(b_shape, seed=2 * seed), random_tensor(a_shape, seed=2 * seed + 1)])


def test_mul_gradient_matches_finite_differences(impl):
    """gradcheck: mul's backward against finite differences, random upstream, several broadcast pairs"""
    for seed, (a_shape, b_shape) in enumerate(BROADCAST_PAIRS):
        gradcheck(impl.mul, [random_tensor(a_shape, seed=2 * seed), random_tensor(b_shape, seed=2 * seed + 1)])
        gradcheck(impl.mul, [random_tensor(b_shape, seed=2 * seed), random_tensor(a_shape, seed=2 * seed + 1)])


def test_float32_gradients_match_microtensor(impl):
    """in float32 the gradients equal microtensor's own F.add and F.mul, and stay float32"""
    for name, function, reference in (("add", impl.add, F.add), ("mul", impl.mul, F.mul)):
        a_values = np.random.default_rng(4).uniform(-2, 2, size=(2, 1, 3)).astype(np.float32)
        b_values = np.random.default_rng(5).uniform(-2, 2, size=(4, 1)).astype(np.float32)
        upstream = np.random.default_rng(6).normal(size=(2, 4, 3)).astype(np.float32)
        a, b = mt.tensor(a_values, requires_grad=True), mt.tensor(b_values, requires_grad=True)
        grad_a, grad_b = _gradients_of(function, a, b, upstream)
        a_ref, b_ref = mt.tensor(a_values, requires_grad=True), mt.tensor(b_values, requires_grad=True)
        reference(a_ref, b_ref).backward(upstream)
        expect_close(f"{name}: dL/da of shape (2, 1, 3) in float32", grad_a, a_ref.grad, f"F.{name}'s backward", atol=1e-6, rtol=1e-5)
        expect_close(f"{name}: dL/db of shape (4, 1) in float32", grad_b, b_ref.grad, f"F.{name}'s backward", atol=1e-6, rtol=1e-5)
