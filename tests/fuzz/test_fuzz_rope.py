"""The fuzz entries of microtensor/ops/electives/rope.py (an elective).

How an entry draws its arguments and judges the call: fuzzing.py."""
import numpy as np

import microtensor.functional as F
from fuzzing import assert_close, fuzz, fuzz_test, run


@fuzz("rope")
def _rope(draw):
    shape = draw.shape(0, 2, 0, 2) + (draw.integer(0, 3), 2 * draw.integer(0, 2))
    if draw.one_in(10):
        shape = shape[:-1] + (shape[-1] + 1,)
        draw.mark_invalid("an odd D")
    if draw.one_in(15):
        shape = shape[-1:]
        draw.mark_invalid("a 1-d input")
    x = draw.float_operand(shape, draw.float_dtype())
    offset = draw.choice((-1, 1.5, True)) if draw.rarely() else draw.choice((0, 3, 100, np.int64(5)))
    if not isinstance(offset, (int, np.integer)) or isinstance(offset, bool) or offset < 0:
        draw.mark_invalid(f"offset = {offset!r}")

    def expect(result):
        values = x.numpy()
        T, D = values.shape[-2:]
        theta = 10000.0 ** (-np.arange(0, D, 2) / D)
        angle = np.arange(offset, offset + T)[:, None] * theta[None, :]
        cos, sin = np.cos(angle), np.sin(angle)
        even, odd = values[..., 0::2].astype(np.float64), values[..., 1::2].astype(np.float64)
        expected = np.empty(values.shape)
        expected[..., 0::2] = even * cos - odd * sin
        expected[..., 1::2] = even * sin + odd * cos
        if not np.all(np.isfinite(values)):
            np.testing.assert_array_equal(np.isfinite(result.numpy()), np.isfinite(expected.astype(values.dtype)), err_msg="rope")
            return
        assert_close("rope", result, expected.astype(values.dtype))

    run(draw, "rope", lambda: F.rope(x, offset), expect)


test_fuzz = fuzz_test(__name__)
