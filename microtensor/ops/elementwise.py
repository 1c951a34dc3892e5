"""Elementwise ops: add, sub, mul, div, neg, pow, exp, log, sqrt, tanh, relu, sigmoid, cast.

Each output element depends on the input elements at the same position only, so every Jacobian is
diagonal and backward is an elementwise product: for y = f(x), dL/dx = dL/dy * f'(x).

Forward mode is the same diagonal read the other way: dy = f'(x) * t for a tangent t of x, the
directional derivative (a diagonal Jacobian is its own transpose, so JVP and VJP share the factor).

Binary ops follow numpy broadcasting (x (3, 1) + y (4,) gives (3, 4)); their backward sums each
gradient back down to its input's shape with `unbroadcast`. Python numbers take the tensor's dtype;
two tensors of different dtypes are an error, never a silent cast. These ops are one numpy call each
(memory-bound, nothing a hand loop would win), so they have no Numba kernel. One has a fast twin:
the sum of two arrays of one shape (`add_arrays`, a GPT's residual connection), which the fast set
shares among the threads (microtensor/fast/memory.py).
"""
import numpy as np

from ..autograd import Function, add_tangents, unbroadcast
from ..checks import as_dtype, broadcast_shape, check_float, describe
from ..errors import InputTypeError
from ..gradcheck import gradcheck_case
from ..kernels import active
from ..tensor import Tensor, as_tensor


def _binary(op, function, a, b):
    """a and b: Tensors, numpy arrays or Python numbers, at least one a Tensor (numbers and integer
    arrays take its dtype)."""
    if not isinstance(a, Tensor):
        if not isinstance(b, Tensor):
            raise InputTypeError(f"{op}: expected at least one Tensor, got {describe(a)} and {describe(b)}")
        a = as_tensor(op, a, b)
    b = as_tensor(op, b, a)
    check_float(op, a, b)
    if a.shape != b.shape:
        broadcast_shape(op, a.shape, b.shape)
    return function.apply(a, b)


def _unary(op, function, x):
    check_float(op, x)
    return function.apply(x)


def add_arrays(a, b):
    """a + b as a new array, for two arrays of one shape and dtype."""
    return a + b


class Add(Function):
    """y = a + b.   dL/da = unbroadcast(g),  dL/db = unbroadcast(g).

    JVP: dy = ta + tb, each broadcast to y's shape (the directional derivative of a sum).
    """

    @staticmethod
    def forward(ctx, a, b):
        ctx.shapes = (a.shape, b.shape)
        return active(add_arrays)(a, b) if a.shape == b.shape else a + b

    @staticmethod
    def backward(ctx, grad_out):
        a_shape, b_shape = ctx.shapes
        return unbroadcast(grad_out, a_shape), unbroadcast(grad_out, b_shape)

    @staticmethod
    def jvp(ctx, tangent_a, tangent_b):
        return add_tangents(np.broadcast_shapes(*ctx.shapes), tangent_a, tangent_b)


class Sub(Function):
    """y = a - b.   dL/da = unbroadcast(g),  dL/db = -unbroadcast(g).

    JVP: dy = ta - tb, each broadcast to y's shape.
    """

    @staticmethod
    def forward(ctx, a, b):
        ctx.shapes = (a.shape, b.shape)
        return a - b

    @staticmethod
    def backward(ctx, grad_out):
        a_shape, b_shape = ctx.shapes
        return unbroadcast(grad_out, a_shape), -unbroadcast(grad_out, b_shape)

    @staticmethod
    def jvp(ctx, tangent_a, tangent_b):
        return add_tangents(np.broadcast_shapes(*ctx.shapes), tangent_a, None if tangent_b is None else -tangent_b)


class Mul(Function):
    """y = a * b.   dL/da = unbroadcast(g * b),  dL/db = unbroadcast(g * a).

    JVP (the product rule): dy = ta * b + a * tb, broadcast to y's shape.
    """

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    def backward(ctx, grad_out):
        a, b = ctx.saved_tensors
        grad_a = unbroadcast(grad_out * b, a.shape) if ctx.needs_input_grad[0] else None
        grad_b = unbroadcast(grad_out * a, b.shape) if ctx.needs_input_grad[1] else None
        return grad_a, grad_b

    @staticmethod
    def jvp(ctx, tangent_a, tangent_b):
        a, b = ctx.saved_tensors
        return add_tangents(
            np.broadcast_shapes(a.shape, b.shape),
            None if tangent_a is None else tangent_a * b,
            None if tangent_b is None else a * tangent_b,
        )


class Div(Function):
    """y = a / b.   dL/da = unbroadcast(g / b),  dL/db = unbroadcast(-g * a / b^2) = unbroadcast(-g * y / b).

    JVP (the quotient rule): dy = ta / b - tb * a / b^2 = ta / b - tb * y / b.
    """

    @staticmethod
    def forward(ctx, a, b):
        y = a / b
        ctx.save_for_backward(a, b, y)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        a, b, y = ctx.saved_tensors
        grad_a = unbroadcast(grad_out / b, a.shape) if ctx.needs_input_grad[0] else None
        grad_b = unbroadcast(-grad_out * y / b, b.shape) if ctx.needs_input_grad[1] else None
        return grad_a, grad_b

    @staticmethod
    def jvp(ctx, tangent_a, tangent_b):
        a, b, y = ctx.saved_tensors
        return add_tangents(
            y.shape,
            None if tangent_a is None else tangent_a / b,
            None if tangent_b is None else -tangent_b * y / b,
        )


