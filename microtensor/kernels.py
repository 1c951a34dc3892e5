"""The two kernel sets, the switch between them, and the decorator every kernel is compiled with.

Every op's file holds its *readable* kernels: plain loops that follow the op's formula line by
line. They are what a student reads, steps through in a debugger and edits. Some ops also have a
*fast* twin in `microtensor/fast/`: the same computation with the same arguments, written for speed
(BLAS calls, vectorized e^x, fused passes). One switch chooses which set runs:

    mt.set_kernels("readable")            # or "fast" (the default)
    with mt.using_kernels("readable"):    # for a block of code, then back
        ...
    MICROTENSOR_KERNELS=readable python train.py    # the default for a whole program

An op calls its kernel through `active`, which hands back the readable kernel itself, or its fast
twin when the fast set is chosen:

    active(softmax_forward)(x_rows, y_rows)

`active` is a lookup in a dict (RUNNING_KERNELS, refilled whenever the set changes), not a function
of ours: stepping into that line in a debugger lands in the kernel at once.

Both sets are run by the same tests and must agree (tests/test_kernel_sets.py). Under
NUMBA_DISABLE_JIT=1 every kernel runs as plain Python, which is what a debugger needs; only the
readable set is meant for that (the fast set calls BLAS from compiled code), so it is the default
there and asking for "fast" is an error.

The cache. Numba can keep compiled kernels on disk (`cache=True`), but it decides whether a cached
kernel is stale by looking at the kernel's own file only: an edit to a helper in another file would
be silently ignored. `kernel` below keys the cache on a hash of every source file of the package
instead (the readable set's files for a readable kernel, every file for a fast one), so any edit
anywhere is seen on the next run, at the price of recompiling.
"""
import hashlib
import inspect
import os
from contextlib import contextmanager
from pathlib import Path

import numba
from numba.core.caching import CompileResultCacheImpl, FunctionCache

from .errors import InputError

KERNEL_SETS = ("readable", "fast")
ENVIRONMENT_VARIABLE = "MICROTENSOR_KERNELS"

PACKAGE_DIR = Path(__file__).resolve().parent
FAST_DIR = PACKAGE_DIR / "fast"

FAST_TWINS = {}  # readable kernel -> its fast twin; filled when microtensor.fast is imported
_chosen = None  # the kernel set in use; None until first asked for


# --------------------------------------------------------------------------------- the switch


def _check_name(where, name):
    if name not in KERNEL_SETS:
        raise InputError(f"{where}: unknown kernel set {name!r}; expected one of {KERNEL_SETS}")
    if name == "fast" and numba.config.DISABLE_JIT:
        raise InputError(
            f"{where}: the fast kernels need Numba's compiler, and NUMBA_DISABLE_JIT=1 is set; "
            "use the readable kernels (they are the ones to step through in a debugger)"
        )


def _default():
    name = os.environ.get(ENVIRONMENT_VARIABLE)
    if name is None:
        return "readable" if numba.config.DISABLE_JIT else "fast"
    _check_name(f"the environment variable {ENVIRONMENT_VARIABLE}", name)
    return name


def set_kernels(name):
    """Choose the kernel set every op runs from now on: "readable" or "fast"."""
    global _chosen
    _check_name("set_kernels", name)
    if name == "fast":
        from . import fast  # noqa: F401  (importing it registers the fast twins)
    _chosen = name
    RUNNING_KERNELS.refill()


def get_kernels():
    """The kernel set in use: "readable" or "fast"."""
    if _chosen is None:
        set_kernels(_default())
    return _chosen


@contextmanager
def using_kernels(name):
    """Run the enclosed code (forward and backward alike) with the kernel set `name`, then go back."""
    previous = get_kernels()
    set_kernels(name)
    try:
        yield
    finally:
        set_kernels(previous)


def _to_run(readable_kernel):
    return FAST_TWINS.get(readable_kernel, readable_kernel) if _chosen == "fast" else readable_kernel


class RunningKernels(dict):
    """Each readable kernel -> the kernel to run for it under the chosen set (itself, or its fast
    twin). Every kernel `kernel` compiles is entered when it is made and again when the set changes;
    a function it has never seen (or any before the set is first chosen) is entered on first use."""

    def __missing__(self, readable_kernel):
        get_kernels()  # the first use chooses the set, which enters every kernel made so far
        self[readable_kernel] = _to_run(readable_kernel)
        return self[readable_kernel]

    def refill(self):
        self.clear()
        if _chosen is not None:
            self.update((k, _to_run(k)) for k in READABLE_KERNELS)


READABLE_KERNELS = []  # every kernel `kernel` has compiled, in the order they were made
RUNNING_KERNELS = RunningKernels()

# active(readable_kernel): the kernel to run for it. A dict lookup rather than a function of ours,
# so that a debugger's step (pdb's `s`) from `active(kernel)(...)` goes straight into the kernel.
active = RUNNING_KERNELS.__getitem__


