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
    # TODO: for every sequence b and channel d, walk t = 0 .. T-1 keeping the state h (N numbers,
    # zeros before the first step; read h_{t-1} from states[b, t - 1, d] after it): a = exp(Δ A[d, n]),
    # h = a h_{t-1} + Δ B[b, t, n] x, written to states[b, t, d, n]; y[b, t, d] = Σ_n C[b, t, n] h_n
    # + D[d] x. Typed constants: x.dtype.type(0).
    raise NotImplementedError("TODO: scan_forward (exercise 26)")


@kernel
def scan_backward(grad_y, x, delta, A, B, C, D, states, grad_x, grad_delta, grad_A, grad_B, grad_C, grad_D):
    """grad_y = dL/dy (Bt, T, Dc) -> the six inputs' gradients, each of its input's shape, from the
    inputs and the states the forward saved. grad_A, grad_B, grad_C and grad_D are sums: zero them first."""
    # TODO: zero grad_A, grad_B, grad_C, grad_D. For every b and d: gh = zeros(N), then walk
    # t = T-1 down to 0: add gy_t C_t into gh (gh is now gh_t); the gradients of step t from gh_t,
    # h_{t-1} (zeros at t = 0) and a_t, as README's table gives them; last, gh = a_t gh (the share
    # of h_{t-1}, for the step before). Scratch: np.zeros(N, dtype=x.dtype).
    raise NotImplementedError("TODO: scan_backward (exercise 26)")


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
