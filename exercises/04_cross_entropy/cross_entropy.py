"""Exercise 4: fused log-softmax + cross-entropy. The task is in README.md; write the two TODOs below.

    loss_n = lse_n − z_n,t_n,   lse_n = log sum_v e^{z_n,v}     L = (1/N) sum_n loss_n      backward: dL/dz (N, V)
"""
import numpy as np

import microtensor as mt
from microtensor.autograd import Function
from microtensor.errors import InputError, InputIndexError, InputTypeError
from microtensor.kernels import kernel


@kernel
def cross_entropy_forward(logits, targets, row_loss, lse):
    """Per row n: lse[n] = log sum_v e^(logits[n, v]), computed without overflow, and
    row_loss[n] = lse[n] - logits[n, targets[n]].   logits (N, V); targets, row_loss, lse (N,)."""
    # TODO: for every row n: the row's max m, then s = sum_v e^(logits[n, v] - m), then
    # lse[n] = log sum_v e^(logits[n, v]) written with m and s (no e^(...) of a large number), and
    # row_loss[n] = lse[n] - logits[n, targets[n]]. Start the sum at logits.dtype.type(0).
    raise NotImplementedError("TODO: cross_entropy_forward (exercise 4)")


@kernel
def cross_entropy_backward(logits, targets, lse, grad_loss, grad_logits):
    """grad_logits[n, v] = dL/dz_n,v for L = the mean of row_loss over the N rows, from lse (N,)
    saved by forward and grad_loss = dL/dL upstream (one number).   logits, grad_logits (N, V)."""
    # TODO: for every row n and class v, write dL/dz_n,v into grad_logits[n, v]: the probability
    # softmax(z_n)_v (from logits and lse[n]), minus 1 at the target, times grad_loss / N.
    raise NotImplementedError("TODO: cross_entropy_backward (exercise 4)")


class CrossEntropy(Function):
    @staticmethod
    def forward(ctx, logits, targets):
        logits = np.ascontiguousarray(logits)  # (N, V)
        row_loss = np.empty(logits.shape[0], dtype=logits.dtype)  # (N,)
        lse = np.empty_like(row_loss)  # (N,)
        cross_entropy_forward(logits, targets, row_loss, lse)
        ctx.save_for_backward(logits, targets, lse)
        return np.asarray(row_loss.sum() / logits.dtype.type(logits.shape[0]), dtype=logits.dtype)  # (): the mean

    @staticmethod
    def backward(ctx, grad_out):
        logits, targets, lse = ctx.saved_tensors
        grad_logits = np.empty_like(logits)  # (N, V)
        cross_entropy_backward(logits, targets, lse, grad_out[()], grad_logits)  # grad_out is 0-d, as the loss
        return grad_logits, None


def cross_entropy(logits, targets):
    """The mean over N rows of -log softmax(logits[n])[targets[n]].
    logits: a float Tensor (N, V); targets: integer class indices (N,) in [0, V), a Tensor or a numpy array."""
    if not isinstance(logits, mt.Tensor) or logits.dtype not in (np.float32, np.float64):
        raise InputTypeError(f"cross_entropy: logits must be a float32 or float64 Tensor, got {type(logits).__name__}")
    if logits.ndim != 2:
        raise InputError(f"cross_entropy: logits must have shape (N, V), got {logits.shape}")
    N, V = logits.shape
    targets = np.asarray(targets.numpy() if isinstance(targets, mt.Tensor) else targets)
    if targets.dtype.kind not in "iu":
        raise InputTypeError(f"cross_entropy: targets must be integer class indices, got {targets.dtype}")
    if N == 0 or V == 0 or targets.shape != (N,):
        raise InputError(f"cross_entropy: expected logits (N, V) with N, V >= 1 and targets ({N},), got {logits.shape} and {targets.shape}")
    if targets.min() < 0 or targets.max() >= V:
        raise InputIndexError(f"cross_entropy: targets must be in [0, {V}), got values from {targets.min()} to {targets.max()}")
    return CrossEntropy.apply(logits, np.ascontiguousarray(targets, dtype=np.int64))
