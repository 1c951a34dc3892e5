"""The fast twins of softmax's kernels (microtensor/ops/softmax.py): the same arguments, the same results.

Why each differs from the readable kernel:
- softmax_forward: the row maxima and e^t come from vector_math.py, whose loops vectorize where a
  float comparison and the C library's exp run one number at a time, and all the maxima are found
  in a pass of their own so that no row's exponentials stand waiting for its max.
- log_softmax_forward: the same passes and helpers, ending in (x - m) - log s.
- softmax_backward: the readable loops compiled with REDUCE_FASTMATH, so that the dot product
  <g, y> may be summed in any order, which lets it vectorize.
- log_softmax_backward: the readable loops with vector_math's e^t (every z is <= 0) and
  REDUCE_FASTMATH, for the same two reasons.
"""
import numpy as np
from numba import prange

from ..kernels import fast_twin, kernel
from ..ops import softmax as readable
from .vector_math import REDUCE_FASTMATH, exp_of_nonpositive, max_of_row


@fast_twin(readable.softmax_forward)
@kernel(parallel=True, fastmath=REDUCE_FASTMATH)
def softmax_forward(x, y):
    """y[r] = softmax(x[r]) for every row r.   x, y: (R, C), C-contiguous, C >= 1."""
    rows, cols = x.shape
    one = x.dtype.type(1)
    row_max = np.empty(rows, dtype=x.dtype)  # (R,)
    for r in prange(rows):
        row_max[r] = max_of_row(x, r)
    for r in prange(rows):
        total = x.dtype.type(0)
        for c in range(cols):
            e = exp_of_nonpositive(x[r, c] - row_max[r])
            y[r, c] = e
            total += e
        inverse = one / total
        for c in range(cols):
            y[r, c] *= inverse


@fast_twin(readable.log_softmax_forward)
@kernel(parallel=True, fastmath=REDUCE_FASTMATH)
def log_softmax_forward(x, z):
    """z[r] = log_softmax(x[r]) = (x[r] - max) - log sum e^(x[r] - max).   x, z: (R, C), C >= 1."""
    rows, cols = x.shape
    row_max = np.empty(rows, dtype=x.dtype)  # (R,)
    for r in prange(rows):
        row_max[r] = max_of_row(x, r)
    for r in prange(rows):
        total = x.dtype.type(0)
        for c in range(cols):
            total += exp_of_nonpositive(x[r, c] - row_max[r])
        log_total = np.log(total)
        for c in range(cols):
            z[r, c] = (x[r, c] - row_max[r]) - log_total


softmax_backward = fast_twin(readable.softmax_backward)(
    kernel(parallel=True, fastmath=REDUCE_FASTMATH, tag="fast")(readable.softmax_backward)
)


@fast_twin(readable.log_softmax_backward)
@kernel(parallel=True, fastmath=REDUCE_FASTMATH)
def log_softmax_backward(z, grad_z, grad_x):
    """grad_x[r] = grad_z[r] - e^z[r] * sum(grad_z[r]).   All (R, C), C-contiguous; z <= 0."""
    rows, cols = z.shape
    for r in prange(rows):
        total = z.dtype.type(0)
        for c in range(cols):
            total += grad_z[r, c]
        for c in range(cols):
            grad_x[r, c] = grad_z[r, c] - exp_of_nonpositive(z[r, c]) * total
