"""cross_entropy: forward against plain loops and PyTorch (float64), the gradient against its formula
and PyTorch, ignore_index, float32, stability, layouts, the readable and fast kernels against each
other, and the errors. Tests taking `kernel_set` run once with each kernel set."""
import math

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from microtensor.gradcheck import GradcheckError, gradcheck
from microtensor.ops import cross_entropy as ce
from microtensor.ops import softmax as sm
from microtensor.ops.cross_entropy import CrossEntropy, cross_entropy
from microtensor.tensor import Tensor
from helpers import JIT_DISABLED, fast_twin_of



def loss_by_loops(logits, targets, ignore_index=-100):
    """Mean of -log(e^x_t / sum_v e^x_v) over non-ignored rows, by plain loops with math.fsum."""
    logits = logits.reshape(-1, logits.shape[-1])
    losses = []
    for row, target in zip(logits, targets.reshape(-1)):
        if target == ignore_index:
            continue
        m = max(row)
        log_total = math.log(math.fsum(math.exp(v - m) for v in row))
        losses.append(m + log_total - row[target])
    return math.fsum(losses) / len(losses)


def gradient_by_formula(logits, targets, ignore_index=-100, grad_out=1.0):
    """(softmax - onehot) / N_valid * grad_out on valid rows, 0 on ignored rows."""
    flat = logits.reshape(-1, logits.shape[-1])
    flat_targets = targets.reshape(-1)
    valid = flat_targets != ignore_index
    grad = sm.softmax_reference(flat, -1)
    grad[np.arange(len(flat)), np.where(valid, flat_targets, 0)] -= 1
    grad[~valid] = 0
    return (grad * grad_out / valid.sum()).reshape(logits.shape)