def fast_twin(readable_kernel):
    """Decorator, used in microtensor/fast/ only: register the decorated kernel as the fast set's
    version of `readable_kernel`. It must take the same arguments and compute the same result."""

    def register(fast_kernel):
        FAST_TWINS[readable_kernel] = fast_kernel
        RUNNING_KERNELS.pop(readable_kernel, None)  # entered again, with its twin, on its next use
        return fast_kernel

    return register


# --------------------------------------------------------------------------------- compiling


def kernel(function=None, *, parallel=False, fastmath=False, tag=""):
    """Compile `function` with Numba (nopython mode), cached on disk and keyed on the sources.

    parallel: run `prange` loops on all cores (only over iterations whose writes never overlap).
    fastmath: a set of LLVM flags, e.g. {"reassoc", "contract", "arcp"} to let sums vectorize.
    tag: tells apart two compilations of one Python function (the fast set may compile a readable
        kernel again with other flags: `kernel(fastmath=..., tag="fast")(readable_kernel)`).
    Division by zero gives inf or nan, as in numpy (error_model="numpy"), rather than raising.
    Under NUMBA_DISABLE_JIT=1 the function is returned as it is, to run as Python.
    """

    def compile_(function):
        function = getattr(function, "py_func", function)  # a compiled kernel: compile its Python again
        if numba.config.DISABLE_JIT:
            return _entered(function)
        dispatcher = numba.njit(parallel=parallel, fastmath=fastmath, error_model="numpy")(function)
        # NUMBA_BOUNDSCHECK=1 compiles index checks into every kernel: a kernel of its own, cached apart
        options = repr((parallel, sorted(fastmath) if isinstance(fastmath, (set, frozenset)) else fastmath, tag, numba.config.BOUNDSCHECK))
        file_tag = tag + ("-boundscheck" if numba.config.BOUNDSCHECK else "")  # both kinds stay cached
        dispatcher._cache = SourceKeyedCache(function, file_tag, options)  # what cache=True would do, with our key
        return _entered(dispatcher)

    return compile_ if function is None else compile_(function)


def _entered(readable_kernel):
    """Enter a new kernel in RUNNING_KERNELS, so that `active` finds it without a call of ours."""
    READABLE_KERNELS.append(readable_kernel)
    if _chosen is not None:
        RUNNING_KERNELS[readable_kernel] = _to_run(readable_kernel)
    return readable_kernel


_file_hashes = {}  # path -> (mtime, size, sha256 digest)


def _file_hash(path):
    stat = os.stat(path)
    known = _file_hashes.get(path)
    if known is None or known[:2] != (stat.st_mtime_ns, stat.st_size):
        known = (stat.st_mtime_ns, stat.st_size, hashlib.sha256(Path(path).read_bytes()).digest())
        _file_hashes[path] = known
    return known[2]


def sources_hash(source_file, include_fast=False):
    """A hash of the package's Python files (all but microtensor/fast/ for a readable kernel, which
    never imports it), and of `source_file` when it lies outside the package (an exercise's file).
    Every kernel made asks for it: the walk skips __pycache__ (the cached kernels) and pathlib."""
    source_file = Path(source_file).resolve()
    include_fast, files = include_fast or FAST_DIR in source_file.parents, []
    for folder, subfolders, names in os.walk(PACKAGE_DIR):
        subfolders[:] = sorted(s for s in subfolders if s != "__pycache__" and (include_fast or os.path.join(folder, s) != str(FAST_DIR)))
        files += sorted(os.path.join(folder, name) for name in names if name.endswith(".py"))
    files += [] if PACKAGE_DIR in source_file.parents else [str(source_file)]
    digest = hashlib.sha256()
    for path in files:
        digest.update(os.path.splitdrive(path)[1].lstrip(os.sep).encode())  # the path without its root
        digest.update(_file_hash(path))
    return digest.hexdigest()


class _SourceKeyedCacheImpl(CompileResultCacheImpl):
    """Numba's own cache layout (files in __pycache__ beside the source), with the freshness stamp
    replaced by `sources_hash` and the compile options, and the tag added to the file names. A
    tagged compilation is made by the fast set, so its stamp covers the fast set's files too (the
    flags it was compiled with are defined there)."""

    tag = ""
    options = ""

    def __init__(self, py_func):
        super().__init__(py_func)
        source_file = inspect.getfile(py_func)
        include_fast, options = bool(self.tag), self.options
        self._locator.get_source_stamp = lambda: (sources_hash(source_file, include_fast), options)

    def get_filename_base(self, fullname, abiflags):
        return super().get_filename_base(fullname + (f"-{self.tag}" if self.tag else ""), abiflags)


class SourceKeyedCache(FunctionCache):
    """The on-disk cache of one kernel: stale as soon as any source it may depend on changes."""

    def __init__(self, py_func, tag="", options=""):
        impl_class = type("_TaggedImpl", (_SourceKeyedCacheImpl,), {"tag": tag, "options": options})
        self._impl_class = impl_class
        super().__init__(py_func)
