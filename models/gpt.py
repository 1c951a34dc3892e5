"""A small GPT, built only from microtensor ops and modules, with nanoGPT's parameter names.

    idx (B, T) -> wte(idx) [+ wpe(positions)] -> n_layer × Block -> ln_f -> logits (B, T, V)
    Block:  x = x + attn(norm_1(x));  x = x + mlp(norm_2(x))          (pre-norm, residual stream)

Every gradient flows through ops whose backward is hand-written and gradient-checked: there is no
numpy math in the forward pass. Options (`GPTConfig`), each explained in docs/:
- norm: LayerNorm or RMSNorm; mlp: GELU, SwiGLU, or a mixture of experts ("moe": n_expert GELU
  MLPs, each token routed to expert_top_k of them, with a load-balancing loss, models/moe.py);
- pos: learned positions (a table of block_size rows), rotary ("rope", applied to q and k),
  sinusoidal (a fixed sin/cos table added to the embeddings) or ALiBi (a per-head penalty on the
  scores that grows with distance, no table at all); all but learned can run past block_size;
- n_kv_head: key/value heads shared by groups of query heads (1 is multi-query attention);
- attention: the standard kernel, which keeps the (T, T) probabilities for backward, or "online",
  FlashAttention's tiles with a running max and sum, which keeps only one number per row;
- biases, and tied input/output embeddings (logits = x @ wteᵀ, so `lm_head.weight` exists only
  when untied).
The options combine freely.

Generation (`generate`, `generate_tokens`) runs without gradients and, by default, with a KV cache:
each layer keeps its keys and values in arrays (B, Hk, block_size, D) with a write position (Hk =
n_kv_head), so a new token costs one token's work. The prompt (many tokens at once) goes through the modules above, which
fill the caches, and so does every later token under the readable kernel set. Under the fast set
(`mt.set_kernels("fast")`, the default), a one-token step is instead one kernel call for the whole
model (`microtensor/fast/decode.py`): the same logits, the same cache arrays written. The context
window rule (`window_start`), shared by the cached and uncached paths so that both compute the same
logits: the model sees the tokens from `start` on; once they would exceed block_size, `start` jumps
forward so that the last max(1, block_size // 2) tokens remain, and the cache is rebuilt from those
(positions restart at 0 in the new window).

Every argument is checked before any kernel runs (`GPTConfig`'s fields, the token ids against the
vocabulary, the sampling options, the caches' positions): the kernels index without bounds checks,
so an id outside the vocabulary would otherwise read outside the embedding table.
"""
import math
from dataclasses import asdict, dataclass

import numpy as np

import microtensor as mt
import microtensor.functional as F
from microtensor import InputError, InputTypeError, nn
from microtensor.nn import sinusoidal_embedding

SINGLE_THREAD_TOKENS = 16  # generation steps over at most this many tokens run the kernels on one thread


