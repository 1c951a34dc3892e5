"""Attention that never stores the T × T matrix: the online softmax (FlashAttention's forward and backward).

Same inputs and result as scaled dot-product attention (ops/attention.py, whose docstring derives
the plain forward and backward): q (B, H, Tq, D), k and v (B, Hk, Tk, D), query head h reading
key/value head h // (H / Hk) (grouped-query attention), the queries the LAST Tq positions (query i
sits at position pos_i = Tk - Tq + i and, when causal, sees keys j <= pos_i), and

    S_ij = (q_i · k_j) / √D - slope_h |pos_i - j|     P_i = softmax(S_i)     O_i = sum_j P_ij v_j

(slope_h is ALiBi's bias per head; all slopes 0 is plain attention, exactly: S - 0 = S).

Why. The standard op computes all of P (B, H, Tq, Tk) at once and keeps it for backward: at
T = 4096 that is 16 million numbers per head, where q, k, v and O hold only T D each. Attention
needs P only one row at a time, and a row only through two sums (its softmax's denominator and
O_i), both of which can be built while walking the keys a few at a time. That walk is below; it
keeps per query row a handful of numbers, never a row of P, let alone all of it.

Forward: the online softmax. Walk one query's keys in tiles J_1, J_2, ... (tile_size keys each,
the last one shorter). After the tiles seen so far, keep

    m   = max_j S_ij                      the running max                       ()
    ℓ   = sum_j e^(S_ij - m)               the running sum                       ()
    acc = sum_j e^(S_ij - m) v_j           the output accumulator, unnormalized  (D,)

over the keys j seen so far. With the next tile J, the max may grow: m_new = max(m, max_(j in J) S_ij).
Every term already summed holds e^(S_ij - m), and e^(S_ij - m_new) = e^(S_ij - m) e^(m - m_new), so
one factor per row turns the old sums into sums with the new max, and the tile's terms are added:

    ℓ   <- e^(m - m_new) ℓ   + sum_(j in J) e^(S_ij - m_new)
    acc <- e^(m - m_new) acc + sum_(j in J) e^(S_ij - m_new) v_j
    m   <- m_new

(The max only grows, so m - m_new <= 0 and every exponent is <= 0: nothing overflows, as in
ops/softmax.py. Start with m = -inf, ℓ = 0, acc = 0: the first factor is e^-inf = 0, harmless. Key 0
is in the first tile and every query sees it, so m is finite from the first tile on.) After the last
tile, the sums run over all keys of the row:

    O_i = acc / ℓ = sum_j e^(S_ij - m) v_j / sum_j' e^(S_ij' - m) = sum_j P_ij v_j
    L_i = m + log ℓ = log sum_j e^(S_ij)                    the row's log-sum-exp   (B, H, Tq)

Forward saves O and L: with L, any P_ij = e^(S_ij) / sum_j' e^(S_ij') = e^(S_ij - L_i) is one
exponential away, from one number per row. (L_i >= m >= S_ij since ℓ >= 1, so S_ij - L_i <= 0.)

Backward, from dO (B, H, Tq, D). The formulas are the standard op's (ops/attention.py):

    dP_ij = dO_i · v_j          dS_ij = P_ij (dP_ij - sum_j' P_ij' dP_ij')          (per row i)
    dq_i  = sum_j dS_ij k_j / √D      dk_j = sum_i dS_ij q_i / √D      dv_j = sum_i P_ij dO_i

(the middle one is the softmax's vector-Jacobian product, derived in ops/softmax.py and
docs/ops/softmax.md: dx_j = y_j (g_j - <g, y>), with y = P_i and g = dP_i). The ALiBi bias is a
constant added to S, so dS is the gradient of q kᵀ / √D as well, and the slopes get none.

Only the row dot sum_j' P_ij' dP_ij' needs a whole row of P at once. It does not:

    D_i = sum_j P_ij dP_ij = sum_j P_ij (dO_i · v_j) = dO_i · (sum_j P_ij v_j) = dO_i · O_i     ()

one dot product of two saved (D,) rows, computed before any key is visited. Then backward walks the
keys in tiles as forward did, recomputing each tile's scores S_ij and P_ij = e^(S_ij - L_i), and every
term above is local to (i, j): dS_ij = P_ij (dP_ij - D_i), added into dq_i, dk_j and dv_j tile by tile.

The price: backward computes the scores and exponentials again (one more q kᵀ per tile, plus the
exponentials), where the standard op reads them from P. The gain: saved state O and L, (B, H, Tq, D)
and (B, H, Tq), with O the output that exists anyway, where the standard op keeps P
(B, H, Tq, Tk); no array of either kernel set's working memory is larger than a tile.

Grouped heads. Key/value head g is read by the G = H / Hk query heads h with h // G = g. The loss
depends on K_g through each of those G uses, so by the chain rule dK_g = sum_(h in group g) dK^(h),
where dK^(h) is what head h alone would give its own copy of the keys (dv likewise): repeating K
G times is a broadcast, whose backward sums the copies. The backward kernel runs one (b, g) per
thread and loops over the group's query heads inside, so the G heads add into dK_g one after
another, never two threads into one row.

The tile size. In the readable kernels the tiles only decide when the running max is updated, so
any size gives the same result up to rounding; the fast set's kernels multiply (query tile × key
tile) blocks with BLAS, where a tile's size is a trade between the size of each product and the
scratch each thread keeps (DEFAULT_TILE_SIZE below). A tile larger than Tk is one tile of all keys.

The kernels `online_attention_forward` and `online_attention_backward` below are the readable
ones: every step above, plain loops over one query at a time, tile by tile over its keys,
parallel over (b, h) forward and over (b, kv head) backward. Their only scratch is one row of a
tile (tile_size,) per thread. The fast set's twins multiply blocks with BLAS
(microtensor/fast/electives/online_attention.py).
"""
import math

