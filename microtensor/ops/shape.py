"""Ops that move, pick or combine elements without arithmetic: reshape, permute/transpose,
indexing and slicing, concat, stack, split, masked_fill, where.

Each output element is a copy of exactly one input element (or a constant), so backward routes
every output gradient back to the element it was copied from:

    reshape   y = x viewed with another shape         dL/dx = g viewed with x's shape
    permute   y = x with dims reordered by `dims`     dL/dx = g with dims reordered by the inverse
    getitem   y = x[index]                            dL/dx = zeros, then dL/dx[index] += g
              (scatter-add: an element picked twice, as in x[[0, 0]], gets both gradients)
    concat    y = [x_0, x_1, ...] joined along dim    dL/dx_i = the slice of g that x_i filled
    stack     y = [x_0, x_1, ...] along a new dim     dL/dx_i = g[..., i, ...]
    masked_fill  y = value where mask else x          dL/dx = g where not mask, else 0
    where     y = a where cond else b                 dL/da = g where cond, dL/db = g where not cond
                                                      (each unbroadcast to its input's shape)

Forward mode moves tangents exactly as forward moves values: a tangent t of x gives the output's
tangent by the same reshape, permute, index, concat, stack or selection (zero where a constant was
written), which is why each JVP below is forward's own line with t in place of x.
"""
import math

import numpy as np

from .. import autograd
from ..autograd import Function, add_tangents, unbroadcast
from ..checks import broadcast_shape, check_float, check_tensor, describe, is_real_number, normalize_dim
from ..errors import InputError, InputIndexError, InputTypeError
from ..gradcheck import gradcheck_case
from ..tensor import Tensor, as_tensor


class Reshape(Function):
    """y = x with another shape.   JVP: dy = t with that shape."""

    @staticmethod
    def forward(ctx, x, shape):
        ctx.input_shape = x.shape
        return x.reshape(shape)

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out.reshape(ctx.input_shape), None

    @staticmethod
    def jvp(ctx, tangent, _shape):
        return tangent.reshape(ctx.inputs[1])  # the shape forward was given


class Permute(Function):
    """y = x with dims reordered.   JVP: dy = t with the same dims reordered."""

    @staticmethod
    def forward(ctx, x, dims):
        ctx.dims = dims
        return np.transpose(x, dims)

    @staticmethod
    def backward(ctx, grad_out):
        return np.transpose(grad_out, np.argsort(ctx.dims)), None

    @staticmethod
    def jvp(ctx, tangent, _dims):
        return np.transpose(tangent, ctx.dims)


def _is_basic_index(index):
    """True when the index holds only ints, slices, None and Ellipsis: each element is picked at
    most once, so backward can assign instead of scatter-adding."""
    parts = index if isinstance(index, tuple) else (index,)
    return all(isinstance(p, (int, np.integer, slice)) or p is None or p is Ellipsis for p in parts)


class GetItem(Function):
    """y = x[index].   JVP: dy = t[index] (a copy moves with what it copies)."""

    @staticmethod
    def forward(ctx, x, index):
        ctx.index, ctx.input_shape = index, x.shape
        return x[index]

    @staticmethod
    def backward(ctx, grad_out):
        grad = np.zeros(ctx.input_shape, dtype=grad_out.dtype)
        if _is_basic_index(ctx.index):
            grad[ctx.index] = grad_out
        else:
            np.add.at(grad, ctx.index, grad_out)  # repeated indices accumulate
        return grad, None

    @staticmethod
    def jvp(ctx, tangent, _index):
        return tangent[ctx.index]


