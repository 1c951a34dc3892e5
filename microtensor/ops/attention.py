"""Scaled dot-product attention, fused: one kernel forward, one kernel backward.

Shapes: q (B, H, Tq, D), k and v (B, H, Tk, D), Tk >= Tq when causal. The queries are the LAST Tq
positions of the sequence (so a KV cache can pass one new query against all cached keys): query i
sits at absolute position Tk - Tq + i and, when causal, sees keys j <= Tk - Tq + i.

Forward, for one (b, h) (every (b, h) is independent, so the kernels run them in parallel):

    S = q kᵀ / √D                        (Tq, Tk)   scores: S_ij = (q_i · k_j) / √D
    S_ij = -inf where j is masked        (causal)
    P = softmax(S) along j               (Tq, Tk)   each row sums to 1
    O = P v                              (Tq, D)    O_i = sum_j P_ij v_j

The 1/√D keeps the scores' spread near 1 whatever D is (a dot product of D terms of unit variance
has variance D), so the softmax does not saturate. In the kernels it is the argument `scale`
(= 1/√D), multiplied into each dot product q_i · k_j as soon as it is summed, exactly where S's
formula puts it; the softmax subtracts each row's maximum first, so no e^x overflows (the
derivation is in ops/softmax.py).

Backward, from dO = dL/dO (Tq, D), one step of the forward at a time, last step first:

    O = P v          ->   dP = dO vᵀ             (Tq, Tk)    dv = Pᵀ dO        (Tk, D)
    P = softmax(S)   ->   dS_ij = P_ij (dP_ij - sum_j' P_ij' dP_ij')        (Tq, Tk)
    S = q kᵀ / √D    ->   dq = dS k / √D         (Tq, D)     dk = dSᵀ q / √D   (Tk, D)

dS is the softmax's vector-Jacobian product, row by row: ops/softmax.py derives it
(dx_j = y_j (g_j - <g, y>), with y = P_i and g = dP_i here). In the backward kernel the 1/√D is
again `scale`, multiplied into dS_ij where the last line's formula puts it.

Masked entries have P_ij = 0, so dS_ij = 0 there and they add nothing to dv: the kernels skip them
instead of computing and discarding. The forward saves P (B, H, Tq, Tk) for backward rather than
recomputing it from the scores (one array kept instead of a second pass of exponentials). Under
no_grad (sampling) P is still written, but not kept.

`multi_head_attention(qkv, n_head)` is the whole attention of a transformer block in one op:
qkv (B, T, 3C) from one Linear layer, split into heads (q, k, v each (B, H, T, D), C = H D),
attended causally, and the heads merged back into (B, T, C). No copy is made to split or merge:
q, k and v are strided views of qkv, the kernels read them as they are, and they write the output
and the gradients of q, k and v straight into views of one (B, T, C) and one (B, T, 3C) array.
Built from reshape, permute and indexing instead, the same computation would take seven more graph
nodes per block, and the backward of each index would scatter into a zero array the size of qkv.

The kernels `attention_forward` and `attention_backward` below are the readable ones: every step
of the math above, plain loops, parallel over (b, h). The fast set's twins call BLAS for the
products (microtensor/fast/attention.py).
"""
import math

import numpy as np
from numba import prange

from ..autograd import Function
from ..errors import InputError
from ..gradcheck import gradcheck_case
from ..kernels import active, kernel
from .checks import check_flag, check_float, check_int, check_ndim, check_tensor

# --------------------------------------------------------------------------------- numpy reference


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


# --------------------------------------------------------------------------------- readable kernels


