"""The fuzz entries of microtensor/ops/electives/rms_norm.py (an elective).

How an entry draws its arguments and judges the call: fuzzing.py."""
import numpy as np

import microtensor.functional as F
from fuzzing import an_eps, assert_norm_close, fuzz, fuzz_test, optional_vector, run


@fuzz("rms_norm")
def _rms_norm(draw):
    shape, dtype = draw.shape(0 if draw.rarely() else 1, 3), draw.float_dtype()
    x = draw.float_operand(shape, dtype)
    weight = optional_vector(draw, shape[-1] if shape else 1, dtype, "weight")
    eps = an_eps(draw)
    if not shape:
        draw.mark_invalid("a 0-d input")

    def expect(result):
        values = x.numpy()
        if values.size == 0:
            expected = np.empty(shape, dtype)
        else:
            expected = values / np.sqrt((values * values).mean(axis=-1, keepdims=True) + values.dtype.type(eps))
            expected = expected if weight is None else expected * weight.numpy()
        assert_norm_close("rms_norm", result, expected, values)

    run(draw, "rms_norm", lambda: F.rms_norm(x, weight, eps), expect)


test_fuzz = fuzz_test(__name__)
