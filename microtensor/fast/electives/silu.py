"""The fast twins of microtensor/ops/electives/silu.py: the same loops, with σ taken from vector_math.py.

Why: the readable kernels' σ calls the C library's exp once per element, and a loop that makes a
call per element cannot use the CPU's vector instructions; vector_math's sigmoid is plain
arithmetic from e^-|x| that Numba inlines, so each loop below handles several elements per
instruction. silu_backward has no twin: it computes no exponential (forward saved σ(x)), so the
readable loop is already plain arithmetic that vectorizes. Arguments, results and saved arrays are
those of the readable kernels (all (N,)); in particular silu_forward writes σ(x) for backward too.
"""
from numba import prange

from ...kernels import fast_twin, kernel
from ...ops.electives import silu as readable
from ..vector_math import sigmoid


@fast_twin(readable.silu_forward)
@kernel(parallel=True)
def silu_forward(x, y, sigmoid_x):
    """y = x σ(x) and σ(x) for backward, with vector_math's σ so that the loop vectorizes."""
    for i in prange(x.shape[0]):
        s = sigmoid(x[i])
        sigmoid_x[i] = s
        y[i] = x[i] * s


@fast_twin(readable.swiglu_forward)
@kernel(parallel=True)
def swiglu_forward(a, b, y):
    """y = a σ(a) b, with vector_math's σ so that the loop vectorizes."""
    for i in prange(a.shape[0]):
        y[i] = a[i] * sigmoid(a[i]) * b[i]


@fast_twin(readable.swiglu_backward)
@kernel(parallel=True)
def swiglu_backward(grad_out, a, b, grad_a, grad_b):
    """grad_a = grad_out * b * dsilu/da, grad_b = grad_out * silu(a), with vector_math's σ so that the loop vectorizes."""
    one = a.dtype.type(1)
    for i in prange(a.shape[0]):
        s = sigmoid(a[i])
        grad_a[i] = grad_out[i] * b[i] * s * (one + a[i] * (one - s))
        grad_b[i] = grad_out[i] * a[i] * s