@kernel(parallel=True)
def attention_forward(q, k, v, scale, causal, out, probs):
    """q (B, H, Tq, D), k, v (B, H, Tk, D) -> out (B, H, Tq, D); probs (B, H, Tq, Tk) gets P.
    scale = 1/√D. Any strides (q, k, v, out may be views of larger arrays)."""
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    zero = q.dtype.type(0)  # typed: a bare 0.0 would make float32 math float64
    for bh in prange(B * H):
        b, h = bh // H, bh % H
        for i in range(Tq):
            last = Tk - Tq + i if causal else Tk - 1  # the last key query i may see
            # S_ij = (q_i · k_j) / √D, and the row's maximum as we go
            row_max = q.dtype.type(-np.inf)
            for j in range(last + 1):
                dot = zero
                for d in range(D):
                    dot += q[b, h, i, d] * k[b, h, j, d]
                s = dot * scale
                probs[b, h, i, j] = s
                if s > row_max:
                    row_max = s
            # P_ij = e^(S_ij - max) / sum_j' e^(S_ij' - max)
            total = zero
            for j in range(last + 1):
                e = np.exp(probs[b, h, i, j] - row_max)
                probs[b, h, i, j] = e
                total += e
            for j in range(last + 1):
                probs[b, h, i, j] /= total
            for j in range(last + 1, Tk):  # masked keys: probability 0
                probs[b, h, i, j] = 0
            # O_i = sum_j P_ij v_j
            for d in range(D):
                out[b, h, i, d] = 0
            for j in range(last + 1):
                p = probs[b, h, i, j]
                for d in range(D):
                    out[b, h, i, d] += p * v[b, h, j, d]


@kernel(parallel=True)
def attention_backward(grad_out, q, k, v, probs, scale, causal, grad_q, grad_k, grad_v):
    """grad_out (B, H, Tq, D) = dL/dO -> grad_q (B, H, Tq, D), grad_k, grad_v (B, H, Tk, D), from
    q, k, v and the P that attention_forward saved in probs (B, H, Tq, Tk). scale = 1/√D. Any
    strides."""
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    zero = q.dtype.type(0)
    for bh in prange(B * H):
        b, h = bh // H, bh % H
        grad_k[b, h, :, :] = 0  # dk and dv add up over the queries i
        grad_v[b, h, :, :] = 0
        d_probs = np.empty(Tk, dtype=q.dtype)  # dP_i, one row of dL/dP, private to this (b, h)
        for i in range(Tq):
            last = Tk - Tq + i if causal else Tk - 1
            # dP_ij = dO_i · v_j   (from O = P v)
            for j in range(last + 1):
                dp = zero
                for d in range(D):
                    dp += grad_out[b, h, i, d] * v[b, h, j, d]
                d_probs[j] = dp
            # the softmax's JVP: dS_ij = P_ij (dP_ij - sum_j' P_ij' dP_ij')
            row_dot = zero
            for j in range(last + 1):
                row_dot += probs[b, h, i, j] * d_probs[j]
            for d in range(D):
                grad_q[b, h, i, d] = 0
            for j in range(last + 1):
                p = probs[b, h, i, j]
                d_score = p * (d_probs[j] - row_dot)  # dS_ij
                # S_ij = (q_i · k_j) / √D  ->  dq_i += dS_ij k_j / √D,  dk_j += dS_ij q_i / √D
                for d in range(D):
                    grad_q[b, h, i, d] += d_score * scale * k[b, h, j, d]
                    grad_k[b, h, j, d] += d_score * scale * q[b, h, i, d]
                # O_i = sum_j P_ij v_j  ->  dv_j += P_ij dO_i
                for d in range(D):
                    grad_v[b, h, j, d] += p * grad_out[b, h, i, d]


# --------------------------------------------------------------------------------- the Functions


class ScaledDotProductAttention(Function):
    @staticmethod
    def forward(ctx, q, k, v, causal):
        B, H, Tq, D = q.shape
        Tk = k.shape[2]
        scale = q.dtype.type(1 / math.sqrt(D))  # the 1/√D of S = q kᵀ / √D, in q's float type
        out = np.empty((B, H, Tq, D), dtype=q.dtype)
        probs = np.empty((B, H, Tq, Tk), dtype=q.dtype)  # P, kept for backward
        active(attention_forward)(q, k, v, scale, causal, out, probs)
        ctx.save_for_backward(q, k, v, probs)
        ctx.scale, ctx.causal = scale, causal
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, probs = ctx.saved_tensors
        grad_q, grad_k, grad_v = np.empty(q.shape, q.dtype), np.empty(k.shape, k.dtype), np.empty(v.shape, v.dtype)
        active(attention_backward)(grad_out, q, k, v, probs, ctx.scale, ctx.causal, grad_q, grad_k, grad_v)
        return grad_q, grad_k, grad_v, None


