"""numpy's BLAS, called from Numba's threads: one pool of threads for the matrix products and
the kernels.

Why. A training step alternates matrix products (BLAS) with small kernels (Numba). Left to
themselves, numpy's OpenBLAS and Numba each keep a pool of threads, and the two pools fight over
the cores: a pool that spins after its work, waiting for more, steals the cores from the other's
next call, and a pool that sleeps at once pays for waking its threads (50-100 µs on a virtual
machine, more than a whole kernel of the step). PyTorch runs its products and its kernels on one
OpenMP pool and has neither problem. So does microtensor, when it can: OpenBLAS is told to use
one thread, and `gemm_in_parallel` below splits the rows of C = A B into one slice per Numba
thread, each thread calling BLAS's gemm on its slice (and shares a stack of small products, as in
attention, among the threads, one product per call). Then one pool does everything, and its
threads may spin between calls (microtensor/__init__.py sets how long) without stealing from
anyone. At the GPT recipe's shapes (768 x 128 @ 128 x 512, float32, 2 cores) a product runs at
~190 GFLOP/s this way, against ~180 when OpenBLAS threads it itself and both pools are settled.

How. BLAS's `cblas_?gemm` multiplies row-major matrices given by a pointer and a row stride (its
"leading dimension"), each optionally transposed. numpy ships OpenBLAS inside its wheels; this
module finds that library, looks up its gemm symbols (ILP64 builds, 64-bit integers), and gives
their addresses to LLVM under names of our own, so the Numba kernel calls them like C functions
and its compiled code can be cached (it refers to the name, not to an address of this process).

Where this is not possible (a numpy linked to another BLAS, or NUMBA_DISABLE_JIT=1, where the
kernels run as Python and cannot call C), or MICROTENSOR_SPLIT_PRODUCTS=0 is set, `AVAILABLE` is
False and matmul uses np.matmul, with OpenBLAS threading its products itself.

    C (n, m) = op(A) (n, k) @ op(B) (k, m),   op(X) = X or Xᵀ as X is laid out in memory
    slice t of C: rows [n t / T, n (t + 1) / T) = op(A)'s same rows @ op(B)
"""
import ctypes
import glob
import os

import numba
import numpy as np
from numba import njit, prange, types

ROW_MAJOR, NO_TRANSPOSE, TRANSPOSE = 101, 111, 112  # the CBLAS enum values

# The C declarations, with every pointer passed as a 64-bit integer (the same register and size in
# the C calling convention of every 64-bit platform), so one compiled kernel serves every dtype:
#   void cblas_sgemm(order, trans_a, trans_b, int64 M, int64 N, int64 K, float alpha, const float *A,
#                    int64 lda, const float *B, int64 ldb, float beta, float *C, int64 ldc)
_i32, _i64 = types.int32, types.int64
sgemm = types.ExternalFunction(
    "microtensor_cblas_sgemm",
    types.void(_i32, _i32, _i32, _i64, _i64, _i64, types.float32, _i64, _i64, _i64, _i64, types.float32, _i64, _i64),
)
dgemm = types.ExternalFunction(
    "microtensor_cblas_dgemm",
    types.void(_i32, _i32, _i32, _i64, _i64, _i64, types.float64, _i64, _i64, _i64, _i64, types.float64, _i64, _i64),
)

# (gemm symbols, set-threads symbol) of the ILP64 OpenBLAS builds numpy has shipped: numpy >= 2
# (scipy-openblas) and numpy 1.22-1.26 (openblas64_)
SYMBOL_SETS = (
    ("scipy_cblas_sgemm64_", "scipy_cblas_dgemm64_", "scipy_openblas_set_num_threads64_"),
    ("cblas_sgemm64_", "cblas_dgemm64_", "openblas_set_num_threads64_"),
)

# below this many multiply-adds a product runs on the calling thread: splitting costs more than it saves
SMALL_PRODUCT = 1 << 17


@njit(cache=True, parallel=True)
def gemm_in_parallel(double, trans_a, trans_b, n, m, k, outer, inner, slices, a, a_steps, lda, b, b_steps, ldb, c, c_steps, ldc):
    """C[i, j] = op(A[i, j]) @ op(B[i, j]), (n, m) each, for i < outer and j < inner,
    with the rows of each product cut into `slices` slices: one BLAS call per slice, the calls
    shared among the threads.

    a, b, c are the addresses of the first elements; *_steps are the distances in bytes between
    consecutive i, consecutive j and consecutive rows (a (3,) int64 array each; for op(A) a row
    step is lda elements if A is stored as it is, one element if it is transposed).
    """
    for item in prange(outer * inner * slices):
        product, part = item // slices, item % slices
        i, j = product // inner, product % inner
        first = n * part // slices
        rows = n * (part + 1) // slices - first
        if rows == 0:
            continue
        a_item = a + i * a_steps[0] + j * a_steps[1] + first * a_steps[2]
        b_item = b + i * b_steps[0] + j * b_steps[1]
        c_item = c + i * c_steps[0] + j * c_steps[1] + first * c_steps[2]
        if double:
            dgemm(ROW_MAJOR, trans_a, trans_b, rows, m, k, 1.0, a_item, lda, b_item, ldb, 0.0, c_item, ldc)
        else:
            one, zero = np.float32(1), np.float32(0)
            sgemm(ROW_MAJOR, trans_a, trans_b, rows, m, k, one, a_item, lda, b_item, ldb, zero, c_item, ldc)


