"""Cross-entropy loss of logits against class indices, fused with log-softmax in one kernel.

Forward. logits x (N, V) (or (B, T, V), flattened to N = B*T rows), targets t (N,) with values in
[0, V), or equal to `ignore_index` for positions that take no part (padding). For each row n:

    loss_n = -log softmax(x_n)[t_n] = -(x_n,t_n - log sum_v e^{x_n,v}) = lse_n - x_n,t_n

    L = (1 / N_valid) sum_{n valid} loss_n                 () a 0-d tensor, the mean over valid rows

The log-sum-exp is computed stably from the row max m_n (see softmax.py):

    s_n = sum_v e^{x_n,v - m_n}        lse_n = m_n + log s_n        loss_n = (m_n - x_n,t_n) + log s_n

and the kernel also writes the exponentials e^{x_n,v - m_n}, from which backward gets the
probabilities p_n,v = e^{x_n,v - m_n} / s_n (the softmax of row n). (`log_softmax` followed by
picking the target would write and re-read all N*V log-probabilities, and backward would still
need the probabilities.)

Backward. loss_n depends on row n only, and d lse_n/dx_n,v = e^{x_n,v} / sum_u e^{x_n,u} = p_n,v:

    dloss_n/dx_n,v = d lse_n/dx_n,v - d x_n,t_n/dx_n,v = p_n,v - [v == t_n]      (V,)

so, with the upstream gradient g (a scalar, since L is):

    dL/dx_n,v = g / N_valid * (p_n,v - [v == t_n])     for valid rows n         (N, V)
    dL/dx_n,v = 0                                        for ignored rows

Each gradient row sums to 0 (the probabilities sum to 1, the one-hot to 1).

Forward mode (JVP). Along a tangent t (N, V) of the logits, L moves by the same derivatives summed
against t instead of multiplied by g:

    dL = (1 / N_valid) sum_{n valid} (<p_n, t_n> - t_n,t_n)                        ()

What forward saves for backward: the exponentials e_n,v = e^{x_n,v - m_n} (N, V) and 1/s_n per row
(0 for ignored rows), so that p_n,v = e_n,v / s_n. Backward makes one pass anyway, to multiply by
g / N_valid; it multiplies by (g / N_valid) / s_n instead, and forward skips the pass that would
divide by s_n. (Saving only m_n and log s_n and recomputing the exponentials in backward would
make forward write nothing but the losses, but then backward would pay for N*V exponentials
again, the dearest part of the op.)

Kernels. The forward kernel is softmax.py's `softmax_forward` with the loss added: for each row,
the same running max and the same loop of exponentials and their sum, then, instead of the division,
the loss (m_n - x_n,t_n) + log s_n and 1/s_n. It is written out here rather than calling
softmax_forward because the loss needs m_n and s_n, which softmax_forward keeps to itself. Rows
are independent, so both kernels loop over them with `prange`. The fast set's versions are in
microtensor/fast/cross_entropy.py.

ignore_index: -100 by default, like PyTorch (positions whose target is -100 are skipped); pass None
to ignore nothing, so that every target must be a class index. If every position is ignored there
is nothing to average: PyTorch returns NaN (0 / 0); here it is an error that says so, because a NaN
loss would silently poison every weight at the next optimizer step.
"""
import numpy as np
from numba import prange

from ..autograd import Function
from ..checks import FLOAT_DTYPES, check_int, check_tensor, describe
from ..errors import InputError, InputIndexError, InputTypeError
from ..gradcheck import gradcheck_case
from ..kernels import active, kernel
from ..tensor import Tensor

# --------------------------------------------------------------------------------- numpy reference


def cross_entropy_reference(logits, targets, ignore_index=-100):
    """Plain numpy cross-entropy: the mean of -log softmax(logits)[target] over non-ignored rows."""
    logits = logits.reshape(-1, logits.shape[-1])  # (N, V)
    targets = targets.reshape(-1)  # (N,)
    valid = np.ones(targets.shape, dtype=bool) if ignore_index is None else targets != ignore_index
    shifted = logits[valid] - logits[valid].max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))  # (N_valid, V)
    return -log_probs[np.arange(valid.sum()), targets[valid]].mean()


# --------------------------------------------------------------------------------- kernels


@kernel
def count_valid_targets(targets, vocab_size, ignore_index, has_ignore_index):
    """(number of rows not ignored, index of the first target outside [0, V), or -1 if none)."""
    valid = 0
    for n in range(targets.shape[0]):
        t = targets[n]
        if has_ignore_index and t == ignore_index:
            continue
        if t < 0 or t >= vocab_size:
            return valid, n
        valid += 1
    return valid, -1


