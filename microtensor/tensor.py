"""`Tensor`: a numpy array, its gradient, and the op that made it.

A Tensor holds its values in `.data` (a numpy array, float32 unless asked otherwise), and after
`loss.backward()` the gradient of the loss with respect to it in `.grad` (an array of the same shape
and dtype, or None). `.grad_fn` is the Context of the op that made it (None for a leaf: a tensor the
user made), the node of the graph that backward walks; `register_hook(fn)` lets a function see (or
replace) the gradient as it arrives. The arithmetic operators and methods below only forward to the ops in `microtensor/ops/`,
where each op's math, kernels and backward live.

What a Tensor may hold: float32 or float64 values (the only ones that can require a gradient),
integers (ids, targets), or booleans (masks). Nothing is converted behind the user's back: float
values never become integers (that would drop the fractions), numbers never become booleans, and
complex numbers, strings, objects and float16 are refused, each with an error that says so.

The version counter. `._version` counts the in-place changes microtensor makes to the values in a
tensor's memory: an assignment to `.data` of an array that shares that memory (`w.data -= lr *
w.grad` changes the array in place and assigns it back), an optimizer's step (it calls
`_bump_version()`), or any other in-place mutator. Assigning a new array (`w.data = new_values`)
changes no value an op may have saved, so it is not counted. A view shares the counter of the tensor
it views (reshape, permute, transpose, basic indexing, split, detach), because a change through
either is a change of both. The op that saves an input's array for backward remembers the input's
version, and backward refuses to use an array whose tensor changed since (the gradient would be
computed at values the forward never saw). A write straight through the numpy array,
`w.data[...] = 0` or `np.asarray(w)[0] = 1`, happens inside numpy, where microtensor cannot see it:
the counter misses it (PyTorch's `.data` has the same limit). Between a forward and its backward,
change values by assignment, or call `w._bump_version()` after writing through the array.

Numpy interop. `np.asarray(t)` gives `t.data` (the same memory, no copy): hand numpy `t.data` or
`np.asarray(t)`, not the tensor. Given a tensor, a numpy function such as `np.sum(t, axis=0)` calls
the Tensor's own method of that name (whose arguments are PyTorch's), and numpy's ufuncs
(`np.exp(t)`, `np.ones(3) + t`) refuse it: `__array_ufunc__ = None` makes numpy hand an operator to
the Tensor instead (`t.__radd__`), so `np.ones(3) + t` is a Tensor, in the graph, not an array of
Python objects holding one Tensor per element.

Python numbers. `float(t)`, `int(t)` and `f"{t:.3f}"` take the value of a one-element tensor, as
`t.item()` does.
"""
import numpy as np

from .checks import FLOAT_DTYPES, TensorBase, as_dtype, check_flag, check_float, describe, float32, float64, is_real_number, normalize_dim
from .errors import GraphError, InputError, InputTypeError

_default_dtype = float32


def set_default_dtype(dtype):
    """The dtype of tensors made from Python floats and by the constructors (float32 or float64)."""
    global _default_dtype
    _default_dtype = as_dtype("set_default_dtype", dtype, floats_only=True)


def get_default_dtype():
    return _default_dtype


def _convert(where, array, dtype):
    """`array` as `dtype`, refusing every conversion that would change a value."""
    if array.dtype == dtype:
        return array
    source = array.dtype.kind
    if dtype.kind in "iu":
        if source == "f":
            raise InputTypeError(
                f"{where}: refusing to convert {array.dtype} values to {dtype} (it would drop the fractions); "
                "round them first, e.g. np.round(values).astype(np.int64)"
            )
        if array.size and source in "iu":
            info = np.iinfo(dtype)
            low, high = array.min(), array.max()
            if low < info.min or high > info.max:
                raise InputError(f"{where}: values from {low} to {high} do not fit in {dtype} ({info.min} to {info.max})")
    elif dtype.kind == "b":
        raise InputTypeError(f"{where}: refusing to convert {array.dtype} values to bool; compare instead, e.g. values != 0")
    with np.errstate(over="ignore"):  # checked just below, with a message of our own
        converted = array.astype(dtype)
    if source == "f" and dtype.kind == "f" and array.size:
        overflowed = np.isinf(converted) & np.isfinite(array)
        if overflowed.any():
            raise InputError(f"{where}: {array[overflowed].flat[0]} is too large for {dtype}")
    return converted


