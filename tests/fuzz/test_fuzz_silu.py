"""The fuzz entries of microtensor/ops/electives/silu.py: SiLU and SwiGLU (electives).

How an entry draws its arguments and judges the call: fuzzing.py."""
import numpy as np

import microtensor.functional as F
from fuzzing import assert_close, fuzz, fuzz_test, run


def silu_oracle(x):
    x64 = x.astype(np.float64)
    return (x64 / (1 + np.exp(-x64))).astype(x.dtype)


@fuzz("silu")
def _silu(draw):
    x = draw.float_operand(draw.shape(), draw.float_dtype())
    run(draw, "silu", lambda: F.silu(x), lambda result: assert_close("silu", result, silu_oracle(x.numpy())))


@fuzz("swiglu")
def _swiglu(draw):
    shape, dtype = draw.shape(), draw.float_dtype()
    a = draw.float_operand(shape, dtype)
    other = shape
    if draw.one_in(10):
        other = shape + (2,)
        draw.mark_invalid("gate and value of different shapes")
    b = draw.same_dtype_operand(other, dtype)

    def expect(result):
        with np.errstate(all="ignore"):
            expected = (silu_oracle(a.numpy()).astype(np.float64) * b.numpy()).astype(dtype)
        assert_close("swiglu", result, expected)

    run(draw, "swiglu", lambda: F.swiglu(a, b), expect)


test_fuzz = fuzz_test(__name__)
