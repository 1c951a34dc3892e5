"""The fast twins of the engine's `copy_gradient` and `add_gradients` (microtensor/autograd.py).

copy_gradient: a leaf's first gradient copied into `.grad` by a compiled loop rather than by
numpy's copy.

Why: numpy copies a contiguous array with the C library's memcpy, and glibc's memcpy has a slow
case when the copy begins just past its source modulo 4096 bytes, which is where malloc places an
array of the same size allocated right after another; a plain loop has no such case. Other layouts
go to numpy, whose strided copy does not call memcpy.

add_gradients: two parts of one tensor's gradient (a GPT's residual stream gets one from each
block's branch and one straight through the sum) added by all the threads, each thread the same
band of rows as the parallel kernels that wrote them. An addition is nothing but memory traffic,
and one core alone cannot draw all of a chip's memory bandwidth; each band is also, mostly, in the
cache of the core that adds it. Each element is the same sum as numpy's, so the result is equal.
Gradients smaller than `SHARED_SUM_MIN_ELEMENTS_PER_THREAD` numbers per thread (the default
recipe's residual stream among them) fit in the cache of the core that wrote them: the same loop
compiled without threads adds them on the calling thread, and the parallel loop is compiled only
when a larger one comes. Below a page per thread, numpy adds them.
"""
import numba
import numpy as np
from numba import prange

from ..autograd import add_gradients as readable_add_gradients
from ..autograd import copy_gradient as readable_copy_gradient
from ..kernels import fast_twin, kernel


@kernel
def copy_elements(source, destination):
    """destination[i] = source[i] for two 1-D arrays of one dtype."""
    for i in range(source.shape[0]):
        destination[i] = source[i]


@fast_twin(readable_copy_gradient)
def copy_gradient(grad):
    if not grad.flags.c_contiguous:
        return np.array(grad, copy=True)
    copy = np.empty_like(grad)
    copy_elements(grad.reshape(-1), copy.reshape(-1))
    return copy


# The fewest elements worth a thread of their own in an addition: one 4 KiB page of float32 numbers
# (below it, waking a second thread costs more than the half it takes over).
MIN_ELEMENTS_PER_THREAD = 1024


# The fewest numbers per thread worth sharing an addition among the threads: 64 Ki, 256 KiB of
# float32. Below it a second thread saves little, and compiling a parallel loop takes three times
# as long as a serial one: a short run would spend more compiling it than it saves.
SHARED_SUM_MIN_ELEMENTS_PER_THREAD = 65536


@kernel(parallel=True)
def add_elements(held, more, total):
    """total[i] = held[i] + more[i] for three 1-D arrays of one dtype, the elements shared among
    the threads in contiguous bands."""
    for i in prange(held.shape[0]):
        total[i] = held[i] + more[i]


add_elements_serial = kernel(tag="serial")(add_elements)  # the same loop without threads: prange runs as range


@fast_twin(readable_add_gradients)
def add_gradients(held, more):
    size = held.size
    if (
        held.ndim == 0
        or size < MIN_ELEMENTS_PER_THREAD * numba.get_num_threads()
        or not (held.flags.c_contiguous and more.flags.c_contiguous)
        or held.dtype != more.dtype
        or held.shape != more.shape
    ):
        return held + more
    total = np.empty_like(held)
    add = add_elements if size >= SHARED_SUM_MIN_ELEMENTS_PER_THREAD * numba.get_num_threads() else add_elements_serial
    add(held.reshape(-1), more.reshape(-1), total.reshape(-1))
    return total
