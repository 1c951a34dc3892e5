"""Forward values of the fused kernels: LayerNorm, RMSNorm, GELU, SiLU, SwiGLU, embedding,
dropout and attention, against plain-loop or numpy references, PyTorch in float64 when installed,
float32 against float64, and their bad-input errors. (Gradients: tests/test_gradcheck_cases.py.)"""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import microtensor as mt
import microtensor.functional as F
from microtensor.ops.attention import attention_reference
from microtensor.ops.gelu import gelu_reference
from microtensor.ops.layer_norm import layer_norm_reference
from microtensor.ops.rms_norm import rms_norm_reference
from microtensor.ops.silu import silu_reference


def randn(*shape, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def test_layer_norm_by_plain_loops():
    x, w, b = randn(3, 5), randn(5, seed=1), randn(5, seed=2)
    expected = np.empty_like(x)
    for n in range(3):
        mean = sum(x[n]) / 5
        var = sum((x[n] - mean) ** 2) / 5
        expected[n] = (x[n] - mean) / math.sqrt(var + 1e-5) * w + b
    got = F.layer_norm(mt.tensor(x), mt.tensor(w), mt.tensor(b)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(layer_norm_reference(x, w, b), expected, rtol=1e-12)


def test_rms_norm_by_plain_loops():
    x, w = randn(3, 5), randn(5, seed=1)
    expected = np.array([x[n] / math.sqrt(sum(x[n] ** 2) / 5 + 1e-5) * w for n in range(3)])
    np.testing.assert_allclose(F.rms_norm(mt.tensor(x), mt.tensor(w)).numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(rms_norm_reference(x, w), expected, rtol=1e-12)


@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=3), seed=st.integers(0, 100))
def test_float32_kernels_agree_with_float64_references(shape, seed):
    x = randn(*shape, seed=seed)
    w, b = randn(shape[-1], seed=seed + 1), randn(shape[-1], seed=seed + 2)
    cases = [
        (lambda t, w, b: F.layer_norm(t, w, b), lambda: layer_norm_reference(x, w, b)),
        (lambda t, w, b: F.rms_norm(t, w), lambda: rms_norm_reference(x, w)),
        (lambda t, w, b: F.gelu(t), lambda: gelu_reference(x, "tanh")),
        (lambda t, w, b: F.gelu(t, approximate="none"), lambda: gelu_reference(x, "none")),
        (lambda t, w, b: F.silu(t), lambda: silu_reference(x)),
    ]
    for ours, reference in cases:
        y = ours(mt.tensor(x.astype(np.float32)), mt.tensor(w.astype(np.float32)), mt.tensor(b.astype(np.float32)))
        assert y.dtype == mt.float32
        np.testing.assert_allclose(y.numpy(), reference(), rtol=2e-4, atol=2e-4)


def test_gelu_and_silu_identities():
    x = np.linspace(-6, 6, 101)
    # erf form: x * Φ(x), Φ from math.erf one number at a time
    phi = np.array([0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x])
    np.testing.assert_allclose(F.gelu(mt.tensor(x), approximate="none").numpy(), x * phi, rtol=1e-12, atol=1e-15)
    # the tanh form is within 1e-3 of the exact one
    np.testing.assert_allclose(F.gelu(mt.tensor(x)).numpy(), x * phi, atol=1e-3)
    np.testing.assert_allclose(F.silu(mt.tensor(x)).numpy(), x / (1 + np.exp(-x)), rtol=1e-12)
    big = mt.tensor(np.array([-1e4, 1e4], dtype=np.float32))
    assert np.all(np.isfinite(F.silu(big).numpy())) and np.all(np.isfinite(F.gelu(big).numpy()))
    a, b = randn(4, 3), randn(4, 3, seed=1)
    np.testing.assert_allclose(F.swiglu(mt.tensor(a), mt.tensor(b)).numpy(), silu_reference(a) * b, rtol=1e-12)


def test_embedding_and_its_scatter_add():
    w = mt.tensor(randn(5, 3), requires_grad=True)
    ids = mt.tensor(np.array([[0, 4, 0], [0, 2, 4]]))
    y = F.embedding(ids, w)
    np.testing.assert_array_equal(y.numpy(), w.numpy()[ids.numpy()])
    y.backward(np.ones((2, 3, 3)))
    np.testing.assert_array_equal(w.grad[:, 0], [3.0, 0.0, 1.0, 0.0, 2.0])  # id 0 appears three times


def test_dropout_statistics_and_modes():
    x = mt.ones(200_000)
    y = F.dropout(x, 0.3, training=True, generator=np.random.default_rng(0)).numpy()
    assert abs((y == 0).mean() - 0.3) < 0.01
    np.testing.assert_allclose(np.unique(y), [0.0, 1 / 0.7], rtol=1e-6)
    assert F.dropout(x, 0.3, training=False) is x
    same = [F.dropout(x, 0.5, generator=np.random.default_rng(7)).numpy() for _ in range(2)]
    np.testing.assert_array_equal(*same)
    with pytest.raises(ValueError, match=r"dropout: p must be in \[0, 1\)"):
        F.dropout(x, 1.0)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("Tq, Tk", [(5, 5), (2, 5), (1, 4)])
def test_attention_against_reference(causal, Tq, Tk, matmul_backend):
    q, k, v = randn(2, 3, Tq, 4), randn(2, 3, Tk, 4, seed=1), randn(2, 3, Tk, 4, seed=2)
    got = F.scaled_dot_product_attention(mt.tensor(q), mt.tensor(k), mt.tensor(v), causal=causal).numpy()
    np.testing.assert_allclose(got, attention_reference(q, k, v, causal), rtol=1e-12, atol=1e-12)
    got32 = F.scaled_dot_product_attention(*(mt.tensor(a.astype(np.float32)) for a in (q, k, v)), causal=causal)
    assert got32.dtype == mt.float32
    np.testing.assert_allclose(got32.numpy(), got, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_multi_head_attention_splits_attends_and_merges(causal, matmul_backend):
    B, T, H, D = 2, 5, 3, 4
    qkv = randn(B, T, 3 * H * D)
    heads = qkv.reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)  # (3, B, H, T, D), by hand
    expected = attention_reference(heads[0], heads[1], heads[2], causal).transpose(0, 2, 1, 3).reshape(B, T, H * D)
    got = F.multi_head_attention(mt.tensor(qkv), H, causal=causal).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    got32 = F.multi_head_attention(mt.tensor(qkv.astype(np.float32)), H, causal=causal)
    assert got32.dtype == mt.float32
    np.testing.assert_allclose(got32.numpy(), got, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="multi_head_attention: the last dim of qkv"):
        F.multi_head_attention(mt.tensor(qkv[:, :, :-1]), H)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_without_blas_calls(causal, monkeypatch):
    """Where numpy's BLAS cannot be called from Numba, attention runs np.matmul and the softmax
    kernels in separate passes: its values against the reference, its gradients against finite
    differences, and both gradients against the fused path's where BLAS can be called."""
    from microtensor.ops import attention, blas

    q, k, v = randn(2, 3, 5, 4), randn(2, 3, 5, 4, seed=1), randn(2, 3, 5, 4, seed=2)
    grad = randn(2, 3, 5, 4, seed=3)
    available = blas.AVAILABLE
    monkeypatch.setattr(blas, "AVAILABLE", False)
    assert attention.blas_jobs((q, np.swapaxes(k, -1, -2), np.empty((2, 3, 5, 5)))) is None
    inputs = [mt.tensor(a, requires_grad=True) for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*inputs, causal=causal)
    np.testing.assert_allclose(out.numpy(), attention_reference(q, k, v, causal), rtol=1e-12, atol=1e-12)
    out.backward(mt.tensor(grad))
    attend = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=causal)  # noqa: E731
    mt.gradcheck(attend, [mt.tensor(a, requires_grad=True) for a in (q, k, v)])
    if not available:
        return  # the fused path needs BLAS (not under NUMBA_DISABLE_JIT=1)
    monkeypatch.setattr(blas, "AVAILABLE", True)
    fused = [mt.tensor(a, requires_grad=True) for a in (q, k, v)]
    F.scaled_dot_product_attention(*fused, causal=causal).backward(mt.tensor(grad))
    for separate, together in zip(inputs, fused):
        np.testing.assert_allclose(separate.grad, together.grad, rtol=1e-10, atol=1e-12)