def _to_array(data, dtype, where="tensor"):
    """The numpy array a new Tensor holds (always a new array, never `data` itself). Python floats
    become the default dtype; numpy arrays keep theirs unless `dtype` is given; no conversion may
    change a value."""
    if dtype is not None:
        dtype = as_dtype(where, dtype)
    if isinstance(data, Tensor):
        data = data._data
    try:
        array = np.array(data)
    except (ValueError, TypeError, OverflowError) as error:
        raise InputError(f"{where}: cannot make a tensor from {describe(data)}: {error}") from None
    kind = array.dtype.kind
    if kind not in "fiub":
        what = {"c": "complex numbers", "U": "strings", "S": "bytes", "O": "Python objects (or integers too large for 64 bits)"}
        raise InputTypeError(
            f"{where}: cannot make a tensor from {what.get(kind, f'values of dtype {array.dtype}')}; "
            "expected real numbers or booleans"
        )
    if kind == "f" and dtype is None:
        if not isinstance(data, (np.ndarray, np.generic)):
            dtype = _default_dtype  # Python floats
        elif array.dtype not in FLOAT_DTYPES:
            raise InputTypeError(f"{where}: unsupported float dtype {array.dtype}; use float32 or float64 (e.g. values.astype(np.float32))")
    return array if dtype is None else _convert(where, array, dtype)


class RemovableHook:
    """What `register_hook` returns: `.remove()` unregisters the hook (a second call does nothing)."""

    def __init__(self, tensor, hook):
        self.tensor, self.hook = tensor, hook

    def remove(self):
        self.tensor._hooks = tuple(h for h in self.tensor._hooks if h is not self.hook)


