"""Softmax and log-softmax along one dim, with backward as a Jacobian-vector product.

Forward. For one row x of C numbers (the softmax dim; every other dim just indexes rows):

    y_i = e^{x_i} / sum_j e^{x_j}                                  softmax,     (C,) -> (C,)
    z_i = log y_i = x_i - log sum_j e^{x_j}                        log-softmax

e^{x_j} overflows float32 for x_j > 88, so both are computed from the shifted row x - m, with
m = max_j x_j: the shift cancels (e^{x_i - m} / sum_j e^{x_j - m} = y_i), every exponent is <= 0, so
no e^{...} exceeds 1, and the largest is exactly e^0 = 1, so the sum is >= 1 and its log is finite:

    s = sum_j e^{x_j - m}          y_i = e^{x_i - m} / s           z_i = (x_i - m) - log s

Backward of softmax. Each y_i depends on every x_j of its row. Differentiating
y_i = e^{x_i} / S with S = sum_k e^{x_k} (quotient rule, dS/dx_j = e^{x_j}):

    dy_i/dx_j = (δ_ij e^{x_i} S - e^{x_i} e^{x_j}) / S^2 = y_i (δ_ij - y_j)

so the Jacobian of one row is J = diag(y) - y yᵀ, (C, C), symmetric. Backward must give, for the
upstream gradient g = dL/dy (C,), the vector-Jacobian product dL/dx = Jᵀ g:

    dx_j = sum_i g_i dy_i/dx_j = sum_i g_i y_i (δ_ij - y_j) = y_j g_j - y_j sum_i g_i y_i
         = y_j (g_j - <g, y>)                                       (C,)

One dot product <g, y> per row and one elementwise pass: O(C) work and memory, where building J
would take O(C^2). `softmax_jacobian` builds J anyway, for teaching and for the tests.

Backward of log-softmax. dz_i/dx_j = δ_ij - dlog S/dx_j = δ_ij - y_j, so

    dx_j = sum_i g_i (δ_ij - y_j) = g_j - y_j sum_i g_i             (C,)

where y_j = e^{z_j} is recomputed from the saved output z (so forward stores one array, not two).

Forward mode (JVP). Along a tangent t (C,) of x, the same J multiplies a column: J t. J is
symmetric, so softmax's JVP has the form of its backward, and log-softmax's is the transpose of its
backward's (the sum moves from g to t weighted by y):

    dy_i = sum_j y_i (δ_ij - y_j) t_j = y_i (t_i - <y, t>)                         (C,)
    dz_i = sum_j (δ_ij - y_j) t_j = t_i - <y, t>                                   (C,)

Shapes. x (..., C, ...) with the softmax dim anywhere: the kernels see a C-contiguous (R, C) array
of rows. When dim is the last dim and x is contiguous this is a free reshape (no copy); otherwise
the dim is moved last and the rows are copied once (np.moveaxis + np.ascontiguousarray), and the
result is moved back as a view.

Kernels. One loop per step of the formula: a running max, the exponentials and their sum, the
division (or, for log-softmax, the log of the sum). Rows are independent, so the loop over rows is
a `prange`: compiled with parallel=True it is split between the cores, and under
NUMBA_DISABLE_JIT=1 it is a plain `range` to step through. These are the row softmax of the ops;
cross_entropy.py runs the same three steps fused with the loss. The fast set's versions are in
microtensor/fast/softmax.py.
"""
import numpy as np
from numba import prange

from ..autograd import Function
from ..checks import FLOAT_DTYPES, allocate, check_float, describe, normalize_dim
from ..errors import InputError, InputTypeError
from ..gradcheck import gradcheck_case
from ..kernels import active, kernel
from ..tensor import Tensor

# --------------------------------------------------------------------------------- numpy reference


def softmax_reference(x, dim=-1):
    """Plain numpy softmax along `dim` (the test oracle)."""
    shifted = x - np.max(x, axis=dim, keepdims=True)
    e = np.exp(shifted)
    return e / np.sum(e, axis=dim, keepdims=True)


def log_softmax_reference(x, dim=-1):
    """Plain numpy log-softmax along `dim`."""
    shifted = x - np.max(x, axis=dim, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=dim, keepdims=True))


