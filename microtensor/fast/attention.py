"""The fast twins of attention's kernels (microtensor/ops/attention.py): the same arguments, the same results.

The math (ops/attention.py), per (b, h):  S = q kᵀ / √D,  P = masked softmax(S),  O = P v;
backward  dP = dO vᵀ,  dS = P (dP - rowsum(P dP)),  dq = dS k / √D,  dk = dSᵀ q / √D,  dv = Pᵀ dO.

- The products (q kᵀ, P v, dO vᵀ and the three of the gradients) are BLAS calls, one small
  (Tq, D) x (D, Tk) product per (b, h), reading q, k, v and the transposes as the strided views
  they are (fast/blas.py: a transpose is BLAS's transpose flag, a view's row stride is its
  leading dimension). BLAS keeps partial sums in vector registers across several rows and
  columns at once; the readable loops' dot products over D numbers or over a row's keys are too
  short for the compiler to do that. The causal product computes the masked half of S too and
  throws it away, since BLAS over the whole tile still beats loops over its lower half.
- What is not a product runs on one (b, h)'s tile: `masked_softmax_tile` (mask, scale, softmax, in
  place on the scores) and `masked_softmax_backward_tile` (the softmax's JVP, in place on dP), with
  e^x and the row maximum from fast/vector_math.py, whose loops vectorize where the C library's exp
  and a float comparison handle one number at a time.
- `attention_forward_by_blas` and `attention_backward_by_blas` give each thread one (b, h) at a
  time and run all its steps there, products and softmax: the tile is softmaxed while it is still
  in that core's cache, and the threads meet once per call instead of once per step.
- The masked keys' scores are set to -inf before anything else, so that every later loop runs over
  the whole row (the row maximum ignores -inf, e^-inf = 0, the JVP gives 0 where P = 0): rows of
  one length vectorize alike, where rows of 1 to Tk keys would each end in a scalar tail.
- The softmax tile works in passes over all its rows (masks and maxima, exponentials and sums,
  divisions) rather than one row at a time: within a row each step waits for the one before (the
  maximum for the exponentials, their sum for the division), while the rows of one pass are
  independent, so the processor overlaps them.
- The 1/√D (`scale`) multiplies S - max inside the exponential, and dS as the JVP writes it: one
  multiplication per score where it is needed anyway (scale > 0, so the maximum of q kᵀ is where
  S is largest).

An input matrix whose strides no BLAS layout fits (say, every other number of a row) is copied
first. The fast twin runs the readable kernel instead where numpy's BLAS is out of reach from
compiled code (`blas.available()` is False), and where an output is laid out so that BLAS cannot
write it or `probs` is not one contiguous array (the Functions never pass such outputs).
"""
import numpy as np
from numba import prange

from ..kernels import fast_twin, kernel
from ..ops import attention as readable
from . import blas
from .vector_math import REDUCE_FASTMATH, exp_of_nonpositive, max_of_row


@kernel(fastmath=REDUCE_FASTMATH)
def masked_softmax_tile(s, scale, causal):
    """s (Tq, Tk) = q kᵀ of one (b, h), in place -> P = softmax(scale * s) along the keys, with the
    keys a query may not see (causal: key j > Tk - Tq + i) at probability 0. Three passes over
    the rows (see the module docstring)."""
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


@kernel(fastmath=REDUCE_FASTMATH)
def masked_softmax_backward_tile(p, dp, scale):
    """dp (Tq, Tk) = dL/dP of one (b, h), in place -> scale * dS = scale * P (dP - sum_j P dP), per
    row: the softmax's JVP, times the 1/√D that S's backward multiplies it by. Masked keys have
    P = 0 and get 0. Two passes, for the reason masked_softmax_tile makes three."""
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


@kernel(parallel=True)
def attention_forward_by_blas(double, jobs, probs, scale, causal):
    """Each (b, h) n on one thread: jobs[n, 0], the BLAS call S' = q kᵀ into probs[n] (Tq, Tk);
    P = masked softmax of scale * S', in place; jobs[n, 1], the BLAS call O = P v. jobs (N, 2, 11),
    the job tables of fast/blas.py; OpenBLAS on one thread meanwhile."""
    previous = blas.one_openblas_thread()
    for n in prange(probs.shape[0]):
        blas.gemm(double, jobs[n, 0])
        masked_softmax_tile(probs[n], scale, causal)
        blas.gemm(double, jobs[n, 1])
    blas.restore_openblas_threads(previous)


