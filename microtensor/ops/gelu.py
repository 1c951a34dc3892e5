"""GELU, the Gaussian error linear unit: y = x Φ(x), with Φ the standard normal CDF.

Φ(x) is the probability that a standard normal variable is below x: GELU lets x through in
proportion to how large it is, a smooth version of relu (which lets x through when x > 0).
Two forms, as in PyTorch's `approximate` argument:

    approximate="none":  y = x Φ(x),   Φ(x) = 1/2 (1 + erf(x / √2))
    approximate="tanh":  y = x/2 (1 + tanh u),   u = k (x + a x³),   k = √(2/π),   a = 0.044715

The tanh form is a close fit of Φ by a tanh curve; it is what GPT-2 was trained with, hence the
default.

The derivatives. For the erf form, the product rule and Φ' = φ, the normal density:

    dy/dx = Φ(x) + x φ(x),   φ(x) = e^(-x²/2) / √(2π)

For the tanh form, the product rule, the chain rule and tanh' = 1 - tanh²:

    dy/dx = 1/2 (1 + tanh u) + x/2 (1 - tanh² u) du/dx,   du/dx = k (1 + 3 a x²)

Shapes. GELU is elementwise: x and y have any one shape, say (B, T, F), and the Jacobian dy/dx is
diagonal, so backward is dL/dx = g * dy/dx with g = dL/dy, of that same shape. The kernels loop
over a flat view (N,) = (B·T·F,) of the contiguous arrays, because an elementwise op does not care
where the axes are. Why each choice:

- Backward recomputes dy/dx from x rather than saving tanh u or Φ(x) from forward: x is kept
  anyway, and one extra array per GELU would cost more memory than the recomputation costs time.
- Every constant is converted to x's float type inside the kernel (`real(0.5)`), because a bare
  Python float would make Numba do float32 arithmetic in float64.
- The loops are `prange`: each element is computed apart from the others, so the cores can share
  them without ever writing the same place.
- The tanh form's kernels use 1/2 (1 + tanh u) = 1 / (1 + e^(-2u)) (multiply the top and bottom
  of 1/2 (1 + tanh u) = e^u / (e^u + e^-u) by e^-u), and so 1 - tanh² u = 4 s (1 - s) with
  s = 1 / (1 + e^(-2u)): one e^x per element, which costs a fraction of the C library's tanh, and
  no 1 + tanh u that loses its digits as tanh u nears -1. In those terms
  y = x s  and  dy/dx = s + 2 x s (1 - s) du/dx.
- math.erf and np.exp are the C library's functions, accurate to the last bit or so; the
  fast set (microtensor/fast/gelu.py) replaces them with arithmetic that vectorizes.
"""
import math

import numpy as np
from numba import prange

from ..autograd import Function
from ..checks import check_float
from ..errors import InputError
from ..gradcheck import gradcheck_case
from ..kernels import active, kernel

SQRT_2_OVER_PI = math.sqrt(2 / math.pi)  # k in the tanh form
CUBIC = 0.044715  # a in the tanh form
INV_SQRT_2 = 1 / math.sqrt(2)  # Φ(x) = 1/2 (1 + erf(x / √2))
INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)  # φ(x) = e^(-x²/2) / √(2π)


def gelu_reference(x, approximate="tanh"):
    """Plain numpy GELU (the test oracle); the erf form through math.erf, one number at a time."""
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(SQRT_2_OVER_PI * (x + CUBIC * x**3)))
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1 + erf(x * INV_SQRT_2))


# --------------------------------------------------------------------------------- the tanh form


@kernel(parallel=True)
def gelu_tanh_forward(x, y):
    """y = x/2 (1 + tanh u),  u = k (x + a x³);  x, y: (N,)."""
    real = x.dtype.type
    one, two, k, a = real(1), real(2), real(SQRT_2_OVER_PI), real(CUBIC)
    for i in prange(x.shape[0]):
        u = k * (x[i] + a * x[i] ** 3)
        s = one / (one + np.exp(-two * u))  # 1/2 (1 + tanh u), by one e^x (the module docstring)
        y[i] = x[i] * s


