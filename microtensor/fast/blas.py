"""BLAS, called from Numba's threads: one pool of threads for the matrix products and the kernels.

Why. A training step alternates matrix products (BLAS) with small kernels (Numba). Left to
themselves, numpy's OpenBLAS and Numba each keep a pool of threads, and the two pools fight over
the cores: a pool that spins after its work, waiting for more, steals the cores from the other's
next call, and a pool that sleeps at once pays for waking its threads on every call. PyTorch runs
its products and its kernels on one pool and has neither problem. So does microtensor's fast set:
`gemm_in_parallel` below runs a table of BLAS calls on Numba's threads, the rows of C = A B cut
into one slice per thread, each thread calling BLAS's gemm on its slice. A kernel may also call
`gemm` itself, as attention's fast kernels do for each (batch, head)'s small products
(`batched_jobs` gives their table). Then one pool does everything, and its threads may spin
between calls (`microtensor.fast.process.tune_for_training` sets how long) without stealing from
anyone.

Which BLAS. numpy ships OpenBLAS inside its wheels. On x86-64, microtensor also installs Intel's
MKL (PyPI's `mkl`), whose gemm is faster on some CPUs and slower on others: a product's speed
depends on how well the library's kernels fit the CPU's vector units and caches, which no rule of
thumb tells. So the first process on a machine measures both at a transformer's product shapes and
keeps the faster (`choose_library`), on disk, so that every later run makes the same choice and
computes the same numbers; MICROTENSOR_BLAS=openblas or =mkl overrides it. `library()` says which
one the kernels call. MKL is set to run each call on its calling thread (its "sequential" layer),
and numpy's own products keep OpenBLAS whatever the choice.

OpenBLAS's own threads, scoped to our calls. Each Numba thread's gemm call must run on that
thread alone: were OpenBLAS to split it again over its own pool, the two pools would fight once
more. So every kernel here that calls gemm sets OpenBLAS to one thread before its parallel loop
and gives back the count it found after it (`one_openblas_thread`, `restore_openblas_threads`:
calls into OpenBLAS from the compiled kernel itself). Outside those kernels numpy's products keep
the thread count they had: importing microtensor or running it changes nothing for them. (While
such a kernel runs, a numpy product started by another Python thread would run on one thread.)

How. BLAS's `cblas_?gemm` multiplies row-major matrices given by a pointer and a row stride (its
"leading dimension"), each optionally transposed. This module finds numpy's OpenBLAS when imported
and looks up its gemm and thread-count functions (ILP64 builds: 64-bit integers), which only reads
the library numpy has already loaded; MKL's ILP64 gemm (`cblas_sgemm_64`, the same arguments) is
looked up when a product first needs a BLAS. Then `available()` gives the chosen functions'
addresses to LLVM under names of our own, so that a Numba kernel calls them like C functions and
its compiled code can be cached (it refers to the name, not to an address of this process).

Where this is not possible (a numpy linked to another BLAS, or NUMBA_DISABLE_JIT=1, where the
kernels run as Python and cannot call C), `available()` is False and the fast twins fall back:
matmul to np.matmul (numpy's own BLAS, threading its products itself), attention to its readable
kernels.

    C (n, m) = op(A) (n, k) @ op(B) (k, m),   op(X) = X or Xᵀ as X is laid out in memory
    slice t of C: rows [n t / T, n (t + 1) / T) = op(A)'s same rows @ op(B), one BLAS call
"""
import ctypes
import functools
import glob
import json
import os
import platform
import sys
import time
from pathlib import Path

import numba
import numpy as np
from numba import prange, types

from ..errors import InputError
from ..kernels import kernel
from .memory import pool_size

ROW_MAJOR, NO_TRANSPOSE, TRANSPOSE = 101, 111, 112  # the CBLAS enum values
MKL_THREADING_SEQUENTIAL = 1  # MKL's enum value: each call runs on its calling thread

