"""Exercise 4: fused log-softmax + cross-entropy. The reference solution.

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
    rows, vocab = logits.shape
    for n in range(rows):
        row_max = logits[n, 0]  # m = max_v z_v
        for v in range(1, vocab):
            if logits[n, v] > row_max:
                row_max = logits[n, v]
        total = logits.dtype.type(0)  # s = sum_v e^(z_v - m), at least 1
        for v in range(vocab):
            total += np.exp(logits[n, v] - row_max)
        lse[n] = row_max + np.log(total)  # log sum_v e^(z_v) = m + log s
        row_loss[n] = lse[n] - logits[n, targets[n]]


@kernel
def cross_entropy_backward(logits, targets, lse, grad_loss, grad_logits):
    """grad_logits[n, v] = dL/dz_n,v for L = the mean of row_loss over the N rows, from lse (N,)
    saved by forward and grad_loss = dL/dL upstream (one number).   logits, grad_logits (N, V)."""
    rows, vocab = logits.shape
    scale = grad_loss / logits.dtype.type(rows)  # g / N: the mean's 1/N, times the upstream gradient
    for n in range(rows):
        for v in range(vocab):
            probability = np.exp(logits[n, v] - lse[n])  # softmax(z_n)_v = e^(z_v) / e^(lse)
            grad_logits[n, v] = scale * probability
        grad_logits[n, targets[n]] -= scale  # the one-hot: minus g / N at the target


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
