"""The fast twins of cross_entropy's kernels (microtensor/ops/cross_entropy.py): the same arguments,
the same results (the losses, and the exponentials and 1/s_n that forward saves for backward).

Why each differs from the readable kernel:
- cross_entropy_forward: on one thread, in three passes over all the rows (the maxima, then the
  exponentials and their sums, then the losses) with vector_math's vectorizing max and e^t, because
  within one row each step waits for the one before, rows in separate passes overlap, and a second
  thread costs more to wake than the work it would take over.
- cross_entropy_backward: the readable loops compiled without `parallel` (`prange` is then a plain
  loop), because one multiplication per number is too little work to pay for a second thread.
"""
import numpy as np

from ..kernels import fast_twin, kernel
from ..ops import cross_entropy as readable
from .vector_math import REDUCE_FASTMATH, exp_of_nonpositive, max_of_row


@fast_twin(readable.cross_entropy_forward)
@kernel(fastmath=REDUCE_FASTMATH)
def cross_entropy_forward(logits, targets, ignore_index, row_loss, exps, inverse_total):
    """Per row n: row_loss[n] = -log softmax(logits[n])[targets[n]], exps[n] = e^(logits[n] - max) and
    inverse_total[n] = 1 / sum(exps[n]); row_loss and inverse_total are 0 for an ignored row.

    logits, exps (N, V); targets, row_loss, inverse_total (N,); all C-contiguous.
    """
    rows, vocab = logits.shape
    zero = logits.dtype.type(0)
    one = logits.dtype.type(1)
    row_max = np.empty(rows, dtype=logits.dtype)  # (N,)
    for n in range(rows):
        row_max[n] = max_of_row(logits, n)
    for n in range(rows):
        total = zero
        for v in range(vocab):
            e = exp_of_nonpositive(logits[n, v] - row_max[n])
            exps[n, v] = e
            total += e
        inverse_total[n] = total  # the sum, for now: the next pass takes its log and inverse
    for n in range(rows):
        t = targets[n]
        if t == ignore_index:
            row_loss[n] = zero
            inverse_total[n] = zero
        else:
            total = inverse_total[n]
            row_loss[n] = (row_max[n] - logits[n, t]) + np.log(total)  # lse - x_t = (m - x_t) + log s
            inverse_total[n] = one / total


cross_entropy_backward = fast_twin(readable.cross_entropy_backward)(
    kernel(fastmath=REDUCE_FASTMATH, tag="fast")(readable.cross_entropy_backward)
)
