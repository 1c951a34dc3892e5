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
    T = logits.shape[1]
    if T < k:
        return None
    return F.cross_entropy(logits[:, : T - k + 1], targets[:, k - 1 :])  # (B, T - k + 1, V) against x_{t+k}


def multi_token_loss(logits_per_head, targets, weights=None):
    """L = sum_k w_k CE_k. logits_per_head: [logits of head 1, head 2, ...], each (B, T, V);
    weights: one number per head (None: 1 each, the plain sum). Returns a scalar Tensor."""
    weights = [1.0] * len(logits_per_head) if weights is None else weights
    total = None
    for k, (logits, weight) in enumerate(zip(logits_per_head, weights), start=1):
        loss = head_loss(logits, targets, k)
        if loss is None:
            continue
        total = loss * weight if total is None else total + loss * weight
    return total
