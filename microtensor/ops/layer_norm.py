"""LayerNorm over the last dim, with optional weight and bias.

Forward, for one row x of C numbers (every leading dim just indexes rows; the kernels see (N, C)):

    mean = (1/C) sum_i x_i                                  ()
    var  = (1/C) sum_i (x_i - mean)^2                       ()
    rstd = 1 / sqrt(var + eps)                              ()
    xhat_i = (x_i - mean) * rstd                            (C,)
    y_i  = xhat_i * w_i + b_i                               (C,)

Backward. With g = dL/dy (C,), the weight and bias gradients add up over rows:

    dL/dw_i = sum_rows g_i xhat_i        dL/db_i = sum_rows g_i         (C,)

For x, go through xhat. Let d_i = dL/dxhat_i = g_i w_i. xhat depends on x directly and through
mean and rstd:

    dxhat_i/dx_j = rstd (δ_ij - 1/C) + (x_i - mean) drstd/dx_j
    drstd/dx_j   = -1/2 (var + eps)^(-3/2) dvar/dx_j = -rstd^3 (x_j - mean) / C
                   (dvar/dx_j = (2/C)(x_j - mean), the mean's own term sums to 0)
    so dxhat_i/dx_j = rstd (δ_ij - 1/C - xhat_i xhat_j / C)

and dL/dx_j = sum_i d_i dxhat_i/dx_j = rstd (d_j - mean_i(d_i) - xhat_j mean_i(d_i xhat_i)).

Two row means and one elementwise pass: the forward saves mean and rstd per row (N,) so that
backward rebuilds xhat instead of storing it.

Forward mode (JVP). Along tangents tx (C,), tw (C,), tb (C,) of x, w, b, the same Jacobian of xhat
is applied from the other side, to a column instead of a row:

    dxhat_i = sum_j dxhat_i/dx_j tx_j = rstd (tx_i - mean_j(tx_j) - xhat_i mean_j(xhat_j tx_j))
    dy_i    = dxhat_i w_i + xhat_i tw_i + tb_i                                    (C,)

(the Jacobian of xhat is symmetric, so the JVP has the backward's form with d replaced by tx).

The kernels loop over the rows one after another with a plain `range` (the weight and bias
gradients must: every row adds into the same C sums). The fast set compiles these same loops with
other flags (microtensor/fast/layer_norm.py).
"""
import math

import numpy as np

from ..autograd import Function
from ..checks import check_float, check_last_dim, check_real, check_tensor
from ..errors import InputError
from ..gradcheck import gradcheck_case
from ..kernels import active, kernel


