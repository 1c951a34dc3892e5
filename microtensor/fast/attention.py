"""The fast twins of attention's kernels (microtensor/ops/attention.py): the same arguments, the same results.

The math (ops/attention.py), per (b, h), with k, v those of K/V head g = h // (H // Hk):
S = q kᵀ / √D - m_h |pos_i - j|,  P = masked softmax(S),  O = P v;  backward  dP = dO vᵀ,
dS = P (dP - rowsum(P dP)),  dq = dS k / √D,  and for the group's K/V head, summed over its query
heads h,  dk_g = sum_h dS^(h)ᵀ q^(h) / √D,  dv_g = sum_h P^(h)ᵀ dO^(h).

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
- `attention_forward_by_blas` gives each thread one (b, h) at a time and runs all its steps there,
  products and softmax: the tile is softmaxed while it is still in that core's cache, and the
  threads meet once per call instead of once per step. `attention_backward_by_blas` gives each
  thread one (b, g), a K/V head, and runs the steps of the G query heads of its group one after
  the other: the first head's products write dk_g and dv_g, the others' add to them (BLAS's
  beta = 1, `gemm_adding`), so the sum over the group costs no extra pass and no two threads
  write the same gradient. With Hk = H the group is one head, and this is one (b, h) per thread.
- The job tables (`blas_jobs`) hold the address of every matrix each (b, h) reads or writes; a
  K/V operand's is that of head h // G. So the kernels never copy or repeat k and v per query
  head: grouped heads cost the same products as multi-head attention, on fewer keys and values.
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
- The ALiBi bias is a pass of its own over the tile, S_ij = scale q_i · k_j - m_h |pos_i - j|
  (the scale then applied there, so the exponentials' pass multiplies by 1), made only for a head
  whose slope is not 0: without ALiBi the slopes are all 0 and the tile is softmaxed exactly as
  without the bias, pass for pass. The backward needs no bias: it is in the P forward saved.

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
def masked_softmax_tile(s, scale, causal, slope):
    """s (Tq, Tk) = q kᵀ of one (b, h), in place -> P = softmax(scale * s - slope * |pos_i - j|)
    along the keys, pos_i = Tk - Tq + i, with the keys a query may not see (causal: key j > pos_i)
    at probability 0. Three passes over the rows (see the module docstring), and the bias's when
    the slope is not 0."""
    Tq, Tk = s.shape
    zero, one = s.dtype.type(0), s.dtype.type(1)
    row_max = np.empty(Tq, dtype=s.dtype)
    total = np.empty(Tq, dtype=s.dtype)
    for i in range(Tq):
        if causal:
            for j in range(Tk - Tq + i + 1, Tk):
                s[i, j] = -np.inf
        if slope != zero:  # ALiBi: S_ij = scale s_ij - m_h |pos_i - j| (a masked -inf stays -inf)
            position = Tk - Tq + i
            for j in range(Tk):
                s[i, j] = s[i, j] * scale - slope * s.dtype.type(abs(position - j))
        row_max[i] = max_of_row(s, i)  # scale > 0: the max of s is where scale * s is largest
    factor = scale if slope == zero else one  # with the bias, the scale is in s already
    for i in range(Tq):
        row_total = zero
        for j in range(Tk):
            e = exp_of_nonpositive((s[i, j] - row_max[i]) * factor)
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
def attention_forward_by_blas(double, jobs, probs, scale, causal, slopes):
    """Each (b, h) n = b H + h on one thread: jobs[n, 0], the BLAS call S' = q kᵀ into probs[n]
    (Tq, Tk); P = masked softmax of scale * S' - ALiBi bias (slope slopes[h]), in place; jobs[n, 1],
    the BLAS call O = P v. jobs (B H, 2, 11), the job tables of fast/blas.py; OpenBLAS on one
    thread meanwhile."""
    previous = blas.one_openblas_thread()
    H = slopes.shape[0]
    for n in prange(probs.shape[0]):
        blas.gemm(double, jobs[n, 0])
        masked_softmax_tile(probs[n], scale, causal, slopes[n % H])
        blas.gemm(double, jobs[n, 1])
    blas.restore_openblas_threads(previous)


@kernel
def gemm_adding(double, job, add):
    """One BLAS call as blas.gemm makes it, C = op(A) op(B), or C += op(A) op(B) when `add` (BLAS's
    beta = 1 instead of 0)."""
    trans_a, trans_b, rows, cols, inner, a, lda, b, ldb, c, ldc = job
    order, trans_a, trans_b = np.int32(blas.ROW_MAJOR), np.int32(trans_a), np.int32(trans_b)
    if double:
        blas.dgemm(order, trans_a, trans_b, rows, cols, inner, 1.0, a, lda, b, ldb, 1.0 if add else 0.0, c, ldc)
    else:
        one, zero = np.float32(1), np.float32(0)
        blas.sgemm(order, trans_a, trans_b, rows, cols, inner, one, a, lda, b, ldb, one if add else zero, c, ldc)


@kernel(parallel=True)
def attention_backward_by_blas(double, jobs, probs, d_scores, scale, group):
    """Each K/V head (b, g) on one thread, and on it each of its group's query heads (b, h),
    n = b H + h = (b Hk + g) G + (h - g G), in turn: jobs[n, 0], dP = dO vᵀ into d_scores[n];
    scale * dS from the softmax's JVP, in place; jobs[n, 1], dq = (scale dS) k; jobs[n, 2] and
    jobs[n, 3], dk_g = (scale dS)ᵀ q and dv_g = Pᵀ dO, written by the group's first head and added
    to by the others. jobs (B H, 4, 11), group = G = H // Hk; OpenBLAS on one thread meanwhile."""
    previous = blas.one_openblas_thread()
    for kv in prange(probs.shape[0] // group):
        for n in range(kv * group, (kv + 1) * group):
            add = n > kv * group  # dk_g = sum over the group's heads of dSᵀ q, dv_g likewise
            blas.gemm(double, jobs[n, 0])
            masked_softmax_backward_tile(probs[n], d_scores[n], scale)
            blas.gemm(double, jobs[n, 1])
            gemm_adding(double, jobs[n, 2], add)
            gemm_adding(double, jobs[n, 3], add)
    blas.restore_openblas_threads(previous)


def as_blas_operand(x):
    """x (B, H, r, c) itself if BLAS can read its matrices as they lie in memory, else a C-contiguous copy."""
    return x if x.size == 0 or blas.blas_layout(x[0, 0]) is not None else np.ascontiguousarray(x)


def blas_jobs(B, H, *products):
    """The job table (B H, len(products), 11) of these products of stacks of matrices (a, b, out),
    row n = b H + h for query head h: out[b, h'] = a[b, h'] @ b[b, h'], where h' is h in a stack of
    H heads and h // (H // Hk) in a stack of Hk (k, v and their gradients: the K/V head query head
    h reads). None if a stack is empty or its matrices' strides fit no BLAS layout (then the
    readable kernel runs), or an output's are laid out so that BLAS cannot write them. (As
    blas.batched_jobs, for stacks whose heads differ.)

    A training step asks for tables of the same shapes and strides again and again; only the
    arrays' addresses differ. So the table is made once per layout (`job_template`, with each
    matrix's byte offset from its array's first number where its address goes) and kept, and each
    call adds the addresses: one numpy sum instead of a dozen small assignments."""
    arrays = [x for product in products for x in product]
    key = (B, H, *[(x.shape, x.strides, x.dtype) for x in arrays])
    template = _job_templates.get(key)
    if template is None:
        if len(_job_templates) >= 64:  # a program that keeps changing shapes: start again
            _job_templates.clear()
        template = _job_templates[key] = job_template(B, H, products)
    if template is False:
        return None
    addresses = np.zeros((len(products), 11), dtype=np.int64)
    addresses[:, blas.A : blas.C + 1 : blas.B - blas.A] = np.array([blas.address(x) for x in arrays], dtype=np.int64).reshape(-1, 3)
    return template + addresses  # (B H, len(products), 11) + (len(products), 11)


_job_templates = {}  # (B, H, each array's shape, strides and dtype) -> its job_template


def job_template(B, H, products):
    """blas_jobs's table with byte offsets in place of addresses (each matrix's from its array's
    first number), or False where blas_jobs gives None."""
    jobs = np.empty((B * H, len(products), 11), dtype=np.int64)
    for index, (a, b, out) in enumerate(products):
        layouts = [blas.blas_layout(x[0, 0]) if x.size else None for x in (a, b, out)]
        if None in layouts or layouts[2][0] != blas.NO_TRANSPOSE:
            return False
        (trans_a, lda), (trans_b, ldb), (_, ldc) = layouts
        table = jobs[:, index]
        table[:] = (trans_a, trans_b, a.shape[2], b.shape[3], a.shape[3], 0, lda, 0, ldb, 0, ldc)
        for column, x in ((blas.A, a), (blas.B, b), (blas.C, out)):  # where the matrix of each (b, h) starts
            table[:, column] = head_offsets(B, H, x.shape[1], *x.strides[:2])
    return jobs


def head_offsets(B, H, heads, batch_stride, head_stride):
    """Byte offsets (B H,) of the matrix that (b, h), in order, reads in a (B, heads) stack, heads =
    H or Hk."""
    b, h = np.divmod(np.arange(B * H, dtype=np.int64), H)
    return b * batch_stride + h // (H // heads) * head_stride


@fast_twin(readable.attention_forward)
def attention_forward(q, k, v, scale, causal, slopes, out, probs):
    """q (B, H, Tq, D), k, v (B, Hk, Tk, D) -> out (B, H, Tq, D); probs (B, H, Tq, Tk) gets P.
    scale = 1/√D, slopes (H,) the ALiBi slopes. Any strides (the Functions pass views of qkv and
    of the output)."""
    if not blas.available():
        return readable.attention_forward(q, k, v, scale, causal, slopes, out, probs)
    B, H, Tq, Tk = probs.shape
    q, k, v = as_blas_operand(q), as_blas_operand(k), as_blas_operand(v)
    jobs = blas_jobs(B, H, (q, np.swapaxes(k, -1, -2), probs), (probs, v, out))  # S' = q kᵀ, O = P v
    if jobs is None or not probs.flags.c_contiguous:  # the tiles are softmaxed in probs itself
        return readable.attention_forward(q, k, v, scale, causal, slopes, out, probs)
    attention_forward_by_blas(q.dtype == np.float64, jobs, probs.reshape(B * H, Tq, Tk), scale, causal, slopes)


@fast_twin(readable.attention_backward)
def attention_backward(grad_out, q, k, v, probs, scale, causal, grad_q, grad_k, grad_v):
    """grad_out (B, H, Tq, D) -> grad_q (B, H, Tq, D), grad_k, grad_v (B, Hk, Tk, D), from q, k, v
    and the P in probs (B, H, Tq, Tk). `causal` is not needed here: the masked P are 0."""
    if not blas.available():
        return readable.attention_backward(grad_out, q, k, v, probs, scale, causal, grad_q, grad_k, grad_v)
    B, H, Tq, Tk = probs.shape
    grad_out, q, k, v = (as_blas_operand(x) for x in (grad_out, q, k, v))
    d_scores = np.empty((B, H, Tq, Tk), dtype=q.dtype)  # dP, then scale * dS in place
    jobs = blas_jobs(
        B, H,
        (grad_out, np.swapaxes(v, -1, -2), d_scores),  # dP = dO vᵀ
        (d_scores, k, grad_q),  # dq = (scale dS) k
        (np.swapaxes(d_scores, -1, -2), q, grad_k),  # dk_g (+)= (scale dS)ᵀ q
        (np.swapaxes(probs, -1, -2), grad_out, grad_v),  # dv_g (+)= Pᵀ dO
    )
    if jobs is None:
        return readable.attention_backward(grad_out, q, k, v, probs, scale, causal, grad_q, grad_k, grad_v)
    flat_probs, flat_d_scores = probs.reshape(B * H, Tq, Tk), d_scores.reshape(B * H, Tq, Tk)
    attention_backward_by_blas(q.dtype == np.float64, jobs, flat_probs, flat_d_scores, scale, H // k.shape[1])
