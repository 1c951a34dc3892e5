"""The fuzz entries of microtensor/ops/electives/lora.py (an elective).

How an entry draws its arguments and judges the call: fuzzing.py."""
import math

import numpy as np

import microtensor.functional as F
from fuzzing import assert_close, fuzz, fuzz_test, optional_vector, run


@fuzz("lora_linear")
def _lora_linear(draw):
    batch, n_in, n_out, rank, dtype = draw.shape(0, 2, 0, 3), draw.integer(0, 3), draw.integer(0, 3), draw.integer(1, 3), draw.float_dtype()
    x = draw.float_operand(batch + (n_in,), dtype)
    weight = draw.same_dtype_operand((n_in, n_out), dtype)
    bias = optional_vector(draw, n_out, dtype, "bias")
    a_shape, b_shape = (n_in, rank), (rank, n_out)
    if draw.one_in(10):
        which = draw.choice(("rank 0", "lora_a", "lora_b"))
        a_shape, b_shape = {"rank 0": ((n_in, 0), (0, n_out)), "lora_a": ((n_in + 1, rank), b_shape), "lora_b": (a_shape, (rank + 1, n_out))}[which]
        draw.mark_invalid(f"shapes: {which}")
    lora_a = draw.same_dtype_operand(a_shape, dtype)
    lora_b = draw.same_dtype_operand(b_shape, dtype)
    if draw.one_in(15):
        x = draw.tensor(batch + (n_in + 1,), dtype)
        draw.mark_invalid("x's last dim is not in")
    scale = draw.choice((float("nan"), float("inf"), "2", None)) if draw.rarely() and draw.boolean() else draw.choice((1.0, 0.5, 2, -1.0, 0.0, np.float32(4.0)))
    if not (isinstance(scale, (int, float, np.floating)) and math.isfinite(scale)):
        draw.mark_invalid(f"scale = {scale!r}")

    def expect(result):
        xs, w, a, b = (t.numpy().astype(np.float64) for t in (x, weight, lora_a, lora_b))
        bias64 = np.zeros(n_out) if bias is None else bias.numpy().astype(np.float64)
        with np.errstate(all="ignore"):
            expected = xs @ w + bias64 + float(scale) * ((xs @ a) @ b)  # (..., out)
            # x A and (x A) B, which the op holds in the input's dtype before it scales the update
            low_rank = np.abs(xs) @ np.abs(a)  # (..., rank)
            update = low_rank @ np.abs(b)  # (..., out)
            bound = np.abs(xs) @ np.abs(w) + np.abs(bias64) + abs(float(scale)) * update
        assert result.dtype == dtype and result.shape == expected.shape, f"lora_linear: {result.dtype} {result.shape}"
        limit = np.finfo(dtype).max / 16
        if not all(np.all(np.isfinite(v)) and v.max(initial=0) <= limit for v in (bound, low_rank, update)):
            # nan, inf or sums near the dtype's limit, in the result or on the way to it (an update
            # that overflows before a scale of 0 multiplies it is nan): the order of the sums decides
            return
        assert_close("lora_linear", result, expected.astype(dtype), scale=max(1.0, float(bound.max(initial=0))))

    run(draw, "lora_linear", lambda: F.lora_linear(x, weight, bias, lora_a, lora_b, scale), expect)


test_fuzz = fuzz_test(__name__)
