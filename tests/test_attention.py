"""Attention in both kernel sets: forward against a plain numpy reference, backward against
PyTorch's, the readable and fast kernels called directly on the views they are given, and the fast
kernels' fallback without BLAS. (Gradients against finite differences: tests/test_gradcheck_cases.py.)

Tolerances: float64 results are held to 1e-12 (sums of a few products and exponentials); float32
ones to 1e-5 absolute (inputs of unit scale, so outputs and gradients are of unit scale, and
float32 rounds at ~6e-8 relative, a few hundred roundings at most along any path here).
"""
import numba
import numpy as np
import pytest

import microtensor as mt
import microtensor.functional as F
from microtensor.ops import attention as readable
from microtensor.ops.attention import attention_reference
from helpers import needs_jit, randn

TOLERANCE = {np.float32: 1e-5, np.float64: 1e-12}


def assert_close(got, expected, dtype):
    tolerance = TOLERANCE[dtype]
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance)


# --------------------------------------------------------------------------------- through the ops


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("Tq, Tk", [(5, 5), (2, 5), (1, 4)])
def test_attention_against_reference(kernel_set, dtype, causal, Tq, Tk):
    q, k, v = randn(2, 3, Tq, 4, dtype=dtype), randn(2, 3, Tk, 4, seed=1, dtype=dtype), randn(2, 3, Tk, 4, seed=2, dtype=dtype)
    got = F.scaled_dot_product_attention(mt.tensor(q), mt.tensor(k), mt.tensor(v), causal=causal)
    assert got.dtype == dtype
    expected = attention_reference(*(x.astype(np.float64) for x in (q, k, v)), causal)
    assert_close(got.numpy(), expected, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [True, False])
def test_multi_head_attention_splits_attends_and_merges(kernel_set, dtype, causal):
    B, T, H, D = 2, 5, 3, 4
    qkv = randn(B, T, 3 * H * D, dtype=dtype)
    heads = qkv.astype(np.float64).reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)  # (3, B, H, T, D), by hand
    expected = attention_reference(heads[0], heads[1], heads[2], causal).transpose(0, 2, 1, 3).reshape(B, T, H * D)
    got = F.multi_head_attention(mt.tensor(qkv), H, causal=causal)
    assert got.dtype == dtype
    assert_close(got.numpy(), expected, dtype)
    with pytest.raises(ValueError, match="multi_head_attention: the last dim of qkv"):
        F.multi_head_attention(mt.tensor(qkv[:, :, :-1]), H)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [True, False])
