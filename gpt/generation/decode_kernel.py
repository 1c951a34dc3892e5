"""Generation's step for a few new tokens: every layer of the GPT of gpt/model/transformer.py, in one kernel.

This is the fast set's replacement for a generation step through the modules. It encodes that
GPT, so it lives beside it: `decode_weights` reads the model by its attribute names
(transformer.wte, transformer.h[i].attn.c_attn, ...), and `can_run` asks the model whether it is
one the kernel computes (its options, and every layer: a layer that computes more than
x @ weight + bias, such as a LoRA adapter, says no with `fits_decode_kernel = False`, and the model
then takes the modules' path). With a KV cache, one new token is little arithmetic (about 12 C²
multiply-adds per layer plus the attention over the cache), while going through the modules is ~60
Function calls, each with its Python around the kernel: for a single token the calls, not the
arithmetic, would set the pace. Here the weights are gathered once per generation into a
`DecodeWeights`, and each step is a single call of `decode_step`, whose loops run on plain arrays.
It computes what `GPT.forward` computes for the new positions (the same logits to float rounding:
the sums run in another order) and writes the same keys and values into the same cache arrays, so a
cache filled by the modules (a prompt, many tokens at once) can be continued here and the other way
round. The `Decoder` (gpt/generation/decoder.py) calls it only under the fast kernel set; under the
readable set every token goes through the modules.

A step takes n new tokens per sequence (n = 1 for plain generation; n = k + 1 when speculative
decoding, gpt/generation/electives/speculative.py, verifies k proposed tokens). For sequence b with
its new tokens at window positions t = position .. position + n - 1, x the residual stream (n, C),
H query heads and Hk key/value heads of size D = C / H (G = H / Hk query heads share one key/value
head), F the MLP's hidden width:

    x[r] = wte[token r] (+ wpe[position + r]: the learned or the sinusoidal position table)   (n, C)
    for each layer:
        a = norm(x; ln_1)                                                    (n, C), row by row
        q, k, v = a @ c_attn.W + c_attn.b, cut in three                      (n, H D), (n, Hk D), (n, Hk D)
                                                                             head h is [hD, hD + D) of its part
        (rope: rotate each pair (2i, 2i+1) of q and k in a head by the angle t θ_i)
        keys[layer, b, g, t], values[layer, b, g, t] = k_g, v_g of row t     the cache, (Hk, block_size, D) per layer
        for each row, at position t, and each query head h, reading key/value head g = h // G:
          s_j = q_h · keys[layer, b, g, j] / √D - m_h (t - j),  j = 0 .. t   (t + 1,): a new token sees
                                                                             itself and all before it, the
                                                                             other new tokens before it included
          p = softmax(s);   y_h = sum_j p_j values[layer, b, g, j]            (D,)
        x = x + (y @ attn.c_proj.W + b)                                      (n, C)
        a = norm(x; ln_2)
        x = x + mlp(a)                                                       (n, C), row by row
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

The step also writes x before ln_f, the last layer's output: a model trained with multi-token
prediction (gpt/model/electives/mtp.py) drafts from it with its extra heads (`draft_logits`), and
`self_speculative_steps` runs self-speculative decoding's rounds at temperature 0 in one call
(gpt/generation/electives/self_speculative.py).

Quantized weights (gpt/model/electives/quantize.py). Each weight matrix is a `Matrix` in one of
three forms: floats, int8 codes with one scale per output column, or int4 codes packed two per byte
with one scale per group of input rows of each column (microtensor/ops/electives/quantize.py has
the math). The products read the codes as they are and dequantize on the fly: an int8 code is
converted to a float inside the multiply-add and the column's scale multiplies each output once at
the end; int4 codes are unpacked a row at a time into floats, and each group's partial sums are
added times the group's scale. The embedding tables (`Table`) are read a row per token the same way.
A weight read from memory is then 1 byte (int8) or half a byte (int4) instead of 4.

Every product is rows times a matrix, x (n, K) @ W (K, N) -> (n, N). `rows_times_matrix` loops over
the rows of W and, inside, over the n rows of x and along one row of W: W is read once, in memory
order, for all n rows (four rows of W, a few kB, stay in the L1 cache while the n rows use them),
and the inner loop's iterations write different outputs, so it vectorizes without reordering any sum.

What bounds its speed: each step reads every weight it uses once, more than fits in one core's L2
cache at the default recipe in float32, so the weights stream from the next level of memory: a step
of n tokens costs about what one token costs, as long as n is small (that is what makes speculative
decoding pay), and int8/int4 codes cut the bytes streamed by 4 and 8. The attention also reads the
cache, which grows with the context (and is G times smaller with grouped heads).

One kernel, serial (no prange): a step is too little work to share between threads (waking one
costs more than the token). A model without biases gets zero biases, which add nothing; a dense MLP
is stored as one expert.

What a model does not have is None in `DecodeWeights`: the position table of a rotary or ALiBi
model, the rotary angles of the others, the router of a dense MLP, SwiGLU's second matrix of a GELU
MLP, and the two forms a Matrix or a Table is not in. Each optional part is handed to a small
kernel of its own as an argument (`add_position_row`, `rotate_with_rope`, `choose_experts`,
`activate`, `add_product`, `table_row`), which begins with `if part is None`. Numba compiles a
kernel for the types of its arguments, and when an argument's type is None it decides that test
while compiling and drops the branch that is not taken. So the step of a model compiles only the
code of that model's options: the default GPT's step leaves out the mixture of experts, rotary
positions, SwiGLU and the int8 and int4 products, which would otherwise be most of what a first
run (an empty compile cache) spends compiling the step. Each combination of options and weight
forms compiles its own version of the kernel, once, and keeps it in the cache.
"""
import dataclasses
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path
from typing import NamedTuple

import numpy as np

# ---- what the kernel takes from microtensor: the kernel decorator, errors, quantized matrices and the vector math
from microtensor import InputError, InputTypeError
from microtensor.fast import CUBIC, REDUCE_FASTMATH, SQRT_2_OVER_PI, exp_of_nonpositive, kernel, sigmoid, tanh
from microtensor.nn import QuantizedMatrix, rope_angles, sinusoidal_embedding

# ---- end of the imports from microtensor

# The kernels below are the fast set's (they call its vector math): tagged "fast", their compiled
# cache is keyed on every file of microtensor, microtensor/fast/ included, and on this file.
FAST = "fast"
FLOAT, INT8, INT4 = 32, 8, 4  # a Matrix's or a Table's form: its bits per weight
CONTRACT = {"contract"}  # a multiply and the add after it become one fused instruction; no sum is reordered


class Matrix(NamedTuple):
    """S weight matrices W (K, N) of one kind (one per layer, or per layer and expert: slot = layer E + e),
    used as x @ W, in the form `bits` says; the other two forms are None (and scale, for floats).

    bits 32: floats (S, K, N).
    bits 8:  int8 (S, K, N) codes q, scale (S, 1, N):  W[k, j] = scale[0, j] q[k, j].
    bits 4:  int4 (S, ceil(K/2), N) bytes, rows 2i and 2i + 1 in byte row i (low four bits first, each
             code + 8); scale (S, ceil(K/G), N):  W[k, j] = scale[k // G, j] q[k, j], G = group_size.
    """

    floats: np.ndarray | None
    int8: np.ndarray | None
    int4: np.ndarray | None
    scale: np.ndarray | None
    group_size: int
    bits: int


class Table(NamedTuple):
    """An embedding table (R, C) read a row at a time, in the form `bits` says (the others None):
    floats (R, C); int8 (R, C) codes with scale (R, 1); int4 (R, ceil(C/2)) bytes with scale
    (R, ceil(C/G)), a scale per group of G entries of a row, as gpt/model/electives/quantize.py stores them."""

    floats: np.ndarray | None
    int8: np.ndarray | None
    int4: np.ndarray | None
    scale: np.ndarray | None
    group_size: int
    bits: int


