"""The fuzz entries of microtensor/ops/elementwise.py: the binary and unary ops (functions,
operators, reflected operators) and cast.

How an entry draws its arguments and judges the call: fuzzing.py."""
import numpy as np

import microtensor as mt
import microtensor.functional as F
from microtensor import Tensor
from fuzzing import assert_close, fuzz, fuzz_test, is_operator_operand, oracle_operand, other_operand, run


BINARY = {
    "add": (F.add, np.add, lambda a, b: a + b),
    "sub": (F.sub, np.subtract, lambda a, b: a - b),
    "mul": (F.mul, np.multiply, lambda a, b: a * b),
    "div": (F.div, np.divide, lambda a, b: a / b),
    "pow": (F.pow, np.power, lambda a, b: a**b),
}


def fuzz_binary(name):
    functional, numpy_op, operator = BINARY[name]

    @fuzz(name)
    def entry(draw):
        shape, dtype = draw.shape(), draw.float_dtype()
        a = draw.float_operand(shape, dtype)
        b = other_operand(draw, shape, dtype)
        form = draw.choice(("function", "operator", "reflected"))
        if not isinstance(a, Tensor) and not isinstance(b, Tensor):
            if form != "function":
                return  # plain Python or numpy arithmetic, not microtensor's
            draw.mark_invalid("no Tensor operand")
        first, second = (b, a) if form == "reflected" else (a, b)
        if form == "function":
            call = lambda: functional(first, second)  # noqa: E731
        else:
            if not is_operator_operand(first):
                return
            call = lambda: operator(first, second)  # noqa: E731

        def expect(result):
            like = (a if isinstance(a, Tensor) else b).dtype
            x, y = oracle_operand(first, like), oracle_operand(second, like)
            assert_close(name, result, numpy_op(x, y), dtype=like)

        run(draw, name, call, expect)


for _name in BINARY:
    fuzz_binary(_name)


UNARY = {
    "exp": (F.exp, "exp", np.exp),
    "log": (F.log, "log", np.log),
    "sqrt": (F.sqrt, "sqrt", np.sqrt),
    "tanh": (F.tanh, "tanh", np.tanh),
    "relu": (F.relu, "relu", lambda x: np.maximum(x, 0)),
    "sigmoid": (F.sigmoid, "sigmoid", lambda x: (1 / (1 + np.exp(-x.astype(np.float64)))).astype(x.dtype)),
    "neg": (F.neg, "__neg__", np.negative),
}


def fuzz_unary(name):
    functional, method, oracle = UNARY[name]

    @fuzz(name)
    def entry(draw):
        x = draw.float_operand(draw.shape(), draw.float_dtype())
        use_method = draw.boolean() and isinstance(x, Tensor)
        call = (lambda: getattr(x, method)()) if use_method else (lambda: functional(x))
        run(draw, name, call, lambda result: assert_close(name, result, oracle(x.numpy()), exact=name not in ("sigmoid",)))


for _name in UNARY:
    fuzz_unary(_name)


@fuzz("cast")
def _cast(draw):
    x = draw.float_operand(draw.shape(), draw.float_dtype())
    form = draw.choice(("function", "to", "float/double"))
    if form != "function" and not isinstance(x, Tensor):
        return
    if form == "float/double":
        target = draw.choice((np.float32, np.float64))
        call = (lambda: x.float()) if target == np.float32 else (lambda: x.double())
    else:
        target = draw.choice((np.float32, np.float64, "float32", mt.float64) * 3 + (np.int64, np.bool_, np.float16, "nonsense", None))
        if any(target is bad for bad in (np.int64, np.bool_, np.float16, "nonsense", None)):
            draw.mark_invalid(f"cast to {target}")
        call = (lambda: F.cast(x, target)) if form == "function" else (lambda: x.to(target))

    def expect(result):
        assert_close("cast", result, x.numpy().astype(target), exact=True)

    run(draw, "cast", call, expect)


test_fuzz = fuzz_test(__name__)
