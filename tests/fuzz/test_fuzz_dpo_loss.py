"""The fuzz entries of microtensor/ops/electives/dpo_loss.py (an elective).

How an entry draws its arguments and judges the call: fuzzing.py."""
import math

import numpy as np

import microtensor.functional as F
from fuzzing import assert_close, fuzz, fuzz_test, run


@fuzz("dpo_loss")
def _dpo_loss(draw):
    batch, dtype = draw.integer(1, 5), draw.float_dtype()
    shapes = [(batch,)] * 4
    if draw.one_in(10):
        which = draw.choice(("empty batch", "0-d", "2-d", "one longer"))
        shapes = {
            "empty batch": [(0,)] * 4,
            "0-d": [()] * 4,
            "2-d": [(batch, 2)] * 4,
            "one longer": [(batch,)] * 3 + [(batch + 1,)],
        }[which]
        draw.mark_invalid(f"shapes: {which}")
    policy_chosen = draw.float_operand(shapes[0], dtype)
    policy_rejected, reference_chosen, reference_rejected = (draw.same_dtype_operand(s, dtype) for s in shapes[1:])
    beta = draw.choice((0.0, -0.5, float("nan"), float("inf"), "0.1", None)) if draw.rarely() else draw.choice((0.1, 0.5, 1, 2.0, np.float32(0.25)))
    if not (isinstance(beta, (int, float, np.floating)) and math.isfinite(beta) and beta > 0):
        draw.mark_invalid(f"beta = {beta!r}")

    def expect(result):
        pc, pr, rc, rr = (t.numpy().astype(np.float64) for t in (policy_chosen, policy_rejected, reference_chosen, reference_rejected))
        margin = (pc - rc) - (pr - rr)  # (B,)
        expected = np.logaddexp(0.0, -float(beta) * margin).mean()  # -log σ(β m) = log(1 + e^-βm)
        # the op takes the differences in the inputs' dtype: their rounding is relative to the inputs' size
        bound = float(beta) * sum(np.abs(v).max() for v in (pc, pr, rc, rr))
        assert_close("dpo_loss", result, np.asarray(expected, dtype=dtype), scale=max(1.0, bound) if math.isfinite(bound) else None)

    run(draw, "dpo_loss", lambda: F.dpo_loss(policy_chosen, policy_rejected, reference_chosen, reference_rejected, beta), expect)


test_fuzz = fuzz_test(__name__)