def softmax_jacobian(y):
    """The explicit Jacobian dy/dx = diag(y) - y yᵀ of softmax at its output y (for teaching and tests).

    y: a softmax output, (C,) or (..., C) (one Jacobian per row along the last dim), a Tensor or a
    numpy array. Returns (C, C) or (..., C, C), of the same kind. Row i, column j holds dy_i/dx_j.
    Backward never builds this: J @ g is y * (g - <g, y>), see the module docstring.
    """
    if isinstance(y, Tensor):
        values = y.data
    elif isinstance(y, np.ndarray):
        values = y
    else:
        raise InputTypeError(f"softmax_jacobian: y must be a Tensor or a numpy array, got {describe(y)}")
    if values.dtype not in FLOAT_DTYPES:
        raise InputTypeError(f"softmax_jacobian: y must be float32 or float64, got {values.dtype}")
    if values.ndim == 0:
        raise InputError("softmax_jacobian: y must have at least one dim (the softmax dim, last)")
    column = values[..., :, None]  # (..., C, 1)

    def diag_minus_outer(shape, dtype):
        return column * np.eye(values.shape[-1], dtype=dtype) - column * values[..., None, :]  # (..., C, C)

    jacobian = allocate("softmax_jacobian", diag_minus_outer, values.shape + values.shape[-1:], values.dtype)
    return Tensor._from_array(jacobian) if isinstance(y, Tensor) else jacobian


# --------------------------------------------------------------------------------- kernels


@kernel(parallel=True)
def softmax_forward(x, y):
    """y[r] = softmax(x[r]) for every row r.   x, y: (R, C), C-contiguous, C >= 1."""
    rows, cols = x.shape
    for r in prange(rows):
        row_max = x[r, 0]  # m = max_j x_j
        for c in range(1, cols):
            if x[r, c] > row_max:
                row_max = x[r, c]
        total = x.dtype.type(0)  # s = sum_j e^(x_j - m)
        for c in range(cols):
            y[r, c] = np.exp(x[r, c] - row_max)
            total += y[r, c]
        for c in range(cols):  # y_i = e^(x_i - m) / s
            y[r, c] = y[r, c] / total


@kernel(parallel=True)
def log_softmax_forward(x, z):
    """z[r] = log_softmax(x[r]) = (x[r] - m) - log sum e^(x[r] - m).   x, z: (R, C), C-contiguous, C >= 1."""
    rows, cols = x.shape
    for r in prange(rows):
        row_max = x[r, 0]  # m = max_j x_j
        for c in range(1, cols):
            if x[r, c] > row_max:
                row_max = x[r, c]
        total = x.dtype.type(0)  # s = sum_j e^(x_j - m)
        for c in range(cols):
            total += np.exp(x[r, c] - row_max)
        log_total = np.log(total)
        for c in range(cols):  # z_i = (x_i - m) - log s
            z[r, c] = (x[r, c] - row_max) - log_total


@kernel(parallel=True)
def softmax_backward(y, grad_y, grad_x):
    """grad_x[r] = y[r] * (grad_y[r] - <grad_y[r], y[r]>).   All (R, C), C-contiguous."""
    rows, cols = y.shape
    for r in prange(rows):
        dot = y.dtype.type(0)  # <g, y>
        for c in range(cols):
            dot += grad_y[r, c] * y[r, c]
        for c in range(cols):
            grad_x[r, c] = y[r, c] * (grad_y[r, c] - dot)


@kernel(parallel=True)
def log_softmax_backward(z, grad_z, grad_x):
    """grad_x[r] = grad_z[r] - e^z[r] * sum(grad_z[r]).   All (R, C), C-contiguous; z <= 0."""
    rows, cols = z.shape
    for r in prange(rows):
        total = z.dtype.type(0)  # sum_i g_i
        for c in range(cols):
            total += grad_z[r, c]
        for c in range(cols):  # y_j = e^(z_j): the probabilities, recomputed from the saved output
            grad_x[r, c] = grad_z[r, c] - np.exp(z[r, c]) * total


# --------------------------------------------------------------------------------- Functions


def as_rows(x, dim):
    """x with `dim` moved last, as a C-contiguous (R, C) array of rows.

    No copy when dim is already last and x is C-contiguous (the common case): np.ascontiguousarray
    returns x itself and the reshape is a view.
    """
    if dim != x.ndim - 1:
        x = np.moveaxis(x, dim, -1)
    x = np.ascontiguousarray(x)
    return x.reshape(-1, x.shape[-1])


def from_rows(rows, shape, dim):
    """The inverse of as_rows: (R, C) back to `shape` (of the input), with the last dim moved to `dim`."""
    moved_shape = shape[:dim] + shape[dim + 1 :] + (shape[dim],)
    out = rows.reshape(moved_shape)
    return out if dim == len(shape) - 1 else np.moveaxis(out, -1, dim)


