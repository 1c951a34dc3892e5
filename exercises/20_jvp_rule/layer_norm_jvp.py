"""Exercise 20: LayerNorm's forward-mode rule (JVP). The task is in README.md; write the two TODOs below.

    per row of C:  xhat = (x − μ) r,  r = 1 / sqrt(σ² + ε),  y = xhat ⊙ w + b      forward mode: dy from tx, tw, tb
"""
import math

import numpy as np

import microtensor as mt
from microtensor.autograd import Function
from microtensor.errors import InputError, InputTypeError


def normalized_tangent(tangent, xhat, rstd):
    """The tangent of xhat (N, C) along the tangent of x (N, C): dxhat = J_xhat tx, row by row.
    xhat (N, C) and rstd (N, 1) are the forward's."""
    # TODO: the two row means your derivation needs, each (N, 1), then dxhat (N, C) in one line.
    raise NotImplementedError("TODO: normalized_tangent (exercise 20)")


class LayerNorm(Function):
    """y = xhat ⊙ w + b per row of the last dim; backward given, the JVP is yours."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        C = x.shape[-1]
        rows = x.reshape(math.prod(x.shape[:-1]), C)  # (N, C)
        mean = rows.mean(axis=1, keepdims=True)  # (N, 1)
        rstd = 1 / np.sqrt(((rows - mean) ** 2).mean(axis=1, keepdims=True) + x.dtype.type(eps))  # (N, 1)
        xhat = (rows - mean) * rstd  # (N, C)
        ctx.save_for_backward(xhat, rstd, weight)
        ctx.shape = x.shape
        return (xhat * weight + bias).reshape(x.shape)

    @staticmethod
    def backward(ctx, grad_out):
        xhat, rstd, weight = ctx.saved_tensors
        g = grad_out.reshape(xhat.shape)  # (N, C)
        d = g * weight  # dL/dxhat
        grad_x = rstd * (d - d.mean(axis=1, keepdims=True) - xhat * (d * xhat).mean(axis=1, keepdims=True))
        return grad_x.reshape(ctx.shape), (g * xhat).sum(axis=0), g.sum(axis=0), None

    @staticmethod
    def jvp(ctx, tangent_x, tangent_weight, tangent_bias, _eps):
        """dy (the output's shape) from the tangents of x, weight and bias; None where one does not move."""
        xhat, rstd, weight = ctx.saved_tensors  # (N, C), (N, 1), (C,)
        # TODO: add up what each input that moves gives dy (N, C): tangent_x through normalized_tangent
        # and the weight, tangent_weight and tangent_bias directly; skip an input whose tangent is None.
        raise NotImplementedError("TODO: LayerNorm.jvp (exercise 20)")


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
