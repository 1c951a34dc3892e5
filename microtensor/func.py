"""Function transforms: derivatives as functions, in the shape of torch.func and JAX.

    import microtensor as mt

    mt.func.grad(f)(x)                        ∇f(x) of a scalar f: one forward, one backward
    out, vjp_fn = mt.func.vjp(f, x)           vjp_fn(u) = Jᵀ u: one backward per call
    out, jv = mt.func.jvp(f, (x,), (v,))      J v: one forward-mode run (mt.jvp)
    mt.func.jacobian(f, mode="rev")(x)        the whole J, by rows (reverse) or by columns ("fwd")
    mt.func.finite_difference_hvp(f, (x,), (v,))
                                              (∇f(x), H v), H v by central differences of ∇f

Every derivative they return is a Tensor, as mt.jvp returns its tangent and as torch.func returns
tensors, so that a transform's result reads like f's own output (`.numpy()` gives the array). These
Tensors carry no graph: a derivative here is not differentiable again. The backward walk calls each
op's `backward` on numpy arrays, and `mt.jvp` calls each op's `jvp` rule on numpy arrays; neither
runs through `Function.apply`, so neither records ops a second derivative could follow. The
transforms therefore do not nest: grad(grad(f)), mt.jvp of grad(f), or a transform inside the f of
another are refused with a GraphError instead of answered with a silent zero.

That is also why there is no exact Hessian-vector product. Forward-over-reverse, H v =
jvp(grad(f), x, v), needs the tangent of every backward kernel, that is a JVP rule for each op's
backward (its second derivative), which the ops do not have. `finite_difference_hvp` is what can
be built honestly from the two modes: central differences of the exact reverse-mode gradient,
(∇f(x + h v) - ∇f(x - h v)) / 2h, with an error of about h² (truncation) plus 1e-16/h (rounding).

The arguments a transform differentiates must be float Tensors or float numpy arrays; each is
copied into a new leaf Tensor, so the caller's tensors and their `.grad` are never touched. The
other arguments are passed to f as they are, except that numpy arrays become Tensors and Tensors
are detached: only the differentiated arguments receive a gradient.
"""
import numpy as np

from . import autograd
from .autograd import is_grad_enabled, jvp as forward_mode_jvp
from .checks import FLOAT_DTYPES, describe
from .errors import GraphError, InputError, InputIndexError, InputTypeError
from .tensor import Tensor

MODES = ("rev", "fwd")  # jacobian's modes: rows by reverse mode, columns by forward mode

_running = None  # the transform whose f is running now, or None: the transforms do not nest


def _check_callable(transform, f):
    if not callable(f):
        raise InputTypeError(f"{transform}: f must be callable (a function of Tensors), got {describe(f)}")


def _check_argnums(transform, argnums):
    """argnums as given to grad or jacobian: an int, or a non-empty tuple of distinct ints."""
    many = isinstance(argnums, tuple)
    for index in argnums if many else (argnums,):
        if not isinstance(index, (int, np.integer)) or isinstance(index, (bool, np.bool_)):
            raise InputTypeError(f"{transform}: argnums must be an int or a tuple of ints, got {argnums!r}")
    if many and (not argnums or len(set(argnums)) != len(argnums)):
        raise InputError(f"{transform}: argnums must be a non-empty tuple of distinct ints, got {argnums!r}")
    return argnums


def _positions(transform, argnums, count):
    """The argument positions argnums names, for a call with `count` arguments (negative counts from the end)."""
    positions = []
    for index in argnums if isinstance(argnums, tuple) else (argnums,):
        if not -count <= index < count:
            raise InputIndexError(
                f"{transform}: argnums {argnums!r} names argument {index}, but f was called with {count} "
                f"argument{'s' if count != 1 else ''} (valid: {-count} to {count - 1})"
            )
        positions.append(int(index) % count)
    if len(set(positions)) != len(positions):
        raise InputError(f"{transform}: argnums {argnums!r} names the same argument twice")
    return positions


def _float_array(transform, name, value):
    """The values of a differentiated argument: a float Tensor's or a float numpy array's."""
    array = value._data if isinstance(value, Tensor) else value
    if not isinstance(array, np.ndarray):
        raise InputTypeError(f"{transform}: {name} must be a float Tensor or a float numpy array, got {describe(value)}")
    if array.dtype not in FLOAT_DTYPES:
        raise InputTypeError(f"{transform}: {name} has dtype {array.dtype}; only float32 and float64 values have derivatives")
    return array


def _as_tensors(args):
    """args with every numpy array made a Tensor (of the same memory) that needs no gradient, and
    every Tensor detached: only the differentiated arguments may receive a gradient."""
    return [Tensor._from_array(a) if isinstance(a, np.ndarray) else a.detach() if isinstance(a, Tensor) else a for a in args]


