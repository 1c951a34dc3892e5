"""numpy's BLAS, called from Numba's threads: one pool of threads for the matrix products and
the kernels.

Why. A training step alternates matrix products (BLAS) with small kernels (Numba). Left to
themselves, numpy's OpenBLAS and Numba each keep a pool of threads, and the two pools fight over
the cores: a pool that spins after its work, waiting for more, steals the cores from the other's
next call, and a pool that sleeps at once pays for waking its threads (50-100 µs on a virtual
machine, more than a whole kernel of the step). PyTorch runs its products and its kernels on one
OpenMP pool and has neither problem. So does microtensor, when it can: OpenBLAS is told to use
one thread, and `gemm_in_parallel` below runs a table of BLAS calls on Numba's threads: the
rows of C = A B cut into one slice per thread, each thread calling BLAS's gemm on its slice. A
kernel may also call `gemm` itself, as attention's do for each (batch, head)'s small products
(`batched_jobs` gives their table). Then one pool does everything, and its threads may spin
between calls (microtensor/__init__.py sets how long) without stealing from anyone. At the GPT
recipe's shapes (768 x 128 @ 128 x 512, float32, 2 cores) a product runs at ~190 GFLOP/s this way
on a Zen 4 VM (118-158 on a Zen 3 one), as fast as when OpenBLAS threads it itself (180-200 in the
same runs on the Zen 4); what it saves is the waiting between calls. In two alternating profiles
of a training step (2-core Zen 4 VM) the step took 35.2-36.4 ms against 36.0-39.8, and GELU's
forward 0.67-0.72 ms per step against 0.86-1.11.

How. BLAS's `cblas_?gemm` multiplies row-major matrices given by a pointer and a row stride (its
"leading dimension"), each optionally transposed. numpy ships OpenBLAS inside its wheels; this
module finds that library, looks up its gemm symbols (ILP64 builds, 64-bit integers), and gives
their addresses to LLVM under names of our own, so the Numba kernel calls them like C functions
and its compiled code can be cached (it refers to the name, not to an address of this process).

Where this is not possible (a numpy linked to another BLAS, or NUMBA_DISABLE_JIT=1, where the
kernels run as Python and cannot call C), or MICROTENSOR_SPLIT_PRODUCTS=0 is set, `AVAILABLE` is
False and matmul uses np.matmul, with OpenBLAS threading its products itself.

    C (n, m) = op(A) (n, k) @ op(B) (k, m),   op(X) = X or Xᵀ as X is laid out in memory
    slice t of C: rows [n t / T, n (t + 1) / T) = op(A)'s same rows @ op(B), one BLAS call
"""
import ctypes
import functools
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


# The columns of a job table: one row per BLAS call, C (rows, cols) = op(A) (rows, inner) @ op(B)
# (inner, cols), with A, B, C the addresses of their first elements and lda, ldb, ldc their row strides.
TRANS_A, TRANS_B, ROWS, COLS, INNER, A, LDA, B, LDB, C, LDC = range(11)


@njit(cache=True)
def gemm(double, job):
    """One BLAS call on the calling thread: C = op(A) op(B) as one row of a job table (int64 (11,),
    the columns above) describes it; float64 if `double`, else float32."""
    trans_a, trans_b, rows, cols, inner, a, lda, b, ldb, c, ldc = job
    order, trans_a, trans_b = np.int32(ROW_MAJOR), np.int32(trans_a), np.int32(trans_b)
    if double:
        dgemm(order, trans_a, trans_b, rows, cols, inner, 1.0, a, lda, b, ldb, 0.0, c, ldc)
    else:
        one, zero = np.float32(1), np.float32(0)
        sgemm(order, trans_a, trans_b, rows, cols, inner, one, a, lda, b, ldb, zero, c, ldc)


@njit(cache=True, parallel=True)
def gemm_in_parallel(double, jobs):
    """Every BLAS call of the job table `jobs` (int64 (J, 11), the columns above), the calls shared
    among the threads (J is a multiple of the thread count, or large, so that they share it evenly)."""
    for job in prange(jobs.shape[0]):
        gemm(double, jobs[job])


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
    return matmul_2d_together((a, b))[0]


