"""The fast twins of the selective scan's kernels (microtensor/ops/electives/selective_scan.py): the
same arguments, the same results, the same saved states.

The scan is sequential in time but independent across sequences and channels: every (b, d) pair
carries its own state. So both kernels run the B × Dc pairs in parallel (`prange`), each walking
its steps in order, as the readable loops do.

- Forward: each pair writes only its own y[b, :, d] and states[b, :, d], so nothing is shared.
- Backward: dL/dx and dL/dΔ are per pair too, but dL/dA and dL/dD add over the sequences, and
  dL/dB and dL/dC over the channels, which the readable kernel adds into one array in order. Here
  each pair writes its own partial sums (dL/dA and dL/dD per sequence, and gh_t, the state's
  gradient at every step, into an array (B, T, Dc, N)); a second loop, parallel over sequences,
  then sums dL/dB_t = Σ_d gh_t Δ_t x_t and dL/dC_t = Σ_d gy_t h_t over the channels, and the
  per-sequence partials are added last. No two iterations ever write the same number.
"""
import numpy as np
from numba import prange

from ...kernels import fast_twin, kernel
from ...ops.electives import selective_scan as readable


@fast_twin(readable.selective_scan_forward)
@kernel(parallel=True, tag="fast")
def selective_scan_forward(x, delta, A, B, C, D, h0, y, states):
    batch, T, channels = x.shape
    N = A.shape[1]
    zero = x.dtype.type(0)
    for pair in prange(batch * channels):
        b, d = pair // channels, pair % channels
        for t in range(T):
            y_t = zero
            for n in range(N):
                h_previous = h0[b, d, n] if t == 0 else states[b, t - 1, d, n]
                h = np.exp(delta[b, t, d] * A[d, n]) * h_previous + delta[b, t, d] * B[b, t, n] * x[b, t, d]
                states[b, t, d, n] = h
                y_t += C[b, t, n] * h
            y[b, t, d] = y_t + D[d] * x[b, t, d]


@fast_twin(readable.selective_scan_backward)
@kernel(parallel=True, tag="fast")
def selective_scan_backward(grad_y, x, delta, A, B, C, D, h0, states, grad_x, grad_delta, grad_A, grad_B, grad_C, grad_D, grad_h):
    batch, T, channels = x.shape
    N = A.shape[1]
    zero = x.dtype.type(0)
    grad_states = np.empty((batch, T, channels, N), dtype=x.dtype)  # gh_t of every pair and step
    grad_A_parts = np.empty((batch, channels, N), dtype=x.dtype)  # dL/dA per sequence
    grad_D_parts = np.empty((batch, channels), dtype=x.dtype)  # dL/dD per sequence
    for pair in prange(batch * channels):
        b, d = pair // channels, pair % channels
        grad_D_b = zero
        for n in range(N):
            grad_A_parts[b, d, n] = zero
        for t in range(T - 1, -1, -1):
            g = grad_y[b, t, d]
            grad_D_b += g * x[b, t, d]
            grad_x_t = g * D[d]
            grad_delta_t = zero
            for n in range(N):
                after = zero if t == T - 1 else np.exp(delta[b, t + 1, d] * A[d, n]) * grad_states[b, t + 1, d, n]
                gh = g * C[b, t, n] + after  # gh_t = gy_t C_t + a_{t+1} gh_{t+1}
                grad_states[b, t, d, n] = gh
                h_previous = h0[b, d, n] if t == 0 else states[b, t - 1, d, n]
                a = np.exp(delta[b, t, d] * A[d, n])
                grad_x_t += gh * delta[b, t, d] * B[b, t, n]
                grad_delta_t += gh * h_previous * a * A[d, n] + gh * B[b, t, n] * x[b, t, d]
                grad_A_parts[b, d, n] += gh * h_previous * a * delta[b, t, d]
            grad_x[b, t, d] = grad_x_t
            grad_delta[b, t, d] = grad_delta_t
        grad_D_parts[b, d] = grad_D_b
    for b in prange(batch):
        for t in range(T):
            for n in range(N):
                sum_B, sum_C = zero, zero
                for d in range(channels):
                    sum_B += grad_states[b, t, d, n] * delta[b, t, d] * x[b, t, d]
                    sum_C += grad_y[b, t, d] * states[b, t, d, n]
                grad_B[b, t, n] = sum_B
                grad_C[b, t, n] = sum_C
    for d in range(channels):
        grad_D[d] = zero
        for n in range(N):
            grad_A[d, n] = zero
        for b in range(batch):
            grad_D[d] += grad_D_parts[b, d]
            for n in range(N):
                grad_A[d, n] += grad_A_parts[b, d, n]
