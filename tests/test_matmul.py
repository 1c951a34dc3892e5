"""matmul forward against plain loops and PyTorch, for both backends, and its errors."""
import os

import numpy as np
import pytest

import microtensor as mt
import microtensor.functional as F
from microtensor.ops import blas
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


# Products big enough to be split across threads (ops/blas.py), in every layout the backward
# passes (transposed views) and some it has to copy; against numpy in float64.
LAYOUTS = {
    "contiguous": lambda x: x,
    "transposed view": lambda x: np.ascontiguousarray(x.T).T,
    "row stride": lambda x: np.concatenate([x, x], axis=1)[:, : x.shape[1]],
    "every other column (copied)": lambda x: np.repeat(x, 2, axis=1)[:, ::2],
    "rows reversed (copied)": lambda x: x[::-1].copy()[::-1],
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout_a", list(LAYOUTS))
@pytest.mark.parametrize("layout_b", ["contiguous", "transposed view", "every other column (copied)"])
def test_split_products_in_every_layout(dtype, layout_a, layout_b):
    if not blas.AVAILABLE:
        pytest.skip("numpy's BLAS is not callable from Numba here (another BLAS, or NUMBA_DISABLE_JIT=1)")
    for n, k, m in [(129, 257, 65), (1, 600, 300), (300, 500, 1), (513, 1, 300)]:
        a, b = randn(n, k, seed=n), randn(k, m, seed=m)
        got = blas.matmul_2d(LAYOUTS[layout_a](a.astype(dtype)), LAYOUTS[layout_b](b.astype(dtype)))
        assert got.dtype == dtype and got.shape == (n, m) and got.flags.c_contiguous
        expected = a.astype(dtype).astype(np.float64) @ b.astype(dtype).astype(np.float64)
        tolerance = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance * np.abs(expected).max())


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_linear_layer_sized_product_forward_and_backward(threads):
    """x (B, T, C) @ W at the GPT recipe's sizes, gradients from the formulas dx = g Wᵀ and
    dW = xᵀ g computed by numpy, on 1 to 3 slices of rows."""
    x, w, g = randn(4, 64, 128), randn(128, 384, seed=1), randn(4, 64, 384, seed=2)
    with mt.num_threads(threads):
        tx, tw = mt.tensor(x, requires_grad=True), mt.tensor(w, requires_grad=True)
        out = tx @ tw
        out.backward(g)
    np.testing.assert_allclose(out.numpy(), x @ w, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tx.grad, g @ w.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tw.grad, x.reshape(-1, 128).T @ g.reshape(-1, 384), rtol=1e-12, atol=1e-11)


def test_products_without_the_split_use_numpys_own_threads():
    """MICROTENSOR_SPLIT_PRODUCTS=0 (as where numpy's BLAS cannot be called from Numba): matmul
    goes through np.matmul, and neither thread pool spins."""
    import subprocess
    import sys

    code = (
        "import os, numpy as np, microtensor as mt\n"
        "from microtensor.ops import blas\n"
        "a, b = np.random.default_rng(0).standard_normal((2, 300, 400))\n"
        "c = (mt.tensor(a) @ mt.tensor(b.T)).numpy()\n"
        "print(blas.AVAILABLE, os.environ['GOMP_SPINCOUNT'], float(np.abs(c - a @ b.T).max()))\n"
    )
    environment = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    environment["MICROTENSOR_SPLIT_PRODUCTS"] = "0"
    result = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, check=True)
    available, spin, error = result.stdout.split()
    assert available == "False" and spin == "1000" and float(error) < 1e-10


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batched_products_on_strided_views(dtype):
    """The (B, H) products of attention, on the views it passes (heads of one (B, T, 3C) array,
    transposes, an output that is the heads of a (B, T, C) array), against numpy."""
    if not blas.AVAILABLE:
        pytest.skip("numpy's BLAS is not callable from Numba here (another BLAS, or NUMBA_DISABLE_JIT=1)")
    B, H, T, D = 3, 2, 5, 4
    qkv = randn(B, T, 3 * H * D).astype(dtype)
    q, k, v = qkv.reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)  # (B, H, T, D) views
    double = dtype == np.float64
    scores = np.empty((B, H, T, T), dtype=dtype)
    blas.gemm_in_parallel(double, blas.batched_jobs(q, np.swapaxes(k, -1, -2), scores))
    heads_out = np.zeros((B, T, H * D), dtype=dtype)
    heads = heads_out.reshape(B, T, H, D).transpose(0, 2, 1, 3)  # (B, H, T, D), a view of heads_out
    blas.gemm_in_parallel(double, blas.batched_jobs(np.swapaxes(scores, -1, -2), v, heads))
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    expected_scores = np.einsum("bhid,bhjd->bhij", q64, k64)
    expected_out = np.einsum("bhji,bhjd->bhid", expected_scores, v64).transpose(0, 2, 1, 3).reshape(B, T, H * D)
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(scores, expected_scores, rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(heads_out, expected_out, rtol=tolerance, atol=tolerance * np.abs(expected_out).max())


def test_two_products_computed_together():
    """matmul_2d_together: a large and a small product, transposed views among them, each as numpy gives it."""
    if not blas.AVAILABLE:
        pytest.skip("numpy's BLAS is not callable from Numba here (another BLAS, or NUMBA_DISABLE_JIT=1)")
    g, w, x = randn(300, 200), randn(100, 200, seed=1), randn(300, 100, seed=2)
    small_a, small_b = randn(3, 4, seed=3), randn(4, 5, seed=4)
    for first, second in [((g, w.T), (x.T, g)), ((g, w.T), (small_a, small_b)), ((small_a, small_b), (x.T, g))]:
        got = blas.matmul_2d_together(first, second)
        for (a, b), c in zip((first, second), got):
            assert c.flags.c_contiguous
            np.testing.assert_allclose(c, a @ b, rtol=1e-12, atol=1e-12)
