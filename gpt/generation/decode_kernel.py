"""Generation's one-token step: every layer of the GPT of gpt/model/transformer.py for one new token, in one kernel.

This is the fast set's replacement for one generation step through the modules. It encodes that
GPT, so it lives beside it: `decode_weights` reads the model by its attribute names
(transformer.wte, transformer.h[i].attn.c_attn, ...), and `can_run` asks the model whether it is
one the kernel computes (its options, and every layer: a layer that computes more than
x @ weight + bias, such as a LoRA adapter or a quantized layer, says no with
`fits_decode_kernel = False`, and the model then takes the modules' path). With a KV cache,
one new token is little arithmetic (about 12 C² multiply-adds per layer plus the attention over the
cache), while going through the modules is ~60 Function calls, each with its Python around the
kernel: for a single token the calls, not the arithmetic, would set the pace. Here the weights are
gathered once per generation into a `DecodeWeights`, and each token is a single call of
`decode_step`, whose loops run on plain arrays. It computes what `GPT.forward` computes for the
last position (the same logits to float rounding: the sums run in another order) and writes the
same keys and values into the same cache arrays, so a cache filled by the modules (a prompt, many
tokens at once) can be continued here and the other way round. The `Decoder` (gpt/generation/decoder.py)
calls it only under the fast kernel set; under the readable set every token goes through the modules.

For one sequence b with its new token at window position t, x the residual stream (C,), H query
heads and Hk key/value heads of size D = C / H (G = H / Hk query heads share one key/value head),
F the MLP's hidden width:

    x = wte[token] (+ wpe[t]: the learned or the sinusoidal position table)  (C,)
    for each layer:
        a = norm(x; ln_1)                                                    (C,)
        q, k, v = a @ c_attn.W + c_attn.b, cut in three                      (H D,), (Hk D,), (Hk D,)
                                                                             head h is [hD, hD + D) of its part
        (rope: rotate each pair (2i, 2i+1) of q and k in a head by the angle t θ_i)
        keys[layer, b, g, t], values[layer, b, g, t] = k_g, v_g              the cache, (Hk, block_size, D) per layer
        for each query head h, reading key/value head g = h // G:
          s_j = q_h · keys[layer, b, g, j] / √D - m_h (t - j),  j = 0 .. t   (t + 1,): the new token sees
                                                                             itself and all before it
          p = softmax(s);   y_h = sum_j p_j values[layer, b, g, j]            (D,)
        x = x + (y @ attn.c_proj.W + b)                                      (C,)
        a = norm(x; ln_2)
        x = x + mlp(a)                                                       (C,)
    logits = norm(x; ln_f) @ lm_head            lm_head (C, V) = wteᵀ when the weights are tied

    m_h: ALiBi's slope of head h (0 for every head without ALiBi: the term is then exactly 0)
    mlp(a) = sum over the chosen experts e of gate_e expert_e(a):
        a dense MLP is one expert, always chosen, with gate 1;
        a mixture of E experts (gpt/model/electives/moe.py): p = softmax(a @ router.W) (E,), the top_k most
        probable experts are chosen (equal probabilities: the lower expert number first, as the
        module's stable sort), gate_e = p_e / (sum of the chosen p), or p_e itself when top_k = 1
    expert(a) = gelu(a @ c_fc.W + b) @ c_proj.W + b                         (GELU)
             or (silu(a @ c_fc.W + b) * (a @ c_up.W + b)) @ c_proj.W + b     (SwiGLU)

    LayerNorm: (x - mean(x)) rstd w + b,  rstd = 1 / sqrt(mean((x - mean(x))²) + eps)
    RMSNorm:    x rstd w,                 rstd = 1 / sqrt(mean(x²) + eps)

Only the chosen experts run: a token costs top_k experts' work, as in the module, not E.

Every product is a row vector times a matrix, x (K,) @ W (K, N) -> (N,). `linear` loops over the
rows of W and, inside, along one row: W is read once in memory order, and the inner loop's
iterations write different outputs, so it vectorizes without reordering any sum.

What bounds its speed: each token reads every weight it uses once, more than fits in one core's L2
cache at the default recipe, so the weights stream from the next level of memory; the attention
also reads the cache, which grows with the context (and is G times smaller with grouped heads).

One kernel, serial (no prange): one token is too little work to share between threads (waking
one costs more than the token). A model without biases gets zero biases, which add nothing; all
options are flags and arrays of fixed dimensions in `DecodeWeights` (a dense MLP is stored as one
expert), so a model of any options compiles one version of the kernel per float type.
"""
from typing import NamedTuple

