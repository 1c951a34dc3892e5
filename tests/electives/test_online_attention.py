"""Online (FlashAttention-style) attention: forward and gradients against a numpy reference written
here (explicit mask, K/V repeated for grouped heads, the ALiBi bias, the softmax's VJP with its row
dot), against PyTorch when installed, and against the standard op; several tile sizes, 1 and more
than T among them; the KV-cache case (Tq < Tk); the saved state (no Tq × Tk array); forward in one
kernel set and backward in the other; the kernels called directly on views; and the errors.
(Gradients against finite differences: the gradcheck cases, run by tests/test_gradcheck_cases.py.)

Tolerances: float64 results to 1e-12, float32 ones to 2e-5 absolute and relative (unit-scale
inputs; the online softmax rescales each row's sums once per tile, a few more roundings than the
standard op's one pass).
"""
import numpy as np
import pytest

import microtensor as mt
import microtensor.functional as F
from microtensor.ops.electives import online_attention as readable
from microtensor.ops.electives.online_attention import multi_head_online_attention, online_attention
from helpers import needs_jit, randn

TOLERANCE = {np.float32: 2e-5, np.float64: 1e-12}


def assert_close(got, expected, dtype, what=""):
    tolerance = TOLERANCE[dtype]
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance, err_msg=what)


def reference(q, k, v, grad_out, causal, slopes=None):
    """O, dq, dk, dv in float64 numpy, all of S at once: K and V repeated for the query heads that
    share them, an explicit mask, the ALiBi bias; backward by the standard op's formulas (the
    softmax's VJP with its row dot sum_j P dP), then each shared head's gradient summed over its group."""
    q, k, v, grad_out = (np.asarray(x, dtype=np.float64) for x in (q, k, v, grad_out))
    B, H, Tq, D = q.shape
    Hk, Tk = k.shape[1], k.shape[2]
    group = H // Hk
    k_heads, v_heads = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # (B, H, Tk, D)
    positions = Tk - Tq + np.arange(Tq)
    scores = q @ k_heads.swapaxes(-1, -2) / np.sqrt(D)  # (B, H, Tq, Tk)
    if slopes is not None:
        scores -= np.asarray(slopes, dtype=np.float64)[:, None, None] * np.abs(positions[:, None] - np.arange(Tk)[None, :])
    if causal:
        scores = np.where(np.arange(Tk)[None, :] <= positions[:, None], scores, -np.inf)
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    out = p @ v_heads
    d_p = grad_out @ v_heads.swapaxes(-1, -2)
    d_s = p * (d_p - (p * d_p).sum(axis=-1, keepdims=True))
    grad_q = d_s @ k_heads / np.sqrt(D)
    grad_k = (d_s.swapaxes(-1, -2) @ q / np.sqrt(D)).reshape(B, Hk, group, Tk, D).sum(axis=2)
    grad_v = (p.swapaxes(-1, -2) @ grad_out).reshape(B, Hk, group, Tk, D).sum(axis=2)
    return out, grad_q, grad_k, grad_v


def inputs(B, H, Hk, Tq, Tk, D, dtype, seed=0):
    q, k, v = randn(B, H, Tq, D, seed=seed, dtype=dtype), randn(B, Hk, Tk, D, seed=seed + 1, dtype=dtype), randn(B, Hk, Tk, D, seed=seed + 2, dtype=dtype)
    return q, k, v, randn(B, H, Tq, D, seed=seed + 3, dtype=dtype)


def run_online(q, k, v, grad_out, causal, slopes=None, tile_size=None):
    tensors = [mt.tensor(x, requires_grad=True) for x in (q, k, v)]
    out = online_attention(*tensors, causal=causal, alibi_slopes=slopes, tile_size=tile_size)
    out.backward(grad_out)
    return out.numpy(), *(t.grad for t in tensors)


