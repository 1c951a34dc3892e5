"""Scaled dot-product attention, fused: one kernel forward, one kernel backward; with grouped-query
attention (fewer key/value heads than query heads) and the ALiBi bias.

Shapes: q (B, H, Tq, D), k and v (B, Hk, Tk, D), H a multiple of Hk, Tk >= Tq when causal. Query
head h reads key/value head h // G, G = H // Hk: a group of G consecutive query heads shares one
K/V head (Hk = H: multi-head attention; Hk = 1: multi-query; in between: grouped-query). The
queries are the LAST Tq positions of the sequence (so a KV cache can pass one new query against all
cached keys): query i sits at absolute position pos_i = Tk - Tq + i and, when causal, sees keys
j <= pos_i.

Forward, for one (b, h), with K, V the (Tk, D) matrices of its K/V head h // G (every (b, h) is
independent, so the kernels run them in parallel):

    S = q Kᵀ / √D - m_h |pos_i - j|      (Tq, Tk)   scores: S_ij = (q_i · k_j) / √D - m_h |pos_i - j|
    S_ij = -inf where j is masked        (causal)
    P = softmax(S) along j               (Tq, Tk)   each row sums to 1
    O = P V                              (Tq, D)    O_i = sum_j P_ij v_j

The 1/√D keeps the scores' spread near 1 whatever D is (a dot product of D terms of unit variance
has variance D), so the softmax does not saturate. In the kernels it is the argument `scale`
(= 1/√D), multiplied into each dot product q_i · k_j as soon as it is summed, exactly where S's
formula puts it; the softmax subtracts each row's maximum first, so no e^x overflows (the
derivation is in ops/softmax.py).

ALiBi (Press et al., "Train short, test long", 2022). Instead of adding a position embedding to
the tokens, ALiBi subtracts from each score a penalty proportional to the distance between the
query and the key, m_h |pos_i - j|, with one slope m_h > 0 per head (`slopes`, (H,)). A head with a
large slope attends to its near neighbours; one with a small slope sees far back. The bias depends
only on the distance pos_i - j, never on the positions themselves: a query at position 5000 treats
the key 3 tokens back exactly as a query at position 50 does, so a model trained on short
sequences meets nothing new on longer ones (no embedding of a position it never saw), which is how
ALiBi extrapolates. For causal attention j <= pos_i and the term is the paper's -m_h (i - j); the
absolute value extends it to keys after the query (non-causal). Slopes of 0 give plain attention,
and exactly so: the kernels subtract 0 · distance = 0, which leaves every score as it was.
`alibi_slopes(n_head)` gives the paper's slopes.

Backward, from dO = dL/dO (Tq, D) of one query head, one step of the forward at a time, last step
first:

    O = P V          ->   dP = dO Vᵀ             (Tq, Tk)    dV^(h) = Pᵀ dO        (Tk, D)
    P = softmax(S)   ->   dS_ij = P_ij (dP_ij - sum_j' P_ij' dP_ij')        (Tq, Tk)
    S = q Kᵀ / √D    ->   dq = dS K / √D         (Tq, D)     dK^(h) = dSᵀ q / √D   (Tk, D)

dS is the softmax's vector-Jacobian product, row by row: ops/softmax.py derives it
(dx_j = y_j (g_j - <g, y>), with y = P_i and g = dP_i here). In the backward kernel the 1/√D is
again `scale`, multiplied into dS_ij where the last line's formula puts it.

The ALiBi term is a constant added to S: it depends on neither q nor K, so ∂S_ij/∂q_i and
∂S_ij/∂k_j are what they are without it, and the last line does not change. Nor does any other:
the bias reaches backward only through P, which forward saves. So the backward kernel needs no
slopes.

Grouped heads. K/V head g (Tk, D) is used by the G query heads h = g G, ..., g G + G - 1: L depends
on K_g through each of their score matrices S^(h), and on V_g through each of their outputs O^(h).
The chain rule adds the paths: a change δ of K_g changes L by sum_h <dK^(h), δ>, so

    dK_g = sum over h in group g of dK^(h) = sum_h dS^(h)ᵀ q^(h) / √D      (Tk, D)
    dV_g = sum over h in group g of dV^(h) = sum_h P^(h)ᵀ dO^(h)           (Tk, D)

(Equivalently: grouped attention is multi-head attention with each K/V head repeated G times, and
the backward of a repeat sums the copies' gradients.) The backward kernel runs in parallel over
(b, g), not over (b, h): the G heads of one group add into the same dK_g and dV_g, so one thread
loops over them and no two threads ever write the same numbers.

Forward mode (JVP), from tangents tq, tK, tV, one step of the forward at a time, first step first
(the chain rule in the order forward runs):

    S = q Kᵀ / √D    ->   dS = (tq Kᵀ + q tKᵀ) / √D                     (Tq, Tk)
    P = softmax(S)   ->   dP_ij = P_ij (dS_ij - sum_j' P_ij' dS_ij')     (Tq, Tk)   (softmax's JVP)
    O = P V          ->   dO = dP V + P tV                               (Tq, D)

Grouped heads need no sum here: each query head reads its group's tK and tV, as forward reads K
and V. `attention_jvp` computes it with numpy from the saved P (ALiBi and the mask reach it only
through P, masked P_ij being 0).

Masked entries have P_ij = 0, so dS_ij = 0 there and they add nothing to dV: the kernels skip them
instead of computing and discarding. The forward saves P (B, H, Tq, Tk) for backward rather than
recomputing it from the scores (one array kept instead of a second pass of exponentials). Under
no_grad (sampling) P is still written, but not kept.

`multi_head_attention(qkv, n_head, n_kv_head=...)` is the whole attention of a transformer block in
one op: qkv (B, T, (H + 2 Hk) D) from one Linear layer holds the H query heads, then the Hk key
heads, then the Hk value heads, side by side; they are split into q (B, H, T, D) and k, v
(B, Hk, T, D), attended causally, and the H heads merged back into (B, T, H D). No copy is made to
split or merge: q, k and v are strided views of qkv, the kernels read them as they are, and they
write the output and the gradients of q, k and v straight into views of one (B, T, H D) and one
(B, T, (H + 2 Hk) D) array. Built from reshape, permute and indexing instead, the same computation
would take seven more graph nodes per block, and the backward of each index would scatter into a
zero array the size of qkv.

The kernels `attention_forward` and `attention_backward` below are the readable ones: every step
of the math above, plain loops, parallel over (b, h) forward and over (b, g) backward. The fast
set's twins call BLAS for the products (microtensor/fast/attention.py).
"""
import math