@kernel(parallel=True)
def cross_entropy_forward(logits, targets, ignore_index, row_loss, exps, inverse_total):
    """Per row n: row_loss[n] = -log softmax(logits[n])[targets[n]], exps[n] = e^(logits[n] - max) and
    inverse_total[n] = 1 / sum(exps[n]), so that softmax(logits[n]) = exps[n] * inverse_total[n];
    row_loss and inverse_total are 0 for an ignored row.

    logits, exps (N, V); targets, row_loss, inverse_total (N,); all C-contiguous.
    """
    rows, vocab = logits.shape
    for n in prange(rows):
        row_max = logits[n, 0]  # m = max_v x_v, as in softmax_forward
        for v in range(1, vocab):
            if logits[n, v] > row_max:
                row_max = logits[n, v]
        total = logits.dtype.type(0)  # s = sum_v e^(x_v - m), as in softmax_forward
        for v in range(vocab):
            exps[n, v] = np.exp(logits[n, v] - row_max)
            total += exps[n, v]
        t = targets[n]
        if t == ignore_index:
            row_loss[n] = logits.dtype.type(0)
            inverse_total[n] = logits.dtype.type(0)
        else:
            row_loss[n] = (row_max - logits[n, t]) + np.log(total)  # lse - x_t = (m - x_t) + log s
            inverse_total[n] = logits.dtype.type(1) / total


@kernel(parallel=True)
def cross_entropy_backward(exps, inverse_total, targets, ignore_index, scale, grad_logits):
    """grad_logits[n] = scale * (exps[n] * inverse_total[n] - onehot(targets[n])), zeros for ignored rows.

    scale = grad_out / N_valid.   exps, grad_logits (N, V); inverse_total, targets (N,).
    """
    rows, vocab = exps.shape
    for n in prange(rows):
        t = targets[n]
        if t == ignore_index:
            for v in range(vocab):
                grad_logits[n, v] = exps.dtype.type(0)
        else:
            row_scale = scale * inverse_total[n]  # (g / N_valid) / s_n
            for v in range(vocab):
                grad_logits[n, v] = exps[n, v] * row_scale  # (g / N_valid) p_n,v
            grad_logits[n, t] -= scale  # minus (g / N_valid) [v == t_n]


# --------------------------------------------------------------------------------- Function


class CrossEntropy(Function):
    """L = mean over valid rows of (lse_n - x_n,t_n).   dL/dx_n = g / N_valid * (softmax(x_n) - onehot(t_n)).

    JVP: dL = mean over valid rows of <softmax(x_n), t_n> - t_n,t_n.
    """

    @staticmethod
    def forward(ctx, logits, targets, ignore_index, valid_count):
        # targets (N,) int64, C-contiguous (made so by cross_entropy); ignore_index is an int here (-1
        # when nothing is ignored: the caller checked that every target is then in [0, V));
        # valid_count: the rows not ignored (> 0).
        ctx.shape = logits.shape
        logits = np.ascontiguousarray(logits).reshape(-1, logits.shape[-1])  # (N, V)
        row_loss = np.empty(targets.shape[0], dtype=logits.dtype)  # (N,)
        inverse_total = np.empty_like(row_loss)  # (N,)
        exps = np.empty_like(logits)  # (N, V)
        active(cross_entropy_forward)(logits, targets, ignore_index, row_loss, exps, inverse_total)
        ctx.save_for_backward(exps, inverse_total, targets)
        ctx.ignore_index, ctx.valid_count = ignore_index, valid_count
        return np.asarray(row_loss.sum() / logits.dtype.type(valid_count), dtype=logits.dtype)  # ()

    @staticmethod
    def backward(ctx, grad_out):
        exps, inverse_total, targets = ctx.saved_tensors
        scale = (grad_out / grad_out.dtype.type(ctx.valid_count))[()]  # a float32/float64 scalar
        grad_logits = np.empty_like(exps)  # (N, V)
        active(cross_entropy_backward)(exps, inverse_total, targets, ctx.ignore_index, scale, grad_logits)
        return grad_logits.reshape(ctx.shape), None, None, None

    @staticmethod
    def jvp(ctx, tangent, _targets, _ignore_index, _valid_count):
        exps, inverse_total, targets = ctx.saved_tensors
        t = tangent.reshape(exps.shape)  # (N, V)
        probs = exps * inverse_total[:, None]  # (N, V), rows of zeros where the target is ignored
        valid = targets != ctx.ignore_index  # (N,)
        picked = np.take_along_axis(t, np.where(valid, targets, 0)[:, None], axis=1)[:, 0]  # t_n,t_n (N,)
        rows = np.sum(probs * t, axis=1) - np.where(valid, picked, tangent.dtype.type(0))  # (N,)
        return np.asarray(rows.sum() / tangent.dtype.type(ctx.valid_count), dtype=tangent.dtype)


