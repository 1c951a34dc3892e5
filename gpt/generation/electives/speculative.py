"""Speculative decoding (docs/electives/speculative-decoding.md): a target's own sampling, faster, over two Decoders.

A small draft model proposes k tokens d_1 .. d_k, one at a time from its distributions q_i; the
target model scores all of them in one forward over its cache (k + 1 rows: the distributions p_1
.. p_{k+1} of the target after each prefix). Then, for i = 1 .. k in turn:

    accept d_i with probability min(1, p_i(d_i) / q_i(d_i));
    on the first rejection, draw the token instead from  r_i = max(0, p_i - q_i) / sum(max(0, p_i - q_i))
    and end the round; if all k are accepted, draw one more token from p_{k+1}.

Each token so produced is distributed exactly as p_i (the proof is in the docs page:
P(token = x) = min(p(x), q(x)) + max(0, p(x) - q(x)) = p(x)), so the output has the target's
distribution whatever the draft is; a good draft only makes more tokens accepted per target
forward. At temperature 0, p and q are one-hot at their argmax, the rule accepts d_i exactly when
it is the target's argmax and otherwise replaces it by the target's argmax: the output is the
target's greedy output. Both Decoders are rolled back (`Decoder.rollback`) to the accepted tokens by setting their
`.length`: the positions past it are never read (attention reads positions < length only) and
are overwritten by the next tokens.

The context window: both models follow the Decoder's rule (gpt/generation/decoder.py). Where a window
starts depends only on the sequence's length, never on its tokens, so a round can choose how many
tokens to propose so that neither model's window moves inside the round (it moves, if it must, at
the start of the next round): the target then scores each position with the very window plain
generation would give it.

Under the fast kernel set at temperature 0 there is nothing to draw, so the rounds themselves run
inside one kernel call (`greedy_rounds`, gpt/generation/decode_kernel.py's `decode_speculative`),
for as many tokens as both windows hold without moving: the same rounds, with no Python between
them, which is what lets the draft pay against the kernel's plain greedy loop.
"""
from dataclasses import dataclass

import numpy as np

from microtensor import InputError, InputTypeError
from microtensor.checks import is_integer

from gpt.generation.decoder import KERNEL_TOKENS, Decoder, check_generation_options, check_one_sequence
from gpt.model.transformer import GPT
from gpt.generation.sampling import token_distribution


@dataclass
class SpeculativeStats:
    """What a speculative generation did: rounds (one target forward each), tokens the draft
    proposed and the target accepted, and the tokens produced."""

    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    generated: int = 0

    @property
    def acceptance_rate(self):
        """accepted / proposed (nan before any proposal)."""
        return self.accepted / self.proposed if self.proposed else float("nan")

    @property
    def tokens_per_round(self):
        """New tokens per target forward: 1 for plain decoding, up to k + 1 here."""
        return self.generated / self.rounds if self.rounds else float("nan")


def draw(probs, rng):
    """One token id from the distribution probs (V,), by inverting its cumulative sum: the first id
    whose cumulative probability exceeds a uniform u in [0, 1) (an id of probability 0 adds nothing
    to the sum, so it is never the first to exceed u)."""
    cumulative = np.cumsum(probs)
    return int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))


def accept_or_resample(p, q, proposed, rng):
    """The rule that keeps the target's distribution. p (k + 1, V): the target's distributions after
    each prefix; q (k, V): the draft's, from which proposed (k,) were drawn. Returns (j, token): the
    first j proposals are accepted, and token follows them (drawn from the residual at the first
    rejection, or from p[k] when all k are accepted)."""
    k = len(proposed)
    for i in range(k):
        d = proposed[i]
        # accept with probability min(1, p/q): a uniform u in [0, 1) is below p/q with probability
        # min(1, p/q); q[i, d] > 0 because d was drawn from q[i]
        if rng.random() < p[i, d] / q[i, d]:
            continue
        residual = np.maximum(p[i] - q[i], 0)  # (V,)
        total = residual.sum()
        # total is 0 only when p == q, where a rejection cannot happen but for rounding: then p itself
        return i, draw(residual / total if total > 0 else p[i], rng)
    return k, draw(p[k], rng)