def test_incremental_attention_equals_the_full_causal_forward():
    q, k, v = randn(1, 2, 6, 4), randn(1, 2, 6, 4, seed=1), randn(1, 2, 6, 4, seed=2)
    full = F.scaled_dot_product_attention(mt.tensor(q), mt.tensor(k), mt.tensor(v)).numpy()
    for t in range(6):  # one query at a time, against the keys so far: what a KV cache does
        row = F.scaled_dot_product_attention(mt.tensor(q[:, :, t : t + 1]), mt.tensor(k[:, :, : t + 1]), mt.tensor(v[:, :, : t + 1]))
        np.testing.assert_allclose(row.numpy()[:, :, 0], full[:, :, t], rtol=1e-12)


def test_against_torch_in_float64():
    torch = pytest.importorskip("torch")
    tf = torch.nn.functional
    x, w, b = randn(4, 6), randn(6, seed=1), randn(6, seed=2)
    T = torch.tensor
    close = np.testing.assert_allclose
    close(F.layer_norm(mt.tensor(x), mt.tensor(w), mt.tensor(b)).numpy(), tf.layer_norm(T(x), (6,), T(w), T(b)).numpy(), rtol=1e-10)
    close(F.rms_norm(mt.tensor(x), mt.tensor(w)).numpy(), tf.rms_norm(T(x), (6,), T(w), eps=1e-5).numpy(), rtol=1e-10)
    close(F.gelu(mt.tensor(x)).numpy(), tf.gelu(T(x), approximate="tanh").numpy(), rtol=1e-12)
    close(F.gelu(mt.tensor(x), approximate="none").numpy(), tf.gelu(T(x)).numpy(), rtol=1e-12)
    close(F.silu(mt.tensor(x)).numpy(), tf.silu(T(x)).numpy(), rtol=1e-12)
    ids = np.array([[1, 3], [0, 1]])
    close(F.embedding(mt.tensor(ids), mt.tensor(x)).numpy(), tf.embedding(T(ids), T(x)).numpy())
    q, k, v = randn(2, 2, 5, 3), randn(2, 2, 5, 3, seed=1), randn(2, 2, 5, 3, seed=2)
    close(
        F.scaled_dot_product_attention(mt.tensor(q), mt.tensor(k), mt.tensor(v)).numpy(),
        tf.scaled_dot_product_attention(T(q), T(k), T(v), is_causal=True).numpy(),
        rtol=1e-10,
    )