class DecodeWeights(NamedTuple):
    """A GPT's weights for `decode_step`: each kind of layer weight stacked over the layers, L of them.

    Shapes with C = n_embd, V = vocab, H and Hk the query and key/value heads, D = C / H,
    T = block_size, E the experts (1 for a dense MLP), F an expert's hidden width. What the model
    has not got is None, so that the kernel compiles none of its code (the module docstring says how).
    """

    wte: Table  # (V, C)
    wpe: Table | None  # (T, C): the learned table, or the sinusoidal one; None with rope and ALiBi
    rope_cos: np.ndarray | None  # (T, D/2), cos(t θ_i) with rope; None otherwise
    rope_sin: np.ndarray | None  # (T, D/2)
    alibi_slopes: np.ndarray  # (H,), ALiBi's slope of each query head; zeros without ALiBi
    ln_1_weight: np.ndarray  # (L, C)
    ln_1_bias: np.ndarray  # (L, C), zeros with RMSNorm or without biases
    c_attn: Matrix  # L of (C, (H + 2 Hk) D): q, k, v side by side
    c_attn_bias: np.ndarray  # (L, (H + 2 Hk) D)
    attn_proj: Matrix  # L of (C, C)
    attn_proj_bias: np.ndarray  # (L, C)
    ln_2_weight: np.ndarray  # (L, C)
    ln_2_bias: np.ndarray  # (L, C)
    router: Matrix | None  # L of (C, E) for a mixture of experts; None for a dense MLP
    router_bias: np.ndarray | None  # (L, E): zeros (the router has no bias); None for a dense MLP
    c_fc: Matrix  # L E of (C, F)
    c_fc_bias: np.ndarray  # (L, E, F)
    c_up: Matrix | None  # L E of (C, F) for SwiGLU; None for GELU
    c_up_bias: np.ndarray | None  # (L, E, F); None for GELU
    mlp_proj: Matrix  # L E of (F, C)
    mlp_proj_bias: np.ndarray  # (L, E, C)
    ln_f_weight: np.ndarray  # (C,)
    ln_f_bias: np.ndarray  # (C,)
    lm_head: Matrix  # 1 of (C, V)
    lm_head_bias: np.ndarray  # (V,): zeros
    eps: np.floating  # the norms' epsilon, in the weights' float type
    n_head: int
    n_kv_head: int
    top_k: int  # experts per token (1 for a dense MLP)
    rmsnorm: bool  # else LayerNorm


class DraftHeads(NamedTuple):
    """The K = mtp - 1 extra heads of a model trained with multi-token prediction
    (gpt/model/electives/mtp.py) for `draft_logits`: each head's residual MLP, stacked over the heads
    (slot k - 2 for head k). ln_f and lm_head are the DecodeWeights', shared with the next-token head."""

    ln_weight: np.ndarray  # (K, C)
    ln_bias: np.ndarray  # (K, C), zeros with RMSNorm or without biases
    c_fc: Matrix  # K of (C, F)
    c_fc_bias: np.ndarray  # (K, 1, F): one expert per head, as `activate` indexes its biases
    c_up: Matrix | None  # K of (C, F) for SwiGLU; None for GELU
    c_up_bias: np.ndarray | None  # (K, 1, F); None for GELU
    c_proj: Matrix  # K of (F, C)
    c_proj_bias: np.ndarray  # (K, C)


def decode_kernel_fits(config):
    """Whether the kernel covers a model of these options; the others take each token through the
    modules, with the same results. It covers every option of GPTConfig today: any n_kv_head,
    every position scheme, both norms, every MLP (the mixture of experts routes each token as
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
    every layer's answer. The kernel reads each layer's weight (floats or quantized codes) and bias
    only, so a layer that computes something else from them (gpt/model/electives/lora.py's adapter
    adds a low-rank product) answers no with `fits_decode_kernel = False`."""
    # asked of the class: a module's own lookup of a missing name would search for a close match to suggest
    return decode_kernel_fits(model.config) and all(getattr(type(layer), "fits_decode_kernel", True) for layer in model.modules())


def weight_form(weight):
    """One weight as x @ W reads it: (bits, floats or codes, scale (groups, N) or None, group_size).
    A float weight is a Tensor (K, N); a quantized one a QuantizedMatrix, whose "out_in" codes (an
    embedding table used as the tied head) are transposed: int4 bytes pair rows along K in both layouts,
    so the transposed bytes are the "in_out" ones."""
    if not isinstance(weight, QuantizedMatrix):
        return FLOAT, weight if isinstance(weight, np.ndarray) else weight.data, None, 0
    values, scale = weight.values, weight.scale
    if weight.layout == "out_in":
        values, scale = values.T, scale.T
    N = values.shape[1]
    return weight.bits, values, scale.reshape(-1, N), weight.group_size or weight.shape[0]


def matrix(weights, dtype):
    """A Matrix of the weights (a list of S Tensors or QuantizedMatrix of one form and shape)."""
    forms = [weight_form(w) for w in weights]
    bits, group_size = forms[0][0], forms[0][3]
    if any(form[0] != bits or form[3] != group_size for form in forms):
        raise InputError(f"decode_weights: a model's matrices must share one form, got bits {sorted({form[0] for form in forms})}")
    values = np.ascontiguousarray(np.stack([form[1] for form in forms]))  # (S, K or ceil(K/2), N)
    return Matrix(
        floats=values if bits == FLOAT else None,
        int8=values if bits == INT8 else None,
        int4=values if bits == INT4 else None,
        scale=None if bits == FLOAT else np.ascontiguousarray(np.stack([form[2] for form in forms])),
        group_size=int(group_size),
        bits=bits,
    )


def table(weight, dtype):
    """A Table of an embedding's weight: a float array or Tensor (R, C), or a QuantizedMatrix of layout "out_in"."""
    if not isinstance(weight, QuantizedMatrix):
        floats = weight if isinstance(weight, np.ndarray) else weight.data
        return Table(np.ascontiguousarray(floats), None, None, None, 0, FLOAT)
    bits, values = weight.bits, np.ascontiguousarray(weight.values)
    scale = np.ascontiguousarray(weight.scale.reshape(values.shape[0], -1))  # (R, 1) or (R, groups)
    return Table(
        floats=None,
        int8=values if bits == INT8 else None,
        int4=values if bits == INT4 else None,
        scale=scale,
        group_size=int(weight.group_size or weight.shape[0]),
        bits=bits,
    )


