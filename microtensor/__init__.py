"""microtensor: a small autograd framework for teaching.

    import microtensor as mt
    import microtensor.functional as F

    x = mt.randn(4, 3, requires_grad=True)
    loss = F.softmax(x, dim=-1)[:, 0].sum()
    loss.backward()
    x.grad  # d loss / d x, from hand-written backward functions

Where things live: `tensor.py` (Tensor), `autograd.py` (Function and the backward walk),
`ops/` (one file per op: math, readable kernels, backward, gradient check), `kernels.py` (the
switch between the readable kernels and the fast ones in `fast/`), `functional.py` (the ops as
functions), `nn.py` (modules), `optim.py` (optimizers), `gradcheck.py` (finite differences).

Importing microtensor changes nothing outside it: no environment variable, no thread count, no
allocator setting (see `fast/process.py` for the settings a training program may ask for).
"""
import numpy as np

# tensor first: it defines Tensor, then imports the engine and the ops, which all need Tensor.
from .tensor import FLOAT_DTYPES, Tensor, bool_, float32, float64, get_default_dtype, int64, set_default_dtype  # isort: skip
from . import functional, nn, optim
from .autograd import Function, is_grad_enabled, no_grad, unbroadcast
from .gradcheck import GradcheckError, gradcheck, gradcheck_case
from .kernels import get_kernels, set_kernels, using_kernels
from .threads import num_threads
from .ops.shape import cat, concat, split, stack, where
from .random import get_generator, manual_seed

__version__ = "0.1.0"


def set_matmul(backend):
    """Gone: the matrix products follow the kernel set. set_matmul("numba") is
    set_kernels("readable") and set_matmul("blas") is set_kernels("fast"); this alias says so."""
    choices = {"numba": "readable", "blas": "fast"}
    if backend not in choices:
        raise ValueError(f"set_matmul: unknown backend {backend!r}; expected 'blas' or 'numba' (use set_kernels instead)")
    import warnings

    warnings.warn(
        f'set_matmul("{backend}") is now set_kernels("{choices[backend]}"), which switches every kernel, not only matmul',
        DeprecationWarning,
        stacklevel=2,
    )
    set_kernels(choices[backend])


def tensor(data, dtype=None, requires_grad=False):
    """A new leaf tensor holding a copy of `data` (Python floats become float32; numpy arrays keep their dtype)."""
    return Tensor(data, dtype=dtype, requires_grad=requires_grad)


def _float_dtype(dtype):
    dtype = get_default_dtype() if dtype is None else np.dtype(dtype)
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"expected dtype float32 or float64, got {dtype}")
    return dtype


def _shape(shape):
    return tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)


def zeros(*shape, dtype=None, requires_grad=False):
    return Tensor(np.zeros(_shape(shape), dtype=_float_dtype(dtype)), requires_grad=requires_grad)


def ones(*shape, dtype=None, requires_grad=False):
    return Tensor(np.ones(_shape(shape), dtype=_float_dtype(dtype)), requires_grad=requires_grad)


def zeros_like(x, requires_grad=False):
    return Tensor(np.zeros_like(x.data), requires_grad=requires_grad)


def ones_like(x, requires_grad=False):
    return Tensor(np.ones_like(x.data), requires_grad=requires_grad)


def randn(*shape, dtype=None, requires_grad=False, generator=None):
    """Standard normal values from `generator` (default: the global one, seeded by manual_seed)."""
    generator = get_generator() if generator is None else generator
    values = generator.standard_normal(_shape(shape), dtype=_float_dtype(dtype))
    return Tensor(values, requires_grad=requires_grad)


def rand(*shape, dtype=None, requires_grad=False, generator=None):
    """Uniform values in [0, 1)."""
    generator = get_generator() if generator is None else generator
    values = generator.random(_shape(shape), dtype=_float_dtype(dtype))
    return Tensor(values, requires_grad=requires_grad)


def arange(start, stop=None, step=1, dtype=None):
    """Like numpy's arange: integers give an int64 tensor, floats the default float dtype."""
    if stop is None:
        start, stop = 0, start
    if dtype is None and all(isinstance(v, (int, np.integer)) for v in (start, stop, step)):
        dtype = int64
    return Tensor(np.arange(start, stop, step, dtype=np.dtype(dtype) if dtype is not None else get_default_dtype()))