@dataclass
class GPTConfig:
    vocab_size: int
    block_size: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = False
    norm: str = "layernorm"  # or "rmsnorm"
    mlp: str = "gelu"  # or "swiglu", or "moe" (a mixture of n_expert GELU MLPs, expert_top_k per token)
    pos: str = "learned"  # or "rope", "sinusoidal", "alibi"
    tie_weights: bool = True
    n_kv_head: int | None = None  # key/value heads: None or n_head is multi-head, 1 multi-query, else grouped
    attention: str = "standard"  # or "online": the FlashAttention-style kernel that never stores (T, T)
    n_expert: int = 4  # experts of the "moe" MLP
    expert_top_k: int = 2  # experts each token is routed to

    def __post_init__(self):
        """Check every field, types first (a float size or a string flag is refused, not rounded or
        read as true); numpy integers become Python ints, so that `to_dict()` is plain JSON."""
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head if _is_int(self.n_head) else None
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "n_kv_head", "n_expert", "expert_top_k"):
            value = getattr(self, name)
            if not _is_int(value):
                raise InputTypeError(f"GPTConfig: {name} must be an int, got {type(value).__name__} {value!r}")
            if value < 1:
                raise InputError(f"GPTConfig: {name} must be a positive integer, got {value}")
            setattr(self, name, int(value))
        if self.n_embd % self.n_head:
            raise InputError(f"GPTConfig: n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.n_head % self.n_kv_head:
            raise InputError(
                f"GPTConfig: n_kv_head ({self.n_kv_head}) must divide n_head ({self.n_head}): each key/value head "
                "serves a group of n_head / n_kv_head query heads"
            )
        if self.expert_top_k > self.n_expert:
            raise InputError(
                f"GPTConfig: expert_top_k ({self.expert_top_k}) must be at most n_expert ({self.n_expert}): "
                "a token cannot be routed to more experts than there are"
            )
        choices = {
            "norm": ("layernorm", "rmsnorm"),
            "mlp": ("gelu", "swiglu", "moe"),
            "pos": POSITION_SCHEMES,
            "attention": ("standard", "online"),
        }
        for name, allowed in choices.items():
            value = getattr(self, name)
            if not isinstance(value, str):
                raise InputTypeError(f"GPTConfig: {name} must be one of {allowed}, got {type(value).__name__} {value!r}")
            if value not in allowed:
                raise InputError(f"GPTConfig: {name} must be one of {allowed}, got {value!r}")
        if self.pos == "rope" and (self.n_embd // self.n_head) % 2:
            raise InputError(f"GPTConfig: rope needs an even head size, got {self.n_embd // self.n_head}")
        if self.pos == "sinusoidal" and self.n_embd % 2:
            raise InputError(f"GPTConfig: sinusoidal positions pair a sine and a cosine, so n_embd must be even, got {self.n_embd}")
        for name in ("bias", "tie_weights"):
            value = getattr(self, name)
            if not isinstance(value, (bool, np.bool_)):
                raise InputTypeError(f"GPTConfig: {name} must be True or False, got {type(value).__name__} {value!r}")
            setattr(self, name, bool(value))
        if not _is_real(self.dropout):
            raise InputTypeError(f"GPTConfig: dropout must be a number, got {type(self.dropout).__name__} {self.dropout!r}")
        if not 0 <= self.dropout < 1:
            raise InputError(f"GPTConfig: dropout must be in [0, 1), got {self.dropout}")
        self.dropout = float(self.dropout)

    def to_dict(self):
        return asdict(self)


POSITION_SCHEMES = ("learned", "rope", "sinusoidal", "alibi")


def _is_int(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_real(value):
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _norm(config, dtype):
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd, dtype=dtype)
    return nn.LayerNorm(config.n_embd, bias=config.bias, dtype=dtype)


class KVCache:
    """One layer's keys and values for generation: (B, Hk, block_size, D) arrays and a write position,
    Hk = n_kv_head (grouped-query attention stores only the shared heads). GPT.new_caches makes them
    views of two arrays (n_layer, B, Hk, block_size, D), which the fast set's decode kernel takes whole."""

    def __init__(self, k, v):
        self.k, self.v = k, v  # each (B, Hk, block_size, D)
        self.length = 0  # how many positions hold keys and values

    def append(self, k, v):
        """Write the new keys and values (B, Hk, T, D); return all of them so far as tensors."""
        T = k.shape[2]
        if self.length + T > self.k.shape[2]:
            raise InputError(
                f"KVCache: {T} new positions after {self.length} do not fit a cache of {self.k.shape[2]} positions"
            )
        self.k[:, :, self.length : self.length + T] = k.data
        self.v[:, :, self.length : self.length + T] = v.data
        self.length += T
        return mt.Tensor(self.k[:, :, : self.length]), mt.Tensor(self.v[:, :, : self.length])


class CausalSelfAttention(nn.Module):
    """n_head query heads over n_kv_head key/value heads (grouped-query attention: each key/value head
    serves n_head / n_kv_head query heads; multi-head when they are equal). One Linear layer makes the
    queries, keys and values side by side: qkv (B, T, (H + 2 Hk) D)."""

    def __init__(self, config, dtype):
        super().__init__()
        self.n_head, self.n_kv_head, self.pos = config.n_head, config.n_kv_head, config.pos
        head_size = config.n_embd // config.n_head
        width = (config.n_head + 2 * config.n_kv_head) * head_size
        self.c_attn = nn.Linear(config.n_embd, width, bias=config.bias, dtype=dtype)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias, dtype=dtype)
        self.resid_dropout = nn.Dropout(config.dropout)
        # ALiBi's per-head slopes: a constant, not a parameter (None: no bias on the scores)
        self.alibi_slopes = F.alibi_slopes(config.n_head).astype(dtype) if config.pos == "alibi" else None
        if config.attention == "online":
            self.attend, self.attend_packed = F.online_attention, F.multi_head_online_attention
        else:
            self.attend, self.attend_packed = F.scaled_dot_product_attention, F.multi_head_attention

    def forward(self, x, cache=None, offset=0):
        B, T, C = x.shape
        H, Hk = self.n_head, self.n_kv_head
        qkv = self.c_attn(x)  # (B, T, (H + 2 Hk) D)
        if cache is None and self.pos != "rope":
            # training: split into heads, attend, merge, all in one op (equal to the steps below)
            y = self.attend_packed(qkv, H, n_kv_head=Hk, alibi_slopes=self.alibi_slopes)  # (B, T, C)
            return self.resid_dropout(self.c_proj(y))
        heads = qkv.reshape(B, T, H + 2 * Hk, C // H).permute(0, 2, 1, 3)  # (B, H + 2 Hk, T, D)
        q, k, v = heads[:, :H], heads[:, H : H + Hk], heads[:, H + Hk :]  # (B, H, T, D), (B, Hk, T, D) twice
        if self.pos == "rope":
            q, k = F.rope(q, offset), F.rope(k, offset)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, Hk, offset + T, D): the queries are the last T positions
        y = self.attend(q, k, v, causal=True, alibi_slopes=self.alibi_slopes)  # (B, H, T, D)
        y = y.permute(0, 2, 1, 3).reshape(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """GELU: c_proj(gelu(c_fc(x))), hidden 4C. SwiGLU: c_proj(swiglu(c_fc(x), c_up(x))) with hidden
    width round(8C/3) to a multiple of 8, which keeps the parameter count of the GELU MLP."""

    def __init__(self, config, dtype):
        super().__init__()
        self.kind = config.mlp
        C = config.n_embd
        hidden = 4 * C if config.mlp == "gelu" else 8 * math.ceil(8 * C / 3 / 8)
        self.c_fc = nn.Linear(C, hidden, bias=config.bias, dtype=dtype)
        if config.mlp == "swiglu":
            self.c_up = nn.Linear(C, hidden, bias=config.bias, dtype=dtype)
        self.c_proj = nn.Linear(hidden, C, bias=config.bias, dtype=dtype)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        if self.kind == "swiglu":
            h = F.swiglu(self.c_fc(x), self.c_up(x))
        else:
            h = F.gelu(self.c_fc(x), approximate="tanh")
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    def __init__(self, config, dtype):
        super().__init__()
        self.ln_1 = _norm(config, dtype)
        self.attn = CausalSelfAttention(config, dtype)
        self.ln_2 = _norm(config, dtype)
        if config.mlp == "moe":
            from models.moe import MixtureOfExperts

            hidden = 4 * config.n_embd  # each expert is as wide as the dense GELU MLP
            self.mlp = MixtureOfExperts(
                config.n_embd, config.n_expert, config.expert_top_k, hidden, config.bias, dtype, dropout=config.dropout
            )
        else:
            self.mlp = MLP(config, dtype)

    def forward(self, x, cache=None, offset=0):
        x = x + self.attn(self.ln_1(x), cache, offset)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config, dtype=mt.float32):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise InputTypeError(f"GPT: expected a GPTConfig, got {type(config).__name__}")
        self.config = config
        parts = {"wte": nn.Embedding(config.vocab_size, config.n_embd, dtype=dtype)}
        if config.pos == "learned":
            parts["wpe"] = nn.Embedding(config.block_size, config.n_embd, dtype=dtype)
        parts["drop"] = nn.Dropout(config.dropout)
        parts["h"] = nn.ModuleList([Block(config, dtype) for _ in range(config.n_layer)])
        parts["ln_f"] = _norm(config, dtype)
        self.transformer = nn.ModuleDict(parts)
        if not config.tie_weights:
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False, dtype=dtype)
        self._init_weights()

    def _init_weights(self):
        """GPT-2's: weights N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 n_layer)) (each block
        adds two of them to the residual stream), biases 0, norm weights 1."""
        rng = mt.get_generator()
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                p.data[...] = 0
            elif ".ln_" in name or name.startswith("transformer.ln_f"):
                p.data[...] = 1
            else:
                std = 0.02 / math.sqrt(2 * self.config.n_layer) if name.endswith("c_proj.weight") else 0.02
                p.data[...] = rng.normal(0.0, std, p.shape)

    def forward(self, idx, targets=None, caches=None, offset=0):
        """idx (B, T) int -> (logits (B, T, V), loss or None). With caches, idx holds the tokens at
        positions offset .. offset + T - 1 of the window, and their keys and values are appended."""
        if not isinstance(idx, mt.Tensor):
            idx = np.asarray(idx)
            if idx.dtype.kind not in "iu":  # before mt.tensor, which would take floats or strings
                raise InputError(f"GPT: idx must be an integer tensor (B, T), got {idx.dtype} of shape {idx.shape}")
            idx = mt.tensor(idx)
        if idx.ndim != 2 or idx.dtype.kind not in "iu":
            raise InputError(f"GPT: idx must be an integer tensor (B, T), got {idx.dtype} of shape {idx.shape}")
        B, T = idx.shape
        _check_ids("GPT", idx.data, self.config.vocab_size)
        if not _is_int(offset) or offset < 0:
            raise InputError(f"GPT: offset must be an int >= 0, got {offset!r}")
        if offset + T > self.config.block_size and (self.config.pos == "learned" or caches is not None):
            # rope, sinusoidal and alibi compute positions on the fly, so a forward without caches may go
            # past block_size (to measure how a model extrapolates); a learned table has no such rows
            raise InputError(
                f"GPT: a sequence of {offset + T} tokens is longer than block_size {self.config.block_size}"
                + (" (the learned position table has block_size rows)" if self.config.pos == "learned" else "")
            )
        if caches is not None:
            self._check_caches(caches, B, offset)
        x = self.transformer.wte(idx)  # (B, T, C)
        if self.config.pos == "learned":
            x = x + self.transformer.wpe(mt.arange(offset, offset + T))
        elif self.config.pos == "sinusoidal":
            x = x + mt.tensor(sinusoidal_embedding(offset, T, self.config.n_embd, x.dtype))  # (T, C), a constant
        x = self.transformer.drop(x)
        for layer, block in enumerate(self.transformer.h):
            x = block(x, None if caches is None else caches[layer], offset)
        x = self.transformer.ln_f(x)
        if self.config.tie_weights:
            wte = self.transformer.wte
            # a quantized table (models/quantize.py) computes x @ wteᵀ from its codes: there is no float weight
            logits = x @ wte.weight.T if isinstance(wte, nn.Embedding) else wte.tied_head(x)  # (B, T, C) @ (C, V)
        else:
            logits = self.lm_head(x)
        loss = None if targets is None else F.cross_entropy(logits, targets)
        return logits, loss

    def moe_aux_loss(self):
        """The sum over blocks of the mixture-of-experts load-balancing loss of the last forward (a
        Tensor; add it to the loss with a coefficient), or None when the MLPs are not experts."""
        from models.moe import total_aux_loss

        return total_aux_loss(self)

    def tokens_per_expert(self):
        """(n_layer, n_expert) ints: how many tokens each block routed to each expert in the last forward."""
        if self.config.mlp != "moe":
            raise InputError("GPT.tokens_per_expert: this model has no experts (mlp is not 'moe')")
        return np.stack([block.mlp.tokens_per_expert for block in self.transformer.h])

    def kv_cache_bytes_per_token(self):
        """Bytes of keys and values the cache keeps for each token: 2 · n_layer · n_kv_head · D numbers."""
        c = self.config
        return 2 * c.n_layer * c.n_kv_head * (c.n_embd // c.n_head) * self.transformer.wte.weight.dtype.itemsize

    def _check_caches(self, caches, batch, offset):
        """The caches a forward appends to: one KVCache per layer, for this batch, holding exactly the
        `offset` positions before the new tokens (else the new keys would land at other positions
        than the ones their queries are given)."""
        c = self.config
        if not isinstance(caches, (list, tuple)) or len(caches) != c.n_layer or not all(isinstance(x, KVCache) for x in caches):
            raise InputTypeError(f"GPT: caches must be a list of {c.n_layer} KVCaches (from new_caches), got {caches!r:.80}")
        shape = (batch, c.n_kv_head, None, c.n_embd // c.n_head)
        for layer, cache in enumerate(caches):
            k_shape = cache.k.shape
            if cache.k.ndim != 4 or (k_shape[0], k_shape[1], k_shape[3]) != (batch, c.n_kv_head, c.n_embd // c.n_head) or cache.v.shape != k_shape:
                raise InputError(f"GPT: the cache of layer {layer} holds keys {k_shape} and values {cache.v.shape}, expected {shape}")
            if cache.length != offset:
                raise InputError(
                    f"GPT: offset is {offset}, but the cache of layer {layer} holds {cache.length} positions; "
                    "the new tokens' positions must start where the cache ends"
                )

    # ------------------------------------------------------------------------------ generation

    def new_cache_arrays(self, batch):
        """Zeroed keys and values of every layer: two arrays (n_layer, B, Hk, block_size, D), Hk = n_kv_head."""
        if not _is_int(batch) or batch < 1:
            raise InputError(f"GPT.new_cache_arrays: batch must be an int >= 1, got {batch!r}")
        c = self.config
        dtype = self.transformer.wte.weight.dtype
        keys = np.zeros((c.n_layer, batch, c.n_kv_head, c.block_size, c.n_embd // c.n_head), dtype=dtype)
        return keys, np.zeros_like(keys)

    def new_caches(self, batch, arrays=None):
        """One empty KVCache per layer, over `arrays` (keys, values), each (n_layer, B, Hk, block_size, D),
        or over new zeroed ones."""
        keys, values = self.new_cache_arrays(batch) if arrays is None else arrays
        return [KVCache(k, v) for k, v in zip(keys, values)]

    def generate_tokens(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_kv_cache=True, seed=None):
        """Yield (next token ids (B,), their logits (B, V)) one step at a time; see the module
        docstring for the window rule past block_size. Every argument is checked here, when called,
        not at the first step (see `generate` for their meaning)."""
        prompt = _check_prompt("generate_tokens", idx, self.config.vocab_size)
        _check_generation_options("generate_tokens", max_new_tokens, temperature, top_k, top_p, use_kv_cache, seed)
        return self._generate_tokens(prompt, max_new_tokens, temperature, top_k, top_p, use_kv_cache, seed)

    def fits_decode_kernel(self):
        """Whether the fast set's one-token kernel (microtensor/fast/decode.py) can run this model as it
        is now: its options (decode_kernel_fits), and every layer's weight a plain float matrix. The
        kernel reads each layer's weight only, so quantized layers and unmerged LoRA adapters
        (models/quantize.py, models/lora.py) take the modules' path."""
        from models.lora import has_lora

        return decode_kernel_fits(self.config) and getattr(self, "quantization", None) is None and not has_lora(self)

    def _generate_tokens(self, idx, max_new_tokens, temperature, top_k, top_p, use_kv_cache, seed):
        rng = np.random.default_rng(seed)
        block = self.config.block_size
        # A prompt longer than the block starts with its last block_size tokens.
        start, caches, fed = max(0, idx.shape[1] - block), None, 0  # fed: tokens of the window in the cache
        if use_kv_cache:
            keys, values = self.new_cache_arrays(idx.shape[0])  # (n_layer, B, H, block, D), reused by every window
        decode_weights = None  # the fast set's copy of the weights, gathered at its first one-token step
        fits_decode = self.fits_decode_kernel()
        was_training = self.training
        self.eval()
        try:
            with mt.no_grad():
                for _ in range(max_new_tokens):
                    new_start = window_start(idx.shape[1], start, block)
                    if new_start != start:
                        start, caches = new_start, None
                    window = idx[:, start:]
                    if caches is None and use_kv_cache:
                        # the old window's entries need no clearing: attention reads positions < length only
                        caches, fed = self.new_caches(idx.shape[0], (keys, values)), 0
                    new_tokens = window[:, fed:] if use_kv_cache else window
                    if use_kv_cache and new_tokens.shape[1] == 1 and mt.get_kernels() == "fast" and fits_decode:
                        # fast path: one kernel over every layer replaces this token's trip through the modules
                        from microtensor.fast import decode

                        if decode_weights is None:
                            decode_weights = decode.decode_weights(self)  # a copy, kept for the whole generation
                        last = decode.decode(decode_weights, new_tokens[:, 0], fed, keys, values)  # (B, V)
                        fed = window.shape[1]
                        for cache in caches:
                            cache.length = fed
                    else:
                        # a few tokens are too little work to share: waking a thread costs more (mt.num_threads)
                        with mt.num_threads(1 if new_tokens.size <= SINGLE_THREAD_TOKENS else None):
                            if use_kv_cache:
                                logits, _ = self(new_tokens, caches=caches, offset=fed)
                                fed = window.shape[1]
                            else:
                                logits, _ = self(window)
                        last = logits.data[:, -1, :]  # (B, V)
                    token = sample(last, temperature, top_k, top_p, rng)
                    idx = np.concatenate([idx, token[:, None]], axis=1)
                    yield token, last
        finally:
            self.train(was_training)

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_kv_cache=True, seed=None):
        """idx (B, T) -> (B, T + max_new_tokens) int tensor: greedy when temperature is 0, else sampled
        from softmax(logits / temperature), optionally limited to the top_k tokens or to the smallest
        set whose probability reaches top_p.

        idx: integer ids in [0, vocab_size), B >= 1 sequences of T >= 1 tokens (a Tensor, an array or
        nested lists); max_new_tokens an int >= 0; temperature a finite number >= 0; top_k None or
        an int >= 1 (more than the vocabulary keeps every token); top_p None or a number in (0, 1];
        use_kv_cache True or False; seed None or an int >= 0.
        """
        prompt = _check_prompt("generate", idx, self.config.vocab_size)
        _check_generation_options("generate", max_new_tokens, temperature, top_k, top_p, use_kv_cache, seed)
        tokens = [t for t, _ in self._generate_tokens(prompt, max_new_tokens, temperature, top_k, top_p, use_kv_cache, seed)]
        new = np.stack(tokens, axis=1) if tokens else np.zeros((prompt.shape[0], 0), dtype=np.int64)
        return mt.tensor(np.concatenate([prompt, new], axis=1))


def decode_kernel_fits(config):
    """Whether the fast set's one-token kernel (microtensor/fast/decode.py) covers this model; the
    others take each token through the modules, with the same results. It covers every option of
    GPTConfig today: any n_kv_head, every position scheme, both norms, every MLP (the mixture of
    experts routes the one token as the module does), and both attention kernels (the same math).
    The options are listed, not assumed, so that an option added later takes the module path until
    the kernel learns it."""
    return (
        config.norm in ("layernorm", "rmsnorm")
        and config.mlp in ("gelu", "swiglu", "moe")
        and config.pos in ("learned", "rope", "sinusoidal", "alibi")
        and config.attention in ("standard", "online")
    )


def window_start(length, start, block_size):
    """The context window rule: where the window of a sequence of `length` tokens starts, given that
    it started at `start` so far. It stays while the window holds at most block_size tokens; past
    that it jumps forward so that the last max(1, block_size // 2) tokens remain (at least one: with
    block_size 1 the window is the last token alone). Jumping by half a block, not by one token,
    lets the cache serve block_size // 2 tokens before the next rebuild."""
    if length - start <= block_size:
        return start
    return length - max(1, block_size // 2)


def sample(logits, temperature, top_k, top_p, rng):
    """Next token ids (B,) from last-position logits (B, V): the argmax when temperature is 0, else a
    draw from softmax(logits / temperature), restricted by `keep_top_k` and then `keep_top_p`."""
    if not np.isfinite(logits).all():
        raise InputError("generate: the model's logits hold an inf or a nan (are its weights finite?)")
    if temperature == 0:
        return logits.argmax(axis=-1)
    _check_generation_options("generate", 0, temperature, top_k, top_p, True, None)
    logits = logits.astype(np.float64) / temperature
    if top_k is not None:
        logits = keep_top_k(logits, top_k)
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    if top_p is not None:
        probs = np.where(keep_top_p(probs, top_p), probs, 0)
        probs /= probs.sum(axis=-1, keepdims=True)
    return np.array([rng.choice(probs.shape[-1], p=row) for row in probs], dtype=np.int64)


def keep_top_k(logits, top_k):
    """logits (B, V) with every token below the top_k-th largest set to -inf. Tokens tied with the
    top_k-th are all kept (as in nanoGPT), so more than top_k may remain; top_k >= V keeps all."""
    kth = np.sort(logits, axis=-1)[:, -min(top_k, logits.shape[-1])][:, None]  # (B, 1)
    return np.where(logits < kth, -np.inf, logits)


def keep_top_p(probs, top_p):
    """Which tokens top-p ("nucleus") sampling keeps, (B, V) bool: the smallest set of the most
    probable tokens whose probabilities add up to at least top_p. A token is kept when the tokens
    ranked above it add up to less than top_p, so the most probable token is always kept.
    (Tokens of equal probability are ranked by id, lower first.)"""
    order = np.argsort(-probs, axis=-1, kind="stable")  # (B, V): ids from the most probable down
    sorted_probs = np.take_along_axis(probs, order, axis=-1)
    above = np.cumsum(sorted_probs, axis=-1) - sorted_probs  # the probability ranked above each token
    keep_sorted = above < top_p
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    return keep


# ================================================================================= checks


def _check_ids(where, ids, vocab_size):
    """Every id in [0, vocab_size): the embedding kernels index the table without bounds checks."""
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        bad = ids[(ids < 0) | (ids >= vocab_size)].flat[0]
        raise InputError(f"{where}: token id {bad} is outside the vocabulary; ids must be in [0, {vocab_size})")


def _check_prompt(where, idx, vocab_size):
    """A prompt (B, T) of integer ids in [0, vocab_size), B >= 1 and T >= 1, as a new int64 array."""
    array = idx.data if isinstance(idx, mt.Tensor) else idx
    try:
        array = np.asarray(array)
    except ValueError:  # ragged nested lists
        raise InputError(f"{where}: idx must be (B, T) integer token ids, got a ragged {type(idx).__name__}") from None
    if array.dtype.kind not in "iu":
        raise InputTypeError(f"{where}: idx must hold integer token ids, got {array.dtype}")
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise InputError(f"{where}: idx must be (B, T) with B >= 1 and T >= 1, got shape {array.shape}")
    _check_ids(where, array, vocab_size)
    return np.array(array, dtype=np.int64)


def _check_generation_options(where, max_new_tokens, temperature, top_k, top_p, use_kv_cache, seed):
    if not _is_int(max_new_tokens) or max_new_tokens < 0:
        raise InputError(f"{where}: max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not _is_real(temperature) or not (math.isfinite(temperature) and temperature >= 0):
        raise InputError(f"{where}: temperature must be a finite number >= 0 (0: greedy), got {temperature!r}")
    if top_k is not None and (not _is_int(top_k) or top_k < 1):
        raise InputError(f"{where}: top_k must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and (not _is_real(top_p) or not 0 < top_p <= 1):
        raise InputError(f"{where}: top_p must be None or a number in (0, 1], got {top_p!r}")
    if not isinstance(use_kv_cache, (bool, np.bool_)):
        raise InputTypeError(f"{where}: use_kv_cache must be True or False, got {use_kv_cache!r}")
    if seed is not None and (not _is_int(seed) or seed < 0):
        raise InputError(f"{where}: seed must be None or an int >= 0, got {seed!r}")
