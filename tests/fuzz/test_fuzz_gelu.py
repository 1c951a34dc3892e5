"""The fuzz entries of microtensor/ops/gelu.py.

How an entry draws its arguments and judges the call: fuzzing.py."""
import math

import numpy as np

import microtensor.functional as F
from fuzzing import assert_close, fuzz, fuzz_test, run


def gelu_oracle(x, approximate):
    x64 = x.astype(np.float64)
    if approximate == "tanh":
        y = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)))
    else:
        y = 0.5 * x64 * (1 + np.vectorize(math.erf, otypes=[np.float64])(x64 / math.sqrt(2))) if x64.size else x64
    return y.astype(x.dtype)


@fuzz("gelu")
def _gelu(draw):
    x = draw.float_operand(draw.shape(), draw.float_dtype())
    approximate = draw.choice(("tanh", "none", "tanh", "none", "sigmoid", None))
    if approximate not in ("tanh", "none"):
        draw.mark_invalid(f"approximate={approximate!r}")
    run(draw, "gelu", lambda: F.gelu(x, approximate), lambda result: assert_close("gelu", result, gelu_oracle(x.numpy(), approximate)))


test_fuzz = fuzz_test(__name__)