class Concat(Function):
    """y = the inputs joined along dim.   JVP: dy = their tangents joined along dim (zeros for an input without one)."""

    @staticmethod
    def forward(ctx, *arrays, dim):
        ctx.dim = dim
        ctx.boundaries = np.cumsum([a.shape[dim] for a in arrays])[:-1]
        return np.concatenate(arrays, axis=dim)

    @staticmethod
    def backward(ctx, grad_out):
        return tuple(np.split(grad_out, ctx.boundaries, axis=ctx.dim))

    @staticmethod
    def jvp(ctx, *tangents):
        dtype = next(t.dtype for t in tangents if t is not None)
        parts = [np.zeros(x.shape, dtype=dtype) if t is None else t for x, t in zip(ctx.inputs, tangents)]
        return np.concatenate(parts, axis=ctx.dim)


class Stack(Function):
    """y = the inputs stacked along a new dim.   JVP: dy = their tangents stacked likewise."""

    @staticmethod
    def forward(ctx, *arrays, dim):
        ctx.dim = dim
        return np.stack(arrays, axis=dim)

    @staticmethod
    def backward(ctx, grad_out):
        return tuple(np.moveaxis(grad_out, ctx.dim, 0))

    @staticmethod
    def jvp(ctx, *tangents):
        dtype = next(t.dtype for t in tangents if t is not None)
        parts = [np.zeros(x.shape, dtype=dtype) if t is None else t for x, t in zip(ctx.inputs, tangents)]
        return np.stack(parts, axis=ctx.dim)


class MaskedFill(Function):
    """y = value where mask else x.   JVP: dy = 0 where mask (a constant does not move), else t."""

    @staticmethod
    def forward(ctx, x, mask, value):
        ctx.save_for_backward(mask)
        return np.where(mask, x.dtype.type(value), x)

    @staticmethod
    def backward(ctx, grad_out):
        (mask,) = ctx.saved_tensors
        return np.where(mask, grad_out.dtype.type(0), grad_out), None, None

    @staticmethod
    def jvp(ctx, tangent, _mask, _value):
        (mask,) = ctx.saved_tensors
        return np.where(mask, tangent.dtype.type(0), tangent)


class Where(Function):
    """y = a where condition else b.   JVP: dy = ta where condition, else tb (each broadcast to y's shape)."""

    @staticmethod
    def forward(ctx, condition, a, b):
        ctx.save_for_backward(condition)
        ctx.shapes = (a.shape, b.shape)
        return np.where(condition, a, b)

    @staticmethod
    def backward(ctx, grad_out):
        (condition,) = ctx.saved_tensors
        a_shape, b_shape = ctx.shapes
        zero = grad_out.dtype.type(0)
        grad_a = unbroadcast(np.where(condition, grad_out, zero), a_shape) if ctx.needs_input_grad[1] else None
        grad_b = unbroadcast(np.where(condition, zero, grad_out), b_shape) if ctx.needs_input_grad[2] else None
        return None, grad_a, grad_b

    @staticmethod
    def jvp(ctx, _condition, tangent_a, tangent_b):
        (condition,) = ctx.saved_tensors
        shape = np.broadcast_shapes(condition.shape, *ctx.shapes)
        zero = next(t.dtype for t in (tangent_a, tangent_b) if t is not None).type(0)
        return add_tangents(
            shape,
            None if tangent_a is None else np.where(condition, tangent_a, zero),
            None if tangent_b is None else np.where(condition, zero, tangent_b),
        )


# --------------------------------------------------------------------------------- public functions