def _leaves(transform, args, positions):
    """args with each differentiated one replaced by a new leaf that requires grad (a copy of its
    values), and the others as `_as_tensors` makes them."""
    leaves = _as_tensors(args)
    for i in positions:
        array = _float_array(transform, f"argument {i}", args[i])
        leaves[i] = Tensor._from_array(np.array(array, copy=True), requires_grad=True)
    return leaves


def _moving(transform, name, value):
    """A primal for forward mode: a Tensor of the value's memory that requires grad, so that every op
    f runs on it goes through Function.apply, where mt.jvp carries the tangents (indexing a tensor
    that needs no gradient returns a plain view, outside apply, and its tangent would be lost)."""
    return Tensor._from_array(_float_array(transform, name, value), requires_grad=True)


class _Running:
    """Marks a transform's f as running, and refuses one transform inside another (see the module docstring)."""

    def __init__(self, transform):
        self.transform = transform

    def __enter__(self):
        global _running
        if _running is not None or autograd._forward_tangents is not None:
            outer = _running or "mt.jvp"
            raise GraphError(
                f"{self.transform}: called while {outer} runs its f; transforms do not nest here, because a "
                "derivative is computed by numpy code outside the graph and is not differentiable again "
                "(for H v, see mt.func.finite_difference_hvp)"
            )
        _running = self.transform

    def __exit__(self, *exc_info):
        global _running
        _running = None


def _recorded_output(transform, f, args):
    """f(*args) with gradients recorded: one Tensor that depends on the leaves through the graph."""
    if not is_grad_enabled():
        raise InputError(f"{transform}: gradients are disabled (inside mt.no_grad()), so there is no backward to run")
    with _Running(transform):
        out = f(*args)
    if not isinstance(out, Tensor):
        raise InputTypeError(f"{transform}: f must return one Tensor, got {describe(out)}")
    if out.dtype not in FLOAT_DTYPES:
        raise InputTypeError(f"{transform}: f returned a Tensor of dtype {out.dtype}; only a float output has derivatives")
    if not out.requires_grad:
        raise GraphError(
            f"{transform}: f's output (shape {out.shape}) does not depend on the differentiated arguments through "
            "any recorded op: it is a constant, or it was computed outside the graph (under mt.no_grad(), from "
            ".data or .numpy(), or from a derivative, which is not differentiable again here)"
        )
    return out


def _gradients(out, leaves, cotangent):
    """Jᵀ u for each leaf, by one backward from `out` with grad_out = `cotangent` (the graph is kept)."""
    for leaf in leaves:
        leaf.grad = None
    out.backward(cotangent, retain_graph=True)
    return [leaf.grad if leaf.grad is not None else np.zeros_like(leaf._data) for leaf in leaves]


def grad(f, argnums=0):
    """The gradient of a scalar function, as a function: grad(f)(*args) = ∂f/∂args[argnums].

    f takes Tensors and returns a one-element float Tensor (a loss). The transform runs f once with
    the differentiated arguments as new leaves, then one backward; the gradient comes back as a
    Tensor of its argument's shape and dtype (a tuple of them when argnums is a tuple). argnums
    counts from 0, negative from the end, like Python's indices.

        f = lambda x, w: (x @ w).tanh().sum()
        dx = mt.func.grad(f)(x, w)                       # ∂f/∂x, shaped like x
        dx, dw = mt.func.grad(f, argnums=(0, 1))(x, w)

    For a non-scalar output use `vjp` (one contraction Jᵀ u) or `jacobian` (all of J).
    """
    _check_callable("grad", f)
    argnums = _check_argnums("grad", argnums)

    def gradient(*args):
        positions = _positions("grad", argnums, len(args))
        args = _leaves("grad", args, positions)
        out = _recorded_output("grad", f, args)
        if out.numel() != 1:
            raise InputError(
                f"grad: f must return a scalar (a one-element Tensor), got shape {out.shape}; for a non-scalar "
                "output use mt.func.vjp (Jᵀ u for a u of your choice) or mt.func.jacobian"
            )
        grads = [Tensor._from_array(g) for g in _gradients(out, [args[i] for i in positions], None)]
        return tuple(grads) if isinstance(argnums, tuple) else grads[0]

    gradient.__name__ = f"grad_of_{getattr(f, '__name__', 'f')}"
    return gradient


