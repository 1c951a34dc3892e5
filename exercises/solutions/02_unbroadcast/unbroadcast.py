"""Exercise 2: the backward of broadcasting. The reference solution.

    y = a + b  or  a * b, with numpy broadcasting      dL/da = unbroadcast(g ⊙ dy/da, a.shape)
"""
import numpy as np

from microtensor.autograd import Function
from microtensor.errors import InputError


def unbroadcast(grad, shape):
    """grad summed down to `shape`: over the leading dims broadcasting added, and over every dim
    where `shape` has size 1 and grad does not.   grad: the output's shape;  returns `shape`."""
    shape = tuple(shape)
    added = grad.ndim - len(shape)  # the leading dims broadcasting put in front of `shape`
    summed = grad.sum(axis=tuple(range(added)))  # now of len(shape) dims
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and summed.shape[i] != 1)
    summed = summed.sum(axis=stretched, keepdims=True)  # keepdims: the size-1 dims stay
    return np.asarray(summed).reshape(shape)  # a 0-d sum comes back as a numpy scalar


class Add(Function):
    """y = a + b.   dy/da = dy/db = 1, elementwise."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.shapes = (a.shape, b.shape)
        return a + b

    @staticmethod
    def backward(ctx, grad_out):
        a_shape, b_shape = ctx.shapes
        return unbroadcast(grad_out, a_shape), unbroadcast(grad_out, b_shape)


class Mul(Function):
    """y = a * b.   dy/da = b, dy/db = a, elementwise."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    def backward(ctx, grad_out):
        a, b = ctx.saved_tensors
        return unbroadcast(grad_out * b, a.shape), unbroadcast(grad_out * a, b.shape)


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