# The C declarations, with every pointer passed as a 64-bit integer (the same register and size in
# the C calling convention of every 64-bit platform), so one compiled kernel serves every dtype:
#   void cblas_sgemm(order, trans_a, trans_b, int64 M, int64 N, int64 K, float alpha, const float *A,
#                    int64 lda, const float *B, int64 ldb, float beta, float *C, int64 ldc)
#   int openblas_get_num_threads(void)        void openblas_set_num_threads(int)
_i32, _i64 = types.int32, types.int64
sgemm = types.ExternalFunction(
    "microtensor_cblas_sgemm",
    types.void(_i32, _i32, _i32, _i64, _i64, _i64, types.float32, _i64, _i64, _i64, _i64, types.float32, _i64, _i64),
)
dgemm = types.ExternalFunction(
    "microtensor_cblas_dgemm",
    types.void(_i32, _i32, _i32, _i64, _i64, _i64, types.float64, _i64, _i64, _i64, _i64, types.float64, _i64, _i64),
)
openblas_get_num_threads = types.ExternalFunction("microtensor_openblas_get_num_threads", _i32())
openblas_set_num_threads = types.ExternalFunction("microtensor_openblas_set_num_threads", types.void(_i32))

# Our names for the four functions, in the order of each row of SYMBOL_SETS below.
OUR_NAMES = (
    "microtensor_cblas_sgemm",
    "microtensor_cblas_dgemm",
    "microtensor_openblas_get_num_threads",
    "microtensor_openblas_set_num_threads",
)
# Their names in the ILP64 OpenBLAS builds numpy has shipped: numpy >= 2 (scipy-openblas) and
# numpy 1.22-1.26 (openblas64_).
SYMBOL_SETS = (
    ("scipy_cblas_sgemm64_", "scipy_cblas_dgemm64_", "scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
    ("cblas_sgemm64_", "cblas_dgemm64_", "openblas_get_num_threads64_", "openblas_set_num_threads64_"),
)

# below this many multiply-adds a product runs on the calling thread: splitting costs more than it saves
SMALL_PRODUCT = 1 << 17


# The columns of a job table: one row per BLAS call, C (rows, cols) = op(A) (rows, inner) @ op(B)
# (inner, cols), with A, B, C the addresses of their first elements and lda, ldb, ldc their row strides.
TRANS_A, TRANS_B, ROWS, COLS, INNER, A, LDA, B, LDB, C, LDC = range(11)


# --------------------------------------------------------------------------------- finding the libraries


def _numpy_blas_libraries():
    """The shared libraries inside numpy's wheel that may be its OpenBLAS, as ctypes CDLLs (numpy
    has loaded them already, so opening them again only returns the same handle)."""
    here = os.path.dirname(np.__file__)
    for pattern in ("../numpy.libs/*openblas*", ".dylibs/*openblas*", "../numpy.libs/*.dll", ".libs/*openblas*"):
        for path in sorted(glob.glob(os.path.join(here, pattern))):
            try:
                yield ctypes.CDLL(path)
            except OSError:
                continue


def find_openblas():
    """{our name: address} of numpy's OpenBLAS gemm and thread-count functions, and the library's
    file; None if numpy's BLAS is not an OpenBLAS this module knows. Only looks symbols up."""
    for library in _numpy_blas_libraries():
        for names in SYMBOL_SETS:
            try:
                functions = [getattr(library, name) for name in names]
            except AttributeError:
                continue
            return {ours: ctypes.cast(function, ctypes.c_void_p).value for ours, function in zip(OUR_NAMES, functions)}, library._name
    return None


def find_mkl():
    """{our name: address} of Intel MKL's ILP64 gemm functions (PyPI's `mkl` package, which
    microtensor installs on x86-64), with MKL set to run each call on its calling thread, and the
    library's file; None where MKL is not installed. Loading it maps it into this process and
    changes nothing else: numpy keeps its own BLAS."""
    prefixes = sorted({sys.prefix, sys.base_prefix})
    patterns = ("lib/libmkl_rt.so*", "Library/bin/mkl_rt*.dll")
    for path in sorted(found for prefix in prefixes for pattern in patterns for found in glob.glob(os.path.join(prefix, pattern))):
        try:
            library = ctypes.CDLL(path)
            functions = library.cblas_sgemm_64, library.cblas_dgemm_64
            library.MKL_Set_Threading_Layer(MKL_THREADING_SEQUENTIAL)  # Numba's threads share the rows, not MKL's
        except (OSError, AttributeError):
            continue
        return {ours: ctypes.cast(function, ctypes.c_void_p).value for ours, function in zip(OUR_NAMES, functions)}, path
    return None


OPENBLAS = find_openblas()  # (addresses, file) or None; MKL is looked for only when a kernel first needs a BLAS


# --------------------------------------------------------------------------------- choosing one


def measure_libraries(candidates, rounds=9):
    """{library name: seconds} of three float32 products shaped like one thread's slice of a small
    transformer's layers (rows of tokens by widths of 128 to 512), each through the library's sgemm
    called on this thread (`candidates`: {name: addresses}). The libraries take turns, three times,
    so that a noisy neighbour slows them alike; the first turn warms the caches and is not kept."""
    shapes = [(384, 128, 512), (384, 512, 128), (128, 384, 384)]
    rng = np.random.default_rng(0)
    operands = [(rng.standard_normal((n, k), dtype=np.float32), rng.standard_normal((k, m), dtype=np.float32), np.empty((n, m), np.float32))
                for n, k, m in shapes]  # fmt: skip
    sgemm_type = ctypes.CFUNCTYPE(None, *[ctypes.c_int32] * 3, *[ctypes.c_int64] * 3, ctypes.c_float, *[ctypes.c_int64] * 4, ctypes.c_float, ctypes.c_int64, ctypes.c_int64)  # fmt: skip
    set_threads = ctypes.CFUNCTYPE(None, ctypes.c_int32)(OPENBLAS[0][OUR_NAMES[3]])
    previous = ctypes.CFUNCTYPE(ctypes.c_int32)(OPENBLAS[0][OUR_NAMES[2]])()
    set_threads(1)  # as the kernels call it: one thread per call
    turns = {name: [] for name in candidates}
    try:
        for _ in range(3):
            for name, addresses in candidates.items():
                sgemm = sgemm_type(addresses[OUR_NAMES[0]])
                total = 0.0
                for a, b, c in operands:
                    (n, k), m = a.shape, b.shape[1]
                    times = []
                    for _ in range(rounds):
                        start = time.perf_counter()
                        sgemm(ROW_MAJOR, NO_TRANSPOSE, NO_TRANSPOSE, n, m, k, 1.0, a.ctypes.data, k, b.ctypes.data, m, 0.0, c.ctypes.data, m)
                        times.append(time.perf_counter() - start)
                    total += sorted(times)[rounds // 2]
                turns[name].append(total)
    finally:
        set_threads(previous)
    return {name: min(times[1:]) for name, times in turns.items()}


def faster_library(seconds, margin=0.05):
    """The library to use, given {name: seconds} for the same products: MKL only where it beats
    OpenBLAS by more than `margin` (a closer race is noise, and OpenBLAS is numpy's own)."""
    if "MKL" in seconds and seconds["MKL"] < (1 - margin) * seconds["OpenBLAS"]:
        return "MKL"
    return "OpenBLAS"


def choice_file():
    """Where the measured choice is kept: with this module's compiled kernels (Numba's cache)."""
    folder = numba.config.CACHE_DIR or os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__")
    return Path(folder) / "blas-choice.json"


def machine_key(files):
    """What a measured choice holds for: this CPU, and the libraries' and this module's files as
    they are (an upgrade or an edit measures again)."""
    cpu = platform.machine()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as cpuinfo:
            cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), cpu)
    paths = [os.path.realpath(path) for path in [__file__, *files]]
    stamps = [f"{path}:{os.stat(path).st_size}:{os.stat(path).st_mtime_ns}" for path in paths]
    return {"cpu": cpu, "files": stamps}


