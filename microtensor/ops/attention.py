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

Two ways to compute it, chosen with the matrix products (`microtensor.set_matmul`):

- "blas" (the default): the products above (q kᵀ, P v, dO vᵀ and the three of the gradients) are
  BLAS calls, one small (T, D) x (D, T) product per (b, h), reading q, k, v and the transposes as
  strided views (ops/blas.py); what is not a product is a Numba function on one (b, h)'s tile:
  `masked_softmax_tile` (scale, mask, softmax, in place on the scores) and
  `masked_softmax_backward_tile` (the softmax JVP, in place on dP). `attention_forward_by_blas`
  and `attention_backward_by_blas` give each thread one (b, h) at a time and run all its steps
  there, so the (64, 64) tile is softmaxed while it is still in that core's cache and the threads
  meet once per call. Run as separate passes over all (b, h) (products, then softmax, then
  products), the same work took 2% longer forward and 6-9% longer backward (alternating blocks in
  one process, (12, 4, 64, 32), float32, 2-core Zen 3 VM: ~0.73 and ~1.0 ms fused).
  The fused loops below took ~0.6 and ~0.65 ms where BLAS products took ~0.35 and ~0.4 (a Xeon
  VM), and on the Zen 3 VM the loops' forward ~1.4 ms against ~0.5: BLAS's products are
  register-blocked; our loops over 64 keys or 32 dims are too short for that (LLVM's vector loop
  takes 32 floats a step here, so a causal row of 5 keys runs almost entirely in its scalar
  tail). The causal product computes the masked half too and throws it away: still cheaper than
  the loops.
- "numba": `attention_forward` and `attention_backward`, every step of the math above fused into
  one kernel each, plain loops parallel over (b, h): the ones to read and step through.

Masking in `masked_softmax_tile`: the scores a query may not see are set to -inf first, so that
every later loop runs over the whole row (the row maximum ignores -inf, e^-inf = 0, and the JVP
gives 0 where P = 0). Rows of varying length (1 to 64 keys) cost more than the work they save.

