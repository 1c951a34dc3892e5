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

Arrays changed in place. `save_for_backward` keeps arrays, not copies, so a change to an input's
values between forward and backward would make backward compute the gradient at values the forward
never saw. Every Tensor counts the in-place changes of its memory in `._version`, a counter its
views share (see tensor.py); `apply` notes the version of each input (a tuple of ints, nothing
more, when a graph is recorded), and before the walk calls an op's backward it checks that no input
whose array the op saved, and not the op's output either, has changed since. An input the op did
not save (Add keeps nothing) may change freely: its gradient does not depend on its values.

Sizes too large. A forward or backward that asks numpy for more memory than there is (a matmul of
two 10^6-long vectors' outer product) makes numpy raise MemoryError; `apply` and the walk report it
as an AllocationError naming the op and its inputs, one place for every op's arrays.

Processes made by fork(). Numba runs parallel kernels on a pool of threads from its threading layer;
the default on Linux is GNU OpenMP, whose threads do not survive fork(): in a child process forked
after a parallel kernel has run, the next parallel kernel kills the child (and a multiprocessing
pool whose workers were forked waits for them forever). `apply` notices a new process id (one
os.getpid() per op) and, when the parent had started GNU OpenMP's threads, raises ThreadingError in
the child, naming the ways out, before any kernel runs: the exception reaches a pool's parent, which
then fails with that message instead of hanging. The ways out: start the workers with
multiprocessing's "spawn" or "forkserver" method, or choose a threading layer that survives fork
before the first parallel kernel runs (NUMBA_THREADING_LAYER=tbb, with the tbb package where Numba
finds it, or =workqueue). microtensor does not choose the layer itself: it is a setting of the whole
process, shared with every other user of Numba in it.

Forward mode. Backward gives vector-Jacobian products: a row of the Jacobian J per output
direction u (uᵀ J). Forward mode gives Jacobian-vector products J v: the directional derivative of
the output when the inputs move along v, d/dt f(x + t v) at t = 0. Every Function also has a
`jvp(ctx, *tangents) -> tangent_out` static method: given the Context its forward filled and one
tangent per positional input (a numpy array shaped like that input, or None where the input has
no tangent or is not a tensor), it returns the output's tangent, an array shaped like the output.
`jvp(f, primals, tangents)` below runs f once with forward mode on: `apply` finds each input's
tangent by the input's identity, calls the op's `jvp` when any input has one, and keeps the
output's tangent beside it. Under forward mode `save_for_backward` keeps its arrays even when no
input needs a gradient (the JVP rules read them), so reverse mode pays nothing for this; the rules
are written with numpy (the readable reference: no fast twin). docs/forward-mode.md compares the
two modes.

Watchers. While `detect_anomaly()` (anomaly.py) or `debug.profile()` (profiler.py) runs, the
module variable `_observer` holds it: `apply` hands it the whole call, and the walk runs each op's
backward through it. Otherwise they cost one test of `_observer` per op and one per walk.
"""
import os

import numpy as np

from .checks import check_flag, describe, is_size_refusal
from .errors import AllocationError, GraphError, InputError, InputTypeError, ThreadingError
from .kernels import active
from .tensor import Tensor

_grad_enabled = True
_forward_tangents = None  # while jvp() runs: {id(tensor): (tensor, its tangent array)}; None otherwise
# While detect_anomaly() or profile() runs (microtensor/anomaly.py, profiler.py): the object that
# watches every op, with `apply(function, args, kwargs)` and `backward_op(ctx, grad_out)`; None otherwise.
_observer = None
_low_precision = None  # inside mt.autocast: its 16-bit Policy (ops/electives/mixed_precision.py); None otherwise


def is_grad_enabled():
    return _grad_enabled


def forward_mode_running():
    """True while jvp() runs: an op must then go through Function.apply even for inputs that need
    no gradient, since a tangent may ride on them."""
    return _forward_tangents is not None


class no_grad:
    """Context manager (and decorator) in which no op records a graph: for evaluation and sampling."""

    def __init__(self):
        self._previous = []  # a stack: the same no_grad object may be entered again inside itself

    def __enter__(self):
        global _grad_enabled
        self._previous.append(_grad_enabled)
        _grad_enabled = False

    def __exit__(self, *exc_info):
        global _grad_enabled
        _grad_enabled = self._previous.pop()

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

    created_at = None  # where in the user's code the op was called ("file:line in function"): set under detect_anomaly() only

    def __init__(self, function, inputs, needs_input_grad, requires_grad):
        self.function = function  # the Function subclass that made the output
        self.inputs = inputs  # the positional arguments of apply, Tensors or not
        self.needs_input_grad = needs_input_grad  # one bool per input
        self.requires_grad = requires_grad
        self.versions = ()  # each Tensor input's _version when forward ran (None for other inputs)
        self.input_layouts = ()  # each Tensor input's (shape, dtype) when forward ran (None for other inputs)
        self.saved_tensors = ()
        self.freed = False
        self.forward_mode = _forward_tangents is not None  # True while jvp() runs: the JVP rules read what forward saves
        self.low_precision = _low_precision  # made inside mt.autocast: its backward rounds to 16 bits too

    @property
    def name(self):
        """The op's name: its Function's class name ("MatMul", "LayerNorm")."""
        return self.function.__name__

    def __repr__(self):
        inputs = ", ".join(f"Tensor{tuple(x.shape)}" if isinstance(x, Tensor) else repr(x) for x in self.inputs)
        return f"<{self.name}({inputs}), {len(self.saved_tensors)} arrays saved>"

    def save_for_backward(self, *arrays):
        """Keep `arrays` (inputs, views of inputs, or arrays forward made) for backward. Before
        backward runs, the walk checks that no Tensor input sharing memory with one of them has
        changed in place since forward (the versions noted by `apply`)."""
        if self.requires_grad or self.forward_mode:
            self.saved_tensors = arrays

    def _shares_memory_with_saved(self, array):
        return any(isinstance(saved, np.ndarray) and np.may_share_memory(saved, array) for saved in self.saved_tensors)

    def check_versions(self, output):
        """Raise if an array this context saved belongs to a tensor (an input, or `output`, the
        tensor the op made) whose values changed in place after the forward."""
        op = self.function.__name__
        for index, (inp, version) in enumerate(zip(self.inputs, self.versions)):
            if version is not None and inp._version != version and self._shares_memory_with_saved(inp._data):
                raise GraphError(
                    f"backward: input {index} of {op} (shape {inp.shape}) was modified in place after forward "
                    f"(its version went from {version} to {inp._version}), and {op} saved its values for backward; "
                    "the gradient would be computed at values the forward never saw. Change it after "
                    "backward, or compute the forward again after the change"
                )
        if output._version != 0 and self._shares_memory_with_saved(output._data):
            raise GraphError(
                f"backward: the output of {op} (shape {output.shape}) was modified in place after forward, "
                f"and {op} saved it for backward; change a copy instead (e.g. y = y * 1.0 first)"
            )


class Function:
    """Base class of every differentiable op. See the module docstring for the contract."""

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, grad_out):
        raise NotImplementedError

    @staticmethod
    def jvp(ctx, *tangents):
        """The output's tangent from one tangent per positional input (None where it has none)."""
        raise NotImplementedError

    @classmethod
    def apply(cls, *args, **kwargs):
        if _observer is not None:  # detect_anomaly() or profile(): it runs this apply and watches it
            return _observer.apply(cls, args, kwargs)
        needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        requires_grad = _grad_enabled and any(needs_input_grad)
        ctx = Context(cls, args, needs_input_grad, requires_grad)
        if requires_grad:
            ctx.versions = tuple(a._version_counter[0] if isinstance(a, Tensor) else None for a in args)
            ctx.input_layouts = tuple((a._data.shape, a._data.dtype) if isinstance(a, Tensor) else None for a in args)
        arrays = [a._data if isinstance(a, Tensor) else a for a in args]
        if os.getpid() != _process_id:
            _check_forked_process()
        try:
            out = cls.forward(ctx, *arrays, **kwargs)
        except (MemoryError, ValueError) as error:
            if not is_size_refusal(error):
                raise
            raise _allocation_error(cls, "forward", args, error) from None
        if type(out) is not np.ndarray:
            out = _as_output_array(cls, out)
        if _low_precision is not None:  # 16-bit training: the output on the grid, the saved arrays in 16 bits
            out = _low_precision.round_output(ctx, arrays, out)
        result = Tensor._from_array(out, requires_grad)
        if requires_grad:
            result._ctx = ctx
        if _forward_tangents is not None:
            _push_tangent(cls, ctx, args, result)
        return result


def _push_tangent(function, ctx, args, result):
    """Forward mode: the output's tangent from the inputs' tangents, by `function.jvp`."""
    tangents = tuple(_forward_tangents.get(id(a), (None, None))[1] if isinstance(a, Tensor) else None for a in args)
    if all(t is None for t in tangents):
        return  # no input moves: neither does the output
    op = function.__name__
    if function.jvp is Function.jvp:
        raise GraphError(
            f"jvp: {op} has no forward-mode rule (a static method jvp(ctx, *tangents) -> tangent of the output), "
            "so mt.jvp cannot carry a tangent through it; write one beside its backward"
        )
    tangent = function.jvp(ctx, *tangents)
    if isinstance(tangent, np.generic):
        tangent = np.asarray(tangent)  # numpy arithmetic on 0-d arrays gives scalars
    if type(tangent) is not np.ndarray:
        raise GraphError(f"{op}.jvp returned {describe(tangent)}; expected a numpy array shaped like the output")
    if tangent.shape != result._data.shape or tangent.dtype != result._data.dtype:
        raise GraphError(
            f"{op}.jvp returned a tangent of shape {tangent.shape} and dtype {tangent.dtype} for an output "
            f"of shape {result.shape} and dtype {result.dtype}"
        )
    _forward_tangents[id(result)] = (result, tangent)


def add_tangents(shape, *terms):
    """The sum of the tangent terms that are not None (at least one is), broadcast to `shape`, as a
    new array of the terms' dtype: an input with no tangent adds nothing to the output's."""
    present = [term for term in terms if term is not None]
    total = present[0]
    for term in present[1:]:
        total = total + term
    return np.array(np.broadcast_to(total, shape), dtype=present[0].dtype)


def jvp(f, primals, tangents):
    """Run f(*primals) once in forward mode: (outputs, output_tangents).

    primals: a tuple (or list) of f's arguments, or one Tensor. tangents: one per primal (a Tensor
    alone when primals is one): a numpy array or Tensor of the primal's shape and float dtype, or
    None where that argument does not move (and for arguments that are not Tensors).
    Returns f's output (a Tensor, or a tuple of Tensors) and its tangent J v, the directional
    derivative d/dt f(primals + t tangents) at t = 0, as a Tensor of the output's shape and dtype
    (a tuple when f returns one). Every op f runs needs a `jvp` rule; one without raises naming it.
    """
    global _forward_tangents
    if not callable(f):
        raise InputTypeError(f"jvp: f must be callable (a function of the primals), got {describe(f)}")
    if _forward_tangents is not None:
        raise GraphError("jvp: mt.jvp was called inside another mt.jvp; nested forward mode is not supported")
    single = isinstance(primals, Tensor)
    if single:
        primals, tangents = (primals,), (tangents,)
    elif not isinstance(primals, (tuple, list)):
        raise InputTypeError(f"jvp: primals must be a Tensor or a tuple of f's arguments, got {describe(primals)}")
    elif not isinstance(tangents, (tuple, list)):
        raise InputTypeError(f"jvp: tangents must be a tuple with one entry per primal ({len(primals)}), got {describe(tangents)}")
    if len(tangents) != len(primals):
        raise InputError(f"jvp: {len(tangents)} tangents for {len(primals)} primals; give one per primal (None where it does not move)")
    table = {}
    for index, (primal, tangent) in enumerate(zip(primals, tangents)):
        name = "tangents" if single else f"tangents[{index}]"
        if tangent is None:
            continue
        if not isinstance(primal, Tensor):
            raise InputTypeError(f"jvp: {name} is given for a primal that is not a Tensor ({describe(primal)}); pass None there")
        if isinstance(tangent, Tensor):
            tangent = tangent._data
        if not isinstance(tangent, np.ndarray):
            raise InputTypeError(f"jvp: {name} must be a numpy array, a Tensor or None, got {describe(tangent)}")
        if primal.dtype.kind != "f":
            raise InputTypeError(f"jvp: {name} is given for a primal of dtype {primal.dtype}; only float tensors have tangents (pass None)")
        if tangent.shape != primal._data.shape or tangent.dtype != primal._data.dtype:
            raise InputError(
                f"jvp: {name} has shape {tangent.shape} and dtype {tangent.dtype}, but its primal has shape "
                f"{primal.shape} and dtype {primal.dtype}; a tangent is a direction in the primal's own space"
            )
        if id(primal) in table:
            raise InputError(f"jvp: primal {index} is the same Tensor as an earlier primal; give each Tensor once")
        table[id(primal)] = (primal, np.array(tangent, copy=True))
    _forward_tangents = table
    try:
        outputs = f(*primals)
    finally:
        _forward_tangents = None
    many = isinstance(outputs, (tuple, list))
    output_tangents = []
    for index, out in enumerate(outputs if many else (outputs,)):
        if not isinstance(out, Tensor):
            where = f"output {index}" if many else "its output"
            raise InputTypeError(f"jvp: f must return a Tensor or a tuple of Tensors, got {describe(out)} as {where}")
        held = table.get(id(out))
        tangent = held[1] if held is not None else np.zeros(out._data.shape, dtype=out._data.dtype)
        output_tangents.append(Tensor._from_array(tangent))
    if many:
        return tuple(outputs), tuple(output_tangents)
    return outputs, output_tangents[0]


_process_id = os.getpid()  # the process the ops last ran in


def gnu_openmp_started():
    """True when this process's parallel kernels run on GNU OpenMP and its threads have started
    (from this process or, copied by fork(), from its parent)."""
    import numba

    try:
        layer = numba.threading_layer()
    except ValueError:  # no parallel kernel has run yet: the layer is not chosen
        return False
    if layer != "omp":
        return False
    from numba.np.ufunc import omppool  # already loaded: the layer in use

    return getattr(omppool, "openmp_vendor", "GNU") == "GNU"


def _check_forked_process():
    """Run once per new process id: refuse to go on in a child forked after GNU OpenMP's threads started."""
    global _process_id
    if gnu_openmp_started():
        raise ThreadingError(
            "microtensor cannot run its parallel kernels in this process: it was made by fork() from a "
            "process whose kernels had already started GNU OpenMP's threads, which do not survive fork() "
            "(the kernel would kill this process). Start worker processes with multiprocessing's 'spawn' "
            "or 'forkserver' method (multiprocessing.get_context('spawn')), or choose a threading layer "
            "that survives fork before the first kernel runs: NUMBA_THREADING_LAYER=workqueue, or =tbb "
            "with the tbb package installed where Numba finds it"
        )
    _process_id = os.getpid()


def _allocation_error(function, stage, inputs, error):
    """numpy's refusal of a size inside an op's forward or backward, as an AllocationError naming the
    op and its inputs (numpy's own message names the array it could not make)."""
    layouts = ", ".join(f"{x.shape} {x.dtype}" for x in inputs if isinstance(x, Tensor))
    return AllocationError(f"{function.__name__} ({stage}): cannot allocate its arrays for inputs of shape and dtype {layouts}: {error}")


def _as_output_array(function, out):
    """A forward's result as an ndarray: numpy reductions return scalars (np.float32) for 0-d results."""
    if isinstance(out, (np.ndarray, np.generic)):
        return np.asarray(out)
    raise GraphError(f"{function.__name__}.forward returned {describe(out)}; a forward must return a numpy array")


def unbroadcast(grad, shape):
    """Sum `grad` down to `shape`: the backward of numpy broadcasting.

    Broadcasting copies an input along new leading axes and along axes of size 1, so every copy's
    gradient must be added back into the one element it came from. Example: x (3, 1) + y (4,) gives
    (3, 4); the gradient of x is grad.sum(axis=1, keepdims=True), that of y is grad.sum(axis=0).
    """
    if grad.shape == shape:
        return grad
    shape = tuple(shape)
    leading = grad.ndim - len(shape)
    if leading < 0 or any(n != 1 and n != m for n, m in zip(shape, grad.shape[leading:])):
        raise InputError(f"unbroadcast: a gradient of shape {grad.shape} cannot come from broadcasting shape {shape}")
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


def add_gradients(held, more):
    """held + more, as a new array: two parts of one tensor's gradient, of one shape and dtype, that
    reached it along different paths (the fast set has a twin of it)."""
    return held + more


def _accumulate_into_grad(tensor, grad):
    # The first gradient is copied: `grad` may be shared with other ops or be a read-only view.
    if tensor.grad is None:
        tensor.grad = active(copy_gradient)(grad)
        return
    held = tensor.grad
    # Only a .grad set by hand can differ; += would broadcast into it, or keep its dtype, silently.
    if type(held) is not np.ndarray or held.shape != tensor._data.shape or held.dtype != tensor._data.dtype:
        raise GraphError(
            f"backward: a tensor of shape {tensor.shape} and dtype {tensor.dtype} holds a .grad that is a "
            f"{describe(held)}; expected None or a numpy array of the tensor's shape and dtype to add the "
            "new gradient into (set .grad = None to start from nothing)"
        )
    held += grad


def _root_gradient(root, grad):
    """The gradient the walk starts from: ones for a scalar root, else `grad` as an array of the
    root's shape and dtype (a Tensor, a numpy array, or a number for a one-element root)."""
    if grad is None:
        if root._data.size != 1:
            raise GraphError(
                f"backward: a gradient must be given for a non-scalar output of shape {root.shape}; "
                "call .backward(grad) with an array of that shape, or reduce the output first (e.g. .sum())"
            )
        return np.ones_like(root._data)
    if isinstance(grad, Tensor):
        grad = grad._data
    elif isinstance(grad, (int, float, np.integer, np.floating)) and not isinstance(grad, (bool, np.bool_)):
        if root._data.size != 1:
            raise InputError(
                f"backward: a number is a gradient only for a one-element output; this output has shape {root.shape}: "
                "pass an array of that shape"
            )
        grad = np.full(root.shape, grad, dtype=root.dtype)
    if not isinstance(grad, np.ndarray):
        raise InputTypeError(f"backward: the gradient must be a Tensor or a numpy array, got {describe(grad)}")
    if grad.shape != root._data.shape or grad.dtype != root._data.dtype:
        raise InputError(
            f"backward: the gradient has shape {grad.shape} and dtype {grad.dtype}, "
            f"but the output has shape {root.shape} and dtype {root.dtype}"
        )
    return grad


def _run_hooks(tensor, grad):
    """Call each hook of `tensor` with its complete gradient, as a read-only Tensor (the array may
    be shared with other ops); a hook that returns a Tensor or array replaces the gradient."""
    grad = np.asarray(grad)  # adding two 0-d gradients gives a numpy scalar
    for hook in tensor._hooks:
        view = grad.view()
        view.flags.writeable = False
        replacement = hook(Tensor._from_array(view))
        if replacement is None:
            continue
        name = getattr(hook, "__name__", type(hook).__name__)
        if isinstance(replacement, Tensor):
            replacement = replacement._data
        if not isinstance(replacement, np.ndarray):
            raise GraphError(f"backward: the hook {name} returned {describe(replacement)}; expected None, a Tensor or a numpy array")
        if replacement.shape != grad.shape or replacement.dtype != grad.dtype:
            raise GraphError(
                f"backward: the hook {name} returned a gradient of shape {replacement.shape} and dtype {replacement.dtype} "
                f"for a tensor of shape {tensor.shape} and dtype {tensor.dtype}"
            )
        grad = replacement
    return grad


def backward(root, grad=None, retain_graph=False, run_op=None):
    """Fill `.grad` of every leaf tensor that `root` depends on with d(root)/d(leaf) contracted with `grad`.

    A tensor's hooks (`register_hook`) run when its gradient is complete: after every op that uses
    it has sent its part, before the gradient goes on (or into `.grad`). `run_op(ctx, grad_out)`, when
    given, is called instead of `ctx.function.backward(ctx, grad_out)` and must return what that
    returns: the tracer in microtensor/debug.py times and measures each op through it, and so do
    detect_anomaly() and profile() when no run_op is given."""
    retain_graph = check_flag("backward", "retain_graph", retain_graph)
    if run_op is not None and not callable(run_op):
        raise InputTypeError(f"backward: run_op must be a function (ctx, grad_out) -> gradients, got {describe(run_op)}")
    if not root.requires_grad:
        raise GraphError(
            "backward: this tensor does not require a gradient (no input of the ops that made it "
            "had requires_grad=True, or it was computed under no_grad())"
        )
    grad = _root_gradient(root, grad)
    if run_op is None and _observer is not None:  # detect_anomaly() or profile() watches each op's backward
        run_op = _observer.backward_op

    grads = {id(root): grad}  # gradients that have reached a tensor, not yet passed on
    for tensor in reversed(topological_order(root)):
        grad_out = grads.pop(id(tensor), None)
        if grad_out is None:
            continue  # nothing flowed here (e.g. only through an input that needs no gradient)
        if tensor._hooks:
            grad_out = _run_hooks(tensor, grad_out)
        ctx = tensor._ctx
        if ctx is None or tensor._retains_grad:
            _accumulate_into_grad(tensor, grad_out)
        if ctx is None:
            continue
        op = ctx.function.__name__
        if ctx.freed:
            raise GraphError(
                f"backward: trying to go through {op} a second time, but its saved arrays were freed "
                "by the first backward; call backward(retain_graph=True) the first time"
            )
        ctx.check_versions(tensor)
        if ctx.low_precision is not None:  # 16-bit training: saved arrays back to float32, grad_out on the grid
            grad_out = ctx.low_precision.before_backward(ctx, grad_out)
        try:
            if run_op is None:
                input_grads = ctx.function.backward(ctx, grad_out)
            else:
                input_grads = run_op(ctx, grad_out)
        except (MemoryError, ValueError) as error:
            if not is_size_refusal(error):
                raise
            raise _allocation_error(ctx.function, "backward", ctx.inputs, error) from None
        if not isinstance(input_grads, tuple):
            input_grads = (input_grads,)
        if len(input_grads) != len(ctx.inputs):
            raise GraphError(
                f"{op}.backward returned {len(input_grads)} gradients, but forward took {len(ctx.inputs)} inputs"
            )
        for index, (inp, needs_grad, input_grad) in enumerate(zip(ctx.inputs, ctx.needs_input_grad, input_grads)):
            if not needs_grad or input_grad is None:
                continue
            if type(input_grad) is not np.ndarray:
                if not isinstance(input_grad, (np.ndarray, np.generic)):
                    raise GraphError(f"{op}.backward returned {describe(input_grad)} as a gradient; expected a numpy array")
                input_grad = np.asarray(input_grad)  # numpy arithmetic on 0-d arrays gives scalars
            if input_grad.shape != inp._data.shape or input_grad.dtype != inp._data.dtype:
                then_shape, then_dtype = ctx.input_layouts[index]
                if (then_shape, then_dtype) != (inp._data.shape, inp._data.dtype):
                    # The op is not at fault: the input's values were replaced after the graph was recorded.
                    raise GraphError(
                        f"backward: input {index} of {op} had shape {then_shape} and dtype {then_dtype} when the forward "
                        f"ran, and now has shape {inp.shape} and dtype {inp.dtype}: its .data was replaced after the "
                        "forward (t.data = ..., or Module.to). Replace values before the forward, or run the forward again"
                    )
                raise GraphError(
                    f"{op}.backward returned a gradient of shape {input_grad.shape} and dtype "
                    f"{input_grad.dtype} for an input of shape {inp.shape} and dtype {inp.dtype}"
                )
            key = id(inp)
            if key in grads:
                grads[key] = active(add_gradients)(grads[key], input_grad)  # a new array: never add into a shared one
            else:
                grads[key] = input_grad
        if not retain_graph:
            ctx.saved_tensors = ()
            ctx.freed = True
