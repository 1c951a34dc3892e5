"""A hypothesis fuzz test over the whole public API.

Every function of `microtensor.functional`, the Tensor's methods and operators, the constructors
and `gradcheck` are called with arguments drawn from valid and invalid domains: shapes (empty ones
included), dtypes (float32, float64, integers, bool, float16), values (ordinary, large, nan, inf,
huge), memory layouts (contiguous, transposed, strided), dims, ids and hyperparameters. Each call
must either

- return the right result: a Tensor of the expected dtype and shape whose values match a plain
  numpy computation written here (never microtensor's own code), and whose backward, when it needs
  one, runs and gives gradients of the inputs' shapes and dtypes; or
- raise a MicrotensorError (microtensor's one error type).

Any other exception fails the test: a raw numpy, Numba or Python error, a crash. A call whose
arguments were all drawn from a valid domain must return; one with an argument drawn from an invalid
domain must raise. The outcomes are counted and printed at the end of the module:

    fuzz: N calls: X returned correct results, Y raised MicrotensorError

HYPOTHESIS_PROFILE=thorough runs ten times as many examples (tests/conftest.py).
"""
import math
from collections import Counter

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import microtensor as mt
import microtensor.functional as F
from microtensor import MicrotensorError, Tensor

COUNTS = Counter()  # outcome -> calls; and (api name, outcome) -> calls
EXAMPLES = 4 * settings.default.max_examples  # per API entry: 100 by default, 32 without the JIT, 1200 thorough
KERNEL_SETS = ("readable",) if numba.config.DISABLE_JIT else ("readable", "fast")

# Forward values against numpy computed in the input's dtype: the same formulas, with sums taken in
# another order (and, in the fast set, e^x, tanh and erf from vectorizable formulas accurate to a
# few ulp): tolerances relative to the values' scale.
TOLERANCE = {np.dtype(np.float32): (2e-4, 2e-5), np.dtype(np.float64): (1e-9, 1e-11)}


@pytest.fixture(scope="module", autouse=True)
def report_counts(request):
    yield
    total = COUNTS["correct"] + COUNTS["raised"]
    lines = [f"fuzz: {total} calls: {COUNTS['correct']} returned correct results, {COUNTS['raised']} raised MicrotensorError"]
    names = sorted({key[0] for key in COUNTS if isinstance(key, tuple)})
    lines.append("  per entry (correct/raised): " + ", ".join(f"{n} {COUNTS[(n, 'correct')]}/{COUNTS[(n, 'raised')]}" for n in names))
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # shown in every run, not only with -rA
            reporter.write_line("")
            for line in lines:
                reporter.write_line(line)


# ================================================================================ drawing arguments


class Draw:
    """Choices from hypothesis (so failures shrink and replay), values from a numpy generator seeded
    by hypothesis, and a record of whether every argument came from a valid domain."""

    def __init__(self, data):
        self.data = data
        self.rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
        self.invalid = []  # why the call is invalid, if it is
        self.kernels = None  # the kernel set the call runs in (drawn by `run`)

    @property
    def valid(self):
        return not self.invalid

    def mark_invalid(self, why):
        self.invalid.append(why)

    def integer(self, low, high):
        return self.data.draw(st.integers(low, high))

    def boolean(self):
        return self.data.draw(st.booleans())

    def choice(self, options):
        return options[self.integer(0, len(options) - 1)]

    def shape(self, min_dims=0, max_dims=3, min_side=0, max_side=4):
        return tuple(self.integer(min_side, max_side) for _ in range(self.integer(min_dims, max_dims)))

    def broadcastable(self, shape):
        """A shape that broadcasts against `shape`, or (marked invalid) one that does not."""
        dropped = self.integer(0, len(shape))
        other = [1 if self.one_in(4) else n for n in shape[dropped:]]
        sizes = [i for i, n in enumerate(shape[dropped:]) if n != 1]  # where another size cannot broadcast
        if sizes and self.one_in(8):
            i = self.choice(sizes)
            other[i] = max(shape[dropped + i] + self.integer(1, 2), 2)  # neither equal nor 1
            self.mark_invalid("shapes do not broadcast")
        return tuple(other)

    def one_in(self, n):
        """True one time in n. The value that decides is a middle one, which hypothesis's preference
        for 0 and for the ends of a range does not pick more often."""
        return self.integer(0, n - 1) == n // 2

    def rarely(self):
        """True one time in five: how often an argument is drawn from an invalid domain."""
        return self.one_in(5)

    def float_dtype(self):
        return np.dtype(self.choice((np.float32, np.float64)))

    def values(self, shape, dtype):
        """Values of one kind: ordinary, large, with nan and inf, or huge (near the dtype's limit)."""
        size = math.prod(shape)
        kind = self.choice(("ordinary", "ordinary", "ordinary", "large", "special", "huge"))
        if kind == "ordinary":
            v = self.rng.uniform(-3, 3, size)
        elif kind == "large":
            v = self.rng.uniform(-1e3, 1e3, size)
        elif kind == "special":
            v = self.rng.uniform(-3, 3, size)
            picked = self.rng.random(size) < 0.25
            v[picked] = self.rng.choice([np.nan, np.inf, -np.inf], picked.sum())
        else:
            v = self.rng.uniform(-1, 1, size) * (1e30 if dtype == np.float32 else 1e200)
        return self.layout(v.astype(dtype).reshape(shape))

    def layout(self, array):
        """The same values stored contiguously, transposed or strided (a view into a larger array)."""
        kind = self.choice(("contiguous", "transposed", "strided"))
        if kind == "transposed" and array.ndim >= 2:
            return np.ascontiguousarray(array.T).T
        if kind == "strided" and array.ndim >= 1:
            padded = np.zeros(array.shape[:-1] + (2 * array.shape[-1],), dtype=array.dtype)
            padded[..., ::2] = array
            return padded[..., ::2]
        return array.copy()

    def tensor(self, shape, dtype=None, requires_grad=None):
        """A float tensor of `shape` (of a drawn float dtype unless given)."""
        dtype = self.float_dtype() if dtype is None else np.dtype(dtype)
        requires_grad = self.boolean() if requires_grad is None else requires_grad
        return Tensor(self.values(shape, dtype), requires_grad=requires_grad)

    def any_operand(self, shape, dtype):
        """For ops that move elements without arithmetic (reshape, permute, ...): a tensor of floats,
        integers or booleans, or (marked invalid) a list or a string."""
        kind = self.choice(("int", "bool", "list", "string")) if self.rarely() else "float"
        if kind == "float":
            return self.tensor(shape, dtype)
        if kind == "int":
            return Tensor(self.rng.integers(-3, 3, shape))
        if kind == "bool":
            return Tensor(self.rng.random(shape) < 0.5)
        self.mark_invalid(f"a {kind} where a tensor is needed")
        return np.atleast_1d(self.rng.standard_normal(shape)).tolist() if kind == "list" else "tensor"

    def float_operand(self, shape, dtype):
        """Usually a float tensor of `dtype`; sometimes (marked invalid) something an op needing a
        float Tensor must refuse: an integer or bool tensor, a float16 array, a list, a string."""
        kind = self.choice(("int tensor", "bool tensor", "float16 array", "list", "string")) if self.rarely() else "tensor"
        if kind == "tensor":
            return self.tensor(shape, dtype)
        self.mark_invalid(f"a {kind} where a float tensor is needed")
        if kind == "int tensor":
            return Tensor(self.rng.integers(-3, 3, shape))
        if kind == "bool tensor":
            return Tensor(self.rng.random(shape) < 0.5)
        if kind == "float16 array":
            return self.rng.standard_normal(shape).astype(np.float16)
        if kind == "list":
            return np.atleast_1d(self.rng.standard_normal(shape)).tolist()  # a list even for a 0-d shape
        return "tensor"

    def same_dtype_operand(self, shape, dtype):
        """Like float_operand, beside a tensor of `dtype`: sometimes (marked invalid) a float
        tensor of the other float dtype, which microtensor never casts silently."""
        if self.rarely() and self.boolean():
            self.mark_invalid("float32 meets float64")
            return self.tensor(shape, np.float64 if np.dtype(dtype) == np.float32 else np.float32)
        return self.float_operand(shape, dtype)

    def dim(self, ndim, allow_none=False):
        """A dim of a tensor with ndim dims: in range (either sign), or (marked invalid) out of
        range, a float or a bool."""
        if self.rarely():
            kind = self.choice(("out of range", "float", "bool"))
        else:
            kind = self.choice(("in range", "in range", "in range") + (("none",) if allow_none else ()))
        if kind == "none":
            return None
        if kind == "in range" and ndim > 0:
            return self.integer(-ndim, ndim - 1)
        self.mark_invalid(f"dim: {kind}")
        if kind == "float":
            return 0.0
        if kind == "bool":
            return True
        return self.choice((ndim, -ndim - 1, ndim + 3))

    def flag(self, name):
        """True or False, or (marked invalid) something that is neither."""
        if self.one_in(10):
            self.mark_invalid(f"{name} is not a bool")
            return self.choice((1, "yes", None))
        return self.boolean()


