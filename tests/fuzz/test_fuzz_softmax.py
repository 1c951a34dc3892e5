"""The fuzz entries of microtensor/ops/softmax.py: softmax, log_softmax and the softmax Jacobian.

How an entry draws its arguments and judges the call: fuzzing.py."""
import numpy as np

import microtensor.functional as F
from microtensor import Tensor
from fuzzing import array_of, assert_close, fuzz, fuzz_test, log_softmax_oracle, run, softmax_oracle


def fuzz_softmax(name, oracle):
    @fuzz(name)
    def entry(draw):
        x = draw.float_operand(draw.shape(), draw.float_dtype())
        dim = draw.dim(x.ndim if isinstance(x, Tensor) else 1)
        if draw.valid and x.numpy().size == 0:
            expected = lambda: np.empty(x.shape, x.dtype)  # noqa: E731  (an empty batch, or rows of nothing)
        else:
            expected = lambda: oracle(x.numpy(), dim)  # noqa: E731
        run(draw, name, lambda: getattr(F, name)(x, dim), lambda result: assert_close(name, result, expected()))


fuzz_softmax("softmax", softmax_oracle)
fuzz_softmax("log_softmax", log_softmax_oracle)


@fuzz("softmax_jacobian")
def _softmax_jacobian(draw):
    shape, dtype = draw.shape(), draw.float_dtype()
    kind = draw.choice(("tensor", "array", "list", "int array"))
    y = draw.values(shape, dtype)
    y = softmax_oracle(y, -1) if y.size else y
    if kind == "tensor":
        y = Tensor(y)
    elif kind == "list":
        y = y.tolist()
        draw.mark_invalid("a list")
    elif kind == "int array":
        y = y.astype(np.int64)
        draw.mark_invalid("integers")
    if not shape:
        draw.mark_invalid("a 0-d y")

    def expect(result):
        values = array_of(y)
        expected = values[..., :, None] * np.eye(values.shape[-1], dtype=values.dtype) - values[..., :, None] * values[..., None, :]
        if isinstance(y, Tensor):
            assert_close("softmax_jacobian", result, expected)
        else:
            assert isinstance(result, np.ndarray) and result.dtype == values.dtype
            np.testing.assert_allclose(result, expected, rtol=1e-6, equal_nan=True)

    run(draw, "softmax_jacobian", lambda: F.softmax_jacobian(y), expect)


test_fuzz = fuzz_test(__name__)
