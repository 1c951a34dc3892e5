"""The checks of exercise 8. Run them with `python -m exercises check attention`."""
import math

import numpy as np

import microtensor as mt
import microtensor.functional as F
from exercises.checking import CheckFailed, expect, expect_close, float64_arithmetic, gradcheck, random_tensor

SHAPE = (1, 2, 4, 4)  # (B, H, T, D): D = 4, so 1/√D = 1/2


def numpy_attention(q, k, v):
    """Causal attention in numpy, written out: the independent reference of the forward."""
    T, D = q.shape[-2], q.shape[-1]
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(D)  # (B, H, T, T)
    scores = np.where(np.tril(np.ones((T, T), dtype=bool)), scores, -np.inf)  # key j > query i: masked
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True) @ v


def inputs(seed, shape=SHAPE, dtype=np.float64):
    return [random_tensor(shape, seed=seed + n, dtype=dtype) for n in range(3)]


def upstream_gradient(shape, seed, dtype=np.float64):
    return np.random.default_rng(seed).normal(size=shape).astype(dtype)


def gradients(attention, q, k, v, upstream):
    for t in (q, k, v):
        t.zero_grad()
    attention(q, k, v).backward(mt.tensor(upstream))
    return q.grad, k.grad, v.grad


def reference_gradients(q, k, v, upstream):
    """dL/dq, dL/dk, dL/dv from microtensor's own F.scaled_dot_product_attention, on copies."""
    copies = [mt.tensor(t.numpy(), requires_grad=True) for t in (q, k, v)]
    return gradients(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=True), *copies, upstream)


def numpy_backward(q, k, v, probs, upstream, scale, keys_seen):
    """dq, dk, dv in numpy from the forward's P, visiting for query i the keys j where keys_seen[i, j]:
    the right mask (j <= i) or a kernel's off-by-one (j < i), to name that mistake when it is made."""
    seen_probs = np.where(keys_seen, probs, 0.0)  # (B, H, T, T)
    d_probs = np.where(keys_seen, upstream @ np.swapaxes(v, -1, -2), 0.0)  # dP = dO vᵀ
    d_scores = seen_probs * (d_probs - (seen_probs * d_probs).sum(axis=-1, keepdims=True))  # dS
    return d_scores @ k * scale, np.swapaxes(d_scores, -1, -2) @ q * scale, np.swapaxes(seen_probs, -1, -2) @ upstream


def test_forward_matches_numpy(impl):
    """the forward equals causal attention written in numpy"""
    q, k, v = inputs(seed=1)
    expected = numpy_attention(q.numpy(), k.numpy(), v.numpy())
    expect_close(f"O of shape {SHAPE}", impl.causal_attention(q, k, v), expected, "numpy's causal attention")


def test_masked_entries_are_skipped(impl):
    """the mask: for query i the backward visits exactly the keys j <= i, the diagonal j = i included"""
    q, k, v = (t.numpy() for t in inputs(seed=15))
    B, H, T, D = q.shape
    scale = q.dtype.type(1 / math.sqrt(D))  # as CausalAttention.forward passes it
    out, probs = np.empty(q.shape), np.empty((B, H, T, T))
    impl.attention_forward(q, k, v, scale, out, probs)
    below = np.tril(np.ones((T, T), dtype=bool))  # (T, T): the keys j <= i
    given = probs.copy()
    given[..., ~below] = np.nan  # the masked entries: never to be read
    g = upstream_gradient(q.shape, seed=18)
    grads = [np.zeros(q.shape) for _ in range(3)]
    impl.attention_backward(g, q, k, v, given, scale, *grads)
    for name, grad in zip("qkv", grads):
        if np.isnan(grad).any():
            raise CheckFailed(
                f"dL/d{name} {grad.shape}: {int(np.isnan(grad).sum())} of {grad.size} values are NaN: your kernel read "
                "P_ij for a masked key j > i. Those keys contribute nothing (P_ij = 0): loop j over 0..i only"
            )
    # Only the mask is judged here: a gradient wrong in another way is the later checks' to name.
    skipping_the_diagonal = numpy_backward(q, k, v, probs, g, scale, np.tril(below, -1))
    for name, grad, wrong in zip("qkv", grads, skipping_the_diagonal):
        factors = (1.0,) if name == "v" else (1.0, math.sqrt(D), 1 / math.sqrt(D))  # whatever the scale does
        if any(np.allclose(grad, wrong * factor) for factor in factors) and not np.allclose(wrong, 0.0):
            raise CheckFailed(
                f"dL/d{name} {grad.shape} leaves out the diagonal key j = i: query i sees the keys j <= i, itself "
                "included (P_ii > 0). Loop j over 0..i, range(i + 1), in every loop over the keys"
            )


