"""A hypothesis fuzz test over the whole public API: how an entry draws its arguments and judges
the call. The entries are in the files beside this one, one file per module they fuzz.

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
domain must raise. The outcomes are counted and printed at the end of the run (tests/fuzz/conftest.py):

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
from microtensor import MicrotensorError, Tensor

COUNTS = Counter()  # outcome -> calls; and (api name, outcome) -> calls
EXAMPLES = 4 * settings.default.max_examples  # per API entry: 100 by default, 32 without the JIT, 1200 thorough
KERNEL_SETS = ("readable",) if numba.config.DISABLE_JIT else ("readable", "fast")

# Forward values against numpy computed in the input's dtype: the same formulas, with sums taken in
# another order (and, in the fast set, e^x, tanh and erf from vectorizable formulas accurate to a
# few ulp): tolerances relative to the values' scale.
TOLERANCE = {np.dtype(np.float32): (2e-4, 2e-5), np.dtype(np.float64): (1e-9, 1e-11)}


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


# ================================================================================ oracles and draws several files use


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


def softmax_oracle(x, axis):
    shifted = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(shifted)
    return e / np.sum(e, axis=axis, keepdims=True)


def log_softmax_oracle(x, axis):
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


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


def alibi_oracle(n):
    """The ALiBi paper's slopes: for a power of two n the geometric sequence from 2^(-8/n) with
    ratio 2^(-8/n); otherwise those of the largest power of two p below n, then the odd-numbered
    (1st, 3rd, ...) of those of 2p heads, until there are n."""
    def geometric(count):
        start = 2.0 ** (-8.0 / count)
        return [start ** (i + 1) for i in range(count)]

    p = 2 ** math.floor(math.log2(n))
    return np.array(geometric(p) + geometric(2 * p)[0::2][: n - p])


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


# ================================================================================ the test of each file


SLOW_ENTRIES = {"multi_head_online_attention"}  # as tests/helpers.py's SLOW_REGISTRY_CASES, for the same reason


def fuzz_test(module_name):
    """The test of one file: test_fuzz[NAME] for each entry the module `module_name` registered."""
    names = sorted(name for name, function in ENTRIES.items() if function.__module__ == module_name)

    @pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.slow] if name in SLOW_ENTRIES else []) for name in names])
    @settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
    @given(data=st.data())
    def test_fuzz(name, data):
        ENTRIES[name](Draw(data))

    return test_fuzz