def decode_weights(model):
    """Gather a GPT's weights into a DecodeWeights (copies: take it again after the weights change).
    Float weights, or the codes and scales of a model quantized by gpt/model/electives/quantize.py."""
    config, parts = model.config, model.transformer
    blocks = list(parts.h)
    dtype = parts.ln_f.weight.dtype
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

    def expert_matrix(get):
        """The Matrix of get(expert) of every expert of every layer, slot layer E + e."""
        return matrix([get(expert).weight for block in blocks for expert in experts(block)], dtype)

    rope_cos = rope_sin = wpe = None
    if config.pos == "rope":
        rope_cos, rope_sin = (np.ascontiguousarray(a) for a in rope_angles(config.block_size, D, 0, dtype))  # the module's own angles, (T, D/2)
    elif config.pos == "learned":
        wpe = table(parts.wpe.weight, dtype)
    elif config.pos == "sinusoidal":
        wpe = table(sinusoidal_embedding(0, config.block_size, C, dtype), dtype)  # (T, C), rows 0 .. T-1
    if config.pos == "alibi":
        alibi_slopes = np.array(blocks[0].attn.alibi_slopes, dtype)  # the module's own slopes, (H,)
    else:
        alibi_slopes = np.zeros(config.n_head, dtype)  # a slope of 0 adds exactly nothing
    first = experts(blocks[0])[0]
    E = len(experts(blocks[0]))
    hidden = first.c_fc.weight.shape[1]
    swiglu = getattr(first, "kind", config.mlp) == "swiglu"  # an Expert says its kind; the dense MLP's is config.mlp
    if swiglu:
        c_up = expert_matrix(lambda e: e.c_up)
        c_up_bias = per_expert(lambda e: bias(e.c_up, hidden))
    else:
        c_up = c_up_bias = None
    if moe:
        router = matrix([b.mlp.router.weight for b in blocks], dtype)  # L of (C, E)
        router_bias, top_k = np.zeros((L, E), dtype), int(blocks[0].mlp.top_k)
    else:
        router, router_bias, top_k = None, None, 1
    lm_head = parts.wte.weight if config.tie_weights else model.lm_head.weight
    if config.tie_weights and not isinstance(lm_head, QuantizedMatrix):
        lm_head = lm_head.data.T  # (C, V): the tied head is x @ wteᵀ
    return DecodeWeights(
        wte=table(parts.wte.weight, dtype),
        wpe=wpe,
        rope_cos=rope_cos,
        rope_sin=rope_sin,
        alibi_slopes=np.ascontiguousarray(alibi_slopes),
        ln_1_weight=stacked(lambda b: b.ln_1.weight.data),
        ln_1_bias=stacked(lambda b: bias(b.ln_1, C)),
        c_attn=matrix([b.attn.c_attn.weight for b in blocks], dtype),
        c_attn_bias=stacked(lambda b: bias(b.attn.c_attn, width)),
        attn_proj=matrix([b.attn.c_proj.weight for b in blocks], dtype),
        attn_proj_bias=stacked(lambda b: bias(b.attn.c_proj, C)),
        ln_2_weight=stacked(lambda b: b.ln_2.weight.data),
        ln_2_bias=stacked(lambda b: bias(b.ln_2, C)),
        router=router,
        router_bias=router_bias,
        c_fc=expert_matrix(lambda e: e.c_fc),
        c_fc_bias=per_expert(lambda e: bias(e.c_fc, hidden)),
        c_up=c_up,
        c_up_bias=c_up_bias,
        mlp_proj=expert_matrix(lambda e: e.c_proj),
        mlp_proj_bias=per_expert(lambda e: bias(e.c_proj, C)),
        ln_f_weight=np.ascontiguousarray(parts.ln_f.weight.data),
        ln_f_bias=np.ascontiguousarray(bias(parts.ln_f, C)),
        lm_head=matrix([lm_head], dtype),
        lm_head_bias=np.zeros(config.vocab_size, dtype),
        eps=dtype.type(parts.ln_f.eps),
        n_head=int(config.n_head),
        n_kv_head=int(config.n_kv_head),
        top_k=top_k,
        rmsnorm=config.norm == "rmsnorm",
    )


def draft_heads(model):
    """Gather the extra heads of a model trained with `mtp` >= 2 into a DraftHeads (copies, as
    `decode_weights`). A head's MLP is SwiGLU when the model's is, GELU otherwise."""
    config, heads = model.config, list(model.mtp_heads)
    dtype = model.transformer.ln_f.weight.dtype
    C, hidden = config.n_embd, heads[0].mlp.c_fc.weight.shape[1]

    def bias(module, width):
        b = getattr(module, "bias", None)
        return np.zeros(width, dtype) if b is None else b.data

    def stacked(get):
        return np.ascontiguousarray(np.stack([get(head) for head in heads]))

    swiglu = heads[0].mlp.kind == "swiglu"
    return DraftHeads(
        ln_weight=stacked(lambda h: h.ln_1.weight.data),
        ln_bias=stacked(lambda h: bias(h.ln_1, C)),
        c_fc=matrix([h.mlp.c_fc.weight for h in heads], dtype),
        c_fc_bias=stacked(lambda h: bias(h.mlp.c_fc, hidden)[None]),
        c_up=matrix([h.mlp.c_up.weight for h in heads], dtype) if swiglu else None,
        c_up_bias=stacked(lambda h: bias(h.mlp.c_up, hidden)[None]) if swiglu else None,
        c_proj=matrix([h.mlp.c_proj.weight for h in heads], dtype),
        c_proj_bias=stacked(lambda h: bias(h.mlp.c_proj, C)),
    )


def decode(weights, tokens, position, keys, values, hidden=False):
    """tokens (B,) or (B, n) int, the new tokens of B sequences at window positions position ..
    position + n - 1 -> their logits (B, V) or (B, n, V), a new array; with hidden=True also the
    last layer's output before ln_f, (B, C) or (B, n, C): (logits, hidden).

    keys, values (L, B, Hk, block_size, D): positions 0 .. position - 1 hold the earlier tokens' keys
    and values; this writes the new tokens' at position .. position + n - 1. Everything the kernel
    will index is checked first (it has no bounds checks): each token in [0, V), the batch and every
    other dim of the caches against the weights, and the positions inside the caches and the
    position table.
    """
    one_per_sequence = np.ndim(tokens) == 1
    tokens = checked("decode", weights, tokens, position, 0, keys, values)  # (B, n) int64
    B, n = tokens.shape
    dtype = weights.ln_f_weight.dtype
    logits = np.empty((B, n, weights.lm_head_bias.shape[0]), dtype=dtype)
    last_layer = np.empty((B, n, weights.ln_1_weight.shape[1]), dtype=dtype)
    arguments = (tokens, int(position), weights, keys, values, logits, last_layer)
    compiled(decode_step, weights, arguments)(*arguments)
    if one_per_sequence:
        logits, last_layer = logits[:, 0], last_layer[:, 0]
    return (logits, last_layer) if hidden else logits


def decode_greedy(weights, tokens, position, steps, keys, values):
    """Greedy decoding's inner loop in one call: tokens (B, n) as `decode` takes them, then `steps`
    tokens chosen one after another, each the argmax of the logits before it (ties: the lower id,
    as numpy's argmax), each fed in turn but the last. Returns (chosen (B, steps) int64, the logits
    each was chosen from (B, steps, V)). The caches then hold position .. position + n + steps - 2."""
    steps = checked_steps("decode_greedy", steps)
    tokens = checked("decode_greedy", weights, tokens, position, steps - 1, keys, values)
    B, V = tokens.shape[0], weights.lm_head_bias.shape[0]
    chosen = np.empty((B, steps), np.int64)
    logits = np.empty((B, steps, V), dtype=weights.ln_f_weight.dtype)
    arguments = (tokens, int(position), weights, keys, values, chosen, logits)
    compiled(greedy_steps, weights, arguments)(*arguments)
    return chosen, logits


def decode_drafts(weights, heads, hidden):
    """The extra heads' logits (K, V) from the trunk's output at one position, hidden (C,)."""
    if not isinstance(heads, DraftHeads):
        raise InputTypeError(f"decode_drafts: heads must be a DraftHeads (from draft_heads(model)), got {type(heads).__name__}")
    dtype, C = weights.ln_f_weight.dtype, weights.ln_1_weight.shape[1]
    hidden = np.ascontiguousarray(hidden, dtype=dtype)
    if hidden.shape != (C,) or heads.ln_weight.shape[1] != C:
        raise InputError(f"decode_drafts: hidden must be ({C},) and the heads {C} wide, got {hidden.shape} and {heads.ln_weight.shape[1]}")
    logits = np.empty((heads.ln_weight.shape[0], weights.lm_head_bias.shape[0]), dtype)
    arguments = (hidden, weights, heads, logits)
    compiled(draft_logits, weights, arguments)(*arguments)
    return logits


