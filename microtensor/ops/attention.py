"""Scaled dot-product attention, fused: one kernel forward, one kernel backward.

Shapes: q (B, H, Tq, D), k and v (B, H, Tk, D), Tk >= Tq when causal. The queries are the LAST Tq
positions of the sequence (so a KV cache can pass one new query against all cached keys): query i
sits at absolute position Tk - Tq + i and, when causal, sees keys j <= Tk - Tq + i.

Forward, for one (b, h) (every (b, h) is independent, so the kernels run them in parallel):

    S = q kᵀ / √D                        (Tq, Tk)   scores
    S_ij = -inf where j is masked        (causal)
    P = softmax(S) along j               (Tq, Tk)   each row sums to 1
    O = P v                              (Tq, D)

Backward, from dO = dL/dO (Tq, D), one matrix product at a time:

    O = P v          ->   dP = dO vᵀ             (Tq, Tk)    dv = Pᵀ dO        (Tk, D)
    P = softmax(S)   ->   dS_ij = P_ij (dP_ij - sum_j' P_ij' dP_ij')   (the softmax JVP, per row)
    S = q kᵀ / √D    ->   dq = dS k / √D         (Tq, D)     dk = dSᵀ q / √D   (Tk, D)

Masked entries have P_ij = 0, so dS_ij = 0 there: the kernels skip them instead of computing and
discarding. The forward saves P (B, H, Tq, Tk) for backward rather than recomputing it from the
scores: at the recipe's shape (12, 4, 64, 64) that is 0.8 MB per layer, cheaper than a second
pass of exponentials. Under no_grad (sampling) P is still written row by row but never kept.

`multi_head_attention(qkv, n_head)` is the whole attention of a transformer block in one op:
qkv (B, T, 3C) from one Linear layer, split into heads (q, k, v each (B, H, T, D), C = H D),
attended causally, and the heads merged back into (B, T, C). Its backward writes the gradients of
q, k and v straight into one (B, T, 3C) array. Built from reshape, permute and indexing instead,
the same computation costs seven more graph nodes per block, and the backward of each index
scatters into a zero array the size of qkv.
"""
import math

import numpy as np
from numba import njit, prange

from ..autograd import Function
from ..gradcheck import gradcheck_case
from ..tensor import Tensor
from .checks import check_float
from .vector_math import exp_of_nonpositive

REDUCE_FASTMATH = {"reassoc", "contract", "arcp"}  # dot products vectorize; inf/NaN keep their meaning


def attention_reference(q, k, v, causal=True):
    """Plain numpy attention with an explicit mask (the test oracle)."""
    Tq, Tk, D = q.shape[-2], k.shape[-2], q.shape[-1]
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(D)  # (B, H, Tq, Tk)
    if causal:
        visible = np.arange(Tk)[None, :] <= (Tk - Tq + np.arange(Tq))[:, None]  # (Tq, Tk)
        scores = np.where(visible, scores, -np.inf)
    scores = scores - scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p = p / p.sum(axis=-1, keepdims=True)
    return p @ v


@njit(cache=True, parallel=True, error_model="numpy", fastmath=REDUCE_FASTMATH)
def attention_forward(q, k, v, scale, causal, out, probs):
    """q (B, H, Tq, D), k, v (B, H, Tk, D) -> out (B, H, Tq, D); probs (B, H, Tq, Tk) gets P."""
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    zero = q.dtype.type(0)  # typed accumulators: a bare 0 would make float32 math float64
    for bh in prange(B * H):
        b, h = bh // H, bh % H
        for i in range(Tq):
            last = Tk - Tq + i if causal else Tk - 1  # the last key this query sees
            row_max = zero
            for j in range(last + 1):
                s = zero
                for d in range(D):
                    s += q[b, h, i, d] * k[b, h, j, d]
                s *= scale
                probs[b, h, i, j] = s
                if j == 0 or s > row_max:
                    row_max = s
            total = zero
            for j in range(last + 1):
                e = exp_of_nonpositive(probs[b, h, i, j] - row_max)
                probs[b, h, i, j] = e
                total += e
            for j in range(last + 1):
                probs[b, h, i, j] /= total
            for j in range(last + 1, Tk):
                probs[b, h, i, j] = 0
            for d in range(D):
                out[b, h, i, d] = 0
            for j in range(last + 1):
                p = probs[b, h, i, j]
                for d in range(D):
                    out[b, h, i, d] += p * v[b, h, j, d]


