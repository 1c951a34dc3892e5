"""GELU, the Gaussian error linear unit: y = x Φ(x), with Φ the standard normal CDF.

Two forms, as in PyTorch:

    approximate="none":  y = x Φ(x) = x/2 (1 + erf(x / √2))
        dy/dx = Φ(x) + x φ(x),        φ(x) = e^(-x²/2) / √(2π)   (product rule; Φ' = φ)

    approximate="tanh":  y = x/2 (1 + tanh u),   u = k (x + a x³),  k = √(2/π),  a = 0.044715
        dy/dx = 1/2 (1 + tanh u) + x/2 (1 - tanh² u) k (1 + 3 a x²)   (tanh' = 1 - tanh²)

Elementwise, so backward is dL/dx = g * dy/dx. The kernels run over a flat view; backward
recomputes dy/dx from the saved input instead of saving intermediates. Constants are passed in
the input's dtype so that float32 math stays float32. tanh comes from vector_math.py, written so
that the loop vectorizes (the C library's tanh, one number at a time, made the tanh form ~10x
slower); erf is still the C library's.
"""
import math

import numpy as np
from numba import njit, prange

from ..autograd import Function
from ..gradcheck import gradcheck_case
from .checks import check_float
from .vector_math import tanh

SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
INV_SQRT_2 = 1 / math.sqrt(2)
INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)
CUBIC = 0.044715


def gelu_reference(x, approximate="tanh"):
    """Plain numpy GELU (the test oracle); the erf form through math.erf, one number at a time."""
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(SQRT_2_OVER_PI * (x + CUBIC * x**3)))
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1 + erf(x * INV_SQRT_2))


@njit(cache=True, parallel=True, error_model="numpy")
def gelu_tanh_forward(x, y, half, k, cubic):
    one = x.dtype.type(1)  # a bare 1 would make float32 math float64
    for i in prange(x.shape[0]):
        xi = x[i]
        y[i] = half * xi * (one + tanh(k * (xi + cubic * xi * xi * xi)))


@njit(cache=True, parallel=True, error_model="numpy")
def gelu_tanh_backward(grad_out, x, grad_x, half, k, cubic):
    one, three = x.dtype.type(1), x.dtype.type(3)
    for i in prange(x.shape[0]):
        xi = x[i]
        t = tanh(k * (xi + cubic * xi * xi * xi))
        dy_dx = half * (one + t) + half * xi * (one - t * t) * k * (one + three * cubic * xi * xi)
        grad_x[i] = grad_out[i] * dy_dx


@njit(cache=True, parallel=True, error_model="numpy")
def gelu_erf_forward(x, y, half, inv_sqrt_2):
    one = x.dtype.type(1)
    for i in prange(x.shape[0]):
        xi = x[i]
        y[i] = half * xi * (one + math.erf(xi * inv_sqrt_2))


@njit(cache=True, parallel=True, error_model="numpy")
def gelu_erf_backward(grad_out, x, grad_x, half, inv_sqrt_2, inv_sqrt_2pi):
    one = x.dtype.type(1)
    for i in prange(x.shape[0]):
        xi = x[i]
        cdf = half * (one + math.erf(xi * inv_sqrt_2))
        pdf = inv_sqrt_2pi * np.exp(-half * xi * xi)
        grad_x[i] = grad_out[i] * (cdf + xi * pdf)


class GELU(Function):
    @staticmethod
    def forward(ctx, x, approximate):
        flat = np.ascontiguousarray(x).reshape(-1)
        y = np.empty_like(flat)
        t = x.dtype.type
        if approximate == "tanh":
            gelu_tanh_forward(flat, y, t(0.5), t(SQRT_2_OVER_PI), t(CUBIC))
        else:
            gelu_erf_forward(flat, y, t(0.5), t(INV_SQRT_2))
        ctx.save_for_backward(flat)
        ctx.approximate, ctx.shape = approximate, x.shape
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, grad_out):
        (flat,) = ctx.saved_tensors
        g = np.ascontiguousarray(grad_out).reshape(-1)
        grad_x = np.empty_like(flat)
        t = flat.dtype.type
        if ctx.approximate == "tanh":
            gelu_tanh_backward(g, flat, grad_x, t(0.5), t(SQRT_2_OVER_PI), t(CUBIC))
        else:
            gelu_erf_backward(g, flat, grad_x, t(0.5), t(INV_SQRT_2), t(INV_SQRT_2PI))
        return grad_x.reshape(ctx.shape), None


def gelu(x, approximate="tanh"):
    check_float("gelu", x)
    if approximate not in ("tanh", "none"):
        raise ValueError(f'gelu: approximate must be "tanh" or "none", got {approximate!r}')
    return GELU.apply(x, approximate)


@gradcheck_case(GELU)
def _gelu_case(draw):
    x = draw.tensor(draw.shape(), -4.0, 4.0)
    approximate = draw.choice(("tanh", "none"))
    return (lambda x: gelu(x, approximate)), (x,)
