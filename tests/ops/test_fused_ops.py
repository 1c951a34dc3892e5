"""The checks the fused ops (LayerNorm, RMSNorm, GELU, SiLU, embedding) share, each test over several
of them: float32 against float64 references, which kernels have fast twins, forward values and the
norms' and embedding's gradients against PyTorch in float64 when installed, and the bad-input
errors. Each op's own tests are in its file (test_layer_norm.py, test_embedding.py,
test_dropout.py, test_activations.py; tests/electives/test_rms_norm.py). (Gradients against finite
differences: tests/test_gradcheck_cases.py.) Tests taking `kernel_set` run once with each kernel
set."""
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


def test_which_norm_kernels_have_fast_twins():
    """The row kernels have twins (compiled to sum in any order), and so has LayerNorm's sum over the
    rows (in one band of rows per thread); RMSNorm's sum over the rows and embedding's gather and
    scatter-add have none (the readable loops are the fast ones)."""
    if numba.config.DISABLE_JIT:
        pytest.skip("the fast kernels need Numba's compiler")
    twinned = [
        layer_norm.layer_norm_forward, layer_norm.layer_norm_backward_input, layer_norm.layer_norm_backward_params,
        rms_norm.rms_norm_forward, rms_norm.rms_norm_backward_input,
    ]  # fmt: skip
    alone = [
        rms_norm.rms_norm_backward_weight,
        embedding.embedding_forward, embedding.embedding_backward, embedding.first_id_out_of_range,
    ]  # fmt: skip
    with mt.using_kernels("fast"):
        assert all(active(k) is not k for k in twinned)
        assert all(active(k) is k for k in alone)


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