import numpy as np

# ---- what the kernel takes from microtensor: the kernel decorator, errors and the vector math
from microtensor import InputError, InputTypeError
from microtensor.fast import CUBIC, REDUCE_FASTMATH, SQRT_2_OVER_PI, exp_of_nonpositive, kernel, sigmoid, tanh
from microtensor.nn import rope_angles, sinusoidal_embedding

# ---- end of the imports from microtensor

# The kernels below are the fast set's (they call its vector math): tagged "fast", their compiled
# cache is keyed on every file of microtensor, microtensor/fast/ included, and on this file.
FAST = "fast"


class DecodeWeights(NamedTuple):
    """A GPT's weights for `decode_step`: each kind of layer weight stacked over the layers, L of them.

    Shapes with C = n_embd, V = vocab, H and Hk the query and key/value heads, D = C / H,
    T = block_size, E the experts (1 for a dense MLP), F an expert's hidden width. Arrays an option
    leaves out are empty, so that the kernel sees the same types for every option.
    """

    wte: np.ndarray  # (V, C)
    wpe: np.ndarray  # (T, C): the learned table, or the sinusoidal one; (0, C) with rope and ALiBi
    rope_cos: np.ndarray  # (T, D/2), cos(t θ_i) with rope; (0, 0) otherwise
    rope_sin: np.ndarray  # (T, D/2)
    alibi_slopes: np.ndarray  # (H,), ALiBi's slope of each query head; zeros without ALiBi
    ln_1_weight: np.ndarray  # (L, C)
    ln_1_bias: np.ndarray  # (L, C), zeros with RMSNorm or without biases
    c_attn_weight: np.ndarray  # (L, C, (H + 2 Hk) D): q, k, v side by side
    c_attn_bias: np.ndarray  # (L, (H + 2 Hk) D)
    attn_proj_weight: np.ndarray  # (L, C, C)
    attn_proj_bias: np.ndarray  # (L, C)
    ln_2_weight: np.ndarray  # (L, C)
    ln_2_bias: np.ndarray  # (L, C)
    router_weight: np.ndarray  # (L, C, E) for a mixture of experts; (L, C, 0) for a dense MLP
    c_fc_weight: np.ndarray  # (L, E, C, F)
    c_fc_bias: np.ndarray  # (L, E, F)
    c_up_weight: np.ndarray  # (L, E, C, F) for SwiGLU; (L, E, C, 0) for GELU
    c_up_bias: np.ndarray  # (L, E, F); (L, E, 0)
    mlp_proj_weight: np.ndarray  # (L, E, F, C)
    mlp_proj_bias: np.ndarray  # (L, E, C)
    ln_f_weight: np.ndarray  # (C,)
    ln_f_bias: np.ndarray  # (C,)
    lm_head: np.ndarray  # (C, V)
    eps: np.floating  # the norms' epsilon, in the weights' float type
    n_head: int
    n_kv_head: int
    top_k: int  # experts per token (1 for a dense MLP)
    rmsnorm: bool  # else LayerNorm
    swiglu: bool  # else GELU
    rope: bool  # rotary positions: rotate q and k
    position_table: bool  # learned or sinusoidal positions: add wpe[t] to the token's embedding
    moe: bool  # a mixture of experts; else one dense MLP


