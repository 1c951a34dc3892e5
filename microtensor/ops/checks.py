"""Input checks shared by the ops: each error names the op, the shapes or dtypes, and what was expected.

Nothing is cast or broadcast behind the user's back: a float32 tensor meeting a float64 one is an
error (cast one with `.to()`), and so is an integer tensor where a float one is needed.
"""
import numpy as np

from ..tensor import FLOAT_DTYPES, Tensor


def as_tensor(op, value, like):
    """`value` as a Tensor of `like`'s float dtype: Tensors pass through, Python numbers are converted."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{op}: expected a Tensor or a Python number, got {type(value).__name__}")
    return Tensor._from_array(np.asarray(value, dtype=like.dtype))


def check_float(op, *tensors):
    """All tensors float32 or float64, and all the same dtype. Returns that dtype."""
    dtype = None
    for t in tensors:
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{op}: expected a float32 or float64 tensor, got {t.dtype} of shape {t.shape}")
        if dtype is not None and t.dtype != dtype:
            shapes = ", ".join(f"{x.dtype} {x.shape}" for x in tensors)
            raise TypeError(f"{op}: inputs have different dtypes ({shapes}); cast one with .to() first")
        dtype = t.dtype
    return dtype


def check_integer(op, name, tensor):
    if tensor.dtype.kind not in "iu":
        raise TypeError(f"{op}: {name} must be an integer tensor, got {tensor.dtype} of shape {tensor.shape}")


def broadcast_shape(op, *shapes):
    """The numpy broadcast of `shapes`, or an error that names the op."""
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        raise ValueError(
            f"{op}: shapes {', '.join(str(tuple(s)) for s in shapes)} cannot be broadcast together "
            "(sizes must match or be 1, aligned from the last dim)"
        ) from None


def normalize_dim(op, dim, ndim):
    """A dim in [-ndim, ndim) as a non-negative index."""
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
        raise TypeError(f"{op}: dim must be an int, got {type(dim).__name__}")
    if not -ndim <= dim < ndim:
        raise IndexError(f"{op}: dim {dim} is out of range for a tensor with {ndim} dims (expected {-ndim}..{ndim - 1})")
    return int(dim) % ndim


def check_last_dim(op, name, tensor, size):
    if tensor.shape != (size,):
        raise ValueError(f"{op}: {name} must have shape ({size},) to match the last dim of the input, got {tensor.shape}")
