"""Every check of microtensor's inputs, in one place: each error names the op (or layer, or flag),
what was given and what was expected. The errors are microtensor's own (microtensor/errors.py).

Every public op checks its inputs here, in Python, before any kernel sees them: a kernel is a plain
loop that indexes without bounds checks, so a wrong shape or an id out of range would read or write
outside an array. Nothing is cast or broadcast behind the user's back: a float32 tensor meeting a
float64 one is an error (cast one with `.to()`), and so is an integer tensor where a float one is
needed.

This module imports nothing of microtensor but its errors, so that every other module (tensor.py
first) can import it at the top. It knows a Tensor by `TensorBase`, the class Tensor derives from.

    dtypes and values  FLOAT_DTYPES, as_dtype, describe, check_flag, check_real, check_int, as_real, as_count
    sizes              is_size_refusal, allocate
    shapes and dims    broadcast_shape, normalize_dim
    tensors            check_tensor, check_float, check_integer, check_ndim, check_last_dim
    layers (nn.py)     check_layer_dtype, check_size, check_layer_flag, check_norm_eps, check_layer_input
"""
import math

import numpy as np

from .errors import AllocationError, InputError, InputIndexError, InputTypeError, MicrotensorError

float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
int64 = np.dtype(np.int64)
bool_ = np.dtype(np.bool_)

FLOAT_DTYPES = (float32, float64)  # the only dtypes that can require a gradient

REAL_TYPES = (int, float, np.integer, np.floating)


class TensorBase:
    """The base class of `microtensor.Tensor`, and all the checks need to know of it: defined here so
    that this module need not import tensor.py, which imports it."""

    __slots__ = ()


# ----------------------------------------------------------------------------- dtypes and values


def describe(value):
    """A short description of a value for an error message: its type, and its shape and dtype if it has them."""
    if isinstance(value, (TensorBase, np.ndarray)):
        return f"{type(value).__name__} of shape {value.shape} and dtype {value.dtype}"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of length {len(value)}"
    return type(value).__name__


def as_dtype(where, dtype, floats_only=False):
    """`dtype` as a numpy dtype microtensor supports (float32, float64, an integer type or bool; only
    the two floats if `floats_only`), or an error naming `where`."""
    try:
        resolved = np.dtype(dtype)
    except (TypeError, ValueError):
        resolved = None
    if dtype is None or resolved is None:
        raise InputTypeError(f"{where}: {dtype!r} is not a dtype; expected float32 or float64" + ("" if floats_only else ", an integer dtype or bool"))
    if resolved in FLOAT_DTYPES or (not floats_only and resolved.kind in "iub"):
        return resolved
    expected = "float32 or float64" if floats_only else "float32, float64, an integer dtype or bool"
    raise InputTypeError(f"{where}: dtype {resolved} is not supported; expected {expected}")