# ================================================================================ running one call


def run(draw, name, call, expect=None):
    """Make the call (inside a kernel set drawn here) and judge it. `expect(result)` checks a
    returned result against numpy (it runs only when the call returned)."""
    kernels = draw.kernels = draw.choice(KERNEL_SETS)
    try:
        with mt.using_kernels(kernels):
            result = call()
            if draw.valid and isinstance(result, Tensor):
                check_backward(name, result)
    except MicrotensorError as error:
        assert not draw.valid, f"{name}: a valid call raised {type(error).__name__}: {error}"
        COUNTS["raised"] += 1
        COUNTS[(name, "raised")] += 1
        return
    except Exception as error:  # noqa: BLE001  (any other type is the failure this test is for)
        pytest.fail(f"{name} raised {type(error).__name__} (not a MicrotensorError): {error} [kernels {kernels}; invalid: {draw.invalid}]")
    assert draw.valid, f"{name}: an invalid call ({'; '.join(draw.invalid)}) returned {result!r} instead of raising"
    if expect is not None:
        with np.errstate(all="ignore"):
            expect(result)
    COUNTS["correct"] += 1
    COUNTS[(name, "correct")] += 1


def check_backward(name, out):
    """Backward from a random upstream gradient runs, and every leaf's gradient has its shape and dtype."""
    if not out.requires_grad or out.dtype.kind != "f":
        return
    leaves = graph_leaves(out)
    for leaf in leaves:
        leaf.grad = None
    upstream = np.random.default_rng(0).standard_normal(out.shape).astype(out.dtype)
    out.backward(upstream)
    for leaf in leaves:
        assert leaf.grad is not None and leaf.grad.shape == leaf.shape and leaf.grad.dtype == leaf.dtype, (
            f"{name}: the gradient of a leaf of shape {leaf.shape} {leaf.dtype} came back as "
            f"{None if leaf.grad is None else (leaf.grad.shape, leaf.grad.dtype)}"
        )


def graph_leaves(out):
    leaves, seen, stack = [], set(), [out]
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if t._ctx is None:
            leaves.append(t)
        else:
            stack.extend(i for i in t._ctx.inputs if isinstance(i, Tensor) and i.requires_grad)
    return leaves


def assert_close(name, result, expected, dtype=None, scale=None, exact=False):
    """result: a Tensor whose values, dtype and shape match `expected` (a numpy array)."""
    assert isinstance(result, Tensor), f"{name}: returned {type(result).__name__}, expected a Tensor"
    expected = np.asarray(expected)
    dtype = expected.dtype if dtype is None else np.dtype(dtype)
    assert result.dtype == dtype, f"{name}: dtype {result.dtype}, expected {dtype}"
    assert result.shape == expected.shape, f"{name}: shape {result.shape}, expected {expected.shape}"
    got = result.numpy()
    if exact or dtype.kind != "f":
        np.testing.assert_array_equal(got, expected, err_msg=name)
        return
    rtol, atol = TOLERANCE[dtype]
    if scale is None:
        finite = np.abs(expected[np.isfinite(expected)])
        scale = max(1.0, float(finite.max())) if finite.size else 1.0
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol * scale, equal_nan=True, err_msg=name)


def array_of(value, dtype=None):
    """The numpy values of an operand (a Tensor, array or number), for the oracles."""
    if isinstance(value, Tensor):
        return value.numpy()
    return np.asarray(value, dtype=dtype)


def fuzz(name):
    """Register a fuzzing function for one API entry: fn(draw) makes one call through `run`."""

    def register(function):
        ENTRIES[name] = function
        return function

    return register


ENTRIES = {}


# ================================================================================ elementwise ops

BINARY = {
    "add": (F.add, np.add, lambda a, b: a + b),
    "sub": (F.sub, np.subtract, lambda a, b: a - b),
    "mul": (F.mul, np.multiply, lambda a, b: a * b),
    "div": (F.div, np.divide, lambda a, b: a / b),
    "pow": (F.pow, np.power, lambda a, b: a**b),
}


def other_operand(draw, shape, dtype):
    """The second operand of a binary op: a tensor, a Python or numpy number, a numpy array, or
    (marked invalid) a bool, a string, a list or a mismatched float array."""
    if draw.rarely():
        kind = draw.choice(("bool", "string", "list", "other float array"))
    else:
        kind = draw.choice(("tensor", "tensor", "tensor", "python number", "numpy number", "int array", "float array"))
    if kind == "tensor":
        return draw.same_dtype_operand(draw.broadcastable(shape), dtype)
    if kind == "python number":
        return draw.choice((2, -1, 0.5, 0.0, float("nan"), float("inf"), 10**30, 1e300))
    if kind == "numpy number":
        return draw.choice((np.float64(1.5), np.int64(3), np.float32(-2.0)))
    if kind == "int array":
        return draw.rng.integers(-3, 4, draw.broadcastable(shape))
    if kind == "float array":
        return draw.values(draw.broadcastable(shape), dtype)
    draw.mark_invalid(f"a {kind} as an operand")
    if kind == "bool":
        return True
    if kind == "string":
        return "2"
    if kind == "list":
        return [1.0, 2.0]
    return draw.values(draw.broadcastable(shape), np.float64 if dtype == np.float32 else np.float32)


def is_operator_operand(value):
    """Python hands `value op tensor` to the Tensor only for operands whose own operator gives way
    (numbers, numpy values, other Tensors); a list or a string raises its own TypeError first."""
    return not isinstance(value, (list, str))


def oracle_operand(value, dtype):
    """What an operand is in the op: a tensor's values; a float array as it is; an integer array or
    a number in the other operand's dtype."""
    if isinstance(value, Tensor):
        return value.numpy()
    if isinstance(value, np.ndarray):
        return value if value.dtype.kind == "f" else value.astype(dtype)
    with np.errstate(over="ignore"):
        return np.asarray(float(value), dtype=dtype)


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


# ================================================================================ matmul


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


# ================================================================================ reductions

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


# ================================================================================ shape ops


@fuzz("reshape")
def _reshape(draw):
    x = draw.any_operand(draw.shape(), draw.float_dtype())
    size = x.numpy().size if isinstance(x, Tensor) else 6
    kind = draw.choice(("exact", "exact", "minus one", "wrong size", "two minus ones", "float size", "negative"))
    if kind in ("exact", "minus one"):
        shape = [size] if size == 0 else []
        rest = size
        while rest > 1:  # a random factorization of the size
            factor = draw.choice([f for f in range(2, rest + 1) if rest % f == 0])
            shape.append(factor)
            rest //= factor
        if draw.boolean():
            shape.insert(draw.integer(0, len(shape)), 1)
        if kind == "minus one" and shape and size > 0:
            shape[draw.integer(0, len(shape) - 1)] = -1
    else:
        draw.mark_invalid(f"shape: {kind}")
        shape = {"wrong size": [size + 1], "two minus ones": [-1, -1], "float size": [float(size)], "negative": [-2, -size]}[kind]
    form = draw.choice(("function", "method", "view", "tuple"))
    if form != "function" and not isinstance(x, Tensor):
        return
    call = {
        "function": lambda: F.reshape(x, *shape),
        "method": lambda: x.reshape(*shape),
        "view": lambda: x.view(*shape),
        "tuple": lambda: x.reshape(tuple(shape)),
    }[form]
    run(draw, "reshape", call, lambda result: assert_close("reshape", result, x.numpy().reshape(shape), exact=True))


@fuzz("flatten")
def _flatten(draw):
    x = draw.any_operand(draw.shape(), draw.float_dtype())
    ndim = x.ndim if isinstance(x, Tensor) else 1
    start, end = draw.dim(max(ndim, 1)), draw.dim(max(ndim, 1))
    if draw.valid and ndim > 0 and start % ndim > end % ndim:
        draw.mark_invalid("start_dim after end_dim")

    def expect(result):
        values = x.numpy()
        if values.ndim == 0:
            expected = values.reshape(1)
        else:
            s, e = start % values.ndim, end % values.ndim
            expected = values.reshape(values.shape[:s] + (math.prod(values.shape[s : e + 1]),) + values.shape[e + 1 :])
        assert_close("flatten", result, expected, exact=True)

    run(draw, "flatten", lambda: F.flatten(x, start, end), expect)