def decode_kernel_fits(config):
    """Whether the kernel covers a model of these options; the others take each token through the
    modules, with the same results. It covers every option of GPTConfig today: any n_kv_head,
    every position scheme, both norms, every MLP (the mixture of experts routes the one token as
    the module does), and both attention kernels (the same math). The options are listed, not
    assumed, so that an option added later takes the module path until the kernel learns it."""
    return (
        config.norm in ("layernorm", "rmsnorm")
        and config.mlp in ("gelu", "swiglu", "moe")
        and config.pos in ("learned", "rope", "sinusoidal", "alibi")
        and config.attention in ("standard", "online")
    )


def can_run(model):
    """Whether the kernel computes this model as it is now: its options (`decode_kernel_fits`), and
    every layer's answer. The kernel reads each layer's weight and bias only, so a layer that
    computes something else from them (gpt/model/electives/lora.py's adapter adds a low-rank product,
    gpt/model/electives/quantize.py's layers keep integer codes) answers no with `fits_decode_kernel = False`."""
    return decode_kernel_fits(model.config) and all(getattr(layer, "fits_decode_kernel", True) for layer in model.modules())


def decode_weights(model):
    """Gather a GPT's weights into a DecodeWeights (copies: take it again after the weights change)."""
    config, parts = model.config, model.transformer
    blocks = list(parts.h)
    dtype = parts.wte.weight.dtype
    L, C, D = config.n_layer, config.n_embd, config.n_embd // config.n_head
    width = (config.n_head + 2 * config.n_kv_head) * D  # c_attn's output: q, k, v heads side by side

    def stacked(get):
        """get(block) of every layer, stacked along a new first dim: (L, ...)."""
        return np.ascontiguousarray(np.stack([get(block) for block in blocks]))

    def bias(module, width):
        """A Linear's or LayerNorm's bias; zeros without one (RMSNorm has none)."""
        b = getattr(module, "bias", None)
        return np.zeros(width, dtype) if b is None else b.data

    moe = config.mlp == "moe"

    def experts(block):
        """The block's MLPs as a list of experts; a dense MLP is a list of one (same parameter names)."""
        return list(block.mlp.experts) if moe else [block.mlp]

    def per_expert(get):
        """get(expert) of every expert of every layer: (L, E, ...)."""
        return stacked(lambda block: np.stack([get(expert) for expert in experts(block)]))

    rope_cos = rope_sin = np.zeros((0, 0), dtype)
    wpe = np.zeros((0, C), dtype)
    if config.pos == "rope":
        rope_cos, rope_sin = rope_angles(config.block_size, D, 0, dtype)  # the module's own angles, (T, D/2)
    elif config.pos == "learned":
        wpe = parts.wpe.weight.data
    elif config.pos == "sinusoidal":
        wpe = sinusoidal_embedding(0, config.block_size, C, dtype)  # (T, C), rows 0 .. T-1
    if config.pos == "alibi":
        alibi_slopes = np.array(blocks[0].attn.alibi_slopes, dtype)  # the module's own slopes, (H,)
    else:
        alibi_slopes = np.zeros(config.n_head, dtype)  # a slope of 0 adds exactly nothing
    first = experts(blocks[0])[0]
    hidden = first.c_fc.weight.shape[1]
    swiglu = getattr(first, "kind", config.mlp) == "swiglu"  # an Expert says its kind; the dense MLP's is config.mlp
    if swiglu:
        c_up_weight = per_expert(lambda e: e.c_up.weight.data)
        c_up_bias = per_expert(lambda e: bias(e.c_up, hidden))
    else:
        E = len(experts(blocks[0]))
        c_up_weight, c_up_bias = np.zeros((L, E, C, 0), dtype), np.zeros((L, E, 0), dtype)
    if moe:
        router_weight = stacked(lambda b: b.mlp.router.weight.data)  # (L, C, E)
        top_k = int(blocks[0].mlp.top_k)
    else:
        router_weight, top_k = np.zeros((L, C, 0), dtype), 1
    lm_head = parts.wte.weight.data.T if config.tie_weights else model.lm_head.weight.data  # (C, V)
    return DecodeWeights(
        wte=np.ascontiguousarray(parts.wte.weight.data),
        wpe=np.ascontiguousarray(wpe),
        rope_cos=np.ascontiguousarray(rope_cos),
        rope_sin=np.ascontiguousarray(rope_sin),
        alibi_slopes=np.ascontiguousarray(alibi_slopes),
        ln_1_weight=stacked(lambda b: b.ln_1.weight.data),
        ln_1_bias=stacked(lambda b: bias(b.ln_1, C)),
        c_attn_weight=stacked(lambda b: b.attn.c_attn.weight.data),
        c_attn_bias=stacked(lambda b: bias(b.attn.c_attn, width)),
        attn_proj_weight=stacked(lambda b: b.attn.c_proj.weight.data),
        attn_proj_bias=stacked(lambda b: bias(b.attn.c_proj, C)),
        ln_2_weight=stacked(lambda b: b.ln_2.weight.data),
        ln_2_bias=stacked(lambda b: bias(b.ln_2, C)),
        router_weight=router_weight,
        c_fc_weight=per_expert(lambda e: e.c_fc.weight.data),
        c_fc_bias=per_expert(lambda e: bias(e.c_fc, hidden)),
        c_up_weight=c_up_weight,
        c_up_bias=c_up_bias,
        mlp_proj_weight=per_expert(lambda e: e.c_proj.weight.data),
        mlp_proj_bias=per_expert(lambda e: bias(e.c_proj, C)),
        ln_f_weight=np.ascontiguousarray(parts.ln_f.weight.data),
        ln_f_bias=np.ascontiguousarray(bias(parts.ln_f, C)),
        lm_head=np.ascontiguousarray(lm_head),
        eps=dtype.type(parts.ln_f.eps),
        n_head=int(config.n_head),
        n_kv_head=int(config.n_kv_head),
        top_k=top_k,
        rmsnorm=config.norm == "rmsnorm",
        swiglu=swiglu,
        rope=config.pos == "rope",
        position_table=config.pos in ("learned", "sinusoidal"),
        moe=moe,
    )