class MultiHeadAttention(Function):
    @staticmethod
    def forward(ctx, qkv, n_head, causal):
        B, T, C3 = qkv.shape
        H, D = n_head, C3 // 3 // n_head
        heads = qkv.reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)  # (3, B, H, T, D), a view
        out = np.empty((B, T, H * D), dtype=qkv.dtype)
        out_heads = out.reshape(B, T, H, D).transpose(0, 2, 1, 3)  # (B, H, T, D), a view of out
        probs = np.empty((B, H, T, T), dtype=qkv.dtype)
        scale = qkv.dtype.type(1 / math.sqrt(D))
        active(attention_forward)(heads[0], heads[1], heads[2], scale, causal, out_heads, probs)
        ctx.save_for_backward(qkv, probs)
        ctx.n_head, ctx.scale, ctx.causal = n_head, scale, causal
        return out

    @staticmethod
    def backward(ctx, grad_out):
        qkv, probs = ctx.saved_tensors
        B, T, C3 = qkv.shape
        H, D = ctx.n_head, C3 // 3 // ctx.n_head
        heads = qkv.reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)  # (3, B, H, T, D)
        grad_heads = grad_out.reshape(B, T, H, D).transpose(0, 2, 1, 3)  # (B, H, T, D)
        grad_qkv = np.empty((B, T, C3), dtype=qkv.dtype)
        grad_parts = grad_qkv.reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)  # views of grad_qkv
        active(attention_backward)(
            grad_heads, heads[0], heads[1], heads[2], probs, ctx.scale, ctx.causal, grad_parts[0], grad_parts[1], grad_parts[2]
        )
        return grad_qkv, None, None


def multi_head_attention(qkv, n_head, causal=True):
    """qkv (B, T, 3C), the queries, keys and values side by side -> (B, T, C): split into n_head
    heads, attention within each, heads merged. Equal to splitting qkv into q, k, v (B, H, T, D),
    calling scaled_dot_product_attention and merging, in one op. n_head >= 1 divides C; causal is a
    bool. B = 0 or T = 0 gives an empty result; a head needs D >= 1 numbers, so C = 0 is refused."""
    op = "multi_head_attention"
    check_tensor(op, qkv, "qkv")
    check_ndim(op, "qkv", qkv, (3,), "a 3-d Tensor (B, T, 3C)")
    check_float(op, qkv)
    n_head = check_int(op, "n_head", n_head, low=1)
    causal = check_flag(op, "causal", causal)
    B, T, C3 = qkv.shape
    if C3 % 3 or (C3 // 3) % n_head or C3 == 0:
        raise InputError(
            f"{op}: the last dim of qkv {qkv.shape} must be 3 C with C >= 1 divisible by n_head ({n_head})"
        )
    return MultiHeadAttention.apply(qkv, n_head, causal)


def scaled_dot_product_attention(q, k, v, causal=True):
    """softmax(q kᵀ / √D, causally masked) v for q (B, H, Tq, D) and k, v (B, H, Tk, D); Tk >= Tq
    when causal (a bool). Sizes of 0 give an empty result, except D = 0 (no 1/√D) and Tk = 0 with
    Tq > 0 (a query that sees no key has no softmax)."""
    op = "scaled_dot_product_attention"
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(op, t, name)
        check_ndim(op, name, t, (4,), "a 4-d Tensor (B, H, T, D)")
    check_float(op, q, k, v)
    causal = check_flag(op, "causal", causal)
    (B, H, Tq, D), Tk = q.shape, k.shape[2]
    if k.shape != v.shape or k.shape[:2] != (B, H) or k.shape[3] != D:
        raise InputError(
            f"{op}: shapes q {q.shape}, k {k.shape}, v {v.shape} do not fit "
            "(expected q (B, H, Tq, D) and k, v both (B, H, Tk, D))"
        )
    if causal and Tk < Tq:
        raise InputError(f"{op}: causal attention needs Tk >= Tq, got Tq {Tq} and Tk {Tk}")
    if D == 0 or (Tk == 0 and Tq > 0 and B * H > 0):
        raise InputError(f"{op}: empty input (q {q.shape}, k {k.shape}): D and Tk must be >= 1 when there are queries")
    return ScaledDotProductAttention.apply(q, k, v, causal)


# --------------------------------------------------------------------------------- gradcheck cases


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
