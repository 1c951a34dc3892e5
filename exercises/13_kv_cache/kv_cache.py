"""Exercise 13: a KV cache that equals recomputation. The task is in README.md; write the four TODOs below.

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
        # TODO: if the Tn new positions do not fit after the `length` cached ones, raise InputError
        # naming the op, Tn, length and the capacity, and change nothing. Otherwise write k and v
        # into positions length .. length + Tn - 1 of self.keys and self.values, advance length,
        # and return the keys and values of positions 0 .. length - 1 (views: no copy needed).
        raise NotImplementedError("TODO: KVCache.append (exercise 13)")

    def reset(self):
        """Forget every cached position, for a new sequence (the arrays are kept, to be written over)."""
        # TODO: make the cache empty, so that the next append writes from position 0.
        raise NotImplementedError("TODO: KVCache.reset (exercise 13)")


def attend(q, keys, values):
    """q (B, H, Tn, D): the queries of the Tn newest positions; keys, values (B, H, Tc, D): every
    cached position, the Tn new ones last -> the new positions' outputs (B, H, Tn, D)."""
    # TODO: causal attention of the Tn new queries over the Tc cached keys and values, in numpy:
    # S = q kᵀ / √D (B, H, Tn, Tc), -inf where key j comes after query i's position Tc - Tn + i,
    # a softmax along the last axis (subtract the row's max first), then P @ values. Keep the
    # arrays' dtype: float32 inputs give a float32 result.
    raise NotImplementedError("TODO: attend (exercise 13)")


class CachedSelfAttention:
    """Generation through one attention layer: feed it the next positions' x, get their outputs,
    with the keys and values of the earlier positions read from the cache, not recomputed."""

    def __init__(self, attention, batch, capacity, dtype=np.float64):
        self.attention = attention
        self.cache = KVCache(batch, attention.n_head, capacity, attention.head_size, dtype)

    def step(self, x):
        """x (B, Tn, C): the next Tn positions (a prompt, or one new token) -> their outputs (B, Tn, C)."""
        # TODO: project x into q, k, v, append k and v to self.cache, attend the new queries over
        # everything the cache holds, and merge the heads back (SelfAttention gives project, merge).
        raise NotImplementedError("TODO: CachedSelfAttention.step (exercise 13)")
