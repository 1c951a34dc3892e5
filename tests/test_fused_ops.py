"""Forward values of the fused kernels: LayerNorm, RMSNorm, GELU, SiLU, SwiGLU, embedding,
and dropout, against plain-loop or numpy references, PyTorch in float64 when installed,
float32 against float64, the readable and fast kernels of LayerNorm, RMSNorm and embedding against
each other, the norms' and embedding's gradients against PyTorch, and the bad-input errors.
(Gradients against finite differences: tests/test_gradcheck_cases.py.) Tests taking `kernel_set`
run once with each kernel set."""
import math

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import microtensor as mt
import microtensor.functional as F
from microtensor.kernels import active
from microtensor.ops import embedding, layer_norm
from microtensor.ops.electives import rms_norm
from microtensor.ops.gelu import gelu_reference
from microtensor.ops.layer_norm import layer_norm_reference
from microtensor.ops.electives.rms_norm import rms_norm_reference
from microtensor.ops.electives.silu import silu_reference
from helpers import randn


def test_layer_norm_by_plain_loops(kernel_set):
    x, w, b = randn(3, 5), randn(5, seed=1), randn(5, seed=2)
    expected = np.empty_like(x)
    for n in range(3):
        mean = sum(x[n]) / 5
        var = sum((x[n] - mean) ** 2) / 5
        expected[n] = (x[n] - mean) / math.sqrt(var + 1e-5) * w + b
    got = F.layer_norm(mt.tensor(x), mt.tensor(w), mt.tensor(b)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(layer_norm_reference(x, w, b), expected, rtol=1e-12)


def test_rms_norm_by_plain_loops(kernel_set):
    x, w = randn(3, 5), randn(5, seed=1)
    expected = np.array([x[n] / math.sqrt(sum(x[n] ** 2) / 5 + 1e-5) * w for n in range(3)])
    np.testing.assert_allclose(F.rms_norm(mt.tensor(x), mt.tensor(w)).numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(rms_norm_reference(x, w), expected, rtol=1e-12)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # one kernel set for all examples
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=3), seed=st.integers(0, 100))
def test_float32_kernels_agree_with_float64_references(shape, seed, kernel_set):
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


def test_embedding_and_its_scatter_add(kernel_set):
    w = mt.tensor(randn(5, 3), requires_grad=True)
    ids = mt.tensor(np.array([[0, 4, 0], [0, 2, 4]]))
    y = F.embedding(ids, w)
    np.testing.assert_array_equal(y.numpy(), w.numpy()[ids.numpy()])
    y.backward(np.ones((2, 3, 3)))
    np.testing.assert_array_equal(w.grad[:, 0], [3.0, 0.0, 1.0, 0.0, 2.0])  # id 0 appears three times


