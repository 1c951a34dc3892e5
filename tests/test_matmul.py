"""matmul forward against plain loops and PyTorch, for both backends, and its errors."""
import numpy as np
import pytest

import microtensor as mt
import microtensor.functional as F
from microtensor.ops.matmul import matmul_reference


def randn(*shape, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def test_two_dims_against_plain_loops(matmul_backend):
    a, b = randn(5, 3), randn(3, 4, seed=1)
    np.testing.assert_allclose(F.matmul(mt.tensor(a), mt.tensor(b)).numpy(), matmul_reference(a, b), rtol=1e-12)


def test_batched_broadcasting_and_3d_by_2d(matmul_backend):
    a, b = randn(2, 1, 3, 4), randn(5, 4, 2, seed=1)
    got = F.matmul(mt.tensor(a), mt.tensor(b)).numpy()
    assert got.shape == (2, 5, 3, 2)
    for i in range(2):
        for j in range(5):
            np.testing.assert_allclose(got[i, j], matmul_reference(a[i, 0], b[j]), rtol=1e-12)
    x, w = randn(2, 3, 4), randn(4, 6, seed=2)
    got = (mt.tensor(x) @ mt.tensor(w)).numpy()
    for i in range(2):
        np.testing.assert_allclose(got[i], matmul_reference(x[i], w), rtol=1e-12)


def test_vectors(matmul_backend):
    v, m = randn(3), randn(3, 2, seed=1)
    assert F.matmul(mt.tensor(v), mt.tensor(m)).shape == (2,)
    assert F.matmul(mt.tensor(m.T), mt.tensor(v)).shape == (2,)
    dot = F.matmul(mt.tensor(v), mt.tensor(v))
    assert dot.shape == () and abs(dot.item() - float(v @ v)) < 1e-12


def test_float32_stays_float32_and_agrees(matmul_backend):
    a, b = randn(64, 48), randn(48, 32, seed=1)
    c = F.matmul(mt.tensor(a.astype(np.float32)), mt.tensor(b.astype(np.float32)))
    assert c.dtype == mt.float32
    np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_backends_agree_forward_and_backward():
    a, b = randn(2, 6, 5), randn(5, 4, seed=1)
    results = []
    for name in ("blas", "numba"):
        mt.set_matmul(name)
        ta, tb = mt.tensor(a, requires_grad=True), mt.tensor(b, requires_grad=True)
        out = ta @ tb
        out.backward(randn(2, 6, 4, seed=3))
        results.append((out.numpy(), ta.grad, tb.grad))
    mt.set_matmul("blas")
    for ours, theirs in zip(*results):
        np.testing.assert_allclose(ours, theirs, rtol=1e-12)


def test_against_torch():
    torch = pytest.importorskip("torch")
    a, b = randn(3, 4, 5), randn(3, 5, 2, seed=1)
    np.testing.assert_allclose((mt.tensor(a) @ mt.tensor(b)).numpy(), (torch.tensor(a) @ torch.tensor(b)).numpy(), rtol=1e-12)


def test_errors():
    with pytest.raises(ValueError, match=r"matmul: cannot multiply \(2, 3\) by \(4, 5\)"):
        mt.ones(2, 3) @ mt.ones(4, 5)
    with pytest.raises(ValueError, match="matmul \\(batch dims\\)"):
        mt.ones(2, 2, 3) @ mt.ones(3, 3, 4)
    with pytest.raises(TypeError, match="matmul: inputs have different dtypes"):
        mt.ones(2, 3) @ mt.ones(3, 2, dtype=mt.float64)
    with pytest.raises(ValueError, match="set_matmul: unknown backend 'cuda'"):
        mt.set_matmul("cuda")