def test_bad_inputs_name_the_op():
    x = mt.randn(4, 6)
    with pytest.raises(ValueError, match=r"layer_norm: weight must have shape \(6,\)"):
        F.layer_norm(x, mt.ones(4))
    with pytest.raises(TypeError, match="rms_norm: inputs have different dtypes"):
        F.rms_norm(x, mt.ones(6, dtype=mt.float64))
    with pytest.raises(TypeError, match="layer_norm: expected a float32 or float64 tensor, got int64"):
        F.layer_norm(mt.arange(6))
    with pytest.raises(ValueError, match='gelu: approximate must be "tanh" or "none"'):
        F.gelu(x, approximate="sigmoid")
    with pytest.raises(ValueError, match="swiglu: gate and value must have the same shape"):
        F.swiglu(x, mt.randn(4, 5))
    with pytest.raises(IndexError, match=r"embedding: id 9 is out of range for a table of 4 rows"):
        F.embedding(mt.tensor([1, 9]), x)
    with pytest.raises(TypeError, match="embedding: ids must be an integer tensor"):
        F.embedding(mt.tensor([1.0]), x)
    q = mt.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="scaled_dot_product_attention: shapes"):
        F.scaled_dot_product_attention(q, mt.randn(1, 2, 3, 5), mt.randn(1, 2, 3, 5))
    with pytest.raises(ValueError, match="causal attention needs Tk >= Tq"):
        F.scaled_dot_product_attention(q, mt.randn(1, 2, 2, 4), mt.randn(1, 2, 2, 4))
    with pytest.raises(ValueError, match="must be a 4-d Tensor"):
        F.scaled_dot_product_attention(mt.randn(2, 3, 4), q, q)


