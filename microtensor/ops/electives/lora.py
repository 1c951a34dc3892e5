"""LoRA's linear layer, fused: a frozen product x W plus a trainable low-rank correction.

LoRA (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", 2021) fine-tunes a trained
layer y = x W + b without changing W. It learns two thin matrices A (in, r) and B (r, out), r much
smaller than in and out, and adds their product, scaled by s = α/r:

    y = x W + b + s (x A) B                       x (N, in), W (in, out), b (out,)
                                                  A (in, r), B (r, out), y (N, out)

Every leading dim of x just indexes rows; the Function folds them into N (as matmul does). W and b
are the base model's and stay frozen: the update the layer learns, ΔW = s A B (in, out), is a
matrix of rank at most r, and it costs r (in + out) numbers instead of in · out. B starts at 0, so
at the start ΔW = 0 and the layer computes exactly the base layer's y.

Forward, one product at a time, in the order the kernels run:

    xa = x A                 (N, in) @ (in, r)  = (N, r)
    y  = x W                 (N, in) @ (in, out) = (N, out)
    y += s (xa B) + b        (N, r) @ (r, out)  = (N, out), then scaled and added row by row

The grouping (x A) B is the point: x (A B) would first build the full (in, out) matrix A B, as large
as W, for every forward; (x A) B never makes anything larger than (N, out), and costs
N r (in + out) multiplications instead of in · out · r + N in out.

Backward. With g = dL/dy (N, out), go back through the same three products (each is a matmul, whose
backward is g bᵀ for its left operand and aᵀ g for its right one: ops/matmul.py derives it). The
low-rank path first. y depends on xa through s xa B, so

    h  = dL/dxa = s g Bᵀ                          (N, out) @ (out, r) = (N, r)
    dB = s xaᵀ g = s (x A)ᵀ g                     (r, N) @ (N, out)  = (r, out)

and xa = x A gives, from h,

    dA = xᵀ h = s xᵀ (g Bᵀ)                       (in, N) @ (N, r)   = (in, r)

x reaches y along two paths, the base product and the low-rank one, and the chain rule adds them:

    dx = g Wᵀ + h Aᵀ = g Wᵀ + s g Bᵀ Aᵀ           (N, out) @ (out, in) + (N, r) @ (r, in) = (N, in)

The base weights: dW = xᵀ g (in, out) and db = sum over the rows of g (out,). A frozen W needs
neither, and the Function computes only what is asked for: `ctx.needs_input_grad` says which
inputs require a gradient, and the others get None. During LoRA fine-tuning that skips dW, the
largest product of the backward (in · out · N multiplications, as large as the forward's x W).
(The checks below also run with W requiring a gradient, so dW is derived and tested too.)

Every gradient has its input's shape, and each is again a matmul with a thin operand except g Wᵀ.
The forward saves xa (N, r), which dB needs, instead of computing x A again.

The kernels. The three products are matrix products, so they run on matmul's own kernels, called as
`active(matmul_forward)` and `active(matmul_backward)`: the readable set's are the three loops of
ops/matmul.py, which a student has already stepped through, and the fast set's are their BLAS
twins. Why not one loop nest of its own: it would be a second copy of the matrix product to read and
keep right, and the fast set would need a twin of it again, where reusing matmul's kernels gives
the fast set's speed with no code of its own (this op has no file in microtensor/fast/). What is
left is elementwise, and is written here as plain loops: `add_scaled` (y += s · update + b, row by
row), `scale_in_place` and `sum_rows` (the bias's gradient).

Merging. After training, W' = W + s A B folds the adapter into the base weight, and x W' + b is the
same function as this op (up to rounding: the sums run in another order): gpt/model/electives/lora.py's
`merge_lora`.
"""
import math

import numpy as np

from ...autograd import Function, add_tangents
from ...checks import check_float, check_real, check_tensor
from ...errors import InputError
from ...gradcheck import gradcheck_case
from ...kernels import active, kernel
from ..matmul import matmul_backward, matmul_forward

# --------------------------------------------------------------------------------- numpy reference


def lora_linear_reference(x, weight, bias, lora_a, lora_b, scale):
    """Plain numpy y = x W + b + scale (x A) B (the test oracle); bias may be None."""
    y = x @ weight + scale * ((x @ lora_a) @ lora_b)
    return y if bias is None else y + bias


# --------------------------------------------------------------------------------- readable kernels


