"""Multi-head latent attention (DeepSeek-V2's MLA): the KV cache keeps one small vector per token,
from which every head's keys and values are made (`GPTConfig(attention="latent", kv_latent=d_c)`,
`train.py --attention latent --kv-latent d_c`; docs/electives/latent-attention.md).

Standard attention caches 2 H D = 2C numbers per token and layer (keys and values of every head).
Grouped-query attention shrinks that by sharing heads (2 Hk D). Latent attention instead compresses:

    c     = x W_DKV                          (B, T, d_c)    the latent: all the cache keeps of x
    k_h   = c W_UK,h                         (B, T, D)      head h's keys, made from the latent
    v_h   = c W_UV,h                         (B, T, D)      head h's values
    q_h   = x W_Q,h                          (B, T, D)      queries as usual (not compressed: below)
    y     = concat_h softmax(q_h k_hᵀ / √D) v_h,   then c_proj

W_DKV is `kv_down` (C, d_c); W_UK and W_UV are `k_up` and `v_up` (d_c, H D), head h's columns
h D .. (h + 1) D - 1. Training runs this form ("expanded": the keys and values are built, then the
ordinary attention op runs on them, so its backward is the hand-written one of
microtensor/ops/attention.py).

Absorption: at decode time the keys and values are never built. For one query q_h and a cached c_j,

    q_h · k_h,j = q_h · (c_j W_UK,h) = (q_h W_UK,hᵀ) · c_j              a dot product with the latent
    Σ_j p_j v_h,j = Σ_j p_j c_j W_UV,h = (Σ_j p_j c_j) W_UV,h            the weights applied once, after

so each head's query goes down to the latent's size (q_h W_UK,hᵀ, (B, H, T, d_c)), attends over the
latents themselves as keys and values (one key/value head that every query head shares: multi-query
attention over c), and the (B, H, T, d_c) result goes up through W_UV,h and c_proj. W_UK is absorbed
into the query side and W_UV into the output side; a new token costs O(S H d_c) over S cached
positions, where expanding would cost O(S d_c H D) to rebuild every key and value first.

RoPE, decoupled. A rotary key is k_h,j rotated by R_j, a matrix that depends on the position j; then
q_h · R_j c_j W_UK,h cannot be regrouped as (q_h ...) · c_j with one matrix for every j, and the
absorption fails. DeepSeek-V2's answer, done here: the content parts (above) carry no rotation, and
a separate small part of size d_R (`rope_head_dim`) carries the positions:

    k_R,j = RoPE_j(x_j W_KR)                 (B, T, d_R)    one rotary key, shared by every head, cached beside c
    q_R,h = RoPE_i(x_i W_QR,h)               (B, T, d_R)    each head's rotary query
    score = (q_h · k_h,j + q_R,h · k_R,j) / √(D + d_R)

`kv_down` makes c and x W_KR side by side ((C, d_c + d_R)) and `c_q` makes each head's content and
rotary queries side by side ((C, H (D + d_R))). The cache per token is then d_c + d_R numbers.
Learned and sinusoidal positions are added to the embeddings before any block, and ALiBi lowers
the scores by a distance that does not depend on the keys: all three pass through the latent and
the absorption unchanged, so they apply as they are, and only `rope_head_dim` (which exists only
with rope) is refused with them.

Queries are not compressed. DeepSeek-V2 also sends the queries through a latent, which saves
activation memory in training, not cache: at this size it would add a matrix and save nothing the
cache cares about.

Biases: `kv_down`, `c_q` and `c_proj` follow `bias`; the up-projections have none, so that the
absorbed form is exactly the expanded one (a key bias would add q_h · b to every score of a row, which
softmax ignores, but an exact identity reads better).

Generation runs through these modules: the fast set's one-token kernel (gpt/generation/decode_kernel.py)
reads (n_layer, B, Hk, block_size, D) keys and values, which this model does not have, so
`GPT.new_cache_arrays` returns None and each layer keeps a `LatentCache`.
"""
import math

import numpy as np