def decode(weights, tokens, position, keys, values):
    """tokens (B,) int at window position `position` -> logits (B, V), a new array.

    keys, values (L, B, Hk, block_size, D): positions 0 .. position - 1 hold the earlier tokens' keys
    and values; this writes the new tokens' at `position`. Everything the kernel will index is
    checked first (it has no bounds checks): each token in [0, V), the batch and every other dim of
    the caches against the weights, and the position inside the caches and the position table.
    """
    if not isinstance(weights, DecodeWeights):
        raise InputTypeError(f"decode: weights must be a DecodeWeights (from decode_weights(model)), got {type(weights).__name__}")
    dtype = weights.wte.dtype
    tokens = np.asarray(tokens)
    if tokens.dtype.kind not in "iu" or tokens.ndim != 1 or tokens.shape[0] == 0:
        raise InputError(f"decode: tokens must be (B,) integer ids with B >= 1, got {tokens.dtype} of shape {tokens.shape}")
    vocab = weights.wte.shape[0]
    if tokens.min() < 0 or tokens.max() >= vocab:
        bad = tokens[(tokens < 0) | (tokens >= vocab)][0]
        raise InputError(f"decode: token id {bad} is outside the vocabulary; ids must be in [0, {vocab})")
    L, C = weights.ln_1_weight.shape
    H, Hk = weights.n_head, weights.n_kv_head
    expected = (L, tokens.shape[0], Hk, None, C // H)
    for name, cache in (("keys", keys), ("values", values)):
        if not isinstance(cache, np.ndarray) or cache.dtype != dtype or not cache.flags.writeable:
            raise InputTypeError(f"decode: {name} must be a writeable {dtype} array, got {type(cache).__name__} {getattr(cache, 'dtype', '')}")
        if cache.ndim != 5 or cache.shape[:3] + cache.shape[4:] != expected[:3] + expected[4:] or cache.shape != keys.shape:
            raise InputError(
                f"decode: {name} has shape {cache.shape}, expected (n_layer, B, n_kv_head, block_size, head size) = "
                f"{expected} with B = {tokens.shape[0]} tokens, and keys and values of one shape"
            )
    # rows of the position table; ALiBi has none, its bias depends on distances only
    table = weights.rope_cos.shape[0] if weights.rope else weights.wpe.shape[0] if weights.position_table else keys.shape[3]
    limit = min(keys.shape[3], table)
    if not isinstance(position, (int, np.integer)) or isinstance(position, (bool, np.bool_)) or not 0 <= position < limit:
        raise InputError(
            f"decode: position {position!r} is outside the cache of {keys.shape[3]} positions "
            f"(or the position table of {table} rows); expected an int in [0, {limit})"
        )
    tokens = np.ascontiguousarray(tokens, dtype=np.int64)  # one array type: one compiled version
    logits = np.empty((tokens.shape[0], weights.lm_head.shape[1]), dtype=weights.lm_head.dtype)
    decode_step(tokens, int(position), weights, keys, values, logits)
    return logits


# ------------------------------------------------------------------------------ the kernel


@kernel(tag=FAST)
def decode_step(tokens, position, w, keys, values, logits):
    """One new token per sequence through the whole GPT (the module docstring's math).

    tokens (B,) at window position `position`; w a DecodeWeights; keys, values (L, B, Hk, T, D),
    written at `position`; logits (B, V) is written.
    """
    L, C = w.ln_1_weight.shape
    H, Hk = w.n_head, w.n_kv_head
    D = C // H
    group = H // Hk  # query heads per key/value head
    E, F = w.c_fc_weight.shape[1], w.c_fc_weight.shape[3]
    dtype = w.wte.dtype
    scale = dtype.type(1) / np.sqrt(dtype.type(D))  # 1/√D, computed in the weights' dtype
    key_start, value_start = H * D, (H + Hk) * D  # where k and v begin in qkv
    x = np.empty(C, dtype)  # the residual stream
    normed = np.empty(C, dtype)  # norm(x), the input of attention, of the MLP and of lm_head
    qkv = np.empty((H + 2 * Hk) * D, dtype)  # q of every query head, then k, then v of every key/value head
    attended = np.empty(C, dtype)  # the query heads' outputs side by side
    delta = np.empty(C, dtype)  # what a sub-layer adds to the residual stream
    answer = np.empty(C, dtype)  # one expert's output
    probs = np.empty(position + 1, dtype)  # one head's attention over the cache
    hidden = np.empty(F, dtype)  # an expert's hidden activations
    up = np.empty(F if w.swiglu else 0, dtype)  # SwiGLU's second projection
    expert_probs = np.empty(E, dtype)  # the router's softmax
    gates = np.empty(E, dtype)  # each expert's weight in the MLP's output (0: not chosen)
    chosen = np.empty(E, np.bool_)  # which experts run
    for b in range(tokens.shape[0]):
        for c in range(C):
            x[c] = w.wte[tokens[b], c]
        if w.position_table:
            for c in range(C):
                x[c] += w.wpe[position, c]
        for layer in range(L):
            # attention: x = x + c_proj(attend(q, cached keys and values))
            norm_row(x, w.ln_1_weight[layer], w.ln_1_bias[layer], w.eps, w.rmsnorm, normed)
            linear(normed, w.c_attn_weight[layer], w.c_attn_bias[layer], qkv)
            if w.rope:
                rotate_heads(qkv, 0, H, D, w.rope_cos[position], w.rope_sin[position])  # q
                rotate_heads(qkv, key_start, Hk, D, w.rope_cos[position], w.rope_sin[position])  # k
            for g in range(Hk):
                for d in range(D):
                    keys[layer, b, g, position, d] = qkv[key_start + g * D + d]
                    values[layer, b, g, position, d] = qkv[value_start + g * D + d]
            for h in range(H):
                g = h // group  # the key/value head of h's group
                attend(qkv, h, keys[layer, b, g], values[layer, b, g], position, scale, w.alibi_slopes[h], probs, attended)
            linear(attended, w.attn_proj_weight[layer], w.attn_proj_bias[layer], delta)
            for c in range(C):
                x[c] += delta[c]
            # MLP: x = x + sum over the chosen experts of gate * expert(norm(x))
            norm_row(x, w.ln_2_weight[layer], w.ln_2_bias[layer], w.eps, w.rmsnorm, normed)
            if w.moe:
                route(normed, w.router_weight[layer], w.top_k, expert_probs, chosen, gates)
            else:
                chosen[0], gates[0] = True, dtype.type(1)  # the dense MLP: one expert, gate 1
            for c in range(C):
                delta[c] = 0
            for e in range(E):  # in expert order, as the module adds the experts' contributions
                if not chosen[e]:
                    continue  # experts not chosen do no work
                linear(normed, w.c_fc_weight[layer, e], w.c_fc_bias[layer, e], hidden)
                if w.swiglu:
                    linear(normed, w.c_up_weight[layer, e], w.c_up_bias[layer, e], up)
                    swiglu_in_place(hidden, up)
                else:
                    gelu_in_place(hidden)
                linear(hidden, w.mlp_proj_weight[layer, e], w.mlp_proj_bias[layer, e], answer)
                gate = gates[e]
                for c in range(C):
                    delta[c] += gate * answer[c]
            for c in range(C):
                x[c] += delta[c]
        norm_row(x, w.ln_f_weight, w.ln_f_bias, w.eps, w.rmsnorm, normed)
        logits_row = logits[b]
        for v in range(logits_row.shape[0]):
            logits_row[v] = 0
        matvec_accumulate(normed, w.lm_head, logits_row)


@kernel(tag=FAST)
def linear(x, weight, bias, out):
    """out (N,) = x (K,) @ weight (K, N) + bias (N,)."""
    out[:] = 0
    matvec_accumulate(x, weight, out)
    for j in range(out.shape[0]):
        out[j] += bias[j]


@kernel(tag=FAST)
def matvec_accumulate(x, weight, out):
    """out (N,) += x (K,) @ weight (K, N), four rows of weight at a time.

    out[j] gathers x[i] weight[i, j] over i: the inner loop walks along rows of weight, contiguous
    in memory, writing N different outputs, which the compiler turns into vector instructions (a dot
    product per output, down a column, would stride through memory). Taking four rows per pass loads
    and stores out a quarter as often as one row per pass would."""
    K, N = weight.shape
    rows_by_four = K - K % 4
    for i in range(0, rows_by_four, 4):
        x0, x1, x2, x3 = x[i], x[i + 1], x[i + 2], x[i + 3]
        w0, w1, w2, w3 = weight[i], weight[i + 1], weight[i + 2], weight[i + 3]  # (N,) each
        for j in range(N):
            out[j] += x0 * w0[j] + x1 * w1[j] + x2 * w2[j] + x3 * w3[j]
    for i in range(rows_by_four, K):  # the last K % 4 rows
        xi = x[i]
        for j in range(N):
            out[j] += xi * weight[i, j]


@kernel(fastmath=REDUCE_FASTMATH, tag=FAST)
def norm_row(x, weight, bias, eps, rmsnorm, out):
    """out (C,) = LayerNorm(x) w + b, or RMSNorm(x) w, of one row x (C,)."""
    C = x.shape[0]
    zero, one, count = x.dtype.type(0), x.dtype.type(1), x.dtype.type(C)  # typed: float32 stays float32
    if rmsnorm:
        squares = zero
        for c in range(C):
            squares += x[c] * x[c]
        rstd = one / np.sqrt(squares / count + eps)
        for c in range(C):
            out[c] = x[c] * rstd * weight[c]
        return
    total = zero
    for c in range(C):
        total += x[c]
    mean = total / count
    squares = zero
    for c in range(C):
        squares += (x[c] - mean) * (x[c] - mean)
    rstd = one / np.sqrt(squares / count + eps)
    for c in range(C):
        out[c] = (x[c] - mean) * rstd * weight[c] + bias[c]


@kernel(tag=FAST)
def rotate_heads(qkv, start, H, D, cos, sin):
    """Rotary positions: rotate each pair (2i, 2i+1) of every head of qkv[start : start + H D] by
    the angle whose cos and sin are cos[i], sin[i] (D/2,), in place."""
    for h in range(H):
        base = start + h * D
        for i in range(D // 2):
            even, odd = qkv[base + 2 * i], qkv[base + 2 * i + 1]
            qkv[base + 2 * i] = even * cos[i] - odd * sin[i]
            qkv[base + 2 * i + 1] = even * sin[i] + odd * cos[i]


@kernel(fastmath=REDUCE_FASTMATH, tag=FAST)
def attend(qkv, h, keys, values, position, scale, slope, probs, out):
    """Query head h's q = qkv[hD : hD + D] against the keys and values (T, D) of its key/value head
    at positions 0 .. position: out[hD : hD + D] = softmax(q kᵀ scale - slope (position - j)) v.
    slope: ALiBi's, 0 without it. probs (position + 1,) is scratch."""
    n, D = position + 1, keys.shape[1]
    zero = keys.dtype.type(0)
    q = qkv[h * D : h * D + D]
    row_max = zero
    for j in range(n):  # scores, and their maximum on the way (a loop of its own would not vectorize)
        s = zero
        for d in range(D):
            s += q[d] * keys[j, d]
        s = s * scale - slope * keys.dtype.type(position - j)  # ALiBi: the farther back, the lower
        probs[j] = s
        if j == 0 or s > row_max:
            row_max = s
    total = zero
    for j in range(n):
        e = exp_of_nonpositive(probs[j] - row_max)  # <= 0: the maximum was subtracted
        probs[j] = e
        total += e
    for j in range(n):
        probs[j] /= total
    y = out[h * D : h * D + D]
    y[:] = 0
    matvec_accumulate(probs, values[:n], y)  # y (D,) = p (n,) @ v (n, D)


@kernel(tag=FAST)
def route(a, router_weight, top_k, probs, chosen, gates):
    """A mixture of experts' choice for one token a (C,): probs (E,) = softmax(a @ router_weight
    (C, E)); chosen (E,) marks the top_k most probable experts; gates (E,) = each chosen expert's
    probability over the sum of the chosen ones (with top_k = 1: the probability itself, Switch
    Transformer's gate, as gpt/model/electives/moe.py has it), 0 for the others.

    The experts are picked one at a time, each the most probable of those left: a strict > keeps
    the first of equal probabilities, the lower expert number, which is the order the module's
    stable sort gives (gpt/model/electives/moe.py), so both choose the same experts. The chosen probabilities
    are summed in the order they were picked, as the module sums them."""
    E = probs.shape[0]
    zero = a.dtype.type(0)
    probs[:] = 0
    matvec_accumulate(a, router_weight, probs)  # the router's logits (E,)
    row_max = probs[0]
    for e in range(1, E):
        if probs[e] > row_max:
            row_max = probs[e]
    total = zero
    for e in range(E):
        probs[e] = exp_of_nonpositive(probs[e] - row_max)
        total += probs[e]
    for e in range(E):
        probs[e] /= total
    chosen[:] = False
    gates[:] = 0
    picked = zero  # the sum of the chosen probabilities
    for _ in range(top_k):
        best = -1
        for e in range(E):
            if not chosen[e] and (best < 0 or probs[e] > probs[best]):
                best = e
        chosen[best] = True
        picked += probs[best]
    if top_k == 1:
        picked = a.dtype.type(1)  # Switch's gate: the probability, not p / p = 1
    for e in range(E):
        if chosen[e]:
            gates[e] = probs[e] / picked


@kernel(tag=FAST)
def gelu_in_place(h):
    """h = h/2 (1 + tanh(k (h + 0.044715 h³))), k = √(2/π): GELU's tanh form, as the module's MLP."""
    real = h.dtype.type
    half, one, k, cubic = real(0.5), real(1), real(SQRT_2_OVER_PI), real(CUBIC)
    for i in range(h.shape[0]):
        x = h[i]
        h[i] = half * x * (one + tanh(k * (x + cubic * x * x * x)))


@kernel(tag=FAST)
def swiglu_in_place(gate, up):
    """gate = silu(gate) * up = gate σ(gate) up."""
    for i in range(gate.shape[0]):
        gate[i] = gate[i] * sigmoid(gate[i]) * up[i]
