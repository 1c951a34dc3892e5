"""Gradient checkpointing: keep a segment's inputs, not its intermediate tensors, and compute those
again in backward.

Backward needs what forward saved: a LayerNorm its rstd, a matmul both factors, attention its
(T, T) probabilities. A forward through N blocks holds every block's intermediate tensors until
backward frees them, so memory grows with N. `checkpoint(fn, *inputs)` runs fn under no_grad():
its ops save nothing and record no graph, and fn's output joins the graph as the output of one
op, Checkpoint, whose inputs are `inputs`. Checkpoint's backward runs fn again from the same input
values, this time recording a graph, and walks that small graph with `autograd.backward`:

    forward:   y = fn(x)                   under no_grad: the node keeps x and the generator's state
    backward:  x' = x as a new leaf        the same memory, cut off from the graph outside
               y' = fn(x') with a graph    equal to y bit for bit: the same ops on the same values
               backward(y', dL/dy)         fills x'.grad, and the .grad of the parameters fn uses
               return x'.grad              the walk outside goes on from x with it

Cost: one more forward of fn per backward. Memory: the graph outside keeps one tensor per
checkpointed segment (its input), and backward holds one segment's intermediate tensors at a time.

Random numbers. fn may draw them (dropout's mask). forward notes the global generator's state
before it runs fn; backward sets that state back for the second run, so that every mask comes out
the same, then gives the caller's state back, so that code after backward draws what it would have
drawn without checkpointing. A generator fn is given by hand (`dropout(..., generator=g)`) is fn's
own to replay. The kernel set forward ran with is the one backward's second run uses too.

Parameters. fn may use tensors it does not take as inputs, as a Module uses its Parameters: the
walk inside backward adds their gradients into their .grad, as the walk outside would have. Such
a tensor must be a leaf (a Parameter, a tensor made with requires_grad=True). A tensor that ops
outside fn made and that needs a gradient must be one of `inputs`: only an input hands its
gradient back to the walk outside.

Several outputs. fn may return a tuple of tensors of one dtype: checkpoint joins them into one
flat tensor (the node's output) and hands back its pieces, each of its tensor's shape.

Forward mode (JVP). Under mt.jvp, forward's run of fn carries the tangents through fn's ops as any
code does (forward mode needs no graph), and the rule returns the tangent of fn's output that run
found: J v through fn, with no second run.
"""
import numpy as np

from ... import autograd, random
from ...autograd import Function, is_grad_enabled, no_grad
from ...checks import describe
from ...errors import GraphError, InputError, InputTypeError
from ...gradcheck import gradcheck_case
from ...kernels import get_kernels, using_kernels
from ...tensor import Tensor
from ..shape import concat


class Checkpoint(Function):
    """y = fn(*inputs), computed without a graph.   Backward: fn again with a graph, then its backward.
    JVP: the tangent forward's run of fn carried."""

    @staticmethod
    def forward(ctx, *arrays, fn):
        ctx.fn = fn
        ctx.generator_state = random.get_state()
        ctx.kernels = get_kernels()
        # the walk checks, before backward, that no input changed in place since: fn must run again on these values
        ctx.save_for_backward(*(a for a in arrays if isinstance(a, np.ndarray)))
        with no_grad():
            output = fn(*ctx.inputs)
        tangents = autograd._forward_tangents  # None unless mt.jvp is running
        if tangents is not None:
            ctx.output_tangent = _output_tangent(ctx, tangents, output)
        return output._data

    @staticmethod
    def backward(ctx, grad_out):
        if not is_grad_enabled():
            raise GraphError(
                "checkpoint: backward ran inside no_grad(), so the second run of the checkpointed function "
                "cannot record the graph its backward needs; call backward outside no_grad()"
            )
        leaves = tuple(
            x.detach().requires_grad_(needs) if isinstance(x, Tensor) else x
            for x, needs in zip(ctx.inputs, ctx.needs_input_grad)
        )  # fmt: skip
        caller_state = random.get_state()
        random.set_state(ctx.generator_state)  # the same dropout masks as forward drew
        try:
            with using_kernels(ctx.kernels):
                output = ctx.fn(*leaves)
        finally:
            random.set_state(caller_state)
        if output.requires_grad:
            autograd.backward(output, grad_out)
        return tuple(leaf.grad if needs else None for leaf, needs in zip(leaves, ctx.needs_input_grad))

    @staticmethod
    def jvp(ctx, *_tangents):
        return ctx.output_tangent