def test_float32_kernels_do_their_arithmetic_in_float32():
    """A Python number literal (`1 + x`, `0.5 * x`) can make a float32 kernel compute in float64:
    compile each kernel for float32 arrays and look at the types numba inferred for its variables
    and arithmetic."""
    numba = pytest.importorskip("numba")
    if numba.config.DISABLE_JIT:
        pytest.skip("needs numba's type inference")
    from microtensor.ops import attention, embedding, gelu, layer_norm, rms_norm, silu

    f = np.float32
    a, r, c = np.ones((4, 3), f), np.ones(4, f), np.ones(3, f)
    flat = np.ones(5, f)
    q = np.ones((1, 2, 3, 4), f)
    probs = np.ones((1, 2, 3, 3), f)
    ids = np.zeros(4, np.int64)
    calls = [
        (layer_norm.layer_norm_forward, (a, c, c, f(1e-5), a.copy(), r.copy(), r.copy())),
        (layer_norm.layer_norm_backward_input, (a, a, c, r, r, a.copy())),
        (layer_norm.layer_norm_backward_params, (a, a, r, r, c.copy(), c.copy())),
        (rms_norm.rms_norm_forward, (a, c, f(1e-5), a.copy(), r.copy())),
        (rms_norm.rms_norm_backward_input, (a, a, c, r, a.copy())),
        (rms_norm.rms_norm_backward_weight, (a, a, r, c.copy())),
        (gelu.gelu_tanh_forward, (flat, flat.copy(), f(0.5), f(0.8), f(0.04))),
        (gelu.gelu_tanh_backward, (flat, flat, flat.copy(), f(0.5), f(0.8), f(0.04))),
        (gelu.gelu_erf_forward, (flat, flat.copy(), f(0.5), f(0.7))),
        (gelu.gelu_erf_backward, (flat, flat, flat.copy(), f(0.5), f(0.7), f(0.4))),
        (silu.silu_forward, (flat, flat.copy(), flat.copy())),
        (silu.silu_backward, (flat, flat, flat, flat.copy())),
        (silu.swiglu_forward, (flat, flat, flat.copy())),
        (silu.swiglu_backward, (flat, flat, flat, flat.copy(), flat.copy())),
        (embedding.embedding_forward, (ids, a, a.copy())),
        (embedding.embedding_backward, (a, ids, a.copy())),
        (attention.attention_forward, (q, q, q, f(0.5), True, q.copy(), probs.copy())),
        (attention.attention_backward, (q, q, q, q, probs, f(0.5), True, q.copy(), q.copy(), q.copy())),
        (attention.masked_softmax_tile, (probs[0, 0].copy(), f(0.5), True)),
        (attention.masked_softmax_backward_tile, (probs[0, 0], probs[0, 0].copy(), f(0.5))),
    ]
    promoted = {}
    for kernel, args in calls:
        fresh = numba.njit(kernel.py_func)
        fresh(*args)
        overload = fresh.overloads[fresh.signatures[0]]
        names = [n for n, t in overload.type_annotation.typemap.items() if t == numba.float64 and (not n.startswith("$") or n.startswith("$binop"))]
        if names:
            promoted[kernel.__name__] = names
    assert not promoted, f"float64 arithmetic in float32 kernels: {promoted}"
