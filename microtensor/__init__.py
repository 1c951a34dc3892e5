"""microtensor: a small autograd framework for teaching.

    import microtensor as mt
    import microtensor.functional as F

    x = mt.randn(4, 3, requires_grad=True)
    loss = F.softmax(x, dim=-1)[:, 0].sum()
    loss.backward()
    x.grad  # d loss / d x, from hand-written backward functions

Where things live (the files the default GPT runs at the top of each folder, the techniques in
`electives/` beside them): `tensor.py` (Tensor), `autograd.py` (Function and the backward walk),
`ops/` (one file per op: math, readable kernels, backward, gradient check; `ops/electives/` for the
techniques: RMSNorm, SiLU, RoPE, online attention, mixture of experts, LoRA, quantization,
gradient checkpointing: `checkpoint`; 16-bit training: `autocast`, `LossScaler`),
`kernels.py` (the switch between the readable kernels and the fast ones in `fast/` and
`fast/electives/`), `functional.py` (the ops as functions), `nn.py` (modules, and the sinusoidal
position table), `optim.py` (optimizers), `gradcheck.py` (finite differences), `checks.py` (every
input check, and the dtypes), `errors.py` (the errors they raise), `anomaly.py` (detect_anomaly:
the first op to make a NaN or inf) and `profiler.py` (time, FLOPs and memory per op, as
`microtensor.debug.profile`).

Importing microtensor changes nothing outside it: no environment variable, no thread count, no
allocator setting (see `fast/process.py` for the settings a training program may ask for).
"""
import math

import numpy as np

# tensor first: it defines Tensor and closes microtensor's one import circle (see its last lines).
from .tensor import Tensor, get_default_dtype, set_default_dtype
from . import checks, func, functional, nn, optim
from .autograd import Function, is_grad_enabled, jvp, no_grad, unbroadcast
from .anomaly import AnomalyError, detect_anomaly
from .checks import FLOAT_DTYPES, allocate as _allocate, as_dtype as _as_dtype, bool_, check_flag as _check_flag, float32, float64, int64
from .errors import AllocationError, GraphError, InputError, InputIndexError, InputTypeError, MicrotensorError, StateDictError, ThreadingError
from .gradcheck import GradcheckError, GradcheckReport, JvpcheckError, dot_product_check, gradcheck, gradcheck_case, gradcheck_report, jvpcheck

from .kernels import get_kernels, set_kernels, using_kernels
from .threads import num_threads
from .ops.shape import cat, concat, split, stack, where
from .ops.electives.checkpointing import checkpoint
from .ops.electives.mixed_precision import LossScaler, autocast
from .random import get_generator, manual_seed

__version__ = "0.1.0"


def set_matmul(backend):
    """Gone: the matrix products follow the kernel set. set_matmul("numba") is
    set_kernels("readable") and set_matmul("blas") is set_kernels("fast"); this alias says so."""
    choices = {"numba": "readable", "blas": "fast"}
    if backend not in choices:
        raise InputError(f"set_matmul: unknown backend {backend!r}; expected 'blas' or 'numba' (use set_kernels instead)")
    import warnings

    warnings.warn(
        f'set_matmul("{backend}") is now set_kernels("{choices[backend]}"), which switches every kernel, not only matmul',
        DeprecationWarning,
        stacklevel=2,
    )
    set_kernels(choices[backend])


def tensor(data, dtype=None, requires_grad=False):
    """A new leaf tensor holding a copy of `data` (Python floats become float32; numpy arrays keep
    their dtype). A conversion that would change a value is refused: floats to an integer dtype,
    integers that do not fit the dtype, numbers to bool, values too large for float32."""
    return Tensor(data, dtype=dtype, requires_grad=requires_grad)


def _float_dtype(where, dtype):
    return get_default_dtype() if dtype is None else _as_dtype(where, dtype, floats_only=True)