class Neg(Function):
    """y = -x.   dL/dx = -g.

    JVP: dy = -t.
    """

    @staticmethod
    def forward(ctx, x):
        return -x

    @staticmethod
    def backward(ctx, grad_out):
        return -grad_out

    @staticmethod
    def jvp(ctx, tangent):
        return -tangent


class Pow(Function):
    """y = a ** b.

    dL/da = unbroadcast(g * b * a^(b-1)),
    dL/db = unbroadcast(g * y * ln a)        (only defined for a > 0; needed only when b requires grad).

    Two points where the formulas multiply 0 by infinity, though the derivative is 0:
    - b = 0: y = a^0 = 1 whatever a is, so dy/da = 0 (at a = 0 the formula gives 0 * 0^-1 = 0 * inf);
    - a = 0 with b >= 0: y = 0^b is 0 (or 1 at b = 0) for every b nearby on that side, so dy/db is
      taken as 0, as PyTorch does (the formula gives y * ln 0 = 0 * -inf).

    JVP: dy = b a^(b-1) ta + y ln(a) tb, with the same two points taken as 0; both terms are
    the partial derivatives backward multiplies g by, here multiplied by the tangents instead.
    """

    @staticmethod
    def forward(ctx, a, b):
        y = a**b
        ctx.save_for_backward(a, b, y)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        a, b, y = ctx.saved_tensors
        zero = y.dtype.type(0)
        grad_a = grad_b = None
        with np.errstate(divide="ignore", invalid="ignore"):  # the 0 * inf points, replaced below
            if ctx.needs_input_grad[0]:
                dy_da = np.where(b == 0, zero, b * a ** (b - 1))
                grad_a = unbroadcast(grad_out * dy_da, a.shape)
            if ctx.needs_input_grad[1]:
                dy_db = np.where((a == 0) & (b >= 0), zero, y * np.log(a))
                grad_b = unbroadcast(grad_out * dy_db, b.shape)
        return grad_a, grad_b

    @staticmethod
    def jvp(ctx, tangent_a, tangent_b):
        a, b, y = ctx.saved_tensors
        zero = y.dtype.type(0)
        with np.errstate(divide="ignore", invalid="ignore"):  # the 0 * inf points, replaced as in backward
            term_a = None if tangent_a is None else np.where(b == 0, zero, b * a ** (b - 1)) * tangent_a
            term_b = None if tangent_b is None else np.where((a == 0) & (b >= 0), zero, y * np.log(a)) * tangent_b
        return add_tangents(y.shape, term_a, term_b)