def _blas_layout(x):
    """(transpose flag, leading dimension) that BLAS reads x (rows, cols) with, or None if x's
    strides fit neither way (then it is copied)."""
    rows, cols = x.shape
    if any(s % x.itemsize for s in x.strides):
        return None
    row_stride, col_stride = (s // x.itemsize for s in x.strides)
    if col_stride == 1 and (rows == 1 or row_stride >= max(1, cols)):
        return NO_TRANSPOSE, max(1, cols) if rows == 1 else row_stride
    if row_stride == 1 and (cols == 1 or col_stride >= max(1, rows)):
        return TRANSPOSE, max(1, rows) if cols == 1 else col_stride
    return None


def matmul_2d(a, b):
    """a (n, k) @ b (k, m) -> a new C-contiguous (n, m), both float32 or both float64, any strides:
    one product, its rows cut into one slice per thread."""
    n, k = a.shape
    m = b.shape[1]
    c = np.empty((n, m), dtype=a.dtype)
    if n * k * m < SMALL_PRODUCT or k == 0:
        return np.matmul(a, b, out=c)
    a, b = (x if _blas_layout(x) else np.ascontiguousarray(x) for x in (a, b))
    return _gemm(a[None, None], b[None, None], c[None, None], numba.get_num_threads())[0, 0]


def matmul_batched(a, b, out):
    """out[i, j] = a[i, j] @ b[i, j] for 4-D stacks (outer, inner, n, k) @ (outer, inner, k, m) ->
    out (outer, inner, n, m), all of one float dtype, any strides (views of other arrays too: no
    copy is made when every matrix has a BLAS layout): one product per thread at a time."""
    if 0 in a.shape or 0 in b.shape or not all(_blas_layout(x[0, 0]) for x in (a, b, out)):
        return np.matmul(a, b, out=out)  # empty, or a layout BLAS cannot read without copying
    if _blas_layout(out[0, 0])[0] != NO_TRANSPOSE:
        return np.matmul(a, b, out=out)
    return _gemm(a, b, out, 1)


def _gemm(a, b, c, slices):
    """c = a @ b for 4-D stacks whose matrices BLAS can read as they are (see _blas_layout)."""
    (trans_a, lda), (trans_b, ldb), (_, ldc) = (_blas_layout(x[0, 0]) for x in (a, b, c))
    _, _, n, k = a.shape
    steps = [np.array(x.strides[:3], dtype=np.int64) for x in (a, b, c)]
    gemm_in_parallel(
        a.dtype == np.float64, trans_a, trans_b, n, b.shape[3], k, a.shape[0], a.shape[1], slices,
        a.ctypes.data, steps[0], lda, b.ctypes.data, steps[1], ldb, c.ctypes.data, steps[2], ldc,
    )  # fmt: skip
    return c


def _numpy_blas_library():
    """The OpenBLAS shared library inside numpy's wheel, as a ctypes CDLL, or None."""
    here = os.path.dirname(np.__file__)
    for pattern in ("../numpy.libs/*openblas*", ".dylibs/*openblas*", "../numpy.libs/*.dll", ".libs/*openblas*"):
        for path in sorted(glob.glob(os.path.join(here, pattern))):
            try:
                return ctypes.CDLL(path)
            except OSError:
                continue
    return None


def _connect():
    """Register numpy's gemm with LLVM and set OpenBLAS to one thread; True if that worked."""
    if numba.config.DISABLE_JIT or os.environ.get("MICROTENSOR_SPLIT_PRODUCTS") == "0":
        return False
    library = _numpy_blas_library()
    if library is None:
        return False
    import llvmlite.binding as llvm

    for sgemm_name, dgemm_name, threads_name in SYMBOL_SETS:
        try:
            functions = [getattr(library, name) for name in (sgemm_name, dgemm_name, threads_name)]
        except AttributeError:
            continue
        set_threads = functions[2]
        set_threads.argtypes, set_threads.restype = [ctypes.c_int], None
        set_threads(1)  # every product is split by gemm_in_parallel; OpenBLAS must not split it again
        for name, function in (("microtensor_cblas_sgemm", functions[0]), ("microtensor_cblas_dgemm", functions[1])):
            llvm.add_symbol(name, ctypes.cast(function, ctypes.c_void_p).value)
        return True
    return False


AVAILABLE = _connect()
