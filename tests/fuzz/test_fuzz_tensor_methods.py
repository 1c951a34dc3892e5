"""The fuzz entries of microtensor/tensor.py: the Tensor's comparisons, other methods, backward and version counter.

How an entry draws its arguments and judges the call: fuzzing.py."""
import math

import numpy as np

import microtensor.functional as F
from microtensor import Tensor
from fuzzing import array_of, assert_close, fuzz, fuzz_test, run


@fuzz("comparisons")
def _comparisons(draw):
    shape, dtype = draw.shape(), draw.float_dtype()
    x = draw.tensor(shape, dtype, requires_grad=draw.boolean())
    symbol, numpy_op = draw.choice((("<", np.less), ("<=", np.less_equal), (">", np.greater), (">=", np.greater_equal), ("==", np.equal), ("!=", np.not_equal)))
    kind = draw.choice(("tensor", "number", "array", "int tensor", "reflected number", "string", "list"))
    if kind == "tensor":
        other = draw.tensor(draw.broadcastable(shape), dtype)
    elif kind in ("number", "reflected number"):
        other = draw.choice((0, 1.5, float("nan"), np.float32(-1.0), True))
    elif kind == "array":
        other = draw.values(draw.broadcastable(shape), draw.float_dtype())
    elif kind == "int tensor":
        other = Tensor(draw.rng.integers(-2, 3, draw.broadcastable(shape)))
    else:
        other = "a" if kind == "string" else [1.0]
        if kind == "list" or symbol not in ("==", "!="):
            draw.mark_invalid(f"a comparison with a {kind}")
    operators = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}
    if kind == "reflected number":
        call = lambda: operators[symbol](other, x)  # noqa: E731
        expected = lambda: numpy_op(np.asarray(other), x.numpy())  # noqa: E731
    else:
        call = lambda: operators[symbol](x, other)  # noqa: E731
        expected = lambda: numpy_op(x.numpy(), array_of(other))  # noqa: E731

    def expect(result):
        if kind == "string":  # == and != with an unrelated object: Python's identity answer
            assert result is (symbol == "!="), f"{symbol} with a string gave {result!r}"
            return
        assert_close(symbol, result, np.asarray(expected()), exact=True)

    run(draw, "comparisons", call, expect)


@fuzz("tensor methods")
def _tensor_methods(draw):
    x = draw.tensor(draw.shape(), requires_grad=draw.boolean()) if draw.integer(0, 4) else Tensor(draw.rng.integers(-2, 3, draw.shape()))
    values = x.numpy()
    method = draw.choice(("item", "tolist", "numpy", "size", "numel", "len", "iter", "bool", "any", "all", "detach", "requires_grad_", "asarray", "repr"))

    def check_value(got, expected):
        if isinstance(expected, float) and math.isnan(expected):
            assert isinstance(got, float) and math.isnan(got)
        else:
            assert got == expected or (isinstance(got, list) and np.array_equal(np.asarray(got, dtype=values.dtype), values, equal_nan=True))

    if method == "item":
        if values.size != 1:
            draw.mark_invalid("item of a tensor that is not one number")
        run(draw, "tensor methods", x.item, lambda got: check_value(got, values.item()))
    elif method == "tolist":
        run(draw, "tensor methods", x.tolist, lambda got: check_value(got, values.tolist()))
    elif method == "numpy":
        run(draw, "tensor methods", x.numpy, lambda got: np.testing.assert_array_equal(got, values))
    elif method == "size":
        dim = draw.dim(values.ndim, allow_none=True)
        run(draw, "tensor methods", lambda: x.size(dim), lambda got: check_value(got, values.shape if dim is None else values.shape[dim]))
    elif method == "numel":
        run(draw, "tensor methods", x.numel, lambda got: check_value(got, values.size))
    elif method == "len":
        if values.ndim == 0:
            draw.mark_invalid("len of a 0-d tensor")
        run(draw, "tensor methods", lambda: len(x), lambda got: check_value(got, len(values)))
    elif method == "iter":
        if values.ndim == 0:
            draw.mark_invalid("iteration over a 0-d tensor")

        def expect(rows):
            assert len(rows) == len(values)
            for row, row_values in zip(rows, values):
                assert_close("iter", row, np.asarray(row_values), exact=True)

        run(draw, "tensor methods", lambda: list(x), expect)
    elif method == "bool":
        if values.size != 1:
            draw.mark_invalid("bool of a tensor that is not one number")
        run(draw, "tensor methods", lambda: bool(x), lambda got: check_value(got, bool(values)))
    elif method in ("any", "all"):
        run(draw, "tensor methods", getattr(x, method), lambda got: check_value(got, bool(getattr(values, method)())))
    elif method == "detach":
        run(draw, "tensor methods", x.detach, lambda got: assert_close("detach", got, values, exact=True) or None)
    elif method == "requires_grad_":
        flag = draw.flag("requires_grad")
        if flag is True and values.dtype.kind != "f":
            draw.mark_invalid("an integer tensor cannot require a gradient")
        run(draw, "tensor methods", lambda: x.requires_grad_(flag), lambda got: check_value(got.requires_grad, flag))
    elif method == "asarray":
        run(draw, "tensor methods", lambda: np.asarray(x), lambda got: check_value(got is x.numpy(), True))
    else:
        run(draw, "tensor methods", lambda: repr(x), lambda got: check_value(got.startswith("tensor("), True))


