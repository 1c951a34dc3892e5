"""The checks of exercise 26. Run them with `python -m exercises check selective_scan`."""
import math

import numpy as np

from exercises.checking import expect_close, gradcheck, random_tensor

SHAPE = (2, 5, 3, 4)  # (Bt, T, Dc, N)


def inputs(seed):
    Bt, T, Dc, N = SHAPE
    x = random_tensor((Bt, T, Dc), seed=seed)
    delta = random_tensor((Bt, T, Dc), seed=seed + 1, low=0.1, high=1.0)  # Δ > 0, as softplus makes it
    A = random_tensor((Dc, N), seed=seed + 2, low=-1.5, high=-0.3)  # A < 0: exp(ΔA) in (0, 1)
    B, C = random_tensor((Bt, T, N), seed=seed + 3), random_tensor((Bt, T, N), seed=seed + 4)
    D = random_tensor((Dc,), seed=seed + 5)
    return [x, delta, A, B, C, D]


def plain_scan(x, delta, A, B, C, D):
    """The recurrence with Python floats, one channel at a time."""
    Bt, T, Dc = x.shape
    N = A.shape[1]
    y = np.empty(x.shape)
    for b in range(Bt):
        for d in range(Dc):
            h = [0.0] * N
            for t in range(T):
                h = [math.exp(delta[b, t, d] * A[d, n]) * h[n] + delta[b, t, d] * B[b, t, n] * x[b, t, d] for n in range(N)]
                y[b, t, d] = sum(C[b, t, n] * h[n] for n in range(N)) + D[d] * x[b, t, d]
    return y


def test_the_forward_follows_the_recurrence(impl):
    """y against the recurrence written with Python floats; the first saved state h_0 = Δ_0 B_0 x_0"""
    tensors = inputs(seed=1)
    values = [t.numpy() for t in tensors]
    expect_close("selective_scan's y", impl.selective_scan(*tensors).numpy(), plain_scan(*values), "the recurrence with Python floats")
    x, delta, A, B, C, D = values
    y, states = np.empty_like(x), np.empty(x.shape + (A.shape[1],))
    impl.scan_forward(x, delta, A, B, C, D, y, states)
    first = delta[:, 0, :, None] * B[:, 0, None, :] * x[:, 0, :, None]  # h_0 = Δ_0 B_0 x_0 (from h_{-1} = 0)
    expect_close("states[:, 0]: h_0", states[:, 0], first, "Δ_0 B_0 x_0")


def test_gradients_match_finite_differences(impl):
    """gradcheck of all six inputs (random upstream gradient), three draws"""
    for seed in (10, 20, 30):
        gradcheck(impl.selective_scan, inputs(seed))


def test_one_step_and_one_channel(impl):
    """gradcheck with T = 1 (no reverse scan at all) and with Dc = 1, N = 1"""
    x, delta, A, B, C, D = inputs(seed=40)
    gradcheck(impl.selective_scan, [t[:, :1].detach().requires_grad_() if t.ndim == 3 else t for t in (x, delta, A, B, C, D)])
    small = [x[:, :, :1], delta[:, :, :1], A[:1, :1], B[:, :, :1], C[:, :, :1], D[:1]]
    gradcheck(impl.selective_scan, [t.detach().requires_grad_() for t in small])