def test_gradients_against_torch(kernel_set, dtype, causal):
    """q, k, v gradients of scaled_dot_product_attention (Tq < Tk: the queries are the last
    positions) and of multi_head_attention, against PyTorch's in float64."""
    torch = pytest.importorskip("torch")
    q, k, v = randn(2, 3, 4, 5, dtype=dtype), randn(2, 3, 6, 5, seed=1, dtype=dtype), randn(2, 3, 6, 5, seed=2, dtype=dtype)
    grad = randn(2, 3, 4, 5, seed=3, dtype=dtype)
    ours = [mt.tensor(x, requires_grad=True) for x in (q, k, v)]
    F.scaled_dot_product_attention(*ours, causal=causal).backward(grad)
    theirs = [torch.tensor(x.astype(np.float64), requires_grad=True) for x in (q, k, v)]
    mask = torch.ones(4, 6, dtype=torch.bool).tril(diagonal=2) if causal else None  # query i sees keys <= 2 + i
    torch.nn.functional.scaled_dot_product_attention(*theirs, attn_mask=mask).backward(torch.tensor(grad.astype(np.float64)))
    for mine, reference in zip(ours, theirs):
        assert mine.grad.dtype == dtype
        assert_close(mine.grad, reference.grad.numpy(), dtype)

    B, T, H, D = 2, 5, 3, 4
    qkv, grad = randn(B, T, 3 * H * D, seed=4, dtype=dtype), randn(B, T, H * D, seed=5, dtype=dtype)
    mine = mt.tensor(qkv, requires_grad=True)
    F.multi_head_attention(mine, H, causal=causal).backward(grad)
    reference = torch.tensor(qkv.astype(np.float64), requires_grad=True)
    heads = reference.reshape(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
    out = torch.nn.functional.scaled_dot_product_attention(heads[0], heads[1], heads[2], is_causal=causal)
    out.permute(0, 2, 1, 3).reshape(B, T, H * D).backward(torch.tensor(grad.astype(np.float64)))
    assert_close(mine.grad, reference.grad.numpy(), dtype)


def test_incremental_attention_equals_the_full_causal_forward(kernel_set):
    q, k, v = randn(1, 2, 6, 4), randn(1, 2, 6, 4, seed=1), randn(1, 2, 6, 4, seed=2)
    full = F.scaled_dot_product_attention(mt.tensor(q), mt.tensor(k), mt.tensor(v)).numpy()
    for t in range(6):  # one query at a time, against the keys so far: what a KV cache does
        row = F.scaled_dot_product_attention(mt.tensor(q[:, :, t : t + 1]), mt.tensor(k[:, :, : t + 1]), mt.tensor(v[:, :, : t + 1]))
        np.testing.assert_allclose(row.numpy()[:, :, 0], full[:, :, t], rtol=1e-12, atol=1e-12)


def test_errors():
    q = mt.ones(1, 2, 3, 4)
    with pytest.raises(ValueError, match="scaled_dot_product_attention: causal attention needs Tk >= Tq"):
        F.scaled_dot_product_attention(q, mt.ones(1, 2, 2, 4), mt.ones(1, 2, 2, 4))
    with pytest.raises(ValueError, match="scaled_dot_product_attention: shapes q"):
        F.scaled_dot_product_attention(q, mt.ones(1, 2, 3, 5), mt.ones(1, 2, 3, 5))
    with pytest.raises(ValueError, match="scaled_dot_product_attention: k must be a 4-d Tensor"):
        F.scaled_dot_product_attention(q, mt.ones(2, 3, 4), mt.ones(1, 2, 3, 4))


# --------------------------------------------------------------------------------- the kernels directly


def views(dtype, B=2, H=3, Tq=5, Tk=7, D=4, seed=0):
    """Inputs and outputs as the Functions and users give them, in several layouts: q, k, v, the
    upstream gradient and the outputs as views of wider arrays, k transposed in memory, and q with
    every other number of a row (a layout BLAS cannot read)."""
    rng = np.random.default_rng(seed)
    wide = rng.standard_normal((B, Tk, 3, H, D)).astype(dtype).transpose(2, 0, 3, 1, 4)  # (3, B, H, Tk, D) views
    q = rng.standard_normal((B, H, Tq, 2 * D)).astype(dtype)[..., ::2]  # every other number
    k = np.ascontiguousarray(wide[1].swapaxes(-1, -2)).swapaxes(-1, -2)  # each matrix transposed in memory
    v = wide[2]
    grad_out = rng.standard_normal((B, Tq, H, D)).astype(dtype).transpose(0, 2, 1, 3)  # heads of a (B, T, C) array
    return q, k, v, grad_out


def output_views(dtype, B=2, H=3, Tq=5, Tk=7, D=4):
    """out, grad_q, grad_k, grad_v as the Functions allocate them: heads of (B, T, C) arrays."""
    out = np.full((B, Tq, H, D), np.nan, dtype=dtype).transpose(0, 2, 1, 3)
    grad_q = np.full((B, Tq, H, D), np.nan, dtype=dtype).transpose(0, 2, 1, 3)
    grad_k, grad_v = (np.full((B, Tk, 3, H, D), np.nan, dtype=dtype).transpose(2, 0, 3, 1, 4)[i] for i in (1, 2))
    return out, grad_q, grad_k, grad_v


def reference_gradients(q, k, v, grad_out, causal):
    """dq, dk, dv by the formulas of ops/attention.py's docstring, in numpy float64."""
    q, k, v, grad_out = (x.astype(np.float64) for x in (q, k, v, grad_out))
    Tq, Tk, D = q.shape[-2], k.shape[-2], q.shape[-1]
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(D)
    if causal:
        scores = np.where(np.arange(Tk)[None, :] <= (Tk - Tq + np.arange(Tq))[:, None], scores, -np.inf)
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    d_p = grad_out @ v.swapaxes(-1, -2)
    d_s = p * (d_p - (p * d_p).sum(axis=-1, keepdims=True))
    return d_s @ k / np.sqrt(D), d_s.swapaxes(-1, -2) @ q / np.sqrt(D), p.swapaxes(-1, -2) @ grad_out


def kernel_sets_to_call():
    """(name, forward, backward) of each set's kernels, called directly (the fast ones only compiled)."""
    sets = [("readable", readable.attention_forward, readable.attention_backward)]
    if not numba.config.DISABLE_JIT:
        from microtensor.fast import attention as fast

        sets.append(("fast", fast.attention_forward, fast.attention_backward))
    return sets


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [True, False])
def test_kernels_called_directly_on_views(dtype, causal):
    """Each set's forward and backward kernel on strided views (inputs and outputs), against the
    reference; readable and fast therefore agree with each other too."""
    q, k, v, grad_out = views(dtype)
    scale = dtype(1 / np.sqrt(q.shape[-1]))
    expected_out = attention_reference(*(x.astype(np.float64) for x in (q, k, v)), causal)
    expected_grads = reference_gradients(q, k, v, grad_out, causal)
    for name, forward, backward in kernel_sets_to_call():
        out, grad_q, grad_k, grad_v = output_views(dtype)
        probs = np.full((2, 3, 5, 7), np.nan, dtype=dtype)
        forward(q, k, v, scale, causal, out, probs)
        assert_close(out, expected_out, dtype)
        assert np.allclose(probs.sum(axis=-1), 1) and (not causal or probs[0, 0, 0, 3:].max() == 0), name
        backward(grad_out, q, k, v, probs, scale, causal, grad_q, grad_k, grad_v)
        for got, expected in zip((grad_q, grad_k, grad_v), expected_grads):
            assert_close(got, expected, dtype)


