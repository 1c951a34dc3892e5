"""Attention in both kernel sets, with grouped-query heads (k, v with Hk <= H heads) and the ALiBi
bias: forward and gradients against a numpy reference written here from the definition (K/V
repeated per group, the bias added, a masked softmax), the grouped gradient against the per-head
gradients of an explicitly repeated K/V, backward against PyTorch's, the readable and fast kernels
called directly on the views they are given, the fast kernels' fallback without BLAS, ALiBi's
slopes against the paper's, and the errors. (Gradients against finite differences:
tests/test_gradcheck_cases.py.)

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
from microtensor.ops.attention import alibi_slopes, attention_reference, multi_head_attention, scaled_dot_product_attention
from helpers import needs_jit, randn

TOLERANCE = {np.float32: 1e-5, np.float64: 1e-12}


def assert_close(got, expected, dtype):
    tolerance = TOLERANCE[dtype]
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance)


# --------------------------------------------------------------------------------- the reference


def reference_probs(q, k, causal, slopes=None):
    """P (B, H, Tq, Tk) in float64, from the definition: query head h reads K/V head h // G
    (np.repeat lays K's heads out as h // G), S = q kᵀ / √D - m_h |pos_i - j| with pos_i = Tk - Tq
    + i, keys after pos_i masked when causal, softmax along the keys."""
    q, k = q.astype(np.float64), k.astype(np.float64)
    (H, Tq, D), Hk, Tk = q.shape[1:], k.shape[1], k.shape[2]
    k = np.repeat(k, H // Hk, axis=1)  # (B, H, Tk, D)
    positions = Tk - Tq + np.arange(Tq)  # the queries are the last Tq positions
    scores = np.einsum("bhid,bhjd->bhij", q, k) / np.sqrt(D)
    if slopes is not None:
        distance = np.abs(positions[:, None] - np.arange(Tk)[None, :])  # (Tq, Tk)
        scores = scores - np.asarray(slopes, dtype=np.float64)[:, None, None] * distance
    if causal:
        scores = np.where(np.arange(Tk)[None, :] <= positions[:, None], scores, -np.inf)
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True)


def reference_attention(q, k, v, causal, slopes=None):
    """O (B, H, Tq, D) = P V, with V's heads repeated as K's, in float64."""
    H, Hk = q.shape[1], k.shape[1]
    return reference_probs(q, k, causal, slopes) @ np.repeat(v.astype(np.float64), H // Hk, axis=1)


def reference_gradients(q, k, v, grad_out, causal, slopes=None):
    """dq, dk, dv by the formulas of ops/attention.py's docstring, in numpy float64, for K and V
    repeated per group; a K/V head's gradient is the sum of its repeats' (its group's heads')."""
    q, k, v, grad_out = (x.astype(np.float64) for x in (q, k, v, grad_out))
    (B, H, _, D), (Hk, Tk) = q.shape, k.shape[1:3]
    k_repeated, v_repeated = np.repeat(k, H // Hk, axis=1), np.repeat(v, H // Hk, axis=1)
    p = reference_probs(q, k, causal, slopes)
    d_p = grad_out @ v_repeated.swapaxes(-1, -2)
    d_s = p * (d_p - (p * d_p).sum(axis=-1, keepdims=True))
    d_k = d_s.swapaxes(-1, -2) @ q / np.sqrt(D)  # (B, H, Tk, D), one per query head
    d_v = p.swapaxes(-1, -2) @ grad_out
    return d_s @ k_repeated / np.sqrt(D), d_k.reshape(B, Hk, H // Hk, Tk, D).sum(axis=2), d_v.reshape(B, Hk, H // Hk, Tk, D).sum(axis=2)


def split_by_hand(qkv, H, Hk):
    """q (B, H, T, D), k, v (B, Hk, T, D) from qkv (B, T, (H + 2 Hk) D), sliced and reshaped here."""
    B, T, width = qkv.shape
    D = width // (H + 2 * Hk)
    q = qkv[:, :, : H * D].reshape(B, T, H, D).transpose(0, 2, 1, 3)
    k = qkv[:, :, H * D : (H + Hk) * D].reshape(B, T, Hk, D).transpose(0, 2, 1, 3)
    v = qkv[:, :, (H + Hk) * D :].reshape(B, T, Hk, D).transpose(0, 2, 1, 3)
    return q, k, v


# --------------------------------------------------------------------------------- through the ops


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("Tq, Tk", [(5, 5), (2, 5), (1, 4)])
def test_attention_against_reference(kernel_set, dtype, causal, Tq, Tk):
    q, k, v = randn(2, 3, Tq, 4, dtype=dtype), randn(2, 3, Tk, 4, seed=1, dtype=dtype), randn(2, 3, Tk, 4, seed=2, dtype=dtype)
    got = F.scaled_dot_product_attention(mt.tensor(q), mt.tensor(k), mt.tensor(v), causal=causal)
    assert got.dtype == dtype
    assert_close(got.numpy(), reference_attention(q, k, v, causal), dtype)
    # the module's own numpy reference (docs and other tests use it) agrees with this one
    np.testing.assert_allclose(attention_reference(*(x.astype(np.float64) for x in (q, k, v)), causal), reference_attention(q, k, v, causal), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("Tq, Tk", [(5, 5), (2, 6)])
@pytest.mark.parametrize("Hk", [1, 2, 4])
@pytest.mark.parametrize("alibi", [False, True])
def test_grouped_and_alibi_against_reference(kernel_set, dtype, causal, Tq, Tk, Hk, alibi):
    """Output and the gradients of q, k, v with Hk in {1, 2, H = 4} K/V heads, with and without
    ALiBi (slopes large enough to matter at these few positions, one of them 0), queries the last Tq
    of Tk positions."""
    H, D = 4, 3
    q, k, v = randn(2, H, Tq, D, dtype=dtype), randn(2, Hk, Tk, D, seed=1, dtype=dtype), randn(2, Hk, Tk, D, seed=2, dtype=dtype)
    grad = randn(2, H, Tq, D, seed=3, dtype=dtype)
    slopes = [0.9, 0.0, 0.35, 2.0] if alibi else None
    inputs = [mt.tensor(x, requires_grad=True) for x in (q, k, v)]
    out = F.scaled_dot_product_attention(*inputs, causal=causal, alibi_slopes=slopes)
    out.backward(grad)
    assert out.dtype == dtype
    assert_close(out.numpy(), reference_attention(q, k, v, causal, slopes), dtype)
    for tensor, expected in zip(inputs, reference_gradients(q, k, v, grad, causal, slopes)):
        assert tensor.grad.dtype == dtype and tensor.grad.shape == expected.shape
        assert_close(tensor.grad, expected, dtype)


def test_alibi_changes_the_result(kernel_set):
    """The bias is felt (the tests above would pass for a kernel that ignored the slopes only if
    the reference did too): nonzero slopes move the output, and a head of larger slope puts more
    weight on the nearest keys."""
    q, k, v = randn(1, 2, 6, 3), randn(1, 2, 6, 3, seed=1), randn(1, 2, 6, 3, seed=2)
    plain = F.scaled_dot_product_attention(mt.tensor(q), mt.tensor(k), mt.tensor(v)).numpy()
    biased = F.scaled_dot_product_attention(mt.tensor(q), mt.tensor(k), mt.tensor(v), alibi_slopes=[0.0, 3.0]).numpy()
    np.testing.assert_array_equal(biased[:, 0], plain[:, 0])  # slope 0: exactly plain attention
    assert np.abs(biased[:, 1] - plain[:, 1]).max() > 0.1
    np.testing.assert_allclose(biased, reference_attention(q, k, v, True, [0.0, 3.0]), rtol=1e-12, atol=1e-12)
    p = reference_probs(q, k, True, [0.0, 3.0])
    assert p[0, 1, -1, -1] > 0.9  # slope 3: the last query's own key has almost all the weight


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [True, False])
def test_no_slopes_is_exactly_plain_attention(kernel_set, dtype, causal):
    """alibi_slopes=None, all zeros, and n_kv_head=None or = n_head: the same numbers bit for bit,
    forward and backward (a zero slope adds exactly nothing; the fast set skips its pass)."""
    q, k, v = randn(2, 3, 4, 5, dtype=dtype), randn(2, 3, 6, 5, seed=1, dtype=dtype), randn(2, 3, 6, 5, seed=2, dtype=dtype)
    grad = randn(2, 3, 4, 5, seed=3, dtype=dtype)
    results = []
    for slopes in (None, np.zeros(3, dtype), [0.0, 0.0, 0.0]):
        inputs = [mt.tensor(x, requires_grad=True) for x in (q, k, v)]
        out = F.scaled_dot_product_attention(*inputs, causal=causal, alibi_slopes=slopes)
        out.backward(grad)
        results.append([out.numpy()] + [t.grad for t in inputs])
    B, T, H, D = 2, 5, 3, 4
    qkv, grad = randn(B, T, 3 * H * D, seed=4, dtype=dtype), randn(B, T, H * D, seed=5, dtype=dtype)
    for n_kv_head, slopes in ((None, None), (H, None), (None, np.zeros(H))):
        tensor = mt.tensor(qkv, requires_grad=True)
        out = F.multi_head_attention(tensor, H, causal=causal, n_kv_head=n_kv_head, alibi_slopes=slopes)
        out.backward(grad)
        results.append([out.numpy(), tensor.grad])
    for first, other in ((0, 1), (0, 2), (3, 4), (3, 5)):
        for a, b in zip(results[first], results[other]):
            np.testing.assert_array_equal(a, b)
    assert_close(results[0][0], reference_attention(q, k, v, causal), dtype)  # and it is attention


@pytest.mark.parametrize("Hk", [1, 2])
@pytest.mark.parametrize("alibi", [False, True])
def test_grouped_gradient_is_the_sum_over_the_group(kernel_set, Hk, alibi):
    """Grouped attention equals multi-head attention with each K/V head repeated for its group
    (np.repeat; computed by the op with Hk = H), and a K/V head's gradient is the sum of its
    repeats' gradients."""
    H, causal = 4, True
    q, k, v = randn(2, H, 3, 4), randn(2, Hk, 5, 4, seed=1), randn(2, Hk, 5, 4, seed=2)
    grad = randn(2, H, 3, 4, seed=3)
    slopes = alibi_slopes(H) * 4 if alibi else None
    grouped = [mt.tensor(x, requires_grad=True) for x in (q, k, v)]
    out = F.scaled_dot_product_attention(*grouped, causal=causal, alibi_slopes=slopes)
    out.backward(grad)
    repeated = [mt.tensor(x, requires_grad=True) for x in (q, np.repeat(k, H // Hk, axis=1), np.repeat(v, H // Hk, axis=1))]
    out_repeated = F.scaled_dot_product_attention(*repeated, causal=causal, alibi_slopes=slopes)
    out_repeated.backward(grad)
    np.testing.assert_allclose(out.numpy(), out_repeated.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grouped[0].grad, repeated[0].grad, rtol=1e-12, atol=1e-12)
    for mine, per_head in zip(grouped[1:], repeated[1:]):
        summed = per_head.grad.reshape(2, Hk, H // Hk, 5, 4).sum(axis=2)  # the G heads of each group
        np.testing.assert_allclose(mine.grad, summed, rtol=1e-12, atol=1e-12)
        assert np.abs(mine.grad - per_head.grad[:, :: H // Hk]).max() > 1e-3  # not just the first head's


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [True, False])
def test_multi_head_attention_splits_attends_and_merges(kernel_set, dtype, causal):
    B, T, H, D = 2, 5, 3, 4
    qkv = randn(B, T, 3 * H * D, dtype=dtype)
    heads = qkv.astype(np.float64).reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)  # (3, B, H, T, D), by hand
    expected = reference_attention(heads[0], heads[1], heads[2], causal).transpose(0, 2, 1, 3).reshape(B, T, H * D)
    got = F.multi_head_attention(mt.tensor(qkv), H, causal=causal)
    assert got.dtype == dtype
    assert_close(got.numpy(), expected, dtype)
    with pytest.raises(ValueError, match="multi_head_attention: the last dim of qkv"):
        F.multi_head_attention(mt.tensor(qkv[:, :, :-1]), H)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("Hk", [1, 2, 4])
@pytest.mark.parametrize("alibi", [False, True])
def test_grouped_multi_head_attention(kernel_set, dtype, Hk, alibi):
    """qkv (B, T, (H + 2 Hk) D): the H query heads, then the Hk key heads, then the Hk value
    heads; the output and the gradient of qkv (dq, dk, dv side by side) against the reference."""
    B, T, H, D = 2, 5, 4, 3
    qkv, grad = randn(B, T, (H + 2 * Hk) * D, dtype=dtype), randn(B, T, H * D, seed=1, dtype=dtype)
    slopes = (alibi_slopes(H) * 3).astype(dtype) if alibi else None
    tensor = mt.tensor(qkv, requires_grad=True)
    out = F.multi_head_attention(tensor, H, n_kv_head=Hk, alibi_slopes=slopes)
    out.backward(grad)
    q, k, v = split_by_hand(qkv, H, Hk)
    expected = reference_attention(q, k, v, True, slopes).transpose(0, 2, 1, 3).reshape(B, T, H * D)
    assert out.dtype == dtype and out.shape == (B, T, H * D)
    assert_close(out.numpy(), expected, dtype)
    d_q, d_k, d_v = reference_gradients(q, k, v, grad.reshape(B, T, H, D).transpose(0, 2, 1, 3), True, slopes)
    merged = [x.transpose(0, 2, 1, 3).reshape(B, T, -1) for x in (d_q, d_k, d_v)]  # (B, heads, T, D) -> (B, T, heads D)
    assert_close(tensor.grad, np.concatenate(merged, axis=-1), dtype)


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


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("Hk", [1, 2])
def test_grouped_alibi_gradients_against_torch(kernel_set, causal, Hk):
    """Grouped heads and ALiBi against PyTorch in float64: its scaled_dot_product_attention with
    enable_gqa=True (and, for multi_head_attention, K/V repeated with repeat_interleave), the bias
    -m_h |pos_i - j| given as an additive attn_mask (-inf where causal masks)."""
    torch = pytest.importorskip("torch")
    H, Tq, Tk, D = 4, 3, 5, 4
    slopes = alibi_slopes(H) * 4
    positions = torch.arange(Tk - Tq, Tk)[:, None]  # (Tq, 1)
    bias = -torch.tensor(slopes)[:, None, None] * (positions - torch.arange(Tk)[None, :]).abs()  # (H, Tq, Tk)
    if causal:
        bias = bias.masked_fill(torch.arange(Tk)[None, :] > positions, -torch.inf)
    q, k, v = randn(2, H, Tq, D), randn(2, Hk, Tk, D, seed=1), randn(2, Hk, Tk, D, seed=2)
    grad = randn(2, H, Tq, D, seed=3)
    ours = [mt.tensor(x, requires_grad=True) for x in (q, k, v)]
    out = F.scaled_dot_product_attention(*ours, causal=causal, alibi_slopes=slopes)
    out.backward(grad)
    theirs = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
    expected = torch.nn.functional.scaled_dot_product_attention(*theirs, attn_mask=bias, enable_gqa=True)
    expected.backward(torch.tensor(grad))
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=1e-12, atol=1e-12)
    for mine, reference in zip(ours, theirs):
        np.testing.assert_allclose(mine.grad, reference.grad.numpy(), rtol=1e-12, atol=1e-12)

    B, T = 2, 5
    qkv, grad = randn(B, T, (H + 2 * Hk) * D, seed=4), randn(B, T, H * D, seed=5)
    mine = mt.tensor(qkv, requires_grad=True)
    F.multi_head_attention(mine, H, causal=causal, n_kv_head=Hk, alibi_slopes=slopes).backward(grad)
    reference = torch.tensor(qkv, requires_grad=True)
    q, k, v = (part.reshape(B, T, -1, D).permute(0, 2, 1, 3) for part in reference.split([H * D, Hk * D, Hk * D], dim=-1))
    k, v = k.repeat_interleave(H // Hk, dim=1), v.repeat_interleave(H // Hk, dim=1)  # head h gets K/V head h // G
    bias = -torch.tensor(slopes)[:, None, None] * (torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs()
    if causal:
        bias = bias.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(diagonal=1), -torch.inf)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    out.permute(0, 2, 1, 3).reshape(B, T, H * D).backward(torch.tensor(grad))
    np.testing.assert_allclose(mine.grad, reference.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("Hk, slopes", [(2, None), (1, [0.5, 0.25]), (2, [1.0, 0.0])])
def test_incremental_attention_equals_the_full_causal_forward(kernel_set, Hk, slopes):
    """One query at a time against the keys so far, as a KV cache runs it, gives the full causal
    forward's rows: the queries are the last positions, for the mask and for ALiBi's distances."""
    q, k, v = randn(1, 2, 6, 4), randn(1, Hk, 6, 4, seed=1), randn(1, Hk, 6, 4, seed=2)
    full = F.scaled_dot_product_attention(mt.tensor(q), mt.tensor(k), mt.tensor(v), alibi_slopes=slopes).numpy()
    for t in range(6):
        row = F.scaled_dot_product_attention(
            mt.tensor(q[:, :, t : t + 1]), mt.tensor(k[:, :, : t + 1]), mt.tensor(v[:, :, : t + 1]), alibi_slopes=slopes
        )
        np.testing.assert_allclose(row.numpy()[:, :, 0], full[:, :, t], rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------------- ALiBi's slopes


def test_alibi_slopes_are_the_papers():
    """Press et al. 2022: for n heads, n a power of two, the geometric sequence that starts at
    2^(-8/n) with ratio 2^(-8/n); otherwise the slopes of the largest power of two 2^a below n,
    then every other slope of 2^(a+1) (the 1st, 3rd, ...), until there are n."""
    assert alibi_slopes(8).dtype == np.float64
    np.testing.assert_array_equal(alibi_slopes(8), [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256])
    np.testing.assert_array_equal(alibi_slopes(1), [1 / 256])
    np.testing.assert_array_equal(alibi_slopes(2), [1 / 16, 1 / 256])
    np.testing.assert_array_equal(alibi_slopes(4), [1 / 4, 1 / 16, 1 / 64, 1 / 256])
    np.testing.assert_allclose(alibi_slopes(16), [2 ** (-h / 2) for h in range(1, 17)], rtol=1e-15)
    # n = 6: the 4 slopes of 4 heads, then the 1st and 3rd of 8 heads' (1/2, 1/4, 1/8, ...)
    np.testing.assert_array_equal(alibi_slopes(6), [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8])
    # n = 12: the 8 slopes of 8 heads, then the 1st, 3rd, 5th and 7th of 16 heads' (2^-0.5, 2^-1, ...)
    expected = [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256, 2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5]
    np.testing.assert_allclose(alibi_slopes(12), expected, rtol=1e-15)
    with pytest.raises(ValueError, match=r"^alibi_slopes: n_head must be >= 1, got 0"):
        alibi_slopes(0)
    with pytest.raises(TypeError, match=r"^alibi_slopes: n_head must be an int"):
        alibi_slopes(4.0)


def test_alibi_slopes_refuse_a_head_count_no_model_has():
    """10**12 heads once built a list of 10**12 floats (past 3 GB, for minutes) before failing."""
    assert alibi_slopes(2**16).shape == (2**16,)  # the bound itself is fine
    with pytest.raises(ValueError, match=r"^alibi_slopes: n_head must be <= 65536 \(every head needs at least one channel of the embedding\), got 1000000000000$"):
        alibi_slopes(10**12)


# --------------------------------------------------------------------------------- errors


def test_errors():
    q = mt.ones(1, 2, 3, 4)
    with pytest.raises(ValueError, match="scaled_dot_product_attention: causal attention needs Tk >= Tq"):
        F.scaled_dot_product_attention(q, mt.ones(1, 2, 2, 4), mt.ones(1, 2, 2, 4))
    with pytest.raises(ValueError, match="scaled_dot_product_attention: shapes q"):
        F.scaled_dot_product_attention(q, mt.ones(1, 2, 3, 5), mt.ones(1, 2, 3, 5))
    with pytest.raises(ValueError, match="scaled_dot_product_attention: k must be a 4-d Tensor"):
        F.scaled_dot_product_attention(q, mt.ones(2, 3, 4), mt.ones(1, 2, 3, 4))


def test_errors_of_grouped_heads_and_slopes():
    op = "scaled_dot_product_attention"
    q, k = mt.ones(1, 4, 3, 2), mt.ones(1, 2, 3, 2)
    cases = [
        # heads: H a multiple of Hk, k and v alike
        (lambda: F.scaled_dot_product_attention(q, mt.ones(1, 3, 3, 2), mt.ones(1, 3, 3, 2)), mt.InputError,
         rf"^{op}: q's 4 heads must be a whole number of groups of k and v's 3 heads"),
        (lambda: F.scaled_dot_product_attention(mt.ones(1, 2, 3, 2), mt.ones(1, 4, 3, 2), mt.ones(1, 4, 3, 2)), mt.InputError,
         rf"^{op}: q's 2 heads must be a whole number of groups of k and v's 4 heads"),
        (lambda: F.scaled_dot_product_attention(q, k, mt.ones(1, 1, 3, 2)), mt.InputError, rf"^{op}: shapes q .* do not fit"),
        # slopes: H finite real numbers, constants
        (lambda: F.scaled_dot_product_attention(q, k, k, alibi_slopes=[0.5, 0.25]), mt.InputError,
         rf"^{op}: alibi_slopes must have shape \(4,\), one slope per query head, got shape \(2,\)"),
        (lambda: F.scaled_dot_product_attention(q, k, k, alibi_slopes=np.ones((4, 1))), mt.InputError, r"alibi_slopes must have shape \(4,\)"),
        (lambda: F.scaled_dot_product_attention(q, k, k, alibi_slopes=[0.5, np.nan, 0.1, 0.1]), mt.InputError,
         rf"^{op}: alibi_slopes must be finite numbers"),
        (lambda: F.scaled_dot_product_attention(q, k, k, alibi_slopes=[0.5, np.inf, 0.1, 0.1]), mt.InputError, "alibi_slopes must be finite"),
        (lambda: F.scaled_dot_product_attention(q.float(), k.float(), k.float(), alibi_slopes=[1e39] * 4), mt.InputError,
         r"alibi_slopes must be finite numbers \(in float32\)"),
        (lambda: F.scaled_dot_product_attention(q, k, k, alibi_slopes=mt.ones(4, requires_grad=True)), mt.InputError,
         rf"^{op}: alibi_slopes are constants and get no gradient, got a Tensor that requires grad"),
        (lambda: F.scaled_dot_product_attention(q, k, k, alibi_slopes="alibi"), mt.InputTypeError, rf"^{op}: alibi_slopes must be None, a list"),
        (lambda: F.scaled_dot_product_attention(q, k, k, alibi_slopes=0.5), mt.InputTypeError, rf"^{op}: alibi_slopes must be None, a list"),
        (lambda: F.scaled_dot_product_attention(q, k, k, alibi_slopes=[True] * 4), mt.InputTypeError, "alibi_slopes must hold real numbers"),
        (lambda: F.scaled_dot_product_attention(q, k, k, alibi_slopes=[[1.0], [1.0, 2.0]]), mt.InputTypeError, "alibi_slopes must be a 1-d list"),
        # multi_head_attention: n_kv_head divides n_head, and qkv's width fits both
        (lambda: F.multi_head_attention(mt.ones(1, 2, 20), 4, n_kv_head=3), mt.InputError,
         r"^multi_head_attention: n_kv_head \(3\) must divide n_head \(4\)"),
        (lambda: F.multi_head_attention(mt.ones(1, 2, 20), 4, n_kv_head=0), mt.InputError, r"^multi_head_attention: n_kv_head must be >= 1, got 0"),
        (lambda: F.multi_head_attention(mt.ones(1, 2, 20), 4, n_kv_head=2.0), mt.InputTypeError, r"^multi_head_attention: n_kv_head must be an int"),
        (lambda: F.multi_head_attention(mt.ones(1, 2, 20), 4, n_kv_head=2), mt.InputError,
         r"^multi_head_attention: the last dim of qkv \(1, 2, 20\) must be \(n_head \+ 2 n_kv_head\) D = 8 D"),
        (lambda: F.multi_head_attention(mt.ones(1, 2, 16), 4, n_kv_head=2, alibi_slopes=[0.5, 0.25]), mt.InputError,
         r"^multi_head_attention: alibi_slopes must have shape \(4,\)"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()
    # a Tensor of slopes that requires no grad is a constant like any other, as is a float32 array
    # for float64 inputs (the slopes are taken in the scores' dtype)
    expected = F.scaled_dot_product_attention(q, k, k, alibi_slopes=[0.5, 0.25, 0.125, 0.0]).numpy()
    for slopes in (mt.tensor([0.5, 0.25, 0.125, 0.0]), np.array([0.5, 0.25, 0.125, 0.0], dtype=np.float32), (0.5, 0.25, 0.125, 0)):
        np.testing.assert_array_equal(F.scaled_dot_product_attention(q, k, k, alibi_slopes=slopes).numpy(), expected)


# --------------------------------------------------------------------------------- the kernels directly


def views(dtype, B=2, H=4, Hk=2, Tq=5, Tk=7, D=4, seed=0):
    """Inputs as the Functions and users give them, in several layouts: k, v and the upstream
    gradient as views of wider arrays, k transposed in memory, and q with every other number of a
    row (a layout BLAS cannot read)."""
    rng = np.random.default_rng(seed)
    wide = rng.standard_normal((B, Tk, 2, Hk, D)).astype(dtype).transpose(2, 0, 3, 1, 4)  # (2, B, Hk, Tk, D) views
    q = rng.standard_normal((B, H, Tq, 2 * D)).astype(dtype)[..., ::2]  # every other number
    k = np.ascontiguousarray(wide[0].swapaxes(-1, -2)).swapaxes(-1, -2)  # each matrix transposed in memory
    v = wide[1]
    grad_out = rng.standard_normal((B, Tq, H, D)).astype(dtype).transpose(0, 2, 1, 3)  # heads of a (B, T, C) array
    return q, k, v, grad_out


def output_views(dtype, B=2, H=4, Hk=2, Tq=5, Tk=7, D=4):
    """out, grad_q, grad_k, grad_v as the Functions allocate them: heads of (B, T, C) arrays, full
    of nan so that a number left unwritten shows."""
    out = np.full((B, Tq, H, D), np.nan, dtype=dtype).transpose(0, 2, 1, 3)
    grad_q = np.full((B, Tq, H, D), np.nan, dtype=dtype).transpose(0, 2, 1, 3)
    grad_k, grad_v = (np.full((B, Tk, H + 2 * Hk, D), np.nan, dtype=dtype).transpose(0, 2, 1, 3)[:, start : start + Hk] for start in (H, H + Hk))
    return out, grad_q, grad_k, grad_v


def kernel_sets_to_call():
    """(name, forward, backward) of each set's kernels, called directly (the fast ones only compiled)."""
    sets = [("readable", readable.attention_forward, readable.attention_backward)]
    if not numba.config.DISABLE_JIT:
        from microtensor.fast import attention as fast

        sets.append(("fast", fast.attention_forward, fast.attention_backward))
    return sets


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("Hk", [1, 2, 4])
def test_kernels_called_directly_on_views(dtype, causal, Hk):
    """Each set's forward and backward kernel on strided views (inputs and outputs), with grouped
    heads and ALiBi slopes (two of them 0: the fast set skips their bias pass, not the others'),
    against the reference; readable and fast therefore agree with each other too."""
    q, k, v, grad_out = views(dtype, Hk=Hk)
    scale = dtype(1 / np.sqrt(q.shape[-1]))
    slopes = np.array([0.0, 0.6, 0.0, 1.5], dtype=dtype)
    expected_out = reference_attention(q, k, v, causal, slopes)
    expected_grads = reference_gradients(q, k, v, grad_out, causal, slopes)
    for name, forward, backward in kernel_sets_to_call():
        out, grad_q, grad_k, grad_v = output_views(dtype, Hk=Hk)
        probs = np.full((2, 4, 5, 7), np.nan, dtype=dtype)
        forward(q, k, v, scale, causal, slopes, out, probs)
        assert_close(out, expected_out, dtype)
        assert_close(probs, reference_probs(q, k, causal, slopes), dtype)
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
    slopes = np.array([0.0, 0.6, 0.0, 1.5])
    results = []
    for forward, backward in ((readable.attention_forward, readable.attention_backward), (fast.attention_forward, fast.attention_backward)):
        out, grad_q, grad_k, grad_v = output_views(np.float64)
        probs = np.empty((2, 4, 5, 7))
        forward(q, k, v, scale, causal, slopes, out, probs)
        backward(grad_out, q, k, v, probs, scale, causal, grad_q, grad_k, grad_v)
        results.append((out, probs, grad_q, grad_k, grad_v))
    for from_readable, from_fast in zip(*results):
        np.testing.assert_array_equal(from_fast, from_readable)
    with mt.using_kernels("fast"):  # and through the op
        inputs = [mt.tensor(x, requires_grad=True) for x in (q, k, v)]
        out = scaled_dot_product_attention(*inputs, causal=causal, alibi_slopes=slopes)
        out.backward(grad_out)
    np.testing.assert_allclose(out.numpy(), reference_attention(q, k, v, causal, slopes), rtol=1e-12, atol=1e-12)
    for tensor, expected in zip(inputs, reference_gradients(q, k, v, grad_out, causal, slopes)):
        np.testing.assert_allclose(tensor.grad, expected, rtol=1e-12, atol=1e-12)
    # multi_head_attention takes the same path
    with mt.using_kernels("fast"):
        qkv = mt.tensor(randn(2, 5, 8 * 4), requires_grad=True)
        multi_head_attention(qkv, 4, n_kv_head=2, alibi_slopes=slopes).backward(np.ones((2, 5, 16)))
    assert np.all(np.isfinite(qkv.grad))
