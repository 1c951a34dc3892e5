"""The fast twins of the engine's `copy_gradient` and `add_gradients` (microtensor/autograd.py) and
of the Add op's sum of two same-shaped arrays (`add_arrays`, microtensor/ops/elementwise.py).

copy_gradient: a leaf's first gradient copied into `.grad` by a compiled loop rather than by
numpy's copy, shared among the threads from a page of numbers per thread (as the sums below).

Why: numpy copies a contiguous array with the C library's memcpy, and glibc's memcpy has a slow
case when the copy begins just past its source modulo 4096 bytes, which is where malloc places an
array of the same size allocated right after another; a plain loop has no such case. Other layouts
go to numpy, whose strided copy does not call memcpy.

add_gradients and add_arrays: two arrays added by all the threads, each thread the same band of
rows as the parallel kernels that wrote them. The walk adds two parts of one tensor's gradient (a
GPT's residual stream gets one from each block's branch and one straight through the sum); the
forward adds each block's branch to the residual stream. An addition is nothing but memory traffic,
and one core alone cannot draw all of a chip's memory bandwidth; each band is also, mostly, in the
cache of the core that adds it. Each element is the same sum as numpy's, so the result is equal.
Below a page of numbers per thread (`MIN_ELEMENTS_PER_THREAD`), waking a second thread costs more
than the half it takes over, and numpy adds them.
"""
import numba
import numpy as np
from numba import prange

from ..autograd import add_gradients as readable_add_gradients
from ..autograd import copy_gradient as readable_copy_gradient
from ..kernels import fast_twin, kernel
from ..ops import elementwise


@kernel
def copy_elements(source, destination):
    """destination[i] = source[i] for two 1-D arrays of one dtype."""
    for i in range(source.shape[0]):
        destination[i] = source[i]


@kernel(parallel=True)
def copy_elements_in_bands(source, destination):
    """copy_elements, the elements shared among the threads in contiguous bands."""
    for i in prange(source.shape[0]):
        destination[i] = source[i]


@fast_twin(readable_copy_gradient)
def copy_gradient(grad):
    if not grad.flags.c_contiguous:
        return np.array(grad, copy=True)
    copy = np.empty_like(grad)
    (copy_elements_in_bands if worth_sharing(grad.size) else copy_elements)(grad.reshape(-1), copy.reshape(-1))
    return copy


def pool_size():
    """The threads of Numba's pool (NUMBA_NUM_THREADS): how many ways the fast kernels cut work into
    slices and bands. A constant, where the count in use (numba.get_num_threads(), which mt.num_threads
    and numba.set_num_threads lower) takes a process-wide lock to read; with fewer threads in use, a
    thread takes several slices or bands, one after another, and the results are the same."""
    return numba.config.NUMBA_NUM_THREADS


# The fewest elements worth a thread of their own in an elementwise kernel: one 4 KiB page of
# float32 numbers (below it, waking a second thread costs more than the half it takes over).
MIN_ELEMENTS_PER_THREAD = 1024


def worth_sharing(size):
    """Whether `size` numbers give every thread a page of them: the fast set's one rule for sharing
    an elementwise or row-by-row kernel among the threads (memory.py, layer_norm.py, optimizer.py)."""
    if size >= MIN_ELEMENTS_PER_THREAD * pool_size():
        return True  # a page for every thread of the pool, so for those in use too: no need to ask
    return size >= MIN_ELEMENTS_PER_THREAD * numba.get_num_threads()


@kernel(parallel=True)
def add_elements(held, more, total):
    """total[i] = held[i] + more[i] for three 1-D arrays of one dtype, the elements shared among
    the threads in contiguous bands."""
    for i in prange(held.shape[0]):
        total[i] = held[i] + more[i]


def sum_in_bands(a, b):
    """a + b as a new array, by `add_elements` where the arrays are large, contiguous and alike
    (otherwise by numpy, whose sum it equals bit for bit)."""
    size = a.size
    if (
        a.ndim == 0
        or not worth_sharing(size)
        or not (a.flags.c_contiguous and b.flags.c_contiguous)
        or a.dtype != b.dtype
        or a.shape != b.shape
    ):
        return a + b
    total = np.empty_like(a)
    add_elements(a.reshape(-1), b.reshape(-1), total.reshape(-1))
    return total


def add_into(total, more):
    """total += more, for two arrays of one shape and dtype, by `add_elements` where both are large
    and contiguous (otherwise by numpy)."""
    if worth_sharing(total.size) and total.flags.c_contiguous and more.flags.c_contiguous:
        flat = total.reshape(-1)
        add_elements(flat, more.reshape(-1), flat)  # each element read, then written: in place is safe
    else:
        total += more


@fast_twin(readable_add_gradients)
def add_gradients(held, more):
    return sum_in_bands(held, more)


@fast_twin(elementwise.add_arrays)
def add_arrays(a, b):
    return sum_in_bands(a, b)