def choose_library():
    """'OpenBLAS' or 'MKL', and its {our name: address}: the BLAS whose gemm the kernels call.
    MICROTENSOR_BLAS=openblas or =mkl says which; otherwise the faster of those installed on this
    CPU (`measure_libraries`, a few dozen products), measured once and kept on disk (`choice_file`), so that
    every later run on the same machine makes the same choice and so computes the same numbers."""
    asked = os.environ.get("MICROTENSOR_BLAS")
    if asked is not None and asked.lower() == "openblas":
        return "OpenBLAS", OPENBLAS[0]  # numpy's, loaded already: MKL is not even looked for
    candidates = {"OpenBLAS": OPENBLAS}
    mkl = find_mkl()
    if mkl is not None:
        candidates["MKL"] = mkl
    if asked is not None:
        if asked.lower() != "mkl" or mkl is None:
            installed = " or ".join(name.lower() for name in candidates)
            raise InputError(f"MICROTENSOR_BLAS: {asked!r} is not a BLAS installed here; expected {installed}")
        return "MKL", mkl[0]
    if len(candidates) == 1:
        return "OpenBLAS", OPENBLAS[0]
    key, path = machine_key([file for _, file in candidates.values()]), choice_file()
    try:
        kept = json.loads(path.read_text())
        if kept["key"] == key and kept["choice"] in candidates:
            return kept["choice"], candidates[kept["choice"]][0]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none kept yet, or kept for another machine or version: measure
    seconds = measure_libraries({name: addresses for name, (addresses, _) in candidates.items()})
    choice = faster_library(seconds)
    try:  # written whole, then renamed, so that no reader sees half a file
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}")
        partial.write_text(json.dumps({"key": key, "choice": choice, "seconds": seconds}, indent=1))
        os.replace(partial, path)
    except OSError:
        pass  # a read-only install measures again in each process
    return choice, candidates[choice][0]