@njit(cache=True, parallel=True, error_model="numpy", fastmath=REDUCE_FASTMATH)
def attention_backward(grad_out, q, k, v, probs, scale, causal, grad_q, grad_k, grad_v):
    """grad_out (B, H, Tq, D) -> grad_q (B, H, Tq, D), grad_k, grad_v (B, H, Tk, D)."""
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    zero = q.dtype.type(0)
    for bh in prange(B * H):
        b, h = bh // H, bh % H
        grad_k[b, h, :, :] = 0
        grad_v[b, h, :, :] = 0
        d_probs = np.empty(Tk, dtype=q.dtype)  # one row of dP, private to this (b, h)
        for i in range(Tq):
            last = Tk - Tq + i if causal else Tk - 1
            row_dot = zero  # sum_j P_ij dP_ij
            for j in range(last + 1):
                dp = zero
                for d in range(D):
                    dp += grad_out[b, h, i, d] * v[b, h, j, d]
                d_probs[j] = dp
                row_dot += probs[b, h, i, j] * dp
            for d in range(D):
                grad_q[b, h, i, d] = 0
            for j in range(last + 1):
                p = probs[b, h, i, j]
                d_score = p * (d_probs[j] - row_dot) * scale
                for d in range(D):
                    grad_q[b, h, i, d] += d_score * k[b, h, j, d]
                    grad_k[b, h, j, d] += d_score * q[b, h, i, d]
                    grad_v[b, h, j, d] += p * grad_out[b, h, i, d]


class ScaledDotProductAttention(Function):
    @staticmethod
    def forward(ctx, q, k, v, causal):
        q, k, v = np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v)
        B, H, Tq, D = q.shape
        scale = q.dtype.type(1 / math.sqrt(D))
        out = np.empty_like(q)
        probs = np.empty((B, H, Tq, k.shape[2]), dtype=q.dtype)
        attention_forward(q, k, v, scale, causal, out, probs)
        ctx.save_for_backward(q, k, v, probs)
        ctx.scale, ctx.causal = scale, causal
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, probs = ctx.saved_tensors
        grad_q, grad_k, grad_v = np.empty_like(q), np.empty_like(k), np.empty_like(v)
        attention_backward(np.ascontiguousarray(grad_out), q, k, v, probs, ctx.scale, ctx.causal, grad_q, grad_k, grad_v)
        return grad_q, grad_k, grad_v, None


class MultiHeadAttention(Function):
    @staticmethod
    def forward(ctx, qkv, n_head, causal):
        B, T, C3 = qkv.shape
        H, D = n_head, C3 // 3 // n_head
        heads = qkv.reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)  # (3, B, H, T, D), a view
        q, k, v = (np.ascontiguousarray(heads[s]) for s in range(3))  # each (B, H, T, D)
        scale = qkv.dtype.type(1 / math.sqrt(D))
        out = np.empty_like(q)
        probs = np.empty((B, H, T, T), dtype=qkv.dtype)
        attention_forward(q, k, v, scale, causal, out, probs)
        ctx.save_for_backward(q, k, v, probs)
        ctx.scale, ctx.causal = scale, causal
        return out.transpose(0, 2, 1, 3).reshape(B, T, H * D)  # heads merged: (B, T, C)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, probs = ctx.saved_tensors
        B, H, T, D = q.shape
        grad_heads = np.ascontiguousarray(grad_out.reshape(B, T, H, D).transpose(0, 2, 1, 3))  # (B, H, T, D)
        grad_q, grad_k, grad_v = np.empty_like(q), np.empty_like(k), np.empty_like(v)
        attention_backward(grad_heads, q, k, v, probs, ctx.scale, ctx.causal, grad_q, grad_k, grad_v)
        grad_qkv = np.empty((B, T, 3, H, D), dtype=q.dtype)
        for s, grad in enumerate((grad_q, grad_k, grad_v)):
            grad_qkv[:, :, s] = grad.transpose(0, 2, 1, 3)  # (B, T, H, D)
        return grad_qkv.reshape(B, T, 3 * H * D), None, None


