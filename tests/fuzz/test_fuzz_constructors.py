"""The fuzz entries of microtensor/tensor.py: the constructors and the default dtype.

How an entry draws its arguments and judges the call: fuzzing.py."""
import math

import numpy as np

import microtensor as mt
from microtensor import Tensor
from fuzzing import array_of, assert_close, fuzz, fuzz_test, run


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


test_fuzz = fuzz_test(__name__)
