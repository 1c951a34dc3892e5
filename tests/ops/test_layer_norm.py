"""LayerNorm (microtensor/ops/layer_norm.py): forward by plain loops, and the readable and fast
kernels against each other. The checks it shares with the other fused ops (float32 against float64,
PyTorch, the errors) are in test_fused_ops.py. Tests taking `kernel_set` run once with each kernel
set."""
import math

import numpy as np
import pytest

import microtensor as mt
import microtensor.functional as F
from microtensor.ops import layer_norm
from microtensor.ops.layer_norm import layer_norm_reference
from helpers import AGREE, assert_close, kernel_pair, needs_jit, norm_problem, randn


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


@pytest.mark.parametrize("shared", [False, True], ids=["one_thread", "rows_shared"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_layer_norm_kernels_readable_and_fast_agree(dtype, shared, monkeypatch):
    kernel_pair(layer_norm.layer_norm_forward)  # skips without the JIT
    from microtensor.fast import layer_norm as fast_layer_norm
    from microtensor.fast import memory

    # the fast twins' two compilations of each loop: the rows shared among the threads, or not
    monkeypatch.setattr(memory, "MIN_ELEMENTS_PER_THREAD", 0 if shared else 10**12)
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


@needs_jit
def test_the_fast_twins_share_the_rows_from_a_page_per_thread(monkeypatch):
    """At the default recipe's size (B 12 × T 64 rows of 128) a LayerNorm's rows are shared among
    the threads; one row (a generated token's) runs on the calling thread, its loops compiled without
    threads."""
    import numba

    from microtensor.fast import layer_norm as fast_layer_norm
    from microtensor.fast import memory

    ran = []
    for name in ("layer_norm_forward_in_parallel", "layer_norm_forward_serial",
                 "layer_norm_backward_input_in_parallel", "layer_norm_backward_input_serial"):  # fmt: skip
        monkeypatch.setattr(fast_layer_norm, name, lambda *args, name=name: ran.append(name))
    assert 128 < memory.MIN_ELEMENTS_PER_THREAD * numba.get_num_threads() <= 12 * 64 * 128
    for rows in (12 * 64, 1):
        x = np.zeros((rows, 128), np.float32)
        fast_layer_norm.layer_norm_forward(x, None, None, 1e-5, None, None, None)
        fast_layer_norm.layer_norm_backward_input(x, x, None, None, None, None)
    assert ran == ["layer_norm_forward_in_parallel", "layer_norm_backward_input_in_parallel",
                   "layer_norm_forward_serial", "layer_norm_backward_input_serial"]  # fmt: skip
