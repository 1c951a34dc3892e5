"""The fast twin of the engine's `copy_gradient` (microtensor/autograd.py): a leaf's first gradient
copied into `.grad` by a compiled loop rather than by numpy's copy.

Why: numpy copies a contiguous array with the C library's memcpy, and glibc's memcpy has a slow
case when the copy begins just past its source modulo 4096 bytes, which is where malloc places an
array of the same size allocated right after another; a plain loop has no such case. Other layouts
go to numpy, whose strided copy does not call memcpy.
"""
import numpy as np

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
