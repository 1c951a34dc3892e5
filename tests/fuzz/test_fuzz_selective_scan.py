"""The fuzz entries of microtensor/ops/electives/selective_scan.py (an elective).

How an entry draws its arguments and judges the call: fuzzing.py."""
import numpy as np

import microtensor.functional as F
from fuzzing import assert_close, fuzz, fuzz_test, run


def scan_oracle(x, delta, A, B, C, D, h0):
    """The recurrence in numpy, step by step, in the inputs' dtype (where exp(ΔA) overflows is the
    dtype's): (y, the largest |C_t| · |h_t| + |D x_t| seen, which sets the scale of the rounding)."""
    h = h0
    y, scale = np.empty_like(x), 1.0
    for t in range(x.shape[1]):
        h = np.exp(delta[:, t, :, None] * A) * h + delta[:, t, :, None] * B[:, t, None, :] * x[:, t, :, None]  # (B, Dc, N)
        y[:, t] = (C[:, t, None, :] * h).sum(axis=-1) + D * x[:, t]
        size = (np.abs(C[:, t, None, :]) * np.abs(h)).sum(axis=-1) + np.abs(D * x[:, t])
        finite = size[np.isfinite(size)]
        scale = max(scale, float(finite.max()) if finite.size else 1.0)
    return y, scale


@fuzz("selective_scan")
def _selective_scan(draw):
    batch, T, channels, N = (draw.integer(0 if draw.rarely() else 1, 3) for _ in range(4))
    dtype = draw.float_dtype()
    shapes = {"x": (batch, T, channels), "delta": (batch, T, channels), "A": (channels, N), "B": (batch, T, N), "C": (batch, T, N), "D": (channels,)}
    misshapen = draw.choice(tuple(shapes)) if draw.one_in(10) else None
    if misshapen is not None:
        shapes[misshapen] = shapes[misshapen] + (1,) if draw.boolean() else shapes[misshapen][:-1] + (shapes[misshapen][-1] + 1,)
        draw.mark_invalid(f"{misshapen} of shape {shapes[misshapen]}")
    odd = draw.choice(tuple(shapes)) if draw.rarely() else None  # the one operand that may be of a wrong kind
    x = draw.float_operand(shapes["x"], dtype) if odd == "x" else draw.tensor(shapes["x"], dtype)
    delta, A, B, C = (draw.same_dtype_operand(shapes[name], dtype) if odd == name else draw.tensor(shapes[name], dtype) for name in ("delta", "A", "B", "C"))
    D = (draw.same_dtype_operand(shapes["D"], dtype) if odd == "D" else draw.tensor(shapes["D"], dtype)) if "D" in (odd, misshapen) or draw.boolean() else None
    state = None
    if draw.one_in(4):
        state_shape = (batch, channels, N) if not draw.one_in(4) else (batch, channels, N + 1)
        if state_shape != (batch, channels, N):
            draw.mark_invalid(f"a state of shape {state_shape}")
        state = np.asarray(draw.rng.standard_normal(state_shape), dtype=dtype)
    h0 = None if state is None else state.copy()

    def expect(result):
        values = [t.numpy() for t in (x, delta, A, B, C)]
        skip = np.zeros(channels, dtype) if D is None else D.numpy()
        start = np.zeros((batch, channels, N), dtype) if h0 is None else h0
        expected, scale = scan_oracle(*values, skip, start)
        assert_close("selective_scan", result, expected, scale=scale)

    run(draw, "selective_scan", lambda: F.selective_scan(x, delta, A, B, C, D, state=state), expect)


test_fuzz = fuzz_test(__name__)
