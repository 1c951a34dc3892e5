"""Exercise 10: softplus (and Mish), a whole op in one file. The reference solution.

    softplus(x) = log(1 + e^x)            mish(x) = x tanh(softplus(x))

Softplus is a smooth relu: log(1 + e^x) is close to 0 for x very negative, close to x for x very
positive, and its derivative goes smoothly from 0 to 1.

The stable form. Written as it stands, log(1 + e^x) overflows: e^x is inf in float32 past
x = 88.7 (float64: past 709.8). Split off the larger of 1 and e^x before taking the log. For
x > 0, 1 + e^x = e^x (e^-x + 1), so log(1 + e^x) = x + log(1 + e^-x); for x <= 0 it stays as it
is. Both cases at once, with |x|:

    softplus(x) = max(x, 0) + log(1 + e^-|x|)

Now the exponent -|x| is never positive, so e^-|x| is in (0, 1] and never overflows, and
log1p(u) = log(1 + u) keeps the digits of a tiny u that 1 + u would round away (at x = -30,
e^-30 = 9.4e-14 and softplus(x) ≈ 9.4e-14, but 1 + 9.4e-14 is 1 in float32 and log(1) = 0).

The derivative, by the chain rule (log' = 1/u, (1 + e^x)' = e^x):

    dsoftplus/dx = e^x / (1 + e^x) = 1 / (1 + e^-x) = σ(x)

the logistic sigmoid, computed without overflow as ops/electives/silu.py does: 1 / (1 + e^-x) for x >= 0,
e^x / (1 + e^x) for x < 0 (the same fraction, top and bottom times e^x): the exponent used is
never positive. Elementwise, so the Jacobian is diagonal and with g = dL/dy (the shape of x):

    dL/dx = g * σ(x)

Shapes: x and y have any one shape; the kernels loop over the flat view (N,). Backward
recomputes σ from the saved x: x is kept anyway, and an exponential costs less than an array.

Mish is a composition of ops that each have a backward (softplus, tanh, a product), so the
engine's chain rule differentiates it with no backward of its own.
"""
import numpy as np

import microtensor.functional as F
from microtensor.autograd import Function
from microtensor.gradcheck import gradcheck_case
from microtensor.kernels import active, kernel
from microtensor.checks import check_float


def softplus_reference(x):
    """Plain numpy softplus of a float array x, stable for any x (the test oracle of the op)."""
    return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0)


@kernel
def softplus_forward(x, y):
    """y[i] = softplus(x[i]) = max(x, 0) + log1p(e^-|x|);  x, y: (N,)."""
    zero = x.dtype.type(0)  # a bare 0.0 would make float32 math float64
    for i in range(x.shape[0]):
        y[i] = max(x[i], zero) + np.log1p(np.exp(-abs(x[i])))


@kernel
def softplus_backward(grad_out, x, grad_x):
    """grad_x[i] = grad_out[i] * σ(x[i]), σ computed without overflow;  all (N,)."""
    one = x.dtype.type(1)
    for i in range(x.shape[0]):
        if x[i] >= 0:
            sigmoid = one / (one + np.exp(-x[i]))
        else:
            e = np.exp(x[i])  # x < 0: e^x <= 1
            sigmoid = e / (one + e)
        grad_x[i] = grad_out[i] * sigmoid


class Softplus(Function):
    @staticmethod
    def forward(ctx, x):
        flat = np.ascontiguousarray(x).reshape(-1)  # (N,): the kernels loop over a flat view
        y = np.empty_like(flat)
        active(softplus_forward)(flat, y)
        ctx.save_for_backward(flat)
        ctx.shape = x.shape
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, grad_out):
        (flat,) = ctx.saved_tensors
        grad_x = np.empty_like(flat)
        active(softplus_backward)(np.ascontiguousarray(grad_out).reshape(-1), flat, grad_x)
        return grad_x.reshape(ctx.shape)


def softplus(x):
    """softplus of a float tensor of any shape: log(1 + e^x), computed without overflow."""
    check_float("softplus", x)
    return Softplus.apply(x)


@gradcheck_case(Softplus)
def _softplus_case(draw):
    """The gradcheck case of Softplus: softplus and one float64 tensor of a drawn shape."""
    return softplus, (draw.tensor(draw.shape(), -6.0, 6.0),)


def mish(x):
    """Mish of a float tensor: x tanh(softplus(x)), built from ops (no backward of its own)."""
    return x * F.tanh(softplus(x))
