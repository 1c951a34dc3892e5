"""The selective scan: the recurrence at the heart of a selective state-space model (Mamba).

Each of the Dc channels of a sequence x (B, T, Dc) carries a hidden state h of N numbers, which
reads the channel's input and is read out by the output, one step per token:

    h_t = Ā_t h_{t-1} + B̄_t x_t               (N,)       h_{-1} = h0 (zeros, unless given)
    y_t = C_t · h_t + D x_t                    ()

Where the numbers come from. A continuous-time state-space model of one channel is
h'(s) = A h(s) + B x(s) with A a diagonal (N,) of negative numbers (each state decays at its own
rate). Hold x constant over a step of length Δ (the zero-order hold): the exact solution over the
step is

    h(s + Δ) = e^{ΔA} h(s) + (∫_0^Δ e^{uA} du) B x = e^{ΔA} h(s) + A⁻¹ (e^{ΔA} - 1) B x

so Ā = exp(ΔA), and B̄ = A⁻¹ (exp(ΔA) - 1) B = Δ B (1 + ΔA/2 + ...) ≈ Δ B for small ΔA: the
Euler step, which Mamba uses for B̄ (and so do we). *Selective*: Δ, B and C are not fixed
parameters but computed from each token (delta (B, T, Dc) > 0, one step size per token and channel;
B and C (B, T, N), shared by the channels), so the model chooses, token by token, how much to
remember (Δ small: Ā ≈ 1, keep h, ignore x) or to reset (Δ large: Ā ≈ 0, take x). With A < 0 and
Δ > 0, Ā = exp(ΔA) is in (0, 1): the state never grows without bound.

With a_t = exp(Δ_t A) (N,) and b_t = Δ_t B_t x_t (N,), for one channel:

    forward (a scan, t = 0 .. T-1):   h_t = a_t h_{t-1} + b_t,    y_t = C_t · h_t + D x_t

Backward, with gy_t = dL/dy_t, by reverse-mode through the recurrence. Let gh_t be the gradient of
L with respect to h_t through everything that reads h_t: y_t reads it directly (gy_t C_t), and
h_{t+1} reads it through a_{t+1}. So gh satisfies a recurrence of its own, run backwards in time:

    gh_t = gy_t C_t + a_{t+1} gh_{t+1}          (N,)      gh_T = 0     (a reverse scan)

and every input's gradient reads gh_t at its own step:

    dL/dC_t   = gy_t h_t                                          (N,)   summed over channels
    dL/dD     = Σ_t gy_t x_t
    dL/dx_t   = gy_t D + Σ_n gh_t[n] Δ_t B_t[n]
    dL/da_t   = gh_t h_{t-1},   dL/db_t = gh_t
    dL/dΔ_t   = Σ_n (gh_t[n] h_{t-1}[n] a_t[n] A[n] + gh_t[n] B_t[n] x_t)      (da/dΔ = a A)
    dL/dA[n]  = Σ_t gh_t[n] h_{t-1}[n] a_t[n] Δ_t                           (da/dA = a Δ)
    dL/dB_t   = gh_t Δ_t x_t                                      (N,)   summed over channels

The forward saves every state h_t (B, T, Dc, N) for backward, which needs h_{t-1} at each step;
rebuilding h_{t-1} from h_t would divide by a_t, which can be tiny.

Forward mode (JVP): the tangent of the state follows the same forward recurrence, with tangents
tx, tΔ, tA, tB, tC, tD:

    ta_t = a_t (tΔ_t A + Δ_t tA)
    th_t = a_t th_{t-1} + ta_t h_{t-1} + (tΔ_t B_t x_t + Δ_t tB_t x_t + Δ_t B_t tx_t)
    ty_t = tC_t · h_t + C_t · th_t + tD x_t + D tx_t

Cost: T steps of N multiply-adds per channel: linear in T, against attention's T² (each token
reads every earlier one). Generation carries h (and nothing that grows with T) from token to token:
`state` below is where it is kept between calls.

The readable kernels loop over sequences, channels and steps one after the other, and follow the
formulas above line by line. The fast set runs the sequences × channels in parallel
(microtensor/fast/electives/selective_scan.py).
"""
import numpy as np

from ...autograd import Function, add_tangents
from ...checks import check_float, check_tensor, describe
from ...errors import InputError, InputTypeError
from ...gradcheck import gradcheck_case
from ...kernels import active, kernel


def selective_scan_reference(x, delta, A, B, C, D=None, h0=None):
    """Plain numpy selective scan (the test oracle): (y (B, T, Dc), the last state (B, Dc, N))."""
    batch, T, channels = x.shape
    h = np.zeros((batch, channels, A.shape[1]), dtype=x.dtype) if h0 is None else h0.copy()  # (B, Dc, N)
    y = np.empty_like(x)
    for t in range(T):
        a = np.exp(delta[:, t, :, None] * A)  # (B, Dc, N)
        b = delta[:, t, :, None] * B[:, t, None, :] * x[:, t, :, None]  # (B, Dc, N)
        h = a * h + b
        y[:, t] = (h * C[:, t, None, :]).sum(axis=-1)  # (B, Dc)
    if D is not None:
        y = y + D * x
    return y, h