import microtensor as mt
import microtensor.functional as F
from microtensor import InputError, InputTypeError, nn
from microtensor.checks import is_integer


def default_rope_head_dim(head_size):
    """Half the head size, rounded down to even (RoPE rotates pairs), at least 2: DeepSeek-V2's ratio."""
    return max(2, head_size // 2 // 2 * 2)


def check_latent_config(config):
    """GPTConfig's checks for attention="latent" (called from its __post_init__, after the common
    ones): fills kv_latent's default (n_embd // 4) and rope_head_dim's (with pos rope), and raises
    ConfigError for a value that cannot work."""
    from gpt.model.transformer import _require

    C, H = config.n_embd, config.n_head
    if config.kv_latent is None:
        config.kv_latent = max(1, C // 4)
    for name in ("kv_latent", "rope_head_dim"):
        value = getattr(config, name)
        if value is not None and not is_integer(value):
            raise InputTypeError(f"GPTConfig: {name} must be an int, got {type(value).__name__} {value!r}")
    config.kv_latent = int(config.kv_latent)
    _require(
        1 <= config.kv_latent <= C, f"kv_latent ({config.kv_latent}) must be between 1 and n_embd ({C}): the latent "
        "compresses a token's width, and a larger one would cache more than the token itself",
        "kv_latent", config.kv_latent, f"an integer in [1, `n_embd`] = [1, {C}]",
    )  # fmt: skip
    _require(
        config.n_kv_head == H, f"n_kv_head ({config.n_kv_head}) has no meaning with attention latent: every head's keys "
        "and values are made from the one latent", "n_kv_head", config.n_kv_head,
        f"unset, or `n_head` ({H}), with `attention` latent (the heads share the latent, not key/value heads)",
    )  # fmt: skip
    if config.pos != "rope":
        _require(
            config.rope_head_dim is None, f"rope_head_dim ({config.rope_head_dim}) is the size of the rotary key, "
            f"which exists only with pos rope, not {config.pos}", "rope_head_dim", config.rope_head_dim,
            f"unset with `pos` {config.pos} (its positions need no rotary key), or `pos` rope",
        )  # fmt: skip
        return
    if config.rope_head_dim is None:
        config.rope_head_dim = default_rope_head_dim(C // H)
    config.rope_head_dim = int(config.rope_head_dim)
    R = config.rope_head_dim
    _require(
        R >= 2 and R % 2 == 0, f"rope_head_dim must be even and >= 2 (RoPE rotates pairs), got {R}",
        "rope_head_dim", R, "an even integer >= 2 (RoPE rotates pairs of numbers)",
    )  # fmt: skip


def rope_size(config):
    """d_R: the rotary part of each query and of the shared key (0 without rope)."""
    return config.rope_head_dim or 0


def parameter_count(config):
    """The numbers one LatentAttention learns: c_q, kv_down, k_up, v_up and c_proj."""
    C, H, L, R = config.n_embd, config.n_head, config.kv_latent, rope_size(config)
    D, bias = C // H, 1 if config.bias else 0
    return (C + bias) * H * (D + R) + (C + bias) * (L + R) + 2 * L * C + (C + bias) * C


def cache_numbers_per_token(config):
    """Numbers the cache keeps per token and layer: the latent and the rotary key, d_c + d_R."""
    return config.kv_latent + rope_size(config)


def activation_numbers(config):
    """Per token, the arrays of one block's attention (before its output) that the graph keeps for
    backward, for training_step_bytes' lower bound: c_q's and kv_down's outputs, the keys and values
    made by k_up and v_up (2C), and with rope the joined queries, keys and values (3 H (D + d_R))."""
    C, H, L, R = config.n_embd, config.n_head, config.kv_latent, rope_size(config)
    D = C // H
    return H * (D + R) + (L + R) + 2 * C + (3 * H * (D + R) if R else 0)


class LatentCache:
    """One layer's cache for latent attention: the latents (B, block_size, d_c) and the rotated
    shared keys (B, block_size, d_R; d_R = 0 without rope), with a write position `length`."""

    def __init__(self, latent, rope_key):
        self.latent, self.rope_key = latent, rope_key
        self.length = 0  # how many positions hold a latent

    @classmethod
    def empty(cls, batch, block_size, kv_latent, rope_head_dim, dtype):
        return cls(np.zeros((batch, block_size, kv_latent), dtype), np.zeros((batch, block_size, rope_head_dim), dtype))

    def append(self, latent, rope_key):
        """Write the new latents (B, T, d_c) and rotary keys (B, T, d_R) or None; return all so far as Tensors."""
        T = latent.shape[1]
        if self.length + T > self.latent.shape[1]:
            raise InputError(f"LatentCache: {T} new positions after {self.length} do not fit a cache of {self.latent.shape[1]} positions")
        end = self.length + T
        self.latent[:, self.length : end] = latent.data
        if rope_key is not None:
            self.rope_key[:, self.length : end] = rope_key.data
        self.length = end
        rope_keys = mt.Tensor(self.rope_key[:, :end]) if rope_key is not None else None
        return mt.Tensor(self.latent[:, :end]), rope_keys

    def reordered(self, rows):
        """A cache whose row r is row rows[r] of this one (new arrays: rows may repeat)."""
        cache = LatentCache(self.latent[rows], self.rope_key[rows])
        cache.length = self.length
        return cache


def new_latent_caches(model, batch):
    """One empty LatentCache per layer of a latent-attention GPT."""
    c = model.config
    dtype = model.transformer.wte.weight.dtype
    return [LatentCache.empty(batch, c.block_size, c.kv_latent, rope_size(c), dtype) for _ in range(c.n_layer)]


def check_latent_caches(model, caches, batch, offset):
    """The caches a forward appends to: one LatentCache per layer, for this batch and these sizes,
    holding exactly the `offset` positions before the new tokens."""
    c = model.config
    if not isinstance(caches, (list, tuple)) or len(caches) != c.n_layer or not all(isinstance(x, LatentCache) for x in caches):
        raise InputTypeError(f"GPT: caches must be a list of {c.n_layer} LatentCaches (from new_caches), got {caches!r:.80}")
    for layer, cache in enumerate(caches):
        latent, rope_key = cache.latent.shape, cache.rope_key.shape
        if latent[0] != batch or latent[2] != c.kv_latent or rope_key[:2] != latent[:2] or rope_key[2] != rope_size(c):
            raise InputError(
                f"GPT: the cache of layer {layer} holds latents {latent} and rotary keys {rope_key}, expected "
                f"({batch}, positions, {c.kv_latent}) and ({batch}, positions, {rope_size(c)})"
            )
        if cache.length != offset:
            raise InputError(
                f"GPT: offset is {offset}, but the cache of layer {layer} holds {cache.length} positions; "
                "the new tokens' positions must start where the cache ends"
            )


class LatentAttention(nn.Module):
    """Causal self-attention whose keys and values are made from a cached latent (the module
    docstring derives it). `absorb`: with a cache, attend over the latents directly (True, the
    default) or expand them into every head's keys and values first (False: the same numbers,
    slower, for the tests and the docs to compare)."""

    fits_decode_kernel = False  # the one-token kernel reads full keys and values, not latents

    def __init__(self, config, dtype):
        super().__init__()
        C, H = config.n_embd, config.n_head
        self.n_head, self.head_size = H, C // H
        self.kv_latent, self.rope_head_dim = config.kv_latent, rope_size(config)
        D, L, R = self.head_size, self.kv_latent, self.rope_head_dim
        self.c_q = nn.Linear(C, H * (D + R), bias=config.bias, dtype=dtype)  # each head's content and rotary queries
        self.kv_down = nn.Linear(C, L + R, bias=config.bias, dtype=dtype)  # W_DKV and W_KR: what the cache keeps
        self.k_up = nn.Linear(L, C, bias=False, dtype=dtype)  # W_UK (d_c, H D)
        self.v_up = nn.Linear(L, C, bias=False, dtype=dtype)  # W_UV (d_c, H D)
        self.c_proj = nn.Linear(C, C, bias=config.bias, dtype=dtype)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.alibi_slopes = F.alibi_slopes(H).astype(dtype) if config.pos == "alibi" else None
        self.absorb = True

    def forward(self, x, cache=None, offset=0):
        B, T, C = x.shape
        H, D, L, R = self.n_head, self.head_size, self.kv_latent, self.rope_head_dim
        q = self.c_q(x).reshape(B, T, H, D + R).permute(0, 2, 1, 3)  # (B, H, T, D + R)
        down = self.kv_down(x)  # (B, T, L + R)
        latent, rope_key = down[:, :, :L], None  # (B, T, L)
        if R:
            rope_key = F.rope(down[:, :, L:], offset)  # (B, T, R): rotated once, read by every head
            q = F.cat([q[:, :, :, :D], F.rope(q[:, :, :, D:], offset)], dim=-1)
        if cache is not None:
            latent, rope_key = cache.append(latent, rope_key)  # (B, S, L), (B, S, R), S = offset + T
        if cache is not None and self.absorb:
            y = self.attend_absorbed(q, latent, rope_key)
        else:
            y = self.attend_expanded(q, latent, rope_key)  # (B, H, T, D)
        y = y.permute(0, 2, 1, 3).reshape(B, T, C)
        return self.resid_dropout(self.c_proj(y))

    def attend_expanded(self, q, latent, rope_key):
        """q (B, H, T, D + R), latent (B, S, L), rope_key (B, S, R) or None -> (B, H, T, D): every
        head's keys and values built from the latents, then the attention op."""
        H, D, R = self.n_head, self.head_size, self.rope_head_dim
        B, S, _ = latent.shape
        k = self.k_up(latent).reshape(B, S, H, D).permute(0, 2, 1, 3)  # (B, H, S, D)
        v = self.v_up(latent).reshape(B, S, H, D).permute(0, 2, 1, 3)  # (B, H, S, D)
        if R:
            zeros = mt.zeros(B, H, S, R, dtype=latent.dtype)
            k = F.cat([k, rope_key.reshape(B, 1, S, R) + zeros], dim=-1)  # (B, H, S, D + R): one rotary key for all heads
            v = F.cat([v, zeros], dim=-1)  # the op takes values as wide as keys; the extra R outputs are dropped
        y = F.scaled_dot_product_attention(q, k, v, causal=True, alibi_slopes=self.alibi_slopes)  # (B, H, T, D + R)
        return y[:, :, :, :D] if R else y

    def attend_absorbed(self, q, latent, rope_key):
        """The same as attend_expanded, with W_UK absorbed into the queries and W_UV applied after
        the attention: the latents are the keys and values of one head that all query heads share."""
        H, D, L, R = self.n_head, self.head_size, self.kv_latent, self.rope_head_dim
        B, S, _ = latent.shape
        k_up_t = self.k_up.weight.reshape(L, H, D).permute(1, 2, 0)  # (H, D, L): each head's W_UKᵀ
        q_latent = q[:, :, :, :D] @ k_up_t if R else q @ k_up_t  # (B, H, T, L)
        keys = latent.reshape(B, 1, S, L)
        if R:
            q_latent = F.cat([q_latent, q[:, :, :, D:]], dim=-1)  # (B, H, T, L + R)
            keys = F.cat([latent, rope_key], dim=-1).reshape(B, 1, S, L + R)
        # the op divides the scores by √(its width, L + R); the model's are divided by √(D + R)
        q_latent = q_latent * math.sqrt((L + R) / (D + R))
        # the keys serve as values too: their first L outputs are Σ_j p_j c_j, the rest are dropped
        mixed = F.scaled_dot_product_attention(q_latent, keys, keys, causal=True, alibi_slopes=self.alibi_slopes)
        mixed = mixed[:, :, :, :L] if R else mixed  # (B, H, T, L)
        v_up = self.v_up.weight.reshape(L, H, D).permute(1, 0, 2)  # (H, L, D): each head's W_UV
        return mixed @ v_up  # (B, H, T, D)
