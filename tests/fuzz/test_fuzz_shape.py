"""The fuzz entries of microtensor/ops/shape.py: reshape, flatten, permute, indexing, concat, stack, split, masked_fill and where.

How an entry draws its arguments and judges the call: fuzzing.py."""
import math

import numpy as np

import microtensor as mt
import microtensor.functional as F
from microtensor import Tensor
from fuzzing import assert_close, fuzz, fuzz_test, oracle_operand, other_operand, run


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


test_fuzz = fuzz_test(__name__)
