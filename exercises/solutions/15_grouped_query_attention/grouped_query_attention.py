"""Exercise 15: grouped-query attention. The reference solution.

    q (B, H, T, D), k and v (B, Hk, T, D), G = H / Hk: query head h reads key/value head h // G
    forward: one head's causal attention per (b, h), with K, V of head h // G
    backward: dK_g = sum over the G query heads h of group g of dK^(h)   (dV_g likewise)
"""
import math

import numpy as np

from microtensor.autograd import Function
from microtensor.errors import InputError


def head_attention_forward(q, k, v):
    """One head's causal attention: q, k, v (T, D) -> O (T, D) and P (T, T), in numpy.
    S = q kᵀ / √D, -inf where key j comes after query i;  P = softmax(S) by rows;  O = P v."""
    T, D = q.shape
    scores = q @ k.T / math.sqrt(D)  # (T, T)
    scores = np.where(np.tril(np.ones((T, T), dtype=bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(axis=1, keepdims=True))  # the row's max first: no overflow
    probs /= probs.sum(axis=1, keepdims=True)
    return probs @ v, probs


def head_attention_backward(grad_out, q, k, v, probs):
    """One head's backward, from dO (T, D) and its P (T, T): dq, dk, dv (T, D), the gradients of
    this head's q, k and v alone (exercise 8's formulas, as matrix products)."""
    D = q.shape[1]
    grad_v = probs.T @ grad_out  # dV = Pᵀ dO
    grad_probs = grad_out @ v.T  # dP = dO Vᵀ
    grad_scores = probs * (grad_probs - (grad_probs * probs).sum(axis=1, keepdims=True))  # dS, the softmax's VJP
    grad_q = grad_scores @ k / math.sqrt(D)  # dQ = dS K / √D
    grad_k = grad_scores.T @ q / math.sqrt(D)  # dK = dSᵀ Q / √D
    return grad_q, grad_k, grad_v


def group_size(n_head, n_kv_head):
    """G = H / Hk, the query heads that share one key/value head; an InputError unless Hk >= 1
    divides H."""
    if n_kv_head < 1 or n_head % n_kv_head:
        raise InputError(
            f"grouped_query_attention: q's {n_head} heads must split into groups over k and v's {n_kv_head} "
            "heads (the number of key/value heads must be >= 1 and divide the number of query heads)"
        )
    return n_head // n_kv_head


def gqa_forward(q, k, v, out, probs):
    """q (B, H, T, D), k, v (B, Hk, T, D) -> out (B, H, T, D); probs (B, H, T, T) gets every
    query head's P. Query head h reads key/value head h // G."""
    B, H = q.shape[0], q.shape[1]
    group = group_size(H, k.shape[1])  # G
    for b in range(B):
        for h in range(H):
            g = h // group  # the key/value head of h's group
            out[b, h], probs[b, h] = head_attention_forward(q[b, h], k[b, g], v[b, g])


def gqa_backward(grad_out, q, k, v, probs, grad_q, grad_k, grad_v):
    """grad_out = dL/dO (B, H, T, D) -> grad_q (B, H, T, D), grad_k, grad_v (B, Hk, T, D): each
    key/value head's gradient is the sum over the query heads of its group."""
    B, H = q.shape[0], q.shape[1]
    group = group_size(H, k.shape[1])
    grad_k[...] = 0  # the sums over each group start at 0
    grad_v[...] = 0
    for b in range(B):
        for h in range(H):
            g = h // group
            head_q, head_k, head_v = head_attention_backward(grad_out[b, h], q[b, h], k[b, g], v[b, g], probs[b, h])
            grad_q[b, h] = head_q  # query head h is used by itself only
            # K_g and V_g were used by every head of group g: their gradients add up
            grad_k[b, g] += head_k
            grad_v[b, g] += head_v


class GroupedQueryAttention(Function):
    @staticmethod
    def forward(ctx, q, k, v):
        B, H, T, D = q.shape
        out = np.empty((B, H, T, D), dtype=q.dtype)
        probs = np.empty((B, H, T, T), dtype=q.dtype)  # every query head's P, kept for backward
        gqa_forward(q, k, v, out, probs)
        ctx.save_for_backward(q, k, v, probs)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, probs = ctx.saved_tensors
        grad_q, grad_k, grad_v = np.empty(q.shape, q.dtype), np.empty(k.shape, k.dtype), np.empty(v.shape, v.dtype)
        gqa_backward(grad_out, q, k, v, probs, grad_q, grad_k, grad_v)
        return grad_q, grad_k, grad_v


def grouped_query_attention(q, k, v):
    """Causal attention of q (B, H, T, D) over k, v (B, Hk, T, D), Hk dividing H: query head h reads
    key/value head h // (H / Hk). Hk = H is multi-head attention, Hk = 1 multi-query attention."""
    if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape:
        raise InputError(
            f"grouped_query_attention: expected q (B, H, T, D) and k, v (B, Hk, T, D), got {q.shape}, {k.shape}, {v.shape}"
        )
    if k.shape[0] != q.shape[0] or k.shape[2:] != q.shape[2:]:
        raise InputError(f"grouped_query_attention: q {q.shape} and k {k.shape} must agree in B, T and D")
    if not (q.dtype == k.dtype == v.dtype):
        raise InputError(f"grouped_query_attention: q, k, v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    group_size(q.shape[1], k.shape[1])  # refuse heads that do not divide before any work
    return GroupedQueryAttention.apply(q, k, v)
