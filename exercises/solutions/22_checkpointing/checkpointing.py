"""Exercise 22: gradient checkpointing. The reference solution.

    forward:   y = fn(x) under no_grad        keeps x and the generator's state, nothing of fn's
    backward:  y' = fn(x') with a graph       x' a new leaf with x's values, the same random draws
               y'.backward(dL/dy)             fills x'.grad and the .grad of fn's parameters
               return x'.grad
"""
import math

from microtensor import random
from microtensor.autograd import Function, no_grad


class Checkpoint(Function):
    @staticmethod
    def forward(ctx, x, fn):
        ctx.fn = fn
        ctx.generator_state = random.get_state()  # before fn draws anything (its dropout masks)
        ctx.save_for_backward(x)
        with no_grad():  # fn's ops record nothing and save nothing
            y = fn(ctx.inputs[0])
        return y.numpy()

    @staticmethod
    def backward(ctx, grad_out):
        """grad_out = dL/dy, shaped like y. Returns (dL/dx, None for fn)."""
        leaf = ctx.inputs[0].detach().requires_grad_()  # x's values, cut off from the graph outside
        caller_state = random.get_state()
        random.set_state(ctx.generator_state)  # the same masks as forward drew
        y = ctx.fn(leaf)  # grad is on here: this time fn records its graph
        random.set_state(caller_state)  # the caller's draws go on as if nothing had run
        y.backward(grad_out)  # the walk inside: leaf.grad, and the .grad of fn's parameters
        return leaf.grad, None


def checkpoint(fn, x):
    """fn(x) for a Tensor x, keeping only x for backward: backward runs fn again."""
    return Checkpoint.apply(x, fn)


def checkpoint_sequential(blocks, x):
    """Run x through `blocks` (functions of one Tensor) in segments of k = ⌊√N⌋ blocks (N =
    len(blocks)), each segment under one checkpoint; the last segment may be shorter."""
    k = max(1, math.isqrt(len(blocks)))
    for first in range(0, len(blocks), k):
        segment = blocks[first : first + k]

        def run_segment(x, segment=segment):  # segment bound now: the loop goes on before backward runs
            for block in segment:
                x = block(x)
            return x

        x = checkpoint(run_segment, x)
    return x
