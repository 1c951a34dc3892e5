"""Exercise 14: online-softmax attention with O(T) memory. The reference solution.

    per query row i, walking the keys in tiles J:   m_new = max(m, max_(j in J) S_ij)
        ℓ   <- e^(m - m_new) ℓ   + sum_(j in J) e^(S_ij - m_new)
        acc <- e^(m - m_new) acc + sum_(j in J) e^(S_ij - m_new) v_j
    O_i = acc / ℓ        L_i = m + log ℓ   (all backward needs of P: P_ij = e^(S_ij - L_i))
"""
import math

import numpy as np

from microtensor.autograd import Function
from microtensor.errors import InputError
from microtensor.kernels import kernel


@kernel
def online_attention_forward(q, k, v, scale, causal, tile, out, log_sum_exp):
    """q, k, v (B, H, T, D) -> out (B, H, T, D), and log_sum_exp (B, H, T): L_i = m + log ℓ of
    each query row. scale = 1/√D; causal: query i sees the keys j <= i; tile: keys per tile."""
    B, H, T, D = q.shape
    real = q.dtype.type  # every number in q's float type: a bare 0.0 would make float32 math float64
    zero, minus_infinity = real(0), real(-np.inf)
    scores = np.empty(tile, dtype=q.dtype)  # S_ij of one tile of keys, for one query: the only scratch
    for b in range(B):
        for h in range(H):
            for i in range(T):
                last = i if causal else T - 1  # the last key query i may see
                running_max = minus_infinity  # m
                running_sum = zero  # ℓ
                for d in range(D):  # acc, kept in O's own row until the division at the end
                    out[b, h, i, d] = 0
                for start in range(0, last + 1, tile):
                    stop = min(start + tile, last + 1)  # the last tile may be shorter
                    # the tile's scores S_ij = (q_i · k_j) / √D, and their max
                    tile_max = minus_infinity
                    for j in range(start, stop):
                        dot = zero
                        for d in range(D):
                            dot += q[b, h, i, d] * k[b, h, j, d]
                        scores[j - start] = dot * scale
                        tile_max = max(tile_max, scores[j - start])
                    new_max = max(running_max, tile_max)
                    # all scores -inf so far: the sums are 0; subtract 0, as -inf - (-inf) is NaN
                    shift = new_max if new_max > minus_infinity else zero
                    # the sums so far hold e^(S - m); times e^(m - m_new) they hold e^(S - m_new)
                    correction = np.exp(running_max - shift)
                    running_sum *= correction
                    for d in range(D):
                        out[b, h, i, d] *= correction
                    # the tile's own terms: ℓ += e^(S_ij - m_new), acc += e^(S_ij - m_new) v_j
                    for j in range(start, stop):
                        p = np.exp(scores[j - start] - shift)
                        running_sum += p
                        for d in range(D):
                            out[b, h, i, d] += p * v[b, h, j, d]
                    running_max = new_max
                # O_i = acc / ℓ,  L_i = m + log ℓ = log sum_j e^(S_ij)
                for d in range(D):
                    out[b, h, i, d] /= running_sum
                log_sum_exp[b, h, i] = running_max + np.log(running_sum)


@kernel
def online_attention_backward(grad_out, q, k, v, out, log_sum_exp, scale, causal, tile, grad_q, grad_k, grad_v):
    """grad_out = dL/dO (B, H, T, D) -> grad_q, grad_k, grad_v (B, H, T, D), from q, k, v and what
    the forward saved: out (B, H, T, D) and log_sum_exp (B, H, T). P is recomputed tile by tile,
    P_ij = e^(S_ij - L_i), and never stored whole."""
    B, H, T, D = q.shape
    zero = q.dtype.type(0)
    probs = np.empty(tile, dtype=q.dtype)  # P_ij of one tile of keys, for one query, recomputed
    for b in range(B):
        for h in range(H):
            grad_k[b, h, :, :] = 0  # dk_j and dv_j add up over the queries i
            grad_v[b, h, :, :] = 0
            for i in range(T):
                last = i if causal else T - 1
                # D_i = dO_i · O_i, which equals sum_j P_ij dP_ij: the softmax's row term, no row of P needed
                row_dot = zero
                for d in range(D):
                    row_dot += grad_out[b, h, i, d] * out[b, h, i, d]
                for d in range(D):
                    grad_q[b, h, i, d] = 0
                for start in range(0, last + 1, tile):
                    stop = min(start + tile, last + 1)
                    # the tile's P_ij = e^(S_ij - L_i), from the scores and the saved L_i
                    for j in range(start, stop):
                        dot = zero
                        for d in range(D):
                            dot += q[b, h, i, d] * k[b, h, j, d]
                        probs[j - start] = np.exp(dot * scale - log_sum_exp[b, h, i])
                    for j in range(start, stop):
                        p = probs[j - start]
                        dp = zero  # dP_ij = dO_i · v_j   (from O = P v)
                        for d in range(D):
                            dp += grad_out[b, h, i, d] * v[b, h, j, d]
                        d_score = p * (dp - row_dot)  # dS_ij = P_ij (dP_ij - D_i)
                        for d in range(D):
                            grad_q[b, h, i, d] += d_score * scale * k[b, h, j, d]
                            grad_k[b, h, j, d] += d_score * scale * q[b, h, i, d]
                            grad_v[b, h, j, d] += p * grad_out[b, h, i, d]


class OnlineAttention(Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, tile):
        B, H, T, D = q.shape
        scale = q.dtype.type(1 / math.sqrt(D))  # the 1/√D of S = q kᵀ / √D, in q's float type
        out = np.empty((B, H, T, D), dtype=q.dtype)
        log_sum_exp = np.empty((B, H, T), dtype=q.dtype)  # L: one number per query row
        online_attention_forward(q, k, v, scale, causal, tile, out, log_sum_exp)
        ctx.save_for_backward(q, k, v, out, log_sum_exp)  # nothing of size T × T
        ctx.scale, ctx.causal, ctx.tile = scale, causal, tile
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, log_sum_exp = ctx.saved_tensors
        grad_q, grad_k, grad_v = np.empty(q.shape, q.dtype), np.empty(k.shape, k.dtype), np.empty(v.shape, v.dtype)
        online_attention_backward(
            np.ascontiguousarray(grad_out), q, k, v, out, log_sum_exp, ctx.scale, ctx.causal, ctx.tile, grad_q, grad_k, grad_v
        )
        return grad_q, grad_k, grad_v, None, None


def online_attention(q, k, v, causal=True, tile=2):
    """softmax(q kᵀ / √D, causally masked or not) v for q, k, v (B, H, T, D), walking the keys in
    tiles of `tile` (an int >= 1), keeping O and one log-sum-exp per row for backward."""
    if q.ndim != 4 or q.shape != k.shape or q.shape != v.shape:
        raise InputError(f"online_attention: expected q, k, v of one shape (B, H, T, D), got {q.shape}, {k.shape}, {v.shape}")
    if not (q.dtype == k.dtype == v.dtype):
        raise InputError(f"online_attention: q, k, v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not isinstance(tile, int) or isinstance(tile, bool) or tile < 1:
        raise InputError(f"online_attention: tile must be an int >= 1, got {tile!r}")
    if not isinstance(causal, bool):
        raise InputError(f"online_attention: causal must be True or False, got {causal!r}")
    return OnlineAttention.apply(q, k, v, causal, tile)