`multi_head_attention(qkv, n_head)` is the whole attention of a transformer block in one op:
qkv (B, T, 3C) from one Linear layer, split into heads (q, k, v each (B, H, T, D), C = H D),
attended causally, and the heads merged back into (B, T, C). No copy is made to split or merge:
q, k and v are strided views of qkv, the products read them as they are (BLAS takes a row stride)
and write the output and the gradients of q, k and v straight into views of one (B, T, C) and one
(B, T, 3C) array. Built from reshape, permute and indexing instead, the same computation costs
seven more graph nodes per block, and the backward of each index scatters into a zero array the
size of qkv.
"""
import math

import numpy as np
from numba import njit, prange

from ..autograd import Function
from ..gradcheck import gradcheck_case
from ..tensor import Tensor
from . import blas
from .checks import check_float
from .matmul import BACKENDS, get_matmul, with_matmul
from .vector_math import exp_of_nonpositive, max_of_row

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


@njit(cache=True, error_model="numpy", fastmath=REDUCE_FASTMATH)
def masked_softmax_tile(s, scale, causal):
    """s (Tq, Tk) = q kᵀ of one (b, h), in place -> P = softmax(scale * s) along the keys, with the
    keys a query may not see (causal: key j > Tk - Tq + i) at probability 0.

    Three passes over the rows, not one loop doing everything per row: within a row each step
    waits for the one before (the maximum for the exponentials, their sum for the division), and
    64 keys are too few to hide that wait; rows of one pass are independent and overlap. 3072 rows
    of 64, float32, one thread: 282 µs instead of 375."""
    Tq, Tk = s.shape
    zero, one = s.dtype.type(0), s.dtype.type(1)
    row_max = np.empty(Tq, dtype=s.dtype)
    total = np.empty(Tq, dtype=s.dtype)
    for i in range(Tq):
        if causal:
            for j in range(Tk - Tq + i + 1, Tk):
                s[i, j] = -np.inf
        row_max[i] = max_of_row(s, i)  # scale > 0: the max of s is where scale * s is largest
    for i in range(Tq):
        row_total = zero
        for j in range(Tk):
            e = exp_of_nonpositive((s[i, j] - row_max[i]) * scale)
            s[i, j] = e
            row_total += e
        total[i] = row_total
    for i in range(Tq):
        inverse = one / total[i]
        for j in range(Tk):
            s[i, j] *= inverse


@njit(cache=True, error_model="numpy", fastmath=REDUCE_FASTMATH)
def masked_softmax_backward_tile(p, dp, scale):
    """dp (Tq, Tk) = dL/dP of one (b, h), in place -> dL/dS = scale * P * (dP - sum_j P dP), per
    row: the softmax JVP and the scale's chain rule. Masked keys have P = 0 and get 0. Two passes,
    for the reason given in masked_softmax_tile."""
    Tq, Tk = p.shape
    zero = p.dtype.type(0)
    row_dot = np.empty(Tq, dtype=p.dtype)  # sum_j P_ij dP_ij
    for i in range(Tq):
        dot = zero
        for j in range(Tk):
            dot += p[i, j] * dp[i, j]
        row_dot[i] = dot
    for i in range(Tq):
        for j in range(Tk):
            dp[i, j] = p[i, j] * (dp[i, j] - row_dot[i]) * scale


@njit(cache=True, parallel=True)
def masked_softmax_forward(scores, scale, causal):
    """masked_softmax_tile on every (b, h) of scores (N, Tq, Tk), in parallel."""
    for n in prange(scores.shape[0]):
        masked_softmax_tile(scores[n], scale, causal)


@njit(cache=True, parallel=True)
def masked_softmax_backward(probs, d_probs, scale):
    """masked_softmax_backward_tile on every (b, h) of probs and d_probs (N, Tq, Tk), in parallel."""
    for n in prange(probs.shape[0]):
        masked_softmax_backward_tile(probs[n], d_probs[n], scale)


@njit(cache=True, parallel=True)
def attention_forward_by_blas(double, jobs, probs, scale, causal):
    """Each (b, h) n on one thread: jobs[n, 0], the BLAS call S = q kᵀ into probs[n] (Tq, Tk); P =
    masked softmax of S, in place; jobs[n, 1], the BLAS call O = P v. jobs (N, 2, 11), ops/blas.py.

    One kernel for the three steps, not three passes over all (b, h): P is softmaxed and multiplied
    while it is in the core's cache (a (64, 64) float32 tile is 16 KB), and the threads meet once
    per call instead of three times."""
    for n in prange(probs.shape[0]):
        blas.gemm(double, jobs[n, 0])
        masked_softmax_tile(probs[n], scale, causal)
        blas.gemm(double, jobs[n, 1])


@njit(cache=True, parallel=True)
def attention_backward_by_blas(double, jobs, probs, d_scores, scale):
    """Each (b, h) n on one thread: jobs[n, 0], dP = dO vᵀ into d_scores[n]; dS from the softmax JVP,
    in place; jobs[n, 1:], dq = dS k, dk = dSᵀ q and dv = Pᵀ dO. jobs (N, 4, 11), ops/blas.py."""
    for n in prange(probs.shape[0]):
        blas.gemm(double, jobs[n, 0])
        masked_softmax_backward_tile(probs[n], d_scores[n], scale)
        for product in range(1, jobs.shape[1]):
            blas.gemm(double, jobs[n, product])


def blas_jobs(*products):
    """The job table (N, len(products), 11) of these products of (B, H) stacks (a, b, out), (b, h)
    by (b, h); None if BLAS cannot be called or cannot read one of them as it is laid out."""
    if not blas.AVAILABLE:
        return None
    B, H = products[0][2].shape[:2]
    jobs = np.empty((B * H, len(products), 11), dtype=np.int64)
    for index, (a, b, out) in enumerate(products):
        if blas.batched_jobs(a, b, out, jobs[:, index]) is None:
            return None
    return jobs


def attend(q, k, v, causal, out):
    """out (B, H, Tq, D) = attention of q (B, H, Tq, D) over k, v (B, H, Tk, D); returns P
    (B, H, Tq, Tk). Any strides in; `out` may be a view (the heads of a (B, T, C) array)."""
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    scale = q.dtype.type(1 / math.sqrt(D))
    if get_matmul() == "numba":
        probs = np.empty((B, H, Tq, Tk), dtype=q.dtype)
        result = np.empty((B, H, Tq, D), dtype=q.dtype)
        q, k, v = np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v)
        attention_forward(q, k, v, scale, causal, result, probs)
        out[...] = result
        return probs
    probs = np.empty((B, H, Tq, Tk), dtype=q.dtype)
    jobs = blas_jobs((q, np.swapaxes(k, -1, -2), probs), (probs, v, out))  # S = q kᵀ, O = P v
    if jobs is not None:
        attention_forward_by_blas(q.dtype == np.float64, jobs, probs.reshape(B * H, Tq, Tk), scale, causal)
        return probs
    np.matmul(q, np.swapaxes(k, -1, -2), out=probs)  # (B, H, Tq, Tk) scores
    masked_softmax_forward(probs.reshape(B * H, Tq, Tk), scale, causal)
    np.matmul(probs, v, out=out)
    return probs


def attend_backward(grad_out, q, k, v, probs, causal, grad_q, grad_k, grad_v):
    """Fill grad_q (B, H, Tq, D), grad_k and grad_v (B, H, Tk, D) (views allowed) from grad_out
    (B, H, Tq, D) and what `attend` returned."""
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    scale = q.dtype.type(1 / math.sqrt(D))
    if get_matmul() == "numba":
        results = [np.empty(g.shape, dtype=q.dtype) for g in (grad_q, grad_k, grad_v)]
        q, k, v, grad_out = (np.ascontiguousarray(a) for a in (q, k, v, grad_out))
        attention_backward(grad_out, q, k, v, probs, scale, causal, *results)
        for grad, result in zip((grad_q, grad_k, grad_v), results):
            grad[...] = result
        return
    d_scores = np.empty((B, H, Tq, Tk), dtype=q.dtype)
    products = (
        (grad_out, np.swapaxes(v, -1, -2), d_scores),  # dP = dO vᵀ (B, H, Tq, Tk), then dS in place
        (d_scores, k, grad_q),  # dq = dS k
        (np.swapaxes(d_scores, -1, -2), q, grad_k),  # dk = dSᵀ q
        (np.swapaxes(probs, -1, -2), grad_out, grad_v),  # dv = Pᵀ dO
    )
    jobs = blas_jobs(*products)
    flat_probs, flat_d_scores = probs.reshape(B * H, Tq, Tk), d_scores.reshape(B * H, Tq, Tk)
    if jobs is not None:
        attention_backward_by_blas(q.dtype == np.float64, jobs, flat_probs, flat_d_scores, scale)
        return
    np.matmul(*products[0][:2], out=products[0][2])
    masked_softmax_backward(flat_probs, flat_d_scores, scale)
    for a, b, out in products[1:]:
        np.matmul(a, b, out=out)


class ScaledDotProductAttention(Function):
    @staticmethod
    def forward(ctx, q, k, v, causal):
        out = np.empty(q.shape, dtype=q.dtype)
        probs = attend(q, k, v, causal, out)
        ctx.save_for_backward(q, k, v, probs)
        ctx.causal = causal
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, probs = ctx.saved_tensors
        grad_q, grad_k, grad_v = np.empty(q.shape, q.dtype), np.empty(k.shape, k.dtype), np.empty(v.shape, v.dtype)
        attend_backward(grad_out, q, k, v, probs, ctx.causal, grad_q, grad_k, grad_v)
        return grad_q, grad_k, grad_v, None


class MultiHeadAttention(Function):
    @staticmethod
    def forward(ctx, qkv, n_head, causal):
        B, T, C3 = qkv.shape
        H, D = n_head, C3 // 3 // n_head
        heads = qkv.reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)  # (3, B, H, T, D), a view
        out = np.empty((B, T, H * D), dtype=qkv.dtype)
        out_heads = out.reshape(B, T, H, D).transpose(0, 2, 1, 3)  # (B, H, T, D), a view of out
        probs = attend(heads[0], heads[1], heads[2], causal, out_heads)
        ctx.save_for_backward(qkv, probs)
        ctx.n_head, ctx.causal = n_head, causal
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
        attend_backward(grad_heads, heads[0], heads[1], heads[2], probs, ctx.causal, *grad_parts)
        return grad_qkv, None, None


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
    return with_matmul(draw.choice(BACKENDS), lambda q, k, v: scaled_dot_product_attention(q, k, v, causal)), (q, k, v)


@gradcheck_case(MultiHeadAttention)
def _multi_head_attention_case(draw):
    H, D = draw.integer(1, 3), draw.integer(1, 3)
    qkv = draw.tensor((draw.integer(1, 2), draw.integer(1, 4), 3 * H * D))
    causal = draw.boolean()
    return with_matmul(draw.choice(BACKENDS), lambda qkv: multi_head_attention(qkv, H, causal)), (qkv,)
