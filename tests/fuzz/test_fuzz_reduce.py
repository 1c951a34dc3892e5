"""The fuzz entries of microtensor/ops/reduce.py: sum, mean, max and argmax.

How an entry draws its arguments and judges the call: fuzzing.py."""
import math

import numpy as np

import microtensor.functional as F
from microtensor import Tensor
from fuzzing import assert_close, fuzz, fuzz_test, run


REDUCTIONS = {"sum": np.sum, "mean": np.mean, "max": np.max}


def reduction_dims(draw, ndim):
    kind = draw.choice(("none", "int", "tuple", "list", "repeated"))
    if kind == "none":
        return None
    if kind == "int":
        return draw.dim(ndim)
    dims = [draw.dim(ndim) for _ in range(draw.integer(1, max(1, ndim)))]
    if kind == "repeated" and ndim > 0 and isinstance(dims[0], int):
        dims.append(dims[0] - ndim if dims[0] >= 0 else dims[0] + ndim)  # the same dim, other sign
        draw.mark_invalid("a dim named twice")
    elif ndim > 0 and all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        if len({d % ndim for d in dims}) != len(dims):
            draw.mark_invalid("a dim named twice")
    return tuple(dims) if kind == "tuple" else dims


def fuzz_reduction(name):
    numpy_op = REDUCTIONS[name]

    @fuzz(name)
    def entry(draw):
        x = draw.float_operand(draw.shape(), draw.float_dtype())
        ndim = x.ndim if isinstance(x, Tensor) else 1
        dim = reduction_dims(draw, ndim)
        keepdim = draw.flag("keepdim")
        if draw.valid and name != "sum":
            axes = range(ndim) if dim is None else [d % ndim for d in ([dim] if isinstance(dim, int) else dim)]
            count = math.prod(x.shape[a] for a in set(axes))
            if count == 0 and math.prod(n for a, n in enumerate(x.shape) if a not in set(axes)) > 0:
                draw.mark_invalid(f"{name} over no elements")
        form = draw.choice(("function", "method"))
        if form == "method" and not isinstance(x, Tensor):
            return
        call = (lambda: getattr(F, name)(x, dim, keepdim)) if form == "function" else (lambda: getattr(x, name)(dim=dim, keepdim=keepdim))

        def expect(result):
            axis = None if dim is None else (tuple(dim) if isinstance(dim, (list, tuple)) else dim)
            values = x.numpy()
            if values.size == 0:
                expected = np.sum(values, axis=axis, keepdims=keepdim)  # an empty result, or a sum of nothing: zeros
            else:
                expected = numpy_op(values, axis=axis, keepdims=keepdim)
            assert_close(name, result, np.asarray(expected, dtype=values.dtype))

        run(draw, name, call, expect)


for _name in REDUCTIONS:
    fuzz_reduction(_name)


@fuzz("argmax")
def _argmax(draw):
    x = draw.tensor(draw.shape(), requires_grad=False)
    dim = draw.dim(x.ndim, allow_none=True)
    keepdim = draw.flag("keepdim")
    length = x.numpy().size if dim is None or not draw.valid else x.shape[dim]
    if length == 0:
        draw.mark_invalid("argmax of nothing")

    def expect(result):
        expected = np.argmax(x.numpy(), axis=dim, keepdims=keepdim)
        assert_close("argmax", result, np.asarray(expected), exact=True)

    run(draw, "argmax", lambda: x.argmax(dim=dim, keepdim=keepdim), expect)


test_fuzz = fuzz_test(__name__)
