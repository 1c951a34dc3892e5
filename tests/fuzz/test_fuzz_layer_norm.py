"""The fuzz entries of microtensor/ops/layer_norm.py.

How an entry draws its arguments and judges the call: fuzzing.py."""
import numpy as np

import microtensor.functional as F
from fuzzing import an_eps, assert_norm_close, fuzz, fuzz_test, optional_vector, run


def layer_norm_oracle(x, weight, bias, eps):
    mean = x.mean(axis=-1, keepdims=True)
    y = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + x.dtype.type(eps))
    y = y if weight is None else y * weight
    return y if bias is None else y + bias


@fuzz("layer_norm")
def _layer_norm(draw):
    shape, dtype = draw.shape(0 if draw.rarely() else 1, 3), draw.float_dtype()
    x = draw.float_operand(shape, dtype)
    size = shape[-1] if shape else 1
    weight, bias = optional_vector(draw, size, dtype, "weight"), optional_vector(draw, size, dtype, "bias")
    eps = an_eps(draw)
    if not shape:
        draw.mark_invalid("a 0-d input")

    def expect(result):
        w, b = (None if t is None else t.numpy() for t in (weight, bias))
        expected = np.empty(shape, dtype) if x.numpy().size == 0 else layer_norm_oracle(x.numpy(), w, b, eps)
        assert_norm_close("layer_norm", result, expected, x.numpy())

    run(draw, "layer_norm", lambda: F.layer_norm(x, weight, bias, eps), expect)


test_fuzz = fuzz_test(__name__)
