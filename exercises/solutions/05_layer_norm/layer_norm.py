"""Exercise 5: LayerNorm backward from its derivation. The reference solution.

    per row of C:  xhat = (x − μ) r,  r = 1 / sqrt(σ² + ε),  y = xhat ⊙ w + b      backward: dL/dx, dL/dw, dL/db
"""
import math

import numpy as np

import microtensor as mt
from microtensor.autograd import Function
from microtensor.errors import InputError, InputTypeError
from microtensor.kernels import kernel


@kernel
def layer_norm_forward(x, weight, bias, eps, y, mean, rstd):
    """x (N, C), weight (C,), bias (C,) -> y (N, C); saves mean (N,) and rstd (N,) for backward."""
    N, C = x.shape
    zero, one, count = x.dtype.type(0), x.dtype.type(1), x.dtype.type(C)  # typed: no float64 creeps in
    for n in range(N):
        total = zero
        for c in range(C):
            total += x[n, c]
        m = total / count  # μ
        squares = zero
        for c in range(C):
            squares += (x[n, c] - m) * (x[n, c] - m)
        r = one / np.sqrt(squares / count + eps)  # r = 1 / sqrt(σ² + ε)
        for c in range(C):
            y[n, c] = (x[n, c] - m) * r * weight[c] + bias[c]
        mean[n] = m
        rstd[n] = r


@kernel
def layer_norm_backward_input(grad_y, x, weight, mean, rstd, grad_x):
    """grad_x (N, C) = dL/dx, from grad_y = dL/dy (N, C), x, weight (C,) and the saved mean, rstd (N,)."""
    N, C = x.shape
    zero, count = x.dtype.type(0), x.dtype.type(C)
    for n in range(N):
        m, r = mean[n], rstd[n]
        d_sum = zero  # sum_i d_i
        d_xhat_sum = zero  # sum_i d_i xhat_i
        for c in range(C):
            d = grad_y[n, c] * weight[c]
            d_sum += d
            d_xhat_sum += d * (x[n, c] - m) * r
        d_mean = d_sum / count
        d_xhat_mean = d_xhat_sum / count
        for c in range(C):  # dL/dx_j = r (d_j - mean(d) - xhat_j mean(d xhat))
            xhat = (x[n, c] - m) * r
            grad_x[n, c] = r * (grad_y[n, c] * weight[c] - d_mean - xhat * d_xhat_mean)


@kernel
def layer_norm_backward_params(grad_y, x, mean, rstd, grad_weight, grad_bias):
    """grad_weight, grad_bias (C,) = dL/dw, dL/db, summed over the N rows; they arrive filled with zeros."""
    N, C = x.shape
    for n in range(N):
        m, r = mean[n], rstd[n]
        for c in range(C):
            grad_weight[c] += grad_y[n, c] * (x[n, c] - m) * r  # g_c xhat_c
            grad_bias[c] += grad_y[n, c]


class LayerNorm(Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        C = x.shape[-1]
        rows = np.ascontiguousarray(x).reshape(math.prod(x.shape[:-1]), C)  # (N, C): every leading dim counts rows
        weight, bias = np.ascontiguousarray(weight), np.ascontiguousarray(bias)
        y = np.empty_like(rows)
        mean = np.empty(rows.shape[0], dtype=x.dtype)  # (N,)
        rstd = np.empty(rows.shape[0], dtype=x.dtype)  # (N,)
        layer_norm_forward(rows, weight, bias, x.dtype.type(eps), y, mean, rstd)
        ctx.save_for_backward(rows, weight, mean, rstd)
        ctx.shape = x.shape
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, grad_out):
        rows, weight, mean, rstd = ctx.saved_tensors
        grad_y = np.ascontiguousarray(grad_out).reshape(rows.shape)  # (N, C)
        grad_x = np.empty_like(rows)
        layer_norm_backward_input(grad_y, rows, weight, mean, rstd, grad_x)
        grad_weight, grad_bias = np.zeros_like(weight), np.zeros_like(weight)  # (C,): the kernel adds into them
        layer_norm_backward_params(grad_y, rows, mean, rstd, grad_weight, grad_bias)
        return grad_x.reshape(ctx.shape), grad_weight, grad_bias, None


def layer_norm(x, weight, bias, eps=1e-5):
    """LayerNorm over the last dim of x (..., C), with weight and bias of shape (C,), all of one float dtype."""
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if not isinstance(t, mt.Tensor) or t.dtype != x.dtype or t.dtype not in (np.float32, np.float64):
            raise InputTypeError(f"layer_norm: {name} must be a float32 or float64 Tensor of x's dtype, got {type(t).__name__}")
    if x.ndim == 0 or x.shape[-1] == 0 or math.prod(x.shape) == 0:
        raise InputError(f"layer_norm: expected x of shape (..., C) with C >= 1 and at least one row, got {x.shape}")
    C = x.shape[-1]
    if weight.shape != (C,) or bias.shape != (C,):
        raise InputError(f"layer_norm: weight and bias must have shape ({C},), got {weight.shape} and {bias.shape}")
    return LayerNorm.apply(x, weight, bias, float(eps))
