"""Two ways to generate beyond one token at a time: beam search and speculative decoding.

Both run a GPT over its KV cache (models/gpt.py) and follow `GPT.generate_tokens`'s context window
rule, through `WindowedCache` below, so that every logit they use is one that plain generation
would compute for the same tokens.

Beam search (docs/beam-search.md)
---------------------------------
Greedy decoding takes the most probable token at each step; the sequence it builds need not be the
most probable sequence: a less likely first token can open a much more likely continuation. Beam
search keeps the K best partial sequences ("beams"), each with its summed log-probability

    logprob(y_1 .. y_t) = sum_i log p(y_i | prompt, y_1 .. y_{i-1})

and at each step extends every beam by every token (K · V candidates), keeping the K best. The K
beams are the K rows of one batch: the model scores all of them in one call, and when a step keeps
beam b's extension in row r, row r of every layer's cache must hold beam b's keys and values, so
the cache rows are gathered along the batch axis (`WindowedCache.reorder`). K = 1 is greedy
decoding, token for token (ties go to the lower token id, as argmax).

Without an end token every beam has the same length, so the K best by log-probability are the K
best by any score of the form logprob / f(length). With `stop_token`, a beam that generates it is
finished (set aside), and the hypotheses, finished or not, are ranked by

    score = logprob / length^alpha       (length: the new tokens, the stop token included)

(the simpler form of GNMT's length penalty, which divides by ((5 + length) / 6)^alpha): alpha = 0
ranks by log-probability, which favours short hypotheses (every token adds a negative term);
alpha = 1 ranks by the mean log-probability per token.

Speculative decoding (docs/speculative-decoding.md)
---------------------------------------------------
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
target's greedy output. Both caches are rolled back to the accepted tokens by setting their
`.length`: the positions past it are never read (attention reads positions < length only) and
are overwritten by the next tokens.

The context window
------------------
The rule is `models.gpt.window_start`: the window of a sequence of n tokens starts where it
started, until it would hold more than block_size tokens; then it jumps so that the last
max(1, block_size // 2) tokens remain, and the cache is rebuilt from them. Where it starts depends
only on the sequence's length, never on its tokens, so every beam's window starts at the same
place, and a speculative round can choose how many tokens to propose so that neither model's
window moves inside the round (it moves, if it must, at the start of the next round): the target
then scores each position with the very window plain generation would give it.
"""
from dataclasses import dataclass, field

import numpy as np

import microtensor as mt
from microtensor import InputError, InputTypeError

from .gpt import (
    GPT,
    SINGLE_THREAD_TOKENS,
    _check_generation_options,
    _check_prompt,
    _is_int,
    _is_real,
    keep_top_k,
    keep_top_p,
    window_start,
)