class Tensor(TensorBase):
    # _version_counter: a one-element list, shared by a tensor and its views (see the module docstring)
    __slots__ = ("_data", "_version_counter", "grad", "requires_grad", "_ctx", "_retains_grad", "_hooks", "__weakref__")

    # numpy's operators hand every operation with a Tensor to the Tensor's own (see the module docstring).
    __array_ufunc__ = None

    def __init__(self, data, dtype=None, requires_grad=False):
        self._data = _to_array(data, dtype)
        if check_flag("tensor", "requires_grad", requires_grad) and self._data.dtype not in FLOAT_DTYPES:
            raise InputTypeError(
                f"tensor: only float32 and float64 tensors can require gradients, got {self._data.dtype}"
            )
        self._version_counter = [0]
        self.grad = None
        self.requires_grad = bool(requires_grad)
        self._ctx = None
        self._retains_grad = False
        self._hooks = ()

    @classmethod
    def _from_array(cls, array, requires_grad=False):
        """Wrap an op's result without any checks or copies (the hot path of every op)."""
        tensor = cls.__new__(cls)
        tensor._data = array
        tensor._version_counter = [0]
        tensor.grad = None
        tensor.requires_grad = requires_grad
        tensor._ctx = None
        tensor._retains_grad = False
        tensor._hooks = ()
        return tensor

    @property
    def data(self):
        """The values, a numpy array (the tensor's own memory: writes through it change the tensor)."""
        return self._data

    @data.setter
    def data(self, array):
        if not isinstance(array, np.ndarray):
            raise InputTypeError(f"Tensor.data: expected a numpy array, got {describe(array)} (np.asarray(values) makes one)")
        if array.dtype not in FLOAT_DTYPES and array.dtype.kind not in "iub":
            raise InputTypeError(f"Tensor.data: dtype {array.dtype} is not supported; expected float32, float64, an integer dtype or bool")
        if self.requires_grad and array.dtype not in FLOAT_DTYPES:
            raise InputTypeError(f"Tensor.data: this tensor requires a gradient, so its values must be float32 or float64, got {array.dtype}")
        if np.may_share_memory(array, self._data):
            self._version_counter[0] += 1  # `t.data -= x`: the same memory, changed in place
        self._data = array

    @property
    def _version(self):
        """How many in-place changes the values in this tensor's memory have seen."""
        return self._version_counter[0]

    def _bump_version(self):
        """Record an in-place change of the values (see the version counter in the module docstring)."""
        self._version_counter[0] += 1

    def _view_of(self, base):
        """Mark this tensor as a view of `base` when their arrays share memory: one version counter
        for both (called by the ops that return views). Returns self."""
        if self is not base and np.may_share_memory(self._data, base._data):
            self._version_counter = base._version_counter
        return self

    def __array__(self, dtype=None, copy=None):
        """np.asarray(t): the values, t.data itself when no other dtype and no copy is asked for."""
        array = self._data
        if dtype is not None and np.dtype(dtype) != array.dtype:
            if copy is False:
                raise InputError(f"np.asarray(tensor, dtype={np.dtype(dtype)}, copy=False): the tensor is {array.dtype}, so a copy is needed")
            return array.astype(dtype)
        return array.copy() if copy else array

    # ----------------------------------------------------------------------------- attributes
    @property
    def shape(self):
        return self._data.shape

    @property
    def dtype(self):
        return self._data.dtype

    @property
    def ndim(self):
        return self._data.ndim

    @property
    def is_leaf(self):
        """True for a tensor no recorded op made (one you created, or any tensor that needs no
        gradient): backward fills `.grad` on leaves only (see retain_grad for the others)."""
        return self._ctx is None

    @property
    def grad_fn(self):
        """The record of the op that made this tensor, or None for a leaf: a Context whose `.name`
        is the op ("LayerNorm"), `.inputs` its arguments (the input Tensors are the graph's next
        nodes: follow their `.grad_fn`), and `.saved_tensors` the arrays its backward will read."""
        return self._ctx

    def size(self, dim=None):
        """The shape, or the size of one dim."""
        if dim is None:
            return self._data.shape
        return self._data.shape[normalize_dim("size", dim, self.ndim)]

    def numel(self):
        return self._data.size

    def __len__(self):
        if self._data.ndim == 0:
            raise InputTypeError("len() of a 0-d tensor: it has no first dim (use .item() for its value)")
        return len(self._data)

    def __iter__(self):
        """The slices along the first dim, each a Tensor (in the graph, like t[i])."""
        if self._data.ndim == 0:
            raise InputTypeError("iteration over a 0-d tensor: it has no first dim (use .item() for its value)")
        return (self[i] for i in range(len(self._data)))

    def __repr__(self):
        body = np.array2string(self._data, precision=4, separator=", ", prefix="tensor(")
        extra = ""
        if self.dtype != float32:
            extra += f", dtype={self.dtype}"
        if self._ctx is not None:
            extra += f", grad_fn={self._ctx.function.__name__}"
        elif self.requires_grad:
            extra += ", requires_grad=True"
        return f"tensor({body}{extra})"

    # Comparisons below return tensors, so equality by value is not identity: hash by identity.
    __hash__ = object.__hash__

    def __bool__(self):
        if self._data.size != 1:
            raise InputError(f"bool() of a tensor of shape {self.shape} is ambiguous; use .any() or .all()")
        return bool(self._data)

    # ----------------------------------------------------------------------------- conversions
    def numpy(self):
        """The values as a numpy array (the same memory, not a copy)."""
        return self._data

    def item(self):
        if self._data.size != 1:
            raise InputError(f"item(): the tensor has {self._data.size} elements (shape {self.shape}), expected 1")
        return self._data.item()

    def tolist(self):
        return self._data.tolist()

    def __float__(self):
        return float(self._one_value("float()"))

    def __int__(self):
        return int(self._one_value("int()"))

    def __format__(self, format_spec):
        """f"{loss:.3f}" formats the value of a one-element tensor; f"{t}" prints any tensor."""
        if not format_spec:
            return str(self)
        return format(self._one_value(f"format with {format_spec!r}"), format_spec)

    def _one_value(self, what):
        if self._data.size != 1:
            raise InputError(f"{what}: the tensor has {self._data.size} elements (shape {self.shape}), expected 1 (index it, or reduce it first)")
        return self._data.item()

    def detach(self):
        """The same values (the same memory, and so the same version counter), cut off from the
        graph: no gradient flows through it."""
        detached = Tensor._from_array(self._data, False)
        detached._version_counter = self._version_counter
        return detached

    def requires_grad_(self, requires_grad=True):
        if check_flag("requires_grad_", "requires_grad", requires_grad) and self._data.dtype not in FLOAT_DTYPES:
            raise InputTypeError(f"requires_grad_: only float tensors can require gradients, got {self.dtype}")
        if not requires_grad and self._ctx is not None:
            raise GraphError("requires_grad_(False): this tensor was made by an op in the graph; use .detach() for a copy outside it")
        self.requires_grad = bool(requires_grad)
        return self

    def to(self, dtype):
        """A differentiable cast to float32 or float64 (the only way dtypes change)."""
        return _elementwise.cast(self, dtype)

    def float(self):
        return self.to(float32)

    def double(self):
        return self.to(float64)

    # ----------------------------------------------------------------------------- autograd
    def backward(self, grad=None, retain_graph=False):
        _autograd.backward(self, grad, retain_graph)

    def zero_grad(self):
        self.grad = None

    def register_hook(self, hook):
        """Call `hook(grad)` during backward when this tensor's gradient is complete (every use has
        added its part), before it flows on to the inputs or into `.grad`. `grad` is a read-only
        Tensor; a hook that returns a Tensor or array of the same shape and dtype replaces the
        gradient, one that returns None leaves it. Returns a handle whose `.remove()` takes the
        hook away. Hooks on one tensor run in the order they were registered."""
        if not callable(hook):
            raise InputTypeError(f"register_hook: expected a function grad -> None or a new gradient, got {describe(hook)}")
        if not self.requires_grad:
            raise GraphError("register_hook: this tensor does not require a gradient, so no gradient will reach the hook")
        self._hooks = self._hooks + (hook,)
        return RemovableHook(self, hook)

    def retain_grad(self):
        """Keep `.grad` on this non-leaf tensor after backward (leaves always keep theirs)."""
        if not self.requires_grad:
            raise GraphError("retain_grad: this tensor does not require a gradient")
        self._retains_grad = True

    # ----------------------------------------------------------------------------- arithmetic
    def __add__(self, other):
        return _elementwise.add(self, other)

    def __radd__(self, other):
        return _elementwise.add(other, self)

    def __sub__(self, other):
        return _elementwise.sub(self, other)

    def __rsub__(self, other):
        return _elementwise.sub(other, self)

    def __mul__(self, other):
        return _elementwise.mul(self, other)

    def __rmul__(self, other):
        return _elementwise.mul(other, self)

    def __truediv__(self, other):
        return _elementwise.div(self, other)

    def __rtruediv__(self, other):
        return _elementwise.div(other, self)

    def __neg__(self):
        return _elementwise.neg(self)

    def __pow__(self, exponent):
        return _elementwise.pow(self, exponent)

    def __rpow__(self, base):
        return _elementwise.pow(base, self)

    def __matmul__(self, other):
        return _matmul.matmul(self, other)

    def __rmatmul__(self, other):
        return _matmul.matmul(other, self)

    def __getitem__(self, index):
        return _shape.getitem(self, index)

    # Comparisons: plain boolean tensors, outside the graph. (`1 < t` reaches t.__gt__(1), which is
    # the same comparison; == and != with an unrelated object give Python's own identity answer.)
    def __lt__(self, other):
        return _compare("<", np.less, self, other)

    def __le__(self, other):
        return _compare("<=", np.less_equal, self, other)

    def __gt__(self, other):
        return _compare(">", np.greater, self, other)

    def __ge__(self, other):
        return _compare(">=", np.greater_equal, self, other)

    def __eq__(self, other):
        return _compare("==", np.equal, self, other)

    def __ne__(self, other):
        return _compare("!=", np.not_equal, self, other)

    def exp(self):
        return _elementwise.exp(self)

    def log(self):
        return _elementwise.log(self)

    def sqrt(self):
        return _elementwise.sqrt(self)

    def tanh(self):
        return _elementwise.tanh(self)

    def relu(self):
        return _elementwise.relu(self)

    def sigmoid(self):
        return _elementwise.sigmoid(self)

    # ----------------------------------------------------------------------------- reductions
    def sum(self, dim=None, keepdim=False):
        return _reduce.sum(self, dim, keepdim)

    def mean(self, dim=None, keepdim=False):
        return _reduce.mean(self, dim, keepdim)

    def max(self, dim=None, keepdim=False):
        return _reduce.max(self, dim, keepdim)

    def argmax(self, dim=None, keepdim=False):
        """Indices of the largest values (an integer tensor, outside the graph): of the flattened
        values when dim is None."""
        keepdim = check_flag("argmax", "keepdim", keepdim)
        axis = None if dim is None else normalize_dim("argmax", dim, self.ndim)
        length = self._data.size if axis is None else self._data.shape[axis]
        if length == 0:
            raise InputError(f"argmax: no largest value in an empty {'tensor' if axis is None else f'dim {dim}'} (shape {self.shape})")
        return Tensor._from_array(np.asarray(np.argmax(self._data, axis=axis, keepdims=keepdim)))

    def any(self):
        return bool(self._data.any())

    def all(self):
        return bool(self._data.all())

    # ----------------------------------------------------------------------------- shapes
    def reshape(self, *shape):
        return _shape.reshape(self, *shape)

    view = reshape

    def flatten(self, start_dim=0, end_dim=-1):
        return _shape.flatten(self, start_dim, end_dim)

    def permute(self, *dims):
        return _shape.permute(self, *dims)

    def transpose(self, dim0, dim1):
        return _shape.transpose(self, dim0, dim1)

    @property
    def T(self):
        return _shape.permute(self, *reversed(range(self.ndim)))

    def split(self, split_size_or_sections, dim=0):
        return _shape.split(self, split_size_or_sections, dim)

    def masked_fill(self, mask, value):
        return _shape.masked_fill(self, mask, value)