def cross_entropy(logits, targets, ignore_index=-100):
    """Mean cross-entropy -log softmax(logits)[target] over the positions whose target is not ignored.

    logits: float Tensor (N, V) or (B, T, V), unnormalized scores over V classes.
    targets: integer Tensor (or numpy array) (N,) or (B, T), class indices in [0, V).
    ignore_index: positions whose target equals it are left out of the mean and get zero gradient
        (-100 by default, like PyTorch); None ignores nothing.
    Returns a 0-d Tensor of the logits' dtype. Raises if every position is ignored (PyTorch gives NaN).
    """
    op = "cross_entropy"
    check_tensor(op, logits, "logits")
    if logits.dtype not in FLOAT_DTYPES:
        raise InputTypeError(f"{op}: logits must be float32 or float64, got {logits.dtype} of shape {logits.shape}")
    if isinstance(targets, np.ndarray):
        targets = Tensor._from_array(targets)
    if not isinstance(targets, Tensor):
        raise InputTypeError(f"{op}: targets must be an integer Tensor, got {describe(targets)}")
    if targets.dtype.kind not in "iu":
        raise InputTypeError(
            f"{op}: targets must be integer class indices, got {targets.dtype} of shape {targets.shape}"
        )
    if logits.ndim not in (2, 3):
        raise InputError(f"{op}: logits must have shape (N, V) or (B, T, V), got {logits.shape}")
    if targets.shape != logits.shape[:-1]:
        raise InputError(
            f"{op}: targets of shape {targets.shape} do not match logits of shape {logits.shape} "
            f"(expected targets of shape {logits.shape[:-1]}, one class index per row of logits)"
        )
    vocab_size = logits.shape[-1]
    if vocab_size == 0:
        raise InputError(f"{op}: logits of shape {logits.shape} have no classes (V = 0), so no target can be right")
    if ignore_index is not None:
        if not isinstance(ignore_index, (int, np.integer)) or isinstance(ignore_index, (bool, np.bool_)):
            raise InputTypeError(f"{op}: ignore_index must be an int or None, got {type(ignore_index).__name__}")
        ignore_index = check_int(op, "ignore_index", ignore_index, low=-(2**63), high=2**63 - 1)
    if targets.data.size == 0:
        raise InputError(f"{op}: there are no targets (logits of shape {logits.shape}), so there is no loss to average")
    if targets.dtype == np.uint64 and targets.data.max() > np.iinfo(np.int64).max:
        raise InputError(f"{op}: target {targets.data.max()} is not a class index (logits have V={vocab_size} classes)")
    flat_targets = np.ascontiguousarray(targets.data, dtype=np.int64).reshape(-1)  # (N,)
    has_ignore_index = ignore_index is not None
    ignore = int(ignore_index) if has_ignore_index else -1
    valid_count, first_bad = active(count_valid_targets)(flat_targets, vocab_size, ignore, has_ignore_index)
    if first_bad >= 0:
        position = tuple(int(i) for i in np.unravel_index(first_bad, targets.shape))
        allowed = f"[0, {vocab_size})" + (f" or ignore_index={ignore_index}" if has_ignore_index else "")
        raise InputIndexError(
            f"{op}: target {int(flat_targets[first_bad])} at position {position} is not a class index "
            f"(logits have V={vocab_size} classes, so targets must be in {allowed})"
        )
    if valid_count == 0:
        raise InputError(
            f"{op}: all {flat_targets.shape[0]} targets equal ignore_index={ignore_index}, so there is "
            "no position to average over (PyTorch would return NaN)"
        )
    return CrossEntropy.apply(logits, flat_targets, ignore, valid_count)


# --------------------------------------------------------------------------------- gradcheck cases


def _targets(draw, shape, vocab_size, ignore_index):
    targets = draw.indices(shape, vocab_size)
    if ignore_index is not None:
        ignored = draw.rng.random(shape) < 0.3
        targets.data[ignored] = ignore_index
        kept = np.unravel_index(draw.integer(0, ignored.size - 1), shape)
        targets.data[kept] = vocab_size - 1 if ignore_index == 0 else draw.integer(0, vocab_size - 1)  # one valid row
    return targets


@gradcheck_case(CrossEntropy)
def _cross_entropy_case(draw):
    # 2-D (N, V) or 3-D (B, T, V) logits; with or without ignored positions, and with the default
    # ignore_index or another one (0 is a real class index that may be ignored, as in PyTorch).
    three_dims = draw.boolean()
    rows_shape = (draw.integer(1, 3), draw.integer(1, 4)) if three_dims else (draw.integer(1, 5),)
    vocab_size = draw.integer(1, 5)
    ignore_index = draw.choice((None, -100, 0))
    if ignore_index == 0:
        vocab_size = max(vocab_size, 2)  # so that a valid row has a class other than 0
    logits = draw.tensor(rows_shape + (vocab_size,), low=-3.0, high=3.0)
    targets = _targets(draw, rows_shape, vocab_size, ignore_index)
    return (lambda x: cross_entropy(x, targets, ignore_index)), (logits,)
