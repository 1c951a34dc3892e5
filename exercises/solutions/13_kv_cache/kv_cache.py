"""Exercise 13: a KV cache that equals recomputation. The reference solution.

    full forward:  O = softmax(q kᵀ / √D, causal) v for all T positions at once
    cached:        each step appends its k, v to the cache; its queries attend over every cached position
"""
import math

import numpy as np

from microtensor.errors import InputError


class SelfAttention:
    """The weights of one causal self-attention layer with H heads of size D (C = H D), and the
    projections around the attention itself: x (B, T, C) -> q, k, v (B, H, T, D), and the heads'
    outputs (B, H, T, D) -> (B, T, C). No position encoding: the order only enters through the mask."""

    def __init__(self, n_embd, n_head, seed=0, dtype=np.float64):
        if n_embd % n_head:
            raise InputError(f"SelfAttention: n_embd ({n_embd}) must be divisible by n_head ({n_head})")
        rng = np.random.default_rng(seed)
        self.n_head, self.head_size = n_head, n_embd // n_head
        self.w_qkv = (rng.normal(size=(n_embd, 3 * n_embd)) / math.sqrt(n_embd)).astype(dtype)  # (C, 3C)
        self.w_proj = (rng.normal(size=(n_embd, n_embd)) / math.sqrt(n_embd)).astype(dtype)  # (C, C)

    def project(self, x):
        """x (B, T, C) -> q, k, v, each (B, H, T, D): one product, split into queries, keys, values and heads."""
        B, T, _ = x.shape
        qkv = x @ self.w_qkv  # (B, T, 3C)
        heads = qkv.reshape(B, T, 3, self.n_head, self.head_size).transpose(2, 0, 3, 1, 4)  # (3, B, H, T, D)
        return heads[0], heads[1], heads[2]

    def merge(self, y):
        """y (B, H, T, D), the heads' outputs -> (B, T, C): heads side by side, then the output projection."""
        B, H, T, D = y.shape
        return y.transpose(0, 2, 1, 3).reshape(B, T, H * D) @ self.w_proj


class KVCache:
    """The keys and values of every position seen so far, for B sequences of H heads: arrays
    (B, H, capacity, D), of which the first `length` positions hold data."""

    def __init__(self, batch, n_head, capacity, head_size, dtype=np.float64):
        self.keys = np.zeros((batch, n_head, capacity, head_size), dtype=dtype)  # (B, H, capacity, D)
        self.values = np.zeros((batch, n_head, capacity, head_size), dtype=dtype)
        self.length = 0  # how many positions hold keys and values

    @property
    def capacity(self):
        return self.keys.shape[2]

    def append(self, k, v):
        """Store k, v (B, H, Tn, D), the Tn newest positions, after the `length` already cached;
        return the keys and values of all positions so far, each (B, H, length, D)."""
        new = k.shape[2]
        if self.length + new > self.capacity:
            raise InputError(
                f"KVCache.append: {new} new positions after the {self.length} cached do not fit "
                f"a cache of capacity {self.capacity}"
            )
        self.keys[:, :, self.length : self.length + new] = k
        self.values[:, :, self.length : self.length + new] = v
        self.length += new
        return self.keys[:, :, : self.length], self.values[:, :, : self.length]

    def reset(self):
        """Forget every cached position, for a new sequence (the arrays are kept, to be written over)."""
        self.length = 0


def attend(q, keys, values):
    """q (B, H, Tn, D): the queries of the Tn newest positions; keys, values (B, H, Tc, D): every
    cached position, the Tn new ones last -> the new positions' outputs (B, H, Tn, D)."""
    Tn, D = q.shape[2], q.shape[3]
    Tc = keys.shape[2]
    scores = q @ np.swapaxes(keys, 2, 3) / math.sqrt(D)  # (B, H, Tn, Tc)
    # new query i sits at position Tc - Tn + i and sees the keys j <= Tc - Tn + i
    visible = np.arange(Tc)[None, :] <= (Tc - Tn + np.arange(Tn))[:, None]  # (Tn, Tc)
    scores = np.where(visible, scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))  # the row's max first: no overflow
    weights /= weights.sum(axis=-1, keepdims=True)  # P (B, H, Tn, Tc), each row sums to 1
    return weights @ values  # (B, H, Tn, D)


class CachedSelfAttention:
    """Generation through one attention layer: feed it the next positions' x, get their outputs,
    with the keys and values of the earlier positions read from the cache, not recomputed."""

    def __init__(self, attention, batch, capacity, dtype=np.float64):
        self.attention = attention
        self.cache = KVCache(batch, attention.n_head, capacity, attention.head_size, dtype)

    def step(self, x):
        """x (B, Tn, C): the next Tn positions (a prompt, or one new token) -> their outputs (B, Tn, C)."""
        q, k, v = self.attention.project(x)  # (B, H, Tn, D) each
        keys, values = self.cache.append(k, v)  # (B, H, length, D): the new ones included
        return self.attention.merge(attend(q, keys, values))
