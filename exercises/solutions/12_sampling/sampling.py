"""Exercise 12: temperature, top-k and top-p sampling. The reference solution.

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
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"keep_top_k: k must be an integer >= 1, got {k!r}")
    V = logits.shape[-1]
    kth = np.sort(logits, axis=-1)[:, V - min(k, V)][:, None]  # (B, 1): each row's k-th largest
    return np.where(logits < kth, -np.inf, logits).astype(logits.dtype)  # ties with the k-th stay


def keep_top_p(probs, p):
    """Which tokens nucleus (top-p) sampling keeps, a bool array (B, V): in each row, the smallest set
    of the most probable tokens whose probabilities add up to at least p. A token is kept when the
    probabilities ranked above it add up to less than p, so the most probable token is always kept.
    Equal probabilities are ranked by id, the lower id first. Raises ValueError unless 0 < p <= 1."""
    if not 0 < p <= 1:  # a nan fails this too
        raise ValueError(f"keep_top_p: p must be in (0, 1], got {p!r}")
    order = np.argsort(-probs, axis=-1, kind="stable")  # (B, V): ids from the most probable down
    sorted_probs = np.take_along_axis(probs, order, axis=-1)
    above = np.cumsum(sorted_probs, axis=-1) - sorted_probs  # the mass ranked above each token
    keep = np.zeros(probs.shape, dtype=bool)
    np.put_along_axis(keep, order, above < p, axis=-1)  # back in id order
    return keep


def distribution(logits, temperature, top_k=None, top_p=None):
    """The distribution the next token is drawn from, (B, V) float64, each row summing to 1.

    temperature 0: one-hot at each row's argmax (ties: the lower id). Otherwise softmax(logits /
    temperature) after keep_top_k (when top_k is not None), then restricted to keep_top_p of those
    probabilities (when top_p is not None) and renormalized. Raises ValueError for a temperature
    below 0 (or not finite), a top_k that is not an integer >= 1 (2.5, True), a top_p outside (0, 1],
    whatever the temperature."""
    if not (np.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"distribution: temperature must be a finite number >= 0 (0: greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1):
        raise ValueError(f"distribution: top_k must be None or an integer >= 1, got {top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"distribution: top_p must be None or a number in (0, 1], got {top_p!r}")
    logits = np.asarray(logits, dtype=np.float64)  # (B, V)
    if temperature == 0:
        probs = np.zeros_like(logits)
        probs[np.arange(logits.shape[0]), logits.argmax(axis=-1)] = 1.0  # argmax: ties to the lower id
        return probs
    logits = logits / temperature  # below 1 sharpens, above 1 flattens
    if top_k is not None:
        logits = keep_top_k(logits, top_k)
    probs = softmax(logits)
    if top_p is not None:
        probs = np.where(keep_top_p(probs, top_p), probs, 0.0)
        probs = probs / probs.sum(axis=-1, keepdims=True)  # the nucleus, renormalized
    return probs


def sample(logits, rng, temperature=1.0, top_k=None, top_p=None):
    """Next token ids (B,) int64 from last-position logits (B, V). temperature 0: each row's argmax,
    drawing nothing from rng. Otherwise one draw per row, in row order, from `distribution(...)`
    with rng.choice(V, p=row) (rng: a numpy Generator, e.g. np.random.default_rng(seed))."""
    probs = distribution(logits, temperature, top_k, top_p)  # (B, V); checks the options
    if temperature == 0:
        return np.asarray(logits).argmax(axis=-1).astype(np.int64)
    V = probs.shape[-1]
    return np.array([rng.choice(V, p=row) for row in probs], dtype=np.int64)