@kernel
def selective_scan_forward(x, delta, A, B, C, D, h0, y, states):
    """x, delta (B, T, Dc); A (Dc, N); B, C (B, T, N); D (Dc,); h0 (B, Dc, N) -> y (B, T, Dc);
    saves every state h_t in states (B, T, Dc, N)."""
    batch, T, channels = x.shape
    N = A.shape[1]
    zero = x.dtype.type(0)  # typed: a bare 0.0 would make the sums float64
    for b in range(batch):
        for d in range(channels):
            for t in range(T):
                y_t = zero
                for n in range(N):
                    h_previous = h0[b, d, n] if t == 0 else states[b, t - 1, d, n]
                    a = np.exp(delta[b, t, d] * A[d, n])  # Ā = exp(ΔA)
                    h = a * h_previous + delta[b, t, d] * B[b, t, n] * x[b, t, d]  # + B̄ x, B̄ = ΔB
                    states[b, t, d, n] = h
                    y_t += C[b, t, n] * h
                y[b, t, d] = y_t + D[d] * x[b, t, d]


@kernel
def selective_scan_backward(grad_y, x, delta, A, B, C, D, h0, states, grad_x, grad_delta, grad_A, grad_B, grad_C, grad_D, grad_h):
    """The reverse scan: gh_t = gy_t C_t + a_{t+1} gh_{t+1}, from t = T-1 down to 0, and each input's
    gradient from gh_t (the module docstring). grad_A, grad_B, grad_C, grad_D are sums (over
    sequences, or over channels), so every loop here runs in order; grad_h (N,) is scratch."""
    batch, T, channels = x.shape
    N = A.shape[1]
    zero = x.dtype.type(0)
    grad_A[:] = 0
    grad_B[:] = 0
    grad_C[:] = 0
    grad_D[:] = 0
    for b in range(batch):
        for d in range(channels):
            grad_h[:] = 0  # gh_T = 0: nothing after the last step reads h
            for t in range(T - 1, -1, -1):
                g = grad_y[b, t, d]
                grad_D[d] += g * x[b, t, d]
                grad_x_t = g * D[d]
                grad_delta_t = zero
                for n in range(N):
                    grad_C[b, t, n] += g * states[b, t, d, n]
                    grad_h[n] += g * C[b, t, n]  # now gh_t: y_t's share added to h_{t+1}'s
                    h_previous = h0[b, d, n] if t == 0 else states[b, t - 1, d, n]
                    a = np.exp(delta[b, t, d] * A[d, n])
                    grad_a = grad_h[n] * h_previous  # dL/da_t
                    grad_x_t += grad_h[n] * delta[b, t, d] * B[b, t, n]
                    grad_delta_t += grad_a * a * A[d, n] + grad_h[n] * B[b, t, n] * x[b, t, d]
                    grad_A[d, n] += grad_a * a * delta[b, t, d]
                    grad_B[b, t, n] += grad_h[n] * delta[b, t, d] * x[b, t, d]
                    grad_h[n] = a * grad_h[n]  # h_{t-1}'s share through h_t
                grad_x[b, t, d] = grad_x_t
                grad_delta[b, t, d] = grad_delta_t


