"""The checks of exercise 19. Run them with `python -m exercises check speculative_decoding`."""
import numpy as np

from exercises.checking import CheckFailed, expect, expect_close, expect_equal
from gpt.generation.sampling import token_distribution
from gpt.generation.electives.speculative import accept_or_resample

# chi-square values exceeded with probability 0.001 by a right rule, for V - 1 degrees of freedom
CHI_SQUARE_AT_0_001 = {2: 13.82, 3: 16.27}


def random_distributions(rng, rows, V, low=0.05):
    """rows distributions over V tokens, every probability >= low / (V (1 + low)) > 0."""
    values = rng.uniform(low, 1.0, size=(rows, V))
    return values / values.sum(axis=1, keepdims=True)


def as_tokens(what, emitted, k):
    """The emitted tokens as an int array of 1 to k + 1 ids, or a failed check that says what came."""
    tokens = np.asarray(emitted)
    if not (tokens.ndim == 1 and 1 <= tokens.size <= k + 1):  # (messages made only on failure: this runs thousands of times)
        raise CheckFailed(f"{what}: expected 1 to {k + 1} token ids in a 1-d array, got {emitted!r}")
    if tokens.dtype.kind not in "iu":
        raise CheckFailed(f"{what}: expected integer token ids, got dtype {tokens.dtype}")
    return tokens


def test_acceptance_probability(impl):
    """acceptance_probability is min(1, p/q), and 1 or 0 when q = 0 (p > 0 or p = 0)"""
    table = [(0.5, 0.25, 1.0), (0.2, 0.4, 0.5), (0.3, 0.3, 1.0), (0.0, 0.5, 0.0), (0.3, 0.0, 1.0), (0.0, 0.0, 0.0)]
    for p_x, q_x, expected in table:
        with np.errstate(all="ignore"):  # a division by 0 must not decide: the value says what is wrong
            got = impl.acceptance_probability(np.float64(p_x), np.float64(q_x))
        expect(
            got is not None and np.isfinite(got) and abs(got - expected) <= 1e-15,
            f"acceptance_probability(p={p_x}, q={q_x}) returned {got!r}, expected {expected}"
            + (" (q = 0: the README's edge case)" if q_x == 0 else ""),
        )


def test_residual_distribution(impl):
    """the residual sums to 1, is 0 where q >= p, is proportional to p - q elsewhere, and is p when q = p"""
    rng = np.random.default_rng(0)
    for trial in range(5):
        p, q = random_distributions(rng, 2, 4)
        r = np.asarray(impl.residual_distribution(p, q), dtype=np.float64)
        excess = np.maximum(p - q, 0)
        expect_close(f"residual_distribution(p, q) for p = {p.round(3).tolist()}, q = {q.round(3).tolist()}", r, excess / excess.sum(), "max(0, p - q) / its sum, in numpy", atol=1e-15)
        expect(abs(r.sum() - 1) < 1e-12, f"the residual of trial {trial} sums to {r.sum()!r}, expected 1")
        expect(np.all(r[q >= p] == 0), f"the residual of trial {trial} is {r.tolist()}: it must be 0 where q >= p ({(q >= p).tolist()})")
    p = np.array([0.1, 0.2, 0.3, 0.4])
    expect_close("residual_distribution(p, p) (no token has p > q)", np.asarray(impl.residual_distribution(p, p.copy()), dtype=np.float64), p, "p itself (the README's rule)")


def test_matches_microtensor_with_the_same_seed(impl):
    """with the same seed, the emitted tokens equal gpt/generation/electives/speculative.py's accept_or_resample, k = 1, 2, 3"""
    rng = np.random.default_rng(1)
    for trial in range(60):
        k, V = 1 + trial % 3, 3 + trial % 2
        p, q = random_distributions(rng, k + 1, V), random_distributions(rng, k, V)
        draft = np.array([rng.choice(V, p=q[i]) for i in range(k)])
        seed = int(rng.integers(1 << 30))
        accepted, token = accept_or_resample(p, q, list(draft), np.random.default_rng(seed))
        expected = np.array(list(draft[:accepted]) + [token])
        got = as_tokens(f"speculative_step with k = {k}", impl.speculative_step(p, q, draft, np.random.default_rng(seed)), k)
        expect(
            not (accepted == k and np.array_equal(got, draft)),
            f"speculative_step (trial {trial}: k = {k}, V = {V}, draft {draft.tolist()}, rng seed {seed}) accepted "
            f"all k = {k} draft tokens and returned {got.tolist()}: when all k are accepted, emit a bonus token drawn from p[k]",
        )
        expect_equal(
            f"the tokens emitted (trial {trial}: k = {k}, V = {V}, draft {draft.tolist()}, rng seed {seed}; "
            "one rng.random() per proposal, then one per sample(), as the README says)",
            got, expected, "accept_or_resample in gpt/generation/electives/speculative.py",
        )