@fuzz("permute")
def _permute(draw):
    x = draw.any_operand(draw.shape(), draw.float_dtype())
    if not isinstance(x, Tensor):
        run(draw, "permute", lambda: F.permute(x, 0, 1))
        return
    ndim = x.ndim
    dims = [int(i) for i in draw.rng.permutation(ndim)]
    kind = draw.choice(("permutation",) * 4 + ("repeated", "missing", "out of range"))
    if kind == "repeated" and ndim >= 2:
        dims[0] = dims[1]
        draw.mark_invalid("a dim twice")
    elif kind == "missing" and ndim >= 1:
        dims = dims[:-1]
        draw.mark_invalid("a dim missing")
    elif kind == "out of range":
        dims = dims + [ndim + 1]
        draw.mark_invalid("a dim out of range")
    dims = [d - ndim if draw.boolean() else d for d in dims]  # either sign
    form = draw.choice(("function", "method", "tuple", "T", "transpose", "functional transpose"))
    if form != "function" and not isinstance(x, Tensor):
        return
    if form in ("T", "transpose", "functional transpose"):
        draw.invalid = [why for why in draw.invalid if why.startswith("a ") and "where a tensor" in why]  # dims are not used
    if form == "T":
        dims = list(reversed(range(ndim)))
        call = lambda: x.T  # noqa: E731
    elif form in ("transpose", "functional transpose"):
        d0, d1 = draw.dim(ndim), draw.dim(ndim)
        dims = list(range(ndim))
        if draw.valid:
            dims[d0], dims[d1] = dims[d1], dims[d0]
        call = (lambda: x.transpose(d0, d1)) if form == "transpose" else (lambda: F.transpose(x, d0, d1))  # noqa: E731
    else:
        call = {"function": lambda: F.permute(x, *dims), "method": lambda: x.permute(*dims), "tuple": lambda: x.permute(tuple(dims))}[form]
    run(draw, "permute", call, lambda result: assert_close("permute", result, np.transpose(x.numpy(), [d % ndim for d in dims]), exact=True))


def an_index(draw, shape):
    """An index for a tensor of `shape`: ints (some out of range), slices, None, Ellipsis, integer
    arrays (repeats allowed), a boolean mask, floats, too many indices."""
    if draw.one_in(6):
        return np.asarray(draw.rng.random(shape) < 0.5)  # a boolean mask of the whole shape
    parts = []
    for n in shape[: draw.integer(0, len(shape))]:
        if draw.one_in(6):
            parts.append(None)  # a new dim of size 1: it takes none of x's dims
        kind = draw.choice(("int", "slice", "slice", "array", "out of range", "float"))
        if kind == "int" and n > 0:
            parts.append(draw.integer(-n, n - 1))
        elif kind == "slice":
            parts.append(slice(draw.integer(-5, 5), draw.integer(-5, 5), draw.choice((None, 1, 2, -1, -2))))
        elif kind == "array" and n > 0:
            parts.append(draw.rng.integers(-n, n, draw.integer(0, 4)))
        elif kind == "float":
            parts.append(0.5)
        else:
            parts.append(n + draw.integer(0, 2))
    if draw.one_in(10):
        parts.insert(draw.integer(0, len(parts)), Ellipsis)
    if draw.one_in(15):
        parts.extend([0] * (len(shape) + 1))
    return tuple(parts) if len(parts) != 1 or draw.boolean() else parts[0]


@fuzz("getitem")
def _getitem(draw):
    x = draw.tensor(draw.shape(0, 3, 0, 4))
    index = an_index(draw, x.shape)
    try:  # numpy's indexing rules decide which index is valid; microtensor follows them
        np.empty(x.shape)[index]
    except IndexError:
        draw.mark_invalid("an index numpy refuses")
    if isinstance(index, tuple) and draw.one_in(5):  # an integer array as a Tensor
        index = tuple(Tensor(p) if isinstance(p, np.ndarray) else p for p in index)

    def expect(result):
        numpy_index = tuple(p.numpy() if isinstance(p, Tensor) else p for p in index) if isinstance(index, tuple) else index
        assert_close("getitem", result, np.asarray(x.numpy()[numpy_index]), exact=True)

    run(draw, "getitem", lambda: x[index], expect)


def tensor_list(draw, op):
    """A list of float tensors that fit together for concat along `dim` or stack, or (marked
    invalid) that do not, or not a list of Tensors at all."""
    shape, dtype = draw.shape(0, 3, 0, 3), draw.float_dtype()
    count = draw.integer(1, 3)
    kind = draw.choice(("fit",) * 6 + ("empty", "a Tensor", "a list holding a number", "shapes differ", "dims differ"))
    dim = draw.dim(len(shape) + (1 if op == "stack" else 0))
    if kind == "empty":
        draw.mark_invalid("an empty list")
        return [], dim
    if kind == "a Tensor":
        draw.mark_invalid("a Tensor instead of a list")
        return draw.tensor(shape, dtype), dim
    tensors = []
    for i in range(count):
        this = list(shape)
        if op == "concat" and draw.valid and this:
            this[dim % len(this)] = draw.integer(0, 3)  # concat: the joined dim may differ
        tensors.append(draw.float_operand(tuple(this), dtype) if i == 0 else draw.same_dtype_operand(tuple(this), dtype))
    if kind == "a list holding a number":
        tensors.append(2.0)
        draw.mark_invalid("a number in the list")
    elif kind == "shapes differ" and shape:
        other = list(shape)
        i = draw.integer(0, len(other) - 1)
        if op == "stack" or not draw.valid or i != dim % len(other):
            other[i] += 1
            tensors.append(draw.tensor(tuple(other), dtype))
            draw.mark_invalid("shapes differ")
    elif kind == "dims differ":
        tensors.append(draw.tensor(shape + (1,), dtype))
        draw.mark_invalid("dims differ")
    if op == "concat" and not shape:
        draw.mark_invalid("concat of 0-d tensors")
    return tensors, dim


@fuzz("concat")
def _concat(draw):
    tensors, dim = tensor_list(draw, "concat")
    function = draw.choice((F.concat, F.cat, mt.concat, mt.cat))
    run(draw, "concat", lambda: function(tensors, dim), lambda result: assert_close("concat", result, np.concatenate([t.numpy() for t in tensors], axis=dim), exact=True))


@fuzz("stack")
def _stack(draw):
    tensors, dim = tensor_list(draw, "stack")
    function = draw.choice((F.stack, mt.stack))
    run(draw, "stack", lambda: function(tensors, dim), lambda result: assert_close("stack", result, np.stack([t.numpy() for t in tensors], axis=dim), exact=True))


@fuzz("split")
def _split(draw):
    x = draw.tensor(draw.shape(1, 3, 0, 5))
    dim = draw.dim(x.ndim)
    length = x.shape[dim] if draw.valid else 0
    kind = draw.choice(("size", "sections", "zero size", "bad sections", "float"))
    if kind == "size":
        sections = draw.integer(1, 4)
    elif kind == "sections":
        cuts = sorted(draw.integer(0, length) for _ in range(draw.integer(0, 3)))
        sections = [b - a for a, b in zip([0] + cuts, cuts + [length])]
    else:
        draw.mark_invalid(f"split: {kind}")
        sections = {"zero size": 0, "bad sections": [length + 1], "float": 2.0}[kind]
    function = draw.choice((F.split, mt.split, "method"))
    call = (lambda: x.split(sections, dim)) if function == "method" else (lambda: function(x, sections, dim))

    def expect(pieces):
        assert isinstance(pieces, tuple)
        sizes = [sections] * math.ceil(length / sections) if isinstance(sections, int) else sections
        starts = np.cumsum([0] + list(sizes))
        expected = [np.take(x.numpy(), range(a, min(b, length)), axis=dim) for a, b in zip(starts[:-1], starts[1:])]
        assert len(pieces) == len(expected), f"split: {len(pieces)} pieces, expected {len(expected)}"
        for piece, values in zip(pieces, expected):
            assert_close("split", piece, values, exact=True)

    run(draw, "split", call, expect)


def a_mask(draw, shape, name="mask"):
    """A boolean mask that broadcasts to `shape` (a Tensor, an array or a list), or (marked
    invalid) one that does not, or that is not boolean."""
    mask_shape = draw.broadcastable(shape)
    kind = draw.choice(("array", "array", "tensor", "list", "floats", "ints"))
    values = draw.rng.random(mask_shape) < 0.5
    if kind == "tensor":
        return Tensor(values)
    if kind == "list" and values.size:  # (a list of an empty shape loses the dims after the first 0)
        return values.tolist() if values.ndim else bool(values)
    if kind in ("floats", "ints"):
        draw.mark_invalid(f"a {name} of {kind}")
        return values.astype(np.float64 if kind == "floats" else np.int64)
    return values


@fuzz("masked_fill")
def _masked_fill(draw):
    x = draw.float_operand(draw.shape(), draw.float_dtype())
    shape = x.shape if isinstance(x, Tensor) else (2,)
    mask = a_mask(draw, shape)  # marked invalid when it does not broadcast to x's shape
    value = draw.choice((0.0, -1.5, float("-inf"), float("nan"), 3, np.float32(2.0)) * 2 + ("a", True, None))
    if value in ("a", None) or value is True:
        draw.mark_invalid("a value that is not a number")
    method = draw.boolean() and isinstance(x, Tensor)
    call = (lambda: x.masked_fill(mask, value)) if method else (lambda: F.masked_fill(x, mask, value))

    def expect(result):
        m = mask.numpy() if isinstance(mask, Tensor) else np.asarray(mask)
        expected = np.where(m, np.asarray(float(value)).astype(x.dtype), x.numpy())
        assert_close("masked_fill", result, expected, exact=True)

    run(draw, "masked_fill", call, expect)


