"""Keep the memory a training step frees for the next step, instead of giving it back to the OS.

A step allocates its activations and gradients (32 MiB for the GPT recipe) and frees them all when
the graph goes. By default glibc's malloc then returns the top of its heap to the OS and serves
arrays from about 1.5 MiB up with fresh mmaps, so the next step faults every page back in: 6,600
page faults per step of the recipe, and a step ~40% slower (53 instead of 38 ms on a 2-core
virtual machine). With both of malloc's thresholds fixed (mallopt also turns off their automatic
adjustment) the pages are reused: no faults after the first steps, full speed, the same peak RSS.

microtensor does this when it is imported. Without glibc (macOS, musl) there is nothing to change.
"""
import ctypes

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
