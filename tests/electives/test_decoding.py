"""Beam search and speculative decoding (gpt/generation/electives/beam_search.py, gpt/generation/electives/speculative.py) and their flags in generate.py.

Every expected value comes from outside the code under test: greedy decoding from GPT.generate,
log-probabilities from one forward without a cache and a log-softmax written here, the exhaustive
search from enumerating every sequence, the target's distribution from its logits, and a
chi-square test (its survival function written here) that a deliberately wrong acceptance rule
must fail.
"""
import copy
import itertools
import math
import re

import numpy as np
import pytest

import generate
import microtensor as mt
from helpers import needs_jit
from microtensor.errors import InputError, InputTypeError
from gpt.checkpoints import checkpoint
from gpt.generation.electives import speculative
from gpt.generation.electives.beam_search import beam_search, sequence_logprob
from gpt.text.electives.bpe import BytePairTokenizer
from gpt.text.data import CharTokenizer
from gpt.generation.decoder import Decoder
from gpt.model.transformer import GPT, GPTConfig
from gpt.model.electives.lora import add_lora, merge_lora
from gpt.model.electives.quantize import quantize_model
from gpt.generation.electives.speculative import SpeculativeDecoder, accept_or_resample, speculative_generate


def tiny_gpt(seed, scale=3.0, dtype=mt.float64, **options):
    """A random GPT whose weights are scaled up, so that its distributions are far from uniform
    (GPT-2's initialization makes every next token almost equally likely)."""
    config = dict(vocab_size=5, block_size=8, n_layer=1, n_head=2, n_embd=16)
    config.update(options)
    mt.manual_seed(seed)
    model = GPT(GPTConfig(**config), dtype=dtype)
    for p in model.parameters():
        p.data *= scale
    model.eval()
    return model


def noisy_copy(model, noise, seed, **options):
    """A draft that agrees with `model` part of the time: its weights plus N(0, noise) each, in a
    GPT whose config differs by `options` (with rotary positions the weights fit any block_size)."""
    config = GPTConfig(**{**model.config.to_dict(), **options})
    copy = GPT(config, dtype=model.transformer.wte.weight.dtype)
    rng = np.random.default_rng(seed)
    copy.load_state_dict({name: value + rng.normal(0, noise, value.shape) for name, value in model.state_dict().items()})
    copy.eval()
    return copy