@fuzz("where")
def _where(draw):
    shape, dtype = draw.shape(), draw.float_dtype()
    condition = a_mask(draw, shape, "condition")
    a = draw.float_operand(shape, dtype)  # of the full shape: each other operand broadcasts to it, or is marked invalid
    b = other_operand(draw, shape, dtype)
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        draw.mark_invalid("no Tensor operand")
    if draw.boolean():
        a, b = b, a
    function = draw.choice((F.where, mt.where))

    def expect(result):
        like = (a if isinstance(a, Tensor) else b).dtype
        c = condition.numpy() if isinstance(condition, Tensor) else np.asarray(condition)
        assert_close("where", result, np.where(c, oracle_operand(a, like), oracle_operand(b, like)), dtype=like, exact=True)

    run(draw, "where", lambda: function(condition, a, b), expect)


# ================================================================================ softmax and the loss


def softmax_oracle(x, axis):
    shifted = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(shifted)
    return e / np.sum(e, axis=axis, keepdims=True)


def log_softmax_oracle(x, axis):
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


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


@fuzz("cross_entropy")
def _cross_entropy(draw):
    low = 0 if draw.rarely() else 1  # no rows at all: nothing to average over
    rows = draw.choice(((draw.integer(low, 4),), (draw.integer(low, 2), draw.integer(low, 3))))
    vocab = draw.integer(0 if draw.rarely() else 1, 5)
    logits = draw.float_operand(rows + (vocab,), draw.float_dtype())
    if draw.one_in(10):
        logits = draw.tensor(rows, requires_grad=False)  # no class dim
        draw.mark_invalid("logits of the wrong shape")
    ignore_index = draw.choice((1.5, True)) if draw.rarely() and draw.boolean() else draw.choice((-100, None, -1, -100, None, 0, 2))
    ignores = isinstance(ignore_index, int) and not isinstance(ignore_index, bool)
    if ignore_index is not None and not ignores:
        draw.mark_invalid("ignore_index not an int")
    targets = draw.rng.integers(-1, vocab + 1, rows) if draw.rarely() else draw.rng.integers(0, max(vocab, 1), rows)  # or some out of range
    if ignores:
        targets[draw.rng.random(rows) < 0.3] = ignore_index
    kind = draw.choice(("float tensor", "list", "wrong shape")) if draw.rarely() else draw.choice(("int64 tensor", "int32 tensor", "uint8 array"))
    if kind == "uint8 array" and targets.size and targets.min() < 0:
        kind = "int64 tensor"  # uint8 holds no negative target
    kept = [int(t) for t in targets.reshape(-1) if not (ignores and t == ignore_index)]
    if any(t < 0 or t >= vocab for t in kept):
        draw.mark_invalid("a target out of range")
    if not kept:
        draw.mark_invalid("no target to average over")
    if kind in ("float tensor", "list"):
        draw.mark_invalid(f"targets as a {kind}")
    if kind == "wrong shape":
        targets = targets.reshape(-1)[:-1] if targets.size else np.zeros(3, np.int64)
        draw.mark_invalid("targets of the wrong shape")
    argument = {
        "int64 tensor": lambda: Tensor(targets.astype(np.int64)),
        "int32 tensor": lambda: Tensor(targets.astype(np.int32)),
        "uint8 array": lambda: targets.astype(np.uint8),
        "float tensor": lambda: Tensor(targets.astype(np.float32)),
        "list": lambda: targets.tolist(),
        "wrong shape": lambda: Tensor(targets),
    }[kind]()

    def expect(result):
        x = logits.numpy().reshape(-1, vocab).astype(np.float64)
        t = targets.reshape(-1)
        keep = t != ignore_index if ignores else np.ones(t.shape, bool)
        expected = -np.mean(log_softmax_oracle(x[keep], 1)[np.arange(keep.sum()), t[keep]])
        scale = max(1.0, float(np.max(np.abs(np.nan_to_num(x, posinf=0, neginf=0)), initial=0)))
        assert_close("cross_entropy", result, np.asarray(expected, dtype=logits.dtype), scale=scale)

    run(draw, "cross_entropy", lambda: F.cross_entropy(logits, argument, ignore_index), expect)


# ================================================================================ norms and activations


def an_eps(draw, name="eps"):
    eps = draw.choice((0.0, -1e-5, float("nan"), float("inf"), "small", True)) if draw.rarely() else draw.choice((1e-5, 1e-3, 1.0, np.float32(1e-6)))
    if not (isinstance(eps, (float, np.floating)) and math.isfinite(eps) and eps > 0):
        draw.mark_invalid(f"{name} = {eps!r}")
    return eps


def optional_vector(draw, size, dtype, name):
    """None, a (size,) tensor, or (marked invalid) one of another size, dtype or kind."""
    kind = draw.choice(("wrong size", "other")) if draw.rarely() and draw.boolean() else draw.choice(("none", "vector"))
    if kind == "none":
        return None
    if kind == "wrong size":
        draw.mark_invalid(f"{name} of the wrong size")
        return draw.tensor((size + 1,), dtype)
    if kind == "other":
        return draw.same_dtype_operand((size,), dtype)
    return draw.tensor((size,), dtype)


def layer_norm_oracle(x, weight, bias, eps):
    mean = x.mean(axis=-1, keepdims=True)
    y = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + x.dtype.type(eps))
    y = y if weight is None else y * weight
    return y if bias is None else y + bias


def assert_norm_close(name, result, expected, values):
    """As assert_close, where a row whose sum of squares overflows the dtype (|x| past about 1e19 in
    float32) may also come out as NaN: numpy gives 0 there (x / sqrt(inf)), and a kernel whose
    1 / sqrt(v) is computed as an estimate refined by Newton's method gives inf * 0 = NaN. Neither is
    the true value, and NaN at least says so."""
    with np.errstate(over="ignore", invalid="ignore"):
        squares = np.sum(np.square(values.astype(np.float64)), axis=-1, keepdims=True) if values.size else np.zeros(values.shape[:-1] + (1,))
    overflowed = np.broadcast_to(squares > np.finfo(values.dtype).max / 4, values.shape)
    got = result.numpy() if isinstance(result, Tensor) else result
    if isinstance(result, Tensor) and overflowed.any():
        expected = np.where(overflowed & np.isnan(got), got, expected)
    assert_close(name, result, expected)


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


@fuzz("embedding")
def _embedding(draw):
    vocab, dim, dtype = draw.integer(0, 5), draw.integer(0, 4), draw.float_dtype()
    weight = draw.float_operand((vocab, dim), dtype)
    if draw.one_in(10):
        weight = draw.tensor((vocab,), dtype)
        draw.mark_invalid("a 1-d table")
    ids = draw.rng.integers(-1, vocab + 1, draw.shape(0, 2)) if draw.rarely() else draw.rng.integers(0, max(vocab, 1), draw.shape(0, 2))
    if draw.valid and ids.size and (ids.min() < 0 or ids.max() >= vocab):
        draw.mark_invalid("an id out of range")
    kind = draw.choice(("float tensor", "bool array", "huge")) if draw.rarely() else draw.choice(("int64 tensor", "int32 array", "list"))
    if kind == "list" and ids.size == 0:
        kind = "int32 array"  # (a list of an empty shape loses the dims after the first 0)
    if kind == "float tensor" or kind == "bool array":
        draw.mark_invalid(f"ids as a {kind}")
    if kind == "huge":
        ids = np.array([10**6, 2**40], np.int64)[: draw.integer(1, 2)]
        draw.mark_invalid("an id far out of range")
    argument = {
        "int64 tensor": lambda: Tensor(ids.astype(np.int64)),
        "int32 array": lambda: ids.astype(np.int32),
        "list": lambda: ids.tolist(),
        "float tensor": lambda: Tensor(ids.astype(np.float64)),
        "bool array": lambda: ids > 0,
        "huge": lambda: Tensor(ids),
    }[kind]()
    run(draw, "embedding", lambda: F.embedding(argument, weight), lambda result: assert_close("embedding", result, weight.numpy()[ids], exact=True))


