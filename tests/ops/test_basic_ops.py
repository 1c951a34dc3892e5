"""Forward values of the basic ops: identities that hold without any reference library, and
PyTorch in float64 when it is installed (skipped otherwise)."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import microtensor as mt
import microtensor.functional as F


def values(shape, low=-2.0, high=2.0, seed=0):
    return np.random.default_rng(seed).uniform(low, high, shape)


def test_identities():
    x = mt.tensor(values((3, 4), 0.1, 2.0))
    close = np.testing.assert_allclose
    close(F.log(F.exp(x)).numpy(), x.numpy(), rtol=1e-12)
    close((F.sqrt(x) * F.sqrt(x)).numpy(), x.numpy(), rtol=1e-12)
    close(F.tanh(x).numpy(), (2 * F.sigmoid(2 * x) - 1).numpy(), rtol=1e-12)
    close((x / x).numpy(), np.ones((3, 4)))
    close((x - x).numpy(), np.zeros((3, 4)))
    close((x**2.0).numpy(), (x * x).numpy(), rtol=1e-12)
    close((-x).numpy() + x.numpy(), np.zeros((3, 4)))
    close(F.relu(x - 1.0).numpy() - F.relu(1.0 - x).numpy(), (x - 1.0).numpy(), atol=1e-12)
    close(x.mean(dim=1).numpy() * 4, x.sum(dim=1).numpy(), rtol=1e-12)


def test_sums_by_plain_loops():
    x = values((2, 3, 4))
    expected = np.zeros((2, 4))
    for i in range(2):
        for j in range(3):
            for k in range(4):
                expected[i, k] += x[i, j, k]
    np.testing.assert_allclose(mt.tensor(x).sum(dim=1).numpy(), expected)
    assert mt.tensor(x).sum(dim=(0, 2), keepdim=True).shape == (1, 3, 1)


def test_sigmoid_is_stable_at_large_inputs():
    x = mt.tensor(np.array([-1e4, -50.0, 0.0, 50.0, 1e4], dtype=np.float32))
    y = F.sigmoid(x).numpy()
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y, [0.0, 1.9287e-22, 0.5, 1.0, 1.0], rtol=1e-4)


TORCH_UNARY = [
    ("exp", F.exp, "exp", (-3, 3)),
    ("log", F.log, "log", (0.1, 3)),
    ("sqrt", F.sqrt, "sqrt", (0.1, 3)),
    ("tanh", F.tanh, "tanh", (-3, 3)),
    ("relu", F.relu, "relu", (-3, 3)),
    ("sigmoid", F.sigmoid, "sigmoid", (-8, 8)),
    ("neg", F.neg, "neg", (-3, 3)),
]


@pytest.mark.parametrize("name, ours, theirs, value_range", TORCH_UNARY, ids=[row[0] for row in TORCH_UNARY])
def test_unary_against_torch(name, ours, theirs, value_range):
    torch = pytest.importorskip("torch")
    x = values((4, 5), *value_range)
    np.testing.assert_allclose(ours(mt.tensor(x)).numpy(), getattr(torch, theirs)(torch.tensor(x)).numpy(), rtol=1e-12, atol=1e-15)


@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), seed=st.integers(0, 1000))
def test_binary_broadcasting_against_torch(shape, seed):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    other = [1 if rng.random() < 0.4 else n for n in shape][rng.integers(0, len(shape)) :]
    a, b = values(shape, 0.5, 2, seed), values(other, 0.5, 2, seed + 1)
    ta, tb = torch.tensor(a), torch.tensor(b)
    for ours, theirs in [(F.add, torch.add), (F.sub, torch.sub), (F.mul, torch.mul), (F.div, torch.div), (F.pow, torch.pow)]:
        np.testing.assert_allclose(ours(mt.tensor(a), mt.tensor(b)).numpy(), theirs(ta, tb).numpy(), rtol=1e-12)


def test_reductions_and_shapes_against_torch():
    torch = pytest.importorskip("torch")
    x = values((2, 3, 4))
    t = torch.tensor(x)
    ours = mt.tensor(x)
    close = np.testing.assert_allclose
    close(ours.sum(dim=(0, 2)).numpy(), t.sum(dim=(0, 2)).numpy())
    close(ours.mean(dim=-1, keepdim=True).numpy(), t.mean(dim=-1, keepdim=True).numpy())
    close(ours.max(dim=1).numpy(), t.amax(dim=1).numpy())
    close(ours.max().numpy(), t.max().numpy())
    close(ours.permute(2, 0, 1).numpy(), t.permute(2, 0, 1).numpy())
    close(ours[1, ::-1, 1:3].numpy(), t[1, :, 1:3].flip(0).numpy())
    close(mt.concat([ours, ours], dim=1).numpy(), torch.cat([t, t], dim=1).numpy())
    close(mt.stack([ours, ours], dim=-1).numpy(), torch.stack([t, t], dim=-1).numpy())
    mask = x > 0
    close(ours.masked_fill(mask, 7.0).numpy(), t.masked_fill(torch.tensor(mask), 7.0).numpy())
    close(mt.where(mask, ours, -ours).numpy(), torch.where(torch.tensor(mask), t, -t).numpy())


def test_basic_op_gradients_against_torch():
    torch = pytest.importorskip("torch")
    x = values((3, 4), 0.2, 2.0)
    ours = mt.tensor(x, requires_grad=True)
    theirs = torch.tensor(x, requires_grad=True)
    upstream = values((3,), seed=5)

    def f(lib_x, lib):
        y = (lib_x.exp() * lib_x).sqrt() / (lib_x + 1.0) - lib_x.log().tanh()
        return y.sum(dim=1) if lib is mt else y.sum(dim=1)

    f(ours, mt).backward(upstream)
    f(theirs, torch).backward(torch.tensor(upstream))
    np.testing.assert_allclose(ours.grad, theirs.grad.numpy(), rtol=1e-12)


def test_pow_gradient_is_zero_where_the_formulas_multiply_zero_by_infinity():
    # d(a^0)/da = 0 everywhere, a = 0 included; d(0^b)/db = 0 for b >= 0 (PyTorch's value too).
    a = mt.tensor([0.0, 1.0, 2.0], dtype=mt.float64, requires_grad=True)
    (a**0).sum().backward()
    np.testing.assert_array_equal(a.grad, [0.0, 0.0, 0.0])
    a = mt.tensor([0.0, 0.0, 2.0], dtype=mt.float64, requires_grad=True)
    b = mt.tensor([2.0, 0.0, 3.0], dtype=mt.float64, requires_grad=True)
    (a**b).sum().backward()
    np.testing.assert_allclose(a.grad, [0.0, 0.0, 3 * 2.0**2])
    np.testing.assert_allclose(b.grad, [0.0, 0.0, 2.0**3 * np.log(2.0)])
