"""Matrix multiplication, batched, with numpy's broadcasting of the batch dims.

Forward, for a (n, k) and b (k, m):

    c_ij = sum_p a_ip b_pj                         c (n, m)

Backward. c_ij depends on a_ip through b_pj and on b_pj through a_ip, so with g = dL/dc (n, m):

    dL/da_ip = sum_j g_ij b_pj    ->   dL/da = g bᵀ         (n, m) @ (m, k) = (n, k)
    dL/db_pj = sum_i a_ip g_ij    ->   dL/db = aᵀ g         (k, n) @ (n, m) = (k, m)

Each gradient is itself a matrix product, and has the shape of its input, as it must.

Batch dims. For a (..., n, k) and b (..., k, m) the leading dims broadcast as in numpy, and each
pair of matrices is multiplied as above. Where a batch dim of an input was broadcast (size 1, or
missing), that one matrix met many, so the gradients of all its copies are summed back
(`unbroadcast`).

One product for many rows. The common case in a network, x (B, T, C) @ W (C, O), multiplies every
row of x by the same W: that is ONE (B*T, C) @ (C, O) product, the batch dims folded into the rows
(c's row r depends only on a's row r). Backward, likewise: dx = g Wᵀ is one (B*T, O) @ (O, C)
product, and dW = xᵀ g one (C, B*T) @ (B*T, O) product, which sums over every row, as the
gradient of a matrix used by every row must.

1-D operands act as a row vector (a) or a column vector (b), and that dim is dropped from the
result, as in numpy (`matmul` reshapes them).

The kernels take 2-D arrays of any strides (transposed views included):

    matmul_forward(a, b, c)                        c = a b
    matmul_backward(grad, a, b, grad_a, grad_b)    grad_a = grad bᵀ, grad_b = aᵀ grad

The fast set's twins call BLAS (microtensor/fast/matmul.py).
"""
import math

import numpy as np
from numba import prange

from ..autograd import Function, add_tangents, unbroadcast
from ..checks import broadcast_shape, check_float, describe
from ..errors import InputError, InputTypeError
from ..gradcheck import gradcheck_case
from ..kernels import active, kernel
from ..tensor import Tensor, as_tensor

# --------------------------------------------------------------------------------- numpy reference


def matmul_reference(a, b):
    """Plain loops over one pair of 2-D matrices (the test oracle)."""
    n, k = a.shape
    m = b.shape[1]
    c = np.zeros((n, m), dtype=np.result_type(a, b))
    for i in range(n):
        for j in range(m):
            for p in range(k):
                c[i, j] += a[i, p] * b[p, j]
    return c


# --------------------------------------------------------------------------------- readable kernels