class SpeculativeDecoder:
    """The state of one speculative generation: the sequence so far and both models' caches.
    Each `round` runs the draft k times and the target once (see the module docstring)."""

    def __init__(self, target, draft, prompt, speculate_k, temperature, top_k=None, top_p=None, seed=None, use_kv_cache=True):
        self.target, self.draft = target, draft
        self.sequence = prompt  # (1, n): the prompt and every token produced
        self.speculate_k = speculate_k
        self.options = (temperature, top_k, top_p)
        self.rng = np.random.default_rng(seed)
        self.target_cache = Decoder(target, 1, prompt.shape[1], use_kv_cache)
        self.draft_cache = Decoder(draft, 1, prompt.shape[1], use_kv_cache)
        self.stats = SpeculativeStats()

    def proposals_allowed(self, limit):
        """How many tokens this round may propose: at most speculate_k and `limit` (the tokens still
        wanted), and few enough that neither window moves inside the round. The target scores the
        lengths n .. n + k (n + k - start <= its block); the draft proposes from the lengths n ..
        n + k - 1. The target's room can be 0 (its window is full): the round is then a plain step."""
        n = self.sequence.shape[1]
        target_room = self.target_cache.block - (n - self.target_cache.start_for(n))
        draft_room = self.draft_cache.block - (n - self.draft_cache.start_for(n)) + 1
        return min(self.speculate_k, limit, target_room, draft_room)

    def greedy_rounds(self, limit):
        """At temperature 0 with both models under the decode kernel: rounds in one kernel call
        (decode_kernel.decode_speculative), for as many tokens (at most `limit`) as both windows hold
        without moving; returns them, or None when the kernel cannot take this step (then `round` does)."""
        target, draft = self.target_cache, self.draft_cache
        n = self.sequence.shape[1]
        target.advance(n)
        draft.advance(n)
        pending = [self.sequence[:, cache.start + cache.fed :] for cache in (target, draft)]  # (1, m) each
        if target.kernel is None or draft.kernel is None or any(p.shape[1] > KERNEL_TOKENS for p in pending):
            return None
        # the last token a round feeds stays inside both windows
        steps = min(limit, target.block - (n - target.start) + 1, draft.block - (n - draft.start) + 1)
        chosen, held, (rounds, proposed, accepted) = target.kernel.decode_speculative(
            (target.kernel_weights, pending[0], target.fed, target.keys, target.values),
            (draft.kernel_weights, pending[1], draft.fed, draft.keys, draft.values),
            self.speculate_k, steps,
        )  # fmt: skip
        for cache, fed in zip((target, draft), held):
            cache.hold(fed)
        self.sequence = np.concatenate([self.sequence, chosen[None]], axis=1)
        self.stats.rounds += rounds
        self.stats.proposed += proposed
        self.stats.accepted += accepted
        self.stats.generated += steps
        return chosen.tolist()

    def round(self, limit):
        """Propose, verify, accept or resample; returns the new tokens (1 to min(k + 1, limit))."""
        n = self.sequence.shape[1]
        # the window rule at length n for both models; proposals_allowed keeps them from moving
        # again up to the last length of the round
        self.target_cache.advance(n)
        self.draft_cache.advance(n)
        k = self.proposals_allowed(limit)
        V = self.target.config.vocab_size
        greedy = self.options[0] == 0
        sequence = self.sequence
        if greedy and k > 0:
            # temperature 0: q_i is one-hot at the draft's argmax, so the draft proposes its greedy
            # tokens, all k in one call of its Decoder (one kernel call under the fast set)
            chosen, _ = self.draft_cache.feed_greedy(sequence, k)  # (1, k)
            proposed = chosen[0].tolist()
            sequence = np.concatenate([sequence, chosen], axis=1)  # (1, n + k)
        else:
            proposed, q = [], np.zeros((k, V))
            for i in range(k):
                q[i] = token_distribution(self.draft_cache.feed(sequence)[0, -1:], *self.options)[0]
                proposed.append(draw(q[i], self.rng))
                sequence = np.concatenate([sequence, [[proposed[-1]]]], axis=1)  # (1, n + i + 1)
        # one target forward: the rows of positions n - 1 .. n + k - 1 give p_1 .. p_{k+1}
        logits = self.target_cache.feed(sequence)[0, -(k + 1) :]  # (k + 1, V)
        if greedy:
            # p and q one-hot: the rule accepts d_i exactly when it is the target's argmax, and
            # replaces the first that is not by the target's argmax (ties: the lower id, as greedy)
            best = logits.argmax(axis=-1).tolist()  # (k + 1,)
            accepted = 0
            while accepted < k and proposed[accepted] == best[accepted]:
                accepted += 1
            token = best[accepted]
        else:
            p = token_distribution(logits, *self.options)  # (k + 1, V)
            accepted, token = accept_or_resample(p, q, proposed, self.rng)
        new = (proposed[:accepted] + [token])[:limit]
        # Both caches forget the rejected proposals, and keep every new token but the last, which
        # the next round feeds (its logits predict the token after it).
        keep = n + len(new) - 1
        self.target_cache.rollback(keep)
        self.draft_cache.rollback(min(keep, self.draft_cache.start + self.draft_cache.fed))
        self.sequence = np.concatenate([self.sequence, np.array([new], dtype=np.int64)], axis=1)
        self.stats.rounds += 1
        self.stats.proposed += k
        self.stats.accepted += accepted
        self.stats.generated += len(new)
        return new


