"""Exercise 12: temperature, top-k and top-p sampling. The task is in README.md; write the TODOs below.

    p = softmax(logits / T)  restricted to the top k, then to the nucleus of mass top_p, renormalized
    T = 0: the argmax (greedy)

Everything works on a batch of rows, logits (B, V): B sequences, V tokens in the vocabulary. There
is no backward: sampling happens after the model, under no_grad.
"""
import numpy as np


def softmax(logits):
    """Row-wise softmax of (B, V) logits in float64; −inf logits get probability 0 (each row must
    hold at least one finite logit)."""
    logits = np.asarray(logits, dtype=np.float64)
    exps = np.exp(logits - logits.max(axis=-1, keepdims=True))  # the largest becomes e^0 = 1: no overflow
    return exps / exps.sum(axis=-1, keepdims=True)


def keep_top_k(logits, k):
    """logits (B, V) with every logit below the k-th largest of its row set to −inf (a new array of
    the same dtype). Logits tied with the k-th largest are all kept, so a row may keep more than k;
    k >= V keeps everything; the logits given are left unchanged. Raises ValueError unless k is an
    integer >= 1 (a bool is not one)."""
    # TODO: refuse a k that is not an integer >= 1 (2.5, True) with a ValueError; find each row's
    # k-th largest value (np.sort along the row, or np.partition), shape (B, 1); return
    # np.where(logits < kth, -np.inf, logits), a new array.
    raise NotImplementedError("TODO: keep_top_k (exercise 12)")


def keep_top_p(probs, p):
    """Which tokens nucleus (top-p) sampling keeps, a bool array (B, V): in each row, the smallest set
    of the most probable tokens whose probabilities add up to at least p. A token is kept when the
    probabilities ranked above it add up to less than p, so the most probable token is always kept.
    Equal probabilities are ranked by id, the lower id first. Raises ValueError unless 0 < p <= 1."""
    # TODO: refuse p outside (0, 1]; order each row from the most probable down with
    # np.argsort(-probs, axis=-1, kind="stable"); the mass ranked above each token is the cumulative
    # sum minus the token's own probability; keep where it is < p; put the answers back in id order
    # (np.put_along_axis, or index with the inverse permutation).
    raise NotImplementedError("TODO: keep_top_p (exercise 12)")


def distribution(logits, temperature, top_k=None, top_p=None):
    """The distribution the next token is drawn from, (B, V) float64, each row summing to 1.

    temperature 0: one-hot at each row's argmax (ties: the lower id). Otherwise softmax(logits /
    temperature) after keep_top_k (when top_k is not None), then restricted to keep_top_p of those
    probabilities (when top_p is not None) and renormalized. Raises ValueError for a temperature
    below 0 (or not finite), a top_k that is not an integer >= 1 (2.5, True), a top_p outside (0, 1],
    whatever the temperature."""
    # TODO: check the three options first (so a bad top_k is refused even at temperature 0); then
    # the greedy case; then divide in float64, top-k on the logits, softmax, top-p on the
    # probabilities (zero the rest), and divide each row by its new sum.
    raise NotImplementedError("TODO: distribution (exercise 12)")


def sample(logits, rng, temperature=1.0, top_k=None, top_p=None):
    """Next token ids (B,) int64 from last-position logits (B, V). temperature 0: each row's argmax,
    drawing nothing from rng. Otherwise one draw per row, in row order, from `distribution(...)`
    with rng.choice(V, p=row) (rng: a numpy Generator, e.g. np.random.default_rng(seed))."""
    # TODO: the options are checked by distribution (call it before anything else); greedy returns
    # the argmax as int64; otherwise one rng.choice per row.
    raise NotImplementedError("TODO: sample (exercise 12)")
