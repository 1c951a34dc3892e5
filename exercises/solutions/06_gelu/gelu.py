"""Exercise 6: GELU backward. The reference solution.

    y = x/2 (1 + tanh u),   u = k (x + a x³),   k = √(2/π),   a = 0.044715
    dL/dx = dL/dy · dy/dx, elementwise
"""
import math

import numpy as np

from microtensor.autograd import Function
from microtensor.errors import InputTypeError
from microtensor.kernels import kernel

SQRT_2_OVER_PI = math.sqrt(2 / math.pi)  # k
CUBIC = 0.044715  # a


@kernel
def gelu_forward(x, y):
    """y[i] = x/2 (1 + tanh u),  u = k (x + a x³);  x, y: (N,)."""
    real = x.dtype.type  # every constant in x's float type: float32 stays float32
    half, one, k, a = real(0.5), real(1), real(SQRT_2_OVER_PI), real(CUBIC)
    for i in range(x.shape[0]):
        u = k * (x[i] + a * x[i] ** 3)
        y[i] = half * x[i] * (one + np.tanh(u))


@kernel
def gelu_backward(grad_y, x, grad_x):
    """grad_x[i] = dL/dx_i, from grad_y = dL/dy and the input x;  all (N,)."""
    real = x.dtype.type
    half, one, three, k, a = real(0.5), real(1), real(3), real(SQRT_2_OVER_PI), real(CUBIC)
    for i in range(x.shape[0]):
        tanh_u = np.tanh(k * (x[i] + a * x[i] ** 3))
        du_dx = k * (one + three * a * x[i] * x[i])
        dy_dx = half * (one + tanh_u) + half * x[i] * (one - tanh_u * tanh_u) * du_dx  # product rule, then chain rule
        grad_x[i] = grad_y[i] * dy_dx


class GELU(Function):
    @staticmethod
    def forward(ctx, x):
        flat = np.ascontiguousarray(x).reshape(-1)  # (N,): the kernels loop over a flat view
        y = np.empty_like(flat)
        gelu_forward(flat, y)
        ctx.save_for_backward(flat)  # backward recomputes tanh u from x
        ctx.shape = x.shape
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, grad_out):
        (flat,) = ctx.saved_tensors
        grad_x = np.empty_like(flat)
        gelu_backward(np.ascontiguousarray(grad_out).reshape(-1), flat, grad_x)
        return grad_x.reshape(ctx.shape)


def gelu(x):
    """GELU (the tanh form) of a float tensor of any shape."""
    if x.dtype not in (np.float32, np.float64):
        raise InputTypeError(f"gelu: expected a float32 or float64 tensor, got {x.dtype}")
    return GELU.apply(x)
