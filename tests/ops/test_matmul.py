"""matmul in both kernel sets: forward against plain loops and PyTorch, backward against the
formulas dA = g Bᵀ and dB = Aᵀ g computed by numpy, the readable and fast kernels called directly
on every layout BLAS is given, the fallback without BLAS, and numpy's BLAS threads left alone.
(Gradients against finite differences: tests/test_gradcheck_cases.py.)

Tolerances: float64 results are held to 1e-12 (a few roundings of sums of at most a few hundred
terms); float32 ones to 1e-5 relative to the largest entry, against the product of the same
float32 numbers computed in float64 (float32 has ~6e-8 relative rounding, and sums of a few
hundred terms lose a few hundred times that at worst).
"""
import os
import subprocess
import sys

import numba
import numpy as np
import pytest

import microtensor as mt
import microtensor.functional as F
from microtensor.ops import matmul as readable
from microtensor.ops.matmul import matmul_reference
from helpers import needs_jit, randn

pytestmark = pytest.mark.all_threads  # parallel loops run split across threads here (conftest.py)

TOLERANCE = {np.float32: 1e-5, np.float64: 1e-12}


def assert_close(got, expected, dtype):
    """got against expected (float64), relative to expected's largest entry."""
    tolerance = TOLERANCE[dtype]
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance * max(1.0, np.abs(expected).max()))


def fast_kernels():
    from microtensor.fast import blas, matmul

    return blas, matmul