# --------------------------------------------------------------------------------- against the references


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    "H, Hk, Tq, Tk, slopes",
    [
        (2, 2, 5, 5, None),  # multi-head
        (4, 2, 3, 7, [0.5, 0.25, 0.125, 0.0625]),  # grouped-query, a KV cache, ALiBi
        (3, 1, 6, 6, [0.3, 0.0, 1.5]),  # multi-query, ALiBi with a zero slope among others
    ],
    ids=["mha", "gqa-cache-alibi", "mqa-alibi"],
)
def test_forward_and_gradients_against_the_reference(kernel_set, dtype, causal, H, Hk, Tq, Tk, slopes):
    q, k, v, grad_out = inputs(2, H, Hk, Tq, Tk, 3, dtype)
    expected = reference(q, k, v, grad_out, causal, slopes)
    for tile_size in (1, 2, 4, 100):  # one key per tile, several tiles with a partial last one, one tile
        got = run_online(q, k, v, grad_out, causal, slopes, tile_size)
        for name, mine, theirs in zip(("out", "grad_q", "grad_k", "grad_v"), got, expected):
            assert mine.dtype == dtype
            assert_close(mine, theirs, dtype, f"{name}, tile_size {tile_size}")


def test_gradients_against_torch(kernel_set):
    """Grouped-query attention with ALiBi and a KV cache, through PyTorch's autograd: its
    scaled_dot_product_attention with the bias and mask as a float mask, K and V repeated."""
    torch = pytest.importorskip("torch")
    B, H, Hk, Tq, Tk, D = 2, 4, 2, 3, 6, 5
    slopes = np.array([0.5, 0.25, 0.125, 0.0625])
    for causal in (True, False):
        q, k, v, grad_out = inputs(B, H, Hk, Tq, Tk, D, np.float64, seed=10)
        mine = run_online(q, k, v, grad_out, causal, slopes, tile_size=2)
        theirs = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
        positions = torch.arange(Tk - Tq, Tk, dtype=torch.float64)[:, None]
        keys = torch.arange(Tk, dtype=torch.float64)[None, :]
        bias = -torch.tensor(slopes)[:, None, None] * (positions - keys).abs()  # (H, Tq, Tk)
        if causal:
            bias = bias.masked_fill(keys > positions, -torch.inf)
        out = torch.nn.functional.scaled_dot_product_attention(
            theirs[0], theirs[1].repeat_interleave(H // Hk, dim=1), theirs[2].repeat_interleave(H // Hk, dim=1), attn_mask=bias
        )
        out.backward(torch.tensor(grad_out))
        assert_close(mine[0], out.detach().numpy(), np.float64, "out")
        for name, got, tensor in zip(("grad_q", "grad_k", "grad_v"), mine[1:], theirs):
            assert_close(got, tensor.grad.numpy(), np.float64, name)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("Tq, Tk", [(6, 6), (2, 6)])
def test_equal_to_the_standard_op(kernel_set, dtype, causal, Tq, Tk):
    q, k, v, grad_out = inputs(2, 3, 3, Tq, Tk, 4, dtype, seed=20)
    tensors = [mt.tensor(x, requires_grad=True) for x in (q, k, v)]
    out = F.scaled_dot_product_attention(*tensors, causal=causal)
    out.backward(grad_out)
    standard = [out.numpy()] + [t.grad for t in tensors]
    for tile_size in (1, 4, 7, None):
        online = run_online(q, k, v, grad_out, causal, tile_size=tile_size)
        for name, mine, theirs in zip(("out", "grad_q", "grad_k", "grad_v"), online, standard):
            assert_close(mine, theirs, dtype, f"{name}, tile_size {tile_size}")


@pytest.mark.parametrize("causal", [True, False])
def test_equal_to_the_standard_op_with_grouped_heads_and_alibi(kernel_set, causal):
    q, k, v, grad_out = inputs(2, 4, 2, 3, 6, 3, np.float64, seed=25)
    slopes = np.array([0.5, 0.25, 0.125, 0.0625])
    tensors = [mt.tensor(x, requires_grad=True) for x in (q, k, v)]
    out = F.scaled_dot_product_attention(*tensors, causal=causal, alibi_slopes=slopes)
    out.backward(grad_out)
    online = run_online(q, k, v, grad_out, causal, slopes, tile_size=4)
    for name, mine, theirs in zip(("out", "grad_q", "grad_k", "grad_v"), online, [out.numpy()] + [t.grad for t in tensors]):
        assert_close(mine, theirs, np.float64, name)


def test_zero_slopes_are_exactly_plain_attention(kernel_set):
    q, k, v, grad_out = inputs(1, 2, 1, 4, 5, 3, np.float32, seed=30)
    plain = run_online(q, k, v, grad_out, True, None, 2)
    zeros = run_online(q, k, v, grad_out, True, [0.0, 0.0], 2)
    for mine, theirs in zip(zeros, plain):
        np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("causal", [True, False])
def test_multi_head_online_attention(kernel_set, dtype, causal):
    """qkv split by hand (H query heads, then Hk key heads, then Hk value heads), against the
    reference; and the plain case against the standard multi_head_attention."""
    B, T, H, Hk, D = 2, 5, 4, 2, 3
    slopes = [0.5, 0.25, 0.125, 0.0625]
    qkv, grad = randn(B, T, (H + 2 * Hk) * D, seed=40, dtype=dtype), randn(B, T, H * D, seed=41, dtype=dtype)
    split = np.split(qkv.astype(np.float64), [H * D, (H + Hk) * D], axis=-1)
    q, k, v = (x.reshape(B, T, -1, D).transpose(0, 2, 1, 3) for x in split)
    grad_heads = grad.reshape(B, T, H, D).transpose(0, 2, 1, 3)
    out, grad_q, grad_k, grad_v = reference(q, k, v, grad_heads, causal, slopes)
    merge = lambda x: x.transpose(0, 2, 1, 3).reshape(B, T, -1)  # (B, heads, T, D) -> (B, T, heads D)
    mine = mt.tensor(qkv, requires_grad=True)
    got = multi_head_online_attention(mine, H, causal=causal, n_kv_head=Hk, alibi_slopes=slopes, tile_size=2)
    got.backward(grad)
    assert got.dtype == mine.grad.dtype == dtype
    assert_close(got.numpy(), merge(out), dtype, "out")
    assert_close(mine.grad, np.concatenate([merge(grad_q), merge(grad_k), merge(grad_v)], axis=-1), dtype, "grad_qkv")

    qkv = randn(B, T, 3 * H * D, seed=42, dtype=dtype)
    results = []
    for op in (lambda x: F.multi_head_attention(x, H, causal=causal), lambda x: multi_head_online_attention(x, H, causal=causal, tile_size=3)):
        mine = mt.tensor(qkv, requires_grad=True)
        out = op(mine)
        out.backward(grad)
        results.append((out.numpy(), mine.grad))
    for standard, online in zip(*results):
        assert_close(online, standard, dtype)


def test_one_query_at_a_time_equals_the_full_causal_forward(kernel_set):
    """What a KV cache does: each new query against all the keys so far."""
    q, k, v, _ = inputs(1, 4, 2, 7, 7, 3, np.float64, seed=50)
    slopes = [0.5, 0.25, 0.125, 0.0625]
    full = online_attention(mt.tensor(q), mt.tensor(k), mt.tensor(v), alibi_slopes=slopes, tile_size=3).numpy()
    for t in range(7):
        row = online_attention(mt.tensor(q[:, :, t : t + 1]), mt.tensor(k[:, :, : t + 1]), mt.tensor(v[:, :, : t + 1]), alibi_slopes=slopes, tile_size=3)
        np.testing.assert_allclose(row.numpy()[:, :, 0], full[:, :, t], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_keys_of_score_minus_infinity_weigh_nothing_in_any_tile(kernel_set, dtype):
    """A key whose q · k is -inf gets probability 0, also when a whole tile, the first one included,
    holds only such keys (the running max is then still -inf): the output is the softmax over the
    other keys, as numpy's in float64 gives it, never NaN. The query that sees only such keys gets
    NaN, as numpy's 0/0 does."""
    q = np.array([[[[-2.0], [1.5]]]], dtype=dtype)  # (1, 1, 2, 1): a negative and a positive query
    k = np.array([[[[np.inf], [np.inf], [-1.5], [0.5], [np.inf]]]], dtype=dtype)  # q_0 k_j = -inf for keys 0, 1, 4
    v = randn(1, 1, 5, 1, seed=4, dtype=dtype)
    grad_out = randn(1, 1, 2, 1, seed=5, dtype=dtype)
    expected = reference(q, k, v, grad_out, causal=False)[0]
    for tile_size in (1, 2, 3, 100):  # tiles of -inf scores only first, between and last; one tile
        out = run_online(q, k, v, grad_out, causal=False, tile_size=tile_size)[0]
        assert_close(out[0, 0, 0], expected[0, 0, 0], dtype, f"tile_size {tile_size}")
        assert np.isnan(out[0, 0, 1]).all() and np.isnan(expected[0, 0, 1]).all()  # +inf scores: inf - inf


def test_empty_inputs(kernel_set):
    for B, H, Hk, Tq, Tk in ((0, 2, 1, 3, 3), (1, 2, 1, 0, 0), (1, 2, 2, 0, 4)):
        q, k, v, grad_out = inputs(B, H, Hk, Tq, Tk, 2, np.float64)
        out, grad_q, grad_k, grad_v = run_online(q, k, v, grad_out, causal=True)
        assert out.shape == q.shape and grad_q.shape == q.shape and grad_k.shape == grad_v.shape == k.shape
        assert not grad_k.any() and not grad_v.any()  # no query: no gradient


# --------------------------------------------------------------------------------- what is kept for backward


def saved_arrays(out):
    return [a for a in out._ctx.saved_tensors if isinstance(a, np.ndarray)]


def test_the_saved_state_holds_no_score_matrix(kernel_set):
    """Forward keeps q, k, v (the inputs), O and one log-sum-exp per query row, nothing of size
    Tq × Tk; the standard op keeps P (B, H, Tq, Tk) (which this check finds, so it can fail)."""
    B, H, Hk, Tq, Tk, D = 2, 4, 2, 5, 9, 3
    q, k, v = (mt.tensor(x, requires_grad=True) for x in inputs(B, H, Hk, Tq, Tk, D, np.float32)[:3])

    def holds_scores(arrays):
        return any(a.ndim >= 2 and a.shape[-2:] == (Tq, Tk) for a in arrays)

    saved = saved_arrays(online_attention(q, k, v, tile_size=2))
    assert not holds_scores(saved)
    assert sorted(a.shape for a in saved) == sorted([q.shape, k.shape, v.shape, (B, H, Tq, D), (B, H, Tq)])
    assert sum(a.nbytes for a in saved) == 4 * (2 * B * H * Tq * D + 2 * B * Hk * Tk * D + B * H * Tq)
    q4 = mt.tensor(q.numpy(), requires_grad=True)
    k4, v4 = (mt.tensor(np.repeat(x.numpy(), H // Hk, axis=1), requires_grad=True) for x in (k, v))
    assert holds_scores(saved_arrays(F.scaled_dot_product_attention(q4, k4, v4)))

    T = 6
    qkv = mt.tensor(randn(B, T, (H + 2 * Hk) * D, dtype=np.float32), requires_grad=True)
    saved = saved_arrays(multi_head_online_attention(qkv, H, n_kv_head=Hk, tile_size=2))
    assert sorted(a.shape for a in saved) == sorted([qkv.shape, (B, T, H * D), (B, H, T)])


@needs_jit
@pytest.mark.parametrize("forward_set, backward_set", [("readable", "fast"), ("fast", "readable")])
def test_forward_in_one_kernel_set_and_backward_in_the_other(forward_set, backward_set):
    """Both sets save the same O and L, so a backward of either set can follow a forward of the other."""
    q, k, v, grad_out = inputs(2, 4, 2, 9, 11, 5, np.float64, seed=60)
    slopes = [0.5, 0.25, 0.125, 0.0625]
    expected = reference(q, k, v, grad_out, True, slopes)
    tensors = [mt.tensor(x, requires_grad=True) for x in (q, k, v)]
    with mt.using_kernels(forward_set):
        out = online_attention(*tensors, alibi_slopes=slopes, tile_size=4)
    with mt.using_kernels(backward_set):
        out.backward(grad_out)
    for name, mine, theirs in zip(("out", "grad_q", "grad_k", "grad_v"), [out.numpy()] + [t.grad for t in tensors], expected):
        assert_close(mine, theirs, np.float64, name)


# --------------------------------------------------------------------------------- the kernels directly


def kernel_views(dtype, B=2, H=4, Hk=2, Tq=13, Tk=17, D=3, seed=0):
    """q, k, v, grad_out as the Functions and users give them: q with every other number of a row
    (a layout BLAS cannot read: the fast set copies it), k and v heads of one (B, T, 2 Hk D) array,
    grad_out transposed in memory."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, Tq, 2 * D)).astype(dtype)[..., ::2]
    kv = rng.standard_normal((B, Tk, 2, Hk, D)).astype(dtype).transpose(2, 0, 3, 1, 4)  # (2, B, Hk, Tk, D) views
    grad_out = np.ascontiguousarray(rng.standard_normal((B, H, Tq, D)).astype(dtype).swapaxes(-1, -2)).swapaxes(-1, -2)
    return q, kv[0], kv[1], grad_out


def output_arrays(dtype, B=2, H=4, Hk=2, Tq=13, Tk=17, D=3):
    """out and log_sum_exp, and the gradients: grad_q with every other number of a row (BLAS cannot
    add into it: the fast set computes it apart and copies it back), grad_k and grad_v heads of one
    (B, T, 2 Hk D) array. NaN-filled, so that anything left unwritten shows."""
    out = np.full((B, Tq, H, D), np.nan, dtype=dtype).transpose(0, 2, 1, 3)
    log_sum_exp = np.full((B, H, Tq), np.nan, dtype=dtype)
    grad_q = np.full((B, H, Tq, 2 * D), np.nan, dtype=dtype)[..., ::2]
    grad_kv = np.full((B, Tk, 2, Hk, D), np.nan, dtype=dtype).transpose(2, 0, 3, 1, 4)
    return out, log_sum_exp, grad_q, grad_kv[0], grad_kv[1]


@pytest.mark.all_threads
@needs_jit
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("causal", [True, False])
def test_the_kernels_on_views_in_both_sets(dtype, causal):
    from microtensor.fast.electives import online_attention as fast

    q, k, v, grad_out = kernel_views(dtype)
    slopes = np.array([0.5, 0.0, 0.125, 0.0625], dtype=dtype)
    scale = dtype(1 / np.sqrt(q.shape[-1]))
    expected = reference(q, k, v, grad_out, causal, slopes)
    for forward, backward in (
        (readable.online_attention_forward, readable.online_attention_backward),
        (fast.online_attention_forward, fast.online_attention_backward),
    ):
        for tile_size in (1, 5, 17):
            out, log_sum_exp, grad_q, grad_k, grad_v = output_arrays(dtype)
            forward(q, k, v, slopes, scale, causal, tile_size, out, log_sum_exp)
            backward(grad_out, q, k, v, out, log_sum_exp, slopes, scale, causal, tile_size, grad_q, grad_k, grad_v)
            for name, mine, theirs in zip(("out", "grad_q", "grad_k", "grad_v"), (out, grad_q, grad_k, grad_v), expected):
                assert_close(mine, theirs, dtype, f"{forward.__module__} {name}, tile_size {tile_size}")


# --------------------------------------------------------------------------------- errors


def test_errors():
    q, k = mt.ones(1, 4, 3, 2), mt.ones(1, 2, 3, 2)
    cases = [
        (lambda: online_attention(q, mt.ones(1, 3, 3, 2), mt.ones(1, 3, 3, 2)), ValueError, "online_attention: k and v have 3 heads, which must be >= 1 and divide q's 4 heads"),
        (lambda: online_attention(mt.ones(1, 0, 3, 2), mt.ones(1, 0, 3, 2), mt.ones(1, 0, 3, 2)), ValueError, "online_attention: k and v have 0 heads, which must be >= 1"),
        (lambda: online_attention(q, mt.ones(1, 2, 2, 2), mt.ones(1, 2, 2, 2)), ValueError, "online_attention: causal attention needs Tk >= Tq"),
        (lambda: online_attention(q, k, mt.ones(1, 2, 4, 2)), ValueError, r"online_attention: shapes q \(1, 4, 3, 2\), k \(1, 2, 3, 2\), v \(1, 2, 4, 2\) do not fit"),
        (lambda: online_attention(q, k, mt.ones(2, 3, 2)), ValueError, "online_attention: v must be a 4-d Tensor"),
        (lambda: online_attention(q, k, k.double()), TypeError, "online_attention: inputs have different dtypes"),
        (lambda: online_attention(q, k, k, causal=1), TypeError, "online_attention: causal must be True or False"),
        (lambda: online_attention(q, k, k, tile_size=0), ValueError, "online_attention: tile_size must be >= 1, got 0"),
        (lambda: online_attention(q, k, k, tile_size=2.0), TypeError, "online_attention: tile_size must be an int"),
        (lambda: online_attention(q, k, k, alibi_slopes=[0.5, 0.25]), ValueError, r"online_attention: alibi_slopes must have shape \(4,\), one slope per query head"),
        (lambda: online_attention(q, k, k, alibi_slopes=[0.5, 0.25, np.nan, 1.0]), ValueError, "online_attention: alibi_slopes must be finite"),
        (lambda: online_attention(q, k, k, alibi_slopes=["a", "b", "c", "d"]), TypeError, "online_attention: alibi_slopes must hold real numbers"),
        (lambda: online_attention(q, k, k, alibi_slopes=mt.ones(4, requires_grad=True)), ValueError, "online_attention: alibi_slopes are constants"),
        (lambda: online_attention(q, k, k, alibi_slopes=np.ones((4, 1))), ValueError, r"alibi_slopes must have shape \(4,\)"),
        (lambda: online_attention(mt.ones(1, 4, 3, 0), mt.ones(1, 2, 3, 0), mt.ones(1, 2, 3, 0)), ValueError, "online_attention: empty input"),
        (lambda: multi_head_online_attention(mt.ones(1, 3, 12), 4, n_kv_head=3), ValueError, r"multi_head_online_attention: n_kv_head \(3\) must divide n_head \(4\)"),
        (lambda: multi_head_online_attention(mt.ones(1, 3, 13), 4, n_kv_head=2), ValueError, r"multi_head_online_attention: the last dim of qkv \(1, 3, 13\) must be \(n_head \+ 2 n_kv_head\) D = 8 D"),
        (lambda: multi_head_online_attention(mt.ones(1, 3, 16), 0), ValueError, "multi_head_online_attention: n_head must be >= 1"),
        (lambda: multi_head_online_attention(mt.ones(3, 16), 2), ValueError, "multi_head_online_attention: qkv must be a 3-d Tensor"),
        (lambda: multi_head_online_attention(mt.ones(1, 3, 12), 2, alibi_slopes=[1.0]), ValueError, r"multi_head_online_attention: alibi_slopes must have shape \(2,\)"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()