def decode_self_speculative(weights, heads, tokens, position, steps, keys, values, drafts):
    """Self-speculative decoding at temperature 0 in one call (`self_speculative_steps`): tokens
    (1, n) as `decode` takes them, drafts the extra heads' guesses for the tokens after the last of
    them (a list of at most K ids; empty before the first round). Returns (chosen (steps,) int64,
    the drafts for the token after the last chosen (K,), SpeculativeStats-like counts (rounds,
    proposed, accepted)). The chosen tokens are greedy decoding's; the caches then hold position ..
    position + n + steps - 2, as after `decode_greedy`."""
    steps = checked_steps("decode_self_speculative", steps)
    tokens = checked("decode_self_speculative", weights, tokens, position, steps - 1, keys, values)
    if tokens.shape[0] != 1:
        raise InputError(f"decode_self_speculative: one sequence at a time, got a batch of {tokens.shape[0]}")
    K, V = heads.ln_weight.shape[0], weights.lm_head_bias.shape[0]
    given = np.asarray(drafts, dtype=np.int64).reshape(-1)
    if given.size > K or (given.size and (given.min() < 0 or given.max() >= V)):
        raise InputError(f"decode_self_speculative: drafts must be at most {K} token ids in [0, {V}), got {[int(d) for d in given]}")
    proposed = np.zeros(K, np.int64)
    proposed[: given.size] = given
    chosen = np.empty(steps, np.int64)
    counts = np.array([given.size, 0, 0, 0], np.int64)  # valid drafts, rounds, proposed, accepted
    arguments = (tokens, int(position), weights, heads, keys, values, proposed, chosen, counts)
    compiled(self_speculative_steps, weights, arguments)(*arguments)
    return chosen, proposed, (int(counts[1]), int(counts[2]), int(counts[3]))


def decode_speculative(target, draft, speculate_k, steps):
    """Speculative decoding at temperature 0 in one call (`speculative_steps`): target and draft are
    (weights, tokens (1, n) as `decode` takes them, position, keys, values) of the two models, each
    model's tokens the end of one sequence that its cache does not hold yet. Returns (chosen
    (steps,) int64, the positions each cache then holds (target's, draft's), SpeculativeStats-like
    counts (rounds, proposed, accepted)). The chosen tokens are the target's greedy ones. The caller
    keeps both windows from moving: every length the rounds reach fits in both caches."""
    steps = checked_steps("decode_speculative", steps)
    if isinstance(speculate_k, (bool, np.bool_)) or not isinstance(speculate_k, (int, np.integer)) or speculate_k < 1:
        raise InputError(f"decode_speculative: speculate_k must be an int >= 1, got {speculate_k!r}")
    models = []
    for name, (weights, tokens, position, keys, values) in (("target", target), ("draft", draft)):
        tokens = checked(f"decode_speculative ({name})", weights, tokens, position, 0, keys, values)
        if tokens.shape[0] != 1:
            raise InputError(f"decode_speculative: one sequence at a time, got a batch of {tokens.shape[0]} for the {name}")
        models.append((weights, tokens, int(position), keys, values))
    (target_weights, target_tokens, target_position, target_keys, target_values), draft_model = models
    draft_weights, draft_tokens, draft_position, draft_keys, draft_values = draft_model
    if draft_weights.lm_head_bias.shape[0] != target_weights.lm_head_bias.shape[0]:
        raise InputError("decode_speculative: the target and the draft must share one vocabulary")
    chosen = np.empty(steps, np.int64)
    counts = np.zeros(5, np.int64)  # rounds, proposed, accepted, then the positions the two caches hold
    arguments = (target_tokens, target_position, target_weights, target_keys, target_values,
                 draft_tokens, draft_position, draft_weights, draft_keys, draft_values, np.int64(speculate_k), chosen, counts)  # fmt: skip
    compiled(speculative_steps, target_weights, arguments, draft_weights)(*arguments)
    return chosen, (int(counts[3]), int(counts[4])), (int(counts[0]), int(counts[1]), int(counts[2]))


def checked_steps(where, steps):
    if isinstance(steps, (bool, np.bool_)) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise InputError(f"{where}: steps must be an int >= 1, got {steps!r}")
    return int(steps)


