"""The checks of exercise 12. Run them with `python -m exercises check sampling`."""
import numpy as np

from exercises.checking import CheckFailed, expect, expect_close, expect_equal, expect_raises
from gpt.generation.sampling import keep_top_k as microtensor_top_k
from gpt.generation.sampling import keep_top_p as microtensor_top_p
from gpt.generation.sampling import sample as microtensor_sample
from gpt.generation.sampling import token_distribution

# The 0.999 quantile of the chi-square distribution with d degrees of freedom, d = 1 .. 8: a right
# sampler exceeds it once in a thousand seeds (and this check's seed is fixed).
CHI_SQUARE_999 = [10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322, 26.124]


def logits_with_ties():
    """(3, 6) logits with tied values, as the checks' batch."""
    return np.array([
        [1.0, 3.0, 3.0, 2.0, 0.0, -1.0],
        [0.5, 0.5, 0.5, 0.5, 0.5, 0.5],
        [-2.0, 4.0, 1.0, 1.0, 3.5, 0.0],
    ])  # fmt: skip


def test_top_k_keeps_ties_like_microtensor(impl):
    """top-k: everything below the k-th largest becomes −inf, ties with it stay (as microtensor's keep_top_k)"""
    logits = logits_with_ties()
    kept = impl.keep_top_k(logits[:1], 2)
    expected = np.array([[-np.inf, 3.0, 3.0, -np.inf, -np.inf, -np.inf]])
    expect(
        np.array_equal(kept, expected),
        f"keep_top_k([1, 3, 3, 2, 0, -1], k=2): yours {kept.tolist()}, expected {expected.tolist()} "
        "(the two 3s are the top 2)",
    )
    for k in range(1, 8):
        expect_equal(f"keep_top_k of (3, 6) logits with ties, k={k}", impl.keep_top_k(logits, k), microtensor_top_k(logits, k),
                     "gpt.generation.sampling.keep_top_k")  # fmt: skip
    single = logits.astype(np.float32)
    expect(impl.keep_top_k(single, 3).dtype == np.float32, "keep_top_k of float32 logits must stay float32")


def test_top_k_returns_a_new_array(impl):
    """keep_top_k returns a new array and leaves the logits it was given unchanged (k < V and k >= V)"""
    for k in (2, 6, 9):  # V = 6: 6 and 9 keep every logit, and the result must still be a new array
        logits = logits_with_ties()
        given = logits.copy()
        kept = impl.keep_top_k(logits, k)
        expect(
            np.array_equal(logits, given),
            f"keep_top_k(logits, k={k}) changed the logits it was given: write the −inf into a new array "
            "(np.where makes one), the caller still needs its logits",
        )
        expect(
            not np.shares_memory(np.asarray(kept), logits),
            f"keep_top_k(logits, k={k}) returned the logits it was given (or a view of them): return a new array, "
            "even when nothing is filtered, so that changing one never changes the other",
        )


def test_top_p_keeps_the_smallest_nucleus(impl):
    """top-p: the fewest most-probable tokens whose mass reaches p; the most probable always stays"""
    probs = np.array([[0.2, 0.5, 0.3]])  # sorted: 0.5 (id 1), 0.3 (id 2), 0.2 (id 0)
    cases = {0.6: [False, True, True], 0.5: [False, True, False], 0.05: [False, True, False], 1.0: [True, True, True]}
    for p, expected in cases.items():
        kept = impl.keep_top_p(probs, p)
        expect(
            np.asarray(kept).dtype == bool and np.array_equal(kept, [expected]),
            f"keep_top_p([0.2, 0.5, 0.3], p={p}): yours {np.asarray(kept).tolist()}, expected {[expected]} "
            "(keep a token while the mass ranked above it is below p)",
        )
    rng = np.random.default_rng(5)
    random_probs = rng.dirichlet(np.ones(6), size=4)  # (4, 6)
    random_probs[0, 1:3] = random_probs[0, 1]  # a tie: ranked by id
    random_probs[0] /= random_probs[0].sum()
    for p in (0.1, 0.33, 0.7, 0.9, 0.999):
        expect_equal(f"keep_top_p of (4, 6) random probabilities, p={p}", impl.keep_top_p(random_probs, p),
                     microtensor_top_p(random_probs, p), "gpt.generation.sampling.keep_top_p")  # fmt: skip


OPTIONS = [  # (temperature, top_k, top_p)
    (1.0, None, None), (0.5, None, None), (2.0, None, None), (1.0, 3, None), (0.8, None, 0.7),
    (1.0, 2, 0.5), (1.3, 4, 0.9), (0.0, None, None), (0.0, 2, 0.5),
]  # fmt: skip


def test_distribution_matches_microtensor(impl):
    """the filtered distribution equals microtensor's token_distribution, for 9 sets of options"""
    logits = logits_with_ties()
    logits[1] = [0.4, 0.3, 0.2, 0.1, 0.0, -0.1]  # order matters: top-k first, then top-p on what is left
    for temperature, top_k, top_p in OPTIONS:
        probs = impl.distribution(logits, temperature, top_k, top_p)
        expected = token_distribution(logits, temperature, top_k, top_p)
        what = f"distribution(temperature={temperature}, top_k={top_k}, top_p={top_p}) of (3, 6) logits"
        expect_close(what, probs, expected, "gpt.generation.sampling.token_distribution", atol=1e-12)
    probs = impl.distribution(logits.astype(np.float32), 0.7, 3, 0.9)
    expect(probs.dtype == np.float64, f"distribution of float32 logits gave {probs.dtype}: compute the probabilities in float64")