def check_flag(where, name, value):
    """A True/False option (numpy's bool too); anything else is an error rather than truthy."""
    if not isinstance(value, (bool, np.bool_)):
        raise InputTypeError(f"{where}: {name} must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)


def is_real_number(value):
    """A Python or numpy int or float (a bool is not: True + 1 is a slip, not arithmetic)."""
    return isinstance(value, REAL_TYPES) and not isinstance(value, (bool, np.bool_))


def as_real(value):
    """`value` as a Python float if it is a real number (a bool is not), else None."""
    return float(value) if is_real_number(value) else None


def is_integer(value):
    """A Python or numpy int (a bool is not: True as a count is a slip, not 1)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def as_count(value):
    """`value` as a Python int if it is an integer (a bool is not), else None."""
    return int(value) if is_integer(value) else None


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


# ----------------------------------------------------------------------------- sizes


def is_size_refusal(error):
    """True for numpy's refusal of a size: a MemoryError (not enough memory for it), or the
    ValueError numpy raises for a size beyond any address ("array is too big", "Maximum allowed
    dimension exceeded"). Our own errors are never one: they already say what was wrong."""
    if isinstance(error, MicrotensorError):
        return False
    return isinstance(error, MemoryError) or (isinstance(error, ValueError) and str(error).startswith(("array is too big", "Maximum allowed dimension")))


def allocate(where, make, shape, dtype):
    """make(shape, dtype), with numpy's refusal of an impossible size reported as an AllocationError
    naming `where`, the shape and the dtype. (An op's arrays need no call of this: `Function.apply`
    and the backward walk report a refusal inside any forward or backward the same way.)"""
    try:
        return make(shape, dtype)
    except (ValueError, MemoryError) as error:
        if not is_size_refusal(error):
            raise
        raise AllocationError(f"{where}: cannot allocate a tensor of shape {shape} and dtype {dtype}: {error}") from None


# ----------------------------------------------------------------------------- shapes and dims


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


# ----------------------------------------------------------------------------- tensors


def check_tensor(op, value, name=None):
    """`value` itself if it is a Tensor, else an error that says a Tensor was expected."""
    if not isinstance(value, TensorBase):
        what = f"{name} must be a Tensor" if name else "expected a Tensor"
        raise InputTypeError(f"{op}: {what}, got {describe(value)} (mt.tensor(values) makes one)")
    return value


def check_float(op, *tensors):
    """All Tensors, all float32 or float64, and all the same dtype. Returns that dtype."""
    for t in tensors:
        check_tensor(op, t)  # every one first: the dtype message below describes them all
    dtype = None
    for t in tensors:
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


def check_last_dim(op, name, tensor, size):
    if tensor.shape != (size,):
        raise InputError(f"{op}: {name} must have shape ({size},) to match the last dim of the input, got {tensor.shape}")


# ----------------------------------------------------------------------------- layers (nn.py)


def check_layer_dtype(module, dtype):
    """A layer's dtype: float32 or float64."""
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise InputTypeError(f"{module}: dtype must be float32 or float64, got {dtype!r}") from None
    if dtype not in FLOAT_DTYPES:
        raise InputTypeError(f"{module}: dtype must be float32 or float64, got {dtype}")
    return dtype


def check_size(module, name, value):
    """`value` as an int >= 1 (a size: features, rows, a normalized dim), or an error naming it."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InputTypeError(f"{module}: {name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise InputError(f"{module}: {name} must be >= 1, got {value}")
    return int(value)


def check_layer_flag(module, name, value):
    """A layer's True/False option (the same check as check_flag, in the layers' words)."""
    if not isinstance(value, (bool, np.bool_)):
        raise InputTypeError(f"{module}: {name} must be True or False, got {type(value).__name__} {value!r}")
    return bool(value)


def check_norm_eps(module, eps):
    """A norm's epsilon: finite and > 0, since it alone keeps a constant row from dividing by zero."""
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, (int, float, np.integer, np.floating)):
        raise InputTypeError(f"{module}: eps must be a number, got {type(eps).__name__} {eps!r}")
    if not (math.isfinite(eps) and eps > 0):
        raise InputError(f"{module}: eps must be > 0 and finite, got {eps}")
    return float(eps)


def check_layer_input(module, x, last_dim, dtype):
    """A layer's input: a Tensor of the layer's dtype whose last dim is `last_dim`; the error names
    the layer (its repr), which the op's own error, deeper down, could not."""
    if not isinstance(x, TensorBase):
        raise InputTypeError(f"{module!r}: expected a Tensor input, got {type(x).__name__}; wrap it with mt.tensor(...)")
    if x.ndim == 0 or x.shape[-1] != last_dim:
        raise InputError(f"{module!r}: expected an input whose last dim is {last_dim}, got shape {x.shape}")
    if x.dtype != dtype:
        raise InputTypeError(f"{module!r}: expected a {dtype} input (the layer's dtype), got {x.dtype}; cast one with .to()")