@kernel
def add_scaled(y, update, scale, bias):
    """y (N, M) += scale * update (N, M) + bias (M,), in place. The sum scale * update + bias is
    formed first and added to y last, so that an update of zeros leaves y + bias, exactly what a
    Linear computes. One thread: a single pass over N·M numbers is too little work to pay for
    waking others."""
    N, M = y.shape
    for n in range(N):
        for j in range(M):
            y[n, j] += scale * update[n, j] + bias[j]


@kernel
def scale_in_place(a, scale):
    """a (R, C) *= scale, in place."""
    R, C = a.shape
    for i in range(R):
        for j in range(C):
            a[i, j] *= scale


@kernel
def sum_rows(g, total):
    """total (M,) = the sum of g's (N, M) rows: the gradient of a bias added to every row."""
    N, M = g.shape
    for j in range(M):
        total[j] = 0
    for n in range(N):
        for j in range(M):
            total[j] += g[n, j]


# --------------------------------------------------------------------------------- the Function


class LoRALinear(Function):
    """y = x W + b + s (x A) B.   Backward: the module docstring.

    JVP (the product rule on each product), (N, out):

        dy = tx W + x tW + tb + s ((tx A + x tA) B + (x A) tB)
    """

    @staticmethod
    def forward(ctx, x, weight, bias, lora_a, lora_b, scale):
        n_in, n_out = weight.shape
        rank = lora_a.shape[1]
        N = math.prod(x.shape[:-1])  # spelled out: -1 fails for N * in = 0
        dtype = x.dtype
        rows = x.reshape(N, n_in)  # (N, in)
        s = dtype.type(scale)  # typed: a Python float would make float32 sums float64
        b = np.zeros(n_out, dtype=dtype) if bias is None else bias  # without a bias: add zeros (exact)
        xa = np.empty((N, rank), dtype=dtype)
        active(matmul_forward)(rows, lora_a, xa)  # xa = x A            (N, r)
        y = np.empty((N, n_out), dtype=dtype)
        active(matmul_forward)(rows, weight, y)  # y = x W              (N, out)
        low_rank = np.empty((N, n_out), dtype=dtype)
        active(matmul_forward)(xa, lora_b, low_rank)  # (x A) B         (N, out)
        active(add_scaled)(y, low_rank, s, b)  # y += s (x A) B + b
        ctx.save_for_backward(rows, weight, lora_a, lora_b, xa)
        ctx.x_shape, ctx.scale = x.shape, s
        return y.reshape(x.shape[:-1] + (n_out,))

    @staticmethod
    def backward(ctx, grad_out):
        rows, weight, lora_a, lora_b, xa = ctx.saved_tensors
        need_x, need_weight, need_bias, need_a, need_b = ctx.needs_input_grad[:5]
        (N, n_in), n_out, rank = rows.shape, weight.shape[1], lora_a.shape[1]
        dtype, s = rows.dtype, ctx.scale
        g = grad_out.reshape(N, n_out)  # (N, out)
        grad_x = grad_weight = grad_bias = grad_a = grad_b = None
        # The low-rank path, last product first: (xa) B, then xa = x A.
        if need_x or need_a or need_b:
            h = np.empty((N, rank), dtype=dtype) if (need_x or need_a) else None  # dL/dxa = s g Bᵀ
            grad_b = np.empty((rank, n_out), dtype=dtype) if need_b else None  # dB = s xaᵀ g
            active(matmul_backward)(g, xa, lora_b, h, grad_b)  # h = g Bᵀ, grad_b = xaᵀ g: s comes next
            if need_b:
                active(scale_in_place)(grad_b, s)
            if h is not None:
                active(scale_in_place)(h, s)
                grad_x_low_rank = np.empty((N, n_in), dtype=dtype) if need_x else None  # h Aᵀ
                grad_a = np.empty((n_in, rank), dtype=dtype) if need_a else None  # dA = xᵀ h
                active(matmul_backward)(h, rows, lora_a, grad_x_low_rank, grad_a)
        # The base path: y = x W + b.
        if need_x or need_weight:
            grad_x = np.empty((N, n_in), dtype=dtype) if need_x else None  # g Wᵀ
            grad_weight = np.empty((n_in, n_out), dtype=dtype) if need_weight else None  # dW = xᵀ g
            active(matmul_backward)(g, rows, weight, grad_x, grad_weight)
        if need_x:
            # dx = g Wᵀ + h Aᵀ: the two paths from x to y, added
            active(add_scaled)(grad_x, grad_x_low_rank, dtype.type(1), np.zeros(n_in, dtype=dtype))
            grad_x = grad_x.reshape(ctx.x_shape)
        if need_bias:
            grad_bias = np.empty(n_out, dtype=dtype)
            active(sum_rows)(g, grad_bias)
        return grad_x, grad_weight, grad_bias, grad_a, grad_b, None

    @staticmethod
    def jvp(ctx, tangent_x, tangent_weight, tangent_bias, tangent_a, tangent_b, _scale):
        rows, weight, lora_a, lora_b, xa = ctx.saved_tensors
        N, n_out = rows.shape[0], weight.shape[1]
        s = ctx.scale
        tangent_rows = None if tangent_x is None else tangent_x.reshape(rows.shape)  # (N, in)
        tangent_xa = add_tangents(  # d(x A) = tx A + x tA    (N, r)
            xa.shape,
            None if tangent_rows is None else tangent_rows @ lora_a,
            None if tangent_a is None else rows @ tangent_a,
        ) if tangent_rows is not None or tangent_a is not None else None
        tangent_y = add_tangents(
            (N, n_out),
            None if tangent_rows is None else tangent_rows @ weight,
            None if tangent_weight is None else rows @ tangent_weight,
            tangent_bias,
            None if tangent_xa is None else s * (tangent_xa @ lora_b),
            None if tangent_b is None else s * (xa @ tangent_b),
        )
        return tangent_y.reshape(ctx.x_shape[:-1] + (n_out,))