@fuzz("backward")
def _backward(draw):
    shape, dtype = draw.shape(), draw.float_dtype()
    x = draw.tensor(shape, dtype, requires_grad=True)
    y = (x * 2.0).sum() if draw.boolean() else x * 2.0
    kind = draw.choice(("none", "tensor", "array", "number", "wrong shape", "wrong dtype", "list"))
    if kind == "none":
        grad = None
        if y.numpy().size != 1:
            draw.mark_invalid("no gradient for a non-scalar output")
    elif kind in ("tensor", "array"):
        grad = draw.values(y.shape, dtype)
        grad = Tensor(grad) if kind == "tensor" else grad
    elif kind == "number":
        grad = 1.5
        if y.numpy().size != 1:
            draw.mark_invalid("a number as the gradient of an output of more than one element")
    else:
        draw.mark_invalid(f"a gradient of the {kind}")
        grad = {"wrong shape": np.ones(y.shape + (1,), dtype), "wrong dtype": np.ones(y.shape, np.float16), "list": [1.0]}[kind]
    retain_graph = draw.flag("retain_graph")
    if draw.one_in(10):
        y = y.detach()
        draw.mark_invalid("a tensor that needs no gradient")

    def call():
        y.backward(grad, retain_graph=retain_graph)
        return x.grad

    def expect(got):
        upstream = np.ones(y.shape, dtype) if grad is None else np.broadcast_to(array_of(grad, dtype).astype(dtype), y.shape)
        expected = np.broadcast_to(upstream * dtype.type(2), shape)
        np.testing.assert_allclose(got, expected, equal_nan=True)

    run(draw, "backward", call, expect)


@fuzz("version counter")
def _version_counter(draw):
    x = Tensor(np.ascontiguousarray(draw.values(draw.shape(1, 2, 1, 3), draw.float_dtype())), requires_grad=True)
    op = draw.choice(("mul", "exp", "add", "layer_norm", "matmul"))  # (contiguous x: layer_norm saves a view of it, not a copy)
    if op == "mul":
        y, saves_x = x * x, True
    elif op == "exp":
        y, saves_x = x.exp(), False  # saves its output, not x
    elif op == "add":
        y, saves_x = x + 1.0, False
    elif op == "layer_norm":
        y, saves_x = F.layer_norm(x), True
    else:
        y, saves_x = x @ x.T, True
    change = draw.choice(("assign in place", "assign new", "bump", "none"))
    if change == "assign in place":
        x.data *= 1.0  # the values stay, the change is counted
    elif change == "assign new":
        x.data = x.numpy().copy()
    elif change == "bump":
        x._bump_version()
    if change in ("assign in place", "bump") and saves_x:
        draw.mark_invalid(f"an input of {op} changed in place after forward")
    upstream = np.ones(y.shape, x.dtype)
    run(draw, "version counter", lambda: y.backward(upstream), None)


test_fuzz = fuzz_test(__name__)