def random_problem(rng, rows_shape, vocab_size, ignored_fraction=0.0, ignore_index=-100, scale=3.0):
    logits = rng.standard_normal(rows_shape + (vocab_size,)) * scale
    targets = rng.integers(0, vocab_size, rows_shape)
    if ignore_index is not None:
        ignored = rng.random(rows_shape) < ignored_fraction
        ignored.reshape(-1)[0] = False  # at least one valid position
        targets[ignored] = ignore_index
    return logits, targets


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # one kernel set for all examples
@given(
    three_dims=st.booleans(),
    sizes=st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 6)),
    ignored_fraction=st.sampled_from([0.0, 0.4]),
    seed=st.integers(0, 2**32 - 1),
)
def test_forward_and_gradient_against_loops_and_formula(three_dims, sizes, ignored_fraction, seed, kernel_set):
    rng = np.random.default_rng(seed)
    b, t, v = sizes
    logits, targets = random_problem(rng, (b, t) if three_dims else (b * t,), v, ignored_fraction)
    if rng.random() < 0.5:  # a transposed (non-contiguous) layout of the same values
        logits = np.ascontiguousarray(np.swapaxes(logits, 0, -1)).swapaxes(0, -1)
    x = Tensor(logits, requires_grad=True)
    loss = cross_entropy(x, Tensor(targets))
    assert loss.shape == () and loss.dtype == np.float64
    # atol: a loss near 0 is log(1 + tiny), whose rounding error is absolute (~1e-16), not relative
    np.testing.assert_allclose(loss.item(), loss_by_loops(logits, targets), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(loss.item(), ce.cross_entropy_reference(logits, targets), rtol=1e-13, atol=1e-15)
    loss.backward(np.array(2.5))
    np.testing.assert_allclose(x.grad, gradient_by_formula(logits, targets, grad_out=2.5), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(x.grad.sum(axis=-1), 0.0, atol=1e-13)  # every gradient row sums to 0


@settings(max_examples=10, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    three_dims=st.booleans(),
    sizes=st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 6)),
    ignore_index=st.sampled_from([None, -100, 0, 2]),
    seed=st.integers(0, 2**32 - 1),
)
def test_against_torch_float64(three_dims, sizes, ignore_index, seed, kernel_set):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    b, t, v = sizes
    v = max(v, 2) if ignore_index is not None and ignore_index >= 0 else v
    rows_shape = (b, t) if three_dims else (b * t,)
    logits, targets = random_problem(rng, rows_shape, v, 0.0 if ignore_index is None else 0.4, ignore_index)
    if ignore_index is not None and ignore_index >= 0 and np.all((targets == ignore_index) | (targets >= v)):
        targets.reshape(-1)[0] = (ignore_index + 1) % v  # keep one valid position
    x = Tensor(logits, requires_grad=True)
    loss = cross_entropy(x, Tensor(targets), ignore_index=ignore_index)
    loss.backward()
    tx = torch.tensor(logits, requires_grad=True)
    their_ignore_index = -100 if ignore_index is None else ignore_index  # no target is -100 when None
    theirs = torch.nn.functional.cross_entropy(
        tx.reshape(-1, v), torch.tensor(targets).reshape(-1), ignore_index=their_ignore_index
    )
    theirs.backward()
    np.testing.assert_allclose(loss.item(), theirs.item(), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_float32_stays_float32_and_matches_float64(kernel_set):
    rng = np.random.default_rng(1)
    logits, targets = random_problem(rng, (4, 16), 65, ignored_fraction=0.2)
    x32 = Tensor(logits.astype(np.float32), requires_grad=True)
    loss32 = cross_entropy(x32, Tensor(targets))
    loss32.backward()
    assert loss32.dtype == np.float32 and x32.grad.dtype == np.float32
    x64 = Tensor(logits.astype(np.float32).astype(np.float64), requires_grad=True)  # the same inputs, in float64
    loss64 = cross_entropy(x64, Tensor(targets))
    loss64.backward()
    # loss ~ 5: a handful of float32 roundings (~6e-8 each) in exp, the sums, log and the mean.
    np.testing.assert_allclose(loss32.item(), loss64.item(), rtol=1e-6)
    np.testing.assert_allclose(x32.grad, x64.grad, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("kernel_set_name", ["readable", "fast"])
def test_kernels_do_their_arithmetic_in_the_input_dtype(kernel_set_name):
    """No float64 arithmetic in the float32 versions of the kernels (see test_softmax.py)."""
    if JIT_DISABLED:
        pytest.skip("needs numba's type inference")
    logits = np.ones((2, 3), np.float32)
    targets = np.array([0, 2], np.int64)
    calls = [
        (ce.cross_entropy_forward, (logits, targets, -100, np.ones(2, np.float32), logits.copy(), np.ones(2, np.float32))),
        (ce.cross_entropy_backward, (logits, np.ones(2, np.float32), targets, -100, np.float32(0.5), logits.copy())),
    ]
    for readable, args in calls:
        kernel = readable if kernel_set_name == "readable" else fast_twin_of(readable)
        fresh = numba.njit(kernel.py_func)
        fresh(*args)
        typemap = fresh.overloads[fresh.signatures[0]].type_annotation.typemap
        float64_names = [
            name
            for name, typ in typemap.items()
            if typ == numba.float64 and (not name.startswith("$") or name.startswith("$binop"))
        ]
        where = f"{kernel_set_name} {kernel.__name__}"
        assert not float64_names, f"{where}: float64 arithmetic in the float32 version: {float64_names}"


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-13), (np.float32, 4e-6)])
def test_readable_and_fast_kernels_agree(dtype, rtol):
    """Called directly on the same problem, the fast kernels write what the readable ones write: the
    losses, the exponentials and 1/s that forward saves, and the gradient (rtol: a few ulp of the
    dtype, for sums taken in another order and the last bits of e^t)."""
    rng = np.random.default_rng(0)
    logits, targets = random_problem(rng, (300,), 65, ignored_fraction=0.2)
    logits[7] += 1e3  # far from 0: the max shift must cancel
    logits[8, 5] = 40.0  # one dominant logit: the other probabilities are ~e^-40
    logits = logits.astype(dtype)
    eps = np.finfo(dtype).eps
    results = {}
    for name, forward in (("readable", ce.cross_entropy_forward), ("fast", fast_twin_of(ce.cross_entropy_forward))):
        row_loss, inverse_total, exps = np.empty(300, dtype), np.empty(300, dtype), np.empty_like(logits)
        forward(logits, targets, -100, row_loss, exps, inverse_total)
        results[name] = (row_loss, exps, inverse_total)
    for what, readable, fast in zip(("row_loss", "exps", "inverse_total"), results["readable"], results["fast"]):
        # a loss near 0 is (m - x_t) + log s with s ~ 1: its rounding error is absolute, ~eps
        np.testing.assert_allclose(fast, readable, rtol=rtol, atol=4 * eps if what == "row_loss" else 0, err_msg=what)
    _, exps, inverse_total = results["readable"]
    scale = dtype(2.5 / 240)
    readable_grad, fast_grad = np.empty_like(logits), np.empty_like(logits)
    ce.cross_entropy_backward(exps, inverse_total, targets, -100, scale, readable_grad)
    fast_twin_of(ce.cross_entropy_backward)(exps, inverse_total, targets, -100, scale, fast_grad)
    np.testing.assert_allclose(fast_grad, readable_grad, rtol=rtol, atol=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stable_at_large_logits(dtype, kernel_set):
    logits = np.array([[1e4, -1e4, 0.0], [1e4, -1e4, 0.0], [-1e4, -1e4, -1e4]], dtype=dtype)
    x = Tensor(logits, requires_grad=True)
    loss = cross_entropy(x, Tensor(np.array([0, 1, 2])))
    # per row: 0, 2e4 and log 3
    np.testing.assert_allclose(loss.item(), (0 + 2e4 + math.log(3)) / 3, rtol=1e-6)
    loss.backward()
    assert np.all(np.isfinite(x.grad))
    np.testing.assert_allclose(x.grad, [[0, 0, 0], [1 / 3, -1 / 3, 0], [1 / 9, 1 / 9, -2 / 9]], atol=1e-7)


def test_edge_shapes_and_target_types(kernel_set):
    x = Tensor(np.array([[0.7], [-3.0]]), requires_grad=True)  # one class: the loss and gradient are 0
    loss = cross_entropy(x, Tensor(np.array([0, 0])))
    loss.backward()
    assert loss.item() == 0.0 and np.all(x.grad == 0)
    logits = np.random.default_rng(2).standard_normal((1, 4))
    for targets in (np.array([3], np.int32), np.array([3], np.uint8), Tensor(np.array([3]))):  # numpy arrays too
        expected = loss_by_loops(logits, np.array([3]))
        np.testing.assert_allclose(cross_entropy(Tensor(logits), targets).item(), expected, rtol=1e-14)
    strided_targets = np.array([[1, 9, 2, 9], [0, 9, 3, 9]])[:, ::2]  # a non-contiguous targets view
    logits = np.random.default_rng(3).standard_normal((2, 2, 4))
    expected = loss_by_loops(logits, np.ascontiguousarray(strided_targets))
    np.testing.assert_allclose(cross_entropy(Tensor(logits), Tensor(strided_targets)).item(), expected, rtol=1e-14)


def test_ignore_index_choices(kernel_set):
    logits = np.random.default_rng(4).standard_normal((4, 3))
    targets = np.array([0, -100, 2, 1])
    keep = np.array([0, 2, 3])
    expected = loss_by_loops(logits[keep], targets[keep])
    np.testing.assert_allclose(cross_entropy(Tensor(logits), Tensor(targets)).item(), expected, rtol=1e-14)
    with pytest.raises(ValueError, match=r"cross_entropy: target -100 at position \(1,\)"):
        cross_entropy(Tensor(logits), Tensor(targets), ignore_index=None)  # None: every target must be a class
    # a class index can be ignored too: here class 0 (rows 0 and 1 are left out)
    targets = np.array([0, 0, 2, 1])
    x = Tensor(logits, requires_grad=True)
    loss = cross_entropy(x, Tensor(targets), ignore_index=0)
    np.testing.assert_allclose(loss.item(), loss_by_loops(logits[2:], targets[2:]), rtol=1e-14)
    loss.backward()
    assert np.all(x.grad[:2] == 0) and np.all(x.grad[2:] != 0)


def test_gradcheck_catches_a_wrong_backward(monkeypatch):
    logits, targets = random_problem(np.random.default_rng(5), (2, 3), 4, ignored_fraction=0.3)
    x = Tensor(logits, requires_grad=True)
    fn = lambda x: cross_entropy(x, Tensor(targets))  # noqa: E731
    assert gradcheck(fn, [x])
    original = CrossEntropy.backward

    def divides_by_all_rows(ctx, grad_out):
        # the mean over every row, ignored ones included: too small by N_valid / N
        grad, *rest = original(ctx, grad_out)
        return (grad * ctx.valid_count / targets.size, *rest)

    monkeypatch.setattr(CrossEntropy, "backward", staticmethod(divides_by_all_rows))
    with pytest.raises(GradcheckError):
        gradcheck(fn, [x])


def test_errors_name_the_op_and_the_problem():
    logits = Tensor(np.zeros((2, 3, 5), np.float32))
    targets = Tensor(np.zeros((2, 3), np.int64))
    mismatch = r"^cross_entropy: targets of shape \(3, 2\) do not match logits of shape \(2, 3, 5\)"
    with pytest.raises(ValueError, match=mismatch):
        cross_entropy(logits, Tensor(np.zeros((3, 2), np.int64)))
    with pytest.raises(ValueError, match=r"^cross_entropy: targets of shape \(2, 3, 5\) do not match"):
        cross_entropy(logits, Tensor(np.zeros((2, 3, 5), np.int64)))
    bad = np.zeros((2, 3), np.int64)
    bad[1, 2] = 5
    out_of_range = r"^cross_entropy: target 5 at position \(1, 2\) is not a class index .*\[0, 5\)"
    with pytest.raises(ValueError, match=out_of_range):
        cross_entropy(logits, Tensor(bad))
    bad[1, 2] = -1
    with pytest.raises(ValueError, match=r"^cross_entropy: target -1 at position \(1, 2\)"):
        cross_entropy(logits, Tensor(bad))
    with pytest.raises(TypeError, match=r"^cross_entropy: targets must be integer class indices, got float32"):
        cross_entropy(logits, Tensor(np.zeros((2, 3), np.float32)))
    with pytest.raises(TypeError, match=r"^cross_entropy: logits must be float32 or float64, got int64"):
        cross_entropy(Tensor(np.zeros((2, 3, 5), np.int64)), targets)
    with pytest.raises(ValueError, match=r"^cross_entropy: logits must have shape \(N, V\) or \(B, T, V\), got \(5,\)"):
        cross_entropy(Tensor(np.zeros(5, np.float32)), Tensor(np.zeros((), np.int64)))
    with pytest.raises(ValueError, match=r"^cross_entropy: all 6 targets equal ignore_index=-100"):
        cross_entropy(logits, Tensor(np.full((2, 3), -100)))
    with pytest.raises(TypeError, match=r"^cross_entropy: logits must be a Tensor"):
        cross_entropy(np.zeros((2, 5)), targets)
    with pytest.raises(TypeError, match=r"^cross_entropy: targets must be an integer Tensor, got list"):
        cross_entropy(logits, [[0, 0, 0], [0, 0, 0]])
    with pytest.raises(TypeError, match=r"^cross_entropy: ignore_index must be an int or None, got float"):
        cross_entropy(logits, targets, ignore_index=-100.0)


@pytest.mark.slow
def test_training_sized_batch_against_torch(kernel_set):
    torch = pytest.importorskip("torch")
    if JIT_DISABLED:
        pytest.skip("too slow without the JIT")
    rng = np.random.default_rng(6)
    logits, targets = random_problem(rng, (12, 64), 65, ignored_fraction=0.1)
    x = Tensor(logits.astype(np.float32), requires_grad=True)
    loss = cross_entropy(x, Tensor(targets))
    loss.backward()
    tx = torch.tensor(logits.astype(np.float32), dtype=torch.float64, requires_grad=True)
    theirs = torch.nn.functional.cross_entropy(tx.reshape(-1, 65), torch.tensor(targets).reshape(-1))
    theirs.backward()
    np.testing.assert_allclose(loss.item(), theirs.item(), rtol=1e-6)
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), rtol=1e-5, atol=1e-9)