# --------------------------------------------------------------------------------- through the op


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_two_dims_against_plain_loops(kernel_set, dtype):
    a, b = randn(5, 3, dtype=dtype), randn(3, 4, seed=1, dtype=dtype)
    c = F.matmul(mt.tensor(a), mt.tensor(b))
    assert c.dtype == dtype
    assert_close(c.numpy(), matmul_reference(a.astype(np.float64), b.astype(np.float64)), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batched_broadcasting_and_3d_by_2d(kernel_set, dtype):
    a, b = randn(2, 1, 3, 4, dtype=dtype), randn(5, 4, 2, seed=1, dtype=dtype)
    got = F.matmul(mt.tensor(a), mt.tensor(b)).numpy()
    assert got.shape == (2, 5, 3, 2) and got.dtype == dtype
    for i in range(2):
        for j in range(5):
            assert_close(got[i, j], matmul_reference(a[i, 0].astype(np.float64), b[j].astype(np.float64)), dtype)
    x, w = randn(2, 3, 4, dtype=dtype), randn(4, 6, seed=2, dtype=dtype)
    got = (mt.tensor(x) @ mt.tensor(w)).numpy()
    for i in range(2):
        assert_close(got[i], matmul_reference(x[i].astype(np.float64), w.astype(np.float64)), dtype)


def test_vectors(kernel_set):
    v, m = randn(3), randn(3, 2, seed=1)
    assert F.matmul(mt.tensor(v), mt.tensor(m)).shape == (2,)
    assert F.matmul(mt.tensor(m.T), mt.tensor(v)).shape == (2,)
    dot = F.matmul(mt.tensor(v), mt.tensor(v))
    assert dot.shape == () and abs(dot.item() - float(v @ v)) < 1e-12


def test_against_torch(kernel_set):
    torch = pytest.importorskip("torch")
    a, b = randn(3, 4, 5), randn(3, 5, 2, seed=1)
    np.testing.assert_allclose((mt.tensor(a) @ mt.tensor(b)).numpy(), (torch.tensor(a) @ torch.tensor(b)).numpy(), rtol=1e-12)


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [((6, 5), (5, 4)), ((2, 6, 5), (5, 4)), ((2, 1, 3, 5), (4, 5, 2)), ((3, 5), (2, 5, 4)), ((2, 3, 5), (2, 5, 4))],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_backward_against_the_formulas(kernel_set, a_shape, b_shape, dtype):
    """dA = g Bᵀ and dB = Aᵀ g by numpy in float64, summed over the batch dims an input was
    broadcast along; each gradient also alone (the other input without requires_grad)."""
    a, b = randn(*a_shape, dtype=dtype), randn(*b_shape, seed=1, dtype=dtype)
    out_shape = np.broadcast_shapes(a_shape[:-2], b_shape[:-2]) + (a_shape[-2], b_shape[-1])
    g = randn(*out_shape, seed=2, dtype=dtype)
    a64, b64, g64 = (x.astype(np.float64) for x in (a, b, g))
    expected_a = mt.unbroadcast(g64 @ np.swapaxes(b64, -1, -2), a_shape)
    expected_b = mt.unbroadcast(np.swapaxes(a64, -1, -2) @ g64, b_shape)
    for needs in [(True, True), (True, False), (False, True)]:
        ta, tb = mt.tensor(a, requires_grad=needs[0]), mt.tensor(b, requires_grad=needs[1])
        out = ta @ tb
        assert_close(out.numpy(), a64 @ b64, dtype)
        out.backward(g)
        assert (ta.grad is not None) == needs[0] and (tb.grad is not None) == needs[1]
        if needs[0]:
            assert ta.grad.dtype == dtype
            assert_close(ta.grad, expected_a, dtype)
        if needs[1]:
            assert tb.grad.dtype == dtype
            assert_close(tb.grad, expected_b, dtype)


def test_errors():
    with pytest.raises(ValueError, match=r"matmul: cannot multiply \(2, 3\) by \(4, 5\)"):
        mt.ones(2, 3) @ mt.ones(4, 5)
    with pytest.raises(ValueError, match="matmul \\(batch dims\\)"):
        mt.ones(2, 2, 3) @ mt.ones(3, 3, 4)
    with pytest.raises(TypeError, match="matmul: inputs have different dtypes"):
        mt.ones(2, 3) @ mt.ones(3, 2, dtype=mt.float64)


# --------------------------------------------------------------------------------- the kernels directly

# Layouts of a 2-D operand: those the Function hands the kernels (contiguous, a transposed view,
# the rows of a wider array) and some BLAS cannot read as they are (copied by the fast kernel).
LAYOUTS = {
    "contiguous": lambda x: x,
    "transposed view": lambda x: np.ascontiguousarray(x.T).T,
    "row stride": lambda x: np.concatenate([x, x], axis=1)[:, : x.shape[1]],
    "every other column": lambda x: np.repeat(x, 2, axis=1)[:, ::2],
    "rows reversed": lambda x: x[::-1].copy()[::-1],
}
# Shapes (n, k, m): big enough to be split across the threads, small (one call on this thread),
# and thin ones (a row, a column, k = 1); without the JIT (the readable kernels as Python) small only.
SHAPES = [(129, 257, 65), (5, 3, 4), (1, 600, 300), (300, 500, 1), (513, 1, 300)]
SMALL_SHAPES = [(5, 3, 4), (1, 6, 3), (6, 4, 1), (5, 1, 3)]


def kernel_sets_to_call(readable_too=True):
    """(forward, backward) of each set's kernels, called directly (the fast ones only compiled)."""
    sets = [(readable.matmul_forward, readable.matmul_backward)] if readable_too or numba.config.DISABLE_JIT else []
    if not numba.config.DISABLE_JIT:
        blas, fast = fast_kernels()
        assert blas.available()
        sets.append((fast.matmul_forward, fast.matmul_backward))
    return sets


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout_a", list(LAYOUTS))
@pytest.mark.parametrize("layout_b", ["contiguous", "transposed view", "every other column"])
def test_readable_and_fast_kernels_agree_in_every_layout(dtype, layout_a, layout_b):
    """matmul_forward and matmul_backward, readable and fast, called with the same arrays (the
    outputs in these layouts too), each against numpy in float64."""
    for n, k, m in SMALL_SHAPES if numba.config.DISABLE_JIT else SHAPES:
        a = LAYOUTS[layout_a](randn(n, k, seed=n, dtype=dtype))
        b = LAYOUTS[layout_b](randn(k, m, seed=m, dtype=dtype))
        g = LAYOUTS[layout_a](randn(n, m, seed=k, dtype=dtype))
        a64, b64, g64 = (x.astype(np.float64) for x in (a, b, g))
        # Every layout reaches BLAS's own handling of strides in the fast set; the readable loops
        # index any layout alike, and each layout pair is a compilation of its own, so they see two.
        readable_too = layout_a in ("contiguous", "row stride") and layout_b in ("contiguous", "transposed view")
        for forward, backward in kernel_sets_to_call(readable_too):
            c = LAYOUTS[layout_b](np.full((n, m), np.nan, dtype=dtype))
            forward(a, b, c)
            assert_close(c, a64 @ b64, dtype)
            grad_a = LAYOUTS[layout_b](np.full((n, k), np.nan, dtype=dtype))
            grad_b = LAYOUTS[layout_a](np.full((k, m), np.nan, dtype=dtype))
            backward(g, a, b, grad_a, grad_b)
            assert_close(grad_a, g64 @ b64.T, dtype)
            assert_close(grad_b, a64.T @ g64, dtype)
            only_a, only_b = np.full((n, k), np.nan, dtype=dtype), np.full((k, m), np.nan, dtype=dtype)
            backward(g, a, b, only_a, None)
            backward(g, a, b, None, only_b)
            assert_close(only_a, g64 @ b64.T, dtype)
            assert_close(only_b, a64.T @ g64, dtype)


@needs_jit
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_linear_layer_sized_product_forward_and_backward(threads):
    """x (B, T, C) @ W at the GPT recipe's sizes in the fast set, gradients from the formulas
    dx = g Wᵀ and dW = xᵀ g computed by numpy, on 1 to 3 slices of rows."""
    x, w, g = randn(4, 64, 128), randn(128, 384, seed=1), randn(4, 64, 384, seed=2)
    with mt.using_kernels("fast"), mt.num_threads(threads):
        tx, tw = mt.tensor(x, requires_grad=True), mt.tensor(w, requires_grad=True)
        out = tx @ tw
        out.backward(g)
    np.testing.assert_allclose(out.numpy(), x @ w, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tx.grad, g @ w.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tw.grad, x.reshape(-1, 128).T @ g.reshape(-1, 384), rtol=1e-12, atol=1e-11)


@needs_jit
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["contiguous", "transposed view"])
def test_backward_in_bands_of_rows(dtype, layout):
    """backward_in_bands: each band's rows of dA = g Bᵀ and each band's part of dB = Aᵀ g, the
    parts added, for 2 to 4 bands (more bands than threads too), with and without dA, each as numpy
    gives it in float64; and the fast matmul_backward takes this path, a band per thread of the pool."""
    blas, fast = fast_kernels()
    assert blas.available()
    n, k, m = fast.MIN_ROWS_PER_BAND * max(2, numba.config.NUMBA_NUM_THREADS) + 1, 48, 80  # a band per thread
    a = LAYOUTS[layout](randn(n, k, seed=1, dtype=dtype))
    b = LAYOUTS[layout](randn(k, m, seed=2, dtype=dtype))
    g = LAYOUTS[layout](randn(n, m, seed=3, dtype=dtype))
    a64, b64, g64 = (x.astype(np.float64) for x in (a, b, g))
    for bands in (2, 3, 4):
        for with_grad_a in (True, False):
            grad_a = np.full((n, k), np.nan, dtype=dtype) if with_grad_a else None
            grad_b = np.full((k, m), np.nan, dtype=dtype)
            assert fast.backward_in_bands(g, a, b, grad_a, grad_b, bands)
            assert_close(grad_b, a64.T @ g64, dtype)
            if with_grad_a:
                assert_close(grad_a, g64 @ b64.T, dtype)
    # an output BLAS cannot write row by row: nothing is done, and the caller multiplies as before
    assert not fast.backward_in_bands(g, a, b, None, np.empty((m, k), dtype=dtype).T, 2)
    if numba.config.NUMBA_NUM_THREADS >= 2:
        taken = []
        original = fast.backward_in_bands

        def watched(*args):
            taken.append(original(*args))
            return taken[-1]

        fast.backward_in_bands = watched
        try:
            grad_a, grad_b = np.empty((n, k), dtype=dtype), np.empty((k, m), dtype=dtype)
            fast.matmul_backward(g, a, b, grad_a, grad_b)
        finally:
            fast.backward_in_bands = original
        assert taken == [True]
        assert_close(grad_a, g64 @ b64.T, dtype)
        assert_close(grad_b, a64.T @ g64, dtype)


