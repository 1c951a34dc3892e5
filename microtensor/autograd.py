"""Reverse-mode automatic differentiation: `Function`, its `Context`, and the backward walk.

The whole engine in three ideas:

1. Every differentiable op is a subclass of `Function` with two static methods written by hand:
   `forward(ctx, *arrays, **options) -> array` computes the result from plain numpy arrays, and
   `backward(ctx, grad_out) -> (grad_input_0, grad_input_1, ...)` maps the gradient of the loss with
   respect to the output to the gradients with respect to each input (None where an input needs none).
2. `Function.apply(*inputs)` unwraps the input Tensors, runs `forward`, and, when some input needs a
   gradient, remembers the `Context` (the inputs and whatever forward saved) on the output Tensor.
   That chain of contexts is the computation graph.
3. `backward(root)` sorts the graph topologically (iteratively, so a 10,000-op chain is no problem),
   then walks it from the root to the leaves, calling each op's `backward` once and adding up (`+`)
   every gradient that reaches the same tensor along different paths.

Rules for a Function's author:
- `backward` returns one entry per positional input of `forward`, in order.
- It must never modify `grad_out` in place: the same array may be handed to several ops.
- Each returned gradient has exactly the shape and dtype of its input; the walk checks this and names
  the Function when it does not, so a broadcasting or dtype slip is caught where it happens.
"""
import numpy as np

from .kernels import active
from .tensor import Tensor

_grad_enabled = True


def is_grad_enabled():
    return _grad_enabled


class no_grad:
    """Context manager (and decorator) in which no op records a graph: for evaluation and sampling."""

    def __enter__(self):
        global _grad_enabled
        self._previous = _grad_enabled
        _grad_enabled = False

    def __exit__(self, *exc_info):
        global _grad_enabled
        _grad_enabled = self._previous

    def __call__(self, function):
        def without_grad(*args, **kwargs):
            with no_grad():
                return function(*args, **kwargs)

        without_grad.__name__ = function.__name__
        without_grad.__doc__ = function.__doc__
        return without_grad


class Context:
    """What one call of a Function leaves behind for its backward.

    `saved_tensors` holds the numpy arrays the forward chose to keep; other facts (a dim, a shape)
    are set as plain attributes (`ctx.dim = dim`). When no input needs a gradient the context is
    thrown away with the call and `save_for_backward` keeps nothing.
    """

    def __init__(self, function, inputs, needs_input_grad, requires_grad):
        self.function = function  # the Function subclass that made the output
        self.inputs = inputs  # the positional arguments of apply, Tensors or not
        self.needs_input_grad = needs_input_grad  # one bool per input
        self.requires_grad = requires_grad
        self.saved_tensors = ()
        self.freed = False

    def save_for_backward(self, *arrays):
        if self.requires_grad:
            self.saved_tensors = arrays


class Function:
    """Base class of every differentiable op. See the module docstring for the contract."""

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, grad_out):
        raise NotImplementedError

    @classmethod
    def apply(cls, *args, **kwargs):
        needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        requires_grad = _grad_enabled and any(needs_input_grad)
        ctx = Context(cls, args, needs_input_grad, requires_grad)
        arrays = [a.data if isinstance(a, Tensor) else a for a in args]
        out = cls.forward(ctx, *arrays, **kwargs)
        result = Tensor._from_array(out, requires_grad)
        if requires_grad:
            result._ctx = ctx
        return result


def unbroadcast(grad, shape):
    """Sum `grad` down to `shape`: the backward of numpy broadcasting.

    Broadcasting copies an input along new leading axes and along axes of size 1, so every copy's
    gradient must be added back into the one element it came from. Example: x (3, 1) + y (4,) gives
    (3, 4); the gradient of x is grad.sum(axis=1, keepdims=True), that of y is grad.sum(axis=0).
    """
    if grad.shape == shape:
        return grad
    leading = grad.ndim - len(shape)
    axes = tuple(range(leading)) + tuple(
        leading + i for i, n in enumerate(shape) if n == 1 and grad.shape[leading + i] != 1
    )
    return grad.sum(axis=axes, keepdims=True).reshape(shape)


