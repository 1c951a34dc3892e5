"""`Tensor`: a numpy array, its gradient, and the op that made it.

A Tensor holds its values in `.data` (a numpy array, float32 unless asked otherwise), and after
`loss.backward()` the gradient of the loss with respect to it in `.grad` (an array of the same shape
and dtype, or None). `._ctx` is the Context of the op that made it (None for a leaf: a tensor the
user made). The arithmetic operators and methods below only forward to the ops in `microtensor/ops/`,
where each op's math, kernels and backward live.
"""
import numpy as np

float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
int64 = np.dtype(np.int64)
bool_ = np.dtype(np.bool_)

FLOAT_DTYPES = (float32, float64)

_default_dtype = float32


def set_default_dtype(dtype):
    """The dtype of tensors made from Python floats and by the constructors (float32 or float64)."""
    global _default_dtype
    dtype = np.dtype(dtype)
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"set_default_dtype: expected float32 or float64, got {dtype}")
    _default_dtype = dtype


def get_default_dtype():
    return _default_dtype


def _to_array(data, dtype):
    """The numpy array a new Tensor holds. Python floats become the default dtype; numpy arrays
    keep theirs unless `dtype` is given; nothing else is converted behind the user's back."""
    if isinstance(data, Tensor):
        data = data.data
    if dtype is not None:
        dtype = np.dtype(dtype)
        if isinstance(data, np.ndarray) and data.dtype.kind == "f" and dtype.kind in "iub":
            raise TypeError(f"tensor: refusing to cast {data.dtype} values to {dtype} (it would drop the fractions)")
        return np.array(data, dtype=dtype)
    array = np.array(data)
    if array.dtype.kind == "f":
        if not isinstance(data, np.ndarray) and not isinstance(data, np.generic):
            array = array.astype(_default_dtype)  # Python floats
        elif array.dtype not in FLOAT_DTYPES:
            raise TypeError(f"tensor: unsupported float dtype {array.dtype}; use float32 or float64")
    elif array.dtype.kind not in "iub":
        raise TypeError(f"tensor: cannot make a tensor from values of dtype {array.dtype}")
    return array


class Tensor:
    __slots__ = ("data", "grad", "requires_grad", "_ctx", "_retains_grad", "__weakref__")

    def __init__(self, data, dtype=None, requires_grad=False):
        self.data = _to_array(data, dtype)
        if requires_grad and self.data.dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"Tensor: only float32 and float64 tensors can require gradients, got {self.data.dtype}"
            )
        self.grad = None
        self.requires_grad = bool(requires_grad)
        self._ctx = None
        self._retains_grad = False

    @classmethod
    def _from_array(cls, array, requires_grad=False):
        """Wrap an op's result without any checks or copies (the hot path of every op)."""
        tensor = cls.__new__(cls)
        tensor.data = array
        tensor.grad = None
        tensor.requires_grad = requires_grad
        tensor._ctx = None
        tensor._retains_grad = False
        return tensor

    # ----------------------------------------------------------------------------- attributes
    @property
    def shape(self):
        return self.data.shape

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def ndim(self):
        return self.data.ndim

    @property
    def is_leaf(self):
        return self._ctx is None

    def size(self, dim=None):
        return self.data.shape if dim is None else self.data.shape[dim]

    def numel(self):
        return self.data.size

    def __len__(self):
        return len(self.data)

    def __repr__(self):
        body = np.array2string(self.data, precision=4, separator=", ", prefix="tensor(")
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
        if self.data.size != 1:
            raise RuntimeError(f"bool() of a tensor of shape {self.shape} is ambiguous; use .any() or .all()")
        return bool(self.data)

    # ----------------------------------------------------------------------------- conversions
    def numpy(self):
        """The values as a numpy array (the same memory, not a copy)."""
        return self.data

    def item(self):
        if self.data.size != 1:
            raise ValueError(f"item(): the tensor has {self.data.size} elements (shape {self.shape}), expected 1")
        return self.data.item()

    def tolist(self):
        return self.data.tolist()

    def detach(self):
        """The same values, cut off from the graph (no gradient flows through it)."""
        return Tensor._from_array(self.data, False)

    def requires_grad_(self, requires_grad=True):
        if requires_grad and self.data.dtype not in FLOAT_DTYPES:
            raise TypeError(f"requires_grad_: only float tensors can require gradients, got {self.dtype}")
        self.requires_grad = requires_grad
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

    def retain_grad(self):
        """Keep `.grad` on this non-leaf tensor after backward (leaves always keep theirs)."""
        if not self.requires_grad:
            raise RuntimeError("retain_grad: this tensor does not require a gradient")
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

    # Comparisons: plain boolean tensors, outside the graph.
    def __lt__(self, other):
        return _compare(np.less, self, other)

    def __le__(self, other):
        return _compare(np.less_equal, self, other)

    def __gt__(self, other):
        return _compare(np.greater, self, other)

    def __ge__(self, other):
        return _compare(np.greater_equal, self, other)

    def __eq__(self, other):
        return _compare(np.equal, self, other)

    def __ne__(self, other):
        return _compare(np.not_equal, self, other)

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
        """Indices of the largest values (an integer tensor, outside the graph)."""
        return Tensor._from_array(np.argmax(self.data, axis=dim, keepdims=keepdim))

    def any(self):
        return bool(self.data.any())

    def all(self):
        return bool(self.data.all())

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


def _compare(numpy_op, a, b):
    a = a.data if isinstance(a, Tensor) else a
    b = b.data if isinstance(b, Tensor) else b
    return Tensor._from_array(numpy_op(a, b))


# The ops import Tensor from this module, so they are imported once Tensor exists.
from . import autograd as _autograd  # noqa: E402
from .ops import elementwise as _elementwise  # noqa: E402
from .ops import matmul as _matmul  # noqa: E402
from .ops import reduce as _reduce  # noqa: E402
from .ops import shape as _shape  # noqa: E402
