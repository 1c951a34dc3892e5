"""RMSNorm (microtensor/ops/electives/rms_norm.py): forward by plain loops, and the readable and fast kernels
against each other. The checks it shares with the other fused ops (float32 against float64,
PyTorch, the errors) are in tests/ops/test_fused_ops.py. Tests taking `kernel_set` run once with
each kernel set."""
import math

import numpy as np
import pytest

import microtensor as mt
import microtensor.functional as F
from microtensor.ops.electives import rms_norm
from microtensor.ops.electives.rms_norm import rms_norm_reference
from helpers import AGREE, kernel_pair, norm_problem, randn


def test_rms_norm_by_plain_loops(kernel_set):
    x, w = randn(3, 5), randn(5, seed=1)
    expected = np.array([x[n] / math.sqrt(sum(x[n] ** 2) / 5 + 1e-5) * w for n in range(3)])
    np.testing.assert_allclose(F.rms_norm(mt.tensor(x), mt.tensor(w)).numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(rms_norm_reference(x, w), expected, rtol=1e-12)


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
