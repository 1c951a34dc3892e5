"""Sampling: the next token from the logits, greedy or drawn, over a Decoder (gpt/generation/decoder.py).

    logits (B, V) of the last position -> greedy: argmax
                                       -> else: softmax(logits / temperature), keeping only the
                                          top_k largest logits and then the smallest set of tokens
                                          whose probability reaches top_p, and one draw from it

`sampled_tokens` is the loop behind `GPT.generate` and `GPT.generate_tokens`: feed the sequences to
the Decoder, sample a token per sequence from the last position's logits, append, repeat.
"""
import numpy as np

from microtensor import InputError

from gpt.generation.decoder import KERNEL_TOKENS, Decoder, check_generation_options


NOT_FINITE = "generate: the model's logits hold an inf or a nan (are its weights finite?)"


def sampled_tokens(model, prompt, max_new_tokens, temperature, top_k, top_p, use_kv_cache, seed, many_steps_per_call=False):
    """Yield (next token ids (B,), their logits (B, V)) one step at a time, from prompt (B, T) int64
    (checked by the caller); see gpt/generation/decoder.py for the window rule past block_size.

    many_steps_per_call: at temperature 0 under the decode kernel, compute the greedy steps the
    window holds in one kernel call (Decoder.feed_greedy) and then yield them, instead of one call
    per step: the same tokens, without Python between the steps, for a caller that wants them all
    (GPT.generate); a caller that shows each token as it comes keeps one step per call."""
    rng = np.random.default_rng(seed)
    with Decoder(model, prompt.shape[0], prompt.shape[1], use_kv_cache) as decoder:
        sequences = prompt
        produced = 0
        while produced < max_new_tokens:
            if many_steps_per_call and temperature == 0 and decoder.kernel is not None:
                # greedy under the decode kernel: many steps in one call (Decoder.feed_greedy), no Python between them
                chosen, logits = decoder.feed_greedy(sequences, greedy_steps(decoder, sequences.shape[1], max_new_tokens - produced))
                finite = np.isfinite(logits).all(axis=(0, 2))  # (steps,): sample's check, step by step
            else:
                logits = decoder.feed(sequences)[:, -1:]  # (B, 1, V): the last position predicts the next token
                chosen = sample(logits[:, 0], temperature, top_k, top_p, rng)[:, None]  # (B, 1)
                finite = [True]  # checked by sample
            sequences = np.concatenate([sequences, chosen], axis=1)
            for step in range(chosen.shape[1]):
                if not finite[step]:
                    raise InputError(NOT_FINITE)
                produced += 1
                yield chosen[:, step], logits[:, step]


def greedy_steps(decoder, length, wanted):
    """How many greedy steps one kernel call takes from sequences of `length` tokens: all `wanted`
    that the window holds without moving (the last token fed stays inside it), or 1 when the
    window's new tokens are too many for the kernel (a long prompt, a rebuilt window), which then
    go through the modules once."""
    start = decoder.start_for(length)
    fed = decoder.fed if start == decoder.start else 0  # a moved window is rebuilt from its start
    if length - start - fed > KERNEL_TOKENS:
        return 1
    return min(wanted, decoder.block - (length - start) + 1)


def sample(logits, temperature, top_k, top_p, rng):
    """Next token ids (B,) from last-position logits (B, V): the argmax when temperature is 0, else a
    draw from `token_distribution`: softmax(logits / temperature), restricted by `keep_top_k` and
    then `keep_top_p`."""
    if not np.isfinite(logits).all():
        raise InputError(NOT_FINITE)
    if temperature == 0:
        return logits.argmax(axis=-1)
    check_generation_options("generate", 0, temperature, top_k, top_p, True, None)
    probs = token_distribution(logits, temperature, top_k, top_p)  # (B, V)
    return np.array([rng.choice(probs.shape[-1], p=row) for row in probs], dtype=np.int64)


def token_distribution(logits, temperature, top_k=None, top_p=None):
    """The distributions `sample` draws from, (m, V) float64 rows that sum to 1: one-hot at the
    argmax when temperature is 0, else softmax(logits / temperature) restricted by top_k and then
    top_p (renormalized). A temperature so small that the division overflows (1e-320) gives the
    limit as temperature -> 0: greedy, the argmax's token (tokens tied at the max share it)."""
    logits = np.asarray(logits, dtype=np.float64)  # (m, V)
    if temperature == 0:
        probs = np.zeros_like(logits)
        probs[np.arange(logits.shape[0]), logits.argmax(axis=-1)] = 1  # argmax: ties to the lower id, as sample
        return probs
    # Shifted by the max before the division, so that the largest logit stays 0 whatever the
    # temperature: a tiny one (1e-320) sends the others to -inf, not to inf - inf = nan, and gives
    # the limit of sampling as temperature -> 0, greedy (shared among tokens tied at the max).
    logits = logits - logits.max(axis=-1, keepdims=True)
    with np.errstate(over="ignore"):  # a difference / a tiny temperature -> -inf: a probability of 0
        logits = logits / temperature
    if top_k is not None:
        logits = keep_top_k(logits, top_k)
    probs = np.exp(logits)  # the largest is exp(0) = 1, so the sum below is >= 1
    probs /= probs.sum(axis=-1, keepdims=True)
    if top_p is not None:
        probs = np.where(keep_top_p(probs, top_p), probs, 0)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def keep_top_k(logits, top_k):
    """logits (B, V) with every token below the top_k-th largest set to -inf. Tokens tied with the
    top_k-th are all kept (as in nanoGPT), so more than top_k may remain; top_k >= V keeps all."""
    kth = np.sort(logits, axis=-1)[:, -min(top_k, logits.shape[-1])][:, None]  # (B, 1)
    return np.where(logits < kth, -np.inf, logits)


def keep_top_p(probs, top_p):
    """Which tokens top-p ("nucleus") sampling keeps, (B, V) bool: the smallest set of the most
    probable tokens whose probabilities add up to at least top_p. A token is kept when the tokens
    ranked above it add up to less than top_p, so the most probable token is always kept.
    (Tokens of equal probability are ranked by id, lower first.)"""
    order = np.argsort(-probs, axis=-1, kind="stable")  # (B, V): ids from the most probable down
    sorted_probs = np.take_along_axis(probs, order, axis=-1)
    above = np.cumsum(sorted_probs, axis=-1) - sorted_probs  # the probability ranked above each token
    keep_sorted = above < top_p
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    return keep


def log_softmax(logits):
    """log p = logits - log(sum(exp(logits))), over the last axis, float64 (shifted by the max)."""
    logits = np.asarray(logits, dtype=np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
