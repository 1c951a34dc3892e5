"""The fast twins of matmul's kernels (microtensor/ops/matmul.py): the same arguments, the same results.

- matmul_forward(a, b, c): c = a @ b by BLAS, the rows of c cut into one slice per Numba thread,
  each slice one gemm call (fast/blas.py). BLAS blocks the product for the caches and keeps
  partial sums in vector registers, which the readable three loops do not; the slices run on
  Numba's threads so that products and kernels share one pool.
- matmul_backward(grad, a, b, grad_a, grad_b): dA = g Bᵀ and dB = Aᵀ g by BLAS, both products
  in ONE parallel call, so that the threads meet once per backward instead of twice. Bᵀ and Aᵀ
  are views: BLAS reads a transposed matrix through its transpose flag, without a copy.
  With enough rows, each thread takes one band of rows (of tokens, in a model): its rows of dA,
  and the part of dB = Σ_rows aᵀ g that sums over its rows; the parts are then added. The
  element-wise and row-by-row kernels that made g and a gave each thread the same band, so each
  thread reads numbers its own core's cache holds; computing all of dB on one thread would read
  half of g and a from the other core's cache (or from memory).

Where numpy's BLAS cannot be called from compiled code (`blas.available()` is False), both call
np.matmul: numpy's own BLAS, whatever it is, is still far faster than loops.
"""
import numpy as np

from ..kernels import fast_twin
from ..ops import matmul as readable
from . import blas, memory
from .memory import pool_size

# The fewest rows a thread's band needs for the backward to be cut into bands: each band's part
# of dB is a product with that many terms per number, which BLAS blocks well from about a hundred
# on, and the parts to add cost k·m numbers per band whatever the band's size.
MIN_ROWS_PER_BAND = 128


@fast_twin(readable.matmul_forward)
def matmul_forward(a, b, c):
    """c (n, m) = a (n, k) @ b (k, m), written into c; any strides."""
    if not blas.available():
        np.matmul(a, b, out=c)
        return
    blas.multiply_into((a, b, c))


@fast_twin(readable.matmul_backward)
def matmul_backward(grad, a, b, grad_a, grad_b):
    """grad_a (n, k) = grad (n, m) @ bᵀ and grad_b (k, m) = aᵀ @ grad, written in place; either
    output may be None (not needed)."""
    products = []
    if grad_a is not None:
        products.append((grad, b.T, grad_a))  # dA = g Bᵀ
    if grad_b is not None:
        products.append((a.T, grad, grad_b))  # dB = Aᵀ g
    if not blas.available():
        for x, y, out in products:
            np.matmul(x, y, out=out)
        return
    bands = pool_size()  # one per thread of the pool
    if grad_b is not None and grad_b.size and bands > 1 and grad.shape[0] >= MIN_ROWS_PER_BAND * bands:
        if backward_in_bands(grad, a, b, grad_a, grad_b, bands):
            return
    if products:
        blas.multiply_into(*products)


def backward_in_bands(grad, a, b, grad_a, grad_b, bands):
    """matmul_backward with thread t given band t of the rows: grad_a's rows of the band, g Bᵀ,
    and the band's part of grad_b, aᵀ g over the band's rows (written into grad_b for band 0, into
    a (k, m) array of its own for each other band); then the parts are added into grad_b. False
    (nothing done) if an array's strides do not suit BLAS. Call `blas.available()` first.

    The job table is written here rather than by blas.multiply_into, which would also work out each
    band's layouts and addresses anew: this is Python run for every layer of every training step."""
    b_t, a_t = b.T, a.T  # (m, k) and (k, n): views BLAS reads through its transpose flag
    layouts = [blas.blas_layout(x) for x in (grad, b_t, a_t)]
    written = [blas.blas_layout(x) for x in (grad_b, grad_a) if x is not None]  # BLAS writes rows in place
    if None in layouts or any(layout is None or layout[0] != blas.NO_TRANSPOSE for layout in written):
        return False
    (trans_g, ldg), (trans_bt, ldbt), (trans_at, ldat) = layouts
    ld_grad_b, ld_grad_a = written[0][1], written[-1][1]
    n = grad.shape[0]
    k, m = grad_b.shape
    parts = np.empty((bands - 1, k, m), dtype=grad_b.dtype)  # the bands' parts of grad_b but the first
    g_address, bt_address, at_address = blas.address(grad), blas.address(b_t), blas.address(a_t)
    jobs = []  # the columns of blas.py's job table: flags, sizes, then each matrix's address and leading dimension
    for band in range(bands):
        first, last = n * band // bands, n * (band + 1) // bands
        g_rows = g_address + first * grad.strides[0]  # the band's rows of g, (last - first, m)
        if grad_a is not None:  # the band's rows of dA = g Bᵀ
            dA_rows = blas.address(grad_a) + first * grad_a.strides[0]
            jobs.append((trans_g, trans_bt, last - first, k, m, g_rows, ldg, bt_address, ldbt, dA_rows, ld_grad_a))
        part, ld_part = (blas.address(grad_b), ld_grad_b) if band == 0 else (blas.address(parts[band - 1]), m)
        at_rows = at_address + first * a.strides[0]  # columns first..last of aᵀ
        jobs.append((trans_at, trans_g, k, m, last - first, at_rows, ldat, g_rows, ldg, part, ld_part))
    blas.gemm_in_parallel(grad.dtype == np.float64, np.array(jobs, dtype=np.int64))
    for part in parts:
        memory.add_into(grad_b, part)
    return True
