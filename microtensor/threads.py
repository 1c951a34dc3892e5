"""How many threads Numba's parallel kernels use: `with mt.num_threads(1): ...`.

A parallel kernel wakes the other threads, hands each a share of the rows, and waits for them.
Waking a thread cost ~55 µs here (2 cores, a virtual machine), while a kernel over one token's
numbers (LayerNorm of 1 × 128, GELU of 1 × 512) takes a few µs on one thread: for generating one
token at a time, one thread is ~3x faster. Training steps, with 768 tokens per kernel, are faster
on all cores. Matrix products follow the same count: each thread multiplies one slice of rows
(ops/blas.py).
"""
from contextlib import contextmanager

import numba


@contextmanager
def num_threads(n):
    """Run the enclosed kernels on n threads (None: leave as is), then restore the previous count."""
    previous = numba.get_num_threads()
    if n is not None:
        numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))
    try:
        yield
    finally:
        numba.set_num_threads(previous)
