"""Beam search (docs/electives/beam-search.md): the most probable continuations, over a Decoder.

Greedy decoding takes the most probable token at each step; the sequence it builds need not be the
most probable sequence: a less likely first token can open a much more likely continuation. Beam
search keeps the K best partial sequences ("beams"), each with its summed log-probability

    logprob(y_1 .. y_t) = sum_i log p(y_i | prompt, y_1 .. y_{i-1})

and at each step extends every beam by every token (K · V candidates), keeping the K best. The K
beams are the K rows of one batch: the model scores all of them in one call, and when a step keeps
beam b's extension in row r, row r of every layer's cache must hold beam b's keys and values, so
the cache rows are gathered along the batch axis (`Decoder.reorder`). K = 1 is greedy
decoding, token for token (ties go to the lower token id, as argmax).

Without an end token every beam has the same length, so the K best by log-probability are the K
best by any score of the form logprob / f(length). With `stop_token`, a beam that generates it is
finished (set aside), and the hypotheses, finished or not, are ranked by

    score = logprob / length^alpha       (length: the new tokens, the stop token included)

(the simpler form of GNMT's length penalty, which divides by ((5 + length) / 6)^alpha): alpha = 0
ranks by log-probability, which favours short hypotheses (every token adds a negative term);
alpha = 1 ranks by the mean log-probability per token.

Past block_size the beams follow the Decoder's context window rule (gpt/generation/decoder.py): where the
window starts depends only on the sequences' length, so every beam's window starts at one place,
and every logit the search uses is one that plain generation would compute for the same tokens.
"""
from dataclasses import dataclass, field

import numpy as np

from microtensor import InputError, InputTypeError
from microtensor.checks import is_integer, is_real_number

from gpt.generation.decoder import Decoder, check_generation_options, check_one_sequence
from gpt.generation.sampling import log_softmax
from gpt.model.transformer import GPT


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
    check_model("beam_search", model)
    V = model.config.vocab_size
    prompt = check_one_sequence("beam_search", prompt_ids, V)
    if not is_integer(beam_width) or beam_width < 1:
        raise InputError(f"beam_search: beam_width must be an int >= 1 (1 is greedy search), got {beam_width!r}")
    if not is_real_number(length_penalty) or not (np.isfinite(length_penalty) and length_penalty >= 0):
        raise InputError(f"beam_search: length_penalty must be a finite number >= 0, got {length_penalty!r}")
    if stop_token is not None and (not is_integer(stop_token) or not 0 <= stop_token < V):
        raise InputError(f"beam_search: stop_token must be None or a token id in [0, {V}), got {stop_token!r}")
    check_generation_options("beam_search", max_new_tokens, 0, None, None, use_kv_cache, None)
    K, P = beam_width, prompt.shape[1]
    return _beam_search(model, prompt, K, P, V, max_new_tokens, float(length_penalty), stop_token, use_kv_cache)


def check_model(where, model):
    """The model searched must be a GPT: the search reads its config and feeds it through a Decoder."""
    if not isinstance(model, GPT):
        raise InputTypeError(f"{where}: model must be a GPT, got {type(model).__name__}")


def _beam_search(model, prompt, K, P, V, max_new_tokens, alpha, stop_token, use_kv_cache):
    with Decoder(model, 1, P, use_kv_cache) as decoder:
        return _search(decoder, prompt, K, P, V, max_new_tokens, alpha, stop_token)


def _search(decoder, prompt, K, P, V, max_new_tokens, alpha, stop_token):
    sequences = prompt  # (1, P) now, (K, P + t) after t steps: row r is beam r
    scores = np.zeros(1)  # the beams' summed log-probabilities, (rows,)
    finished = []  # Beams that ended with stop_token
    for step in range(max_new_tokens):
        logprobs = log_softmax(decoder.feed(sequences)[:, -1])  # (rows, V)
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
        decoder.reorder(rows)  # row r of the cache now holds the keys and values of the beam it extends
    length = sequences.shape[1] - P
    live = [Beam(sequences[r, P:].copy(), float(s), float(length_normalized(s, length, alpha))) for r, s in enumerate(scores)]
    beams = sorted(live + finished, key=lambda beam: -beam.score)[:K]  # stable: live before finished on ties
    top = beams[0] if beams else Beam(np.zeros(0, dtype=np.int64), 0.0, 0.0)
    return BeamResult(top.tokens, float(top.logprob), float(top.score), beams)


def sequence_logprob(model, prompt_ids, new_tokens):
    """The summed log-probability that the model gives new_tokens after prompt_ids, from one
    forward without a cache (the sequence must fit the block): a check independent of the search."""
    check_model("sequence_logprob", model)
    prompt = check_one_sequence("sequence_logprob", prompt_ids, model.config.vocab_size)
    new = np.asarray(new_tokens, dtype=np.int64)
    sequence = np.concatenate([prompt[0], new])
    if sequence.size - 1 > model.config.block_size:
        raise InputError(f"sequence_logprob: {sequence.size - 1} positions do not fit the block of {model.config.block_size}")
    with Decoder(model, 1, sequence.size - 1, use_kv_cache=False) as decoder:
        logits = decoder.feed(sequence[None, :-1])[0]  # (T - 1, V): position i predicts token i + 1
    logprobs = log_softmax(logits)[prompt.shape[1] - 1 :]  # (len(new), V)
    return float(logprobs[np.arange(new.size), new].sum())