def lora_linear(x, weight, bias, lora_a, lora_b, scale):
    """y = x @ weight + bias + scale * (x @ lora_a) @ lora_b: a Linear layer with a LoRA adapter.

    x (..., in); weight (in, out); bias (out,) or None; lora_a (in, r) and lora_b (r, out) with
    r >= 1; scale a finite number (LoRA's α/r). All float32 or all float64. Returns (..., out).
    Only the inputs with requires_grad=True get a gradient: a frozen weight costs no dW."""
    op = "lora_linear"
    for name, t in (("x", x), ("weight", weight), ("lora_a", lora_a), ("lora_b", lora_b)):
        check_tensor(op, t, name)
    if bias is not None:
        check_tensor(op, bias, "bias")
    check_float(op, *[t for t in (x, weight, bias, lora_a, lora_b) if t is not None])
    if weight.ndim != 2:
        raise InputError(f"{op}: weight must be 2-D (in, out), got shape {weight.shape}")
    n_in, n_out = weight.shape
    if x.ndim == 0 or x.shape[-1] != n_in:
        raise InputError(f"{op}: x must be (..., in) with in = weight.shape[0] = {n_in}, got shape {x.shape}")
    if bias is not None and bias.shape != (n_out,):
        raise InputError(f"{op}: bias must have shape (out,) = ({n_out},), got {bias.shape}")
    if lora_a.ndim != 2 or lora_a.shape[0] != n_in or lora_a.shape[1] < 1:
        raise InputError(f"{op}: lora_a must be (in, r) = ({n_in}, r) with r >= 1, got shape {lora_a.shape}")
    rank = lora_a.shape[1]
    if lora_b.shape != (rank, n_out):
        raise InputError(f"{op}: lora_b must be (r, out) = ({rank}, {n_out}) to follow lora_a {lora_a.shape}, got shape {lora_b.shape}")
    scale = check_real(op, "scale", scale)
    return LoRALinear.apply(x, weight, bias, lora_a, lora_b, scale)


# --------------------------------------------------------------------------------- gradcheck case


@gradcheck_case(LoRALinear)
def _lora_linear_case(draw):
    n_in, n_out, rank = draw.integer(1, 4), draw.integer(1, 4), draw.integer(1, 3)
    leading = draw.shape(min_dims=0, max_dims=2, max_side=3)  # () gives a single row x (in,)
    x = draw.tensor(leading + (n_in,))
    weight = draw.tensor((n_in, n_out))  # requires a gradient here, so that dW is checked too
    bias = draw.tensor((n_out,)) if draw.boolean() else None
    lora_a, lora_b = draw.tensor((n_in, rank)), draw.tensor((rank, n_out))  # B != 0: every path carries a gradient
    scale = draw.choice((0.5, 1.0, 2.0))

    def fn(x, weight, bias, lora_a, lora_b):
        return lora_linear(x, weight, bias, lora_a, lora_b, scale)

    return fn, (x, weight, bias, lora_a, lora_b)