def log_softmax_rows(logits):
    logits = np.asarray(logits, dtype=np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def logprob_of(model, prompt, new):
    """log p(new | prompt) from one forward of the whole sequence, without a cache (fits the block)."""
    sequence = np.concatenate([np.asarray(prompt), np.asarray(new, dtype=np.int64)])
    with mt.no_grad():
        logits = model(sequence[None, :-1])[0].data[0]  # position i predicts token i + 1
    rows = log_softmax_rows(logits)[len(prompt) - 1 :]
    return float(rows[np.arange(len(new)), new].sum())


def greedy(model, prompt, n):
    return model.generate(np.array([prompt]), n, temperature=0).data[0, len(prompt) :]


# ================================================================================= beam search


@pytest.mark.parametrize("dtype", [mt.float32, mt.float64])
@pytest.mark.parametrize("prompt", [[1, 2], list(range(5)) * 3], ids=["short-prompt", "prompt-longer-than-the-block"])
def test_beam_of_one_is_greedy_token_for_token(kernel_set, dtype, prompt):
    model = tiny_gpt(0, dtype=dtype)
    result = beam_search(model, prompt, 1, 20)  # 20 tokens after a block of 8: the window moves
    assert result.tokens.tolist() == greedy(model, prompt, 20).tolist()
    assert len(result.beams) == 1


def test_beam_search_finds_a_more_probable_sequence_than_greedy():
    # a case found by trying seeds: greedy's first token leads to a less probable continuation
    model, prompt = tiny_gpt(2), [1, 2]
    greedy_tokens = greedy(model, prompt, 6)
    result = beam_search(model, prompt, 3, 6)
    greedy_logprob = logprob_of(model, prompt, greedy_tokens)
    assert result.tokens.tolist() != greedy_tokens.tolist()
    assert math.isclose(result.logprob, logprob_of(model, prompt, result.tokens), rel_tol=1e-12)
    assert result.logprob > greedy_logprob + 0.1


@pytest.mark.parametrize("beam_width", [27, 9])
def test_beam_search_equals_exhaustive_search_when_every_prefix_is_kept(beam_width):
    """With V = 3 and 3 steps there are 27 sequences. K = 27 keeps every one; K = 9 keeps every
    prefix of 2 tokens, so the last step ranks all 27 too: the K beams are the K most probable."""
    model, prompt = tiny_gpt(1, vocab_size=3), [0, 2]
    every = sorted(((logprob_of(model, prompt, list(s)), s) for s in itertools.product(range(3), repeat=3)), reverse=True)
    result = beam_search(model, prompt, beam_width, 3)
    assert [tuple(b.tokens) for b in result.beams] == [s for _, s in every[:beam_width]]
    assert np.allclose([b.logprob for b in result.beams], [lp for lp, _ in every[:beam_width]], rtol=1e-12)
    assert result.tokens.tolist() == list(every[0][1])


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_a_stop_token_and_the_length_penalty_rank_as_an_exhaustive_search(alpha):
    """Token 0 ends a hypothesis. Every hypothesis of at most 3 tokens: the 7 that end with 0
    (lengths 1 to 3, no 0 before) and the 8 of 3 tokens without a 0, ranked by logprob / length^alpha."""
    model, prompt, stop = tiny_gpt(3, vocab_size=3), [1, 2], 0
    hypotheses = [(*s, stop) for n in range(3) for s in itertools.product((1, 2), repeat=n)]
    hypotheses += list(itertools.product((1, 2), repeat=3))
    scored = []
    for h in hypotheses:
        logprob = logprob_of(model, prompt, list(h))
        scored.append((logprob / len(h) ** alpha, logprob, h))
    scored.sort(reverse=True)
    result = beam_search(model, prompt, 15, 3, length_penalty=alpha, stop_token=stop)
    assert [tuple(b.tokens) for b in result.beams] == [h for _, _, h in scored]
    assert np.allclose([b.score for b in result.beams], [s for s, _, _ in scored], rtol=1e-12)
    assert [b.finished for b in result.beams] == [h[-1] == stop for _, _, h in scored]


def test_the_length_penalty_changes_the_winner_only_with_a_stop_token():
    model, prompt = tiny_gpt(3, vocab_size=3), [1, 2]
    by_logprob = beam_search(model, prompt, 15, 3, stop_token=0)
    per_token = beam_search(model, prompt, 15, 3, length_penalty=1.0, stop_token=0)
    assert len(by_logprob.tokens) < len(per_token.tokens)  # alpha = 0 favours the short hypotheses
    # without a stop token every beam has 3 tokens: dividing by 3 changes no ranking
    plain, penalized = beam_search(model, prompt, 4, 3), beam_search(model, prompt, 4, 3, length_penalty=1.0)
    assert [b.tokens.tolist() for b in plain.beams] == [b.tokens.tolist() for b in penalized.beams]


def test_reordered_cache_rows_give_the_logits_of_a_recomputation(kernel_set):
    """Row r of the cache takes row rows[r]'s keys and values; the next token's logits must be
    those of a forward over the reordered sequences without any cache."""
    model = tiny_gpt(4, vocab_size=7)
    sequences = np.random.default_rng(0).integers(0, 7, (3, 5))
    cache = Decoder(model, 3, 5)
    with mt.no_grad():
        cache.feed(sequences)
        rows = np.array([2, 0, 0])
        cache.reorder(rows)
        grown = np.concatenate([sequences[rows], np.array([[1], [4], [6]])], axis=1)  # (3, 6)
        logits = cache.feed(grown)[:, -1]
        expected = model(grown)[0].data[:, -1]
        cache.reorder(np.array([1, 2]))  # fewer rows: new arrays of batch 2
        grown = np.concatenate([grown[[1, 2]], np.array([[3], [3]])], axis=1)
        fewer = cache.feed(grown)[:, -1]
        expected_fewer = model(grown)[0].data[:, -1]
    assert np.allclose(logits, expected, rtol=1e-10, atol=1e-12)
    assert np.allclose(fewer, expected_fewer, rtol=1e-10, atol=1e-12)


def test_beam_search_with_the_cache_equals_beam_search_recomputing_every_window(kernel_set):
    model = tiny_gpt(5, vocab_size=6)
    cached = beam_search(model, [1, 2, 3], 4, 20)  # the window of 8 moves several times
    recomputed = beam_search(model, [1, 2, 3], 4, 20, use_kv_cache=False)
    assert [b.tokens.tolist() for b in cached.beams] == [b.tokens.tolist() for b in recomputed.beams]
    assert np.allclose([b.logprob for b in cached.beams], [b.logprob for b in recomputed.beams], rtol=1e-10)


# ========================================================================== speculative decoding


@pytest.mark.parametrize("speculate_k", [1, 3, 6])
def test_speculative_decoding_at_temperature_0_is_the_targets_greedy_output(kernel_set, speculate_k):
    target = tiny_gpt(0, vocab_size=6, pos="rope")
    draft = noisy_copy(target, 0.01, seed=7, block_size=5)  # with its smaller window, disagrees often
    accepted = rejected = 0
    for prompt in ([1, 2], list(range(6)) * 2):  # the second is longer than both blocks
        tokens, stats = speculative_generate(target, draft, prompt, 25, speculate_k, temperature=0)
        assert tokens.tolist() == greedy(target, prompt, 25).tolist()
        assert stats.generated == 25
        accepted, rejected = accepted + stats.accepted, rejected + stats.proposed - stats.accepted
    assert accepted > 0 and rejected > 0


@needs_jit
def test_the_target_scores_each_rounds_proposals_in_one_call_of_the_decode_kernel(monkeypatch):
    """Under the fast set, a sampling round's k + 1 rows of the target go through the decode kernel
    in one call (their products share each weight read), not through the modules."""
    from gpt.generation import decode_kernel

    calls = []
    original = decode_kernel.decode

    def counted(weights, tokens, *rest, **options):
        calls.append(np.shape(tokens))
        return original(weights, tokens, *rest, **options)

    monkeypatch.setattr(decode_kernel, "decode", counted)
    target = tiny_gpt(0, vocab_size=6, pos="rope", n_layer=2)
    draft = noisy_copy(target, 0.01, seed=7, n_layer=2)
    with mt.using_kernels("fast"):
        tokens, stats = speculative_generate(target, draft, [1, 2], 5, 4, temperature=0.8, seed=0)
    assert len(tokens) == 5
    assert (1, 5) in calls  # a verification of 4 proposals: 5 rows, one call


@needs_jit
@pytest.mark.parametrize("speculate_k", [1, 3, 5])
@pytest.mark.parametrize("prompt", [[1, 2], [3, 1, 4, 1, 5]])
def test_greedy_rounds_in_one_kernel_call_are_the_rounds_one_at_a_time(speculate_k, prompt, monkeypatch):
    """At temperature 0 under the fast set the rounds run inside one kernel call (decode_speculative)
    while both windows hold them: the same tokens (the target's greedy ones), the same rounds,
    proposals and acceptances as the rounds made one at a time, and caches that equal a fresh run
    on the tokens each holds; a longer generation takes a call per stretch the windows hold."""
    from gpt.generation import decode_kernel

    target = tiny_gpt(0, vocab_size=6, pos="rope", n_layer=2)
    draft = noisy_copy(target, 0.05, seed=7, n_layer=2)
    calls = []
    original = decode_kernel.decode_speculative
    monkeypatch.setattr(decode_kernel, "decode_speculative", lambda *a: calls.append(a[-1]) or original(*a))
    with mt.using_kernels("fast"):
        steps = 8 + 1 - len(prompt)  # as many as the block of 8 holds
        in_kernel = SpeculativeDecoder(target, draft, np.array([prompt]), speculate_k, 0.0)
        with in_kernel.target_cache, in_kernel.draft_cache:
            new = in_kernel.greedy_rounds(steps)
        one_at_a_time = SpeculativeDecoder(target, draft, np.array([prompt]), speculate_k, 0.0)
        with one_at_a_time.target_cache, one_at_a_time.draft_cache:
            while one_at_a_time.sequence.shape[1] < len(prompt) + steps:
                one_at_a_time.round(len(prompt) + steps - one_at_a_time.sequence.shape[1])
        longer, _ = speculative_generate(target, draft, prompt, 20, speculate_k, temperature=0)
    assert calls[0] == steps and len(calls) > 2  # the first generation, then the longer one's stretches
    assert new == one_at_a_time.sequence[0, len(prompt) :].tolist() == greedy(target, prompt, steps).tolist()
    assert in_kernel.stats == one_at_a_time.stats and in_kernel.stats.proposed > 0
    for model, cache, other in ((target, in_kernel.target_cache, one_at_a_time.target_cache), (draft, in_kernel.draft_cache, one_at_a_time.draft_cache)):
        assert (cache.start, cache.fed) == (other.start, other.fed)
        held = in_kernel.sequence[:, cache.start : cache.start + cache.fed]
        keys, values = cache_of_a_fresh_run(model, held)
        assert np.allclose(cache.keys[:, :, :, : cache.fed], keys, rtol=1e-10, atol=1e-12)
        assert np.allclose(cache.values[:, :, :, : cache.fed], values, rtol=1e-10, atol=1e-12)
    assert longer.tolist() == greedy(target, prompt, 20).tolist()  # past the windows, where they move


def test_speculative_decoding_with_the_target_as_its_own_draft_accepts_everything():
    target = tiny_gpt(0, vocab_size=6)
    tokens, stats = speculative_generate(target, target, [1, 2], 20, 3, temperature=1.0, seed=0)
    assert stats.accepted == stats.proposed > 0 and len(tokens) == 20


def cache_of_a_fresh_run(model, tokens):
    """Keys and values (n_layer, 1, Hk, T, D) of a new cache fed `tokens` (1, T) in one forward."""
    caches = model.new_caches(1)
    with mt.no_grad():
        model(tokens, caches=caches, offset=0)
    return np.stack([c.k[:, :, : tokens.shape[1]] for c in caches]), np.stack([c.v[:, :, : tokens.shape[1]] for c in caches])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_after_a_rejection_both_caches_equal_a_fresh_run_on_the_accepted_tokens(kernel_set, temperature):
    target = tiny_gpt(0, vocab_size=6, pos="rope")
    draft = noisy_copy(target, 0.05, seed=7, block_size=6)
    decoder = SpeculativeDecoder(target, draft, np.array([list(range(6)) * 2]), 4, temperature, seed=1)
    rejections = 0
    with mt.no_grad():
        for _ in range(15):  # past both blocks: the windows move
            proposed_before, accepted_before = decoder.stats.proposed, decoder.stats.accepted
            decoder.round(4)
            if decoder.stats.accepted - accepted_before == decoder.stats.proposed - proposed_before:
                continue
            rejections += 1
            n = decoder.sequence.shape[1]  # the last token is new: no cache holds it yet
            for model, cache in ((target, decoder.target_cache), (draft, decoder.draft_cache)):
                held = decoder.sequence[:, cache.start : cache.start + cache.fed]
                assert cache.start + cache.fed <= n - 1
                assert all(c.length == cache.fed for c in cache.caches)
                keys, values = cache_of_a_fresh_run(model, held)
                assert np.allclose(cache.keys[:, :, :, : cache.fed], keys, rtol=1e-10, atol=1e-12)
                assert np.allclose(cache.values[:, :, :, : cache.fed], values, rtol=1e-10, atol=1e-12)
            # the target holds every token before the new one
            assert decoder.target_cache.start + decoder.target_cache.fed == n - 1
    assert rejections >= 3


# --------------------------------------------------------------------- the statistical tests

SIGNIFICANCE = 1e-3  # a correct rule fails with this probability; the samples are seeded, so never here


def chi_square_survival(x, dof):
    """P(X >= x) for X chi-square with dof degrees of freedom: the regularized upper incomplete
    gamma Q(dof / 2, x / 2), by its series below s + 1 and its continued fraction above
    (Numerical Recipes, gser and gcf); the continued fraction gives tiny tails without cancellation."""
    s, z = dof / 2, x / 2
    if z <= 0:
        return 1.0
    log_front = s * math.log(z) - z - math.lgamma(s)
    if z < s + 1:
        term = total = 1 / s
        a = s
        while abs(term) > abs(total) * 1e-16:
            a += 1
            term *= z / a
            total += term
        return 1 - total * math.exp(log_front)
    tiny = 1e-300
    b, c, d = z + 1 - s, 1 / tiny, 1 / (z + 1 - s)
    h = d
    for i in range(1, 10_000):
        an = -i * (i - s)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-16:
            break
    return math.exp(log_front) * h


def test_the_chi_square_survival_function_against_table_values():
    for x, dof, tail in [(3.841, 1, 0.05), (2 * math.log(2), 2, 0.5), (16.266, 3, 0.001), (37.697, 15, 0.001), (8.547, 15, 0.9)]:
        assert math.isclose(chi_square_survival(x, dof), tail, rel_tol=2e-3), (x, dof)
    assert chi_square_survival(1e4, 15) < 1e-300


def chi_square_p_value(counts, probs):
    """The chi-square test of observed counts against probabilities (the same shape); cells whose
    expected count is below 5 are pooled into one, as the test's approximation needs."""
    counts, expected = np.ravel(counts), np.ravel(probs) * np.sum(counts)
    small = expected < 5
    if small.any():
        counts = np.append(counts[~small], counts[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token of probability 0 was drawn"
    statistic = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    return chi_square_survival(statistic, keep.sum() - 1)


def filtered_probs(logits, temperature, top_k):
    """softmax(logits / temperature) over the top_k largest logits, 0 elsewhere."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    if top_k is not None:
        z = np.where(z < np.sort(z)[-top_k], -np.inf, z)
    e = np.exp(z - z.max())
    return e / e.sum()


def first_two_tokens_distribution(model, prompt, temperature, top_k):
    """P(t1 = a, t2 = b) = p(a | prompt) p(b | prompt, a), (V, V), from forwards without a cache."""
    V = model.config.vocab_size
    with mt.no_grad():
        first = filtered_probs(model(np.array([prompt]))[0].data[0, -1], temperature, top_k)
        second = [filtered_probs(model(np.array([prompt + [a]]))[0].data[0, -1], temperature, top_k) for a in range(V)]
    return first[:, None] * np.array(second)


STAT_PROMPT = [0, 1]
STAT_SAMPLES = 200


def statistical_models():
    """V = 4: a target and a draft that disagree (their distributions of the first two tokens are
    far apart), so that a wrong rule leaves a large trace."""
    return tiny_gpt(0, scale=4.0, vocab_size=4, n_embd=8, n_head=1), tiny_gpt(1, scale=4.0, vocab_size=4, n_embd=8, n_head=1)


def first_two_tokens_p_value(temperature, top_k, speculate_k=2):
    target, draft = statistical_models()
    expected = first_two_tokens_distribution(target, STAT_PROMPT, temperature, top_k)
    counts = np.zeros((4, 4))
    for seed in range(STAT_SAMPLES):
        tokens, _ = speculative_generate(target, draft, STAT_PROMPT, 2, speculate_k, temperature=temperature, top_k=top_k, seed=seed)
        counts[tokens[0], tokens[1]] += 1
    return chi_square_p_value(counts, expected)


def test_the_statistical_models_disagree():
    target, draft = statistical_models()
    p = first_two_tokens_distribution(target, STAT_PROMPT, 1.0, None)
    q = first_two_tokens_distribution(draft, STAT_PROMPT, 1.0, None)
    assert 0.5 * np.abs(p - q).sum() > 0.5  # total variation distance


@pytest.mark.parametrize("temperature, top_k", [(1.0, None), pytest.param(0.7, 3, marks=pytest.mark.slow)])
def test_speculative_sampling_draws_the_first_two_tokens_from_the_targets_distribution(temperature, top_k):
    assert first_two_tokens_p_value(temperature, top_k) > SIGNIFICANCE


def always_accept(p, q, proposed, rng):
    """Wrong: every proposal kept, so the tokens are the draft's."""
    return len(proposed), speculative.draw(p[len(proposed)], rng)


def resample_from_the_target(p, q, proposed, rng):
    """Wrong: on a rejection, a token drawn from p instead of from the residual max(0, p - q)."""
    for i, d in enumerate(proposed):
        if rng.random() >= p[i, d] / q[i, d]:
            return i, speculative.draw(p[i], rng)
    return len(proposed), speculative.draw(p[len(proposed)], rng)


# resampling from p is also caught without models, faster, by the test of the rule alone below
@pytest.mark.parametrize("wrong_rule", [always_accept, pytest.param(resample_from_the_target, marks=pytest.mark.slow)])
def test_a_wrong_acceptance_rule_fails_the_same_test(monkeypatch, wrong_rule):
    monkeypatch.setattr(speculative, "accept_or_resample", wrong_rule)
    assert first_two_tokens_p_value(1.0, None) < SIGNIFICANCE


def rule_samples(rule, p, q, samples, seed):
    """The tokens the rule produces for fixed distributions (the same at every prefix): the first
    token of each round, and the second among rounds that accepted the first proposal."""
    rng = np.random.default_rng(seed)
    V, k = p.shape[1], q.shape[0]
    proposals = np.stack([rng.choice(V, size=samples, p=q[i]) for i in range(k)], axis=1)  # (samples, k)
    first, second = np.zeros(V), np.zeros(V)
    for proposed in proposals.tolist():
        j, token = rule(p, q, proposed, rng)
        produced = proposed[:j] + [token]
        first[produced[0]] += 1
        if j >= 1:
            second[produced[1]] += 1
    return first, second


def test_the_rule_alone_keeps_the_targets_distribution_at_each_position():
    """Without models: p and q fixed, many rounds of k = 3. The first token of a round must be
    distributed as p_1, and, after an accepted first proposal, the second as p_2."""
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(5) * 0.7, size=4)  # (k + 1, V)
    q = rng.dirichlet(np.ones(5) * 0.7, size=3)  # (k, V)
    first, second = rule_samples(accept_or_resample, p, q, 10_000, seed=1)
    assert chi_square_p_value(first, p[0]) > SIGNIFICANCE
    assert chi_square_p_value(second, p[1]) > SIGNIFICANCE
    for wrong in (always_accept, resample_from_the_target):
        first, _ = rule_samples(wrong, p, q, 10_000, seed=1)
        assert chi_square_p_value(first, p[0]) < SIGNIFICANCE


# ================================================================================= bad input


def test_the_library_refuses_bad_input():
    target = tiny_gpt(0)
    with pytest.raises(InputError, match="draft's vocabulary has 6 tokens, the target's 5"):
        speculative_generate(target, tiny_gpt(1, vocab_size=6), [1], 3, 2)
    with pytest.raises(InputError, match="speculate_k must be an int >= 1"):
        speculative_generate(target, target, [1], 3, 0)
    with pytest.raises(InputError, match="beam_width must be an int >= 1"):
        beam_search(target, [1], 0, 3)
    with pytest.raises(InputError, match="stop_token must be None or a token id in"):
        beam_search(target, [1], 2, 3, stop_token=5)
    with pytest.raises(InputError, match="length_penalty must be a finite number >= 0"):
        beam_search(target, [1], 2, 3, length_penalty=float("nan"))
    with pytest.raises(InputError, match="one sequence"):
        beam_search(target, [[1], [2]], 2, 3)
    with pytest.raises(InputError, match="token id 9 is outside the vocabulary"):
        speculative_generate(target, target, [9], 3, 2)
    # a model that is not a GPT: before, beam_search raised AttributeError ('object' has no 'config')
    with pytest.raises(InputTypeError, match="beam_search: model must be a GPT, got object"):
        beam_search(object(), [1], 2, 3)
    with pytest.raises(InputTypeError, match="sequence_logprob: model must be a GPT, got dict"):
        sequence_logprob({}, [1], [2])
    with pytest.raises(InputTypeError, match="speculative_generate: the target must be a GPT, got object"):
        speculative_generate(object(), target, [1], 3, 2)
    with pytest.raises(InputTypeError, match="speculative_tokens: the draft must be a GPT, got str"):
        speculative.speculative_tokens(target, "draft", [1], 3, 2)


# ================================================================================= generate.py

LETTERS = " abcdefghijklmnopqrstuvwxyz"


def save_checkpoint(folder, tokenizer, seed, **options):
    config = GPTConfig(vocab_size=tokenizer.vocab_size, **{"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16, **options})
    mt.manual_seed(seed)
    model = GPT(config)
    meta = {"iteration": 0, "config": config.to_dict(), **checkpoint.tokenizer_meta(tokenizer)}
    checkpoint.save(folder, model, mt.optim.AdamW(mt.optim.weight_decay_groups(model, 0.1)), meta)
    return str(folder)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoding")
    bpe = BytePairTokenizer.train("the king and the queen " * 20, 260)
    return {
        "target": save_checkpoint(root / "target", CharTokenizer(LETTERS), 0),
        "draft": save_checkpoint(root / "draft", CharTokenizer(LETTERS), 1, n_embd=8, n_head=1, block_size=8),
        "other-vocab": save_checkpoint(root / "other-vocab", CharTokenizer(LETTERS.replace("z", "!")), 1),
        "bpe": save_checkpoint(root / "bpe", bpe, 1),
        "bpe-draft": save_checkpoint(root / "bpe-draft", bpe, 2, n_embd=8, n_head=1),
        "bpe-other-merges": save_checkpoint(root / "bpe-other-merges", BytePairTokenizer.train("a queen and a king " * 20, 260), 2),
        "nowhere": str(root / "nowhere"),
    }


def run(folders, capsys, *flags):
    code = generate.main(["--out-dir", folders["target"], "--prompt", "the", "--max-new-tokens", "12", *flags])
    out = capsys.readouterr().out
    return code, " ".join(out.split()), out


def test_beam_search_prints_its_log_probability_beside_greedys(folders, capsys):
    code, said, _ = run(folders, capsys, "--beam", "3")
    assert code == 0, said
    assert re.search(r"beam search: log-probability -\d+\.\d+ of its 12 tokens; greedy: -\d+\.\d+ of 12 tokens", said)
    code, said, _ = run(folders, capsys, "--beam", "1", "--temperature", "0")
    assert code == 0 and "beam - greedy = +0.000" in said
    code, said, _ = run(folders, capsys, "--beam", "2", "--stop", " ", "--length-penalty", "0.6")
    assert code == 0 and "with length penalty 0.6" in said


def generated_text(out):
    """The sample's text: the line that starts with the prompt."""
    return [line for line in out.splitlines() if line.startswith("the")]


def test_speculative_decoding_prints_its_acceptance_rate_and_matches_greedy_text(folders, capsys):
    code, said, out = run(folders, capsys, "--draft-dir", folders["draft"], "--speculate", "3", "--temperature", "0")
    assert code == 0, said
    assert re.search(r"\d+ of \d+ accepted, acceptance rate \d+%", said) and "tokens/s" in said
    per_round = float(re.search(r"([\d.]+) proposals per round \(--speculate 3\)", said).group(1))
    assert 0 < per_round <= 3  # the windows may cap a round below --speculate, never above
    code, _, plain = run(folders, capsys, "--temperature", "0")
    assert code == 0 and generated_text(out) == generated_text(plain) != []
    code, said, _ = run(folders, capsys, "--draft-dir", folders["draft"], "--num-samples", "2", "--top-k", "5")
    assert code == 0 and "--speculate 3" not in said and "(--speculate 4)" in said  # the default --speculate


def test_a_bpe_model_takes_a_draft_with_the_same_merges_and_refuses_others(folders, capsys):
    argv = ["--out-dir", folders["bpe"], "--prompt", "the", "--max-new-tokens", "8", "--temperature", "0"]
    assert generate.main([*argv, "--draft-dir", folders["bpe-draft"]]) == 0
    assert "acceptance rate" in " ".join(capsys.readouterr().out.split())
    assert generate.main([*argv, "--draft-dir", folders["bpe-other-merges"]]) == 1
    said = " ".join(capsys.readouterr().out.split())
    assert "expected a draft model trained with the target's tokenizer, but the draft's BPE merges (260 tokens) are not the target's" in said


BAD_FLAGS = {
    "beam-zero": (["--beam", "0"], "--beam: given 0, expected an integer >= 1"),
    "beam-top-p": (["--beam", "2", "--top-p", "0.9"], "--top-p: given 0.9 with --beam 2, expected no --top-p: beam search is deterministic"),
    "beam-top-k": (["--beam", "2", "--top-k", "3"], "--top-k: given 3 with --beam 2, expected no --top-k"),
    "beam-temperature": (["--beam", "2", "--temperature", "0.8"], "--temperature: given 0.8 with --beam 2, expected 0 or no --temperature"),
    "beam-samples": (["--beam", "2", "--num-samples", "3"], "--num-samples: given 3 with --beam 2, expected 1"),
    "beam-speculate": (["--beam", "2", "--speculate", "2"], "--speculate: given 2 with --beam 2, expected one of --beam and --draft-dir"),
    "beam-draft": (["--beam", "2", "--draft-dir", "x"], "--draft-dir: given 'x' with --beam 2"),
    "penalty-without-beam": (["--length-penalty", "0.6"], "--length-penalty: given 0.6 without --beam, expected --beam K as well"),
    "penalty-without-stop": (["--beam", "2", "--length-penalty", "0.6"], "--length-penalty: given 0.6 without --stop, expected --stop TEXT as well"),
    "penalty-negative": (["--beam", "2", "--stop", " ", "--length-penalty", "-1"], "--length-penalty: given -1.0, expected a finite number >= 0"),
    "stop-without-beam": (["--stop", "x"], "--stop: given 'x' without --beam"),
    "stop-of-two-tokens": (["--beam", "2", "--stop", "ab"], "--stop: given 'ab', expected the text of one token; the tokenizer makes 2 tokens of it"),
    "stop-unknown": (["--beam", "2", "--stop", "?"], "--stop: given '?', expected characters of the model's vocabulary"),
    "speculate-zero": (["--draft-dir", "x", "--speculate", "0"], "--speculate: given 0, expected an integer >= 1"),
    "speculate-without-draft": (["--speculate", "3"], "--speculate: given 3 without --draft-dir, expected --draft-dir DIR as well"),
    "draft-missing": (["--draft-dir", "{nowhere}"], "--draft-dir: no checkpoint at"),
    "draft-other-vocabulary": (["--draft-dir", "{other-vocab}"], "--draft-dir: given '{other-vocab}', expected a draft model trained with the target's tokenizer, but the draft's vocabulary"),
    "draft-other-tokenizer": (["--draft-dir", "{bpe}"], "the draft's tokenizer is byte-level BPE, the target's character"),
}


@pytest.mark.parametrize("flags, message", BAD_FLAGS.values(), ids=BAD_FLAGS.keys())
def test_bad_flags_are_refused_by_name(folders, capsys, flags, message):
    code, said, _ = run(folders, capsys, *[f.format(**folders) for f in flags])
    assert code == 1
    assert message.format(**folders) in said
    assert "Traceback" not in said


# ================================================ models the one-token kernel cannot run as they are


def adapted_copy(model, seed):
    """`model` with LoRA adapters whose B is not zero, so that they change every logit."""
    adapted = add_lora(copy.deepcopy(model), rank=2, alpha=2.0, targets=("c_attn", "c_proj", "c_fc"))
    rng = np.random.default_rng(seed)
    for name, parameter in adapted.named_parameters():
        if name.endswith("lora_b"):
            parameter.data = rng.normal(0, 0.5, parameter.shape).astype(parameter.dtype)
    return adapted


@needs_jit
def test_beam_search_and_speculative_decoding_see_unmerged_lora_adapters():
    # The fast set's one-token kernel reads each layer's base weight only: these models must take the modules' path.
    target = adapted_copy(tiny_gpt(0, dtype=mt.float32), seed=1)
    merged = merge_lora(target)
    draft = tiny_gpt(2, dtype=mt.float32)
    prompt = [1, 2]
    with mt.using_kernels("fast"):
        expected = greedy(merged, prompt, 12)
        assert not np.array_equal(expected, greedy(tiny_gpt(0, dtype=mt.float32), prompt, 12))  # the adapters matter
        np.testing.assert_array_equal(beam_search(target, prompt, 1, 12).tokens, expected)
        np.testing.assert_array_equal(speculative_generate(target, draft, prompt, 12, 3, temperature=0)[0], expected)
        np.testing.assert_array_equal(speculative_generate(draft, target, prompt, 12, 3, temperature=0)[0], greedy(draft, prompt, 12))


@needs_jit
@pytest.mark.parametrize("bits", [8, pytest.param(4, marks=pytest.mark.slow)])  # int4 compiles kernels of its own
def test_beam_search_and_speculative_decoding_run_a_quantized_model(bits):
    target = quantize_model(tiny_gpt(0, dtype=mt.float32, n_embd=32), bits=bits)
    draft = tiny_gpt(2, dtype=mt.float32)
    prompt = [1, 2]
    with mt.using_kernels("readable"):
        expected = greedy(target, prompt, 12)  # past block_size (8): the window moves, and one-token steps follow
    with mt.using_kernels("fast"):
        np.testing.assert_array_equal(beam_search(target, prompt, 1, 12).tokens, expected)
        np.testing.assert_array_equal(speculative_generate(target, draft, prompt, 12, 3, temperature=0)[0], expected)


def test_quantizing_a_model_with_unmerged_lora_adapters_is_refused():
    adapted = adapted_copy(tiny_gpt(0, dtype=mt.float32), seed=1)
    with pytest.raises(mt.InputError, match=r"quantize_model: transformer\.h\.0\..* hold unmerged LoRA adapters, .* merge them into the weights first"):
        quantize_model(adapted)