# --------------------------------------------------------------------------------- without BLAS


@needs_jit
@pytest.mark.parametrize("causal", [True, False])
def test_fast_kernels_without_blas_run_the_readable_ones(causal, monkeypatch):
    """Where numpy's BLAS cannot be called from compiled code, the fast twins run the readable
    kernels: the same results, bit for bit, and no BLAS kernel runs."""
    from microtensor.fast import attention as fast
    from microtensor.fast import blas

    def no_blas(*args):
        raise AssertionError("a BLAS kernel ran although BLAS is not available")

    monkeypatch.setattr(blas, "available", lambda: False)
    monkeypatch.setattr(fast, "attention_forward_by_blas", no_blas)
    monkeypatch.setattr(fast, "attention_backward_by_blas", no_blas)
    q, k, v, grad_out = views(np.float64)
    scale = 1 / np.sqrt(q.shape[-1])
    results = []
    for forward, backward in ((readable.attention_forward, readable.attention_backward), (fast.attention_forward, fast.attention_backward)):
        out, grad_q, grad_k, grad_v = output_views(np.float64)
        probs = np.empty((2, 3, 5, 7))
        forward(q, k, v, scale, causal, out, probs)
        backward(grad_out, q, k, v, probs, scale, causal, grad_q, grad_k, grad_v)
        results.append((out, probs, grad_q, grad_k, grad_v))
    for from_readable, from_fast in zip(*results):
        np.testing.assert_array_equal(from_fast, from_readable)
    with mt.using_kernels("fast"):  # and through the op
        inputs = [mt.tensor(x, requires_grad=True) for x in (q, k, v)]
        out = F.scaled_dot_product_attention(*inputs, causal=causal)
        out.backward(grad_out)
    np.testing.assert_allclose(out.numpy(), attention_reference(q, k, v, causal), rtol=1e-12, atol=1e-12)
    for tensor, expected in zip(inputs, reference_gradients(q, k, v, grad_out, causal)):
        np.testing.assert_allclose(tensor.grad, expected, rtol=1e-12, atol=1e-12)