_registered = None  # the name of the library whose gemm LLVM was given, once it was


def available():
    """True if the compiled kernels here can call a BLAS. The first time it is True, the chosen
    library's gemm (`choose_library`) and OpenBLAS's thread-count functions are given to LLVM under
    our names, which only fills LLVM's table of symbols in this process; call it before any kernel
    of this module runs, as every fast twin does."""
    global _registered
    if numba.config.DISABLE_JIT or OPENBLAS is None:
        return False
    if _registered is None:
        import llvmlite.binding as llvm

        choice, gemm_addresses = choose_library()
        for name, address in {**OPENBLAS[0], **gemm_addresses}.items():
            llvm.add_symbol(name, address)
        _registered = choice
    return True


def library():
    """The BLAS the compiled kernels call, 'OpenBLAS' or 'MKL'; None where they call none."""
    return _registered if available() else None


# --------------------------------------------------------------------------------- the kernels


@kernel
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


@kernel
def one_openblas_thread():
    """Set OpenBLAS to one thread and return the count it had (for `restore_openblas_threads`), so
    that a gemm call made on one of Numba's threads runs on that thread only."""
    previous = openblas_get_num_threads()
    if previous != 1:
        openblas_set_num_threads(np.int32(1))
    return previous


@kernel
def restore_openblas_threads(previous):
    """Give OpenBLAS back the thread count `one_openblas_thread` found."""
    if previous != 1:
        openblas_set_num_threads(previous)


@kernel(parallel=True)
def gemm_in_parallel(double, jobs):
    """Every BLAS call of the job table `jobs` (int64 (J, 11), the columns above), the calls shared
    among the threads (J is a multiple of the thread count, or large, so that they share it evenly),
    OpenBLAS on one thread meanwhile."""
    previous = one_openblas_thread()
    for job in prange(jobs.shape[0]):
        gemm(double, jobs[job])
    restore_openblas_threads(previous)


# --------------------------------------------------------------------------------- job tables


@kernel
def address(x):
    """The address of x's first number. numpy's x.ctypes.data builds a ctypes object to say it,
    and a training step asks for a few hundred addresses; this compiled call reads the pointer
    without building anything."""
    return x.ctypes.data


def blas_layout(x):
    """(transpose flag, leading dimension) that BLAS reads the matrix x (rows, cols) with, or None if
    x's strides fit neither way (then it must be copied)."""
    return layout_of(x.shape, x.strides, x.itemsize)