def test_every_gradient_element_is_written(impl):
    """your kernel called with grad_q, grad_k, grad_v full of NaN (standing for old values): every element must be written"""
    q, k, v = (t.numpy() for t in inputs(seed=19))
    B, H, T, D = q.shape
    scale = q.dtype.type(1 / math.sqrt(D))  # as CausalAttention.forward passes it
    out, probs = np.empty(q.shape), np.empty((B, H, T, T))
    impl.attention_forward(q, k, v, scale, out, probs)
    grads = [np.full(q.shape, np.nan) for _ in range(3)]  # leftovers: NaN shows where one stays
    impl.attention_backward(upstream_gradient(q.shape, seed=22), q, k, v, probs, scale, *grads)
    for name, grad in zip("qkv", grads):
        if np.isnan(grad).any():
            raise CheckFailed(
                f"grad_{name} {grad.shape}: {int(np.isnan(grad).sum())} of {grad.size} elements still hold what was "
                "there before (NaN here): set each gradient to 0 before adding into it"
            )


def test_scale_in_dq_and_dk(impl):
    """dq and dk carry the 1/√D of S = q kᵀ / √D (D = 4 here) exactly once, dv none: no gradient off by √D"""
    q, k, v = inputs(seed=11)
    g = upstream_gradient(q.shape, seed=14)
    yours = gradients(impl.causal_attention, q, k, v, g)
    expected = reference_gradients(q, k, v, g)
    root_d = math.sqrt(SHAPE[-1])
    diagnoses = {  # a gradient off by exactly this factor: what was likely done
        ("q", root_d): "is √D = 2 times too large: the 1/√D of S = q kᵀ / √D multiplies dq too",
        ("k", root_d): "is √D = 2 times too large: the 1/√D of S = q kᵀ / √D multiplies dk too",
        ("q", 1 / root_d): "is √D = 2 times too small: the 1/√D is in it twice",
        ("k", 1 / root_d): "is √D = 2 times too small: the 1/√D is in it twice",
        ("v", 1 / root_d): "has a 1/√D in it: dv = Pᵀ dO, where no scale appears",
    }
    for name, grad, reference in zip("qkv", yours, expected):
        comparable = grad is not None and grad.shape == reference.shape
        for (input_name, factor), diagnosis in diagnoses.items():
            if input_name == name and comparable and np.allclose(grad, reference * factor):
                raise CheckFailed(f"dL/d{name} of shape {q.shape} {diagnosis}")
    # Only the scale is judged here: a gradient wrong in another way is the later checks' to name.


def test_gradcheck(impl):
    """gradcheck: dq, dk, dv against finite differences, random upstream gradient"""
    gradcheck(impl.causal_attention, inputs(seed=4, shape=(1, 2, 4, 3)))


def test_gradients_match_microtensor(impl):
    """dq, dk, dv equal those of microtensor's F.scaled_dot_product_attention"""
    q, k, v = inputs(seed=7, shape=(2, 2, 5, 3))
    g = upstream_gradient(q.shape, seed=10)
    yours = gradients(impl.causal_attention, q, k, v, g)
    expected = reference_gradients(q, k, v, g)
    for name, grad, reference in zip("qkv", yours, expected):
        expect_close(f"dL/d{name} of shape {q.shape}", grad, reference, "F.scaled_dot_product_attention's backward")


def test_float32_matches_microtensor(impl):
    """in float32 the gradients equal F.scaled_dot_product_attention's"""
    q, k, v = inputs(seed=23, shape=(2, 2, 5, 4), dtype=np.float32)
    g = upstream_gradient(q.shape, seed=26, dtype=np.float32)
    yours = gradients(impl.causal_attention, q, k, v, g)
    expected = reference_gradients(q, k, v, g)
    for name, grad, reference in zip("qkv", yours, expected):
        expect_close(f"dL/d{name} in float32", grad, reference, "F.scaled_dot_product_attention's backward", atol=1e-5, rtol=1e-4)


def test_float32_arithmetic_stays_float32(impl):
    """compiled, the backward kernel computes in float32 for float32 arrays (no bare 0.0)"""
    q, k, v = (t.numpy() for t in inputs(seed=27, shape=(1, 1, 3, 2), dtype=np.float32))
    B, H, T, D = q.shape
    scale = q.dtype.type(1 / math.sqrt(D))
    out, probs = np.empty_like(q), np.empty((B, H, T, T), dtype=q.dtype)
    impl.attention_forward(q, k, v, scale, out, probs)
    arguments = (upstream_gradient(q.shape, seed=30, dtype=np.float32), q, k, v, probs, scale,
                 np.empty_like(q), np.empty_like(k), np.empty_like(v))
    impl.attention_backward(*arguments)  # runs at all (not a TODO any more)
    promoted = float64_arithmetic(impl.attention_backward, *arguments)
    expect(not promoted, f"attention_backward computes {', '.join(promoted)} in float64 for float32 arrays: "
           "a bare Python number such as 0.0 is a float64 to Numba; start sums at q.dtype.type(0)")
