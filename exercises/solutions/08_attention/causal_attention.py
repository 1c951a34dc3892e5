"""Exercise 8: causal attention backward. The reference solution.

    S = q kᵀ / √D,  S_ij = -inf for j > i      P = softmax(S), by rows      O = P v
    dV = Pᵀ dO    dP = dO Vᵀ    dS = P ⊙ (dP − rowsum(dP ⊙ P))    dQ = dS K / √D    dK = dSᵀ Q / √D
"""
import math

import numpy as np

from microtensor.autograd import Function
from microtensor.errors import InputError
from microtensor.kernels import kernel


@kernel
def attention_forward(q, k, v, scale, out, probs):
    """q, k, v (B, H, T, D) -> out (B, H, T, D); probs (B, H, T, T) gets P, 0 where j > i.
    scale = 1/√D. Every (b, h) is one head's attention, independent of the others."""
    B, H, T, D = q.shape
    zero = q.dtype.type(0)  # typed: a bare 0.0 would make float32 math float64
    for b in range(B):
        for h in range(H):
            for i in range(T):
                # S_ij = (q_i · k_j) / √D for the keys j <= i that query i sees, and the row's max
                row_max = q.dtype.type(-np.inf)
                for j in range(i + 1):
                    dot = zero
                    for d in range(D):
                        dot += q[b, h, i, d] * k[b, h, j, d]
                    s = dot * scale
                    probs[b, h, i, j] = s
                    if s > row_max:
                        row_max = s
                # P_ij = e^(S_ij - max) / sum_j' e^(S_ij' - max)
                total = zero
                for j in range(i + 1):
                    e = np.exp(probs[b, h, i, j] - row_max)
                    probs[b, h, i, j] = e
                    total += e
                for j in range(i + 1):
                    probs[b, h, i, j] /= total
                for j in range(i + 1, T):  # the masked keys: probability 0
                    probs[b, h, i, j] = 0
                # O_i = sum_j P_ij v_j
                for d in range(D):
                    acc = zero
                    for j in range(i + 1):
                        acc += probs[b, h, i, j] * v[b, h, j, d]
                    out[b, h, i, d] = acc


@kernel
def attention_backward(grad_out, q, k, v, probs, scale, grad_q, grad_k, grad_v):
    """grad_out = dL/dO (B, H, T, D) -> grad_q, grad_k, grad_v (B, H, T, D), from q, k, v and the
    P (B, H, T, T) the forward saved in probs. scale = 1/√D. Reads P only where j <= i."""
    B, H, T, D = q.shape
    zero = q.dtype.type(0)
    d_probs = np.empty(T, dtype=q.dtype)  # dP_i: one row of dL/dP
    for b in range(B):
        for h in range(H):
            # dk_j and dv_j collect a term from every query i >= j: start them at 0
            for j in range(T):
                for d in range(D):
                    grad_k[b, h, j, d] = 0
                    grad_v[b, h, j, d] = 0
            for i in range(T):
                # dP_ij = dO_i · v_j   (from O = P v), for the keys j <= i only
                for j in range(i + 1):
                    dp = zero
                    for d in range(D):
                        dp += grad_out[b, h, i, d] * v[b, h, j, d]
                    d_probs[j] = dp
                # the softmax's VJP needs one number per row: <P_i, dP_i> = sum_j P_ij dP_ij
                row_dot = zero
                for j in range(i + 1):
                    row_dot += probs[b, h, i, j] * d_probs[j]
                for d in range(D):
                    grad_q[b, h, i, d] = 0
                for j in range(i + 1):
                    p = probs[b, h, i, j]
                    d_score = p * (d_probs[j] - row_dot)  # dS_ij = P_ij (dP_ij - <P_i, dP_i>)
                    for d in range(D):
                        # S_ij = (q_i · k_j) / √D  ->  dq_i += dS_ij k_j / √D,  dk_j += dS_ij q_i / √D
                        grad_q[b, h, i, d] += d_score * scale * k[b, h, j, d]
                        grad_k[b, h, j, d] += d_score * scale * q[b, h, i, d]
                        # O_i = sum_j P_ij v_j  ->  dv_j += P_ij dO_i
                        grad_v[b, h, j, d] += p * grad_out[b, h, i, d]


class CausalAttention(Function):
    @staticmethod
    def forward(ctx, q, k, v):
        B, H, T, D = q.shape
        scale = q.dtype.type(1 / math.sqrt(D))  # the 1/√D of S = q kᵀ / √D, in q's float type
        out = np.empty((B, H, T, D), dtype=q.dtype)
        probs = np.empty((B, H, T, T), dtype=q.dtype)  # P, kept for backward
        attention_forward(q, k, v, scale, out, probs)
        ctx.save_for_backward(q, k, v, probs)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, probs = ctx.saved_tensors
        grad_q, grad_k, grad_v = np.empty(q.shape, q.dtype), np.empty(k.shape, k.dtype), np.empty(v.shape, v.dtype)
        attention_backward(np.ascontiguousarray(grad_out), q, k, v, probs, ctx.scale, grad_q, grad_k, grad_v)
        return grad_q, grad_k, grad_v


def causal_attention(q, k, v):
    """softmax(q kᵀ / √D, causally masked) v for q, k, v (B, H, T, D), one float dtype."""
    if q.ndim != 4 or q.shape != k.shape or q.shape != v.shape:
        raise InputError(f"causal_attention: expected q, k, v of one shape (B, H, T, D), got {q.shape}, {k.shape}, {v.shape}")
    if not (q.dtype == k.dtype == v.dtype):
        raise InputError(f"causal_attention: q, k, v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    return CausalAttention.apply(q, k, v)