@functools.lru_cache(maxsize=256)
def layout_of(shape, strides, itemsize):
    """blas_layout from a matrix's shape, strides and item size; kept, as a training step asks for the
    same few layouts a hundred times."""
    rows, cols = shape
    if any(s % itemsize for s in strides):
        return None
    row_stride, col_stride = (s // itemsize for s in strides)
    if col_stride == 1 and (rows == 1 or row_stride >= max(1, cols)):
        return NO_TRANSPOSE, max(1, cols) if rows == 1 else row_stride
    if row_stride == 1 and (cols == 1 or col_stride >= max(1, rows)):
        return TRANSPOSE, max(1, rows) if cols == 1 else col_stride
    return None


def multiply_into(*products):
    """c = a @ b for every (a, b, c) in `products`: a (n, k) and b (k, m) of any strides, c (n, m)
    written in place, all of one float dtype; call `available()` first. The products are computed
    in one parallel call: each gets an equal share of the threads of Numba's pool, and each of those
    one slice of its rows (with fewer threads in use, set by numba.set_num_threads, a thread takes
    several slices). A layer's backward needs two products, g Wᵀ and xᵀ g; computed together, the
    threads meet once instead of twice, and each BLAS call gets more rows to work on. (Why the
    pool's threads and not those in use: memory.pool_size.)

    Everything here but the products themselves is Python that runs for every product of a training
    step, so it is kept to plain arithmetic on shapes and strides (each numpy call has a cost)."""
    slices = max(1, pool_size() // len(products))
    jobs = []
    operands = []  # every array a job points into, alive until the jobs have run (copies included)
    written_back = []  # (c, the contiguous array BLAS wrote instead) where c's layout does not suit BLAS
    for a, b, c in products:
        n, k = a.shape
        m = b.shape[1]
        if n * k * m < SMALL_PRODUCT or k == 0:
            np.matmul(a, b, out=c)  # on this thread: too small to be worth sharing
            continue
        layouts = [blas_layout(x) for x in (a, b)]
        if None in layouts:
            a, b = (np.ascontiguousarray(x) if layout is None else x for x, layout in zip((a, b), layouts))
            layouts = [blas_layout(x) for x in (a, b)]
        (trans_a, lda), (trans_b, ldb) = layouts
        c_layout = blas_layout(c)
        if c_layout is None or c_layout[0] != NO_TRANSPOSE:
            written_back.append((c, np.empty((n, m), dtype=c.dtype)))
            c = written_back[-1][1]
            c_layout = NO_TRANSPOSE, m
        ldc = c_layout[1]
        operands += (a, b, c)
        a_address, b_address, c_address = address(a), address(b), address(c)
        for part in range(slices):  # slice `part` is rows [first, last) of C and of op(A)
            first, last = n * part // slices, n * (part + 1) // slices
            if last > first:
                a_slice, c_slice = a_address + first * a.strides[0], c_address + first * c.strides[0]
                jobs.append((trans_a, trans_b, last - first, m, k, a_slice, lda, b_address, ldb, c_slice, ldc))
    if jobs:
        gemm_in_parallel(products[0][2].dtype == np.float64, np.array(jobs, dtype=np.int64))
    for c, written in written_back:
        c[...] = written


def batched_jobs(a, b, out, jobs=None):
    """The job table (outer * inner, 11) of the products out[i, j] = a[i, j] @ b[i, j] for 4-D
    stacks (outer, inner, n, k) @ (outer, inner, k, m) -> out (outer, inner, n, m), all of one
    float dtype, any strides (views of other arrays too: BLAS reads them as they are), written into
    `jobs` if given (a view of a larger table may be); None if the stacks are empty or a matrix's
    strides fit no BLAS layout (then nothing can be done without copying)."""
    layouts = [blas_layout(x[0, 0]) if x.size else None for x in (a, b, out)]
    if None in layouts or layouts[2][0] != NO_TRANSPOSE:
        return None
    (trans_a, lda), (trans_b, ldb), (_, ldc) = layouts
    outer, inner, n, k = a.shape
    if jobs is None:
        jobs = np.empty((outer * inner, 11), dtype=np.int64)
    jobs[:] = (trans_a, trans_b, n, b.shape[3], k, 0, lda, 0, ldb, 0, ldc)
    for column, x in ((A, a), (B, b), (C, out)):  # the address of matrix (i, j) of each stack
        jobs[:, column] = _matrix_offsets(outer, inner, *x.strides[:2]) + address(x)
    return jobs


@functools.lru_cache(maxsize=64)
def _matrix_offsets(outer, inner, outer_stride, inner_stride):
    """Byte offsets of the matrices (i, j) of an (outer, inner) stack, in order, (outer * inner,);
    kept, as a training step asks for the same few again and again."""
    i, j = np.divmod(np.arange(outer * inner, dtype=np.int64), inner)
    offsets = i * outer_stride + j * inner_stride
    offsets.flags.writeable = False  # shared by every call that asks for it
    return offsets