@fuzz("dropout")
def _dropout(draw):
    x = draw.float_operand(draw.shape(), draw.float_dtype())
    p = draw.choice((1.0, -0.1, float("nan"), "half", True)) if draw.rarely() else draw.choice((0.0, 0.1, 0.5, 0.9, np.float32(0.25)))
    if not (isinstance(p, (float, np.floating)) and 0 <= p < 1):
        draw.mark_invalid(f"p = {p!r}")
    training = draw.flag("training")
    generator = draw.choice((None, "seeded", "seeded", 7))
    if generator == 7:
        draw.mark_invalid("a generator that is not a numpy Generator")
    elif generator == "seeded":
        generator = np.random.default_rng(draw.integer(0, 100))

    def expect(result):
        values = x.numpy()
        if not training or p == 0:
            assert result is x, "dropout: without training, or with p = 0, the input itself"
            return
        assert result.shape == values.shape and result.dtype == values.dtype
        got = result.numpy()
        kept_value = values * (values.dtype.type(1) / values.dtype.type(1 - p))
        kept = np.isclose(got, kept_value, rtol=TOLERANCE[values.dtype][0], atol=0, equal_nan=True)
        dropped = (got == 0) | (~np.isfinite(values) & np.isnan(got))  # inf * 0 is nan
        assert np.all(kept | dropped), "dropout: an element neither kept (scaled by 1 / (1 - p)) nor zeroed"

    run(draw, "dropout", lambda: F.dropout(x, p, training, generator), expect)


# ================================================================================ attention and rope


def attention_oracle(q, k, v, causal, slopes=None):
    """softmax(q kᵀ / √D - slope_h |pos_i - j|, masked) v in float64, the queries the last Tq
    positions; slopes None (no bias) or (H,) for q (B, H, Tq, D)."""
    Tq, Tk, D = q.shape[-2], k.shape[-2], q.shape[-1]
    scores = q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2) / math.sqrt(D)  # (..., Tq, Tk)
    if slopes is not None:
        distance = np.abs((Tk - Tq + np.arange(Tq))[:, None] - np.arange(Tk)[None, :])  # (Tq, Tk)
        scores = scores - np.asarray(slopes, dtype=np.float64)[:, None, None] * distance  # (B, H, Tq, Tk)
    visible = np.arange(Tk)[None, :] <= (Tk - Tq + np.arange(Tq))[:, None] if causal else np.ones((Tq, Tk), bool)
    scores = np.where(visible, scores, -np.inf)
    if scores.size == 0:
        return np.zeros(q.shape[:-1] + (v.shape[-1],))
    probs = softmax_oracle(scores, -1)
    # O_i = sum over the keys query i sees of P_ij v_j: a masked key adds nothing, even a nan or inf
    # one (a product P v would add 0 * inf = nan)
    terms = probs[..., :, :, None] * v.astype(np.float64)[..., None, :, :]  # (..., Tq, Tk, D)
    return np.where(visible[:, :, None], terms, 0.0).sum(axis=-2)


def attention_tolerance(q, k, v, dtype):
    """The absolute tolerance of attention's output: the output is a weighted mean of rows of v, and
    an error of δ in a score changes the weights by a factor up to e^δ; the scores' rounding error
    grows with their size, D max|q| max|k| / √D, times the dtype's epsilon."""
    def largest(a):
        return float(np.max(np.abs(a.astype(np.float64)), initial=0))

    D = q.shape[-1]
    score_size = D * largest(q) * largest(k) / math.sqrt(max(D, 1))
    rtol, atol = TOLERANCE[np.dtype(dtype)]
    return max(1.0, largest(v)) * (atol + 16 * np.finfo(dtype).eps * score_size)


def attention_check(name, result, q, k, v, expected, dtype, kernels, causal):
    assert result.dtype == dtype and result.shape == expected.shape, f"{name}: {result.dtype} {result.shape}"
    if attention_tolerance(q, k, v, dtype) > 1e20:
        return  # scores beyond the dtype's range (huge values): float64's answer says nothing of float32's
    if not all(np.all(np.isfinite(a)) for a in (q, k, v)):
        finite = np.isfinite(result.numpy())
        if kernels == "fast" and causal and not np.all(np.isfinite(v)):
            # The fast set multiplies P by all of v with BLAS, so a nan or inf in a masked key's v
            # (P = 0 there) gives 0 * inf = nan where the readable set, skipping masked keys,
            # gives a number: only the non-finite values numpy has are required.
            np.testing.assert_array_equal(finite & np.isfinite(expected), finite, err_msg=name)
            return
        np.testing.assert_array_equal(finite, np.isfinite(expected), err_msg=name)  # nan and inf where numpy has them
        return
    rtol = TOLERANCE[np.dtype(dtype)][0]
    np.testing.assert_allclose(result.numpy(), expected, rtol=rtol, atol=attention_tolerance(q, k, v, dtype), err_msg=name)