import numpy as np
from numba import prange

from ..autograd import Function
from ..checks import check_flag, check_float, check_int, check_ndim, check_tensor, describe
from ..errors import InputError, InputTypeError
from ..gradcheck import gradcheck_case
from ..kernels import active, kernel
from ..tensor import Tensor

# --------------------------------------------------------------------------------- ALiBi's slopes


MAX_HEADS = 2**16  # every head needs at least one channel, and no model's embedding is this wide


def alibi_slopes(n_head):
    """The ALiBi paper's slopes m_h for n_head heads, a float64 array (n_head,) (cast it to the
    model's dtype). For n a power of two: the geometric sequence 2^(-8/n), 2^(-16/n), ...,
    2^(-8) (n = 8: 1/2, 1/4, ..., 1/256). Otherwise, with 2^a the largest power of two below n: the
    2^a slopes of 2^a heads, then every other slope of 2^(a+1) heads (the 1st, 3rd, ...) until
    there are n; those fall between the first ones, so the heads still span near and far sight.
    At most MAX_HEADS = 65,536 heads: a count beyond any model's is a mistake (10**12 would fill the
    memory with slopes before failing)."""
    n_head = check_int("alibi_slopes", "n_head", n_head, low=1)
    if n_head > MAX_HEADS:
        raise InputError(f"alibi_slopes: n_head must be <= {MAX_HEADS} (every head needs at least one channel of the embedding), got {n_head}")
    power = 1 << (n_head.bit_length() - 1)  # 2^a <= n_head < 2^(a+1)

    def geometric(n):  # the n slopes of n heads, n a power of two
        return [2.0 ** (-8 * (h + 1) / n) for h in range(n)]

    return np.array(geometric(power) + geometric(2 * power)[0::2][: n_head - power], dtype=np.float64)