def _shape(where, shape):
    """The sizes given as zeros(2, 3) or zeros((2, 3)), checked: ints (numpy's too), none negative."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    for n in shape:
        if not isinstance(n, (int, np.integer)) or isinstance(n, (bool, np.bool_)):
            raise InputTypeError(f"{where}: sizes must be ints, got {n!r} ({type(n).__name__}) in {shape}")
        if n < 0:
            raise InputError(f"{where}: sizes must be >= 0, got {n} in {shape}")
    return tuple(int(n) for n in shape)


def _generator(where, generator):
    if generator is None:
        return get_generator()
    if not isinstance(generator, np.random.Generator):
        raise InputTypeError(f"{where}: generator must be a numpy Generator (np.random.default_rng(seed)), got {type(generator).__name__}")
    return generator


def _leaf(where, values, requires_grad):
    return Tensor._from_array(values, _check_flag(where, "requires_grad", requires_grad))


def zeros(*shape, dtype=None, requires_grad=False):
    shape, dtype = _shape("zeros", shape), _float_dtype("zeros", dtype)
    return _leaf("zeros", _allocate("zeros", np.zeros, shape, dtype), requires_grad)


def ones(*shape, dtype=None, requires_grad=False):
    shape, dtype = _shape("ones", shape), _float_dtype("ones", dtype)
    return _leaf("ones", _allocate("ones", np.ones, shape, dtype), requires_grad)


def _like(where, x, fill, requires_grad):
    if not isinstance(x, Tensor):
        raise InputTypeError(f"{where}: expected a Tensor, got {type(x).__name__}")
    if _check_flag(where, "requires_grad", requires_grad) and x.dtype not in FLOAT_DTYPES:
        raise InputTypeError(f"{where}: only float tensors can require gradients, got {x.dtype}")
    return Tensor._from_array(np.full(x.shape, fill, dtype=x.dtype), requires_grad)


def zeros_like(x, requires_grad=False):
    return _like("zeros_like", x, 0, requires_grad)


def ones_like(x, requires_grad=False):
    return _like("ones_like", x, 1, requires_grad)


def randn(*shape, dtype=None, requires_grad=False, generator=None):
    """Standard normal values from `generator` (default: the global one, seeded by manual_seed)."""
    shape, dtype, generator = _shape("randn", shape), _float_dtype("randn", dtype), _generator("randn", generator)
    values = _allocate("randn", lambda shape, dtype: generator.standard_normal(shape, dtype=dtype), shape, dtype)
    return _leaf("randn", values, requires_grad)


def rand(*shape, dtype=None, requires_grad=False, generator=None):
    """Uniform values in [0, 1)."""
    shape, dtype, generator = _shape("rand", shape), _float_dtype("rand", dtype), _generator("rand", generator)
    values = _allocate("rand", lambda shape, dtype: generator.random(shape, dtype=dtype), shape, dtype)
    return _leaf("rand", values, requires_grad)


MAX_ARANGE_LENGTH = 2**31  # more is a slip (a stop of 1e18), not a tensor anyone can hold


def arange(start, stop=None, step=1, dtype=None):
    """Like numpy's arange: integers give an int64 tensor, floats the default float dtype."""
    if stop is None:
        start, stop = 0, start
    for name, value in (("start", start), ("stop", stop), ("step", step)):
        if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, (bool, np.bool_)):
            raise InputTypeError(f"arange: {name} must be a number, got {value!r} ({type(value).__name__})")
        if not math.isfinite(value):
            raise InputError(f"arange: {name} must be finite, got {value}")
    if step == 0:
        raise InputError("arange: step must not be 0")
    integers = all(isinstance(v, (int, np.integer)) for v in (start, stop, step))
    if dtype is None:
        dtype = int64 if integers else get_default_dtype()
    dtype = _as_dtype("arange", dtype)
    if dtype.kind == "b" or (dtype.kind in "iu" and not integers):
        raise InputTypeError(f"arange: {dtype} values need int start, stop and step, got {start!r}, {stop!r}, {step!r}")
    length = math.ceil((stop - start) / step)
    if length > MAX_ARANGE_LENGTH:
        raise InputError(f"arange: {start} to {stop} in steps of {step} is {length} values, more than {MAX_ARANGE_LENGTH}")
    return Tensor._from_array(np.arange(start, stop, step, dtype=dtype))
