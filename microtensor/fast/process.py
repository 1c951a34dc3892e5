"""Process-wide settings that make training faster, applied only by an explicit call.

    import microtensor.fast.process
    microtensor.fast.process.tune_for_training()   # train.py, generate.py and bench/ call this

Importing microtensor changes nothing outside it; these settings change the whole process, so a
program asks for them. What `tune_for_training` changes:

- glibc's malloc keeps the memory a training step frees for the next step (`mallopt`), instead of
  giving it back to the operating system and faulting every page in again on the next step.
- OpenMP's threads (Numba's pool) keep spinning a short while after each kernel
  (`GOMP_SPINCOUNT`), so that the next kernel, a few microseconds later, finds them awake. This is
  read when the OpenMP library loads, so it takes effect only if no parallel kernel has run yet; a
  value you set yourself is kept.

It returns what it changed, as a dict, so a program can report it.
"""
import ctypes
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # from glibc's malloc.h
SPIN_COUNT = "30000"


def keep_freed_memory(mmap_threshold=32 << 20, trim_threshold=256 << 20):
    """Arrays under `mmap_threshold` bytes come from the heap, which keeps up to `trim_threshold`
    bytes of freed pages for reuse. Returns False where there is no glibc (macOS, musl)."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))


def tune_for_training():
    """Apply the settings above to this process; returns {setting: value} for those applied."""
    applied = {}
    if keep_freed_memory():
        applied["malloc keeps freed memory"] = True
    if "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT
        applied["GOMP_SPINCOUNT"] = SPIN_COUNT
    return applied
