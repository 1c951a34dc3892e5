"""Exercise 26: the selective scan of a state-space model. The task is in README.md; write the TODOs below.

    a_t = exp(Δ_t A)   b_t = Δ_t B_t x_t                                    (N,) per channel
    h_t = a_t h_{t-1} + b_t      y_t = C_t · h_t + D x_t                     h_{-1} = 0
    gh_t = gy_t C_t + a_{t+1} gh_{t+1}   (a reverse scan, gh_T = 0)
"""
import numpy as np

from microtensor.autograd import Function
from microtensor.kernels import kernel


@kernel
def scan_forward(x, delta, A, B, C, D, y, states):
    """x, delta (Bt, T, Dc); A (Dc, N); B, C (Bt, T, N); D (Dc,) -> y (Bt, T, Dc), and every state
    h_t in states (Bt, T, Dc, N), which backward reads."""
    Bt, T, Dc = x.shape
    N = A.shape[1]
    zero = x.dtype.type(0)
    for b in range(Bt):
        for d in range(Dc):
            for t in range(T):
                y_t = zero
                for n in range(N):
                    h_previous = zero if t == 0 else states[b, t - 1, d, n]
                    a = np.exp(delta[b, t, d] * A[d, n])
                    h = a * h_previous + delta[b, t, d] * B[b, t, n] * x[b, t, d]
                    states[b, t, d, n] = h
                    y_t += C[b, t, n] * h
                y[b, t, d] = y_t + D[d] * x[b, t, d]


@kernel
def scan_backward(grad_y, x, delta, A, B, C, D, states, grad_x, grad_delta, grad_A, grad_B, grad_C, grad_D):
    """grad_y = dL/dy (Bt, T, Dc) -> the six inputs' gradients, each of its input's shape, from the
    inputs and the states the forward saved. grad_A, grad_B, grad_C and grad_D are sums: zero them first."""
    Bt, T, Dc = x.shape
    N = A.shape[1]
    zero = x.dtype.type(0)
    grad_A[:] = 0
    grad_B[:] = 0
    grad_C[:] = 0
    grad_D[:] = 0
    for b in range(Bt):
        for d in range(Dc):
            gh = np.zeros(N, dtype=x.dtype)  # gh_T = 0
            for t in range(T - 1, -1, -1):
                g = grad_y[b, t, d]
                grad_D[d] += g * x[b, t, d]
                grad_x_t = g * D[d]
                grad_delta_t = zero
                for n in range(N):
                    grad_C[b, t, n] += g * states[b, t, d, n]
                    gh[n] += g * C[b, t, n]  # gh_t
                    h_previous = zero if t == 0 else states[b, t - 1, d, n]
                    a = np.exp(delta[b, t, d] * A[d, n])
                    grad_x_t += gh[n] * delta[b, t, d] * B[b, t, n]
                    grad_delta_t += gh[n] * h_previous * a * A[d, n] + gh[n] * B[b, t, n] * x[b, t, d]
                    grad_A[d, n] += gh[n] * h_previous * a * delta[b, t, d]
                    grad_B[b, t, n] += gh[n] * delta[b, t, d] * x[b, t, d]
                    gh[n] = a * gh[n]  # h_{t-1}'s share through h_t
                grad_x[b, t, d] = grad_x_t
                grad_delta[b, t, d] = grad_delta_t


class SelectiveScan(Function):
    @staticmethod
    def forward(ctx, x, delta, A, B, C, D):
        x, delta, A, B, C, D = (np.ascontiguousarray(a) for a in (x, delta, A, B, C, D))
        y = np.empty_like(x)
        states = np.empty(x.shape + (A.shape[1],), dtype=x.dtype)  # (Bt, T, Dc, N)
        scan_forward(x, delta, A, B, C, D, y, states)
        ctx.save_for_backward(x, delta, A, B, C, D, states)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, delta, A, B, C, D, states = ctx.saved_tensors
        grads = [np.empty_like(a) for a in (x, delta, A, B, C, D)]
        scan_backward(np.ascontiguousarray(grad_y), x, delta, A, B, C, D, states, *grads)
        return tuple(grads)


def selective_scan(x, delta, A, B, C, D):
    """y (Bt, T, Dc) of the selective scan: every argument a float64 Tensor of the shapes above."""
    return SelectiveScan.apply(x, delta, A, B, C, D)
