"""The selective state-space model: the scan (microtensor/ops/electives/selective_scan.py) by plain
loops and against its numpy reference, readable and fast kernels against each other, its errors;
and the SSM block (gpt/model/electives/ssm.py): generation's recurrence against the full-sequence
forward, the flags it refuses, checkpoints. Tests taking `kernel_set` run once with each kernel set.
Its gradcheck and JVP cases run with every op's (tests/test_gradcheck_cases.py, test_forward_mode.py)."""
import math

import numpy as np
import pytest

import microtensor as mt
import microtensor.functional as F
from microtensor import InputError, InputTypeError
from microtensor.ops.electives import selective_scan
from microtensor.ops.electives.selective_scan import selective_scan_reference
from helpers import AGREE, kernel_pair, randn


def scan_problem(dtype=np.float64, batch=2, T=6, channels=5, N=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, T, channels))
    delta = rng.uniform(0.05, 1.5, (batch, T, channels))
    A = -rng.uniform(0.2, 2.0, (channels, N))
    B, C = rng.standard_normal((batch, T, N)), rng.standard_normal((batch, T, N))
    D = rng.standard_normal(channels)
    return [a.astype(dtype) for a in (x, delta, A, B, C, D)]


def test_scan_by_plain_loops(kernel_set):
    """One channel's recurrence written out with Python floats: h = e^{ΔA} h + Δ B x; y = C·h + D x."""
    x, delta, A, B, C, D = scan_problem()
    y = F.selective_scan(*map(mt.tensor, (x, delta, A, B, C, D))).numpy()
    for b in range(2):
        for d in range(5):
            h = [0.0] * 3
            for t in range(6):
                h = [math.exp(delta[b, t, d] * A[d, n]) * h[n] + delta[b, t, d] * B[b, t, n] * x[b, t, d] for n in range(3)]
                expected = sum(C[b, t, n] * h[n] for n in range(3)) + D[d] * x[b, t, d]
                assert y[b, t, d] == pytest.approx(expected, rel=1e-12, abs=1e-12)
    np.testing.assert_allclose(selective_scan_reference(x, delta, A, B, C, D)[0], y, rtol=1e-12, atol=1e-12)


def test_scan_in_pieces_equals_the_whole(kernel_set):
    """`state` carries h from one call to the next: a sequence scanned 1, 2 and 3 steps at a time
    gives the whole scan's outputs and leaves its last state."""
    x, delta, A, B, C, D = scan_problem()
    whole = F.selective_scan(*map(mt.tensor, (x, delta, A, B, C, D))).numpy()
    state, pieces = np.zeros((2, 5, 3)), []
    for start, stop in ((0, 1), (1, 3), (3, 6)):
        part = [mt.tensor(a[:, start:stop]) for a in (x, delta, B, C)]
        pieces.append(F.selective_scan(part[0], part[1], mt.tensor(A), part[2], part[3], mt.tensor(D), state=state).numpy())
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), whole, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(state, selective_scan_reference(x, delta, A, B, C, D)[1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_scan_kernels_readable_and_fast_agree(dtype):
    x, delta, A, B, C, D = scan_problem(dtype, batch=3, T=9, channels=7, N=4)
    h0 = randn(3, 7, 4, seed=3, dtype=dtype)
    outputs = []
    for forward in kernel_pair(selective_scan.selective_scan_forward):
        y, states = np.empty_like(x), np.empty((3, 9, 7, 4), dtype)
        forward(x, delta, A, B, C, D, h0, y, states)
        outputs.append((y, states))
    for name, readable, fast in zip(("y", "states"), *outputs):
        np.testing.assert_allclose(fast, readable, **AGREE[dtype], err_msg=name)
    assert outputs[1][0].dtype == dtype
    _, states = outputs[0]
    g = randn(3, 9, 7, seed=4, dtype=dtype)
    grads = []
    for backward in kernel_pair(selective_scan.selective_scan_backward):
        out = [np.full_like(a, np.nan) for a in (x, delta, A, B, C, D)]  # every number must be written
        backward(g, x, delta, A, B, C, D, h0, states, *out, np.empty(4, dtype))
        grads.append(out)
    for name, readable, fast in zip(("x", "delta", "A", "B", "C", "D"), *grads):
        np.testing.assert_allclose(fast, readable, **AGREE[dtype], err_msg=f"grad_{name}")
        assert fast.dtype == dtype


def test_scan_float32_against_float64(kernel_set):
    values = scan_problem(np.float64)
    y64 = F.selective_scan(*map(mt.tensor, values)).numpy()
    y32 = F.selective_scan(*(mt.tensor(v.astype(np.float32)) for v in values))
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32.numpy(), y64, rtol=1e-5, atol=1e-5)


def test_scan_errors_name_the_argument():
    x, delta, A, B, C, D = map(mt.tensor, scan_problem())
    with pytest.raises(InputError, match=r"selective_scan: x must be 3-d"):
        F.selective_scan(x[0], delta, A, B, C)
    with pytest.raises(InputError, match=r"selective_scan: A must be \(Dc, N\) = \(5, N\).*got shape \(4, 3\)"):
        F.selective_scan(x, delta, mt.tensor(np.zeros((4, 3))), B, C)
    with pytest.raises(InputError, match=r"selective_scan: B must have shape \(2, 6, 3\).*got \(2, 6, 2\)"):
        F.selective_scan(x, delta, A, B[:, :, :2], C)
    with pytest.raises(InputError, match=r"selective_scan: D must have shape \(5,\)"):
        F.selective_scan(x, delta, A, B, C, D[:3])
    with pytest.raises(InputError, match=r"selective_scan: state must be a float64 array of shape \(2, 5, 3\)"):
        F.selective_scan(x, delta, A, B, C, D, state=np.zeros((2, 5, 4)))
    with pytest.raises(InputTypeError, match=r"selective_scan: state must be None or a numpy array"):
        F.selective_scan(x, delta, A, B, C, D, state=[0.0])
    with pytest.raises(InputTypeError, match=r"selective_scan: delta must be a Tensor"):
        F.selective_scan(x, delta.numpy(), A, B, C)
    with pytest.raises(InputTypeError, match=r"selective_scan: inputs have different dtypes"):
        F.selective_scan(x, delta.to(mt.float32), A, B, C)
