"""Exercise 10: softplus (and Mish), a whole op in one file. The task is in README.md; write the TODOs below.

    softplus(x) = log(1 + e^x)            mish(x) = x tanh(softplus(x))

TODO (not checked, but part of the op): replace this paragraph with the derivation, as every op
file of microtensor opens with its own: the stable form of softplus and why it cannot overflow,
its derivative, dL/dx with g = dL/dy, the shapes, and why mish needs no backward of its own.
"""
import numpy as np

import microtensor.functional as F
from microtensor.autograd import Function
from microtensor.gradcheck import gradcheck_case
from microtensor.kernels import active, kernel
from microtensor.checks import check_float


def softplus_reference(x):
    """Plain numpy softplus of a float array x, stable for any x (the test oracle of the op)."""
    # TODO: return max(x, 0) + log1p(e^-|x|), elementwise, with numpy (np.maximum, np.log1p, ...).
    raise NotImplementedError("TODO: softplus_reference (exercise 10)")


@kernel
def softplus_forward(x, y):
    """y[i] = softplus(x[i]) = max(x, 0) + log1p(e^-|x|);  x, y: (N,)."""
    # TODO: a loop over i writing y[i]. Use a typed zero, x.dtype.type(0), for the max, so that
    # float32 stays float32 when compiled.
    raise NotImplementedError("TODO: softplus_forward (exercise 10)")


@kernel
def softplus_backward(grad_out, x, grad_x):
    """grad_x[i] = grad_out[i] * σ(x[i]), σ computed without overflow;  all (N,)."""
    # TODO: a loop over i: σ(x) = 1 / (1 + e^-x) when x >= 0, e^x / (1 + e^x) when x < 0 (so the
    # exponent is never positive), times grad_out[i], into grad_x[i]. Typed constants: x.dtype.type(1).
    raise NotImplementedError("TODO: softplus_backward (exercise 10)")


class Softplus(Function):
    @staticmethod
    def forward(ctx, x):
        # TODO: x is a numpy array of any shape (maybe not contiguous). Take its flat contiguous
        # view (N,), make y with np.empty_like, run active(softplus_forward) on them, save what
        # backward needs (ctx.save_for_backward(...), ctx.shape = x.shape), return y in x's shape.
        raise NotImplementedError("TODO: Softplus.forward (exercise 10)")

    @staticmethod
    def backward(ctx, grad_out):
        # TODO: read ctx.saved_tensors, run active(softplus_backward) on the flat contiguous
        # grad_out, return dL/dx in the shape of x.
        raise NotImplementedError("TODO: Softplus.backward (exercise 10)")


def softplus(x):
    """softplus of a float tensor of any shape: log(1 + e^x), computed without overflow."""
    # TODO: check the input with check_float (a non-float tensor must raise an error that names
    # "softplus"), then return Softplus.apply(x).
    raise NotImplementedError("TODO: softplus (exercise 10)")


# TODO: register the case below for Softplus: put the decorator @gradcheck_case(Softplus) above it.
def _softplus_case(draw):
    """The gradcheck case of Softplus: softplus and one float64 tensor of a drawn shape."""
    # TODO: return (fn, inputs): softplus, and a 1-tuple holding draw.tensor(shape, low, high) of a
    # shape drawn by draw.shape(), values in about [-6, 6].
    raise NotImplementedError("TODO: _softplus_case (exercise 10)")


def mish(x):
    """Mish of a float tensor: x tanh(softplus(x)), built from ops (no backward of its own)."""
    # TODO: one line: compose softplus, F.tanh and the product of tensors.
    raise NotImplementedError("TODO: mish (exercise 10)")