def _resolve_shape(x, shape):
    """`shape` with its one allowed -1 replaced by the size that keeps the element count."""
    for n in shape:
        if not isinstance(n, (int, np.integer)) or isinstance(n, (bool, np.bool_)):
            raise InputTypeError(f"reshape: sizes must be ints, got {n!r} ({type(n).__name__}) in {shape}")
    shape = tuple(int(n) for n in shape)
    known = math.prod(n for n in shape if n != -1)
    unknown = shape.count(-1)
    if unknown > 1 or any(n < -1 for n in shape):
        raise InputError(f"reshape: invalid shape {shape} (sizes must be >= 0, with at most one -1)")
    if unknown == 1 and known > 0 and x.data.size % known == 0:
        shape = tuple(x.data.size // known if n == -1 else n for n in shape)
    if -1 in shape or math.prod(shape) != x.data.size:
        raise InputError(f"reshape: cannot reshape a tensor of shape {x.shape} ({x.data.size} elements) into {shape}")
    return shape


def reshape(x, *shape):
    """x with another shape and the same elements in the same order; one size may be -1 (inferred)."""
    check_tensor("reshape", x)
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    target = _resolve_shape(x, shape)
    if target == x.shape:
        return x
    return Reshape.apply(x, target)._view_of(x)  # a view when numpy can make one, else a copy


def flatten(x, start_dim=0, end_dim=-1):
    """Dims start_dim .. end_dim (both included) merged into one."""
    check_tensor("flatten", x)
    if x.ndim == 0:
        for dim in (start_dim, end_dim):
            normalize_dim("flatten", dim, 1)  # a 0-d tensor flattens as if it had one dim
        return reshape(x, 1)
    start = normalize_dim("flatten", start_dim, x.ndim)
    end = normalize_dim("flatten", end_dim, x.ndim)
    if start > end:
        raise InputError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for a tensor of shape {x.shape}")
    return reshape(x, x.shape[:start] + (math.prod(x.shape[start : end + 1]),) + x.shape[end + 1 :])


def permute(x, *dims):
    """x with its dims reordered: dim i of the result is dim dims[i] of x."""
    check_tensor("permute", x)
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    dims = tuple(normalize_dim("permute", d, x.ndim) for d in dims)
    if sorted(dims) != list(range(x.ndim)):
        raise InputError(f"permute: dims {dims} are not a permutation of the {x.ndim} dims of a tensor of shape {x.shape}")
    return Permute.apply(x, dims)._view_of(x)


def transpose(x, dim0, dim1):
    """x with dims dim0 and dim1 swapped."""
    check_tensor("transpose", x)
    dims = list(range(x.ndim))
    a, b = normalize_dim("transpose", dim0, x.ndim), normalize_dim("transpose", dim1, x.ndim)
    dims[a], dims[b] = dims[b], dims[a]
    return Permute.apply(x, tuple(dims))._view_of(x)


def _index_part(part):
    """Tensors in an index become their arrays; float indices are an error, not a silent cast."""
    if isinstance(part, Tensor):
        part = part.data
    if isinstance(part, (list, np.ndarray)):
        try:
            array = np.asarray(part)
        except ValueError as error:  # a ragged list
            raise InputIndexError(f"getitem: the index {part!r} is not a valid array of indices: {error}") from None
        if array.dtype.kind not in "iub":
            raise InputIndexError(f"getitem: indices must be integers or booleans, got {array.dtype}")
        return array
    return part


def getitem(x, index):
    """x[index], with numpy's indexing: ints, slices, None, ..., integer arrays (picks that may
    repeat) and boolean masks."""
    check_tensor("getitem", x)
    index = tuple(_index_part(p) for p in index) if isinstance(index, tuple) else _index_part(index)
    try:
        values = x.data[index]  # numpy validates the index (basic indices give a view: no copy)
    except (IndexError, TypeError, ValueError) as error:
        raise InputIndexError(f"getitem: index {index!r} is invalid for a tensor of shape {x.shape}: {error}") from None
    if not x.requires_grad and not autograd.forward_mode_running():
        return Tensor._from_array(np.asarray(values))._view_of(x)  # basic indices give a view
    return GetItem.apply(x, index)._view_of(x)


def _tensor_list(op, tensors):
    if isinstance(tensors, (Tensor, np.ndarray, str)) or not hasattr(tensors, "__iter__"):
        raise InputTypeError(f"{op}: expected a list or tuple of Tensors, got {describe(tensors)}")
    tensors = list(tensors)
    if not tensors:
        raise InputError(f"{op}: expected a non-empty list of Tensors, got an empty one")
    for i, t in enumerate(tensors):
        check_tensor(op, t, f"item {i} of the list")
    check_float(op, *tensors)
    return tensors


def concat(tensors, dim=0):
    """The tensors joined along an existing dim; every other dim must match."""
    tensors = _tensor_list("concat", tensors)
    axis = normalize_dim("concat", dim, tensors[0].ndim)
    for t in tensors:
        if t.ndim != tensors[0].ndim or t.shape[:axis] + t.shape[axis + 1 :] != tensors[0].shape[:axis] + tensors[0].shape[axis + 1 :]:
            shapes = ", ".join(str(t.shape) for t in tensors)
            raise InputError(f"concat: shapes {shapes} must match in every dim but dim {dim}")
    return Concat.apply(*tensors, dim=axis)


cat = concat


def stack(tensors, dim=0):
    """The tensors, all of one shape, stacked along a new dim."""
    tensors = _tensor_list("stack", tensors)
    if any(t.shape != tensors[0].shape for t in tensors):
        raise InputError(f"stack: all tensors must have the same shape, got {', '.join(str(t.shape) for t in tensors)}")
    axis = normalize_dim("stack", dim, tensors[0].ndim + 1)
    return Stack.apply(*tensors, dim=axis)


def split(x, split_size_or_sections, dim=0):
    """Split into pieces along `dim`: of size `split_size_or_sections` each (the last may be smaller),
    or of the listed sizes. The pieces are slices, so each one's backward is GetItem's."""
    check_tensor("split", x)
    axis = normalize_dim("split", dim, x.ndim)
    length = x.shape[axis]
    if isinstance(split_size_or_sections, (int, np.integer)) and not isinstance(split_size_or_sections, (bool, np.bool_)):
        if split_size_or_sections <= 0:
            raise InputError(f"split: split size must be positive, got {split_size_or_sections}")
        sizes = [min(split_size_or_sections, length - start) for start in range(0, length, split_size_or_sections)]
    elif isinstance(split_size_or_sections, (list, tuple)):
        sizes = list(split_size_or_sections)
        if not all(isinstance(n, (int, np.integer)) and not isinstance(n, (bool, np.bool_)) for n in sizes):
            raise InputTypeError(f"split: sizes must be ints, got {sizes}")
        if sum(sizes) != length or any(n < 0 for n in sizes):
            raise InputError(f"split: sizes {sizes} must be non-negative and add up to {length}, the size of dim {dim} of {x.shape}")
    else:
        raise InputTypeError(f"split: expected a piece size (int) or a list of sizes, got {split_size_or_sections!r}")
    pieces, start = [], 0
    for size in sizes:
        index = (slice(None),) * axis + (slice(start, start + size),)
        pieces.append(getitem(x, index))
        start += size
    return tuple(pieces)


def _mask_array(op, mask, name="the mask"):
    if isinstance(mask, Tensor):
        mask = mask.data
    elif isinstance(mask, (list, tuple)):
        try:
            mask = np.asarray(mask)
        except ValueError as error:
            raise InputError(f"{op}: {name} is not a valid array: {error}") from None
        if mask.size == 0:
            mask = mask.astype(np.bool_)  # an empty list has no dtype of its own (numpy says float64)
    elif isinstance(mask, (np.ndarray, bool, np.bool_)):
        mask = np.asarray(mask)
    else:
        raise InputTypeError(f"{op}: {name} must be a boolean Tensor or numpy array, got {describe(mask)}")
    if mask.dtype != np.bool_:
        raise InputTypeError(f"{op}: {name} must be boolean, got {mask.dtype}")
    return mask


def masked_fill(x, mask, value):
    """x with `value` wherever `mask` is True; mask broadcasts to x's shape (not the other way).
    value may be inf or -inf (as for an attention mask) or nan."""
    check_float("masked_fill", x)
    mask = _mask_array("masked_fill", mask)
    if not is_real_number(value):
        raise InputTypeError(f"masked_fill: value must be a number, got {value!r} ({type(value).__name__})")
    if broadcast_shape("masked_fill", x.shape, mask.shape) != x.shape:
        raise InputError(f"masked_fill: a mask of shape {mask.shape} would enlarge the input of shape {x.shape}")
    try:
        value = float(value)
    except OverflowError:
        raise InputError(f"masked_fill: value {value} is too large for a float") from None
    return MaskedFill.apply(x, mask, value)


def where(condition, a, b):
    """a where condition is True, else b: condition boolean; a and b Tensors, numpy arrays or
    numbers (at least one a Tensor); all three broadcast together."""
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise InputTypeError(f"where: at least one of a and b must be a Tensor, got {describe(a)} and {describe(b)}")
    if not isinstance(a, Tensor):
        a = as_tensor("where", a, b)
    if not isinstance(b, Tensor):
        b = as_tensor("where", b, a)
    check_float("where", a, b)
    condition = _mask_array("where", condition, "the condition")
    broadcast_shape("where", condition.shape, a.shape, b.shape)
    return Where.apply(condition, a, b)


# --------------------------------------------------------------------------------- gradcheck cases


@gradcheck_case(Reshape)
def _reshape_case(draw):
    x = draw.tensor(draw.shape(min_dims=1, max_dims=3))
    new_shape = draw.choice(((-1,), (x.data.size, 1), (1, -1)))
    return (lambda x: reshape(x, new_shape) * 1.0), (x,)


@gradcheck_case(Permute)
def _permute_case(draw):
    x = draw.tensor(draw.shape(min_dims=2, max_dims=4))
    dims = tuple(reversed(range(x.ndim))) if draw.boolean() else (1, 0) + tuple(range(2, x.ndim))
    return (lambda x: permute(x, dims)), (x,)


@gradcheck_case(GetItem)
def _getitem_case(draw):
    x = draw.tensor(draw.shape(min_dims=2, max_dims=3, min_side=2))
    kind = draw.choice(("slice", "int", "repeated", "mask", "mixed"))
    if kind == "slice":
        index = (slice(None, None, -1), slice(1, None))
    elif kind == "int":
        index = (draw.integer(0, x.shape[0] - 1),)
    elif kind == "repeated":
        index = np.array([0, 1, 0, 0])  # rows picked several times: their gradients must add up
    elif kind == "mask":
        index = x.data > 0
    else:
        index = (np.array([1, 1, 0]), slice(None, 1))
    return (lambda x: getitem(x, index)), (x,)


@gradcheck_case(Concat)
def _concat_case(draw):
    shape = draw.shape(min_dims=1, max_dims=3)
    dim = draw.integer(-len(shape), len(shape) - 1)
    other = list(shape)
    other[dim] = draw.integer(1, 3)
    return (lambda a, b: concat([a, b, a], dim)), (draw.tensor(shape), draw.tensor(other))


@gradcheck_case(Stack)
def _stack_case(draw):
    shape = draw.shape(min_dims=0, max_dims=2)
    dim = draw.integer(0, len(shape))
    return (lambda a, b: stack([a, b], dim)), (draw.tensor(shape), draw.tensor(shape))


@gradcheck_case(MaskedFill)
def _masked_fill_case(draw):
    x = draw.tensor(draw.shape(min_dims=1, max_dims=3))
    mask = draw.tensor(draw.broadcastable_shape(x.shape), requires_grad=False).data > 0
    return (lambda x: masked_fill(x, mask, -3.0)), (x,)


@gradcheck_case(Where)
def _where_case(draw):
    shape = draw.shape(min_dims=1, max_dims=3)
    condition = draw.tensor(draw.broadcastable_shape(shape), requires_grad=False).data > 0
    a, b = draw.tensor(shape), draw.tensor(draw.broadcastable_shape(shape))
    return (lambda a, b: where(condition, a, b)), (a, b)