def layer_norm_reference(x, weight=None, bias=None, eps=1e-5):
    """Plain numpy LayerNorm over the last dim (the test oracle)."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


@kernel
def layer_norm_forward(x, weight, bias, eps, y, mean, rstd):
    """x (N, C), weight (C,), bias (C,) -> y (N, C); saves mean (N,) and rstd (N,).
    Without a weight or bias the caller passes ones or zeros."""
    N, C = x.shape
    zero, one, count = x.dtype.type(0), x.dtype.type(1), x.dtype.type(C)  # typed: no float64 creeps in
    for n in range(N):
        total = zero
        for c in range(C):
            total += x[n, c]
        m = total / count
        squares = zero
        for c in range(C):
            squares += (x[n, c] - m) * (x[n, c] - m)
        r = one / np.sqrt(squares / count + eps)
        for c in range(C):
            y[n, c] = (x[n, c] - m) * r * weight[c] + bias[c]
        mean[n] = m
        rstd[n] = r


@kernel
def layer_norm_backward_input(grad_out, x, weight, mean, rstd, grad_x):
    """grad_x (N, C) = rstd (d - mean(d) - xhat mean(d xhat)), with d = grad_out * weight, per row."""
    N, C = x.shape
    zero, count = x.dtype.type(0), x.dtype.type(C)
    for n in range(N):
        m, r = mean[n], rstd[n]
        d_sum = zero
        d_xhat_sum = zero
        for c in range(C):
            d = grad_out[n, c] * weight[c]
            d_sum += d
            d_xhat_sum += d * (x[n, c] - m) * r
        d_mean = d_sum / count
        d_xhat_mean = d_xhat_sum / count
        for c in range(C):
            xhat = (x[n, c] - m) * r
            grad_x[n, c] = r * (grad_out[n, c] * weight[c] - d_mean - xhat * d_xhat_mean)


@kernel
def layer_norm_backward_params(grad_out, x, mean, rstd, grad_weight, grad_bias):
    """grad_weight (C,) = sum over rows of grad_out * xhat; grad_bias (C,) = sum of grad_out.
    Serial over rows (every row adds into the same C sums); the inner loop over C vectorizes."""
    N, C = x.shape
    grad_weight[:] = 0
    grad_bias[:] = 0
    for n in range(N):
        m, r = mean[n], rstd[n]
        for c in range(C):
            grad_weight[c] += grad_out[n, c] * (x[n, c] - m) * r
            grad_bias[c] += grad_out[n, c]


class LayerNorm(Function):
    """y = layer_norm(x) * w + b over the last dim.   Backward and forward mode (JVP): the module docstring."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        C = x.shape[-1]
        rows = np.ascontiguousarray(x).reshape(math.prod(x.shape[:-1]), C)  # (N, C); N spelled out, as -1 fails for N*C = 0
        w = np.ones(C, dtype=x.dtype) if weight is None else np.ascontiguousarray(weight)
        b = np.zeros(C, dtype=x.dtype) if bias is None else np.ascontiguousarray(bias)
        y = np.empty_like(rows)
        mean = np.empty(rows.shape[0], dtype=x.dtype)
        rstd = np.empty(rows.shape[0], dtype=x.dtype)
        if rows.size:  # else no rows, or C = 0: an empty result (and no mean of nothing to take)
            active(layer_norm_forward)(rows, w, b, x.dtype.type(eps), y, mean, rstd)
        ctx.save_for_backward(rows, w, mean, rstd)
        ctx.shape = x.shape
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, grad_out):
        rows, w, mean, rstd = ctx.saved_tensors
        g = np.ascontiguousarray(grad_out).reshape(rows.shape)  # (N, C)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = np.empty_like(rows)
            if rows.size:
                active(layer_norm_backward_input)(g, rows, w, mean, rstd, grad_x)
            grad_x = grad_x.reshape(ctx.shape)
        grad_w = grad_b = None
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            grad_w, grad_b = np.empty_like(w), np.empty_like(w)
            active(layer_norm_backward_params)(g, rows, mean, rstd, grad_w, grad_b)
        return (
            grad_x,
            grad_w if ctx.needs_input_grad[1] else None,
            grad_b if ctx.needs_input_grad[2] else None,
            None,
        )

    @staticmethod
    def jvp(ctx, tangent_x, tangent_weight, tangent_bias, _eps):
        rows, w, mean, rstd = ctx.saved_tensors
        dtype = next(t.dtype for t in (tangent_x, tangent_weight, tangent_bias) if t is not None)
        if rows.size == 0:
            return np.zeros(ctx.shape, dtype=dtype)
        xhat = (rows - mean[:, None]) * rstd[:, None]  # (N, C)
        tangent_y = np.zeros(rows.shape, dtype=dtype)  # (N, C)
        if tangent_x is not None:
            t = tangent_x.reshape(rows.shape)  # (N, C)
            tangent_xhat = rstd[:, None] * (t - t.mean(axis=1, keepdims=True) - xhat * (xhat * t).mean(axis=1, keepdims=True))
            tangent_y += tangent_xhat * w
        if tangent_weight is not None:
            tangent_y += xhat * tangent_weight
        if tangent_bias is not None:
            tangent_y += tangent_bias
        return tangent_y.reshape(ctx.shape)


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """Normalize over the last dim to zero mean and unit variance, then scale by weight and shift by bias.
    weight and bias, when given, have shape (C,) exactly, C = x.shape[-1]; eps > 0 and finite.

    An empty last dim (C = 0) has no mean to subtract: the result is empty too, of x's shape, and so
    are the gradients (nothing depends on anything). So is the result when there are no rows."""
    check_tensor("layer_norm", x, "x")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            check_tensor("layer_norm", t, name)
    check_float("layer_norm", *[t for t in (x, weight, bias) if t is not None])
    if x.ndim == 0:
        raise InputError("layer_norm: expected at least 1 dim, got a 0-d tensor")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            check_last_dim("layer_norm", name, t, x.shape[-1])
    eps = check_real("layer_norm", "eps", eps, low=0, low_open=True)
    return LayerNorm.apply(x, weight, bias, eps)


@gradcheck_case(LayerNorm)
def _layer_norm_case(draw):
    shape = draw.shape(min_dims=1, max_dims=3, min_side=2)
    x = draw.tensor(shape, distinct=True)  # spread-out values: no row is near zero variance
    C = shape[-1]
    weight = draw.tensor((C,), 0.5, 1.5) if draw.boolean() else None
    bias = draw.tensor((C,)) if draw.boolean() else None
    return (lambda x, weight, bias: layer_norm(x, weight, bias)), (x, weight, bias)
