"""The checks of exercise 4. Run them with `python -m exercises check cross_entropy`."""
import numpy as np

import microtensor as mt
import microtensor.functional as F
from exercises.checking import expect, expect_close, float64_arithmetic, gradcheck, random_tensor


def cross_entropy_numpy(logits, targets):
    """The mean over rows of log sum_v e^(z_v) - z_target, with numpy's own stable log-sum-exp."""
    lse = np.logaddexp.reduce(logits, axis=1)  # (N,)
    return np.mean(lse - logits[np.arange(len(targets)), targets])


def gradient_numpy(logits, targets, upstream=1.0):
    """(softmax(z) - onehot(t)) * g / N, with softmax from the shifted exponentials."""
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities = e / e.sum(axis=1, keepdims=True)
    one_hot = np.eye(logits.shape[1])[targets]
    return (probabilities - one_hot) * upstream / logits.shape[0]


def test_loss_matches_numpy_and_microtensor(impl):
    """the loss equals log V for equal logits, a numpy reference, and F.cross_entropy"""
    equal = impl.cross_entropy(mt.tensor(np.zeros((3, 4))), np.array([0, 3, 1]))
    expect_close("the loss of 3 rows of 4 equal logits", equal, np.asarray(np.log(4.0)), "log V = log 4 (every class has p = 1/4)")
    logits = np.random.default_rng(1).normal(size=(4, 5)) * 2
    targets = np.array([1, 0, 4, 2])
    loss = impl.cross_entropy(mt.tensor(logits), targets)
    expect_close("the loss of logits (4, 5)", loss, np.asarray(cross_entropy_numpy(logits, targets)), "numpy's logaddexp reference")
    reference = F.cross_entropy(mt.tensor(logits), mt.tensor(targets))
    expect_close("the loss of logits (4, 5)", loss, reference, "F.cross_entropy")


def test_gradient_matches_finite_differences(impl):
    """gradcheck: the gradient w.r.t. the logits against finite differences, random upstream"""
    for seed, (rows, vocab) in enumerate([(4, 5), (1, 3), (3, 1), (2, 6)]):
        targets = np.random.default_rng(100 + seed).integers(0, vocab, size=rows)
        gradcheck(lambda logits: impl.cross_entropy(logits, targets), [random_tensor((rows, vocab), seed=seed, low=-3, high=3)])


def test_gradient_matches_numpy(impl):
    """the gradient equals (softmax(z) - onehot(t)) · g / N in numpy, for g = 1 and g = 2.5"""
    logits = np.random.default_rng(2).normal(size=(3, 4))
    targets = np.array([2, 2, 0])
    for upstream in (1.0, 2.5):
        x = mt.tensor(logits, requires_grad=True)
        impl.cross_entropy(x, targets).backward(np.asarray(upstream))
        expect_close(
            f"dL/dz of shape (3, 4) for upstream g = {upstream}", x.grad, gradient_numpy(logits, targets, upstream),
            "(softmax(z) - onehot(t)) * g / N in numpy",
        )  # fmt: skip


def test_float32_matches_microtensor(impl):
    """in float32 the loss and the gradient equal F.cross_entropy's"""
    logits = np.random.default_rng(3).normal(size=(5, 6)).astype(np.float32) * 3
    targets = np.array([0, 5, 2, 2, 1])
    x = mt.tensor(logits, requires_grad=True)
    loss = impl.cross_entropy(x, targets)
    loss.backward()
    x_ref = mt.tensor(logits, requires_grad=True)
    loss_ref = F.cross_entropy(x_ref, mt.tensor(targets))
    loss_ref.backward()
    expect_close("the loss in float32", loss, loss_ref, "F.cross_entropy", atol=1e-6, rtol=1e-5)
    expect_close("dL/dz of shape (5, 6) in float32", x.grad, x_ref.grad, "F.cross_entropy's backward", atol=1e-7, rtol=1e-5)


def test_float32_arithmetic_stays_float32(impl):
    """compiled, both kernels compute in float32 for float32 arrays (no bare 0.0, no bare N)"""
    logits = np.random.default_rng(4).normal(size=(3, 4)).astype(np.float32)
    targets = np.array([1, 0, 3])
    row_loss, lse, grad_logits = np.empty(3, np.float32), np.empty(3, np.float32), np.empty_like(logits)
    arguments_of = {
        "cross_entropy_forward": (logits, targets, row_loss, lse),
        "cross_entropy_backward": (logits, targets, lse, np.float32(1.0), grad_logits),
    }
    for name, arguments in arguments_of.items():
        kernel = getattr(impl, name)
        kernel(*arguments)  # runs at all (not a TODO any more); forward first: backward reads its lse
        promoted = float64_arithmetic(kernel, *arguments)
        expect(not promoted, f"{name} computes {', '.join(promoted)} in float64 for float32 arrays: a bare Python "
               "number (0.0, or N, an int, in a division) makes float32 math float64 under Numba; "
               "write logits.dtype.type(0) and logits.dtype.type(N)")


def test_large_logits(impl):
    """logits near ±1000 (e^1000 overflows): the loss and the gradient stay finite and right"""
    logits = np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1003.0, -999.5], [800.0, -800.0, 0.0]])
    targets = np.array([0, 1, 1])
    for dtype, atol in ((np.float64, 1e-12), (np.float32, 1e-5)):
        name = np.dtype(dtype).name
        x = mt.tensor(logits.astype(dtype), requires_grad=True)
        loss = impl.cross_entropy(x, targets)
        loss.backward()
        expected = np.asarray(cross_entropy_numpy(logits, targets)).astype(dtype)
        expect(
            np.isfinite(loss.numpy()),
            f"the loss of logits near ±1000 in {name}: yours {loss.numpy().item()}, expected {expected.item()} "
            "(nan or inf: e^z overflowed, or a log of 0: subtract the row's max first, and take lse = m + log s, not log p)",
        )
        expect_close(f"the loss of logits near ±1000 in {name}", loss, expected, "numpy's logaddexp, in float64", atol=atol, rtol=1e-6)
        expect_close(
            f"dL/dz at logits near ±1000 in {name}", x.grad, gradient_numpy(logits, targets).astype(dtype),
            "(softmax(z) - onehot(t)) / N in numpy, float64", atol=atol, rtol=1e-5,
        )  # fmt: skip