def checked(where, weights, tokens, position, more, keys, values):
    """decode's checks, for n tokens at `position` and `more` after them: returns the tokens as a
    (B, n) int64 array (a (B,) array is one token per sequence)."""
    if not isinstance(weights, DecodeWeights):
        raise InputTypeError(f"{where}: weights must be a DecodeWeights (from decode_weights(model)), got {type(weights).__name__}")
    dtype = weights.ln_f_weight.dtype
    tokens = np.asarray(tokens)
    if tokens.dtype.kind not in "iu" or tokens.ndim not in (1, 2) or 0 in tokens.shape:
        raise InputError(f"{where}: tokens must be (B,) integer ids, or (B, n) for n new tokens per sequence, with B, n >= 1, got {tokens.dtype} of shape {tokens.shape}")
    tokens = tokens[:, None] if tokens.ndim == 1 else tokens  # (B, n)
    vocab = weights.lm_head_bias.shape[0]
    if tokens.min() < 0 or tokens.max() >= vocab:
        bad = tokens[(tokens < 0) | (tokens >= vocab)][0]
        raise InputError(f"{where}: token id {bad} is outside the vocabulary; ids must be in [0, {vocab})")
    L, C = weights.ln_1_weight.shape
    H, Hk = weights.n_head, weights.n_kv_head
    expected = (L, tokens.shape[0], Hk, None, C // H)
    for name, cache in (("keys", keys), ("values", values)):
        if not isinstance(cache, np.ndarray) or cache.dtype != dtype or not cache.flags.writeable:
            raise InputTypeError(f"{where}: {name} must be a writeable {dtype} array, got {type(cache).__name__} {getattr(cache, 'dtype', '')}")
        if cache.ndim != 5 or cache.shape[:3] + cache.shape[4:] != expected[:3] + expected[4:] or cache.shape != keys.shape:
            raise InputError(
                f"{where}: {name} has shape {cache.shape}, expected (n_layer, B, n_kv_head, block_size, head size) = "
                f"{expected} with B = {tokens.shape[0]} tokens at each new position, and keys and values of one shape"
            )
    # rows of the position table; ALiBi has none, its bias depends on distances only
    if weights.rope_cos is not None:
        table_rows = weights.rope_cos.shape[0]
    elif weights.wpe is not None:
        table_rows = next(rows for rows in (weights.wpe.floats, weights.wpe.int8, weights.wpe.int4) if rows is not None).shape[0]  # the form it has
    else:
        table_rows = keys.shape[3]
    fed = tokens.shape[1] + more
    limit = min(keys.shape[3], table_rows) - fed + 1  # the last token fed must fit too
    if not isinstance(position, (int, np.integer)) or isinstance(position, (bool, np.bool_)) or not 0 <= position < limit:
        raise InputError(
            f"{where}: position {position!r} is outside the cache of {keys.shape[3]} positions "
            f"(or the position table of {table_rows} rows) for {fed} token(s) fed from it; expected an int in [0, {max(limit, 0)})"
        )
    return np.ascontiguousarray(tokens, dtype=np.int64)  # one array type: one compiled version


COMPILED_KEPT = 8  # the (kernel, DecodeWeights) pairs whose compiled version is remembered: a generation uses one to four
_compiled = {}  # (id(kernel), id(weights), id(draft weights)) -> (both weights, the kernel compiled for their arguments' types)
_compiled_by_kind = {}  # (id(kernel), kind_of(arguments)) -> the kernel compiled for such arguments


def compiled(kernel_function, weights, arguments, draft_weights=None):
    """A kernel's compiled version for these arguments (the weights among them, and a draft model's
    for speculative decoding), to call directly. Numba's dispatcher works out the type of every
    argument on each call to choose the version to run; DecodeWeights holds some 70 arrays, and
    that costs more than a small model's token. The arrays passed with the same weights always have
    the same types (int64 tokens, C-contiguous caches and outputs: the callers make sure), so the
    version is found once per DecodeWeights (by `kind_of`, which names everything its type depends
    on) and kept with them, alive, so that their id names them alone."""
    if not all(a.flags.c_contiguous for a in arguments if isinstance(a, np.ndarray)):
        return kernel_function  # other layouts (a view of a cache): the dispatcher chooses, nothing is kept
    key = (id(kernel_function), id(weights), id(draft_weights))
    known = _compiled.get(key)
    if known is not None and known[0] is weights and known[1] is draft_weights:
        return known[2]
    if not hasattr(kernel_function, "overloads"):  # the JIT is off: the plain function
        return kernel_function
    kind = (id(kernel_function), kind_of(tuple(arguments)))
    if kind not in _compiled_by_kind:
        types = tuple(kernel_function.typeof_pyval(argument) for argument in arguments)
        if types not in kernel_function.overloads:
            kernel_function.compile(types)
        _compiled_by_kind[kind] = kernel_function.overloads[types].entry_point
    while len(_compiled) >= COMPILED_KEPT:
        _compiled.pop(next(iter(_compiled)))  # the oldest
    _compiled[key] = weights, draft_weights, _compiled_by_kind[kind]
    return _compiled_by_kind[kind]


def kind_of(value):
    """What Numba's type of a DecodeWeights depends on, leaf by leaf: each array's dtype, dims, layout
    and flags, and each other value's Python type (nested tuples followed)."""
    if isinstance(value, tuple):
        return tuple(kind_of(item) for item in value)
    if isinstance(value, np.ndarray):
        return value.dtype, value.ndim, value.flags.c_contiguous, value.flags.writeable, value.flags.aligned
    return type(value)


# ------------------------------------------------------------------------------ compiling ahead


def step_arguments(model, weights):
    """What `decode` hands the kernel for one token of one sequence at position 0: its version for
    these types is the one every later step of such a model runs."""
    keys, values = model.new_cache_arrays(1)
    dtype = weights.ln_f_weight.dtype
    logits = np.empty((1, 1, weights.lm_head_bias.shape[0]), dtype=dtype)
    last_layer = np.empty((1, 1, weights.ln_1_weight.shape[1]), dtype=dtype)
    return np.zeros((1, 1), dtype=np.int64), 0, weights, keys, values, logits, last_layer


def is_compiled(model):
    """Whether the kernel's version for `model` is compiled: in this process, or in the compile cache
    on disk (then it is loaded, as its first use would load it)."""
    if not hasattr(decode_step, "overloads"):  # the JIT is off: nothing is ever compiled
        return True
    types = tuple(decode_step.typeof_pyval(a) for a in step_arguments(model, decode_weights(model)))
    return types in decode_step.overloads or decode_step._cache.load_overload(types, decode_step.targetctx) is not None


def compile_in_background(model):
    """Start a second process that compiles the kernel's version for `model` into the compile cache
    this process reads (`compile_for`), and return it (a subprocess.Popen); None if the kernel does
    not run this model or its version is compiled already. The process writes nothing but the
    cache and prints nothing; if it fails, the kernel compiles at its first use, as it would have.
    It is killed if this process ends first."""
    if not can_run(model) or is_compiled(model):
        return None
    fields, dtype = json.dumps(dataclasses.asdict(model.config)), str(next(iter(model.parameters())).dtype)
    program = f"import json; from gpt.generation import decode_kernel; decode_kernel.compile_for(json.loads({fields!r}), {dtype!r})"
    project = str(Path(__file__).resolve().parents[2])  # where `gpt` can be imported from
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [project, os.environ.get("PYTHONPATH")])))
    process = subprocess.Popen([sys.executable, "-c", program], env=environment, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    weakref.finalize(process, process.kill)  # at exit too: never left running after this process
    return process


def compile_for(config_fields, dtype):
    """Compile the kernel's version for a GPT of these options (GPTConfig's fields, a dict) with
    weights of this dtype (a name) into the compile cache: what the second process started by
    gpt/generation/decoder.py's `compile_in_background` runs."""
    from gpt.model.transformer import GPT, GPTConfig  # here: the model's module imports the Decoder's

    model = GPT(GPTConfig(**config_fields))
    if np.dtype(dtype) != np.float32:
        model.to(np.dtype(dtype))
    weights = decode_weights(model)
    compiled(decode_step, weights, step_arguments(model, weights))


# ------------------------------------------------------------------------------ the kernel


@kernel(tag=FAST)
def decode_step(tokens, position, w, keys, values, logits, last_layer):
    """n new tokens per sequence through the whole GPT (the module docstring's math).

    tokens (B, n) at window positions position .. position + n - 1; w a DecodeWeights; keys, values
    (L, B, Hk, T, D), written at those positions; logits (B, n, V) and last_layer (B, n, C), the
    last layer's output before ln_f (what a model's extra heads read), are written.
    """
    B, n = tokens.shape
    L, C = w.ln_1_weight.shape
    H, Hk = w.n_head, w.n_kv_head
    D = C // H
    group = H // Hk  # query heads per key/value head
    E, F = w.c_fc_bias.shape[1], w.c_fc_bias.shape[2]
    dtype = w.ln_f_weight.dtype
    scale = dtype.type(1) / np.sqrt(dtype.type(D))  # 1/√D, computed in the weights' dtype
    key_start, value_start = H * D, (H + Hk) * D  # where k and v begin in qkv
    x = np.empty((n, C), dtype)  # the residual stream
    normed = np.empty((n, C), dtype)  # norm(x), the input of attention, of the MLP and of lm_head
    position_row = np.empty(C, dtype)  # a row of the position table
    qkv = np.empty((n, (H + 2 * Hk) * D), dtype)  # q of every query head, then k, then v of every key/value head
    attended = np.empty((n, C), dtype)  # the query heads' outputs side by side
    delta = np.empty((n, C), dtype)  # what a sub-layer adds to the residual stream
    answer = np.empty((n, C), dtype)  # one expert's output
    probs = np.empty(position + n, dtype)  # one head's attention over the cache
    expert_rows = np.empty((n, C), dtype)  # the rows an expert takes, gathered
    hidden = np.empty((n, F), dtype)  # an expert's hidden activations
    up = np.empty((n, F), dtype)  # SwiGLU's second projection
    router_logits = np.empty((n, E), dtype)
    expert_probs = np.empty(E, dtype)  # the router's softmax
    gates = np.zeros((n, E), dtype)  # each expert's weight in a row's MLP output (0: not chosen)
    chosen = np.zeros((n, E), np.bool_)  # which experts run for each row
    taken = np.empty(n, np.int64)  # the rows an expert takes
    for b in range(B):
        for r in range(n):
            table_row(w.wte, tokens[b, r], x[r])
            add_position_row(w.wpe, position + r, position_row, x[r])
        for layer in range(L):
            # attention: x = x + c_proj(attend(q, cached keys and values))
            for r in range(n):
                norm_row(x[r], w.ln_1_weight[layer], w.ln_1_bias[layer], w.eps, w.rmsnorm, normed[r])
            linear(normed, w.c_attn, layer, w.c_attn_bias[layer], qkv)
            for r in range(n):  # every new key and value is in the cache before any row attends
                t = position + r
                rotate_with_rope(qkv[r], H, Hk, D, w.rope_cos, w.rope_sin, t)
                for g in range(Hk):
                    for d in range(D):
                        keys[layer, b, g, t, d] = qkv[r, key_start + g * D + d]
                        values[layer, b, g, t, d] = qkv[r, value_start + g * D + d]
            for r in range(n):
                for h in range(H):
                    g = h // group  # the key/value head of h's group
                    attend(qkv[r], h, keys[layer, b, g], values[layer, b, g], position + r, scale, w.alibi_slopes[h], probs, attended[r])
            linear(attended, w.attn_proj, layer, w.attn_proj_bias[layer], delta)
            add_rows(delta, x)
            # MLP: x = x + sum over the chosen experts of gate * expert(norm(x))
            for r in range(n):
                norm_row(x[r], w.ln_2_weight[layer], w.ln_2_bias[layer], w.eps, w.rmsnorm, normed[r])
            choose_experts(normed, w.router, w.router_bias, layer, w.top_k, router_logits, expert_probs, chosen, gates)
            delta[:] = 0
            for e in range(E):  # in expert order, as the module adds the experts' contributions
                m = 0
                for r in range(n):
                    if chosen[r, e]:
                        taken[m] = r
                        m += 1
                if m == 0:
                    continue  # experts no row chose do no work
                for i in range(m):  # element by element: copying whole rows would compile Numba's shape check and its message
                    for c in range(C):
                        expert_rows[i, c] = normed[taken[i], c]
                slot = layer * E + e
                linear(expert_rows[:m], w.c_fc, slot, w.c_fc_bias[layer, e], hidden[:m])
                activate(expert_rows[:m], w.c_up, slot, w.c_up_bias, layer, e, hidden[:m], up[:m])
                linear(hidden[:m], w.mlp_proj, slot, w.mlp_proj_bias[layer, e], answer[:m])
                for i in range(m):
                    r = taken[i]
                    gate = gates[r, e]
                    for c in range(C):
                        delta[r, c] += gate * answer[i, c]
            add_rows(delta, x)
        for r in range(n):
            for c in range(C):
                last_layer[b, r, c] = x[r, c]
            norm_row(x[r], w.ln_f_weight, w.ln_f_bias, w.eps, w.rmsnorm, normed[r])
        head_slot = np.int64(0)  # a typed 0: a literal 0 would compile `linear` once more, for that constant
        linear(normed, w.lm_head, head_slot, w.lm_head_bias, logits[b])


@kernel(tag=FAST)
def greedy_steps(tokens, position, w, keys, values, chosen, logits):
    """tokens (B, n) through `decode_step` at `position`, then one token per step, each the argmax of
    the last logits; chosen (B, steps) and logits (B, steps, V) are written (see `decode_greedy`).
    One call for the whole loop: no Python between the steps."""
    B, n = tokens.shape
    steps, V = chosen.shape[1], logits.shape[2]
    C = w.ln_1_weight.shape[1]
    first = np.empty((B, n, V), logits.dtype)  # the logits of the n tokens
    hidden = np.empty((B, n, C), logits.dtype)  # the last layer's output, which greedy decoding does not read
    decode_step(tokens, position, w, keys, values, first, hidden)
    hidden = np.empty((B, 1, C), logits.dtype)  # a new array, not a slice: a slice is another array type, another compile
    last = np.empty((B, 1, V), logits.dtype)  # the logits the next token is chosen from
    for b in range(B):  # element by element, as in decode_step: a row copy would compile a shape check
        for v in range(V):
            last[b, 0, v] = first[b, n - 1, v]
    token = np.empty((B, 1), np.int64)  # the token of the next step
    for s in range(steps):
        if s > 0:
            decode_step(token, position + n + s - 1, w, keys, values, last, hidden)
        for b in range(B):
            for v in range(V):
                logits[b, s, v] = last[b, 0, v]
            chosen[b, s] = np.argmax(last[b, 0])
            token[b, 0] = chosen[b, s]


@kernel(tag=FAST)
def draft_logits(hidden, w, heads, logits):
    """The extra heads' logits (K, V) from one position's hidden state (C,), the trunk's output:
    head k + 2's are ln_f(h + mlp_k(ln_k(h))) @ lm_head (gpt/model/electives/mtp.py's math)."""
    K, C = heads.ln_weight.shape
    F = heads.c_fc_bias.shape[2]
    dtype = hidden.dtype
    normed = np.empty((1, C), dtype)
    x = np.empty((1, C), dtype)  # h plus the head's MLP
    inner = np.empty((1, F), dtype)  # the MLP's hidden activations
    up = np.empty((1, F), dtype)  # SwiGLU's second projection
    delta = np.empty((1, C), dtype)
    zero = np.int64(0)  # a typed 0: a literal 0 would compile `linear` and `activate` once more, for that constant
    for k in range(K):
        norm_row(hidden, heads.ln_weight[k], heads.ln_bias[k], w.eps, w.rmsnorm, normed[0])
        linear(normed, heads.c_fc, k, heads.c_fc_bias[k, 0], inner)
        activate(normed, heads.c_up, k, heads.c_up_bias, k, zero, inner, up)  # a head is expert 0 of slot k
        linear(inner, heads.c_proj, k, heads.c_proj_bias[k], delta)
        for c in range(C):
            x[0, c] = hidden[c] + delta[0, c]
        norm_row(x[0], w.ln_f_weight, w.ln_f_bias, w.eps, w.rmsnorm, normed[0])
        linear(normed, w.lm_head, zero, w.lm_head_bias, logits[k : k + 1])


@kernel(tag=FAST)
def self_speculative_steps(tokens, position, w, heads, keys, values, drafts, chosen, counts):
    """Self-speculative decoding at temperature 0 (gpt/generation/electives/self_speculative.py), its
    rounds in one call: no Python between them.

    tokens (1, n): the new tokens, at positions position .. position + n - 1 (the last is the token
    the next round begins with); drafts (K,) the extra heads' guesses for the tokens after it, the
    first counts[0] of them valid. Each round feeds the last token and k drafts through
    `decode_step`, keeps the drafts that equal the next-token head's argmax, ends with that head's
    argmax after them, and drafts again from the hidden state the argmax came from. Writes chosen
    (steps,), the drafts for the token after the last chosen, and counts: (valid drafts, rounds,
    proposed, accepted). The caller makes sure every fed position is inside the cache."""
    n = tokens.shape[1]
    steps, K = chosen.shape[0], drafts.shape[0]
    V, C = w.lm_head_bias.shape[0], w.ln_1_weight.shape[1]
    T = keys.shape[3]
    dtype = w.ln_f_weight.dtype
    head_logits = np.empty((K, V), dtype)
    valid = counts[0]
    produced = 0
    while produced < steps:
        k = min(valid, steps - produced - 1, T - position - n)  # T - position - n: the last fed position stays in the cache
        # new arrays each round, not slices of bigger ones: a slice is another array type, another compile of decode_step
        fed = np.empty((1, n + k), np.int64)
        logits = np.empty((1, n + k, V), dtype)
        hidden = np.empty((1, n + k, C), dtype)
        for r in range(n):
            fed[0, r] = tokens[0, r] if produced == 0 else chosen[produced - 1]
        for i in range(k):
            fed[0, n + i] = drafts[i]
        decode_step(fed, position, w, keys, values, logits, hidden)
        accepted = 0
        while accepted < k and np.argmax(logits[0, n - 1 + accepted]) == drafts[accepted]:
            chosen[produced] = drafts[accepted]
            produced += 1
            accepted += 1
        last = n - 1 + accepted  # the row whose argmax ends the round
        chosen[produced] = np.argmax(logits[0, last])
        produced += 1
        counts[1] += 1
        counts[2] += k
        counts[3] += accepted
        draft_logits(hidden[0, last], w, heads, head_logits)
        for i in range(K):
            drafts[i] = np.argmax(head_logits[i])
        valid = K
        position += n + accepted
        n = 1
    counts[0] = valid


@kernel(tag=FAST)
def speculative_steps(t_tokens, t_position, tw, t_keys, t_values, d_tokens, d_position, dw, d_keys, d_values, speculate_k, chosen, counts):
    """Speculative decoding at temperature 0 (gpt/generation/electives/speculative.py), its rounds in
    one call: no Python between them, and each round as the module's `round` makes it.

    t_tokens (1, nt) and d_tokens (1, nd): the end of the sequence that the target's cache (holding
    positions < t_position) and the draft's (< d_position) do not hold yet. A round: the draft feeds
    its pending tokens and proposes k tokens, each its argmax after the one before (it feeds k - 1 of
    them); the target feeds its pending tokens and the k proposals in one `decode_step`, keeps the
    proposals that equal its argmax at each place, and ends with its argmax after them. k is
    speculate_k, fewer where the tokens still wanted or either cache's room end. Each cache then keeps
    every token but the round's last (the draft: as many of them as it fed), and the rest is pending
    for the next round. Writes chosen (steps,) and counts: rounds, proposed, accepted, and the
    positions the target's and the draft's caches hold at the end."""
    steps, V = chosen.shape[0], tw.lm_head_bias.shape[0]
    Ct, Cd = tw.ln_1_weight.shape[1], dw.ln_1_weight.shape[1]
    Tt, Td = t_keys.shape[3], d_keys.shape[3]
    dtype = tw.ln_f_weight.dtype
    nt, nd = t_tokens.shape[1], d_tokens.shape[1]
    # the sequence from the draft's first pending token on: index i is the draft's position d_position + i
    history = np.empty(nd + steps, np.int64)
    for i in range(nd):
        history[i] = d_tokens[0, i]
    first_draft_position = d_position
    t_pending = np.empty(max(nt, 1), np.int64)
    for i in range(nt):
        t_pending[i] = t_tokens[0, i]
    proposals = np.empty(speculate_k, np.int64)
    one = np.empty((1, 1), np.int64)
    d_last = np.empty((1, 1, V), dtype)  # the draft's logits at its last fed position
    d_hidden = np.empty((1, 1, Cd), dtype)
    produced = 0
    while produced < steps:
        k = min(speculate_k, steps - produced, Tt - (t_position + nt), Td - (d_position + nd) + 1)
        k = max(k, 0)
        if k > 0:  # the draft: its pending tokens, then each proposal but the last
            fed = np.empty((1, nd), np.int64)  # new arrays each round, not slices: a slice is another array type, another compile
            for i in range(nd):
                fed[0, i] = history[d_position - first_draft_position + i]
            logits = np.empty((1, nd, V), dtype)
            hidden = np.empty((1, nd, Cd), dtype)
            decode_step(fed, d_position, dw, d_keys, d_values, logits, hidden)
            proposals[0] = np.argmax(logits[0, nd - 1])
            for i in range(1, k):
                one[0, 0] = proposals[i - 1]
                decode_step(one, d_position + nd + i - 1, dw, d_keys, d_values, d_last, d_hidden)
                proposals[i] = np.argmax(d_last[0, 0])
        # the target: its pending tokens and the k proposals, in one step
        fed = np.empty((1, nt + k), np.int64)
        for i in range(nt):
            fed[0, i] = t_pending[i]
        for i in range(k):
            fed[0, nt + i] = proposals[i]
        logits = np.empty((1, nt + k, V), dtype)
        hidden = np.empty((1, nt + k, Ct), dtype)
        decode_step(fed, t_position, tw, t_keys, t_values, logits, hidden)
        accepted = 0
        while accepted < k and np.argmax(logits[0, nt - 1 + accepted]) == proposals[accepted]:
            accepted += 1
        new = min(accepted + 1, steps - produced)  # the accepted proposals and the target's own token
        for i in range(new):
            token = proposals[i] if i < accepted else np.argmax(logits[0, nt - 1 + accepted])
            chosen[produced + i] = token
            history[d_position - first_draft_position + nd + i] = token
        produced += new
        counts[0] += 1
        counts[1] += k
        counts[2] += accepted
        # both caches keep every token but the round's last (the draft: those it fed)
        kept = t_position + nt + new - 1
        draft_fed = d_position + nd + k - 1 if k > 0 else d_position
        draft_kept = min(d_position + nd + new - 1, draft_fed)
        t_position, nt = kept, 1
        t_pending[0] = chosen[produced - 1]
        nd = d_position + nd + new - draft_kept
        d_position = draft_kept
    counts[3] = t_position
    counts[4] = d_position


@kernel(tag=FAST)
def add_rows(delta, x):
    """x (n, C) += delta (n, C)."""
    for r in range(x.shape[0]):
        for c in range(x.shape[1]):
            x[r, c] += delta[r, c]


@kernel(tag=FAST)
def linear(x, m, slot, bias, out):
    """out (n, N) = x (n, K) @ W + bias (N,), W the matrix `slot` of the Matrix m, in whichever form it has."""
    out[:] = 0
    add_product(x, m.floats, m.int8, m.int4, m.scale, m.group_size, slot, out)
    for r in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[r, j] += bias[j]


@kernel(tag=FAST)
def add_product(x, floats, int8, int4, scale, group_size, slot, out):
    """out (n, N) += x (n, K) @ W, W the matrix `slot` of a Matrix's one form; the two others are None,
    and Numba, compiling for None, leaves their branches out."""
    if floats is not None:
        rows_times_matrix(x, floats[slot], out)
    if int8 is not None:
        rows_times_matrix(x, int8[slot], out)
        column_scale = scale[slot, 0]  # (N,): one scale per column, taken out of its sums
        for r in range(out.shape[0]):
            for j in range(out.shape[1]):
                out[r, j] *= column_scale[j]
    if int4 is not None:
        rows_times_int4_matrix(x, int4[slot], scale[slot], group_size, out)


@kernel(fastmath=CONTRACT, tag=FAST)
def rows_times_matrix(x, weight, out):
    """out (n, N) += x (n, K) @ weight (K, N), four rows of weight at a time; weight floats or int8 codes.

    out[r, j] gathers x[r, i] weight[i, j] over i: the inner loop walks along rows of weight, contiguous
    in memory, writing N different outputs, which the compiler turns into vector instructions (a dot
    product per output, down a column, would stride through memory). Taking four rows per pass loads
    and stores out a quarter as often as one row per pass would; the four rows, read from memory once,
    serve every row r of x from the L1 cache. With several rows of x (a speculative round's check), four
    of them (then two, then one) share each loaded weight: the loop's loads, not its multiply-adds, are
    what limit it. Each output's sum is added in the same order either way. An int8 code becomes a
    float inside the multiply-add."""
    n, K = x.shape
    N = weight.shape[1]
    real = out.dtype.type
    rows_by_four = K - K % 4
    for i in range(0, rows_by_four, 4):
        w0, w1, w2, w3 = weight[i], weight[i + 1], weight[i + 2], weight[i + 3]  # (N,) each
        r = 0
        while r + 4 <= n:  # four rows of x at a time: each weight, loaded once, serves all four
            a0, a1, a2, a3 = x[r, i], x[r, i + 1], x[r, i + 2], x[r, i + 3]
            b0, b1, b2, b3 = x[r + 1, i], x[r + 1, i + 1], x[r + 1, i + 2], x[r + 1, i + 3]
            c0, c1, c2, c3 = x[r + 2, i], x[r + 2, i + 1], x[r + 2, i + 2], x[r + 2, i + 3]
            d0, d1, d2, d3 = x[r + 3, i], x[r + 3, i + 1], x[r + 3, i + 2], x[r + 3, i + 3]
            out_a, out_b, out_c, out_d = out[r], out[r + 1], out[r + 2], out[r + 3]
            for j in range(N):
                v0, v1, v2, v3 = real(w0[j]), real(w1[j]), real(w2[j]), real(w3[j])
                out_a[j] += a0 * v0 + a1 * v1 + a2 * v2 + a3 * v3
                out_b[j] += b0 * v0 + b1 * v1 + b2 * v2 + b3 * v3
                out_c[j] += c0 * v0 + c1 * v1 + c2 * v2 + c3 * v3
                out_d[j] += d0 * v0 + d1 * v1 + d2 * v2 + d3 * v3
            r += 4
        while r + 2 <= n:
            a0, a1, a2, a3 = x[r, i], x[r, i + 1], x[r, i + 2], x[r, i + 3]
            b0, b1, b2, b3 = x[r + 1, i], x[r + 1, i + 1], x[r + 1, i + 2], x[r + 1, i + 3]
            out_a, out_b = out[r], out[r + 1]
            for j in range(N):
                v0, v1, v2, v3 = real(w0[j]), real(w1[j]), real(w2[j]), real(w3[j])
                out_a[j] += a0 * v0 + a1 * v1 + a2 * v2 + a3 * v3
                out_b[j] += b0 * v0 + b1 * v1 + b2 * v2 + b3 * v3
            r += 2
        if r < n:  # the last row, alone
            x0, x1, x2, x3 = x[r, i], x[r, i + 1], x[r, i + 2], x[r, i + 3]
            out_row = out[r]
            for j in range(N):
                out_row[j] += x0 * real(w0[j]) + x1 * real(w1[j]) + x2 * real(w2[j]) + x3 * real(w3[j])
    for i in range(rows_by_four, K):  # the last K % 4 rows
        weight_row = weight[i]
        for r in range(n):
            xi = x[r, i]
            out_row = out[r]
            for j in range(N):
                out_row[j] += xi * real(weight_row[j])


@kernel(fastmath=CONTRACT, tag=FAST)
def rows_times_int4_matrix(x, packed, scale, group_size, out):
    """out (n, N) += x (n, K) @ Ŵ, Ŵ[k, j] = scale[k // G, j] q[k, j], the codes q packed two per byte
    (packed (ceil(K/2), N): row k in byte row k // 2, shifted by 4 (k mod 2), stored as q + 8).

    The codes are unpacked inside the multiply-adds: two byte rows (four rows of codes) per pass
    along the row, a mask or a shift, a subtraction and a conversion per code, vectorized; each
    group's sums are gathered apart and added times the group's scales, so a scale multiplies once
    per group and output. Rows of codes that do not make up two whole byte rows inside the group
    (an odd G, the group's end) are taken one at a time."""
    n, K = x.shape
    N = out.shape[1]
    real = out.dtype.type
    mask, shift, offset = np.int32(15), np.int32(4), np.int32(8)  # int32: converts to a float in one vector instruction
    partial = np.empty(N, out.dtype)  # one row's sums over the current group
    for g in range(scale.shape[0]):
        start, stop = g * group_size, min(K, (g + 1) * group_size)
        scale_row = scale[g]
        for r in range(n):
            partial[:] = 0
            k = start
            while k < stop:
                if k % 2 == 0 and k + 3 < stop:  # byte rows k/2 and k/2 + 1: rows k .. k + 3, all in this group
                    bytes0, bytes1 = packed[k // 2], packed[k // 2 + 1]
                    x0, x1, x2, x3 = x[r, k], x[r, k + 1], x[r, k + 2], x[r, k + 3]
                    for j in range(N):
                        c0, c1 = np.int32(bytes0[j]), np.int32(bytes1[j])
                        partial[j] += (x0 * real((c0 & mask) - offset) + x1 * real((c0 >> shift) - offset)
                                       + x2 * real((c1 & mask) - offset) + x3 * real((c1 >> shift) - offset))  # fmt: skip
                    k += 4
                else:
                    byte_row, xk, nibble = packed[k // 2], x[r, k], np.int32(4 * (k % 2))
                    for j in range(N):
                        partial[j] += xk * real(((np.int32(byte_row[j]) >> nibble) & mask) - offset)
                    k += 1
            out_row = out[r]
            for j in range(N):
                out_row[j] += scale_row[j] * partial[j]


@kernel(tag=FAST)
def table_row(t, row, out):
    """out (C,) = row `row` of the Table t, dequantized if it holds codes."""
    form_row(t.floats, t.int8, t.int4, t.scale, t.group_size, row, out)


@kernel(tag=FAST)
def form_row(floats, int8, int4, scale, group_size, row, out):
    """out (C,) = row `row` of a Table's one form; the two others are None, and Numba, compiling
    for None, leaves their branches out."""
    C = out.shape[0]
    real = out.dtype.type
    if floats is not None:
        for c in range(C):
            out[c] = floats[row, c]
    if int8 is not None:
        s = scale[row, 0]
        for c in range(C):
            out[c] = s * real(int8[row, c])
    if int4 is not None:
        for c in range(C):
            code = int((int4[row, c // 2] >> (4 * (c % 2))) & 15) - 8
            out[c] = scale[row, c // group_size] * real(code)


@kernel(tag=FAST)
def add_position_row(wpe, t, scratch, x_row):
    """x_row (C,) += row t of the position table wpe (a Table); nothing when the model has none
    (wpe None: rotary positions, ALiBi), which Numba, compiling for None, makes an empty kernel."""
    if wpe is None:
        return
    table_row(wpe, t, scratch)
    for c in range(x_row.shape[0]):
        x_row[c] += scratch[c]


@kernel(fastmath=CONTRACT, tag=FAST)
def matvec_accumulate(x, weight, out):
    """out (N,) += x (K,) @ weight (K, N), four rows at a time: `rows_times_matrix` for one row x,
    which attention uses for p (t + 1,) @ values (t + 1, D)."""
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
def rotate_with_rope(qkv_row, H, Hk, D, rope_cos, rope_sin, t):
    """Rotary positions: rotate the H query heads and the Hk key heads of one row of qkv (q, k, v
    side by side) by position t's angles; nothing when the model has other positions (rope_cos
    None, for which Numba compiles an empty kernel)."""
    if rope_cos is None:
        return
    rotate_heads(qkv_row, 0, H, D, rope_cos[t], rope_sin[t])  # q
    rotate_heads(qkv_row, H * D, Hk, D, rope_cos[t], rope_sin[t])  # k


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
    slope: ALiBi's, 0 without it. probs (>= position + 1,) is scratch."""
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
def choose_experts(normed, router, router_bias, layer, top_k, router_logits, probs, chosen, gates):
    """Which experts each row of normed (n, C) goes to, and with what gate: chosen and gates (n, E).
    A dense MLP (router None, for which Numba compiles this branch alone) is one expert, always
    chosen, with gate 1; a mixture of experts routes each row by its router logits (`route`)."""
    if router is None:
        chosen[:, 0], gates[:, 0] = True, gates.dtype.type(1)
        return
    linear(normed, router, layer, router_bias[layer], router_logits)
    for r in range(normed.shape[0]):
        route(router_logits[r], top_k, probs, chosen[r], gates[r])


@kernel(tag=FAST)
def route(router_logits, top_k, probs, chosen, gates):
    """A mixture of experts' choice for one token from its router logits (E,) (a @ router_weight):
    probs (E,) = their softmax; chosen (E,) marks the top_k most probable experts; gates (E,) = each
    chosen expert's probability over the sum of the chosen ones (with top_k = 1: the probability
    itself, Switch Transformer's gate, as gpt/model/electives/moe.py has it), 0 for the others.

    The experts are picked one at a time, each the most probable of those left: a strict > keeps
    the first of equal probabilities, the lower expert number, which is the order the module's
    stable sort gives (gpt/model/electives/moe.py), so both choose the same experts. The chosen probabilities
    are summed in the order they were picked, as the module sums them."""
    E = probs.shape[0]
    zero = probs.dtype.type(0)
    row_max = router_logits[0]
    for e in range(1, E):
        if router_logits[e] > row_max:
            row_max = router_logits[e]
    total = zero
    for e in range(E):
        probs[e] = exp_of_nonpositive(router_logits[e] - row_max)
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
        picked = probs.dtype.type(1)  # Switch's gate: the probability, not p / p = 1
    for e in range(E):
        if chosen[e]:
            gates[e] = probs[e] / picked


@kernel(tag=FAST)
def activate(rows, c_up, slot, c_up_bias, layer, e, hidden, up):
    """An expert's activation of hidden (m, F) = rows @ c_fc + b, in place: GELU, or SwiGLU's
    silu(hidden) * (rows @ c_up + b) when the model has c_up (None for GELU, for which Numba
    compiles the GELU branch alone). up (m, F) is scratch."""
    if c_up is None:
        gelu_in_place(hidden)
        return
    linear(rows, c_up, slot, c_up_bias[layer, e], up)
    swiglu_in_place(hidden, up)


@kernel(tag=FAST)
def gelu_in_place(h):
    """h (n, F) = h/2 (1 + tanh(k (h + 0.044715 h³))), k = √(2/π): GELU's tanh form, as the module's MLP."""
    real = h.dtype.type
    half, one, k, cubic = real(0.5), real(1), real(SQRT_2_OVER_PI), real(CUBIC)
    for r in range(h.shape[0]):
        row = h[r]
        for i in range(row.shape[0]):
            x = row[i]
            row[i] = half * x * (one + tanh(k * (x + cubic * x * x * x)))


@kernel(tag=FAST)
def swiglu_in_place(gate, up):
    """gate (n, F) = silu(gate) * up = gate σ(gate) up."""
    for r in range(gate.shape[0]):
        gate_row, up_row = gate[r], up[r]
        for i in range(gate_row.shape[0]):
            gate_row[i] = gate_row[i] * sigmoid(gate_row[i]) * up_row[i]
