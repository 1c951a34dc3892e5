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
    # TODO: reshape w_uk to (L, H, D) so that [:, h] is head h's W_UK,h, and give each head's
    # q[h] @ W_UK,hᵀ (README: Moving the query).
    raise NotImplementedError("TODO: absorb_queries (exercise 27)")


def absorbed_step(q, q_rope, latent, rope_keys, w_uk, w_uv):
    """The new token's output per head (H, D), from the cache as it is: no (S, H D) keys or values."""
    # TODO: the scores of the latent and rotary parts over √(D + R), a stable softmax over the S
    # positions, the mixed latents p @ latent, and each head's through W_UV,h (README: The step).
    raise NotImplementedError("TODO: absorbed_step (exercise 27)")