# --------------------------------------------------------------------------------- numpy reference


def attention_reference(q, k, v, causal=True, alibi_slopes=None):
    """Plain numpy attention with an explicit mask (the test oracle): q (B, H, Tq, D), k, v
    (B, Hk, Tk, D), each K/V head repeated for the H // Hk query heads of its group; alibi_slopes
    None or (H,)."""
    H, Hk = q.shape[1], k.shape[1]
    k, v = np.repeat(k, H // Hk, axis=1), np.repeat(v, H // Hk, axis=1)  # (B, H, Tk, D)
    Tq, Tk, D = q.shape[-2], k.shape[-2], q.shape[-1]
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(D)  # (B, H, Tq, Tk)
    if alibi_slopes is not None:
        distance = np.abs((Tk - Tq + np.arange(Tq))[:, None] - np.arange(Tk)[None, :])  # (Tq, Tk)
        scores = scores - np.asarray(alibi_slopes)[:, None, None] * distance  # (B, H, Tq, Tk)
    if causal:
        visible = np.arange(Tk)[None, :] <= (Tk - Tq + np.arange(Tq))[:, None]  # (Tq, Tk)
        scores = np.where(visible, scores, -np.inf)
    scores = scores - scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p = p / p.sum(axis=-1, keepdims=True)
    return p @ v


def attention_probabilities(q, k, slopes, causal):
    """P (B, H, Tq, Tk) with numpy, for q (B, H, Tq, D), k (B, Hk, Tk, D), slopes (H,) (the forward
    mode of the ops that save no P recomputes it here)."""
    (B, H, Tq, D), (Hk, Tk) = q.shape, k.shape[1:3]
    if q.size == 0 or k.size == 0:
        return np.zeros((B, H, Tq, Tk), dtype=q.dtype)
    k = np.repeat(k, H // Hk, axis=1)  # (B, H, Tk, D)
    scores = q @ np.swapaxes(k, -1, -2) * q.dtype.type(1 / math.sqrt(D))  # (B, H, Tq, Tk)
    distance = np.abs((Tk - Tq + np.arange(Tq))[:, None] - np.arange(Tk)[None, :])  # (Tq, Tk)
    scores = scores - slopes[:, None, None] * distance.astype(q.dtype)
    if causal:
        visible = np.arange(Tk)[None, :] <= (Tk - Tq + np.arange(Tq))[:, None]  # (Tq, Tk)
        scores = np.where(visible, scores, q.dtype.type(-np.inf))
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True)


def attention_jvp(q, k, v, probs, scale, tangent_q, tangent_k, tangent_v):
    """dO (B, H, Tq, D) from the tangents of q (B, H, Tq, D), k and v (B, Hk, Tk, D) (any may be
    None) and the probabilities P (B, H, Tq, Tk): the module docstring's forward mode, with numpy."""
    dtype = next(t.dtype for t in (tangent_q, tangent_k, tangent_v) if t is not None)
    if q.size == 0 or probs.size == 0:
        return np.zeros(q.shape, dtype=dtype)
    group = q.shape[1] // k.shape[1]
    keys, values = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # (B, H, Tk, D)
    d_scores = np.zeros(probs.shape, dtype=dtype)  # (B, H, Tq, Tk)
    if tangent_q is not None:
        d_scores += tangent_q @ np.swapaxes(keys, -1, -2) * scale
    if tangent_k is not None:
        d_scores += q @ np.swapaxes(np.repeat(tangent_k, group, axis=1), -1, -2) * scale
    d_probs = probs * (d_scores - np.sum(probs * d_scores, axis=-1, keepdims=True))  # (B, H, Tq, Tk)
    d_out = d_probs @ values  # (B, H, Tq, D)
    if tangent_v is not None:
        d_out += probs @ np.repeat(tangent_v, group, axis=1)
    return d_out


# --------------------------------------------------------------------------------- readable kernels


@kernel(parallel=True)
def attention_forward(q, k, v, scale, causal, slopes, out, probs):
    """q (B, H, Tq, D), k, v (B, Hk, Tk, D) -> out (B, H, Tq, D); probs (B, H, Tq, Tk) gets P.
    Query head h reads K/V head h // (H // Hk). scale = 1/√D; slopes (H,), the ALiBi slopes
    (zeros: no bias). Any strides (q, k, v, out may be views of larger arrays)."""
    B, H, Tq, D = q.shape
    Hk, Tk = k.shape[1], k.shape[2]
    zero = q.dtype.type(0)  # typed: a bare 0.0 would make float32 math float64
    for bh in prange(B * H):
        b, h = bh // H, bh % H
        kv = h // (H // Hk)  # the K/V head of h's group
        slope = slopes[h]
        # this head's queries, keys and values as C-contiguous (T, D) copies: q, k and v are usually
        # views into one (B, T, 3C) array, where row j of a head lies 3C numbers after row j - 1; in
        # a copy it lies right after it, so each loop over d below walks neighbouring numbers
        q_h = np.ascontiguousarray(q[b, h])  # (Tq, D)
        k_h = np.ascontiguousarray(k[b, kv])  # (Tk, D)
        v_h = np.ascontiguousarray(v[b, kv])  # (Tk, D)
        out_i = np.empty(D, dtype=q.dtype)  # row i of O, gathered here and then written to out
        for i in range(Tq):
            position = Tk - Tq + i  # query i's place in the sequence
            last = position if causal else Tk - 1  # the last key query i may see
            # S_ij = (q_i · k_j) / √D - m_h |pos_i - j|, and the row's maximum as we go
            row_max = q.dtype.type(-np.inf)
            for j in range(last + 1):
                dot = zero
                for d in range(D):
                    dot += q_h[i, d] * k_h[j, d]
                distance = q.dtype.type(abs(position - j))
                s = dot * scale - slope * distance
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
            out_i[:] = 0
            for j in range(last + 1):
                p = probs[b, h, i, j]
                for d in range(D):
                    out_i[d] += p * v_h[j, d]
            out[b, h, i, :] = out_i


@kernel(parallel=True)
def attention_backward(grad_out, q, k, v, probs, scale, causal, grad_q, grad_k, grad_v):
    """grad_out (B, H, Tq, D) = dL/dO -> grad_q (B, H, Tq, D), grad_k, grad_v (B, Hk, Tk, D), from
    q, k, v and the P that attention_forward saved in probs (B, H, Tq, Tk) (the ALiBi bias, if any,
    is in P: backward needs no slopes). scale = 1/√D. Any strides."""
    B, H, Tq, D = q.shape
    Hk, Tk = k.shape[1], k.shape[2]
    zero = q.dtype.type(0)
    for bg in prange(B * Hk):  # one K/V head per iteration: its group's heads add into its dk, dv
        b, g = bg // Hk, bg % Hk
        group = H // Hk  # G, the query heads g G, ..., g G + G - 1 read K/V head g
        # K/V head g's keys and values as C-contiguous (Tk, D) copies, and its dk and dv gathered in
        # C-contiguous arrays (as in attention_forward: each loop over d then walks neighbouring numbers)
        k_g = np.ascontiguousarray(k[b, g])
        v_g = np.ascontiguousarray(v[b, g])
        grad_k_g = np.zeros((Tk, D), dtype=q.dtype)  # dk and dv add up over the queries i of every head of the group
        grad_v_g = np.zeros((Tk, D), dtype=q.dtype)
        grad_q_i = np.empty(D, dtype=q.dtype)  # row i of dq, gathered here and then written to grad_q
        d_probs = np.empty(Tk, dtype=q.dtype)  # dP_i, one row of dL/dP, private to this (b, g)
        for h in range(g * group, (g + 1) * group):  # dK_g = sum_h dK^(h), dV_g = sum_h dV^(h)
            q_h = np.ascontiguousarray(q[b, h])  # (Tq, D)
            grad_out_h = np.ascontiguousarray(grad_out[b, h])  # (Tq, D)
            for i in range(Tq):
                last = Tk - Tq + i if causal else Tk - 1
                # dP_ij = dO_i · v_j   (from O = P v)
                for j in range(last + 1):
                    dp = zero
                    for d in range(D):
                        dp += grad_out_h[i, d] * v_g[j, d]
                    d_probs[j] = dp
                # the softmax's JVP: dS_ij = P_ij (dP_ij - sum_j' P_ij' dP_ij')
                row_dot = zero
                for j in range(last + 1):
                    row_dot += probs[b, h, i, j] * d_probs[j]
                grad_q_i[:] = 0
                for j in range(last + 1):
                    p = probs[b, h, i, j]
                    d_score = p * (d_probs[j] - row_dot)  # dS_ij
                    # S_ij = (q_i · k_j) / √D - bias  ->  dq_i += dS_ij k_j / √D,  dk_j += dS_ij q_i / √D
                    for d in range(D):
                        grad_q_i[d] += d_score * scale * k_g[j, d]
                        grad_k_g[j, d] += d_score * scale * q_h[i, d]
                    # O_i = sum_j P_ij v_j  ->  dv_j += P_ij dO_i
                    for d in range(D):
                        grad_v_g[j, d] += p * grad_out_h[i, d]
                grad_q[b, h, i, :] = grad_q_i
        grad_k[b, g, :, :] = grad_k_g
        grad_v[b, g, :, :] = grad_v_g


# --------------------------------------------------------------------------------- the Functions


class ScaledDotProductAttention(Function):
    """O = softmax(q Kᵀ / √D - bias, masked) V.   Backward and forward mode (JVP): the module docstring."""

    @staticmethod
    def forward(ctx, q, k, v, causal, slopes):
        B, H, Tq, D = q.shape
        Tk = k.shape[2]
        scale = q.dtype.type(1 / math.sqrt(D))  # the 1/√D of S = q kᵀ / √D, in q's float type
        out = np.empty((B, H, Tq, D), dtype=q.dtype)
        probs = np.empty((B, H, Tq, Tk), dtype=q.dtype)  # P, kept for backward
        active(attention_forward)(q, k, v, scale, causal, slopes, out, probs)
        ctx.save_for_backward(q, k, v, probs)
        ctx.scale, ctx.causal = scale, causal
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, probs = ctx.saved_tensors
        grad_q, grad_k, grad_v = np.empty(q.shape, q.dtype), np.empty(k.shape, k.dtype), np.empty(v.shape, v.dtype)
        active(attention_backward)(grad_out, q, k, v, probs, ctx.scale, ctx.causal, grad_q, grad_k, grad_v)
        return grad_q, grad_k, grad_v, None, None

    @staticmethod
    def jvp(ctx, tangent_q, tangent_k, tangent_v, _causal, _slopes):
        q, k, v, probs = ctx.saved_tensors
        return attention_jvp(q, k, v, probs, ctx.scale, tangent_q, tangent_k, tangent_v)


def split_heads(qkv, n_head, n_kv_head):
    """q (B, H, T, D), k and v (B, Hk, T, D): views of qkv (B, T, (H + 2 Hk) D), whose last dim
    holds the H query heads, then the Hk key heads, then the Hk value heads."""
    B, T, width = qkv.shape
    D = width // (n_head + 2 * n_kv_head)
    heads = qkv.reshape(B, T, n_head + 2 * n_kv_head, D).transpose(0, 2, 1, 3)  # (B, H + 2 Hk, T, D), a view
    return heads[:, :n_head], heads[:, n_head : n_head + n_kv_head], heads[:, n_head + n_kv_head :]


class MultiHeadAttention(Function):
    """split_heads(qkv), attention, heads merged.   JVP: the tangent of qkv split the same way, attention's
    JVP (the module docstring), the heads' tangents merged the same way.
    """

    @staticmethod
    def forward(ctx, qkv, n_head, n_kv_head, causal, slopes):
        B, T, _ = qkv.shape
        q, k, v = split_heads(qkv, n_head, n_kv_head)
        H, D = n_head, q.shape[3]
        out = np.empty((B, T, H * D), dtype=qkv.dtype)
        out_heads = out.reshape(B, T, H, D).transpose(0, 2, 1, 3)  # (B, H, T, D), a view of out
        probs = np.empty((B, H, T, T), dtype=qkv.dtype)
        scale = qkv.dtype.type(1 / math.sqrt(D))
        active(attention_forward)(q, k, v, scale, causal, slopes, out_heads, probs)
        ctx.save_for_backward(qkv, probs)
        ctx.n_head, ctx.n_kv_head, ctx.scale, ctx.causal = n_head, n_kv_head, scale, causal
        return out

    @staticmethod
    def backward(ctx, grad_out):
        qkv, probs = ctx.saved_tensors
        B, T, _ = qkv.shape
        heads = split_heads(qkv, ctx.n_head, ctx.n_kv_head)  # q (B, H, T, D), k, v (B, Hk, T, D)
        H, D = ctx.n_head, heads[0].shape[3]
        grad_heads = grad_out.reshape(B, T, H, D).transpose(0, 2, 1, 3)  # (B, H, T, D)
        grad_qkv = np.empty(qkv.shape, dtype=qkv.dtype)
        grad_parts = split_heads(grad_qkv, ctx.n_head, ctx.n_kv_head)  # views of grad_qkv
        active(attention_backward)(
            grad_heads, heads[0], heads[1], heads[2], probs, ctx.scale, ctx.causal, grad_parts[0], grad_parts[1], grad_parts[2]
        )
        return grad_qkv, None, None, None, None

    @staticmethod
    def jvp(ctx, tangent_qkv, *_):
        qkv, probs = ctx.saved_tensors
        B, T, _ = qkv.shape
        q, k, v = split_heads(qkv, ctx.n_head, ctx.n_kv_head)
        tangent_heads = attention_jvp(q, k, v, probs, ctx.scale, *split_heads(tangent_qkv, ctx.n_head, ctx.n_kv_head))  # (B, H, T, D)
        return np.ascontiguousarray(tangent_heads.transpose(0, 2, 1, 3)).reshape(B, T, q.shape[1] * q.shape[3])  # (B, T, H D)


# --------------------------------------------------------------------------------- the public functions


def check_alibi_slopes(op, alibi_slopes, n_head, dtype):
    """The slopes as a new contiguous array (n_head,) of the scores' dtype: zeros for None (no
    bias). A list, a numpy array or a Tensor that requires no gradient, of n_head real numbers,
    finite in that dtype; they are constants, so a Tensor that requires grad is refused (its
    gradient would silently be dropped)."""
    if alibi_slopes is None:
        return np.zeros(n_head, dtype=dtype)
    if isinstance(alibi_slopes, Tensor):
        if alibi_slopes.requires_grad:
            raise InputError(
                f"{op}: alibi_slopes are constants and get no gradient, got a Tensor that requires grad "
                "(pass alibi_slopes.detach())"
            )
        values = alibi_slopes.numpy()
    elif isinstance(alibi_slopes, (list, tuple, np.ndarray)):
        try:
            values = np.asarray(alibi_slopes)
        except (ValueError, TypeError):  # a ragged list
            raise InputTypeError(f"{op}: alibi_slopes must be a 1-d list of numbers, got {describe(alibi_slopes)}") from None
    else:
        raise InputTypeError(f"{op}: alibi_slopes must be None, a list, a numpy array or a Tensor, got {describe(alibi_slopes)}")
    if values.dtype.kind not in "iuf":
        raise InputTypeError(f"{op}: alibi_slopes must hold real numbers, got dtype {values.dtype}")
    if values.shape != (n_head,):
        raise InputError(f"{op}: alibi_slopes must have shape ({n_head},), one slope per query head, got shape {values.shape}")
    with np.errstate(over="ignore"):  # 1e39 in float32 is inf: refused below, as any inf is
        slopes = values.astype(dtype)
    if not np.all(np.isfinite(slopes)):
        raise InputError(f"{op}: alibi_slopes must be finite numbers (in {np.dtype(dtype)}), got {values.tolist()}")
    return np.ascontiguousarray(slopes)


def multi_head_attention(qkv, n_head, causal=True, n_kv_head=None, alibi_slopes=None):
    """qkv (B, T, (H + 2 Hk) D), the H query heads, the Hk key heads and the Hk value heads side
    by side -> (B, T, H D): split into heads, attention within each (query head h reads K/V head
    h // (H // Hk)), heads merged. Equal to splitting qkv into q (B, H, T, D) and k, v
    (B, Hk, T, D), calling scaled_dot_product_attention and merging, in one op.

    n_head = H >= 1; n_kv_head = Hk >= 1 divides n_head (None: n_head, the (B, T, 3C) qkv of
    multi-head attention); causal is a bool; alibi_slopes None (no bias) or n_head numbers, see
    scaled_dot_product_attention. B = 0 or T = 0 gives an empty result; a head needs D >= 1
    numbers, so an empty last dim is refused."""
    op = "multi_head_attention"
    check_tensor(op, qkv, "qkv")
    check_ndim(op, "qkv", qkv, (3,), "a 3-d Tensor (B, T, (n_head + 2 n_kv_head) D)")
    check_float(op, qkv)
    n_head = check_int(op, "n_head", n_head, low=1)
    n_kv_head = n_head if n_kv_head is None else check_int(op, "n_kv_head", n_kv_head, low=1)
    if n_head % n_kv_head:
        raise InputError(f"{op}: n_kv_head ({n_kv_head}) must divide n_head ({n_head}): each K/V head serves a group of query heads")
    causal = check_flag(op, "causal", causal)
    width = qkv.shape[2]
    heads = n_head + 2 * n_kv_head
    if width % heads or width == 0:
        raise InputError(
            f"{op}: the last dim of qkv {qkv.shape} must be (n_head + 2 n_kv_head) D = {heads} D: the "
            f"queries' C = n_head D with C >= 1 divisible by n_head ({n_head}), then the keys' and the "
            f"values' n_kv_head D ({n_kv_head} D) each"
        )
    slopes = check_alibi_slopes(op, alibi_slopes, n_head, qkv.dtype)
    return MultiHeadAttention.apply(qkv, n_head, n_kv_head, causal, slopes)


def scaled_dot_product_attention(q, k, v, causal=True, alibi_slopes=None):
    """softmax(q kᵀ / √D - ALiBi bias, causally masked) v for q (B, H, Tq, D) and k, v
    (B, Hk, Tk, D), H a multiple of Hk (query head h reads K/V head h // (H // Hk)); Tk >= Tq when
    causal (a bool). alibi_slopes: None (no bias) or the H slopes m_h (a list, a numpy array, or
    a Tensor that requires no grad; alibi_slopes(H) gives the paper's), taken in q's float type;
    the score of key j for query i of head h is lowered by m_h |pos_i - j|. Sizes of 0 give an
    empty result, except D = 0 (no 1/√D) and Tk = 0 with Tq > 0 (a query that sees no key has no
    softmax)."""
    op = "scaled_dot_product_attention"
    causal = check_query_key_value(op, q, k, v, causal)
    H, Hk = q.shape[1], k.shape[1]
    if (Hk == 0 and H != 0) or (Hk > 0 and (H % Hk or H < Hk)):
        raise InputError(
            f"{op}: q's {H} heads must be a whole number of groups of k and v's {Hk} heads "
            f"(H a multiple of Hk: q {q.shape}, k {k.shape})"
        )
    check_query_key_lengths(op, q, k, causal)
    slopes = check_alibi_slopes(op, alibi_slopes, H, q.dtype)
    return ScaledDotProductAttention.apply(q, k, v, causal, slopes)


def check_query_key_value(op, q, k, v, causal):
    """The first checks of an attention op (this one's and online_attention's): q (B, H, Tq, D)
    and k, v (B, Hk, Tk, D), float Tensors of one dtype, causal a bool (returned). The heads come
    next, checked by each op, then check_query_key_lengths."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(op, t, name)
        check_ndim(op, name, t, (4,), "a 4-d Tensor (B, H, T, D)")
    check_float(op, q, k, v)
    causal = check_flag(op, "causal", causal)
    B, D = q.shape[0], q.shape[3]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise InputError(
            f"{op}: shapes q {q.shape}, k {k.shape}, v {v.shape} do not fit "
            "(expected q (B, H, Tq, D) and k, v both (B, Hk, Tk, D))"
        )
    return causal


def check_query_key_lengths(op, q, k, causal):
    """The last checks of an attention op: causal queries are the last Tq of Tk >= Tq positions,
    and a query that is there needs a key and a head size D >= 1."""
    (B, H, Tq, D), Tk = q.shape, k.shape[2]
    if causal and Tk < Tq:
        raise InputError(f"{op}: causal attention needs Tk >= Tq, got Tq {Tq} and Tk {Tk}")
    if D == 0 or (Tk == 0 and Tq > 0 and B * H > 0):
        raise InputError(f"{op}: empty input (q {q.shape}, k {k.shape}): D and Tk must be >= 1 when there are queries")


# --------------------------------------------------------------------------------- gradcheck cases


def _draw_heads(draw):
    """(H, Hk): 1 to 4 query heads and a divisor of H, so multi-head, grouped and multi-query all come up."""
    H = draw.integer(1, 4)
    return H, draw.choice([n for n in range(1, H + 1) if H % n == 0])


def _draw_slopes(draw, H):
    """None (no bias), the paper's slopes, or H random ones in [0, 2] (larger than the paper's, so
    that the bias is felt at the few positions of a small case)."""
    kind = draw.choice(("none", "paper", "random"))
    if kind == "none":
        return None
    return alibi_slopes(H) if kind == "paper" else draw.tensor((H,), 0.0, 2.0, requires_grad=False).numpy()


@gradcheck_case(ScaledDotProductAttention)
def _attention_case(draw):
    B, D = draw.integer(1, 2), draw.integer(1, 4)
    H, Hk = _draw_heads(draw)
    Tq = draw.integer(1, 4)
    Tk = Tq + draw.integer(0, 2)
    causal = draw.boolean()
    slopes = _draw_slopes(draw, H)
    layout = draw.layout()  # one for all three: each mix of layouts would compile the kernels again
    q, k, v = (draw.tensor(shape, layout=layout) for shape in ((B, H, Tq, D), (B, Hk, Tk, D), (B, Hk, Tk, D)))
    return (lambda q, k, v: scaled_dot_product_attention(q, k, v, causal, slopes)), (q, k, v)


@gradcheck_case(MultiHeadAttention)
def _multi_head_attention_case(draw):
    (H, Hk), D = _draw_heads(draw), draw.integer(1, 3)
    qkv = draw.tensor((draw.integer(1, 2), draw.integer(1, 4), (H + 2 * Hk) * D))
    causal = draw.boolean()
    n_kv_head = None if Hk == H and draw.boolean() else Hk
    slopes = _draw_slopes(draw, H)
    return (lambda qkv: multi_head_attention(qkv, H, causal, n_kv_head, slopes)), (qkv,)
