"""The fuzz entries of microtensor/ops/dropout.py.

How an entry draws its arguments and judges the call: fuzzing.py."""
import numpy as np

import microtensor.functional as F
from fuzzing import fuzz, fuzz_test, run, TOLERANCE


@fuzz("dropout")
def _dropout(draw):
    x = draw.float_operand(draw.shape(), draw.float_dtype())
    p = draw.choice((1.0, -0.1, float("nan"), "half", True)) if draw.rarely() else draw.choice((0.0, 0.1, 0.5, 0.9, np.float32(0.25)))
    if not (isinstance(p, (float, np.floating)) and 0 <= p < 1):
        draw.mark_invalid(f"p = {p!r}")
    training = draw.flag("training")
    generator = draw.choice((None, "seeded", "seeded", 7))
    if generator == 7:
        draw.mark_invalid("a generator that is not a numpy Generator")
    elif generator == "seeded":
        generator = np.random.default_rng(draw.integer(0, 100))

    def expect(result):
        values = x.numpy()
        if not training or p == 0:
            assert result is x, "dropout: without training, or with p = 0, the input itself"
            return
        assert result.shape == values.shape and result.dtype == values.dtype
        got = result.numpy()
        kept_value = values * (values.dtype.type(1) / values.dtype.type(1 - p))
        kept = np.isclose(got, kept_value, rtol=TOLERANCE[values.dtype][0], atol=0, equal_nan=True)
        dropped = (got == 0) | (~np.isfinite(values) & np.isnan(got))  # inf * 0 is nan
        assert np.all(kept | dropped), "dropout: an element neither kept (scaled by 1 / (1 - p)) nor zeroed"

    run(draw, "dropout", lambda: F.dropout(x, p, training, generator), expect)


test_fuzz = fuzz_test(__name__)
