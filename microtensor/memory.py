"""Keep the memory a training step frees for the next step, instead of giving it back to the OS.

A step allocates its activations and gradients (32 MiB for the GPT recipe) and frees them all when
the graph goes. By default glibc's malloc then returns the top of its heap to the OS and serves
arrays from about 1.5 MiB up with fresh mmaps, so the next step faults every page back in: 6,600
page faults per step of the recipe, and a step ~40% slower (53 instead of 38 ms on a 2-core
virtual machine). With both of malloc's thresholds fixed (mallopt also turns off their automatic
adjustment) the pages are reused: no faults after the first steps, full speed, the same peak RSS.

microtensor does this when it is imported. Without glibc (macOS, musl) there is nothing to change.

`copy_of` copies an array the way backward copies a leaf's first gradient into `.grad`: by a
plain loop rather than C's memcpy, for the reason given there.
"""
import ctypes

import numba
import numpy as np
from numba import njit

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # from glibc's malloc.h


def keep_freed_memory(mmap_threshold=32 << 20, trim_threshold=256 << 20):
    """Arrays under `mmap_threshold` bytes (32 MiB, glibc's maximum) come from the heap, which keeps
    up to `trim_threshold` bytes of freed pages. Returns False where there is no glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))


@njit(cache=True)
def copy_elements(source, destination):
    """destination[i] = source[i] for two 1-D arrays of one dtype (LLVM vectorizes the loop)."""
    for i in range(source.shape[0]):
        destination[i] = source[i]


def copy_of(array, dtype):
    """A new array with `array`'s values in `dtype` (laid out as np.array(array, copy=True) would).

    Why not np.array(array, copy=True): numpy copies contiguous data with C's memcpy, and glibc's
    memcpy (2.36, on a 2-core AMD EPYC Zen 3 VM) ran 7-11x slower when the copy began 16 bytes past
    the original modulo 4096, for arrays up to ~512 KB (384 KB: 139-222 µs instead of 13-20). That
    is where malloc puts an array of the same size allocated just after another, so a gradient
    copied into `.grad` lands there often. This loop takes about as long as memcpy elsewhere and
    ~20 µs there. Other layouts and dtypes go to numpy, whose strided copy does not call memcpy,
    and so does everything under NUMBA_DISABLE_JIT=1, where the loop would run in Python.
    """
    if numba.config.DISABLE_JIT or array.dtype != dtype or not array.flags.c_contiguous:
        return np.array(array, dtype=dtype, copy=True)
    copy = np.empty_like(array)
    copy_elements(array.reshape(-1), copy.reshape(-1))
    return copy
