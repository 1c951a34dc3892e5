"""Input checks shared by the ops: each error names the op, what was given and what was expected.

Every public op checks its inputs here, in Python, before any kernel sees them: a kernel is a plain
loop that indexes without bounds checks, so a wrong shape or an id out of range would read or write
outside an array. The errors are microtensor's own (microtensor/errors.py).

Nothing is cast or broadcast behind the user's back: a float32 tensor meeting a float64 one is an
error (cast one with `.to()`), and so is an integer tensor where a float one is needed.
"""
import math

import numpy as np

from ..errors import InputError, InputIndexError, InputTypeError
from ..tensor import FLOAT_DTYPES, Tensor, check_flag, describe  # noqa: F401  (check_flag: for the ops)

REAL_TYPES = (int, float, np.integer, np.floating)


def is_real_number(value):
    """A Python or numpy int or float (a bool is not: True + 1 is a slip, not arithmetic)."""
    return isinstance(value, REAL_TYPES) and not isinstance(value, (bool, np.bool_))


def check_tensor(op, value, name=None):
    """`value` itself if it is a Tensor, else an error that says a Tensor was expected."""
    if not isinstance(value, Tensor):
        what = f"{name} must be a Tensor" if name else "expected a Tensor"
        raise InputTypeError(f"{op}: {what}, got {describe(value)} (mt.tensor(values) makes one)")
    return value


def as_tensor(op, value, like):
    """`value` as a Tensor beside the Tensor `like`: Tensors pass through, Python and numpy numbers
    take like's float dtype, numpy float arrays are wrapped as they are (a dtype that differs from
    like's is then caught by check_float), numpy integer arrays take like's float dtype."""
    if isinstance(value, Tensor):
        return value
    check_float(op, like)  # (a number beside an integer tensor: the op's own refusal, before any conversion)
    if is_real_number(value):
        try:
            number = float(value)
        except OverflowError:
            raise InputError(f"{op}: the number {value} is too large for a float") from None
        with np.errstate(over="ignore"):  # 1e300 in float32 is inf, as the arithmetic would make it anyway
            return Tensor._from_array(np.asarray(number, dtype=like.dtype))
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "f":
            return Tensor._from_array(value)
        if value.dtype.kind in "iu":
            return Tensor._from_array(value.astype(like.dtype))
    raise InputTypeError(f"{op}: expected a Tensor, a numpy array or a Python number, got {describe(value)}")


def check_float(op, *tensors):
    """All Tensors, all float32 or float64, and all the same dtype. Returns that dtype."""
    dtype = None
    for t in tensors:
        check_tensor(op, t)
        if t.dtype not in FLOAT_DTYPES:
            raise InputTypeError(f"{op}: expected a float32 or float64 tensor, got {t.dtype} of shape {t.shape}")
        if dtype is not None and t.dtype != dtype:
            shapes = ", ".join(f"{x.dtype} {x.shape}" for x in tensors)
            raise InputTypeError(f"{op}: inputs have different dtypes ({shapes}); cast one with .to() first")
        dtype = t.dtype
    return dtype


def check_integer(op, name, tensor):
    if tensor.dtype.kind not in "iu":
        raise InputTypeError(f"{op}: {name} must be an integer tensor, got {tensor.dtype} of shape {tensor.shape}")


def check_ndim(op, name, tensor, ndims, expected):
    """tensor.ndim in `ndims`; `expected` says what is expected, e.g. "a 3-d Tensor (B, T, 3C)"."""
    if tensor.ndim not in ndims:
        raise InputError(f"{op}: {name} must be {expected}, got shape {tensor.shape}")


def check_real(op, name, value, low=None, high=None, low_open=False, high_open=False):
    """A finite Python or numpy number within [low, high] (an end is left out when *_open). Returns a float."""
    if not is_real_number(value):
        raise InputTypeError(f"{op}: {name} must be a number, got {value!r} ({type(value).__name__})")
    try:
        number = float(value)
    except OverflowError:  # a Python int beyond any float
        number = math.inf
    below = low is not None and (number <= low if low_open else number < low)
    above = high is not None and (number >= high if high_open else number > high)
    if not math.isfinite(number) or below or above:
        raise InputError(f"{op}: {name} must be {_interval(low, high, low_open, high_open)}, got {value!r}")
    return number


def _interval(low, high, low_open, high_open):
    if low is None and high is None:
        return "a finite number"
    if high is None:
        return f"{'>' if low_open else '>='} {low:g} and finite"
    if low is None:
        return f"{'<' if high_open else '<='} {high:g} and finite"
    return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def check_int(op, name, value, low=None, high=None):
    """A Python or numpy int (not a bool, not a float) within [low, high]. Returns an int."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
        raise InputTypeError(f"{op}: {name} must be an int, got {value!r} ({type(value).__name__})")
    if (low is not None and value < low) or (high is not None and value > high):
        expected = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise InputError(f"{op}: {name} must be {expected}, got {value}")
    return int(value)


def broadcast_shape(op, *shapes):
    """The numpy broadcast of `shapes`, or an error that names the op."""
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        raise InputError(
            f"{op}: shapes {', '.join(str(tuple(s)) for s in shapes)} cannot be broadcast together "
            "(sizes must match or be 1, aligned from the last dim)"
        ) from None


def normalize_dim(op, dim, ndim):
    """A dim in [-ndim, ndim) as a non-negative index."""
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, (bool, np.bool_)):
        raise InputTypeError(f"{op}: dim must be an int, got {dim!r} ({type(dim).__name__})")
    if not -ndim <= dim < ndim:
        raise InputIndexError(f"{op}: dim {dim} is out of range for a tensor with {ndim} dims (expected {-ndim}..{ndim - 1})")
    return int(dim) % ndim


def check_last_dim(op, name, tensor, size):
    if tensor.shape != (size,):
        raise InputError(f"{op}: {name} must have shape ({size},) to match the last dim of the input, got {tensor.shape}")