def _check_speculative(where, target, draft, prompt_ids, max_new_tokens, speculate_k, temperature, top_k, top_p, seed):
    for name, model in (("target", target), ("draft", draft)):
        if not isinstance(model, GPT):
            raise InputTypeError(f"{where}: the {name} must be a GPT, got {type(model).__name__}")
    if draft.config.vocab_size != target.config.vocab_size:
        raise InputError(
            f"{where}: the draft's vocabulary has {draft.config.vocab_size} tokens, the target's {target.config.vocab_size}; "
            "the draft must be trained with the target's tokenizer"
        )
    if not is_integer(speculate_k) or speculate_k < 1:
        raise InputError(f"{where}: speculate_k must be an int >= 1 (the draft's proposals per round), got {speculate_k!r}")
    check_generation_options(where, max_new_tokens, temperature, top_k, top_p, True, seed)
    return check_one_sequence(where, prompt_ids, target.config.vocab_size)


def speculative_tokens(target, draft, prompt_ids, max_new_tokens, speculate_k, temperature=1.0, top_k=None, top_p=None, seed=None, stats=None, use_kv_cache=True):
    """Yield the new token ids one at a time (as ints), made by speculative decoding; `stats`, a
    SpeculativeStats, is updated as the rounds run. Arguments as `speculative_generate`."""
    prompt = _check_speculative("speculative_tokens", target, draft, prompt_ids, max_new_tokens, speculate_k, temperature, top_k, top_p, seed)
    return _speculative_tokens(target, draft, prompt, max_new_tokens, speculate_k, temperature, top_k, top_p, seed, stats, use_kv_cache)


def _speculative_tokens(target, draft, prompt, max_new_tokens, speculate_k, temperature, top_k, top_p, seed, stats, use_kv_cache):
    decoder = SpeculativeDecoder(target, draft, prompt, speculate_k, temperature, top_k, top_p, seed, use_kv_cache)
    if stats is not None:
        decoder.stats = stats
    with decoder.target_cache, decoder.draft_cache:  # both models in evaluation mode, without gradients
        produced = 0
        while produced < max_new_tokens:
            new = decoder.greedy_rounds(max_new_tokens - produced) if temperature == 0 else None
            for token in decoder.round(max_new_tokens - produced) if new is None else new:
                produced += 1
                yield token


def speculative_generate(target, draft, prompt_ids, max_new_tokens, speculate_k, temperature=1.0, top_k=None, top_p=None, seed=None, use_kv_cache=True):
    """max_new_tokens tokens after prompt_ids, distributed as the target's own sampling (greedy at
    temperature 0: the target's greedy tokens), with the draft proposing speculate_k tokens per
    round. Returns (new tokens (max_new_tokens,) int64, SpeculativeStats).

    target, draft: GPTs over the same vocabulary (any sizes, any block sizes); prompt_ids: (T,) or
    (1, T) token ids; speculate_k an int >= 1; temperature, top_k, top_p, seed as GPT.generate.
    """
    prompt = _check_speculative("speculative_generate", target, draft, prompt_ids, max_new_tokens, speculate_k, temperature, top_k, top_p, seed)
    stats = SpeculativeStats()
    tokens = list(_speculative_tokens(target, draft, prompt, max_new_tokens, speculate_k, temperature, top_k, top_p, seed, stats, use_kv_cache))
    return np.array(tokens, dtype=np.int64), stats
