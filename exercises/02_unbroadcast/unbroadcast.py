"""Exercise 2: the backward of broadcasting. The task is in README.md; write the three TODOs below.

    y = a + b  or  a * b, with numpy broadcasting      dL/da = unbroadcast(g ⊙ dy/da, a.shape)
"""
import numpy as np

from microtensor.autograd import Function
from microtensor.errors import InputError


def unbroadcast(grad, shape):
    """grad summed down to `shape`: over the leading dims broadcasting added, and over every dim
    where `shape` has size 1 and grad does not.   grad: the output's shape;  returns `shape`."""
    # TODO: return grad summed over (1) the leading dims that grad has and `shape` has not, and (2)
    # every dim where `shape` has size 1 and grad does not; the result has exactly `shape`
    # (size-1 dims kept: (4, 1) stays (4, 1), and () stays ()).
    raise NotImplementedError("TODO: unbroadcast (exercise 2)")


class Add(Function):
    """y = a + b.   dy/da = dy/db = 1, elementwise."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.shapes = (a.shape, b.shape)
        return a + b

    @staticmethod
    def backward(ctx, grad_out):
        a_shape, b_shape = ctx.shapes
        # TODO: return (dL/da, dL/db) from grad_out, with unbroadcast: each of exactly its input's shape.
        raise NotImplementedError("TODO: Add.backward (exercise 2)")


class Mul(Function):
    """y = a * b.   dy/da = b, dy/db = a, elementwise."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    def backward(ctx, grad_out):
        a, b = ctx.saved_tensors
        # TODO: return (dL/da, dL/db) from grad_out, a and b, with unbroadcast: each of its input's shape.
        raise NotImplementedError("TODO: Mul.backward (exercise 2)")


def _check_shapes(op, a, b):
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise InputError(f"{op}: shapes {a.shape} and {b.shape} do not broadcast against each other") from None


def add(a, b):
    """a + b for two float tensors of one dtype whose shapes broadcast."""
    _check_shapes("add", a, b)
    return Add.apply(a, b)


def mul(a, b):
    """a * b for two float tensors of one dtype whose shapes broadcast."""
    _check_shapes("mul", a, b)
    return Mul.apply(a, b)