def vjp(f, *primals):
    """f's output at `primals`, and a function that pulls a cotangent back: (out, vjp_fn).

    vjp_fn(u), for u of the output's shape and dtype (a numpy array or a Tensor; a number for a
    one-element output), returns Jᵀ u for every primal, as a tuple of Tensors shaped like them.
    f runs once; each call of vjp_fn is one backward through the same graph, kept for the next call.
    Every primal must be a float Tensor or float numpy array. grad(f)(x) equals vjp(f, x)[1](1.0)[0].
    """
    _check_callable("vjp", f)
    if not primals:
        raise InputError("vjp: no primals given; call vjp(f, x, ...) with f's arguments")
    leaves = _leaves("vjp", primals, range(len(primals)))
    out = _recorded_output("vjp", f, leaves)

    def vjp_fn(cotangent):
        if isinstance(cotangent, (int, float, np.integer, np.floating)) and not isinstance(cotangent, (bool, np.bool_)):
            if out.numel() != 1:
                raise InputError(f"vjp_fn: a number is a cotangent only for a one-element output; f's output has shape {out.shape}")
            cotangent = np.full(out.shape, cotangent, dtype=out.dtype)
        if isinstance(cotangent, Tensor):
            cotangent = cotangent._data
        if not isinstance(cotangent, np.ndarray):
            raise InputTypeError(f"vjp_fn: the cotangent must be a numpy array or a Tensor of f's output's shape, got {describe(cotangent)}")
        if cotangent.shape != out.shape or cotangent.dtype != out.dtype:
            raise InputError(
                f"vjp_fn: the cotangent has shape {cotangent.shape} and dtype {cotangent.dtype}, but f's output has "
                f"shape {out.shape} and dtype {out.dtype}; a cotangent is a direction in the output's own space"
            )
        return tuple(Tensor._from_array(g) for g in _gradients(out, leaves, cotangent))

    return out.detach(), vjp_fn


def jvp(f, primals, tangents):
    """f's output at `primals` and its directional derivative along `tangents`: (out, J v).

    primals and tangents are tuples of the same length; each primal a float Tensor or float numpy
    array, each tangent of its primal's shape and dtype (or None: that argument does not move).
    One run of f in forward mode: this is `mt.jvp` (autograd.py), with numpy arrays accepted as
    primals and the same refusal to nest inside another transform.
    """
    _check_callable("jvp", f)
    if not isinstance(primals, (tuple, list)):
        raise InputTypeError(f"jvp: primals must be a tuple of f's arguments, got {describe(primals)}")
    if not isinstance(tangents, (tuple, list)):
        raise InputTypeError(f"jvp: tangents must be a tuple with one entry per primal ({len(primals)}), got {describe(tangents)}")
    arguments = tuple(_moving("jvp", f"primals[{i}]", p) for i, p in enumerate(primals))
    with _Running("jvp"):
        return forward_mode_jvp(f, arguments, tuple(tangents))


def jacobian(f, argnums=0, mode="rev"):
    """The Jacobian of f, as a function: jacobian(f)(*args) has shape out.shape + x.shape, x = args[argnums].

    J[i..., j...] = ∂out[i...]/∂x[j...]. For f from n numbers to m numbers, the two modes build it
    differently and cost differently:

        mode="rev"   by rows: f once, then one backward per output element, u = e_i gives row i.
                     Cost: 1 forward + m backwards. Cheap when the output is small (m = 1: the gradient).
        mode="fwd"   by columns: one forward-mode run (mt.jvp) per input element, v = e_j gives column j.
                     Cost: n forwards, each with its JVP rules. Cheap when the input is small.

    Both work for any output shape; both give the same J to rounding. A tuple argnums gives a tuple
    of Jacobians, one per argument (the rows of every argument come from the same backwards).
    """
    _check_callable("jacobian", f)
    argnums = _check_argnums("jacobian", argnums)
    if not isinstance(mode, str) or mode not in MODES:
        raise InputError(f"jacobian: mode must be 'rev' (rows, by reverse mode) or 'fwd' (columns, by forward mode), got {mode!r}")

    def jacobian_of(*args):
        positions = _positions("jacobian", argnums, len(args))
        blocks = (_by_rows if mode == "rev" else _by_columns)(f, args, positions)
        blocks = [Tensor._from_array(block) for block in blocks]
        return tuple(blocks) if isinstance(argnums, tuple) else blocks[0]

    jacobian_of.__name__ = f"jacobian_of_{getattr(f, '__name__', 'f')}"
    return jacobian_of


