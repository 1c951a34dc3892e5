"""The fast twins of rms_norm's kernels (microtensor/ops/electives/rms_norm.py): the readable loops
themselves, compiled again with other flags.

- rms_norm_forward, rms_norm_backward_input: compiled with REDUCE_FASTMATH, which lets the compiler
  add a row's sums in any order, so that they vectorize (the readable kernels add them in the order
  written, one number at a time).
- rms_norm_backward_weight has no twin: its sums run over rows, one per column, and already
  vectorize across the columns in the order written.

All stay on one thread: a row of a GPT's width is too little work to pay for waking a second one.
"""
from ...kernels import fast_twin, kernel
from ...ops.electives import rms_norm as readable
from ..vector_math import REDUCE_FASTMATH

rms_norm_forward = fast_twin(readable.rms_norm_forward)(
    kernel(fastmath=REDUCE_FASTMATH, tag="fast")(readable.rms_norm_forward)
)
rms_norm_backward_input = fast_twin(readable.rms_norm_backward_input)(
    kernel(fastmath=REDUCE_FASTMATH, tag="fast")(readable.rms_norm_backward_input)
)
