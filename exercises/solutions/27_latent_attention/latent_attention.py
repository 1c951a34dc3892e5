"""Exercise 27: latent attention's absorbed decode step. The task is in README.md; write the TODOs below.

One new token, H heads of size D, a cache of S positions, each a latent c_j (L numbers) and a
rotary key r_j (R numbers, shared by every head; R may be 0):

    q (H, D), q_rope (H, R)          the token's content and rotary queries, per head
    latent (S, L), rope_keys (S, R)  the cache
    w_uk, w_uv (L, H D)              the up-projections: head h's keys c_j w_uk[:, h D:(h+1) D], its values likewise
    out (H, D)                       each head's attention output, before the heads are merged
"""
import numpy as np


def absorb_queries(q, w_uk):
    """q (H, D), w_uk (L, H D) -> (H, L): each head's query moved into the latent's space, q_h W_UK,hᵀ,
    so that q_latent[h] · c_j equals q[h] · (c_j W_UK,h) for every latent c_j."""
    H, D = q.shape
    L = w_uk.shape[0]
    w_uk_heads = w_uk.reshape(L, H, D)  # (L, H, D): [:, h] is head h's W_UK,h
    return np.einsum("hd,lhd->hl", q, w_uk_heads)  # (H, L)


def absorbed_step(q, q_rope, latent, rope_keys, w_uk, w_uv):
    """The new token's output per head (H, D), from the cache as it is: no (S, H D) keys or values."""
    H, D = q.shape
    L, R = latent.shape[1], rope_keys.shape[1]
    q_latent = absorb_queries(q, w_uk)  # (H, L)
    scores = (q_latent @ latent.T + q_rope @ rope_keys.T) / (D + R) ** 0.5  # (H, S): a Python float keeps float32 float32
    p = np.exp(scores - scores.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)  # (H, S)
    mixed = p @ latent  # (H, L): Σ_j p_hj c_j
    w_uv_heads = w_uv.reshape(L, H, D)  # (L, H, D)
    return np.einsum("hl,lhd->hd", mixed, w_uv_heads)  # (H, D): head h's mixed latent times W_UV,h
