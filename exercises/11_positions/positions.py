"""Exercise 11: sinusoidal positions and the ALiBi bias. The task is in README.md; write the TODOs below.

    PE[t, 2i] = sin(t ω_i)      PE[t, 2i + 1] = cos(t ω_i)      ω_i = 10000^(−2i / C)
    bias[h, i, j] = −m_h (i − j)  for j ≤ i,      −inf  for j > i (the causal mask)

Both are constants: nothing here is learned, and nothing has a backward.
"""
import numpy as np

from microtensor.kernels import kernel


def sinusoidal_table(T, C, dtype=np.float64):
    """The sinusoidal position table of positions 0 .. T − 1, (T, C), C even: column 2i holds
    sin(t ω_i) and column 2i + 1 holds cos(t ω_i), ω_i = 10000^(−2i / C), for i = 0 .. C/2 − 1.
    Computed in float64, returned in `dtype`."""
    if C % 2:
        raise ValueError(f"sinusoidal_table: C must be even (each sine has its cosine), got {C}")
    # TODO: the positions t (T, 1) and the frequencies ω_i (C/2,) in float64; fill the even columns
    # (table[:, 0::2]) with the sines and the odd ones (table[:, 1::2]) with the cosines of t ω_i;
    # return the table cast to dtype.
    raise NotImplementedError("TODO: sinusoidal_table (exercise 11)")


def alibi_slopes(H):
    """The ALiBi slopes of H heads, (H,) float64. For H a power of two: m_h = 2^(−8 (h + 1) / H),
    h = 0 .. H − 1. Otherwise, with P the largest power of two at most H: the P slopes of P heads,
    then the 1st, 3rd, 5th, ... slopes of 2P heads, as many as the H − P heads left need."""
    # TODO: a helper giving the n slopes of n heads (n a power of two), then the rule above
    # (P = 1 << (H.bit_length() - 1) is the largest power of two at most H).
    raise NotImplementedError("TODO: alibi_slopes (exercise 11)")


@kernel
def alibi_bias_kernel(slopes, bias):
    """bias (H, T, T) from slopes (H,), of one dtype: bias[h, i, j] = −slopes[h] (i − j) where
    key j may be seen by query i (j <= i), −inf where it may not (j > i)."""
    # TODO: three loops over h, i, j. Keep the arithmetic in bias's dtype: the distance i − j is an
    # integer, so convert it with bias.dtype.type(i - j), and take −inf as bias.dtype.type(-np.inf).
    raise NotImplementedError("TODO: alibi_bias_kernel (exercise 11)")


def alibi_bias(slopes, T):
    """The causal ALiBi bias (H, T, T) of T positions, from slopes (H,), in the slopes' dtype:
    what is added to the attention scores q kᵀ / √D (B, H, T, T) before the softmax."""
    slopes = np.ascontiguousarray(slopes)
    if slopes.ndim != 1 or slopes.dtype not in (np.float32, np.float64):
        raise ValueError(f"alibi_bias: slopes must be a float32 or float64 array (H,), got {slopes.dtype} {slopes.shape}")
    bias = np.empty((slopes.shape[0], T, T), dtype=slopes.dtype)  # (H, T, T)
    alibi_bias_kernel(slopes, bias)
    return bias