@fuzz("multi_head_attention")
def _multi_head_attention(draw):
    B, T, H, D = draw.integer(0, 2), draw.integer(0, 4), draw.integer(1, 3), draw.integer(0 if draw.rarely() else 1, 3)
    qkv = draw.float_operand((B, T, 3 * H * D), draw.float_dtype())
    n_head = draw.choice((0, -1, H + 1, float(H), True)) if draw.rarely() else H
    if n_head is True or isinstance(n_head, float) or n_head < 1:
        draw.mark_invalid(f"n_head = {n_head!r}")
    elif draw.valid and (H * D) % n_head:
        draw.mark_invalid("n_head does not divide C")
    if D == 0:
        draw.mark_invalid("C = 0")
    if draw.one_in(15):
        qkv = draw.tensor((B, T), requires_grad=False)
        draw.mark_invalid("a 2-d qkv")
    causal = draw.flag("causal")

    def expect(result):
        values = qkv.numpy()
        C = values.shape[-1] // 3
        heads = values.reshape(B, T, 3, n_head, C // n_head).transpose(2, 0, 3, 1, 4)
        out = attention_oracle(heads[0], heads[1], heads[2], causal).transpose(0, 2, 1, 3).reshape(B, T, C)
        attention_check("multi_head_attention", result, heads[0], heads[1], heads[2], out.astype(values.dtype), values.dtype, draw.kernels, causal)

    run(draw, "multi_head_attention", lambda: F.multi_head_attention(qkv, n_head, causal), expect)


@fuzz("scaled_dot_product_attention")
def _scaled_dot_product_attention(draw):
    B, H, Tq, D = draw.integer(0, 2), draw.integer(0, 2), draw.integer(0, 3), draw.integer(0 if draw.rarely() else 1, 3)
    Tk = Tq + draw.integer(0, 2)
    causal = draw.flag("causal")
    if draw.one_in(8) and Tq > 0:
        Tk = Tq - 1
        if causal is True:
            draw.mark_invalid("Tk < Tq, causal")
    dtype = draw.float_dtype()
    q = draw.float_operand((B, H, Tq, D), dtype)
    k = draw.same_dtype_operand((B, H, Tk, D), dtype)
    v_shape = (B, H, Tk, D)
    if draw.one_in(10):
        v_shape = (B, H, Tk, D + 1)
        draw.mark_invalid("v of another shape")
    v = draw.same_dtype_operand(v_shape, dtype)
    if D == 0 or (Tk == 0 and Tq > 0 and B * H > 0):
        draw.mark_invalid("D = 0, or queries without keys")

    def expect(result):
        arrays = [t.numpy() for t in (q, k, v)]
        out = attention_oracle(*arrays, causal).astype(dtype)
        attention_check("scaled_dot_product_attention", result, *arrays, out, dtype, draw.kernels, causal)

    run(draw, "scaled_dot_product_attention", lambda: F.scaled_dot_product_attention(q, k, v, causal), expect)


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


def alibi_oracle(n):
    """The ALiBi paper's slopes: for a power of two n the geometric sequence from 2^(-8/n) with
    ratio 2^(-8/n); otherwise those of the largest power of two p below n, then the odd-numbered
    (1st, 3rd, ...) of those of 2p heads, until there are n."""
    def geometric(count):
        start = 2.0 ** (-8.0 / count)
        return [start ** (i + 1) for i in range(count)]

    p = 2 ** math.floor(math.log2(n))
    return np.array(geometric(p) + geometric(2 * p)[0::2][: n - p])


@fuzz("alibi_slopes")
def _alibi_slopes(draw):
    n = draw.choice((0, -1, 2.0, True, "4", None)) if draw.rarely() else draw.choice((1, 2, 3, 4, 5, 6, 8, 12, 16, np.int64(7)))
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        draw.mark_invalid(f"n_head = {n!r}")

    def expect(result):
        assert isinstance(result, np.ndarray) and result.dtype == np.float64, f"alibi_slopes: {type(result).__name__} {getattr(result, 'dtype', None)}"
        np.testing.assert_allclose(result, alibi_oracle(int(n)), rtol=1e-14, atol=0, err_msg="alibi_slopes")

    run(draw, "alibi_slopes", lambda: F.alibi_slopes(n), expect)


def some_slopes(draw, n_head, dtype):
    """None, or n_head slopes as a list, a numpy array or a constant Tensor (ALiBi's or any finite
    numbers); rarely (marked invalid) of the wrong length, with a nan, or a Tensor that requires grad.
    Returns (the argument, the slopes in the op's dtype as float64, or None)."""
    kind = draw.choice(("wrong length", "nan", "requires grad")) if draw.rarely() and draw.boolean() else draw.choice(("none", "none", "alibi", "list", "array", "tensor"))
    if kind == "none":
        return None, None
    values = alibi_oracle(n_head) if kind == "alibi" else draw.rng.uniform(-1, 1, n_head)
    if kind == "wrong length":
        values = np.append(values, 0.5)
    if kind == "nan":
        values[draw.integer(0, n_head - 1)] = np.nan
    if kind in ("wrong length", "nan", "requires grad"):
        draw.mark_invalid(f"alibi_slopes: {kind}")
    expected = values.astype(dtype).astype(np.float64)
    if kind in ("list", "nan"):
        return values.tolist(), expected
    if kind in ("tensor", "requires grad"):
        return Tensor(values.astype(dtype), requires_grad=kind == "requires grad"), expected
    return values, expected


def a_tile_size(draw):
    tile_size = draw.choice((0, -2, 1.5, True)) if draw.rarely() and draw.boolean() else draw.choice((None, 1, 2, 3, 128, np.int64(2)))
    if tile_size is not None and (not isinstance(tile_size, (int, np.integer)) or isinstance(tile_size, bool) or tile_size < 1):
        draw.mark_invalid(f"tile_size = {tile_size!r}")
    return tile_size


@fuzz("online_attention")
def _online_attention(draw):
    B, Hk, group, Tq, D = draw.integer(0, 2), draw.integer(1, 2), draw.integer(1, 2), draw.integer(0, 3), draw.integer(0 if draw.rarely() else 1, 3)
    H = Hk * group
    Tk = Tq + draw.integer(0, 2)
    causal = draw.flag("causal")
    if draw.one_in(8) and Tq > 0:
        Tk = Tq - 1
        if causal is True:
            draw.mark_invalid("Tk < Tq, causal")
    if draw.one_in(10):
        Hk, H = 2, 3
        draw.mark_invalid("Hk does not divide H")
    dtype = draw.float_dtype()
    q = draw.float_operand((B, H, Tq, D), dtype)
    k = draw.same_dtype_operand((B, Hk, Tk, D), dtype)
    v_shape = (B, Hk, Tk, D)
    if draw.one_in(10):
        v_shape = (B, Hk, Tk, D + 1)
        draw.mark_invalid("v of another shape")
    v = draw.same_dtype_operand(v_shape, dtype)
    if D == 0 or (Tk == 0 and Tq > 0 and B * H > 0):
        draw.mark_invalid("D = 0, or queries without keys")
    slopes, slope_values = some_slopes(draw, H, dtype)
    tile_size = a_tile_size(draw)

    def expect(result):
        qa, ka, va = (t.numpy() for t in (q, k, v))
        ka, va = np.repeat(ka, H // Hk, axis=1), np.repeat(va, H // Hk, axis=1)  # (B, H, Tk, D): head h reads h // (H / Hk)
        out = attention_oracle(qa, ka, va, causal, slope_values).astype(dtype)
        attention_check("online_attention", result, qa, ka, va, out, dtype, draw.kernels, causal)

    run(draw, "online_attention", lambda: F.online_attention(q, k, v, causal, slopes, tile_size), expect)


@fuzz("multi_head_online_attention")
def _multi_head_online_attention(draw):
    B, T, Hk, group, D = draw.integer(0, 2), draw.integer(0, 4), draw.integer(1, 2), draw.integer(1, 2), draw.integer(0 if draw.rarely() else 1, 3)
    H = Hk * group
    dtype = draw.float_dtype()
    qkv = draw.float_operand((B, T, (H + 2 * Hk) * D), dtype)
    n_head = draw.choice((0, -1, float(H), True)) if draw.rarely() and draw.boolean() else H
    if n_head is not H:
        draw.mark_invalid(f"n_head = {n_head!r}")
    n_kv_head = None if Hk == H and draw.boolean() else Hk
    if draw.one_in(10):
        n_kv_head = draw.choice((0, 1.0, H + 1))  # below 1, not an int, or not dividing H
        draw.mark_invalid(f"n_kv_head = {n_kv_head!r}")
    if D == 0:
        draw.mark_invalid("D = 0")
    if draw.one_in(15):
        qkv = draw.tensor((B, T), requires_grad=False)
        draw.mark_invalid("a 2-d qkv")
    causal = draw.flag("causal")
    slopes, slope_values = some_slopes(draw, H, dtype)
    tile_size = a_tile_size(draw)

    def expect(result):
        values = qkv.numpy()
        kv = H if n_kv_head is None else n_kv_head
        d = values.shape[-1] // (H + 2 * kv)
        q = values[..., : H * d].reshape(B, T, H, d).transpose(0, 2, 1, 3)  # (B, H, T, d)
        k = values[..., H * d : (H + kv) * d].reshape(B, T, kv, d).transpose(0, 2, 1, 3)  # (B, Hk, T, d)
        v = values[..., (H + kv) * d :].reshape(B, T, kv, d).transpose(0, 2, 1, 3)
        k, v = np.repeat(k, H // kv, axis=1), np.repeat(v, H // kv, axis=1)  # (B, H, T, d)
        out = attention_oracle(q, k, v, causal, slope_values).transpose(0, 2, 1, 3).reshape(B, T, H * d)
        attention_check("multi_head_online_attention", result, q, k, v, out.astype(dtype), dtype, draw.kernels, causal)

    run(draw, "multi_head_online_attention", lambda: F.multi_head_online_attention(qkv, n_head, causal, n_kv_head, slopes, tile_size), expect)


# ================================================================================ mixture of experts and LoRA


def some_indices(draw, shape, high, name):
    """Integers in [0, high) of `shape` as an int64 Tensor, an int32 array or a list; rarely (marked
    invalid) one out of range, floats, or one dim too many."""
    ids = draw.rng.integers(0, max(high, 1), shape)
    if draw.rarely():
        kind = draw.choice(("out of range", "float", "extra dim"))
        if kind == "out of range":
            ids = np.where(np.arange(ids.size).reshape(shape) == 0, draw.choice((-1, high, high + 5)), ids) if ids.size else ids
            if ids.size:
                draw.mark_invalid(f"{name}: {kind}")
        else:
            draw.mark_invalid(f"{name}: {kind}")
            ids = ids.astype(np.float64) if kind == "float" else ids[..., None]
    elif high == 0 and ids.size:
        draw.mark_invalid(f"{name}: no valid index below 0")
    form = draw.choice(("tensor", "array", "list"))
    if form == "list" and ids.size == 0:
        form = "array"  # (a list of an empty shape loses the dims after the first 0)
    argument = {"tensor": lambda: Tensor(ids if ids.dtype.kind == "f" else ids.astype(np.int64)), "array": lambda: ids if ids.dtype.kind == "f" else ids.astype(np.int32), "list": lambda: ids.tolist()}[form]()
    return argument, ids


@fuzz("gather_rows")
def _gather_rows(draw):
    N, C, M, dtype = draw.integer(0 if draw.rarely() else 1, 4), draw.integer(0, 3), draw.integer(0, 5), draw.float_dtype()
    x = draw.float_operand((N, C), dtype)
    if draw.one_in(15):
        x = draw.tensor((N,), dtype)
        draw.mark_invalid("a 1-d x")
    rows, ids = some_indices(draw, (M,), N, "rows")
    run(draw, "gather_rows", lambda: F.gather_rows(x, rows), lambda result: assert_close("gather_rows", result, x.numpy()[ids], exact=True))


@fuzz("scatter_add_rows")
def _scatter_add_rows(draw):
    n, C, M, dtype = draw.integer(0 if draw.rarely() else 1, 4), draw.integer(0, 3), draw.integer(0, 5), draw.float_dtype()
    values = draw.float_operand((M, C), dtype)
    if draw.one_in(15):
        values = draw.tensor((M,), dtype)
        draw.mark_invalid("a 1-d values")
    rows, ids = some_indices(draw, (M,), n, "rows")
    if draw.one_in(12):
        rows, ids = ids[:-1] if M else [0], None  # one entry too few, or one for no row of values
        draw.mark_invalid("rows of another length")
    weights = draw.choice((None, "tensor", "tensor"))
    if weights == "tensor":
        weights = draw.same_dtype_operand((M,) if not draw.one_in(12) else (M + 1,), dtype)
        if isinstance(weights, Tensor) and weights.shape != (M,):
            draw.mark_invalid("weights of the wrong shape")
    size = draw.choice((-1, 2.0, True)) if draw.one_in(12) else n
    if size is not n:
        draw.mark_invalid(f"n = {size!r}")

    def expect(result):
        v = values.numpy()
        w = np.ones(M, dtype) if weights is None else weights.numpy()
        terms = w[:, None] * v  # (M, C), in the dtype
        expected = np.zeros((n, C), dtype)
        np.add.at(expected, ids, terms)  # in the order of m, one by one
        with np.errstate(all="ignore"):
            bound = np.zeros((n, C))
            np.add.at(bound, ids, np.abs(terms.astype(np.float64)))
        finite = bound[np.isfinite(bound)]
        assert_close("scatter_add_rows", result, expected, scale=max(1.0, float(finite.max(initial=0))))

    run(draw, "scatter_add_rows", lambda: F.scatter_add_rows(values, rows, size, weights), expect)


@fuzz("top_k_experts")
def _top_k_experts(draw):
    N, E, dtype = draw.integer(0, 4), draw.integer(0 if draw.rarely() else 1, 5), draw.float_dtype()
    probs = draw.layout(draw.rng.choice([0.1, 0.25, 0.5, 0.7], (N, E)).astype(dtype))  # ties among few values
    form = draw.choice(("tensor", "array"))
    argument = Tensor(probs) if form == "tensor" else probs
    if draw.one_in(10):
        argument = draw.choice((probs.tolist(), probs.astype(np.int64), probs.reshape(-1)))
        draw.mark_invalid("probs not a 2-d float array or Tensor")
    k = draw.choice((0, E + 1, 1.0, True)) if draw.rarely() else draw.integer(1, max(E, 1))
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= E:
        draw.mark_invalid(f"k = {k!r} for E = {E}")

    def expect(result):
        expected = np.array([sorted(range(E), key=lambda e: (-row[e], e))[:k] for row in probs.tolist()], dtype=np.int64).reshape(N, k)
        assert isinstance(result, np.ndarray) and result.dtype == np.int64, f"top_k_experts: {type(result).__name__} {getattr(result, 'dtype', None)}"
        np.testing.assert_array_equal(result, expected, err_msg="top_k_experts")

    run(draw, "top_k_experts", lambda: F.top_k_experts(argument, k), expect)


@fuzz("top_k_gates")
def _top_k_gates(draw):
    N, E, dtype = draw.integer(0, 3), draw.integer(1, 4), draw.float_dtype()
    k = draw.integer(1, 3)
    probs = Tensor(draw.layout(draw.rng.uniform(0.01, 1, (N, E)).astype(dtype)), requires_grad=draw.boolean())
    if draw.one_in(10) and N:
        kind = draw.choice(("zeros", "nan"))
        values = probs.numpy().copy()
        values[draw.integer(0, N - 1)] = 0.0 if kind == "zeros" else np.nan
        probs = Tensor(values, requires_grad=probs.requires_grad)
        draw.mark_invalid(f"a row of {kind}: the chosen probabilities do not add up to more than 0")
    elif draw.one_in(10):
        kind = draw.choice(("1-d", "int tensor", "array"))
        values = probs.numpy()
        probs = {"1-d": lambda: Tensor(values.reshape(-1)), "int tensor": lambda: Tensor(np.ones((N, E), np.int64)), "array": lambda: values}[kind]()
        draw.mark_invalid(f"probs: a {kind} where a 2-d float Tensor is needed")
    experts, ids = some_indices(draw, (N, k), E, "experts")
    if draw.one_in(12):
        experts = ids = np.zeros((N + 1, k) if draw.boolean() else (N, 0), np.int64)
        draw.mark_invalid("experts not (N, k) with k >= 1")

    def expect(result):
        picked = np.take_along_axis(probs.numpy(), ids, axis=1)  # (N, k)
        assert_close("top_k_gates", result, picked / picked.sum(axis=1, keepdims=True))

    run(draw, "top_k_gates", lambda: F.top_k_gates(probs, experts), expect)


@fuzz("lora_linear")
def _lora_linear(draw):
    batch, n_in, n_out, rank, dtype = draw.shape(0, 2, 0, 3), draw.integer(0, 3), draw.integer(0, 3), draw.integer(1, 3), draw.float_dtype()
    x = draw.float_operand(batch + (n_in,), dtype)
    weight = draw.same_dtype_operand((n_in, n_out), dtype)
    bias = optional_vector(draw, n_out, dtype, "bias")
    a_shape, b_shape = (n_in, rank), (rank, n_out)
    if draw.one_in(10):
        which = draw.choice(("rank 0", "lora_a", "lora_b"))
        a_shape, b_shape = {"rank 0": ((n_in, 0), (0, n_out)), "lora_a": ((n_in + 1, rank), b_shape), "lora_b": (a_shape, (rank + 1, n_out))}[which]
        draw.mark_invalid(f"shapes: {which}")
    lora_a = draw.same_dtype_operand(a_shape, dtype)
    lora_b = draw.same_dtype_operand(b_shape, dtype)
    if draw.one_in(15):
        x = draw.tensor(batch + (n_in + 1,), dtype)
        draw.mark_invalid("x's last dim is not in")
    scale = draw.choice((float("nan"), float("inf"), "2", None)) if draw.rarely() and draw.boolean() else draw.choice((1.0, 0.5, 2, -1.0, 0.0, np.float32(4.0)))
    if not (isinstance(scale, (int, float, np.floating)) and math.isfinite(scale)):
        draw.mark_invalid(f"scale = {scale!r}")

    def expect(result):
        xs, w, a, b = (t.numpy().astype(np.float64) for t in (x, weight, lora_a, lora_b))
        bias64 = np.zeros(n_out) if bias is None else bias.numpy().astype(np.float64)
        with np.errstate(all="ignore"):
            expected = xs @ w + bias64 + float(scale) * ((xs @ a) @ b)  # (..., out)
            bound = np.abs(xs) @ np.abs(w) + np.abs(bias64) + abs(float(scale)) * ((np.abs(xs) @ np.abs(a)) @ np.abs(b))
        assert result.dtype == dtype and result.shape == expected.shape, f"lora_linear: {result.dtype} {result.shape}"
        if not np.all(np.isfinite(bound)) or bound.max(initial=0) > np.finfo(dtype).max / 16:
            return  # nan, inf or sums near the dtype's limit: the order of the sums decides what comes out
        assert_close("lora_linear", result, expected.astype(dtype), scale=max(1.0, float(bound.max(initial=0))))

    run(draw, "lora_linear", lambda: F.lora_linear(x, weight, bias, lora_a, lora_b, scale), expect)


# ================================================================================ the Tensor's other methods


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


# ================================================================================ constructors


@fuzz("tensor")
def _tensor_constructor(draw):
    kind = draw.choice(("floats", "ints", "bools", "nested", "array", "ragged", "complex", "strings", "none", "huge int", "float16", "tensor", "scalar"))
    data = {
        "floats": lambda: draw.rng.standard_normal(draw.shape(0, 2)).tolist(),
        "ints": lambda: draw.rng.integers(-5, 5, draw.shape(0, 2)).tolist(),
        "bools": lambda: (draw.rng.random(draw.shape(0, 2)) < 0.5).tolist(),
        "nested": lambda: [[1.0, 2.0], [3.0, 4.0]],
        "array": lambda: draw.values(draw.shape(), draw.float_dtype()),
        "ragged": lambda: [[1.0], [1.0, 2.0]],
        "complex": lambda: [1j, 2.0],
        "strings": lambda: ["a", "b"],
        "none": lambda: None,
        "huge int": lambda: [2**70],
        "float16": lambda: np.ones(3, np.float16),
        "tensor": lambda: draw.tensor(draw.shape()),
        "scalar": lambda: draw.choice((1.5, 3, True, np.float32(2.0))),
    }[kind]()
    if kind in ("ragged", "complex", "strings", "none", "huge int"):
        draw.mark_invalid(f"data: {kind}")
    source = np.array(data.numpy() if isinstance(data, Tensor) else data) if draw.valid else None
    dtype = draw.choice((None, None, None, np.float32, np.float64, np.int64, np.int8, np.bool_, "float32", "complex64", "nonsense"))
    if kind == "float16" and dtype is None:
        draw.mark_invalid("float16 values, and no dtype to convert them to")
    if dtype in ("complex64", "nonsense"):
        draw.mark_invalid(f"dtype {dtype}")
    elif dtype is not None and draw.valid:
        target = np.dtype(dtype)
        if target.kind in "iu" and source.dtype.kind == "f":
            draw.mark_invalid("floats to an integer dtype")
        elif target.kind in "iu" and source.size and (source.min() < np.iinfo(target).min or source.max() > np.iinfo(target).max):
            draw.mark_invalid("integers that do not fit")
        elif target.kind == "b" and source.dtype.kind != "b":
            draw.mark_invalid("numbers to bool")
        elif target.kind == "f" and source.dtype.kind == "f":
            with np.errstate(over="ignore"):
                if np.any(np.isinf(source.astype(target)) & np.isfinite(source)):
                    draw.mark_invalid("too large for float32")
    requires_grad = draw.flag("requires_grad")
    if requires_grad is True and draw.valid:
        final = np.dtype(dtype) if dtype is not None else (mt.get_default_dtype() if source.dtype.kind == "f" and not isinstance(data, (np.ndarray, Tensor, np.generic)) else source.dtype)
        if final.kind != "f":
            draw.mark_invalid("an integer or bool tensor cannot require a gradient")

    def expect(result):
        assert isinstance(result, Tensor) and result.requires_grad == requires_grad
        got = result.numpy()
        if isinstance(data, (np.ndarray, Tensor)):
            assert not np.shares_memory(got, array_of(data)), "tensor(): the data must be copied"
        expected = source if dtype is None else source.astype(dtype)
        if dtype is None and source.dtype.kind == "f" and not isinstance(data, (np.ndarray, Tensor, np.generic)):
            expected = source.astype(mt.get_default_dtype())  # Python floats: the default dtype
        assert got.dtype == expected.dtype and got.shape == expected.shape, f"tensor: {got.dtype} {got.shape}, expected {expected.dtype} {expected.shape}"
        np.testing.assert_array_equal(got, expected)

    run(draw, "tensor", lambda: mt.tensor(data, dtype=dtype, requires_grad=requires_grad), expect)


@fuzz("zeros, ones, randn, rand")
def _filled(draw):
    name = draw.choice(("zeros", "ones", "randn", "rand"))
    shape = list(draw.shape())
    kind = draw.choice(("negative", "float", "bool", "huge")) if draw.rarely() else draw.choice(("sizes", "tuple", "list"))
    if kind in ("negative", "float", "bool") or (kind == "huge" and math.prod(shape) > 0):
        draw.mark_invalid(f"a {kind} size")
    if kind in ("negative", "float", "bool", "huge"):
        shape.append({"negative": -1, "float": 2.0, "bool": True, "huge": 10**12}[kind])
    dtype = draw.choice((np.int64, "nonsense")) if draw.rarely() and draw.boolean() else draw.choice((None, np.float32, np.float64, "float64"))
    if any(dtype is bad for bad in (np.int64, "nonsense")):
        draw.mark_invalid(f"dtype {dtype}")
    options = {"dtype": dtype, "requires_grad": draw.flag("requires_grad")}
    if name in ("randn", "rand") and draw.boolean():
        options["generator"] = draw.choice((np.random.default_rng(1), 5))
        if options["generator"] == 5:
            draw.mark_invalid("a generator that is not a numpy Generator")
    function = getattr(mt, name)
    call = (lambda: function(*shape, **options)) if kind != "tuple" and kind != "list" else (lambda: function(tuple(shape) if kind == "tuple" else shape, **options))

    def expect(result):
        expected_dtype = mt.get_default_dtype() if dtype is None else np.dtype(dtype)
        assert result.shape == tuple(shape) and result.dtype == expected_dtype
        got = result.numpy()
        if name in ("zeros", "ones"):
            np.testing.assert_array_equal(got, np.full(shape, 0.0 if name == "zeros" else 1.0, expected_dtype))
        elif name == "rand":
            assert np.all((got >= 0) & (got < 1))
        else:
            assert np.all(np.isfinite(got))

    run(draw, "zeros, ones, randn, rand", call, expect)


@fuzz("zeros_like, ones_like")
def _like(draw):
    name = draw.choice(("zeros_like", "ones_like"))
    x = draw.tensor(draw.shape()) if draw.integer(0, 3) else Tensor(draw.rng.integers(0, 3, draw.shape()))
    if draw.one_in(10):
        x = x.tolist()
        draw.mark_invalid("a list")
    requires_grad = draw.flag("requires_grad")
    if requires_grad is True and draw.valid and x.dtype.kind != "f":
        draw.mark_invalid("an integer tensor cannot require a gradient")
    expected = (lambda: np.zeros_like(x.numpy())) if name == "zeros_like" else (lambda: np.ones_like(x.numpy()))
    run(draw, "zeros_like, ones_like", lambda: getattr(mt, name)(x, requires_grad=requires_grad), lambda result: assert_close(name, result, expected(), exact=True))


@fuzz("arange")
def _arange(draw):
    numbers = (0, 1, 5, -3, 2.5, 0.25, -1.5, np.int64(4))
    args = [draw.choice(numbers) for _ in range(draw.integer(1, 3))]
    if len(args) == 3 and args[2] == 0:
        draw.mark_invalid("step 0")
    if draw.one_in(10):
        args[0] = draw.choice((float("inf"), float("nan"), "5", True, 10**12))
        if args[0] != 10**12:
            draw.mark_invalid(f"start {args[0]!r}")
    dtype = draw.choice((None, None, np.float32, np.float64, np.int64, np.bool_, "nonsense"))
    if dtype in (np.bool_, "nonsense"):
        draw.mark_invalid(f"dtype {dtype}")
    elif dtype == np.int64 and draw.valid and not all(isinstance(a, (int, np.integer)) for a in args):
        draw.mark_invalid("fractional values as integers")
    if draw.valid:
        start, stop, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) == 3 else 1)
        if math.ceil((stop - start) / step) > 2**31:
            draw.mark_invalid("too many values")

    def expect(result):
        integers = all(isinstance(a, (int, np.integer)) for a in args)
        expected_dtype = np.dtype(dtype) if dtype is not None else (np.dtype(np.int64) if integers else mt.get_default_dtype())
        assert_close("arange", result, np.arange(*args, dtype=expected_dtype), exact=True)

    run(draw, "arange", lambda: mt.arange(*args, dtype=dtype), expect)


@fuzz("set_default_dtype")
def _set_default_dtype(draw):
    dtype = draw.choice((np.float32, np.float64, "float64", mt.float32, np.int64, np.float16, "nonsense", None))
    if dtype in (np.int64, np.float16, "nonsense", None):
        draw.mark_invalid(f"dtype {dtype}")
    before = mt.get_default_dtype()

    def call():
        try:
            mt.set_default_dtype(dtype)
            return mt.get_default_dtype(), mt.tensor([1.5]).dtype
        finally:
            mt.set_default_dtype(before)

    run(draw, "set_default_dtype", call, lambda got: check_pair(got, np.dtype(dtype)))


def check_pair(got, dtype):
    assert got == (dtype, dtype), f"set_default_dtype: {got}, expected {dtype} twice"


# ================================================================================ gradcheck

SMOOTH_OPS = {
    "exp": lambda x: x.exp(),
    "tanh": F.tanh,
    "softmax": lambda x: F.softmax(x, dim=-1),
    "mul": lambda x: x * x,
    "sum": lambda x: x.sum(dim=-1),
    "gelu": F.gelu,
    "log_softmax": lambda x: F.log_softmax(x, dim=0),
}


@fuzz("gradcheck")
def _gradcheck(draw):
    name = draw.choice(tuple(SMOOTH_OPS))
    x = Tensor(draw.rng.uniform(-1, 1, draw.shape(1, 2, 1, 3)), requires_grad=True)
    kind = draw.choice(("float32", "nan", "no grad", "not callable", "a Tensor as inputs")) if draw.rarely() else "valid"
    fn, inputs = SMOOTH_OPS[name], [x]
    if kind == "float32":
        inputs = [Tensor(x.numpy().astype(np.float32), requires_grad=True)]
    elif kind == "nan":
        x.data[(0,) * x.ndim] = np.nan
    elif kind == "no grad":
        x.requires_grad_(False)
    elif kind == "not callable":
        fn = name
    elif kind == "a Tensor as inputs":
        inputs = x
    if kind != "valid":
        draw.mark_invalid(kind)
    options = {}
    for option, good, bad in (("eps", (1e-6, 1e-5), (0, -1e-6, float("nan"), "small")), ("atol", (1e-5, 1e-4), (-1.0, float("inf"))), ("rtol", (1e-3, 0.01), (-0.1, float("nan")))):
        if draw.one_in(3):
            options[option] = draw.choice(bad) if draw.rarely() and draw.boolean() else draw.choice(good)
            if options[option] in bad or (isinstance(options[option], float) and math.isnan(options[option])):
                draw.mark_invalid(f"{option}={options[option]!r}")
    if draw.one_in(5):
        options["max_elements"] = draw.choice((1, 3, 0, -2, 2.0))
        if options["max_elements"] in (0, -2) or isinstance(options["max_elements"], float):
            draw.mark_invalid(f"max_elements={options['max_elements']!r}")

    def expect(result):
        assert result is True, f"gradcheck of a correct {name} returned {result!r}"

    run(draw, "gradcheck", lambda: mt.gradcheck(fn, inputs, **options), expect)


# ================================================================================ the test


SLOW_ENTRIES = {"multi_head_online_attention"}  # as tests/helpers.py's SLOW_REGISTRY_CASES, for the same reason


@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.slow] if name in SLOW_ENTRIES else []) for name in sorted(ENTRIES)])
@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
@given(data=st.data())
def test_fuzz(name, data):
    ENTRIES[name](Draw(data))


def test_every_public_function_is_fuzzed():
    """Every function microtensor.functional exports has an entry here (by name, or under one that
    covers it: concat also calls cat, reshape flatten's view, ...)."""
    covered = set(ENTRIES) | {"cat", "transpose"}
    public = {name for name in dir(F) if not name.startswith("_") and callable(getattr(F, name))}
    missing = sorted(public - covered)
    assert not missing, f"functional API without a fuzz entry: {missing}"