def matmul_2d_together(*products):
    """[a @ b for (a, b) in products], 2-D products (as above) computed in one parallel call: with
    two, each gets half of the threads, each of them a slice of its rows. A layer's backward needs
    two products, g Wᵀ and xᵀ g; one BLAS call over all rows of a product on each thread ran them
    ~10% faster than both products one after the other, each split across the threads.

    Everything here but the products themselves is Python that runs ~60 times a training step,
    so it is kept to plain arithmetic on shapes and strides (each numpy call costs ~1 µs)."""
    outputs = [np.empty((a.shape[0], b.shape[1]), dtype=a.dtype) for a, b in products]
    slices = max(1, numba.get_num_threads() // len(products))
    jobs = []
    for (a, b), c in zip(products, outputs):
        n, k = a.shape
        m = b.shape[1]
        if n * k * m < SMALL_PRODUCT or k == 0:
            np.matmul(a, b, out=c)  # on this thread: too small to be worth sharing
            continue
        layouts = [_blas_layout(x) for x in (a, b)]
        if None in layouts:
            a, b = (np.ascontiguousarray(x) if layout is None else x for x, layout in zip((a, b), layouts))
            layouts = [_blas_layout(x) for x in (a, b)]
        (trans_a, lda), (trans_b, ldb) = layouts
        a_address, b_address, c_address = a.ctypes.data, b.ctypes.data, c.ctypes.data
        for part in range(slices):  # slice `part` is rows [first, last) of C and of op(A)
            first, last = n * part // slices, n * (part + 1) // slices
            if last > first:
                a_slice, c_slice = a_address + first * a.strides[0], c_address + first * c.strides[0]
                jobs.append((trans_a, trans_b, last - first, m, k, a_slice, lda, b_address, ldb, c_slice, m))
    if jobs:
        gemm_in_parallel(outputs[0].dtype == np.float64, np.array(jobs, dtype=np.int64))
    return outputs


def batched_jobs(a, b, out, jobs=None):
    """The job table (outer * inner, 11) of the products out[i, j] = a[i, j] @ b[i, j] for 4-D
    stacks (outer, inner, n, k) @ (outer, inner, k, m) -> out (outer, inner, n, m), all of one
    float dtype, any strides (views of other arrays too: BLAS reads them as they are), written into
    `jobs` if given (a view of a larger table may be); None if the stacks are empty or a matrix's
    strides fit no BLAS layout (then nothing can be done without copying)."""
    layouts = [_blas_layout(x[0, 0]) if x.size else None for x in (a, b, out)]
    if None in layouts or layouts[2][0] != NO_TRANSPOSE:
        return None
    (trans_a, lda), (trans_b, ldb), (_, ldc) = layouts
    outer, inner, n, k = a.shape
    if jobs is None:
        jobs = np.empty((outer * inner, 11), dtype=np.int64)
    jobs[:] = (trans_a, trans_b, n, b.shape[3], k, 0, lda, 0, ldb, 0, ldc)
    for column, x in ((A, a), (B, b), (C, out)):  # the address of matrix (i, j) of each stack
        jobs[:, column] = _matrix_offsets(outer, inner, *x.strides[:2]) + x.ctypes.data
    return jobs


@functools.lru_cache(maxsize=64)
def _matrix_offsets(outer, inner, outer_stride, inner_stride):
    """Byte offsets of the matrices (i, j) of an (outer, inner) stack, in order, (outer * inner,);
    kept, as a training step asks for the same few again and again."""
    i, j = np.divmod(np.arange(outer * inner, dtype=np.int64), inner)
    offsets = i * outer_stride + j * inner_stride
    offsets.flags.writeable = False  # shared by every call that asks for it
    return offsets


def _numpy_blas_libraries():
    """The shared libraries inside numpy's wheel that may be its OpenBLAS, as ctypes CDLLs."""
    here = os.path.dirname(np.__file__)
    for pattern in ("../numpy.libs/*openblas*", ".dylibs/*openblas*", "../numpy.libs/*.dll", ".libs/*openblas*"):
        for path in sorted(glob.glob(os.path.join(here, pattern))):
            try:
                yield ctypes.CDLL(path)
            except OSError:
                continue


def _connect():
    """Register numpy's gemm with LLVM and set OpenBLAS to one thread; True if that worked."""
    if numba.config.DISABLE_JIT or os.environ.get("MICROTENSOR_SPLIT_PRODUCTS") == "0":
        return False
    import llvmlite.binding as llvm

    for library in _numpy_blas_libraries():
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