def norm_problem(dtype, seed=0):
    """Rows as a GPT meets them (37 rows of 130, a width that is no multiple of a vector's), a
    weight and a bias, an upstream gradient, and the float's eps."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((37, 130)) * 2 + 0.5
    x[3] += 100.0  # a large mean: the centering must cancel it
    w, b, g = rng.uniform(0.5, 1.5, 130), rng.standard_normal(130), rng.standard_normal((37, 130))
    return x.astype(dtype), w.astype(dtype), b.astype(dtype), g.astype(dtype)


def kernel_pair(readable_kernel):
    """(the readable kernel, the fast set's kernel), skipping the test without the JIT."""
    if numba.config.DISABLE_JIT:
        pytest.skip("the fast kernels need Numba's compiler")
    with mt.using_kernels("fast"):
        return readable_kernel, active(readable_kernel)


# The fast twins add a row's 130 numbers in another order: each sum may differ by a few ulp, and so
# may each result, relatively (rtol) or, where a result is a difference of nearly equal terms of
# size ~1, absolutely (atol). 64 ulp bounds that with room to spare, and still catches a wrong term.
AGREE = {dtype: dict(rtol=64 * np.finfo(dtype).eps, atol=64 * np.finfo(dtype).eps) for dtype in (np.float64, np.float32)}


def assert_close(actual, desired, rtol, atol, what):
    """|actual - desired| <= atol + rtol |desired| everywhere; atol may be an array (one per row)."""
    excess = np.abs(actual - desired) - (atol + rtol * np.abs(desired))
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert np.all(excess <= 0), f"{what}: at {worst}, {actual[worst]} against {desired[worst]}"


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_layer_norm_kernels_readable_and_fast_agree(dtype):
    x, w, b, g = norm_problem(dtype)
    N, C = x.shape
    eps = dtype(1e-5)
    outputs = []
    for forward in kernel_pair(layer_norm.layer_norm_forward):
        y, mean, rstd = np.empty_like(x), np.empty(N, dtype), np.empty(N, dtype)
        forward(x, w, b, eps, y, mean, rstd)
        outputs.append((y, mean, rstd))
    _, mean, rstd = outputs[0]
    # A row's mean is rounded to a few ulp of |mean|, which xhat = (x - mean) rstd divides by the
    # std: a row far from 0 (row 3) keeps |mean| / std times fewer digits, in either set.
    centering = (1 + np.abs(mean) * rstd)[:, None]  # (N, 1)
    rtol, atol = AGREE[dtype]["rtol"], AGREE[dtype]["atol"]
    for name, readable, fast in zip(("y", "mean", "rstd"), *outputs):
        assert_close(fast, readable, rtol, atol * centering if name == "y" else atol, name)
    grads = []
    for backward in kernel_pair(layer_norm.layer_norm_backward_input):
        grad_x = np.empty_like(x)
        backward(g, x, w, mean, rstd, grad_x)
        grads.append(grad_x)
    assert_close(grads[1], grads[0], rtol, atol * centering, "grad_x")
    params = []
    for backward in kernel_pair(layer_norm.layer_norm_backward_params):
        grad_w, grad_b = np.empty_like(w), np.empty_like(b)
        backward(g, x, mean, rstd, grad_w, grad_b)
        params.append((grad_w, grad_b))
    for name, readable, fast in zip(("grad_weight", "grad_bias"), *params):
        np.testing.assert_allclose(fast, readable, **AGREE[dtype], err_msg=name)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_rms_norm_kernels_readable_and_fast_agree(dtype):
    x, w, _, g = norm_problem(dtype)
    N, C = x.shape
    outputs = []
    for forward in kernel_pair(rms_norm.rms_norm_forward):
        y, rstd = np.empty_like(x), np.empty(N, dtype)
        forward(x, w, dtype(1e-5), y, rstd)
        outputs.append((y, rstd))
    for name, readable, fast in zip(("y", "rstd"), *outputs):
        np.testing.assert_allclose(fast, readable, **AGREE[dtype], err_msg=name)
    _, rstd = outputs[0]
    grads = []
    for backward in kernel_pair(rms_norm.rms_norm_backward_input):
        grad_x = np.empty_like(x)
        backward(g, x, w, rstd, grad_x)
        grads.append(grad_x)
    np.testing.assert_allclose(grads[1], grads[0], **AGREE[dtype], err_msg="grad_x")
    weights = []
    for backward in kernel_pair(rms_norm.rms_norm_backward_weight):
        grad_w = np.empty_like(w)
        backward(g, x, rstd, grad_w)
        weights.append(grad_w)
    np.testing.assert_allclose(weights[1], weights[0], **AGREE[dtype], err_msg="grad_weight")


def test_which_norm_kernels_have_fast_twins():
    """The row kernels have twins (compiled to sum in any order); the kernels summing over rows and
    embedding's gather and scatter-add have none (the readable loops are the fast ones)."""
    if numba.config.DISABLE_JIT:
        pytest.skip("the fast kernels need Numba's compiler")
    twinned = [
        layer_norm.layer_norm_forward, layer_norm.layer_norm_backward_input,
        rms_norm.rms_norm_forward, rms_norm.rms_norm_backward_input,
    ]  # fmt: skip
    alone = [
        layer_norm.layer_norm_backward_params, rms_norm.rms_norm_backward_weight,
        embedding.embedding_forward, embedding.embedding_backward, embedding.first_id_out_of_range,
    ]  # fmt: skip
    with mt.using_kernels("fast"):
        assert all(active(k) is not k for k in twinned)
        assert all(active(k) is k for k in alone)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_embedding_kernels_by_plain_indexing(dtype, kernel_set):
    """The gather is weight[ids] exactly, and the scatter-add adds each position's gradient row into
    its id's row, in position order (np.add.at adds in the same order: equal to the last bit)."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((11, 130)).astype(dtype)
    ids = rng.integers(0, 11, 300)  # ids repeat: rows collect several gradients
    y = np.empty((300, 130), dtype)
    active(embedding.embedding_forward)(ids, weight, y)
    np.testing.assert_array_equal(y, weight[ids])
    g = rng.standard_normal((300, 130)).astype(dtype)
    grad_weight = np.full_like(weight, np.nan)  # the kernel zeroes it first
    active(embedding.embedding_backward)(g, ids, grad_weight)
    expected = np.zeros_like(weight)
    np.add.at(expected, ids, g)
    np.testing.assert_array_equal(grad_weight, expected)
    assert active(embedding.first_id_out_of_range)(ids, 11) == -1
    assert active(embedding.first_id_out_of_range)(np.array([0, 3, 11, -1]), 11) == 2


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


def test_against_torch_in_float64(kernel_set):
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


def test_norm_and_embedding_gradients_against_torch_in_float64(kernel_set):
    """The backward kernels against PyTorch's autograd (an independent implementation), in float64."""
    torch = pytest.importorskip("torch")
    tf = torch.nn.functional
    x, w, b, g = randn(4, 3, 6), randn(6, seed=1), randn(6, seed=2), randn(4, 3, 6, seed=3)
    x[1] += 50.0  # rows far from 0 too
    cases = [
        (lambda x, w, b: F.layer_norm(x, w, b), lambda x, w, b: tf.layer_norm(x, (6,), w, b)),
        (lambda x, w, b: F.rms_norm(x, w), lambda x, w, b: tf.rms_norm(x, (6,), w, eps=1e-5)),
    ]
    for ours, theirs in cases:
        inputs = [mt.tensor(a, requires_grad=True) for a in (x, w, b)]
        ours(*inputs).backward(mt.tensor(g))
        their_inputs = [torch.tensor(a, requires_grad=True) for a in (x, w, b)]
        theirs(*their_inputs).backward(torch.tensor(g))
        for mine, their in zip(inputs, their_inputs):
            if their.grad is not None:  # rms_norm has no bias
                np.testing.assert_allclose(mine.grad, their.grad.numpy(), rtol=1e-10, atol=1e-12)
    ids = np.array([[1, 3, 1], [0, 1, 4]])
    table = mt.tensor(randn(5, 6), requires_grad=True)
    their_table = torch.tensor(table.numpy(), requires_grad=True)
    F.embedding(mt.tensor(ids), table).backward(mt.tensor(g[:2]))
    tf.embedding(torch.tensor(ids), their_table).backward(torch.tensor(g[:2]))
    np.testing.assert_allclose(table.grad, their_table.grad.numpy(), rtol=1e-14, atol=1e-15)


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