class WindowedCache:
    """A model and the KV cache of B sequences that grow together, fed by the window rule of
    `GPT.generate_tokens`: `feed` gives the logits of the positions the cache does not hold yet,
    `rollback` forgets positions, `reorder` gathers the cache rows of chosen sequences.

    The cache holds the tokens sequence[start : start + fed] of every sequence. Without a KV cache
    (use_kv_cache=False) every call recomputes the whole window and returns the same rows, so that
    the two ways can be compared.
    """

    def __init__(self, model, batch, prompt_length, use_kv_cache=True):
        if not isinstance(model, GPT):
            raise InputTypeError(f"WindowedCache: expected a GPT, got {type(model).__name__}")
        self.model = model
        self.block = model.config.block_size
        self.batch = batch
        # as generate_tokens: a prompt longer than the block starts with its last block_size tokens
        self.start = max(0, prompt_length - self.block)
        self.fed = 0  # tokens of the window whose keys and values the cache holds
        self.use_kv_cache = use_kv_cache
        if use_kv_cache:
            self.keys, self.values = model.new_cache_arrays(batch)  # (n_layer, B, Hk, block_size, D) each
            self.caches = model.new_caches(batch, (self.keys, self.values))
        self.decode_weights = None  # the fast set's copy of the weights, gathered at the first one-token step
        self.fits_decode_kernel = model.fits_decode_kernel()  # not for quantized or LoRA layers

    def start_for(self, length):
        """Where the window of a sequence of `length` tokens starts (the rule, without moving it)."""
        return window_start(length, self.start, self.block)

    def advance(self, length):
        """Apply the rule at `length` tokens: if the window moves, the cache is emptied, to be
        rebuilt from the new window (positions restart at 0) by the next `feed`. The rule must see
        every length in turn, as generate_tokens does; a caller that feeds several tokens at once
        advances to the first length and makes sure the window does not move up to the last."""
        start = self.start_for(length)
        if start != self.start:
            self.start, self.fed = start, 0

    def feed(self, sequences):
        """sequences (B, n) int: every token so far. Applies the rule at length n (`advance`), runs
        the model over the tokens of the window not yet in the cache, and returns their logits
        (B, m, V) as float64 (m >= 1 new positions, the last one predicting token n)."""
        n = sequences.shape[1]
        self.advance(n)
        window = sequences[:, self.start :]  # (B, n - start)
        new_tokens = window[:, self.fed :]  # (B, m)
        if new_tokens.shape[1] == 0:
            raise InputError(f"WindowedCache.feed: the cache already holds all {n} tokens; there is nothing new to score")
        model = self.model
        if not self.use_kv_cache:
            with mt.num_threads(1 if window.size <= SINGLE_THREAD_TOKENS else None):
                logits = model(window)[0].data[:, self.fed :]  # (B, m, V)
        elif new_tokens.shape[1] == 1 and mt.get_kernels() == "fast" and self.fits_decode_kernel:
            # one token per sequence: the fast set's one-kernel step, as generate_tokens takes it
            from microtensor.fast import decode

            if self.decode_weights is None:
                self.decode_weights = decode.decode_weights(model)
            logits = decode.decode(self.decode_weights, new_tokens[:, 0], self.fed, self.keys, self.values)[:, None]
        else:
            for cache in self.caches:
                cache.length = self.fed  # a moved window or a rollback starts writing here
            # a few tokens are too little work to share between threads (see GPT.generate_tokens)
            with mt.num_threads(1 if new_tokens.size <= SINGLE_THREAD_TOKENS else None):
                logits = model(new_tokens, caches=self.caches, offset=self.fed)[0].data  # (B, m, V)
        self.fed = window.shape[1]
        if self.use_kv_cache:
            for cache in self.caches:
                cache.length = self.fed
        return logits.astype(np.float64)

    def rollback(self, length):
        """Keep only the first `length` tokens of the sequences: the cache forgets the positions
        after them (it only lowers `.length`; attention never reads past it)."""
        keep = length - self.start
        if not 0 <= keep <= self.fed:
            raise InputError(
                f"WindowedCache.rollback: {length} tokens would keep {keep} positions of a window that starts at "
                f"{self.start} and holds {self.fed}; expected between {self.start} and {self.start + self.fed} tokens"
            )
        self.fed = keep
        if self.use_kv_cache:
            for cache in self.caches:
                cache.length = keep

    def reorder(self, rows):
        """Row r of the cache becomes what row rows[r] was (rows (B',) ints; B' may differ from B)."""
        rows = np.asarray(rows, dtype=np.int64)
        if self.use_kv_cache:
            if rows.shape[0] == self.batch:
                held = slice(0, self.fed)  # only the positions the cache holds need moving
                # the right side is gathered into a new array first, so rows may overlap freely
                self.keys[:, :, :, held] = self.keys[:, rows, :, held]  # (n_layer, B, Hk, fed, D)
                self.values[:, :, :, held] = self.values[:, rows, :, held]
            else:
                self.keys, self.values = self.keys[:, rows], self.values[:, rows]  # new arrays of batch B'
                self.caches = self.model.new_caches(rows.shape[0], (self.keys, self.values))
                for cache in self.caches:
                    cache.length = self.fed
        self.batch = rows.shape[0]


class _inference:
    """Evaluation mode and no gradients for some models, restored afterwards (as generate_tokens)."""

    def __init__(self, *models):
        self.models = models

    def __enter__(self):
        self.was_training = [m.training for m in self.models]
        for m in self.models:
            m.eval()
        self.no_grad = mt.no_grad()
        self.no_grad.__enter__()

    def __exit__(self, *exc):
        self.no_grad.__exit__(*exc)
        for m, training in zip(self.models, self.was_training):
            m.train(training)


