"""Matrix multiplication, batched, with two backends: numpy's BLAS and a readable Numba kernel.

Forward, for a (..., n, k) and b (..., k, m), batch dims broadcast as in numpy:

    c_ij = sum_p a_ip b_pj                         c (..., n, m)

Backward. c_ij depends on a_ip through b_pj and on b_pj through a_ip, so with g = dL/dc (n, m):

    dL/da_ip = sum_j g_ij b_pj    ->   dL/da = g bᵀ         (n, k)
    dL/db_pj = sum_i a_ip g_ij    ->   dL/db = aᵀ g         (k, m)

and where a batch dim was broadcast, the copies' gradients are summed back (`unbroadcast`).

The common case in a network, x (B, T, C) @ W (C, O), is done as ONE (B*T, C) @ (C, O) product
(numpy's batched matmul would run B small ones), and dW as one (B*T, C)ᵀ @ (B*T, O) product.

Backends (`set_matmul`), measured at the GPT recipe's shapes, float32, 2 cores:
- "blas" (default): numpy's OpenBLAS, blocked for the caches and vectorized; ~190 GFLOP/s on 2
  cores of a Zen 4 VM, 118-158 on a Zen 3 one. A 2-D product is split into one slice of rows per Numba thread, each slice one BLAS call
  (`ops/blas.py`: so that products and kernels share one pool of threads); batched products and
  small ones go to np.matmul.
- "numba": `matmul_kernel` below, three plain loops (rows in parallel, the inner loop running along
  contiguous rows of b and c so it vectorizes): the one to read and step through, a few times
  slower than BLAS because it does not block for the caches.
"""
import numpy as np
from numba import njit, prange

from ..autograd import Function, unbroadcast
from ..gradcheck import gradcheck_case
from ..tensor import Tensor
from . import blas
from .checks import broadcast_shape, check_float

BACKENDS = ("blas", "numba")
_backend = "blas"


def set_matmul(backend):
    """Choose how matmul multiplies, forward and backward: "blas" (numpy) or "numba" (the loop kernel)."""
    global _backend
    if backend not in BACKENDS:
        raise ValueError(f"set_matmul: unknown backend {backend!r}; expected one of {BACKENDS}")
    _backend = backend


def get_matmul():
    return _backend


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


@njit(cache=True, parallel=True, error_model="numpy")
def matmul_kernel(a, b, c):
    """c (n, m) = a (n, k) @ b (k, m) for C-contiguous 2-D arrays.

    Loop order i, p, j: for each row i of a and each a_ip, add a_ip times row p of b into row i
    of c. The innermost loop walks along rows of b and c, which are contiguous, so it vectorizes;
    rows i are independent, so they run in parallel.
    """
    n, k = a.shape
    m = b.shape[1]
    for i in prange(n):
        for j in range(m):
            c[i, j] = 0
        for p in range(k):
            a_ip = a[i, p]
            for j in range(m):
                c[i, j] += a_ip * b[p, j]


def _multiply(a, b):
    """a (..., n, k) @ b (..., k, m) with the current backend; any layout in, a new array out."""
    if _backend == "blas":
        if blas.AVAILABLE and a.ndim == 2 and b.ndim == 2:
            return blas.matmul_2d(a, b)  # split across Numba's threads (ops/blas.py)
        return np.matmul(a, b)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = np.ascontiguousarray(np.broadcast_to(a, batch + a.shape[-2:])).reshape((-1,) + a.shape[-2:])
    b = np.ascontiguousarray(np.broadcast_to(b, batch + b.shape[-2:])).reshape((-1,) + b.shape[-2:])
    c = np.empty((a.shape[0], a.shape[1], b.shape[2]), dtype=a.dtype)
    for index in range(a.shape[0]):
        matmul_kernel(a[index], b[index], c[index])
    return c.reshape(batch + c.shape[1:])


def _multiply_both(a1, b1, a2, b2):
    """(a1 @ b1, a2 @ b2): with BLAS, two 2-D products are computed together (ops/blas.py)."""
    if _backend == "blas" and blas.AVAILABLE and a1.ndim == b1.ndim == a2.ndim == b2.ndim == 2:
        return tuple(blas.matmul_2d_together((a1, b1), (a2, b2)))
    return _multiply(a1, b1), _multiply(a2, b2)


class MatMul(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        if a.ndim > 2 and b.ndim == 2:
            # (..., n, k) @ (k, m): one product over all rows at once
            return _multiply(a.reshape(-1, a.shape[-1]), b).reshape(a.shape[:-1] + (b.shape[1],))
        return _multiply(a, b)

    @staticmethod
    def backward(ctx, grad_out):
        a, b = ctx.saved_tensors
        grad_a = grad_b = None
        if a.ndim > 2 and b.ndim == 2:
            rows = a.reshape(-1, a.shape[-1])  # (N, k)
            g = grad_out.reshape(-1, grad_out.shape[-1])  # (N, m)
            if all(ctx.needs_input_grad):
                grad_a, grad_b = _multiply_both(g, b.T, rows.T, g)
                return grad_a.reshape(a.shape), grad_b
            if ctx.needs_input_grad[0]:
                grad_a = _multiply(g, b.T).reshape(a.shape)
            if ctx.needs_input_grad[1]:
                grad_b = _multiply(rows.T, g)
            return grad_a, grad_b
        if ctx.needs_input_grad[0]:
            grad_a = unbroadcast(_multiply(grad_out, np.swapaxes(b, -1, -2)), a.shape)
        if ctx.needs_input_grad[1]:
            grad_b = unbroadcast(_multiply(np.swapaxes(a, -1, -2), grad_out), b.shape)
        return grad_a, grad_b


def matmul(a, b):
    """a @ b for a (..., n, k) and b (..., k, m); 1-D operands act as a row (a) or a column (b)
    vector, and that dim is dropped from the result, as in numpy."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError(f"matmul: expected two Tensors, got {type(a).__name__} and {type(b).__name__}")
    check_float("matmul", a, b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: operands must have at least 1 dim, got shapes {a.shape} and {b.shape}")
    if a.ndim == 1:
        out = matmul(a.reshape(1, -1), b)  # (..., 1, m), or (1,) when b is 1-D too
        return out.reshape(out.shape[:-2] + out.shape[-1:]) if b.ndim > 1 else out.reshape(())
    if b.ndim == 1:
        return matmul(a, b.reshape(-1, 1)).reshape(a.shape[:-1])
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(
            f"matmul: cannot multiply {a.shape} by {b.shape}: the last dim of the first ({a.shape[-1]}) "
            f"must equal the second-to-last of the second ({b.shape[-2]})"
        )
    broadcast_shape("matmul (batch dims)", a.shape[:-2], b.shape[:-2])
    return MatMul.apply(a, b)


# --------------------------------------------------------------------------------- gradcheck cases


def with_matmul(backend, fn):
    """fn, run with `backend` chosen for matrix products (for gradcheck cases that cover both)."""

    def run(*inputs):
        previous = get_matmul()
        set_matmul(backend)
        try:
            return fn(*inputs)
        finally:
            set_matmul(previous)

    return run


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
    return with_matmul(draw.choice(BACKENDS), matmul), (a, b)