def topological_order(root):
    """Every tensor that `root` depends on (through ops that need a gradient), inputs before outputs.

    An explicit stack instead of recursion: Python's recursion limit (~1000) would break deep chains.
    Each tensor is pushed once to be expanded (its inputs pushed above it) and once more, below its
    inputs, to be emitted after all of them.
    """
    order = []
    visited = set()
    stack = [(root, False)]
    while stack:
        tensor, inputs_done = stack.pop()
        if inputs_done:
            order.append(tensor)
            continue
        if id(tensor) in visited:
            continue
        visited.add(id(tensor))
        stack.append((tensor, True))
        ctx = tensor._ctx
        if ctx is not None:
            for inp in ctx.inputs:
                if isinstance(inp, Tensor) and inp.requires_grad and id(inp) not in visited:
                    stack.append((inp, False))
    return order


def copy_gradient(grad):
    """A new array with grad's values, for a tensor's `.grad` (the fast set has a twin of it)."""
    return np.array(grad, copy=True)


def _accumulate_into_grad(tensor, grad):
    # The first gradient is copied: `grad` may be shared with other ops or be a read-only view.
    if tensor.grad is None:
        tensor.grad = active(copy_gradient)(grad)
    else:
        tensor.grad += grad


def backward(root, grad=None, retain_graph=False):
    """Fill `.grad` of every leaf tensor that `root` depends on with d(root)/d(leaf) contracted with `grad`."""
    if not root.requires_grad:
        raise RuntimeError(
            "backward: this tensor does not require a gradient (no input of the ops that made it "
            "had requires_grad=True, or it was computed under no_grad())"
        )
    if grad is None:
        if root.data.size != 1:
            raise RuntimeError(
                f"backward: a gradient must be given for a non-scalar output of shape {root.shape}; "
                "call .backward(grad) with an array of that shape, or reduce the output first (e.g. .sum())"
            )
        grad = np.ones_like(root.data)
    else:
        grad = grad.data if isinstance(grad, Tensor) else np.asarray(grad)
        if grad.shape != root.data.shape or grad.dtype != root.data.dtype:
            raise ValueError(
                f"backward: the gradient has shape {grad.shape} and dtype {grad.dtype}, "
                f"but the output has shape {root.shape} and dtype {root.dtype}"
            )

    grads = {id(root): grad}  # gradients that have reached a tensor, not yet passed on
    for tensor in reversed(topological_order(root)):
        grad_out = grads.pop(id(tensor), None)
        if grad_out is None:
            continue  # nothing flowed here (e.g. only through an input that needs no gradient)
        ctx = tensor._ctx
        if ctx is None or tensor._retains_grad:
            _accumulate_into_grad(tensor, grad_out)
        if ctx is None:
            continue
        op = ctx.function.__name__
        if ctx.freed:
            raise RuntimeError(
                f"backward: trying to go through {op} a second time, but its saved arrays were freed "
                "by the first backward; call backward(retain_graph=True) the first time"
            )
        input_grads = ctx.function.backward(ctx, grad_out)
        if not isinstance(input_grads, tuple):
            input_grads = (input_grads,)
        if len(input_grads) != len(ctx.inputs):
            raise RuntimeError(
                f"{op}.backward returned {len(input_grads)} gradients, but forward took {len(ctx.inputs)} inputs"
            )
        for inp, needs_grad, input_grad in zip(ctx.inputs, ctx.needs_input_grad, input_grads):
            if not needs_grad or input_grad is None:
                continue
            if input_grad.shape != inp.data.shape or input_grad.dtype != inp.data.dtype:
                raise RuntimeError(
                    f"{op}.backward returned a gradient of shape {input_grad.shape} and dtype "
                    f"{input_grad.dtype} for an input of shape {inp.shape} and dtype {inp.dtype}"
                )
            key = id(inp)
            if key in grads:
                grads[key] = grads[key] + input_grad  # a new array: never add into a shared one
            else:
                grads[key] = input_grad
        if not retain_graph:
            ctx.saved_tensors = ()
            ctx.freed = True