def first_token_check(impl, p, q, rounds, seed):
    """Run `rounds` rounds with drafts drawn from q; the first emitted token must be distributed as p[0]."""
    k, V = q.shape
    uniforms = np.random.default_rng(seed).random((rounds, k))
    drafts = (uniforms[:, :, None] >= np.cumsum(q, axis=1)[None]).sum(axis=2)  # (rounds, k): d_i drawn from q_i
    drafts = np.minimum(drafts, V - 1)  # (a cumulative sum may end a rounding below 1)
    rng = np.random.default_rng(seed + 1000)
    counts = np.zeros(V)
    what = f"speculative_step with k = {k}"
    for draft in drafts:
        tokens = as_tokens(what, impl.speculative_step(p, q, draft, rng), k)
        counts[tokens[0]] += 1
    expected = rounds * p[0]
    chi_square = float(np.sum((counts - expected) ** 2 / expected))
    bound = CHI_SQUARE_AT_0_001[V - 1]
    if not chi_square < bound:
        raise CheckFailed(
            f"the first token of {rounds} rounds (k = {k}, V = {V}, p_0 = {p[0].tolist()}, q_0 = {q[0].tolist()}): "
            f"counts {counts.astype(int).tolist()}, expected about {expected.round(1).tolist()} (rounds · p_0); "
            f"chi-square {chi_square:.1f} > {bound} (a right rule exceeds it once in 1000 seeds). "
            "The first token must be distributed as the target's p_0, whatever q is."
        )


def test_first_token_is_distributed_as_the_target(impl):
    """chi-square: over 3000 seeded rounds the first token follows p_0, with q far from p (k = 2, V = 3; k = 1, V = 4)"""
    p = np.array([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.3, 0.3, 0.4]])
    q = np.array([[0.1, 0.2, 0.7], [0.7, 0.2, 0.1]])
    first_token_check(impl, p, q, rounds=3000, seed=2)
    p = np.array([[0.05, 0.15, 0.3, 0.5], [0.25, 0.25, 0.25, 0.25]])
    q = np.array([[0.5, 0.3, 0.15, 0.05]])
    first_token_check(impl, p, q, rounds=3000, seed=3)


def greedy_by_hand(p, draft):
    tokens = []
    for i, d in enumerate(draft):
        tokens.append(int(np.argmax(p[i])))
        if d != tokens[-1]:
            return np.array(tokens)
    return np.array(tokens + [int(np.argmax(p[len(draft)]))])


def test_greedy_matches_a_loop_and_microtensor(impl):
    """greedy_step equals a direct loop, and accept_or_resample on the one-hot (temperature 0) distributions"""
    rng = np.random.default_rng(4)
    for trial in range(40):
        k, V = 1 + trial % 3, 4
        p = random_distributions(rng, k + 1, V)
        best = p.argmax(axis=1)
        # drafts that agree with the target's argmax for a while, then (sometimes) not
        draft = np.array([best[i] if rng.random() < 0.7 else rng.integers(V) for i in range(k)])
        got = as_tokens(f"greedy_step with k = {k}", impl.greedy_step(p, draft), k)
        expect_equal(f"greedy_step (trial {trial}: k = {k}, draft {draft.tolist()}, argmax of p {best.tolist()})", got, greedy_by_hand(p, draft), "a direct loop over argmax")
        one_hot_p = token_distribution(np.log(p), temperature=0)  # (k + 1, V), one-hot at each argmax
        one_hot_q = np.eye(V)[draft]  # (k, V): a greedy draft is one-hot at its token
        accepted, token = accept_or_resample(one_hot_p, one_hot_q, list(draft), np.random.default_rng(trial))
        expect_equal(f"greedy_step (trial {trial})", got, np.array(list(draft[:accepted]) + [token]), "accept_or_resample on one-hot p and q")


def test_edge_cases(impl):
    """q = p accepts every proposal (k + 1 tokens); a draft token with q = 0 is accepted iff p > 0"""
    rng = np.random.default_rng(5)
    p = random_distributions(rng, 4, 3)
    for seed in range(20):
        draft = np.array([1, 0, 2])
        tokens = as_tokens("speculative_step with q = p", impl.speculative_step(p, p[:3].copy(), draft, np.random.default_rng(seed)), 3)
        expect(tokens.size == 4 and np.array_equal(tokens[:3], draft), f"with q = p every proposal must be accepted and a bonus token added: draft {draft.tolist()}, got {tokens.tolist()}")
    p = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    for seed in range(20):
        accepted = impl.speculative_step(p, np.array([[1.0, 0.0, 0.0]]), np.array([1]), np.random.default_rng(seed))
        accepted = as_tokens("speculative_step with q(d) = 0 < p(d)", accepted, 1)
        expect(accepted.size == 2 and accepted[0] == 1, f"draft token 1 with q = 0 and p = 0.5 must be accepted, got {accepted.tolist()}")
        with np.errstate(all="ignore"):
            rejected = impl.speculative_step(p, np.array([[0.0, 1.0, 0.0]]), np.array([2]), np.random.default_rng(seed))
        rejected = as_tokens("speculative_step with q(d) = p(d) = 0", rejected, 1)
        expect(rejected.size == 1 and rejected[0] == 0, f"draft token 2 with q = p = 0 must be rejected and token 0 (the only p > q) emitted, got {rejected.tolist()}")