def multi_head_attention(qkv, n_head, causal=True):
    """qkv (B, T, 3C), the queries, keys and values side by side -> (B, T, C): split into n_head
    heads, attention within each, heads merged. Equal to splitting qkv into q, k, v (B, H, T, D),
    calling scaled_dot_product_attention and merging, in one op."""
    if not isinstance(qkv, Tensor) or qkv.ndim != 3:
        raise ValueError(f"multi_head_attention: qkv must be a 3-d Tensor (B, T, 3C), got {getattr(qkv, 'shape', qkv)}")
    check_float("multi_head_attention", qkv)
    B, T, C3 = qkv.shape
    if C3 % 3 or (C3 // 3) % n_head or n_head < 1:
        raise ValueError(
            f"multi_head_attention: the last dim of qkv {qkv.shape} must be 3 C with C divisible by n_head ({n_head})"
        )
    if T == 0 or C3 == 0:
        raise ValueError(f"multi_head_attention: empty input {qkv.shape}")
    return MultiHeadAttention.apply(qkv, int(n_head), bool(causal))


def scaled_dot_product_attention(q, k, v, causal=True):
    """softmax(q kᵀ / √D, causally masked) v for q (B, H, Tq, D) and k, v (B, H, Tk, D)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.ndim != 4:
            raise ValueError(f"scaled_dot_product_attention: {name} must be a 4-d Tensor (B, H, T, D), got {getattr(t, 'shape', t)}")
    check_float("scaled_dot_product_attention", q, k, v)
    (B, H, Tq, D), Tk = q.shape, k.shape[2]
    if k.shape != v.shape or k.shape[:2] != (B, H) or k.shape[3] != D:
        raise ValueError(
            f"scaled_dot_product_attention: shapes q {q.shape}, k {k.shape}, v {v.shape} do not fit "
            "(expected q (B, H, Tq, D) and k, v both (B, H, Tk, D))"
        )
    if causal and Tk < Tq:
        raise ValueError(f"scaled_dot_product_attention: causal attention needs Tk >= Tq, got Tq {Tq} and Tk {Tk}")
    if Tq == 0 or Tk == 0 or D == 0:
        raise ValueError(f"scaled_dot_product_attention: empty input (q {q.shape}, k {k.shape})")
    return ScaledDotProductAttention.apply(q, k, v, bool(causal))


@gradcheck_case(ScaledDotProductAttention)
def _attention_case(draw):
    B, H, D = draw.integer(1, 2), draw.integer(1, 2), draw.integer(1, 4)
    Tq = draw.integer(1, 4)
    Tk = Tq + draw.integer(0, 2)
    causal = draw.boolean()
    q, k, v = draw.tensor((B, H, Tq, D)), draw.tensor((B, H, Tk, D)), draw.tensor((B, H, Tk, D))
    return (lambda q, k, v: scaled_dot_product_attention(q, k, v, causal)), (q, k, v)


@gradcheck_case(MultiHeadAttention)
def _multi_head_attention_case(draw):
    H, D = draw.integer(1, 3), draw.integer(1, 3)
    qkv = draw.tensor((draw.integer(1, 2), draw.integer(1, 4), 3 * H * D))
    causal = draw.boolean()
    return (lambda qkv: multi_head_attention(qkv, H, causal)), (qkv,)
