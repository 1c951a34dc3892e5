"""microtensor: a small autograd framework for teaching.

    import microtensor as mt
    import microtensor.functional as F

    x = mt.randn(4, 3, requires_grad=True)
    loss = F.softmax(x, dim=-1)[:, 0].sum()
    loss.backward()
    x.grad  # d loss / d x, from hand-written backward functions

Where things live: `tensor.py` (Tensor), `autograd.py` (Function and the backward walk),
`ops/` (one file per op: math, kernels, backward, gradient check), `functional.py` (the ops as
functions), `nn.py` (modules), `optim.py` (optimizers), `gradcheck.py` (finite differences).
"""
import os

# The threads. Numba runs the kernels on a pool of OpenMP threads. Where it can, microtensor runs
# the matrix products on the same pool (ops/blas.py: numpy's BLAS on one thread per slice of
# rows), so one pool does all the work and its threads spin 30,000 rounds (~1 ms) after each call:
# waking a sleeping thread took 50-100 µs on a 2-core virtual machine, more than many kernels of a
# training step, and the gaps between a step's kernels are shorter than 1 ms.
# Where it cannot, OpenBLAS keeps a pool of its own, and the two pools must not spin, or they
# steal the cores from each other (a GPT training step ran 6x slower with OpenBLAS spinning, 1.6x
# with OpenMP's default spin): OpenBLAS then spins 2^4 cycles and OpenMP 1,000 rounds (a few µs).
# Both libraries read these variables when they load, so they take effect only when microtensor
# is imported before numpy (OpenBLAS) and before Numba first runs a parallel kernel (OpenMP); a
# value you set yourself is kept.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import numpy as np  # noqa: E402

from .ops import blas  # noqa: E402  isort: skip  (before any kernel runs: it decides how the threads wait)

os.environ.setdefault("GOMP_SPINCOUNT", "30000" if blas.AVAILABLE else "1000")

from .memory import keep_freed_memory  # noqa: E402

keep_freed_memory()  # a step's freed arrays stay in the heap for the next step (memory.py)

# tensor first: it defines Tensor, then imports the engine and the ops, which all need Tensor.
from .tensor import FLOAT_DTYPES, Tensor, bool_, float32, float64, get_default_dtype, int64, set_default_dtype  # isort: skip
from . import functional, nn, optim
from .autograd import Function, is_grad_enabled, no_grad, unbroadcast
from .gradcheck import GradcheckError, gradcheck, gradcheck_case
from .ops.matmul import get_matmul, set_matmul
from .threads import num_threads
from .ops.shape import cat, concat, split, stack, where
from .random import get_generator, manual_seed

__version__ = "0.1.0"


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
