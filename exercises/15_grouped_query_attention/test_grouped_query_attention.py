"""The checks of exercise 15. Run them with `python -m exercises check grouped_query_attention`."""
import re

import numpy as np

import microtensor as mt
import microtensor.functional as F
from microtensor.errors import InputError
from exercises.checking import CheckFailed, expect, expect_close, expect_raises, gradcheck, random_tensor

B, T, D = 1, 3, 2


def heads(n_head, n_kv_head, seed, dtype=np.float64):
    """q (B, H, T, D), k and v (B, Hk, T, D)."""
    q = random_tensor((B, n_head, T, D), seed=seed, dtype=dtype)
    k = random_tensor((B, n_kv_head, T, D), seed=seed + 1, dtype=dtype)
    v = random_tensor((B, n_kv_head, T, D), seed=seed + 2, dtype=dtype)
    return q, k, v


def forward_and_gradients(attention, q, k, v, upstream):
    """O, and dL/dq, dL/dk, dL/dv for L = sum(O * upstream), on fresh copies of q, k, v."""
    q, k, v = (mt.tensor(t.numpy(), requires_grad=True) for t in (q, k, v))
    out = attention(q, k, v)
    out.backward(mt.tensor(upstream))
    return out.numpy(), q.grad, k.grad, v.grad


def microtensor_attention(q, k, v):
    """microtensor's own op: F.scaled_dot_product_attention takes k, v with fewer heads than q."""
    return F.scaled_dot_product_attention(q, k, v, causal=True)


def per_head_gradients(q, k, v, upstream):
    """dL/dk and dL/dv of each query head's own copy of its key/value head, (B, H, T, D) each:
    microtensor's op on k and v repeated G times, as multi-head attention."""
    group = q.shape[1] // k.shape[1]
    k_copies, v_copies = (mt.tensor(np.repeat(t.numpy(), group, axis=1)) for t in (k, v))
    _, _, grad_k, grad_v = forward_and_gradients(microtensor_attention, q, k_copies, v_copies, upstream)
    return grad_k, grad_v


def compare_to_microtensor(impl, n_head, n_kv_head, seed, dtype=np.float64, atol=1e-10, rtol=1e-7):
    q, k, v = heads(n_head, n_kv_head, seed, dtype)
    upstream = np.random.default_rng(seed + 3).normal(size=q.shape).astype(dtype)
    yours = forward_and_gradients(impl.grouped_query_attention, q, k, v, upstream)
    expected = forward_and_gradients(microtensor_attention, q, k, v, upstream)
    case = f"H = {n_head}, Hk = {n_kv_head}"
    reference = "F.scaled_dot_product_attention"
    expect_close(f"O {q.shape}, {case}", yours[0], expected[0], reference, atol=atol, rtol=rtol)
    expect_close(f"dL/dq {q.shape}, {case}", yours[1], expected[1], reference, atol=atol, rtol=rtol)
    group = n_head // n_kv_head
    per_head = per_head_gradients(q, k, v, upstream)
    for name, grad, wanted, copies in zip("kv", yours[2:], expected[2:], per_head):
        last_head_alone = copies[:, group - 1 :: group]  # (B, Hk, T, D): what overwriting leaves
        if group > 1 and grad is not None and grad.shape == wanted.shape and np.allclose(grad, last_head_alone):
            raise CheckFailed(
                f"dL/d{name} {grad.shape}, {case}: yours is the gradient of the LAST query head of each group alone; "
                f"the {group} query heads of a group all used that key/value head, so their gradients add up"
            )
        expect_close(f"dL/d{name} {k.shape}, {case}", grad, wanted, reference, atol=atol, rtol=rtol)


def test_backward_writes_every_element(impl):
    """gqa_backward writes every element of grad_q, grad_k, grad_v (they arrive holding old values)"""
    q, k, v = (t.numpy() for t in heads(4, 2, seed=21))
    out, probs = np.empty(q.shape), np.empty((B, 4, T, T))
    impl.gqa_forward(q, k, v, out, probs)
    grads = [np.full(q.shape, np.nan), np.full(k.shape, np.nan), np.full(v.shape, np.nan)]  # leftovers: NaN
    impl.gqa_backward(np.random.default_rng(24).normal(size=q.shape), q, k, v, probs, *grads)
    for name, grad in zip("qkv", grads):
        if np.isnan(grad).any():
            raise CheckFailed(
                f"grad_{name} {grad.shape}: {int(np.isnan(grad).sum())} of {grad.size} elements still hold what was "
                "there before (NaN here): set each key/value head's gradient to 0 before adding into it"
            )


def test_multi_head_when_hk_equals_h(impl):
    """Hk = H is ordinary multi-head attention: O and gradients equal F.scaled_dot_product_attention's"""
    compare_to_microtensor(impl, 2, 2, seed=5)


def test_multi_query_when_hk_is_1(impl):
    """Hk = 1 (multi-query): one key/value head serves all 3 query heads"""
    compare_to_microtensor(impl, 3, 1, seed=9)


def test_grouped_matches_microtensor(impl):
    """H = 6 over Hk = 3 and over Hk = 2: O and gradients equal F.scaled_dot_product_attention's"""
    compare_to_microtensor(impl, 6, 3, seed=13)  # G = 2: head h reads h // 2, not h // 3 nor h % 3
    compare_to_microtensor(impl, 6, 2, seed=17)  # G = 3


def test_float32_matches_microtensor(impl):
    """in float32, O and the gradients equal F.scaled_dot_product_attention's"""
    compare_to_microtensor(impl, 4, 2, seed=25, dtype=np.float32, atol=1e-5, rtol=1e-4)


def test_gradcheck(impl):
    """gradcheck: dq, dk, dv against finite differences (H = 4, Hk = 2), random upstream gradient"""
    gradcheck(impl.grouped_query_attention, list(heads(4, 2, seed=1)))


def test_heads_that_do_not_divide_are_refused(impl):
    """H = 4 over Hk = 3, and Hk = 0: an InputError naming both numbers"""
    q, k, v = heads(4, 3, seed=29)
    error = expect_raises("grouped_query_attention with H = 4, Hk = 3", InputError, impl.grouped_query_attention, q, k, v)
    for n in (4, 3):
        expect(re.search(rf"\b{n}\b", str(error)), f"the error says {str(error)!r}; it should name {n}")
    expect_raises("group_size(2, 0)", InputError, impl.group_size, 2, 0)