def test_temperature_zero_is_greedy(impl):
    """temperature 0 picks each row's argmax (ties: the lower id) and draws nothing from rng"""
    logits = logits_with_ties()
    rng = np.random.default_rng(3)
    tokens = impl.sample(logits, rng, temperature=0.0)
    expect_equal("sample(temperature=0) of (3, 6) logits with ties", tokens, np.array([1, 0, 1]), "the argmax, lower id on ties")
    expect(np.asarray(tokens).dtype == np.int64, f"sample must return int64 token ids, got {np.asarray(tokens).dtype}")
    expect(rng.random() == np.random.default_rng(3).random(), "sample(temperature=0) drew from rng: greedy decoding uses no randomness")


def test_sample_matches_microtensor_sample(impl):
    """with the same seed, sample draws the same tokens as microtensor's own sampler"""
    logits = np.random.default_rng(11).normal(size=(5, 7)) * 2
    for temperature, top_k, top_p in OPTIONS:
        tokens = impl.sample(logits, np.random.default_rng(21), temperature, top_k, top_p)
        expected = microtensor_sample(logits, temperature, top_k, top_p, np.random.default_rng(21))
        expect_equal(f"sample(temperature={temperature}, top_k={top_k}, top_p={top_p}) of (5, 7) logits, seed 21",
                     tokens, expected, "gpt.generation.sampling.sample (one rng.choice(V, p=row) per row, in order)")  # fmt: skip


def test_frequencies_follow_the_filtered_distribution(impl):
    """3000 draws on a vocabulary of 6: frequencies within a chi-square bound, filtered tokens never drawn"""
    logits = np.array([[2.0, 1.0, 0.5, 0.0, -0.5, 1.5]])
    draws = 3000
    for temperature, top_k, top_p in [(1.0, None, None), (0.7, 4, 0.9)]:
        expected = token_distribution(logits, temperature, top_k, top_p)[0]  # (6,)
        tokens = impl.sample(np.repeat(logits, draws, axis=0), np.random.default_rng(8), temperature, top_k, top_p)
        counts = np.bincount(np.asarray(tokens), minlength=6)
        what = f"sample(temperature={temperature}, top_k={top_k}, top_p={top_p}), {draws} draws"
        expect(counts.shape == (6,), f"{what}: token ids outside 0 .. 5: {sorted(set(np.asarray(tokens).tolist()))}")
        kept = expected > 0
        if counts[~kept].any():
            raise CheckFailed(f"{what}: drew the filtered-out tokens {np.flatnonzero(~kept & (counts > 0)).tolist()}")
        chi_square = float(np.sum((counts[kept] - draws * expected[kept]) ** 2 / (draws * expected[kept])))
        bound = CHI_SQUARE_999[kept.sum() - 2]
        expect(
            chi_square < bound,
            f"{what}: counts {counts.tolist()} where {np.round(draws * expected, 1).tolist()} were expected; "
            f"chi-square {chi_square:.1f} > {bound} (the 0.999 quantile)",
        )


def test_bad_options_are_refused(impl):
    """a temperature below 0 or not finite, a k not an integer >= 1 or a p outside (0, 1] raise ValueError"""
    logits, rng = logits_with_ties(), np.random.default_rng(0)
    bad = [
        ("temperature=-0.5", dict(temperature=-0.5)), ("temperature=nan", dict(temperature=float("nan"))),
        ("temperature=inf", dict(temperature=float("inf"))),
        ("top_k=0", dict(top_k=0)), ("top_k=-3", dict(top_k=-3)), ("top_k=0 at temperature 0", dict(temperature=0.0, top_k=0)),
        ("top_k=2.5", dict(top_k=2.5)), ("top_k=True", dict(top_k=True)), ("top_k=2.5 at temperature 0", dict(temperature=0.0, top_k=2.5)),
        ("top_p=0", dict(top_p=0.0)), ("top_p=1.5", dict(top_p=1.5)), ("top_p=-0.2", dict(top_p=-0.2)),
    ]  # fmt: skip
    for what, options in bad:
        expect_raises(f"sample(..., {what})", ValueError, impl.sample, logits, rng, **options)
        expect_raises(f"distribution(..., {what})", ValueError, impl.distribution, logits, **{"temperature": 1.0, **options})
    for k in (0, 2.5, True):
        expect_raises(f"keep_top_k(logits, {k!r})", ValueError, impl.keep_top_k, logits, k)
    expect_raises("keep_top_p(probs, 0)", ValueError, impl.keep_top_p, np.full((1, 4), 0.25), 0.0)
    expect_raises("keep_top_p(probs, 1.01)", ValueError, impl.keep_top_p, np.full((1, 4), 0.25), 1.01)