@kernel(parallel=True)
def gelu_tanh_backward(grad_out, x, grad_x):
    """grad_x = grad_out * dy/dx,  dy/dx = 1/2 (1 + tanh u) + x/2 (1 - tanh² u) k (1 + 3 a x²);  all (N,)."""
    real = x.dtype.type
    one, two, three, k, a = real(1), real(2), real(3), real(SQRT_2_OVER_PI), real(CUBIC)
    for i in prange(x.shape[0]):
        u = k * (x[i] + a * x[i] ** 3)
        s = one / (one + np.exp(-two * u))  # 1/2 (1 + tanh u), by one e^x; 1 - tanh² u = 4 s (1 - s)
        du_dx = k * (one + three * a * x[i] ** 2)
        dy_dx = s + two * x[i] * s * (one - s) * du_dx  # 1/2 (1 + tanh u) + x/2 (1 - tanh² u) du/dx
        grad_x[i] = grad_out[i] * dy_dx


# --------------------------------------------------------------------------------- the erf form


@kernel(parallel=True)
def gelu_erf_forward(x, y):
    """y = x Φ(x),  Φ(x) = 1/2 (1 + erf(x / √2));  x, y: (N,)."""
    real = x.dtype.type
    half, one, inv_sqrt_2 = real(0.5), real(1), real(INV_SQRT_2)
    for i in prange(x.shape[0]):
        cdf = half * (one + math.erf(x[i] * inv_sqrt_2))  # Φ(x)
        y[i] = x[i] * cdf


@kernel(parallel=True)
def gelu_erf_backward(grad_out, x, grad_x):
    """grad_x = grad_out * (Φ(x) + x φ(x)),  φ(x) = e^(-x²/2) / √(2π);  all (N,)."""
    real = x.dtype.type
    half, one, inv_sqrt_2, inv_sqrt_2pi = real(0.5), real(1), real(INV_SQRT_2), real(INV_SQRT_2PI)
    for i in prange(x.shape[0]):
        cdf = half * (one + math.erf(x[i] * inv_sqrt_2))  # Φ(x)
        pdf = inv_sqrt_2pi * np.exp(-half * x[i] * x[i])  # φ(x)
        grad_x[i] = grad_out[i] * (cdf + x[i] * pdf)


# --------------------------------------------------------------------------------- the op

class GELU(Function):
    """y = gelu(x), elementwise.   dL/dx = g * dy/dx, with dy/dx derived in the module docstring.

    JVP: dy = dy/dx * t, the same derivative (the Jacobian is diagonal), computed with numpy.
    """

    @staticmethod
    def forward(ctx, x, approximate):
        flat = np.ascontiguousarray(x).reshape(-1)  # (N,)
        y = np.empty_like(flat)
        if approximate == "tanh":
            active(gelu_tanh_forward)(flat, y)
        else:
            active(gelu_erf_forward)(flat, y)
        ctx.save_for_backward(flat)
        ctx.approximate, ctx.shape = approximate, x.shape
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, grad_out):
        (flat,) = ctx.saved_tensors
        grad_x = np.empty_like(flat)
        g = np.ascontiguousarray(grad_out).reshape(-1)  # (N,)
        if ctx.approximate == "tanh":
            active(gelu_tanh_backward)(g, flat, grad_x)
        else:
            active(gelu_erf_backward)(g, flat, grad_x)
        return grad_x.reshape(ctx.shape), None

    @staticmethod
    def jvp(ctx, tangent, _approximate):
        (flat,) = ctx.saved_tensors
        x = flat.reshape(ctx.shape)
        if ctx.approximate == "tanh":
            tanh_u = np.tanh(SQRT_2_OVER_PI * (x + CUBIC * x**3))
            dy_dx = 0.5 * (1 + tanh_u) + 0.5 * x * (1 - tanh_u**2) * SQRT_2_OVER_PI * (1 + 3 * CUBIC * x**2)
        else:
            cdf = 0.5 * (1 + np.vectorize(math.erf)(x * INV_SQRT_2))  # Φ(x)
            dy_dx = cdf + x * INV_SQRT_2PI * np.exp(-0.5 * x * x)  # Φ(x) + x φ(x)
        return (tangent * dy_dx).astype(tangent.dtype)


def gelu(x, approximate="tanh"):
    """GELU of a float tensor of any shape: approximate="tanh" (the default) or "none" (exact, with erf)."""
    check_float("gelu", x)
    if not isinstance(approximate, str) or approximate not in ("tanh", "none"):
        raise InputError(f'gelu: approximate must be "tanh" or "none", got {approximate!r}')
    return GELU.apply(x, approximate)


@gradcheck_case(GELU)
def _gelu_case(draw):
    x = draw.tensor(draw.shape(), -4.0, 4.0)
    approximate = draw.choice(("tanh", "none"))
    return (lambda x: gelu(x, approximate)), (x,)