def _comparable(value):
    """A Tensor, numpy array or number as an array, or None for anything else."""
    if isinstance(value, Tensor):
        return value._data
    if isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating)):
        return np.asarray(value)
    if isinstance(value, np.ndarray) and (value.dtype in FLOAT_DTYPES or value.dtype.kind in "iub"):
        return value
    return None


def _compare(symbol, numpy_op, a, b):
    left, right = _comparable(a), _comparable(b)
    if left is None or right is None:
        other = b if left is not None else a
        if symbol in ("==", "!=") and not isinstance(other, (list, tuple, np.ndarray)):
            return NotImplemented  # Python's own answer for unrelated objects: equal only to itself
        raise InputTypeError(f"{symbol}: cannot compare a Tensor with {describe(other)}; expected a Tensor, a numpy array or a number")
    try:
        np.broadcast_shapes(left.shape, right.shape)
    except ValueError:
        raise InputError(f"{symbol}: shapes {left.shape} and {right.shape} cannot be broadcast together") from None
    return Tensor._from_array(np.asarray(numpy_op(left, right)))


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


# The one import circle of microtensor, closed here: Tensor's methods (+, @, .sum(), .backward())
# call the ops and the backward walk, and those make and take Tensors, so they are imported once
# the class exists. Every other module imports only modules below it (tests/test_imports.py).
from . import autograd as _autograd  # noqa: E402
from .ops import elementwise as _elementwise  # noqa: E402
from .ops import matmul as _matmul  # noqa: E402
from .ops import reduce as _reduce  # noqa: E402
from .ops import shape as _shape  # noqa: E402