def _output_tangent(ctx, tangents, output):
    """Forward mode: the tangent of fn's output, which fn's ops carried from the inputs' tangents."""
    held = tangents.get(id(output))
    moved = any(isinstance(x, Tensor) and id(x) in tangents for x in ctx.inputs)
    if held is not None and not moved:
        raise GraphError(
            "checkpoint: under mt.jvp the function's output moves only through a tensor it uses without taking "
            "it as an input, so the Checkpoint op would pass on no tangent; give that tensor to checkpoint as an input"
        )
    return held[1] if held is not None else np.zeros_like(output._data)


def checkpoint(fn, *inputs):
    """fn(*inputs), keeping for backward only `inputs`: backward runs fn again to find the rest.

    fn: a function of `inputs` (a Module, a lambda) returning a Tensor, or a tuple of Tensors of one
    dtype (then checkpoint returns a tuple of the same shapes). inputs: Tensors, and any other
    arguments fn takes (passed as they are). The global generator's state is replayed, so dropout
    inside fn draws the same masks in backward's second run. Tensors fn uses without taking them
    (its parameters) get their gradients in .grad, and must be leaves; one that ops made outside
    fn and that needs a gradient must be passed in `inputs`.

    When no input needs a gradient while gradients are on, there is nothing to hand back through
    the inputs; fn then runs as it would without checkpoint, recording its graph, so that the
    parameters it uses still get their gradients.
    """
    if not callable(fn):
        raise InputTypeError(f"checkpoint: fn must be callable (a function or a Module), got {describe(fn)}")
    shapes = []  # filled by each run of one_output: None for a single Tensor, else each output's shape
    one_output = _joined(fn, shapes)
    if is_grad_enabled() and not any(isinstance(x, Tensor) and x.requires_grad for x in inputs):
        output = one_output(*inputs)
    else:
        output = Checkpoint.apply(*inputs, fn=one_output)
    if shapes[-1] is None:
        return output
    pieces, start = [], 0
    for shape in shapes[-1]:
        size = int(np.prod(shape))
        pieces.append(output[start : start + size].reshape(shape))
        start += size
    return tuple(pieces)


def _joined(fn, shapes):
    """fn, returning one Tensor: its own, or its tuple of Tensors flattened and joined."""
    name = getattr(fn, "__name__", type(fn).__name__)

    def one_output(*inputs):
        outputs = fn(*inputs)
        if isinstance(outputs, Tensor):
            shapes.append(None)
            return outputs
        if not isinstance(outputs, tuple) or not outputs or not all(isinstance(y, Tensor) for y in outputs):
            raise InputTypeError(f"checkpoint: the function {name} returned {describe(outputs)}; expected a Tensor or a tuple of Tensors")
        dtypes = sorted({str(y.dtype) for y in outputs})
        if len(dtypes) > 1:
            raise InputError(f"checkpoint: the function {name} returned tensors of dtypes {', '.join(dtypes)}; expected one dtype (they are joined into one tensor)")
        shapes.append([y.shape for y in outputs])
        return concat([y.reshape(-1) for y in outputs])

    return one_output


def _segment(x, w):
    """A small segment for the gradient check: x used twice, w a weight."""
    return (x @ w).tanh() * x


@gradcheck_case(Checkpoint)
def _checkpoint_case(draw):
    N, C = draw.integer(1, 3), draw.integer(1, 4)
    x, w = draw.tensor((N, C)), draw.tensor((C, C))
    return (lambda x, w: checkpoint(_segment, x, w)), (x, w)
