"""Inverted dropout: during training, zero each element with probability p and scale the rest by
1 / (1 - p), so that the expected value of every element is unchanged and evaluation needs no
rescaling.

    y = x * mask / (1 - p),   mask_i ~ Bernoulli(1 - p)          (training)
    y = x                                                        (evaluation, or p = 0)
    dL/dx = g * mask / (1 - p)                                   (the same mask)
    dy = t * mask / (1 - p)                                      (forward mode, tangent t of x)

The mask is drawn from a numpy Generator: the `generator` argument, else the global one that
`microtensor.manual_seed` seeds. It is saved (as the scaled mask) for backward.
"""
import numpy as np

from ..autograd import Function
from ..checks import check_flag, check_float, check_real
from ..errors import InputTypeError
from ..gradcheck import gradcheck_case
from ..random import get_generator


class Dropout(Function):
    """y = x * mask / (1 - p).   JVP: dy = t * mask / (1 - p), the same mask."""

    @staticmethod
    def forward(ctx, x, p, generator):
        keep = generator.random(x.shape, dtype=x.dtype if x.dtype == np.float32 else np.float64) >= p
        scaled_mask = keep.astype(x.dtype) / x.dtype.type(1 - p)
        ctx.save_for_backward(scaled_mask)
        return x * scaled_mask

    @staticmethod
    def backward(ctx, grad_out):
        (scaled_mask,) = ctx.saved_tensors
        return grad_out * scaled_mask, None, None

    @staticmethod
    def jvp(ctx, tangent, _p, _generator):
        (scaled_mask,) = ctx.saved_tensors
        return tangent * scaled_mask


def dropout(x, p=0.5, training=True, generator=None):
    """Zero each element with probability p in [0, 1) and scale the rest by 1 / (1 - p) when
    training (a bool); x itself otherwise. generator: a numpy Generator, or None for the global one."""
    check_float("dropout", x)
    p = check_real("dropout", "p", p, low=0, high=1, high_open=True)
    training = check_flag("dropout", "training", training)
    if generator is not None and not isinstance(generator, np.random.Generator):
        raise InputTypeError(f"dropout: generator must be a numpy Generator or None, got {type(generator).__name__}")
    if not training or p == 0:
        return x
    return Dropout.apply(x, p, get_generator() if generator is None else generator)


@gradcheck_case(Dropout)
def _dropout_case(draw):
    # A new generator with the same seed on every call draws the same mask, so that finite
    # differences see one fixed function.
    seed, p = draw.integer(0, 1000), draw.choice((0.2, 0.5))
    return (lambda x: dropout(x, p, True, np.random.default_rng(seed))), (draw.tensor(draw.shape()),)
