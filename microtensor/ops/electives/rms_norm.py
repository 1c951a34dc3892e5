"""RMSNorm over the last dim, with an optional weight: LayerNorm without the mean.

Forward, for one row x of C numbers (the kernels see (N, C)):

    rstd = 1 / sqrt((1/C) sum_i x_i^2 + eps)                ()
    xhat_i = x_i * rstd                                     (C,)
    y_i  = xhat_i * w_i                                     (C,)

Backward, with g = dL/dy (C,) and d_i = dL/dxhat_i = g_i w_i:

    dL/dw_i = sum_rows g_i xhat_i                                        (C,)
    drstd/dx_j = -1/2 rstd^3 (2 x_j / C) = -rstd^3 x_j / C
    dxhat_i/dx_j = rstd δ_ij + x_i drstd/dx_j = rstd (δ_ij - xhat_i xhat_j / C)
    dL/dx_j = sum_i d_i dxhat_i/dx_j = rstd (d_j - xhat_j mean_i(d_i xhat_i))   (C,)

The forward saves rstd per row (N,); backward rebuilds xhat from x.

Forward mode (JVP), along tangents tx (C,) and tw (C,): the same (symmetric) Jacobian of xhat times
a column,

    dxhat_i = sum_j rstd (δ_ij - xhat_i xhat_j / C) tx_j = rstd (tx_i - xhat_i mean_j(xhat_j tx_j))
    dy_i    = dxhat_i w_i + xhat_i tw_i                                           (C,)

The kernels loop over the rows one after the other, like layer_norm.py's. The fast set compiles
these same loops with other flags (microtensor/fast/electives/rms_norm.py).
"""
import math

import numpy as np

from ...autograd import Function
from ...checks import check_float, check_last_dim, check_real, check_tensor
from ...errors import InputError
from ...gradcheck import gradcheck_case
from ...kernels import active, kernel


def rms_norm_reference(x, weight=None, eps=1e-5):
    """Plain numpy RMSNorm over the last dim (the test oracle)."""
    y = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    return y if weight is None else y * weight


@kernel
def rms_norm_forward(x, weight, eps, y, rstd):
    """x (N, C), weight (C,) -> y (N, C); saves rstd (N,)."""
    N, C = x.shape
    zero, one, count = x.dtype.type(0), x.dtype.type(1), x.dtype.type(C)  # typed: no float64 creeps in
    for n in range(N):
        squares = zero
        for c in range(C):
            squares += x[n, c] * x[n, c]
        r = one / np.sqrt(squares / count + eps)
        for c in range(C):
            y[n, c] = x[n, c] * r * weight[c]
        rstd[n] = r


@kernel
def rms_norm_backward_input(grad_out, x, weight, rstd, grad_x):
    """grad_x (N, C) = rstd (d - xhat mean(d xhat)), with d = grad_out * weight, per row."""
    N, C = x.shape
    zero, count = x.dtype.type(0), x.dtype.type(C)
    for n in range(N):
        r = rstd[n]
        d_xhat_sum = zero
        for c in range(C):
            d_xhat_sum += grad_out[n, c] * weight[c] * x[n, c] * r
        d_xhat_mean = d_xhat_sum / count
        for c in range(C):
            grad_x[n, c] = r * (grad_out[n, c] * weight[c] - x[n, c] * r * d_xhat_mean)


@kernel
def rms_norm_backward_weight(grad_out, x, rstd, grad_weight):
    """grad_weight (C,) = sum over rows of grad_out * xhat (serial: every row adds into the same sums)."""
    N, C = x.shape
    grad_weight[:] = 0
    for n in range(N):
        for c in range(C):
            grad_weight[c] += grad_out[n, c] * x[n, c] * rstd[n]


class RMSNorm(Function):
    """y = x rstd w over the last dim.   Backward and forward mode (JVP): the module docstring."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        C = x.shape[-1]
        rows = np.ascontiguousarray(x).reshape(math.prod(x.shape[:-1]), C)  # (N, C); N spelled out, as -1 fails for N*C = 0
        w = np.ones(C, dtype=x.dtype) if weight is None else np.ascontiguousarray(weight)
        y = np.empty_like(rows)
        rstd = np.empty(rows.shape[0], dtype=x.dtype)
        if rows.size:  # else no rows, or C = 0: an empty result (and no mean of nothing to take)
            active(rms_norm_forward)(rows, w, x.dtype.type(eps), y, rstd)
        ctx.save_for_backward(rows, w, rstd)
        ctx.shape = x.shape
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, grad_out):
        rows, w, rstd = ctx.saved_tensors
        g = np.ascontiguousarray(grad_out).reshape(rows.shape)  # (N, C)
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_x = np.empty_like(rows)
            if rows.size:
                active(rms_norm_backward_input)(g, rows, w, rstd, grad_x)
            grad_x = grad_x.reshape(ctx.shape)
        if ctx.needs_input_grad[1]:
            grad_w = np.empty_like(w)
            active(rms_norm_backward_weight)(g, rows, rstd, grad_w)
        return grad_x, grad_w, None

    @staticmethod
    def jvp(ctx, tangent_x, tangent_weight, _eps):
        rows, w, rstd = ctx.saved_tensors
        dtype = next(t.dtype for t in (tangent_x, tangent_weight) if t is not None)
        if rows.size == 0:
            return np.zeros(ctx.shape, dtype=dtype)
        xhat = rows * rstd[:, None]  # (N, C)
        tangent_y = np.zeros(rows.shape, dtype=dtype)  # (N, C)
        if tangent_x is not None:
            t = tangent_x.reshape(rows.shape)  # (N, C)
            tangent_y += rstd[:, None] * (t - xhat * (xhat * t).mean(axis=1, keepdims=True)) * w
        if tangent_weight is not None:
            tangent_y += xhat * tangent_weight
        return tangent_y.reshape(ctx.shape)


def rms_norm(x, weight=None, eps=1e-5):
    """Divide by the root mean square over the last dim, then scale by weight ((C,) exactly, if
    given); eps > 0 and finite. An empty last dim (C = 0) gives an empty result of x's shape, as in
    layer_norm."""
    check_tensor("rms_norm", x, "x")
    if weight is not None:
        check_tensor("rms_norm", weight, "weight")
    check_float("rms_norm", *[t for t in (x, weight) if t is not None])
    if x.ndim == 0:
        raise InputError("rms_norm: expected at least 1 dim, got a 0-d tensor")
    if weight is not None:
        check_last_dim("rms_norm", "weight", weight, x.shape[-1])
    eps = check_real("rms_norm", "eps", eps, low=0, low_open=True)
    return RMSNorm.apply(x, weight, eps)


@gradcheck_case(RMSNorm)
def _rms_norm_case(draw):
    shape = draw.shape(min_dims=1, max_dims=3)
    x = draw.tensor(shape, 0.3, 2.0) if draw.boolean() else draw.tensor(shape, away_from=0.0)
    weight = draw.tensor((shape[-1],), 0.5, 1.5) if draw.boolean() else None
    return (lambda x, weight: rms_norm(x, weight)), (x, weight)