class SelectiveScan(Function):
    """y_t = C_t · h_t + D x_t, h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t x_t.   Backward and forward mode
    (JVP): the module docstring. `state` (an array, not a Tensor) is the scan's starting state, and
    is overwritten with its last one."""

    @staticmethod
    def forward(ctx, x, delta, A, B, C, D, state):
        x, delta, A, B, C = (np.ascontiguousarray(a) for a in (x, delta, A, B, C))
        batch, T, channels = x.shape
        N = A.shape[1]
        D = np.zeros(channels, dtype=x.dtype) if D is None else np.ascontiguousarray(D)
        h0 = np.zeros((batch, channels, N), dtype=x.dtype) if state is None else state.copy()  # (B, Dc, N)
        y = np.empty_like(x)
        states = np.empty((batch, T, channels, N), dtype=x.dtype)  # (B, T, Dc, N)
        if x.size and N:
            active(selective_scan_forward)(x, delta, A, B, C, D, h0, y, states)
        elif x.size:
            y[...] = D * x  # no state numbers: only the skip is left
        if state is not None and T and N:
            state[...] = states[:, -1]  # the last state, where the next call starts
        ctx.save_for_backward(x, delta, A, B, C, D, h0, states)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, delta, A, B, C, D, h0, states = ctx.saved_tensors
        g = np.ascontiguousarray(grad_y)  # (B, T, Dc)
        grads = [np.zeros_like(a) for a in (x, delta, A, B, C, D)]
        if x.size and A.shape[1]:
            grad_h = np.empty(A.shape[1], dtype=x.dtype)  # (N,) scratch of the readable kernel
            active(selective_scan_backward)(g, x, delta, A, B, C, D, h0, states, *grads, grad_h)
        else:
            grads[0] = g * D
            grads[5] = (g * x).sum(axis=(0, 1))
        return (*grads, None)

    @staticmethod
    def jvp(ctx, tx, tdelta, tA, tB, tC, tD, _state):
        x, delta, A, B, C, D, h0, states = ctx.saved_tensors
        batch, T, channels = x.shape
        dtype = next(t.dtype for t in (tx, tdelta, tA, tB, tC, tD) if t is not None)
        tx, tdelta, tB, tC = (np.zeros_like(x if i < 2 else B) if t is None else t for i, t in enumerate((tx, tdelta, tB, tC)))
        tA = np.zeros_like(A) if tA is None else tA
        th = np.zeros((batch, channels, A.shape[1]), dtype=dtype)  # (B, Dc, N): the state's tangent
        ty = np.empty(x.shape, dtype=dtype)
        for t in range(T):
            h_previous = h0 if t == 0 else states[:, t - 1]  # (B, Dc, N)
            a = np.exp(delta[:, t, :, None] * A)  # (B, Dc, N)
            ta = a * (tdelta[:, t, :, None] * A + delta[:, t, :, None] * tA)
            tb = (
                tdelta[:, t, :, None] * B[:, t, None, :] * x[:, t, :, None]
                + delta[:, t, :, None] * tB[:, t, None, :] * x[:, t, :, None]
                + delta[:, t, :, None] * B[:, t, None, :] * tx[:, t, :, None]
            )  # (B, Dc, N)
            th = a * th + ta * h_previous + tb
            ty[:, t] = (tC[:, t, None, :] * states[:, t] + C[:, t, None, :] * th).sum(axis=-1)
        return add_tangents(x.shape, ty, D * tx, None if tD is None else tD * x)


def selective_scan(x, delta, A, B, C, D=None, state=None):
    """The selective scan of x (B, T, Dc): y (B, T, Dc), with per token and channel step sizes delta
    (B, T, Dc) (positive: softplus of something, in a model), A (Dc, N) (negative, so that
    exp(delta A) is in (0, 1)), B and C (B, T, N), and the skip D (Dc,) (None: no skip). All float
    tensors of one dtype.

    state: None (the scan starts from zeros), or a numpy array (B, Dc, N) of x's dtype that holds the
    state to start from and is overwritten with the last state: generation runs a sequence in pieces
    this way, one token at a time. No gradient flows into it."""
    op = "selective_scan"
    for name, value in (("x", x), ("delta", delta), ("A", A), ("B", B), ("C", C)):
        check_tensor(op, value, name)
    if D is not None:
        check_tensor(op, D, "D")
    check_float(op, *[t for t in (x, delta, A, B, C, D) if t is not None])
    if x.ndim != 3:
        raise InputError(f"{op}: x must be 3-d (B, T, Dc), got shape {x.shape}")
    batch, T, channels = x.shape
    if A.ndim != 2 or A.shape[0] != channels:
        raise InputError(f"{op}: A must be (Dc, N) = ({channels}, N) to match x {x.shape}, got shape {A.shape}")
    N = A.shape[1]
    expected = {"delta": x.shape, "B": (batch, T, N), "C": (batch, T, N)}
    for name, value in (("delta", delta), ("B", B), ("C", C)):
        if value.shape != expected[name]:
            raise InputError(f"{op}: {name} must have shape {expected[name]} to match x {x.shape} and A {A.shape}, got {value.shape}")
    if D is not None and D.shape != (channels,):
        raise InputError(f"{op}: D must have shape ({channels},) to match x {x.shape}, got {D.shape}")
    if state is not None:
        if not isinstance(state, np.ndarray):
            raise InputTypeError(f"{op}: state must be None or a numpy array ({batch}, {channels}, {N}), got {describe(state)}")
        if state.shape != (batch, channels, N) or state.dtype != x.dtype:
            raise InputError(
                f"{op}: state must be a {x.dtype} array of shape ({batch}, {channels}, {N}) (B, Dc, N), "
                f"got {state.dtype} of shape {state.shape}"
            )
    return SelectiveScan.apply(x, delta, A, B, C, D, state)


@gradcheck_case(SelectiveScan)
def _selective_scan_case(draw):
    batch, T, channels, N = draw.integer(1, 2), draw.integer(1, 4), draw.integer(1, 3), draw.integer(1, 3)
    x = draw.tensor((batch, T, channels))
    delta = draw.tensor((batch, T, channels), 0.1, 1.0)
    A = draw.tensor((channels, N), -1.5, -0.3)
    B, C = draw.tensor((batch, T, N)), draw.tensor((batch, T, N))
    D = draw.tensor((channels,)) if draw.boolean() else None
    return (lambda x, delta, A, B, C, D: selective_scan(x, delta, A, B, C, D)), (x, delta, A, B, C, D)