def log_softmax(logits):
    """log p = logits - log(sum(exp(logits))), over the last axis, float64 (shifted by the max)."""
    logits = np.asarray(logits, dtype=np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _one_sequence(where, prompt_ids, vocab_size):
    """A prompt of one sequence, (T,) or (1, T), as a (1, T) int64 array."""
    array = prompt_ids.data if isinstance(prompt_ids, mt.Tensor) else prompt_ids
    try:
        array = np.asarray(array)
    except ValueError:  # ragged nested lists
        raise InputError(f"{where}: prompt_ids must be one sequence of token ids, (T,) or (1, T)") from None
    if array.ndim == 1:
        array = array[None]
    if array.ndim != 2 or array.shape[0] != 1:
        raise InputError(f"{where}: prompt_ids must be one sequence of token ids, (T,) or (1, T), got shape {array.shape}")
    return _check_prompt(where, array, vocab_size)


# ================================================================================= beam search


@dataclass
class Beam:
    """One hypothesis: its new tokens, its summed log-probability, its score (the log-probability
    with the length penalty applied) and whether it ended with the stop token."""

    tokens: np.ndarray
    logprob: float
    score: float
    finished: bool = False


@dataclass
class BeamResult:
    """The best hypothesis (its new tokens, log-probability and score) and all final beams, best first."""

    tokens: np.ndarray
    logprob: float
    score: float
    beams: list = field(default_factory=list)


def length_normalized(logprob, length, length_penalty):
    """score = logprob / length^alpha (alpha = length_penalty; 0: the log-probability itself)."""
    return logprob / length**length_penalty if length_penalty and length else logprob


def beam_search(model, prompt_ids, beam_width, max_new_tokens, length_penalty=0.0, stop_token=None, use_kv_cache=True):
    """The beam_width best continuations of one prompt, searched with beam_width beams (see the
    module docstring). Returns a BeamResult: the best beam's new tokens (T_new,), its summed
    log-probability and score, and every final beam, best first.

    prompt_ids: (T,) or (1, T) token ids; beam_width an int >= 1 (1: greedy); max_new_tokens an
    int >= 0; length_penalty a finite number >= 0 (alpha); stop_token None or a token id that ends
    a hypothesis (only then can the length penalty change the ranking); use_kv_cache True, or False
    to recompute every window (the same result, slower).
    """
    V = model.config.vocab_size
    prompt = _one_sequence("beam_search", prompt_ids, V)
    if not _is_int(beam_width) or beam_width < 1:
        raise InputError(f"beam_search: beam_width must be an int >= 1 (1 is greedy search), got {beam_width!r}")
    if not _is_real(length_penalty) or not (np.isfinite(length_penalty) and length_penalty >= 0):
        raise InputError(f"beam_search: length_penalty must be a finite number >= 0, got {length_penalty!r}")
    if stop_token is not None and (not _is_int(stop_token) or not 0 <= stop_token < V):
        raise InputError(f"beam_search: stop_token must be None or a token id in [0, {V}), got {stop_token!r}")
    _check_generation_options("beam_search", max_new_tokens, 0, None, None, use_kv_cache, None)
    K, P = beam_width, prompt.shape[1]
    with _inference(model):
        return _beam_search(model, prompt, K, P, V, max_new_tokens, float(length_penalty), stop_token, use_kv_cache)


def _beam_search(model, prompt, K, P, V, max_new_tokens, alpha, stop_token, use_kv_cache):
    cache = WindowedCache(model, 1, P, use_kv_cache)
    sequences = prompt  # (1, P) now, (K, P + t) after t steps: row r is beam r
    scores = np.zeros(1)  # the beams' summed log-probabilities, (rows,)
    finished = []  # Beams that ended with stop_token
    for step in range(max_new_tokens):
        logprobs = log_softmax(cache.feed(sequences)[:, -1])  # (rows, V)
        candidates = scores[:, None] + logprobs  # (rows, V): each beam extended by each token
        if stop_token is not None:
            for row in np.flatnonzero(np.isfinite(candidates[:, stop_token])):
                tokens = np.append(sequences[row, P:], stop_token)
                logprob = float(candidates[row, stop_token])
                finished.append(Beam(tokens, logprob, length_normalized(logprob, step + 1, alpha), finished=True))
            finished = sorted(finished, key=lambda beam: -beam.score)[:K]  # stable: the earlier first on ties
            candidates[:, stop_token] = -np.inf  # a live beam never holds the stop token
        flat = candidates.ravel()  # index = row * V + token
        # the K best, ties to the lower (beam, token), so that K = 1 picks argmax's token
        best = np.argsort(-flat, kind="stable")[:K]
        best = best[np.isfinite(flat[best])]  # fewer than K candidates exist at first (V < K) or at a stop
        if best.size == 0:
            sequences, scores = sequences[:0], scores[:0]
            break
        rows, tokens = np.divmod(best, V)
        sequences = np.concatenate([sequences[rows], tokens[:, None]], axis=1)  # (rows', P + step + 1)
        scores = flat[best]
        cache.reorder(rows)  # row r of the cache now holds the keys and values of the beam it extends
    length = sequences.shape[1] - P
    live = [Beam(sequences[r, P:].copy(), float(s), float(length_normalized(s, length, alpha))) for r, s in enumerate(scores)]
    beams = sorted(live + finished, key=lambda beam: -beam.score)[:K]  # stable: live before finished on ties
    top = beams[0] if beams else Beam(np.zeros(0, dtype=np.int64), 0.0, 0.0)
    return BeamResult(top.tokens, float(top.logprob), float(top.score), beams)


def sequence_logprob(model, prompt_ids, new_tokens):
    """The summed log-probability that the model gives new_tokens after prompt_ids, from one
    forward without a cache (the sequence must fit the block): a check independent of the search."""
    prompt = _one_sequence("sequence_logprob", prompt_ids, model.config.vocab_size)
    new = np.asarray(new_tokens, dtype=np.int64)
    sequence = np.concatenate([prompt[0], new])
    if sequence.size - 1 > model.config.block_size:
        raise InputError(f"sequence_logprob: {sequence.size - 1} positions do not fit the block of {model.config.block_size}")
    with _inference(model):
        logits = model(sequence[None, :-1])[0].data[0]  # (T - 1, V): position i predicts token i + 1
    logprobs = log_softmax(logits)[prompt.shape[1] - 1 :]  # (len(new), V)
    return float(logprobs[np.arange(new.size), new].sum())


# ========================================================================== speculative decoding


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


def token_distribution(logits, temperature, top_k=None, top_p=None):
    """The distributions `models.gpt.sample` draws from, (m, V) float64 rows that sum to 1: one-hot
    at the argmax when temperature is 0, else softmax(logits / temperature) restricted by top_k and
    then top_p (renormalized)."""
    logits = np.asarray(logits, dtype=np.float64)  # (m, V)
    if temperature == 0:
        probs = np.zeros_like(logits)
        probs[np.arange(logits.shape[0]), logits.argmax(axis=-1)] = 1  # argmax: ties to the lower id, as sample
        return probs
    logits = logits / temperature
    if top_k is not None:
        logits = keep_top_k(logits, top_k)
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    if top_p is not None:
        probs = np.where(keep_top_p(probs, top_p), probs, 0)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


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
        self.target_cache = WindowedCache(target, 1, prompt.shape[1], use_kv_cache)
        self.draft_cache = WindowedCache(draft, 1, prompt.shape[1], use_kv_cache)
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

    def round(self, limit):
        """Propose, verify, accept or resample; returns the new tokens (1 to min(k + 1, limit))."""
        n = self.sequence.shape[1]
        # the window rule at length n for both models; proposals_allowed keeps them from moving
        # again up to the last length of the round
        self.target_cache.advance(n)
        self.draft_cache.advance(n)
        k = self.proposals_allowed(limit)
        V = self.target.config.vocab_size
        proposed, q = [], np.zeros((k, V))
        sequence = self.sequence
        for i in range(k):
            q[i] = token_distribution(self.draft_cache.feed(sequence)[0, -1:], *self.options)[0]
            proposed.append(draw(q[i], self.rng))
            sequence = np.concatenate([sequence, [[proposed[-1]]]], axis=1)  # (1, n + i + 1)
        # one target forward: the rows of positions n - 1 .. n + k - 1 give p_1 .. p_{k+1}
        p = token_distribution(self.target_cache.feed(sequence)[0, -(k + 1) :], *self.options)  # (k + 1, V)
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
    if not _is_int(speculate_k) or speculate_k < 1:
        raise InputError(f"{where}: speculate_k must be an int >= 1 (the draft's proposals per round), got {speculate_k!r}")
    _check_generation_options(where, max_new_tokens, temperature, top_k, top_p, True, seed)
    return _one_sequence(where, prompt_ids, target.config.vocab_size)


def speculative_tokens(target, draft, prompt_ids, max_new_tokens, speculate_k, temperature=1.0, top_k=None, top_p=None, seed=None, stats=None, use_kv_cache=True):
    """Yield the new token ids one at a time (as ints), made by speculative decoding; `stats`, a
    SpeculativeStats, is updated as the rounds run. Arguments as `speculative_generate`."""
    prompt = _check_speculative("speculative_tokens", target, draft, prompt_ids, max_new_tokens, speculate_k, temperature, top_k, top_p, seed)
    return _speculative_tokens(target, draft, prompt, max_new_tokens, speculate_k, temperature, top_k, top_p, seed, stats, use_kv_cache)


def _speculative_tokens(target, draft, prompt, max_new_tokens, speculate_k, temperature, top_k, top_p, seed, stats, use_kv_cache):
    decoder = SpeculativeDecoder(target, draft, prompt, speculate_k, temperature, top_k, top_p, seed, use_kv_cache)
    if stats is not None:
        decoder.stats = stats
    with _inference(target, draft):
        produced = 0
        while produced < max_new_tokens:
            for token in decoder.round(max_new_tokens - produced):
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