class Exp(Function):
    """y = e^x.   dL/dx = g * y.

    JVP: dy = t * y.
    """

    @staticmethod
    def forward(ctx, x):
        y = np.exp(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        (y,) = ctx.saved_tensors
        return grad_out * y

    @staticmethod
    def jvp(ctx, tangent):
        (y,) = ctx.saved_tensors
        return tangent * y


class Log(Function):
    """y = ln x.   dL/dx = g / x.

    JVP: dy = t / x.
    """

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return np.log(x)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out / x

    @staticmethod
    def jvp(ctx, tangent):
        (x,) = ctx.saved_tensors
        return tangent / x


class Sqrt(Function):
    """y = sqrt(x).   dL/dx = g / (2 y).

    JVP: dy = t / (2 y).
    """

    @staticmethod
    def forward(ctx, x):
        y = np.sqrt(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        (y,) = ctx.saved_tensors
        return grad_out / (2 * y)

    @staticmethod
    def jvp(ctx, tangent):
        (y,) = ctx.saved_tensors
        return tangent / (2 * y)


class Tanh(Function):
    """y = tanh x.   dL/dx = g * (1 - y^2).

    JVP: dy = t * (1 - y^2).
    """

    @staticmethod
    def forward(ctx, x):
        y = np.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        (y,) = ctx.saved_tensors
        return grad_out * (1 - y * y)

    @staticmethod
    def jvp(ctx, tangent):
        (y,) = ctx.saved_tensors
        return tangent * (1 - y * y)


class Relu(Function):
    """y = max(x, 0).   dL/dx = g where x > 0, else 0 (the kink at 0 gets 0, as in PyTorch).

    JVP: dy = t where x > 0, else 0 (the same choice at the kink).
    """

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return np.maximum(x, 0)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return np.where(x > 0, grad_out, 0).astype(grad_out.dtype, copy=False)

    @staticmethod
    def jvp(ctx, tangent):
        (x,) = ctx.saved_tensors
        return np.where(x > 0, tangent, tangent.dtype.type(0))


class Sigmoid(Function):
    """y = 1 / (1 + e^-x).   dL/dx = g * y * (1 - y).

    Computed as e^x / (1 + e^x) for x < 0 so that e^-x never overflows.

    JVP: dy = t * y * (1 - y).
    """

    @staticmethod
    def forward(ctx, x):
        exp_of_minus_abs = np.exp(-np.abs(x))
        y = np.where(x >= 0, 1 / (1 + exp_of_minus_abs), exp_of_minus_abs / (1 + exp_of_minus_abs))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        (y,) = ctx.saved_tensors
        return grad_out * y * (1 - y)

    @staticmethod
    def jvp(ctx, tangent):
        (y,) = ctx.saved_tensors
        return tangent * y * (1 - y)


class Cast(Function):
    """y = x converted to another float dtype.   dL/dx = g converted back to x's dtype.

    JVP: dy = t converted to y's dtype.
    """

    @staticmethod
    def forward(ctx, x, dtype):
        ctx.input_dtype = x.dtype
        return x.astype(dtype)

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out.astype(ctx.input_dtype), None

    @staticmethod
    def jvp(ctx, tangent, _dtype):
        return tangent.astype(ctx.inputs[1])  # the tangent moves into y's dtype, as the values do


def add(a, b):
    return _binary("add", Add, a, b)


def sub(a, b):
    return _binary("sub", Sub, a, b)


def mul(a, b):
    return _binary("mul", Mul, a, b)


def div(a, b):
    return _binary("div", Div, a, b)


def neg(x):
    return _unary("neg", Neg, x)


def pow(a, b):
    return _binary("pow", Pow, a, b)


def exp(x):
    return _unary("exp", Exp, x)


def log(x):
    return _unary("log", Log, x)


def sqrt(x):
    return _unary("sqrt", Sqrt, x)


def tanh(x):
    return _unary("tanh", Tanh, x)


def relu(x):
    return _unary("relu", Relu, x)


def sigmoid(x):
    return _unary("sigmoid", Sigmoid, x)


def cast(x, dtype):
    """x as float32 or float64 (a differentiable step in the graph; x itself when it already is)."""
    dtype = as_dtype("cast", dtype, floats_only=True)
    check_float("cast", x)
    if dtype == x.dtype:
        return x
    return Cast.apply(x, dtype)


# --------------------------------------------------------------------------------- gradcheck cases


def _broadcast_pair(draw, low=-2.0, high=2.0):
    shape = draw.shape(min_dims=1, max_dims=3)
    other = draw.broadcastable_shape(shape)
    if draw.boolean():
        shape, other = other, shape
    return draw.tensor(shape, low, high), draw.tensor(other, low, high)


@gradcheck_case(Add)
def _add_case(draw):
    return add, _broadcast_pair(draw)


@gradcheck_case(Sub)
def _sub_case(draw):
    return sub, _broadcast_pair(draw)


@gradcheck_case(Mul)
def _mul_case(draw):
    return mul, _broadcast_pair(draw)


@gradcheck_case(Div)
def _div_case(draw):
    a, _ = _broadcast_pair(draw)
    b = draw.tensor(draw.broadcastable_shape(a.shape), 0.5, 2.0)  # keep away from division by ~0
    return div, (a, b)


@gradcheck_case(Neg)
def _neg_case(draw):
    return neg, (draw.tensor(draw.shape()),)


@gradcheck_case(Pow)
def _pow_case(draw):
    base = draw.tensor(draw.shape(), 0.5, 2.0)  # a > 0: ln a appears in the exponent's gradient
    if draw.boolean():
        exponent = draw.choice((2.0, 3.0, -1.5, 0.5))
        return (lambda a: pow(a, exponent)), (base,)
    return pow, (base, draw.tensor(draw.broadcastable_shape(base.shape), -2.0, 2.0))


@gradcheck_case(Exp)
def _exp_case(draw):
    return exp, (draw.tensor(draw.shape()),)


@gradcheck_case(Log)
def _log_case(draw):
    return log, (draw.tensor(draw.shape(), 0.2, 3.0),)


@gradcheck_case(Sqrt)
def _sqrt_case(draw):
    return sqrt, (draw.tensor(draw.shape(), 0.2, 3.0),)


@gradcheck_case(Tanh)
def _tanh_case(draw):
    return tanh, (draw.tensor(draw.shape(), -3.0, 3.0),)


@gradcheck_case(Relu)
def _relu_case(draw):
    return relu, (draw.tensor(draw.shape(), away_from=0.0),)


@gradcheck_case(Sigmoid)
def _sigmoid_case(draw):
    return sigmoid, (draw.tensor(draw.shape(), -6.0, 6.0),)


@gradcheck_case(Cast)
def _cast_case(draw):
    # The round trip float64 -> float32 -> float64 checks the gradient's dtype on both legs. Its
    # output moves in float32 steps (~1e-7 relative), far coarser than eps = 1e-6, so the step is
    # 1e-2 and the tolerance covers float32 rounding: ~2.4e-7 / 1e-2 = 2.4e-5.
    x = draw.tensor(draw.shape())
    return (lambda x: cast(cast(x, np.float32), np.float64)), (x,), {"eps": 1e-2, "atol": 1e-4}
