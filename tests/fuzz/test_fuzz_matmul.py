"""The fuzz entries of microtensor/ops/matmul.py.

How an entry draws its arguments and judges the call: fuzzing.py."""
import numpy as np

import microtensor.functional as F
from microtensor import Tensor
from fuzzing import array_of, assert_close, fuzz, fuzz_test, run


@fuzz("matmul")
def _matmul(draw):
    n, k, m = draw.integer(0, 4), draw.integer(0, 4), draw.integer(0, 4)
    kind = draw.choice(("2-D", "batched", "3-D @ 2-D", "vector @ matrix", "matrix @ vector", "vector @ vector"))
    if kind == "2-D":
        shapes = (n, k), (k, m)
    elif kind == "batched":
        batch = draw.shape(1, 2, 0, 3)
        shapes = draw.broadcastable(batch) + (n, k), batch + (k, m)
    elif kind == "3-D @ 2-D":
        shapes = (draw.integer(0, 3), n, k), (k, m)
    elif kind == "vector @ matrix":
        shapes = (k,), (k, m)
    elif kind == "matrix @ vector":
        shapes = (n, k), (k,)
    else:
        shapes = (k,), (k,)
    a_shape, b_shape = shapes
    if draw.one_in(10):  # b's inner size (its second-to-last dim, or its only one) off by one
        b_shape = b_shape[:-2] + (k + 1,) + b_shape[-1:] if len(b_shape) >= 2 else (k + 1,)
        draw.mark_invalid("inner sizes differ")
    if draw.one_in(15):
        a_shape = ()
        draw.mark_invalid("a 0-d operand")
    dtype = draw.float_dtype()
    a = draw.float_operand(a_shape, dtype)
    b = draw.same_dtype_operand(b_shape, dtype)
    form = draw.choice(("function", "operator"))
    if form == "operator" and not isinstance(a, Tensor) and not isinstance(b, Tensor):
        return
    call = (lambda: F.matmul(a, b)) if form == "function" else (lambda: a @ b)

    def expect(result):
        x, y = array_of(a), array_of(b)
        with np.errstate(all="ignore"):
            expected = np.matmul(x.astype(np.float64), y.astype(np.float64)).astype(result.dtype)
            finite_scale = np.matmul(np.nan_to_num(np.abs(x.astype(np.float64)), posinf=0), np.nan_to_num(np.abs(y.astype(np.float64)), posinf=0))
        scale = max(1.0, float(np.max(finite_scale, initial=0)))
        if not np.all(np.isfinite(x)) or not np.all(np.isfinite(y)) or scale > 1e25:
            # nan and inf, or products near the dtype's limit: the order of the sums decides which
            # inf or nan comes out, so only the pattern of non-finite values is compared, with
            # numpy's product in the same dtype (whose products overflow where the kernel's do)
            same_dtype = np.matmul(x, y)
            np.testing.assert_array_equal(np.isfinite(result.numpy()), np.isfinite(same_dtype), err_msg="matmul")
            return
        assert_close("matmul", result, expected, scale=scale)

    run(draw, "matmul", call, expect)


test_fuzz = fuzz_test(__name__)
