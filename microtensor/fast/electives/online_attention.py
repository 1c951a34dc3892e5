"""The fast twins of online attention's kernels (microtensor/ops/electives/online_attention.py): the same
arguments, the same results, the same saved O and L.

The math (ops/electives/online_attention.py): per query row, walk the keys in tiles keeping the running max
m, the running sum ℓ and the accumulator acc, rescaled by e^(m_old - m_new) when the max grows;
O = acc / ℓ, L = m + log ℓ. Backward: D_i = dO_i · O_i, and per tile P = e^(S - L),
dP = dO vᵀ, dS = P (dP - D), dq += dS k / √D, dk += dSᵀ q / √D, dv += Pᵀ dO.

- The readable kernels take one query row at a time, so each of their products is a dot product
  of D numbers. Here a whole tile of queries walks the key tiles together: per (query tile, key
  tile) block the products are BLAS calls on (tile × D) and (tile × tile) matrices (S' = q kᵀ,
  acc += P v forward; S' = q kᵀ, dP = dO vᵀ, dq += dS k, dk += dSᵀ q, dv += Pᵀ dO backward), read
  from q, k, v as the strided views they are (fast/blas.py explains the calls, the leading
  dimensions and why OpenBLAS is set to one thread meanwhile). A BLAS kernel keeps partial sums of
  several rows and columns in vector registers; a loop over D numbers cannot.
- What is not a product runs on the block in place, one row at a time (`online_softmax_tile`,
  `recompute_tile`), with e^x and the row's max from fast/vector_math.py, whose loops vectorize.
- The blocks a causal query tile never sees (keys after its last query) are skipped; in the
  blocks it partly sees, the hidden scores are set to -inf (forward, e^-inf = 0) or P to 0
  (backward, so dS = 0 there too).
- Forward runs one (b, h, query tile) per thread (the tiles of one row of heads are independent);
  backward one (b, kv head) per thread, its group's query heads in turn, since they all add into
  that head's dk and dv (ops/electives/online_attention.py: no two threads add into one row).
- Per thread, forward keeps room for one (tile, tile) block of scores (each block is a
  contiguous (rows, cols) array in it, so that its rows vectorize), a (tile, D) accumulator and
  two (tile,) rows of m and ℓ; backward room for two blocks and one (tile,) row of D_i. dq, dk
  and dv are added into by BLAS (beta = 1) in the gradient arrays themselves.

An input whose (T, D) matrices BLAS cannot read row by row (say, every other number of a row) is
copied first; a gradient array BLAS cannot write so is computed in a contiguous array and copied
back. Where numpy's BLAS is out of reach from compiled code (`blas.available()` is False) the
readable kernels run instead.
"""
import numpy as np
from numba import prange

from ...kernels import fast_twin, kernel
from ...ops.electives import online_attention as readable
from .. import blas
from ..vector_math import REDUCE_FASTMATH, exp_of_nonpositive, max_of_row

# --------------------------------------------------------------------------------- BLAS on a block


@kernel
def gemm_block(double, transpose_a, transpose_b, rows, cols, inner, a, lda, b, ldb, accumulate, c, ldc):
    """C (rows, cols) = op(A) (rows, inner) @ op(B) (inner, cols), or C += that if `accumulate`, on
    the calling thread; a, b, c the addresses of the matrices' first numbers, lda, ldb, ldc their
    row strides in numbers, op(X) = Xᵀ when transpose_x; float64 if `double`, else float32."""
    order = np.int32(blas.ROW_MAJOR)
    trans_a = np.int32(blas.TRANSPOSE if transpose_a else blas.NO_TRANSPOSE)
    trans_b = np.int32(blas.TRANSPOSE if transpose_b else blas.NO_TRANSPOSE)
    if double:
        beta = 1.0 if accumulate else 0.0
        blas.dgemm(order, trans_a, trans_b, rows, cols, inner, 1.0, a, lda, b, ldb, beta, c, ldc)
    else:
        one, beta = np.float32(1), np.float32(1) if accumulate else np.float32(0)
        blas.sgemm(order, trans_a, trans_b, rows, cols, inner, one, a, lda, b, ldb, beta, c, ldc)


@kernel
def matrix_address(x, b, h, t):
    """The address of x[b, h, t, 0] of a 4-d array x (B, H, T, D)."""
    return np.int64(x.ctypes.data) + b * x.strides[0] + h * x.strides[1] + t * x.strides[2]


