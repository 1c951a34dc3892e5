"""Exercise 19: speculative decoding's accept/reject rule. The reference solution.

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
    if q_x == 0:
        return 1.0 if p_x > 0 else 0.0  # p / 0 is +inf for p > 0; a token neither model can emit is rejected
    return min(1.0, p_x / q_x)


def residual_distribution(p_i, q_i):
    """r = max(0, p - q) / sum(max(0, p - q)), for two distributions (V,); p itself when p = q."""
    excess = np.maximum(p_i - q_i, 0.0)  # (V,): zero wherever q >= p
    total = excess.sum()
    if total == 0:  # p = q: no rejection can happen, but the function must still return a distribution
        return p_i.copy()
    return excess / total


def speculative_step(p, q, draft_tokens, rng):
    """One round: p (k + 1, V) the target's distributions, q (k, V) the draft's, draft_tokens (k,)
    drawn from q. Returns the emitted tokens, an int64 array of 1 to k + 1 ids."""
    k = len(draft_tokens)
    emitted = []
    for i in range(k):
        d = draft_tokens[i]
        u = rng.random()  # one uniform per proposal, drawn before the test
        if u < acceptance_probability(p[i, d], q[i, d]):
            emitted.append(int(d))
            continue
        emitted.append(sample(residual_distribution(p[i], q[i]), rng))  # the first rejection ends the round
        return np.array(emitted, dtype=np.int64)
    emitted.append(sample(p[k], rng))  # all k accepted: the bonus token, from the target's last row
    return np.array(emitted, dtype=np.int64)


def greedy_step(p, draft_tokens):
    """Temperature 0: accept d_i while it is the argmax of p[i]; at the first other token emit
    p[i]'s argmax and stop; if all k are accepted, emit p[k]'s argmax. p (k + 1, V). int64 array."""
    k = len(draft_tokens)
    emitted = []
    for i in range(k):
        best = int(np.argmax(p[i]))  # ties: the lower id, as np.argmax
        emitted.append(best)
        if draft_tokens[i] != best:
            return np.array(emitted, dtype=np.int64)
    emitted.append(int(np.argmax(p[k])))
    return np.array(emitted, dtype=np.int64)
