"""Exercise 19: speculative decoding's accept/reject rule. The task is in README.md; write the TODOs below.

    accept draft token d_i with probability min(1, p_i(d_i) / q_i(d_i))
    at the first rejection: emit a draw from r_i = max(0, p_i - q_i) / sum(max(0, p_i - q_i)), stop
    all k accepted: emit a bonus draw from p_k

Each emitted token is distributed as the target's p, whatever the draft's q. No backward: this is
sampling, numpy code on probabilities.
"""
import numpy as np


def sample(probs, rng):
    """One token id drawn from probs (V,), with one rng.random(): the first id whose cumulative
    probability exceeds u · total (an id of probability 0 is never drawn)."""
    cumulative = np.cumsum(probs)
    return int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))


def acceptance_probability(p_x, q_x):
    """min(1, p_x / q_x) for the target's and the draft's probabilities of one token (numbers >= 0);
    when q_x = 0: 1 if p_x > 0, else 0."""
    # TODO: return min(1, p_x / q_x) as a float, without ever dividing by q_x = 0 (README: the edge case).
    raise NotImplementedError("TODO: acceptance_probability (exercise 19)")


def residual_distribution(p_i, q_i):
    """r = max(0, p - q) / sum(max(0, p - q)), for two distributions (V,); p itself when p = q."""
    # TODO: the positive part of p_i - q_i, divided by its sum; when that sum is 0, a copy of p_i.
    raise NotImplementedError("TODO: residual_distribution (exercise 19)")


def speculative_step(p, q, draft_tokens, rng):
    """One round: p (k + 1, V) the target's distributions, q (k, V) the draft's, draft_tokens (k,)
    drawn from q. Returns the emitted tokens, an int64 array of 1 to k + 1 ids."""
    # TODO: for i = 0 .. k-1: u = rng.random(); accept draft_tokens[i] if u < acceptance_probability;
    # at the first rejection emit sample(residual_distribution(p[i], q[i]), rng) and stop. If all k
    # were accepted, emit sample(p[k], rng) too. Use rng exactly so: one rng.random() per proposal,
    # then one inside each sample().
    raise NotImplementedError("TODO: speculative_step (exercise 19)")


def greedy_step(p, draft_tokens):
    """Temperature 0: accept d_i while it is the argmax of p[i]; at the first other token emit
    p[i]'s argmax and stop; if all k are accepted, emit p[k]'s argmax. p (k + 1, V). int64 array."""
    # TODO: the same loop with np.argmax in place of the random test and of the draws.
    raise NotImplementedError("TODO: greedy_step (exercise 19)")