@needs_jit
def test_products_computed_together():
    """blas.multiply_into: a large and a small product, transposed views among them, an output
    BLAS cannot write as it lies (every other column), each as numpy gives it."""
    blas, _ = fast_kernels()
    assert blas.available()
    g, w, x = randn(300, 200), randn(100, 200, seed=1), randn(300, 100, seed=2)
    small_a, small_b = randn(3, 4, seed=3), randn(4, 5, seed=4)
    for first, second in [((g, w.T), (x.T, g)), ((g, w.T), (small_a, small_b)), ((small_a, small_b), (x.T, g))]:
        outputs = [np.full((a.shape[0], b.shape[1]), np.nan) for a, b in (first, second)]
        outputs[1] = np.full((outputs[1].shape[0], 2 * outputs[1].shape[1]), np.nan)[:, ::2]
        blas.multiply_into(first + (outputs[0],), second + (outputs[1],))
        for (a, b), c in zip((first, second), outputs):
            np.testing.assert_allclose(c, a @ b, rtol=1e-12, atol=1e-12)


@needs_jit
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batched_jobs_on_strided_views(dtype):
    """The (B, H) products of attention's fast kernels, on the views they are given (heads of one
    (B, T, 3C) array, transposes, an output that is the heads of a (B, T, C) array), against numpy."""
    blas, _ = fast_kernels()
    assert blas.available()
    B, H, T, D = 3, 2, 5, 4
    qkv = randn(B, T, 3 * H * D, dtype=dtype)
    q, k, v = qkv.reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)  # (B, H, T, D) views
    double = dtype == np.float64
    scores = np.empty((B, H, T, T), dtype=dtype)
    blas.gemm_in_parallel(double, blas.batched_jobs(q, np.swapaxes(k, -1, -2), scores))
    heads_out = np.zeros((B, T, H * D), dtype=dtype)
    heads = heads_out.reshape(B, T, H, D).transpose(0, 2, 1, 3)  # (B, H, T, D), a view of heads_out
    blas.gemm_in_parallel(double, blas.batched_jobs(np.swapaxes(scores, -1, -2), v, heads))
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    expected_scores = np.einsum("bhid,bhjd->bhij", q64, k64)
    expected_out = np.einsum("bhji,bhjd->bhid", scores.astype(np.float64), v64).transpose(0, 2, 1, 3).reshape(B, T, H * D)
    assert_close(scores, expected_scores, dtype)
    assert_close(heads_out, expected_out, dtype)


