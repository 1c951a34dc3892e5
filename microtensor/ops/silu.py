"""SiLU (Swish) and the SwiGLU gate.

    silu(x) = x σ(x),   σ(x) = 1 / (1 + e^-x)
        dsilu/dx = σ(x) + x σ(x)(1 - σ(x)) = σ(x) (1 + x (1 - σ(x)))        (σ' = σ(1 - σ))

    swiglu(a, b) = silu(a) * b        a, b of one shape: the gated unit of a SwiGLU MLP,
        h = swiglu(x @ W_gate, x @ W_up) @ W_down
        dL/da = g * b * dsilu/da(a),    dL/db = g * silu(a)

σ comes from vector_math.py: from e^-|x|, so that nothing overflows, in plain arithmetic, so that the
loops vectorize. Elementwise kernels over flat views. SiLU's forward keeps σ(x) for backward (one
more array of x's size), which then needs no exponential: fwd+bwd over 768 x 512 float32 took
~270 µs instead of ~320 on 2 cores. SwiGLU's backward recomputes σ from the saved inputs.
"""
import numpy as np
from numba import njit, prange

from ..autograd import Function
from ..gradcheck import gradcheck_case
from .checks import check_float
from .vector_math import sigmoid


def silu_reference(x):
    return x / (1 + np.exp(-x))


@njit(cache=True, parallel=True, error_model="numpy")
def silu_forward(x, y, sigmoid_x):
    for i in prange(x.shape[0]):
        s = sigmoid(x[i])
        sigmoid_x[i] = s
        y[i] = x[i] * s


@njit(cache=True, parallel=True, error_model="numpy")
def silu_backward(grad_out, x, sigmoid_x, grad_x):
    one = x.dtype.type(1)
    for i in prange(x.shape[0]):
        s = sigmoid_x[i]
        grad_x[i] = grad_out[i] * s * (one + x[i] * (one - s))


@njit(cache=True, parallel=True, error_model="numpy")
def swiglu_forward(a, b, y):
    for i in prange(a.shape[0]):
        y[i] = a[i] * sigmoid(a[i]) * b[i]


@njit(cache=True, parallel=True, error_model="numpy")
def swiglu_backward(grad_out, a, b, grad_a, grad_b):
    one = a.dtype.type(1)
    for i in prange(a.shape[0]):
        s = sigmoid(a[i])
        grad_a[i] = grad_out[i] * b[i] * s * (one + a[i] * (one - s))
        grad_b[i] = grad_out[i] * a[i] * s


class SiLU(Function):
    @staticmethod
    def forward(ctx, x):
        flat = np.ascontiguousarray(x).reshape(-1)
        y, sigmoid_x = np.empty_like(flat), np.empty_like(flat)
        silu_forward(flat, y, sigmoid_x)
        ctx.save_for_backward(flat, sigmoid_x)
        ctx.shape = x.shape
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, grad_out):
        flat, sigmoid_x = ctx.saved_tensors
        grad_x = np.empty_like(flat)
        silu_backward(np.ascontiguousarray(grad_out).reshape(-1), flat, sigmoid_x, grad_x)
        return grad_x.reshape(ctx.shape)


class SwiGLU(Function):
    @staticmethod
    def forward(ctx, a, b):
        flat_a = np.ascontiguousarray(a).reshape(-1)
        flat_b = np.ascontiguousarray(b).reshape(-1)
        y = np.empty_like(flat_a)
        swiglu_forward(flat_a, flat_b, y)
        ctx.save_for_backward(flat_a, flat_b)
        ctx.shape = a.shape
        return y.reshape(a.shape)

    @staticmethod
    def backward(ctx, grad_out):
        flat_a, flat_b = ctx.saved_tensors
        grad_a, grad_b = np.empty_like(flat_a), np.empty_like(flat_b)
        swiglu_backward(np.ascontiguousarray(grad_out).reshape(-1), flat_a, flat_b, grad_a, grad_b)
        return grad_a.reshape(ctx.shape), grad_b.reshape(ctx.shape)


def silu(x):
    check_float("silu", x)
    return SiLU.apply(x)


def swiglu(a, b):
    check_float("swiglu", a, b)
    if a.shape != b.shape:
        raise ValueError(f"swiglu: gate and value must have the same shape, got {a.shape} and {b.shape}")
    return SwiGLU.apply(a, b)


@gradcheck_case(SiLU)
def _silu_case(draw):
    return silu, (draw.tensor(draw.shape(), -6.0, 6.0),)


@gradcheck_case(SwiGLU)
def _swiglu_case(draw):
    shape = draw.shape()
    return swiglu, (draw.tensor(shape, -4.0, 4.0), draw.tensor(shape))
