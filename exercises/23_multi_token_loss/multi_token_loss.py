"""Exercise 23: multi-token prediction's loss. The task is in README.md; write the TODOs below.

    head k (k = 1 .. n) at position t predicts x_{t+k} = targets[:, t + k - 1]
    CE_k = mean over the positions t = 0 .. T - k of -log softmax(logits_k[:, t])[targets[:, t + k - 1]]
    L    = sum_k w_k CE_k          (a head without any position that has a target adds nothing)
"""
import microtensor.functional as F


def head_loss(logits, targets, k):
    """Head k's cross-entropy: logits (B, T, V) Tensor of head k at every position, targets (B, T)
    the next tokens (targets[:, t] = x_{t+1}). Returns a scalar Tensor, or None when T < k (no
    position has a token k places ahead inside the sequence)."""
    # TODO: keep the positions that have a target k places ahead, pair each with its target, and
    # take F.cross_entropy of the two (README: Which positions, which targets).
    raise NotImplementedError("TODO: head_loss (exercise 23)")


def multi_token_loss(logits_per_head, targets, weights=None):
    """L = sum_k w_k CE_k. logits_per_head: [logits of head 1, head 2, ...], each (B, T, V);
    weights: one number per head (None: 1 each, the plain sum). Returns a scalar Tensor."""
    # TODO: head_loss of each head (k counts from 1), weighted, summed; skip the heads that have
    # no position with a target (README: The sum).
    raise NotImplementedError("TODO: multi_token_loss (exercise 23)")
