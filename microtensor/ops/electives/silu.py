"""SiLU (also called Swish) and the SwiGLU gate.

    silu(x) = x σ(x),   σ(x) = 1 / (1 + e^-x)       (σ is the logistic sigmoid)

SiLU lets x through in proportion to σ(x), which goes from 0 (x very negative) to 1 (x very
positive): a smooth relu, like GELU. Its derivative, by the product rule and σ' = σ (1 - σ):

    dsilu/dx = σ(x) + x σ(x) (1 - σ(x)) = σ(x) (1 + x (1 - σ(x)))

SwiGLU is the gated unit of a SwiGLU MLP: two projections of the same input, one of them through
SiLU, multiplied elementwise,

    h = swiglu(x @ W_gate, x @ W_up) @ W_down,     swiglu(a, b) = silu(a) * b     a, b: (B, T, F)

and its two gradients, from the product rule, with g = dL/dy of shape (B, T, F):

    dL/da = g * b * dsilu/da(a),     dL/db = g * silu(a)

Forward mode (JVP), with tangents t, ta, tb: the same diagonal Jacobians times a column,

    dsilu = dsilu/dx(x) * t,      dswiglu = dsilu/da(a) * b * ta + silu(a) * tb

Both ops are elementwise, so every Jacobian is diagonal and the kernels loop over flat views (N,)
of the contiguous arrays. Why each choice:

- σ(x) is computed from e^-x for x >= 0 and from e^x / (1 + e^x) for x < 0 (the same fraction, with
  top and bottom multiplied by e^x): e^-x of a very negative x overflows (float32 past x = -88),
  while the exponent used here is never positive, so nothing overflows.
- SiLU's forward writes σ(x) beside y and saves it for backward, in both kernel sets (one
  signature, so the sets stay interchangeable): backward's σ (1 + x (1 - σ)) then needs no
  exponential, for the price of one array of x's size.
- SwiGLU's backward recomputes σ(a) instead: it keeps a and b already, and a third saved array of
  the hidden layer's size would cost more memory than the exponential costs time.
- The loops are `prange`: each element is computed apart from the others, so the cores can share
  them without ever writing the same place.
"""
import numpy as np
from numba import prange

from ...autograd import Function, add_tangents
from ...checks import check_float
from ...errors import InputError
from ...gradcheck import gradcheck_case
from ...kernels import active, kernel


def silu_reference(x):
    """Plain numpy SiLU (the test oracle)."""
    return x / (1 + np.exp(-x))


@kernel
def sigmoid(x):
    """σ(x) = 1 / (1 + e^-x) for one number x, never overflowing."""
    one = type(x)(1)  # a bare 1 would make float32 math float64
    if x >= 0:
        return one / (one + np.exp(-x))
    e = np.exp(x)  # x < 0 (or NaN): e^x / (1 + e^x), the same value, with e^x <= 1
    return e / (one + e)


# --------------------------------------------------------------------------------- SiLU


@kernel(parallel=True)
def silu_forward(x, y, sigmoid_x):
    """y = x σ(x), and σ(x) kept for backward;  all (N,)."""
    for i in prange(x.shape[0]):
        sigmoid_x[i] = sigmoid(x[i])
        y[i] = x[i] * sigmoid_x[i]


@kernel(parallel=True)
def silu_backward(grad_out, x, sigmoid_x, grad_x):
    """grad_x = grad_out * σ (1 + x (1 - σ)), with σ = σ(x) saved by forward;  all (N,)."""
    one = x.dtype.type(1)
    for i in prange(x.shape[0]):
        s = sigmoid_x[i]
        dy_dx = s * (one + x[i] * (one - s))
        grad_x[i] = grad_out[i] * dy_dx


# --------------------------------------------------------------------------------- SwiGLU


@kernel(parallel=True)
def swiglu_forward(a, b, y):
    """y = silu(a) * b = a σ(a) b;  all (N,)."""
    for i in prange(a.shape[0]):
        y[i] = a[i] * sigmoid(a[i]) * b[i]