import numpy as np
from numba import prange

from ...autograd import Function
from ...checks import check_flag, check_float, check_int, check_ndim, check_tensor
from ...errors import InputError
from ...gradcheck import gradcheck_case
from ...kernels import active, kernel
from ..attention import attention_jvp, attention_probabilities, check_alibi_slopes, check_query_key_lengths, check_query_key_value

# Keys per tile (and queries per tile, in the fast set). The fast backward's two 128 × 128 blocks
# and the (128, D) tiles of q, k, v and dO they come from fit in a core's second-level cache for
# the head sizes of a laptop GPT, while each BLAS product is large enough to run at speed (smaller
# tiles make more, shorter calls; bench/bench_attention.py --tile-sizes compares them).
DEFAULT_TILE_SIZE = 128

# --------------------------------------------------------------------------------- numpy reference


def online_attention_reference(q, k, v, causal=True, alibi_slopes=None):
    """Plain numpy attention, all of S at once, with grouped heads and ALiBi (the test oracle)."""
    H, Tq, D = q.shape[1:]
    Hk, Tk = k.shape[1], k.shape[2]
    k, v = np.repeat(k, H // Hk, axis=1), np.repeat(v, H // Hk, axis=1)  # (B, H, Tk, D): head h reads h // G
    positions = Tk - Tq + np.arange(Tq)  # (Tq,)
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(D)  # (B, H, Tq, Tk)
    if alibi_slopes is not None:
        distance = np.abs(positions[:, None] - np.arange(Tk)[None, :])  # (Tq, Tk)
        scores = scores - np.asarray(alibi_slopes)[:, None, None] * distance
    if causal:
        scores = np.where(np.arange(Tk)[None, :] <= positions[:, None], scores, -np.inf)
    scores = scores - scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    return p / p.sum(axis=-1, keepdims=True) @ v


# --------------------------------------------------------------------------------- readable kernels


@kernel(parallel=True)
def online_attention_forward(q, k, v, slopes, scale, causal, tile_size, out, log_sum_exp):
    """q (B, H, Tq, D), k, v (B, Hk, Tk, D), slopes (H,) -> out (B, H, Tq, D) and log_sum_exp
    (B, H, Tq), the L = m + log ℓ of each row. scale = 1/√D. Any strides."""
    B, H, Tq, D = q.shape
    Hk, Tk = k.shape[1], k.shape[2]
    group = H // Hk
    real = q.dtype.type  # every number below in q's float type: a bare 0.0 would make float32 math float64
    zero, minus_infinity = real(0), real(-np.inf)
    for bh in prange(B * H):
        b, h = bh // H, bh % H
        g = h // group  # the key/value head that query head h reads
        slope = slopes[h]
        scores = np.empty(tile_size, dtype=q.dtype)  # S_ij of one tile of keys, for one query
        for i in range(Tq):
            position = Tk - Tq + i
            last = position if causal else Tk - 1  # the last key query i may see
            running_max = minus_infinity  # m
            running_sum = zero  # ℓ
            for d in range(D):  # acc, kept in O's own row until the division at the end
                out[b, h, i, d] = 0
            for start in range(0, last + 1, tile_size):
                stop = min(start + tile_size, last + 1)
                # the tile's scores S_ij = (q_i · k_j) / √D - slope |pos_i - j|, and their max
                tile_max = minus_infinity
                for j in range(start, stop):
                    dot = zero
                    for d in range(D):
                        dot += q[b, h, i, d] * k[b, g, j, d]
                    s = dot * scale - slope * real(abs(position - j))
                    scores[j - start] = s
                    if s > tile_max:
                        tile_max = s
                new_max = max(running_max, tile_max)
                # While every score so far is -inf (a key of weight 0: q · k = -inf), the sums are 0 and
                # stay 0; subtracting m_new = -inf from -inf would give NaN, so 0 is subtracted instead.
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
                        out[b, h, i, d] += p * v[b, g, j, d]
                running_max = new_max
            # O_i = acc / ℓ,  L_i = m + log ℓ
            for d in range(D):
                out[b, h, i, d] /= running_sum
            log_sum_exp[b, h, i] = running_max + np.log(running_sum)


@kernel(parallel=True)
def online_attention_backward(grad_out, q, k, v, out, log_sum_exp, slopes, scale, causal, tile_size, grad_q, grad_k, grad_v):
    """grad_out (B, H, Tq, D) = dL/dO -> grad_q (B, H, Tq, D), grad_k, grad_v (B, Hk, Tk, D), from
    q, k, v and what online_attention_forward saved: out (B, H, Tq, D) and log_sum_exp (B, H, Tq).
    scale = 1/√D. Any strides."""
    B, H, Tq, D = q.shape
    Hk, Tk = k.shape[1], k.shape[2]
    group = H // Hk
    real = q.dtype.type
    zero = real(0)
    for bg in prange(B * Hk):
        b, g = bg // Hk, bg % Hk
        grad_k[b, g, :, :] = 0  # dk and dv add up over the queries i of every head of the group
        grad_v[b, g, :, :] = 0
        probs = np.empty(tile_size, dtype=q.dtype)  # P_ij of one tile of keys, for one query, recomputed
        for h in range(g * group, (g + 1) * group):  # the query heads that read key/value head g
            slope = slopes[h]
            for i in range(Tq):
                position = Tk - Tq + i
                last = position if causal else Tk - 1
                # D_i = dO_i · O_i, which equals sum_j P_ij dP_ij (the module docstring)
                row_dot = zero
                for d in range(D):
                    row_dot += grad_out[b, h, i, d] * out[b, h, i, d]
                for d in range(D):
                    grad_q[b, h, i, d] = 0
                for start in range(0, last + 1, tile_size):
                    stop = min(start + tile_size, last + 1)
                    # the tile's P_ij = e^(S_ij - L_i), recomputed from the scores and the saved L_i
                    for j in range(start, stop):
                        dot = zero
                        for d in range(D):
                            dot += q[b, h, i, d] * k[b, g, j, d]
                        s = dot * scale - slope * real(abs(position - j))
                        probs[j - start] = np.exp(s - log_sum_exp[b, h, i])
                    for j in range(start, stop):
                        p = probs[j - start]
                        # dP_ij = dO_i · v_j   (from O = P v)
                        dp = zero
                        for d in range(D):
                            dp += grad_out[b, h, i, d] * v[b, g, j, d]
                        d_score = p * (dp - row_dot)  # dS_ij = P_ij (dP_ij - D_i)
                        # S_ij = (q_i · k_j) / √D + bias  ->  dq_i += dS_ij k_j / √D,  dk_j += dS_ij q_i / √D
                        # O_i = sum_j P_ij v_j  ->  dv_j += P_ij dO_i
                        for d in range(D):
                            grad_q[b, h, i, d] += d_score * scale * k[b, g, j, d]
                            grad_k[b, g, j, d] += d_score * scale * q[b, h, i, d]
                            grad_v[b, g, j, d] += p * grad_out[b, h, i, d]


# --------------------------------------------------------------------------------- the Functions


class OnlineAttention(Function):
    """O = softmax(q Kᵀ / √D - bias, masked) V, walked in tiles.   JVP: the same as standard attention's
    (ops/attention.py derives it), from P recomputed with numpy: the tiles change how O is computed,
    not what it is, so its derivative is the same.
    """

    @staticmethod
    def forward(ctx, q, k, v, causal, slopes, tile_size):
        B, H, Tq, D = q.shape
        scale = q.dtype.type(1 / math.sqrt(D))  # the 1/√D of S = q kᵀ / √D, in q's float type
        out = np.empty((B, H, Tq, D), dtype=q.dtype)
        log_sum_exp = np.empty((B, H, Tq), dtype=q.dtype)  # L, one number per query row: all backward needs of P
        active(online_attention_forward)(q, k, v, slopes, scale, causal, tile_size, out, log_sum_exp)
        ctx.save_for_backward(q, k, v, out, log_sum_exp)
        ctx.slopes, ctx.scale, ctx.causal, ctx.tile_size = slopes, scale, causal, tile_size
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, log_sum_exp = ctx.saved_tensors
        grad_q, grad_k, grad_v = np.empty(q.shape, q.dtype), np.empty(k.shape, k.dtype), np.empty(v.shape, v.dtype)
        active(online_attention_backward)(
            grad_out, q, k, v, out, log_sum_exp, ctx.slopes, ctx.scale, ctx.causal, ctx.tile_size, grad_q, grad_k, grad_v
        )
        return grad_q, grad_k, grad_v, None, None, None

    @staticmethod
    def jvp(ctx, tangent_q, tangent_k, tangent_v, *_):
        q, k, v = ctx.saved_tensors[:3]
        probs = attention_probabilities(q, k, ctx.slopes, ctx.causal)  # (B, H, Tq, Tk): forward kept only L
        return attention_jvp(q, k, v, probs, ctx.scale, tangent_q, tangent_k, tangent_v)


def split_heads(qkv, n_head, n_kv_head):
    """qkv (B, T, (H + 2 Hk) D) -> q (B, H, T, D), k, v (B, Hk, T, D): views of qkv's columns."""
    B, T, width = qkv.shape
    D = width // (n_head + 2 * n_kv_head)
    q_width, kv_width = n_head * D, n_kv_head * D
    q = qkv[:, :, :q_width].reshape(B, T, n_head, D).transpose(0, 2, 1, 3)
    k = qkv[:, :, q_width : q_width + kv_width].reshape(B, T, n_kv_head, D).transpose(0, 2, 1, 3)
    v = qkv[:, :, q_width + kv_width :].reshape(B, T, n_kv_head, D).transpose(0, 2, 1, 3)
    return q, k, v


class MultiHeadOnlineAttention(Function):
    """JVP: qkv's tangent split into heads, attention's JVP, the heads merged (as MultiHeadAttention's)."""

    @staticmethod
    def forward(ctx, qkv, n_head, n_kv_head, causal, slopes, tile_size):
        B, T, width = qkv.shape
        H, D = n_head, width // (n_head + 2 * n_kv_head)
        q, k, v = split_heads(qkv, n_head, n_kv_head)  # views of qkv: no copy
        out = np.empty((B, T, H * D), dtype=qkv.dtype)
        out_heads = out.reshape(B, T, H, D).transpose(0, 2, 1, 3)  # (B, H, T, D), a view of out
        log_sum_exp = np.empty((B, H, T), dtype=qkv.dtype)
        scale = qkv.dtype.type(1 / math.sqrt(D))
        active(online_attention_forward)(q, k, v, slopes, scale, causal, tile_size, out_heads, log_sum_exp)
        ctx.save_for_backward(qkv, out, log_sum_exp)
        ctx.n_head, ctx.n_kv_head, ctx.scale, ctx.causal, ctx.slopes, ctx.tile_size = n_head, n_kv_head, scale, causal, slopes, tile_size
        return out

    @staticmethod
    def backward(ctx, grad_out):
        qkv, out, log_sum_exp = ctx.saved_tensors
        B, T, width = qkv.shape
        H = ctx.n_head
        D = width // (H + 2 * ctx.n_kv_head)
        q, k, v = split_heads(qkv, H, ctx.n_kv_head)
        out_heads = out.reshape(B, T, H, D).transpose(0, 2, 1, 3)  # (B, H, T, D)
        grad_heads = grad_out.reshape(B, T, H, D).transpose(0, 2, 1, 3)  # (B, H, T, D)
        grad_qkv = np.empty((B, T, width), dtype=qkv.dtype)
        grad_q, grad_k, grad_v = split_heads(grad_qkv, H, ctx.n_kv_head)  # views of grad_qkv
        active(online_attention_backward)(
            grad_heads, q, k, v, out_heads, log_sum_exp, ctx.slopes, ctx.scale, ctx.causal, ctx.tile_size, grad_q, grad_k, grad_v
        )
        return grad_qkv, None, None, None, None, None

    @staticmethod
    def jvp(ctx, tangent_qkv, *_):
        qkv = ctx.saved_tensors[0]
        B, T, width = qkv.shape
        q, k, v = split_heads(qkv, ctx.n_head, ctx.n_kv_head)
        probs = attention_probabilities(q, k, ctx.slopes, ctx.causal)  # (B, H, T, T)
        tangent_heads = attention_jvp(q, k, v, probs, ctx.scale, *split_heads(tangent_qkv, ctx.n_head, ctx.n_kv_head))
        return np.ascontiguousarray(tangent_heads.transpose(0, 2, 1, 3)).reshape(B, T, q.shape[1] * q.shape[3])  # (B, T, H D)


# --------------------------------------------------------------------------------- the public functions


def check_tile_size(op, tile_size, n_keys):
    """tile_size (None: DEFAULT_TILE_SIZE) as an int >= 1, at most max(n_keys, 1): a tile larger
    than the keys is the same single tile, and its scratch need not be larger."""
    tile_size = DEFAULT_TILE_SIZE if tile_size is None else check_int(op, "tile_size", tile_size, low=1)
    return min(tile_size, max(n_keys, 1))


def online_attention(q, k, v, causal=True, alibi_slopes=None, tile_size=None):
    """softmax(q kᵀ / √D - ALiBi bias, causally masked) v, walking the keys in tiles (the module
    docstring): equal to scaled_dot_product_attention, saving O and a log-sum-exp per row instead
    of the probabilities.

    q (B, H, Tq, D); k, v (B, Hk, Tk, D) with Hk dividing H (query head h reads key/value head
    h // (H / Hk)); the queries are the last Tq positions, so Tk >= Tq when causal (a bool).
    alibi_slopes: None, or H finite numbers (a list, a numpy array or a Tensor that requires no
    gradient: they are constants), cast to q's dtype; ops/attention.py's alibi_slopes(H) makes ALiBi's.
    tile_size: keys per tile, an int >= 1 (None: DEFAULT_TILE_SIZE); the fast set keeps blocks of
    tile_size × tile_size numbers per thread.
    Sizes of 0 give an empty result, except D = 0 (no 1/√D), Hk = 0 (no head to read) and Tk = 0
    with Tq > 0 (a query that sees no key has no softmax)."""
    op = "online_attention"
    causal = check_query_key_value(op, q, k, v, causal)  # the standard op's checks, as for the slopes
    H, Hk, Tk = q.shape[1], k.shape[1], k.shape[2]
    if Hk == 0 or H % Hk:
        raise InputError(f"{op}: k and v have {Hk} heads, which must be >= 1 and divide q's {H} heads (q {q.shape}, k {k.shape})")
    check_query_key_lengths(op, q, k, causal)
    slopes = check_alibi_slopes(op, alibi_slopes, H, q.dtype)  # the standard op's check: one API, one validation
    tile_size = check_tile_size(op, tile_size, Tk)
    return OnlineAttention.apply(q, k, v, causal, slopes, tile_size)


def multi_head_online_attention(qkv, n_head, causal=True, n_kv_head=None, alibi_slopes=None, tile_size=None):
    """qkv (B, T, (H + 2 Hk) D): the H query heads, then the Hk key heads, then the Hk value heads,
    side by side (one Linear layer's output) -> (B, T, H D): split into heads (strided views, no
    copy), online attention within each (query head h reads key/value head h // (H / Hk)), heads
    merged. n_head = H >= 1; n_kv_head = Hk >= 1 dividing H (None: H); causal a bool;
    alibi_slopes None or H finite numbers; tile_size an int >= 1 (None: DEFAULT_TILE_SIZE).
    B = 0 or T = 0 gives an empty result; a head needs D >= 1 numbers."""
    op = "multi_head_online_attention"
    check_tensor(op, qkv, "qkv")
    check_ndim(op, "qkv", qkv, (3,), "a 3-d Tensor (B, T, (n_head + 2 n_kv_head) D)")
    check_float(op, qkv)
    n_head = check_int(op, "n_head", n_head, low=1)
    n_kv_head = n_head if n_kv_head is None else check_int(op, "n_kv_head", n_kv_head, low=1)
    causal = check_flag(op, "causal", causal)
    if n_head % n_kv_head:
        raise InputError(f"{op}: n_kv_head ({n_kv_head}) must divide n_head ({n_head})")
    T, width = qkv.shape[1:]
    heads = n_head + 2 * n_kv_head
    if width % heads or width == 0:
        raise InputError(
            f"{op}: the last dim of qkv {qkv.shape} must be (n_head + 2 n_kv_head) D = {heads} D with D >= 1 "
            f"(n_head {n_head}, n_kv_head {n_kv_head})"
        )
    slopes = check_alibi_slopes(op, alibi_slopes, n_head, qkv.dtype)
    tile_size = check_tile_size(op, tile_size, T)
    return MultiHeadOnlineAttention.apply(qkv, n_head, n_kv_head, causal, slopes, tile_size)


# --------------------------------------------------------------------------------- gradcheck cases


@gradcheck_case(OnlineAttention)
def _online_attention_case(draw):
    """Tiles smaller than Tk (several tiles, the last one partial), Tq < Tk (a KV cache), grouped
    heads, ALiBi, causal or not."""
    B, Hk, group, D = draw.integer(1, 2), draw.integer(1, 2), draw.integer(1, 2), draw.integer(1, 3)
    H = Hk * group
    Tq = draw.integer(1, 4)
    Tk = Tq + draw.integer(0, 2)
    causal = draw.boolean()
    tile_size = draw.integer(1, 3)
    slopes = [draw.choice((0.0, 0.25, 0.5)) for _ in range(H)] if draw.boolean() else None
    layout = draw.layout()  # one for all three: each mix of layouts would compile the kernels again
    q, k, v = (draw.tensor(shape, layout=layout) for shape in ((B, H, Tq, D), (B, Hk, Tk, D), (B, Hk, Tk, D)))
    return (lambda q, k, v: online_attention(q, k, v, causal, slopes, tile_size)), (q, k, v)


@gradcheck_case(MultiHeadOnlineAttention)
def _multi_head_online_attention_case(draw):
    Hk, group, D = draw.integer(1, 2), draw.integer(1, 2), draw.integer(1, 3)
    H = Hk * group
    qkv = draw.tensor((draw.integer(1, 2), draw.integer(1, 4), (H + 2 * Hk) * D))
    causal = draw.boolean()
    tile_size = draw.integer(1, 3)
    slopes = [draw.choice((0.0, 0.5)) for _ in range(H)] if draw.boolean() else None
    return (lambda qkv: multi_head_online_attention(qkv, H, causal, Hk, slopes, tile_size)), (qkv,)