def _by_rows(f, args, positions):
    """Reverse mode: one backward per output element; row i of J is Jᵀ e_i."""
    args = _leaves("jacobian", args, positions)
    leaves = [args[i] for i in positions]
    out = _recorded_output("jacobian", f, args)
    rows = [np.empty((out.numel(),) + leaf.shape, dtype=leaf.dtype) for leaf in leaves]  # (m, *x.shape) each
    unit = np.zeros(out.numel(), dtype=out.dtype)  # e_i, flat
    for i in range(out.numel()):
        unit[i] = 1
        for block, g in zip(rows, _gradients(out, leaves, unit.reshape(out.shape).copy())):
            block[i] = g
        unit[i] = 0
    return [block.reshape(out.shape + leaf.shape) for block, leaf in zip(rows, leaves)]


def _by_columns(f, args, positions):
    """Forward mode: one mt.jvp per input element; column j of J is J e_j."""
    primals = _as_tensors(args)
    for i in positions:
        primals[i] = _moving("jacobian", f"argument {i}", args[i])

    def checked(*arguments):  # f, with its output checked before mt.jvp reads it
        out = f(*arguments)
        if not isinstance(out, Tensor):
            raise InputTypeError(f"jacobian: f must return one Tensor, got {describe(out)}")
        return out

    out, blocks = None, []
    for i in positions:
        x = primals[i]
        columns = []
        for j in range(x.numel()):
            unit = np.zeros(x.numel(), dtype=x.dtype)
            unit[j] = 1
            tangents = [unit.reshape(x.shape) if k == i else None for k in range(len(primals))]
            with _Running("jacobian"):
                out, column = forward_mode_jvp(checked, tuple(primals), tuple(tangents))
            columns.append(column._data.reshape(-1))
        if out is None:  # no input element at all: f runs once for the output's shape
            with _Running("jacobian"):
                out = checked(*primals)
        block = np.stack(columns, axis=1) if columns else np.zeros((out.numel(), 0), dtype=out.dtype)  # (m, n)
        blocks.append(block.reshape(out.shape + x.shape))
    return blocks


def finite_difference_hvp(f, primals, tangents, eps=1e-5):
    """(∇f(x), H v) for a scalar f, H v by central differences of the reverse-mode gradient.

    Not forward-over-reverse (the module docstring says why it cannot be built here): with the
    gradient ∇f exact from `grad`,

        H v ≈ (∇f(x + h v̂) - ∇f(x - h v̂)) / 2h · |v|,    v̂ = v / |v|,  h = eps,

    two backwards for any size of x. Its error is about h² |∂³f| / 6 (truncation) plus
    1e-16 |∇f| / h (rounding): about 1e-10 relative at the default eps = 1e-5, in float64, which
    is required. primals and tangents are tuples of the same length (every primal moves, its
    tangent of its shape; |v| is the norm of all of them together). Returns two tuples of Tensors:
    the gradient and H v, one per primal.
    """
    _check_callable("finite_difference_hvp", f)
    where = "finite_difference_hvp"
    if not isinstance(primals, (tuple, list)) or not primals:
        raise InputTypeError(f"{where}: primals must be a non-empty tuple of f's arguments, got {describe(primals)}")
    if not isinstance(tangents, (tuple, list)) or len(tangents) != len(primals):
        raise InputError(f"{where}: tangents must be a tuple with one entry per primal ({len(primals)}), got {describe(tangents)}")
    if not (isinstance(eps, (float, int)) and not isinstance(eps, bool) and 0 < eps < 1):
        raise InputError(f"{where}: eps must be a number between 0 and 1, got {eps!r}")
    xs, vs = [], []
    for i, (primal, tangent) in enumerate(zip(primals, tangents)):
        x = _float_array(where, f"primals[{i}]", primal)
        v = _float_array(where, f"tangents[{i}]", tangent)
        if x.dtype != np.float64:
            raise InputTypeError(f"{where}: primals[{i}] is {x.dtype}; central differences need float64 (in float32 their rounding error is about 1e-7 / eps)")
        if v.shape != x.shape or v.dtype != x.dtype:
            raise InputError(
                f"{where}: tangents[{i}] has shape {v.shape} and dtype {v.dtype}, but its primal has shape "
                f"{x.shape} and dtype {x.dtype}; a tangent is a direction in the primal's own space"
            )
        xs.append(x)
        vs.append(v)
    gradient_of = grad(f, argnums=tuple(range(len(xs))))
    gradient = gradient_of(*xs)
    norm = float(np.sqrt(sum(np.sum(v * v) for v in vs)))
    if norm == 0:
        return gradient, tuple(Tensor._from_array(np.zeros_like(x)) for x in xs)
    step = eps / norm  # x ± step v moves x by eps, whatever the scale of v
    plus = gradient_of(*[x + step * v for x, v in zip(xs, vs)])
    minus = gradient_of(*[x - step * v for x, v in zip(xs, vs)])
    products = tuple(Tensor._from_array((p._data - m._data) / (2 * step)) for p, m in zip(plus, minus))
    return gradient, products