@kernel(parallel=True)
def swiglu_backward(grad_out, a, b, grad_a, grad_b):
    """grad_a = grad_out * b * dsilu/da,  grad_b = grad_out * silu(a);  all (N,)."""
    one = a.dtype.type(1)
    for i in prange(a.shape[0]):
        s = sigmoid(a[i])
        dsilu_da = s * (one + a[i] * (one - s))
        grad_a[i] = grad_out[i] * b[i] * dsilu_da
        grad_b[i] = grad_out[i] * a[i] * s


# --------------------------------------------------------------------------------- the ops


class SiLU(Function):
    """y = x σ(x).   dL/dx = g σ (1 + x (1 - σ)).   JVP: dy = σ (1 + x (1 - σ)) t."""

    @staticmethod
    def forward(ctx, x):
        flat = np.ascontiguousarray(x).reshape(-1)  # (N,)
        y, sigmoid_x = np.empty_like(flat), np.empty_like(flat)
        active(silu_forward)(flat, y, sigmoid_x)
        ctx.save_for_backward(flat, sigmoid_x)
        ctx.shape = x.shape
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, grad_out):
        flat, sigmoid_x = ctx.saved_tensors
        grad_x = np.empty_like(flat)
        active(silu_backward)(np.ascontiguousarray(grad_out).reshape(-1), flat, sigmoid_x, grad_x)
        return grad_x.reshape(ctx.shape)

    @staticmethod
    def jvp(ctx, tangent):
        flat, sigmoid_x = ctx.saved_tensors
        dy_dx = sigmoid_x * (1 + flat * (1 - sigmoid_x))  # (N,)
        return tangent * dy_dx.reshape(ctx.shape)


class SwiGLU(Function):
    """y = silu(a) b.   JVP: dy = dsilu/da(a) b ta + silu(a) tb."""

    @staticmethod
    def forward(ctx, a, b):
        flat_a = np.ascontiguousarray(a).reshape(-1)  # (N,)
        flat_b = np.ascontiguousarray(b).reshape(-1)  # (N,)
        y = np.empty_like(flat_a)
        active(swiglu_forward)(flat_a, flat_b, y)
        ctx.save_for_backward(flat_a, flat_b)
        ctx.shape = a.shape
        return y.reshape(a.shape)

    @staticmethod
    def backward(ctx, grad_out):
        flat_a, flat_b = ctx.saved_tensors
        grad_a, grad_b = np.empty_like(flat_a), np.empty_like(flat_b)
        active(swiglu_backward)(np.ascontiguousarray(grad_out).reshape(-1), flat_a, flat_b, grad_a, grad_b)
        return grad_a.reshape(ctx.shape), grad_b.reshape(ctx.shape)

    @staticmethod
    def jvp(ctx, tangent_a, tangent_b):
        flat_a, flat_b = ctx.saved_tensors
        a, b = flat_a.reshape(ctx.shape), flat_b.reshape(ctx.shape)
        exp_of_minus_abs = np.exp(-np.abs(a))
        sigmoid_a = np.where(a >= 0, 1 / (1 + exp_of_minus_abs), exp_of_minus_abs / (1 + exp_of_minus_abs))  # σ(a), no overflow
        return add_tangents(
            ctx.shape,
            None if tangent_a is None else sigmoid_a * (1 + a * (1 - sigmoid_a)) * b * tangent_a,
            None if tangent_b is None else a * sigmoid_a * tangent_b,
        )


def silu(x):
    """SiLU of a float tensor of any shape: x σ(x)."""
    check_float("silu", x)
    return SiLU.apply(x)


def swiglu(a, b):
    """silu(a) * b for two float tensors of one shape (the gate a and the value b)."""
    check_float("swiglu", a, b)
    if a.shape != b.shape:
        raise InputError(f"swiglu: gate and value must have the same shape, got {a.shape} and {b.shape}")
    return SwiGLU.apply(a, b)


@gradcheck_case(SiLU)
def _silu_case(draw):
    return silu, (draw.tensor(draw.shape(), -6.0, 6.0),)


@gradcheck_case(SwiGLU)
def _swiglu_case(draw):
    shape = draw.shape()
    return swiglu, (draw.tensor(shape, -4.0, 4.0), draw.tensor(shape))