@kernel(parallel=True)
def attention_backward_by_blas(double, jobs, probs, d_scores, scale):
    """Each (b, h) n on one thread: jobs[n, 0], dP = dO vᵀ into d_scores[n]; scale * dS from the
    softmax's JVP, in place; jobs[n, 1:], dq = (scale dS) k, dk = (scale dS)ᵀ q and dv = Pᵀ dO.
    jobs (N, 4, 11); OpenBLAS on one thread meanwhile."""
    previous = blas.one_openblas_thread()
    for n in prange(probs.shape[0]):
        blas.gemm(double, jobs[n, 0])
        masked_softmax_backward_tile(probs[n], d_scores[n], scale)
        for product in range(1, jobs.shape[1]):
            blas.gemm(double, jobs[n, product])
    blas.restore_openblas_threads(previous)


def as_blas_operand(x):
    """x (B, H, r, c) itself if BLAS can read its matrices as they lie in memory, else a C-contiguous copy."""
    return x if x.size == 0 or blas.blas_layout(x[0, 0]) is not None else np.ascontiguousarray(x)


def blas_jobs(*products):
    """The job table (N, len(products), 11) of these products of (B, H) stacks (a, b, out), (b, h)
    by (b, h); None if an output's matrices are laid out so that BLAS cannot write them."""
    B, H = products[0][2].shape[:2]
    jobs = np.empty((B * H, len(products), 11), dtype=np.int64)
    for index, (a, b, out) in enumerate(products):
        if blas.batched_jobs(a, b, out, jobs[:, index]) is None:
            return None
    return jobs


@fast_twin(readable.attention_forward)
def attention_forward(q, k, v, scale, causal, out, probs):
    """q (B, H, Tq, D), k, v (B, H, Tk, D) -> out (B, H, Tq, D); probs (B, H, Tq, Tk) gets P.
    scale = 1/√D. Any strides (the Functions pass views of qkv and of the output)."""
    if not blas.available():
        return readable.attention_forward(q, k, v, scale, causal, out, probs)
    B, H, Tq, Tk = probs.shape
    q, k, v = as_blas_operand(q), as_blas_operand(k), as_blas_operand(v)
    jobs = blas_jobs((q, np.swapaxes(k, -1, -2), probs), (probs, v, out))  # S' = q kᵀ, O = P v
    if jobs is None or not probs.flags.c_contiguous:  # the tiles are softmaxed in probs itself
        return readable.attention_forward(q, k, v, scale, causal, out, probs)
    attention_forward_by_blas(q.dtype == np.float64, jobs, probs.reshape(B * H, Tq, Tk), scale, causal)


@fast_twin(readable.attention_backward)
def attention_backward(grad_out, q, k, v, probs, scale, causal, grad_q, grad_k, grad_v):
    """grad_out (B, H, Tq, D) -> grad_q (B, H, Tq, D), grad_k, grad_v (B, H, Tk, D), from q, k, v
    and the P in probs (B, H, Tq, Tk). `causal` is not needed here: the masked P are 0."""
    if not blas.available():
        return readable.attention_backward(grad_out, q, k, v, probs, scale, causal, grad_q, grad_k, grad_v)
    B, H, Tq, Tk = probs.shape
    grad_out, q, k, v = (as_blas_operand(x) for x in (grad_out, q, k, v))
    d_scores = np.empty((B, H, Tq, Tk), dtype=q.dtype)  # dP, then scale * dS in place
    jobs = blas_jobs(
        (grad_out, np.swapaxes(v, -1, -2), d_scores),  # dP = dO vᵀ
        (d_scores, k, grad_q),  # dq = (scale dS) k
        (np.swapaxes(d_scores, -1, -2), q, grad_k),  # dk = (scale dS)ᵀ q
        (np.swapaxes(probs, -1, -2), grad_out, grad_v),  # dv = Pᵀ dO
    )
    if jobs is None:
        return readable.attention_backward(grad_out, q, k, v, probs, scale, causal, grad_q, grad_k, grad_v)
    flat_probs, flat_d_scores = probs.reshape(B * H, Tq, Tk), d_scores.reshape(B * H, Tq, Tk)
    attention_backward_by_blas(q.dtype == np.float64, jobs, flat_probs, flat_d_scores, scale)