@kernel(parallel=True)
def matmul_forward(a, b, c):
    """c (n, m) = a (n, k) @ b (k, m): c_ij = sum_p a_ip b_pj.

    Loop order i, p, j: for each row i of a and each a_ip, add a_ip times row p of b into row i
    of c. The innermost loop walks along a row of b and a row of c (neighbouring numbers when the
    arrays are C-contiguous), and its iterations write different c_ij, so the compiler turns it
    into vector instructions without reordering any sum.

    Blocking, four rows by two columns. What bounds that loop is moving numbers, not multiplying
    them: each step loads b_pj, loads c_ij and stores it back, for one multiply-add. So rows
    i .. i+3 of c are computed together (each b_pj, once loaded, serves four rows: b is read n/4
    times instead of n), and two rows p, p+1 of b are added in one pass (each c_ij is loaded and
    stored once for two multiply-adds). Blocks of four rows are independent, so they run in
    parallel. The leftovers take the plain loop: the last row of b when k is odd, the last n % 4
    rows of c one at a time.
    """
    n, k = a.shape
    m = b.shape[1]
    for block in prange((n + 3) // 4):
        i = 4 * block
        if i + 4 <= n:
            for j in range(m):
                c[i, j] = 0
                c[i + 1, j] = 0
                c[i + 2, j] = 0
                c[i + 3, j] = 0
            for p in range(0, k - 1, 2):  # rows p and p + 1 of b in one pass
                a_0, a_1, a_2, a_3 = a[i, p], a[i + 1, p], a[i + 2, p], a[i + 3, p]  # column p of the four rows
                a_0_next, a_1_next, a_2_next, a_3_next = a[i, p + 1], a[i + 1, p + 1], a[i + 2, p + 1], a[i + 3, p + 1]
                for j in range(m):
                    b_pj, b_next = b[p, j], b[p + 1, j]  # each loaded once, used four times
                    c[i, j] += a_0 * b_pj + a_0_next * b_next
                    c[i + 1, j] += a_1 * b_pj + a_1_next * b_next
                    c[i + 2, j] += a_2 * b_pj + a_2_next * b_next
                    c[i + 3, j] += a_3 * b_pj + a_3_next * b_next
            if k % 2 == 1:  # the last row of b, alone
                for row in range(i, i + 4):
                    a_rp = a[row, k - 1]
                    for j in range(m):
                        c[row, j] += a_rp * b[k - 1, j]
        else:
            for row in range(i, n):  # the last n % 4 rows, one at a time
                for j in range(m):
                    c[row, j] = 0
                for p in range(k):
                    a_rp = a[row, p]
                    for j in range(m):
                        c[row, j] += a_rp * b[p, j]


@kernel
def matmul_backward(grad, a, b, grad_a, grad_b):
    """From grad = dL/dc (n, m), for c = a (n, k) @ b (k, m):

        grad_a (n, k):  dL/da_ip = sum_j g_ij b_pj,   dL/da = g bᵀ
        grad_b (k, m):  dL/db_pj = sum_i a_ip g_ij,   dL/db = aᵀ g

    Each is itself a matrix product, so the forward kernel computes it, given bᵀ and aᵀ as
    C-contiguous copies (its inner loop then walks neighbouring numbers). Either output may be
    None when that input needs no gradient; it is then skipped.
    """
    if grad_a is not None:
        matmul_forward(grad, np.ascontiguousarray(b.T), grad_a)  # (n, m) @ (m, k)
    if grad_b is not None:
        matmul_forward(np.ascontiguousarray(a.T), grad, grad_b)  # (k, n) @ (n, m)


# --------------------------------------------------------------------------------- the Function


def _stack(x, batch):
    """x (..., r, s) broadcast to batch + (r, s), then as a stack (P, r, s) of P = prod(batch)
    matrices (a view where numpy can make one, else a copy). Sizes are spelled out rather than -1,
    which numpy cannot resolve when a size is 0."""
    return np.broadcast_to(x, batch + x.shape[-2:]).reshape((math.prod(batch),) + x.shape[-2:])


class MatMul(Function):
    """c = a @ b.   dL/da = g bᵀ, dL/db = aᵀ g (summed over broadcast batch dims).

    JVP (the product rule, a product being bilinear): dc = ta @ b + a @ tb, (..., n, m).
    """

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        n, k, m = a.shape[-2], a.shape[-1], b.shape[-1]
        if b.ndim == 2:
            # (..., n, k) @ (k, m): every row of a meets the same b, so one (N, k) @ (k, m) product
            rows = a.reshape(math.prod(a.shape[:-1]), k)  # (N, k), N = prod(...) n
            c = np.empty((rows.shape[0], m), dtype=a.dtype)
            active(matmul_forward)(rows, b, c)
            return c.reshape(a.shape[:-1] + (m,))
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        a_stack, b_stack = _stack(a, batch), _stack(b, batch)  # (P, n, k), (P, k, m)
        c = np.empty((a_stack.shape[0], n, m), dtype=a.dtype)
        for index in range(c.shape[0]):
            active(matmul_forward)(a_stack[index], b_stack[index], c[index])
        return c.reshape(batch + (n, m))

    @staticmethod
    def backward(ctx, grad_out):
        a, b = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad
        n, k, m = a.shape[-2], a.shape[-1], b.shape[-1]
        if b.ndim == 2:
            N = math.prod(a.shape[:-1])
            rows, g = a.reshape(N, k), grad_out.reshape(N, m)  # (N, k), (N, m)
            grad_rows = np.empty(rows.shape, dtype=a.dtype) if need_a else None  # (N, k)
            grad_b = np.empty(b.shape, dtype=b.dtype) if need_b else None  # (k, m): sums over all N rows
            active(matmul_backward)(g, rows, b, grad_rows, grad_b)
            return (grad_rows.reshape(a.shape) if need_a else None), grad_b
        batch = grad_out.shape[:-2]
        a_stack, b_stack = _stack(a, batch), _stack(b, batch)  # (P, n, k), (P, k, m)
        g_stack = grad_out.reshape((a_stack.shape[0], n, m))  # (P, n, m)
        grad_a = np.empty(a_stack.shape, dtype=a.dtype) if need_a else None  # one per copy of a
        grad_b = np.empty(b_stack.shape, dtype=b.dtype) if need_b else None
        for index in range(g_stack.shape[0]):
            active(matmul_backward)(
                g_stack[index],
                a_stack[index],
                b_stack[index],
                grad_a[index] if need_a else None,
                grad_b[index] if need_b else None,
            )
        # the copies made by broadcasting the batch dims: their gradients summed back
        grad_a = unbroadcast(grad_a.reshape(batch + (n, k)), a.shape) if need_a else None
        grad_b = unbroadcast(grad_b.reshape(batch + (k, m)), b.shape) if need_b else None
        return grad_a, grad_b

    @staticmethod
    def jvp(ctx, tangent_a, tangent_b):
        a, b = ctx.saved_tensors
        shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
        return add_tangents(
            shape,
            None if tangent_a is None else np.matmul(tangent_a, b),  # (..., n, k) @ (..., k, m)
            None if tangent_b is None else np.matmul(a, tangent_b),
        )


def matmul(a, b):
    """a @ b for a (..., n, k) and b (..., k, m); 1-D operands act as a row (a) or a column (b)
    vector, and that dim is dropped from the result, as in numpy. One of them may be a numpy array
    (as in `array @ tensor`). Sizes of 0 are fine: a product over k = 0 terms is 0."""
    if isinstance(a, np.ndarray) and isinstance(b, Tensor):
        a = as_tensor("matmul", a, b)
    elif isinstance(b, np.ndarray) and isinstance(a, Tensor):
        b = as_tensor("matmul", b, a)
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise InputTypeError(f"matmul: expected two Tensors, got {describe(a)} and {describe(b)}")
    check_float("matmul", a, b)
    if a.ndim == 0 or b.ndim == 0:
        raise InputError(f"matmul: operands must have at least 1 dim, got shapes {a.shape} and {b.shape}")
    if a.ndim == 1:
        out = matmul(a.reshape(1, -1), b)  # (..., 1, m), or (1,) when b is 1-D too
        return out.reshape(out.shape[:-2] + out.shape[-1:]) if b.ndim > 1 else out.reshape(())
    if b.ndim == 1:
        return matmul(a, b.reshape(-1, 1)).reshape(a.shape[:-1])
    if a.shape[-1] != b.shape[-2]:
        raise InputError(
            f"matmul: cannot multiply {a.shape} by {b.shape}: the last dim of the first ({a.shape[-1]}) "
            f"must equal the second-to-last of the second ({b.shape[-2]})"
        )
    broadcast_shape("matmul (batch dims)", a.shape[:-2], b.shape[:-2])
    return MatMul.apply(a, b)


# --------------------------------------------------------------------------------- gradcheck case


@gradcheck_case(MatMul)
def _matmul_case(draw):
    n, k, m = draw.integer(1, 4), draw.integer(1, 4), draw.integer(1, 4)
    kind = draw.choice(("2-D", "batched", "3-D @ 2-D", "vector"))
    if kind == "2-D":
        shapes = (n, k), (k, m)
    elif kind == "batched":
        batch = draw.shape(min_dims=1, max_dims=2, max_side=3)
        shapes = draw.broadcastable_shape(batch) + (n, k), batch + (k, m)
    elif kind == "3-D @ 2-D":
        shapes = (draw.integer(1, 3), n, k), (k, m)
    else:
        shapes = draw.choice((((k,), (k, m)), ((n, k), (k,)), ((k,), (k,))))
    a, b = draw.tensor(shapes[0]), draw.tensor(shapes[1])
    return matmul, (a, b)