def _row_op_forward(ctx, x, dim, readable_kernel):
    ctx.dim, ctx.shape = dim, x.shape
    if x.size == 0:
        ctx.save_for_backward(x)
        return np.empty_like(x)
    x_rows = as_rows(x, dim)  # (R, C)
    out_rows = np.empty_like(x_rows)
    active(readable_kernel)(x_rows, out_rows)
    ctx.save_for_backward(out_rows)
    return from_rows(out_rows, x.shape, dim)


def _row_op_backward(ctx, grad_out, readable_kernel):
    (out_rows,) = ctx.saved_tensors
    if out_rows.size == 0:
        return np.zeros(ctx.shape, dtype=grad_out.dtype)
    grad_rows = as_rows(grad_out, ctx.dim)  # (R, C)
    grad_x_rows = np.empty_like(out_rows)
    active(readable_kernel)(out_rows, grad_rows, grad_x_rows)
    return from_rows(grad_x_rows, ctx.shape, ctx.dim)


class Softmax(Function):
    """y = softmax(x) along ctx.dim.   dL/dx = y * (g - sum(g * y)) along that dim.

    JVP: dy = y * (t - sum(y * t)) along that dim.
    """

    @staticmethod
    def forward(ctx, x, dim):
        return _row_op_forward(ctx, x, dim, softmax_forward)

    @staticmethod
    def backward(ctx, grad_out):
        return _row_op_backward(ctx, grad_out, softmax_backward), None

    @staticmethod
    def jvp(ctx, tangent, _dim):
        (out_rows,) = ctx.saved_tensors
        if tangent.size == 0:
            return np.zeros(ctx.shape, dtype=tangent.dtype)
        t = as_rows(tangent, ctx.dim)  # (R, C)
        tangent_rows = out_rows * (t - np.sum(out_rows * t, axis=1, keepdims=True))  # y (t - <y, t>)
        return from_rows(tangent_rows, ctx.shape, ctx.dim)


class LogSoftmax(Function):
    """z = log_softmax(x) along ctx.dim.   dL/dx = g - e^z * sum(g) along that dim.

    JVP: dz = t - sum(e^z * t) along that dim.
    """

    @staticmethod
    def forward(ctx, x, dim):
        return _row_op_forward(ctx, x, dim, log_softmax_forward)

    @staticmethod
    def backward(ctx, grad_out):
        return _row_op_backward(ctx, grad_out, log_softmax_backward), None

    @staticmethod
    def jvp(ctx, tangent, _dim):
        (out_rows,) = ctx.saved_tensors
        if tangent.size == 0:
            return np.zeros(ctx.shape, dtype=tangent.dtype)
        t = as_rows(tangent, ctx.dim)  # (R, C)
        tangent_rows = t - np.sum(np.exp(out_rows) * t, axis=1, keepdims=True)  # t - <y, t>, y = e^z
        return from_rows(tangent_rows, ctx.shape, ctx.dim)


def _check(op, x, dim):
    check_float(op, x)
    return normalize_dim(op, dim, x.ndim)


def softmax(x, dim=-1):
    """e^x / sum(e^x) along `dim`: each slice along `dim` becomes non-negative numbers summing to 1.

    Computed from x - max (stable for any finite input, e.g. values of ±1e4); a float tensor keeps its dtype.
    """
    return Softmax.apply(x, _check("softmax", x, dim))


def log_softmax(x, dim=-1):
    """log(softmax(x)) along `dim`, computed as (x - max) - log sum e^(x - max) (no log of 0)."""
    return LogSoftmax.apply(x, _check("log_softmax", x, dim))


# --------------------------------------------------------------------------------- gradcheck cases


def _any_dim(draw):
    x = draw.tensor(draw.shape(min_dims=1, max_dims=3, max_side=5), low=-3.0, high=3.0)
    return x, draw.integer(-x.ndim, x.ndim - 1)


def _large_logits(draw):
    # Rows far from 0 (±1e3, where e^x alone would overflow): the max shift must cancel exactly in
    # forward and backward. The spread within a row stays small so that no probability is ~0.
    offset = draw.choice((-1000.0, 1000.0))
    return draw.tensor(draw.shape(min_dims=2, max_dims=2, max_side=4), low=offset - 2.0, high=offset + 2.0)


@gradcheck_case(Softmax)
def _softmax_case(draw):
    x, dim = _any_dim(draw)
    return (lambda x: softmax(x, dim)), (x,)


@gradcheck_case(LogSoftmax)
def _log_softmax_case(draw):
    x, dim = _any_dim(draw)
    return (lambda x: log_softmax(x, dim)), (x,)


@gradcheck_case(Softmax)
def _softmax_large_logits_case(draw):
    return softmax, (_large_logits(draw),)


@gradcheck_case(LogSoftmax)
def _log_softmax_large_logits_case(draw):
    return log_softmax, (_large_logits(draw),)
