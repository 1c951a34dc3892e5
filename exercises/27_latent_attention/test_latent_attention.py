"""The checks of exercise 27. Run them with `python -m exercises check latent_attention`."""
import numpy as np

from exercises.checking import expect_close


def cache_and_weights(H, D, L, R, S, seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    draw = lambda *shape: rng.standard_normal(shape).astype(dtype)  # noqa: E731
    return draw(H, D), draw(H, R), draw(S, L), draw(S, R), draw(L, H * D) / np.sqrt(L), draw(L, H * D) / np.sqrt(L)


def expanded_step(q, q_rope, latent, rope_keys, w_uk, w_uv):
    """The naive form: every head's keys and values built from the whole cache, then attention."""
    H, D = q.shape
    R = rope_keys.shape[1]
    out = np.empty_like(q)
    for h in range(H):
        keys = latent @ w_uk[:, h * D : (h + 1) * D]  # (S, D)
        values = latent @ w_uv[:, h * D : (h + 1) * D]  # (S, D)
        scores = (keys @ q[h] + rope_keys @ q_rope[h]) / (D + R) ** 0.5  # (S,)
        p = np.exp(scores - scores.max())
        out[h] = p / p.sum() @ values
    return out


def test_the_absorbed_query_scores_a_latent_as_the_key_would(impl):
    """absorb_queries(q)[h] · c equals q[h] · (c W_UK,h) for random latents c"""
    q, _, latent, _, w_uk, _ = cache_and_weights(H=3, D=4, L=5, R=0, S=6, seed=1)
    expected = np.stack([latent @ w_uk[:, h * 4 : (h + 1) * 4] @ q[h] for h in range(3)])  # (H, S)
    expect_close("absorb_queries(q) @ latentᵀ, 3 heads of 4, latent 5", impl.absorb_queries(q, w_uk) @ latent.T, expected, "q · (c W_UK,h), keys built")


def test_the_absorbed_step_equals_expanding_the_cache(impl):
    """absorbed_step against keys and values built head by head, with and without a rotary key, S = 1 .. 9"""
    for H, D, L, R, S in ((2, 4, 3, 2, 1), (4, 8, 6, 4, 9), (3, 2, 5, 0, 7), (1, 6, 6, 2, 4)):
        inputs = cache_and_weights(H, D, L, R, S, seed=H * 100 + S)
        expect_close(
            f"absorbed_step, {H} heads of {D}, latent {L}, rotary key {R}, {S} cached positions",
            impl.absorbed_step(*inputs), expanded_step(*inputs), "the expanded step", atol=1e-12, rtol=1e-10,
        )  # fmt: skip


def test_large_scores_and_float32(impl):
    """scores of several hundred do not overflow the softmax; float32 in gives float32 out"""
    q, q_rope, latent, rope_keys, w_uk, w_uv = cache_and_weights(2, 4, 3, 2, 5, seed=7)
    big = (q * 300, q_rope, latent, rope_keys, w_uk, w_uv)
    expect_close("absorbed_step with queries 300 times larger", impl.absorbed_step(*big), expanded_step(*big), "the expanded step", atol=1e-9)
    small = [a.astype(np.float32) for a in (q, q_rope, latent, rope_keys, w_uk, w_uv)]
    expected = expanded_step(*small)
    expect_close("absorbed_step in float32", impl.absorbed_step(*small), expected, "the expanded step in float32", atol=1e-5, rtol=1e-4)
