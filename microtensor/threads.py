"""How many threads Numba's parallel kernels use: `with mt.num_threads(1): ...`.

A parallel kernel wakes the other threads, hands each a share of the iterations and waits for them
all. For a small amount of work (one token's numbers during generation) that handing-out costs more
than the work itself, so a caller can run a stretch of code on fewer threads and get the previous
count back afterwards.
"""
from contextlib import contextmanager

import numba

from .errors import InputError


@contextmanager
def num_threads(n):
    """Run the enclosed kernels on n threads (None: leave as is), then restore the previous count."""
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise InputError(f"num_threads: expected a positive int or None, got {n!r}")
    previous = numba.get_num_threads()
    if n is not None:
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    try:
        yield
    finally:
        numba.set_num_threads(previous)