# --------------------------------------------------------------------------------- without BLAS


@needs_jit
def test_fast_kernels_without_blas_use_numpys_product(monkeypatch):
    """Where numpy's BLAS cannot be called from compiled code, the fast twins call np.matmul: the
    products are right, and no BLAS job is run."""
    blas, fast = fast_kernels()

    def no_jobs(*args):
        raise AssertionError("a BLAS job ran although BLAS is not available")

    monkeypatch.setattr(blas, "available", lambda: False)
    monkeypatch.setattr(blas, "gemm_in_parallel", no_jobs)
    a, b, g = randn(300, 200), randn(200, 100, seed=1).T.copy().T, randn(300, 100, seed=2)
    c = np.empty((300, 100))
    fast.matmul_forward(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-12, atol=1e-12)
    grad_a, grad_b = np.empty((300, 200)), np.empty((200, 100))
    fast.matmul_backward(g, a, b, grad_a, grad_b)
    np.testing.assert_allclose(grad_a, g @ b.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grad_b, a.T @ g, rtol=1e-12, atol=1e-12)
    with mt.using_kernels("fast"):
        tx = mt.tensor(randn(2, 150, 200), requires_grad=True)
        out = tx @ mt.tensor(b)
        out.backward(np.ones(out.shape))
    np.testing.assert_allclose(out.numpy(), tx.data @ b, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tx.grad, np.ones((2, 150, 100)) @ b.T, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------------- process state

THREAD_COUNT_SCRIPT = r"""
import ctypes, glob, os, sys
import numpy as np

# numpy's OpenBLAS, found here independently of microtensor
here = os.path.dirname(np.__file__)
library = None
for path in sorted(glob.glob(os.path.join(here, "../numpy.libs/*openblas*")) + glob.glob(os.path.join(here, ".dylibs/*openblas*"))):
    candidate = ctypes.CDLL(path)
    for prefix, suffix in (("scipy_openblas", "64_"), ("openblas", "64_"), ("openblas", "")):
        if hasattr(candidate, f"{prefix}_get_num_threads{suffix}"):
            library = candidate
            get_threads = getattr(candidate, f"{prefix}_get_num_threads{suffix}")
            set_threads = getattr(candidate, f"{prefix}_set_num_threads{suffix}")
            break
    if library is not None:
        break
if library is None:
    print("no-openblas")
    sys.exit(0)
set_threads.argtypes = [ctypes.c_int]
set_threads(3)  # a count nobody would choose by default: a reset to any default shows
counts = [get_threads()]

import microtensor as mt
import microtensor.functional as F
from microtensor.ops.attention import attention_reference
counts.append(get_threads())

rng = np.random.default_rng(0)
with mt.using_kernels("fast"):
    a, b = rng.standard_normal((300, 400)), rng.standard_normal((400, 200))
    ta, tb = mt.tensor(a, requires_grad=True), mt.tensor(b, requires_grad=True)
    c = ta @ tb
    c.backward(np.ones(c.shape))
    counts.append(get_threads())
    q, k, v = (mt.tensor(rng.standard_normal((2, 3, 16, 8)), requires_grad=True) for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v)
    counts.append(get_threads())
    out.backward(np.ones(out.shape))
    counts.append(get_threads())
errors = [
    np.abs(c.numpy() - a @ b).max(),
    np.abs(ta.grad - np.ones((300, 200)) @ b.T).max(),
    np.abs(tb.grad - a.T @ np.ones((300, 200))).max(),
    np.abs(out.numpy() - attention_reference(q.data, k.data, v.data)).max(),
]
from microtensor.fast import blas
print(blas.library(), " ".join(map(str, counts)), max(errors))
"""


@needs_jit
@pytest.mark.parametrize("library", ["OpenBLAS", "MKL"])
def test_numpys_blas_thread_count_is_left_alone(library):
    """numpy's OpenBLAS thread count, read through OpenBLAS itself, is the same before importing
    microtensor, after, and after a fast matmul (forward and backward) and a fast attention
    (forward, backward), whose results are right; with the kernels calling each BLAS in turn
    (MICROTENSOR_BLAS). In a fresh process, so that "before" is before."""
    blas, _ = fast_kernels()
    if library == "MKL" and blas.find_mkl() is None:
        pytest.skip("MKL is not installed here")
    environment = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    environment["MICROTENSOR_BLAS"] = library.lower()
    result = subprocess.run([sys.executable, "-c", THREAD_COUNT_SCRIPT], env=environment, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    if result.stdout.strip() == "no-openblas":
        pytest.skip("numpy is not linked to an OpenBLAS here")
    called, *counts, error = result.stdout.split()
    assert called == library
    assert counts == ["3"] * 5, f"OpenBLAS thread counts before import, after import, after matmul, attention forward, backward: {counts}"
    assert float(error) < 1e-10


# --------------------------------------------------------------------------------- which BLAS


def test_mkl_is_chosen_only_when_clearly_faster():
    """The choice between the installed libraries, from their measured seconds: MKL where it beats
    OpenBLAS by more than the margin, OpenBLAS in a closer race, and wherever MKL is missing."""
    blas, _ = fast_kernels()
    assert blas.faster_library({"OpenBLAS": 1.0, "MKL": 0.8}) == "MKL"
    assert blas.faster_library({"OpenBLAS": 1.0, "MKL": 0.97}) == "OpenBLAS"
    assert blas.faster_library({"OpenBLAS": 1.0, "MKL": 1.3}) == "OpenBLAS"
    assert blas.faster_library({"OpenBLAS": 1.0}) == "OpenBLAS"


@needs_jit
def test_the_measured_choice_is_kept_and_remeasured_for_another_machine(tmp_path, monkeypatch):
    """choose_library measures once, writes its choice beside the compiled kernels, reads it back
    instead of measuring again, and measures again when what it was kept for (the key) differs."""
    blas, _ = fast_kernels()
    if blas.OPENBLAS is None:
        pytest.skip("numpy is not linked to an OpenBLAS here")
    monkeypatch.delenv("MICROTENSOR_BLAS", raising=False)
    monkeypatch.setattr(blas, "choice_file", lambda: tmp_path / "blas-choice.json")
    monkeypatch.setattr(blas, "find_mkl", lambda: ({"microtensor_cblas_sgemm": 1, "microtensor_cblas_dgemm": 2}, blas.__file__))
    measured = []
    monkeypatch.setattr(blas, "measure_libraries", lambda candidates: measured.append(sorted(candidates)) or {"OpenBLAS": 2.0, "MKL": 1.0})
    assert blas.choose_library()[0] == "MKL" and measured == [["MKL", "OpenBLAS"]]
    assert blas.choose_library() == ("MKL", {"microtensor_cblas_sgemm": 1, "microtensor_cblas_dgemm": 2})
    assert len(measured) == 1  # read back, not measured again
    kept = (tmp_path / "blas-choice.json").read_text()
    (tmp_path / "blas-choice.json").write_text(kept.replace('"cpu": "', '"cpu": "another '))
    monkeypatch.setattr(blas, "measure_libraries", lambda candidates: measured.append(sorted(candidates)) or {"OpenBLAS": 1.0, "MKL": 1.0})
    assert blas.choose_library()[0] == "OpenBLAS" and len(measured) == 2


@needs_jit
@pytest.mark.parametrize("asked", ["atlas", "", "mkl"])
def test_an_unknown_or_missing_blas_is_refused_by_name(asked, monkeypatch):
    """MICROTENSOR_BLAS names a library that is not installed here: an error that names the variable,
    what it was given and what it may be."""
    blas, _ = fast_kernels()
    if blas.OPENBLAS is None:
        pytest.skip("numpy is not linked to an OpenBLAS here")
    monkeypatch.setattr(blas, "find_mkl", lambda: None)
    monkeypatch.setenv("MICROTENSOR_BLAS", asked)
    with pytest.raises(mt.MicrotensorError, match=f"MICROTENSOR_BLAS: '{asked}' is not a BLAS installed here; expected openblas$"):
        blas.choose_library()