@kernel
def row_stride(x):
    """The row stride, in numbers, of the (T, D) matrices of x (B, H, T, D), as BLAS's leading
    dimension (at least D: a matrix of one row may have any row stride)."""
    return max(x.strides[2] // x.itemsize, x.shape[3])


# --------------------------------------------------------------------------------- the blocks


@kernel(fastmath=REDUCE_FASTMATH)
def online_softmax_tile(block, first_query, first_key, n_queries, n_keys, slope, scale, causal,
                        running_max, running_sum, accumulator):  # fmt: skip
    """block (rows, cols) = q kᵀ of one block (queries first_query.., keys first_key..), in place
    -> e^(S - m_new) (0 where hidden), with S = scale q kᵀ - slope |pos - j|; the rows' running max
    and sum (tile,) updated, and the accumulator's rows (tile, D) rescaled by e^(m - m_new), ready
    for acc += P v."""
    rows, cols = block.shape
    real = block.dtype.type
    minus_infinity = real(-np.inf)
    for r in range(rows):
        position = n_keys - n_queries + first_query + r
        visible = max(0, min(cols, position - first_key + 1)) if causal else cols  # keys of the block row r sees
        if slope == real(0):  # plain attention: the bias's loop (an integer per score) would add 0
            for c in range(visible):
                block[r, c] *= scale
        else:
            for c in range(visible):
                block[r, c] = block[r, c] * scale - slope * real(abs(position - first_key - c))
        for c in range(visible, cols):
            block[r, c] = minus_infinity
        new_max = max(running_max[r], max_of_row(block, r))
        shift = new_max if new_max > minus_infinity else real(0)  # all -inf so far: 0, as the readable kernel says why
        correction = exp_of_nonpositive(running_max[r] - shift)
        row_total = real(0)
        for c in range(cols):
            e = exp_of_nonpositive(block[r, c] - shift)
            block[r, c] = e
            row_total += e
        running_sum[r] = running_sum[r] * correction + row_total
        running_max[r] = new_max
        for d in range(accumulator.shape[1]):
            accumulator[r, d] *= correction


@kernel(fastmath=REDUCE_FASTMATH)
def recompute_tile(probs, d_probs, first_query, first_key, n_queries, n_keys, slope, scale, causal, log_sum_exp, row_dot):
    """probs (rows, cols) = q kᵀ and d_probs (rows, cols) = dO vᵀ of one block, in place ->
    P = e^(S - L) (0 where hidden) and scale * dS = scale P (dP - D_i), the 1/√D of S's backward
    multiplied in. log_sum_exp and row_dot: the block's rows of L and of D_i."""
    rows, cols = probs.shape
    real = probs.dtype.type
    for r in range(rows):
        position = n_keys - n_queries + first_query + r
        visible = max(0, min(cols, position - first_key + 1)) if causal else cols
        row_log_sum_exp = log_sum_exp[r]
        if slope == real(0):  # as in online_softmax_tile
            for c in range(visible):
                probs[r, c] = exp_of_nonpositive(probs[r, c] * scale - row_log_sum_exp)
        else:
            for c in range(visible):
                s = probs[r, c] * scale - slope * real(abs(position - first_key - c))
                probs[r, c] = exp_of_nonpositive(s - row_log_sum_exp)
        for c in range(visible, cols):
            probs[r, c] = 0
        row_d = row_dot[r]
        for c in range(cols):
            d_probs[r, c] = probs[r, c] * (d_probs[r, c] - row_d) * scale


# --------------------------------------------------------------------------------- the kernels


@kernel(parallel=True)
def online_attention_forward_by_blas(double, q, k, v, slopes, scale, causal, tile_size, out, log_sum_exp):
    """Each (b, h, query tile) on one thread: for each key tile it may see, S' = q kᵀ by BLAS, the
    online softmax step on the block, acc += P v by BLAS; then O = acc / ℓ and L = m + log ℓ. q, k,
    v readable by BLAS row by row (the twin below sees to it); out and log_sum_exp any strides."""
    B, H, Tq, D = q.shape
    Hk, Tk = k.shape[1], k.shape[2]
    group = H // Hk
    query_tiles = (Tq + tile_size - 1) // tile_size
    ldq, ldk, ldv = row_stride(q), row_stride(k), row_stride(v)
    previous = blas.one_openblas_thread()
    for unit in prange(B * H * query_tiles):
        bh, tile = unit // query_tiles, unit % query_tiles
        b, h = bh // H, bh % H
        g = h // group
        first = tile * tile_size
        rows = min(tile_size, Tq - first)
        scores = np.empty(tile_size * tile_size, dtype=q.dtype)  # room for one block: S', then P
        accumulator = np.zeros((tile_size, D), dtype=q.dtype)  # acc (tile, D)
        running_max = np.full(tile_size, -np.inf, dtype=q.dtype)  # m
        running_sum = np.zeros(tile_size, dtype=q.dtype)  # ℓ
        scores_address, accumulator_address = np.int64(scores.ctypes.data), np.int64(accumulator.ctypes.data)
        q_address = matrix_address(q, b, h, first)
        last_key = Tk - Tq + first + rows - 1 if causal else Tk - 1  # the last key any query of the tile sees
        for start in range(0, last_key + 1, tile_size):
            cols = min(tile_size, last_key + 1 - start)
            block = scores[: rows * cols].reshape((rows, cols))  # (rows, cols), contiguous: its rows vectorize
            gemm_block(double, False, True, rows, cols, D, q_address, ldq, matrix_address(k, b, g, start), ldk,
                       False, scores_address, cols)  # fmt: skip
            online_softmax_tile(block, first, start, Tq, Tk, slopes[h], scale, causal, running_max, running_sum, accumulator)
            gemm_block(double, False, False, rows, D, cols, scores_address, cols, matrix_address(v, b, g, start), ldv,
                       True, accumulator_address, D)  # fmt: skip
        for r in range(rows):
            for d in range(D):
                out[b, h, first + r, d] = accumulator[r, d] / running_sum[r]
            log_sum_exp[b, h, first + r] = running_max[r] + np.log(running_sum[r])
    blas.restore_openblas_threads(previous)


@kernel(parallel=True)
def online_attention_backward_by_blas(double, grad_out, q, k, v, out, log_sum_exp, slopes, scale, causal, tile_size,
                                      grad_q, grad_k, grad_v):  # fmt: skip
    """Each (b, kv head g) on one thread, its group's query heads in turn, query tile by query tile:
    D_i = dO_i · O_i; then for each key tile the tile sees, S' = q kᵀ and dP = dO vᵀ by BLAS, P and
    scale * dS on the blocks, and dq += (scale dS) k, dk += (scale dS)ᵀ q, dv += Pᵀ dO by BLAS into
    the gradient arrays. grad_out, q, k, v readable and grad_q, grad_k, grad_v writable by BLAS row
    by row (the twin below sees to it); out and log_sum_exp any strides."""
    B, H, Tq, D = q.shape
    Hk, Tk = k.shape[1], k.shape[2]
    group = H // Hk
    query_tiles = (Tq + tile_size - 1) // tile_size
    ldo, ldq, ldk, ldv = row_stride(grad_out), row_stride(q), row_stride(k), row_stride(v)
    ld_grad_q, ld_grad_k, ld_grad_v = row_stride(grad_q), row_stride(grad_k), row_stride(grad_v)
    previous = blas.one_openblas_thread()
    for bg in prange(B * Hk):
        b, g = bg // Hk, bg % Hk
        grad_k[b, g, :, :] = 0  # dk and dv add up over every query of every head of the group
        grad_v[b, g, :, :] = 0
        probs = np.empty(tile_size * tile_size, dtype=q.dtype)  # room for one block: S', then P
        d_probs = np.empty(tile_size * tile_size, dtype=q.dtype)  # room for one block: dP, then scale * dS
        row_dot = np.empty(tile_size, dtype=q.dtype)  # D_i of the tile's queries
        probs_address, d_probs_address = np.int64(probs.ctypes.data), np.int64(d_probs.ctypes.data)
        for h in range(g * group, (g + 1) * group):
            for tile in range(query_tiles):
                first = tile * tile_size
                rows = min(tile_size, Tq - first)
                for r in range(rows):
                    dot = q.dtype.type(0)
                    for d in range(D):
                        dot += grad_out[b, h, first + r, d] * out[b, h, first + r, d]
                    row_dot[r] = dot
                    grad_q[b, h, first + r, :] = 0
                q_address, grad_out_address = matrix_address(q, b, h, first), matrix_address(grad_out, b, h, first)
                grad_q_address = matrix_address(grad_q, b, h, first)
                last_key = Tk - Tq + first + rows - 1 if causal else Tk - 1
                for start in range(0, last_key + 1, tile_size):
                    cols = min(tile_size, last_key + 1 - start)
                    k_address, v_address = matrix_address(k, b, g, start), matrix_address(v, b, g, start)
                    block_probs = probs[: rows * cols].reshape((rows, cols))  # contiguous (rows, cols) blocks
                    block_d_probs = d_probs[: rows * cols].reshape((rows, cols))
                    gemm_block(double, False, True, rows, cols, D, q_address, ldq, k_address, ldk, False, probs_address, cols)
                    gemm_block(double, False, True, rows, cols, D, grad_out_address, ldo, v_address, ldv, False, d_probs_address, cols)
                    recompute_tile(block_probs, block_d_probs, first, start, Tq, Tk, slopes[h], scale, causal,
                                   log_sum_exp[b, h, first:], row_dot)  # fmt: skip
                    gemm_block(double, False, False, rows, D, cols, d_probs_address, cols, k_address, ldk,
                               True, grad_q_address, ld_grad_q)  # dq += (scale dS) k  # fmt: skip
                    gemm_block(double, True, False, cols, D, rows, d_probs_address, cols, q_address, ldq,
                               True, matrix_address(grad_k, b, g, start), ld_grad_k)  # dk += (scale dS)ᵀ q  # fmt: skip
                    gemm_block(double, True, False, cols, D, rows, probs_address, cols, grad_out_address, ldo,
                               True, matrix_address(grad_v, b, g, start), ld_grad_v)  # dv += Pᵀ dO  # fmt: skip
    blas.restore_openblas_threads(previous)


# --------------------------------------------------------------------------------- the twins


def rows_readable_by_blas(x):
    """True if BLAS can read (and write) each (T, D) matrix of x (B, H, T, D) row by row: the numbers
    of a row adjacent, the rows at least D numbers apart (a matrix of one row: any stride)."""
    T, D = x.shape[2:]
    if any(s % x.itemsize for s in x.strides):
        return False
    row, column = x.strides[2] // x.itemsize, x.strides[3] // x.itemsize
    return (D == 1 or column == 1) and (T <= 1 or row >= D)


def readable_by_blas(x):
    """x itself if BLAS can read its matrices row by row, else a C-contiguous copy."""
    return x if x.size == 0 or rows_readable_by_blas(x) else np.ascontiguousarray(x)


@fast_twin(readable.online_attention_forward)
def online_attention_forward(q, k, v, slopes, scale, causal, tile_size, out, log_sum_exp):
    """q (B, H, Tq, D), k, v (B, Hk, Tk, D), slopes (H,) -> out (B, H, Tq, D) and log_sum_exp
    (B, H, Tq). scale = 1/√D. Any strides."""
    if not blas.available():
        return readable.online_attention_forward(q, k, v, slopes, scale, causal, tile_size, out, log_sum_exp)
    q, k, v = readable_by_blas(q), readable_by_blas(k), readable_by_blas(v)
    online_attention_forward_by_blas(q.dtype == np.float64, q, k, v, slopes, scale, causal, tile_size, out, log_sum_exp)


@fast_twin(readable.online_attention_backward)
def online_attention_backward(grad_out, q, k, v, out, log_sum_exp, slopes, scale, causal, tile_size, grad_q, grad_k, grad_v):
    """grad_out (B, H, Tq, D) -> grad_q (B, H, Tq, D), grad_k, grad_v (B, Hk, Tk, D), from q, k, v,
    out and log_sum_exp. Any strides."""
    arguments = (grad_out, q, k, v, out, log_sum_exp, slopes, scale, causal, tile_size)
    if not blas.available():
        return readable.online_attention_backward(*arguments, grad_q, grad_k, grad_v)
    grad_out, q, k, v = (readable_by_blas(x) for x in (grad_out, q, k, v))
    # a gradient array BLAS cannot add into row by row: computed in a contiguous one, copied back
    targets = [g if g.size == 0 or rows_readable_by_blas(g) else np.empty(g.shape, g.dtype) for g in (grad_q, grad_k, grad_v)]
    online_attention_backward_by_blas(q.dtype == np.float64, grad_out, q, k, v, out, log_sum_exp, slopes, scale, causal,
                                      tile_size, *targets)  # fmt: skip
    for given, target in zip((grad_q, grad_k, grad_v), targets):
        if target is not given:
            given[...] = target
