"""Reductions: sum, mean, max over all elements or over some dims (keepdim as in PyTorch).

All three map an input x of shape S to an output y whose reduced dims are gone (or kept as size 1).
Backward sends each output's gradient back to the input elements it was made from:

    sum:   y = sum_i x_i             dL/dx_i = g                 (g copied along the reduced dims)
    mean:  y = (1/n) sum_i x_i       dL/dx_i = g / n
    max:   y = max_i x_i             dL/dx_i = g / k if x_i is one of the k elements equal to the max, else 0

Forward mode reads the same Jacobians along a tangent t of x: dy = sum of t, mean of t, and for max
the mean of t over the elements equal to the max (the same 1/k per tie).

(`max` splits the gradient evenly between ties, like `torch.amax`; it returns values only: use
`argmax` for the indices.) A NaN is the max of every group that holds one, as in numpy and
PyTorch: the max is NaN and the NaN elements take the gradient (split evenly if there are several).

Empty reductions. A sum over no elements is 0, as in numpy and PyTorch. A mean or a max over no
elements has no value (a mean would be 0 / 0), so they are errors, unless the result is itself
empty, as when a (0, 3) tensor is reduced over its last dim: then there is nothing to compute.
"""
import math

import numpy as np

from ..autograd import Function
from ..checks import check_flag, check_float, normalize_dim
from ..errors import InputError
from ..gradcheck import gradcheck_case
from .shape import concat


def _axes(op, dim, ndim):
    """dim (None, an int or a tuple of ints) as a sorted tuple of non-negative axes."""
    if dim is None:
        return tuple(range(ndim))
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    axes = tuple(sorted(normalize_dim(op, d, ndim) for d in dims))
    if len(set(axes)) != len(axes):
        raise InputError(f"{op}: dim {dim} names the same dim twice")
    return axes


def _expand_to_input(grad_out, axes, keepdim, shape):
    """Give grad_out back its reduced dims (size 1) so that it broadcasts against the input."""
    if not keepdim:
        grad_out = np.expand_dims(grad_out, axes)
    return np.broadcast_to(grad_out, shape)


class Sum(Function):
    """y = sum of x over axes.   JVP: dy = sum of t over the same axes (a sum is linear)."""

    @staticmethod
    def forward(ctx, x, axes, keepdim):
        ctx.axes, ctx.keepdim, ctx.shape = axes, keepdim, x.shape
        return np.sum(x, axis=axes, keepdims=keepdim)

    @staticmethod
    def backward(ctx, grad_out):
        return _expand_to_input(grad_out, ctx.axes, ctx.keepdim, ctx.shape), None, None

    @staticmethod
    def jvp(ctx, tangent, _axes, _keepdim):
        return np.sum(tangent, axis=ctx.axes, keepdims=ctx.keepdim)


class Mean(Function):
    """y = mean of x over axes.   JVP: dy = mean of t over the same axes (linear too)."""

    @staticmethod
    def forward(ctx, x, axes, keepdim):
        ctx.axes, ctx.keepdim, ctx.shape = axes, keepdim, x.shape
        ctx.count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
        if ctx.count == 0:  # the result is empty too (the wrapper saw to it): nothing to divide
            return np.sum(x, axis=axes, keepdims=keepdim)
        return np.mean(x, axis=axes, keepdims=keepdim)

    @staticmethod
    def backward(ctx, grad_out):
        grad = grad_out / grad_out.dtype.type(ctx.count)
        return _expand_to_input(grad, ctx.axes, ctx.keepdim, ctx.shape), None, None

    @staticmethod
    def jvp(ctx, tangent, _axes, _keepdim):
        total = np.sum(tangent, axis=ctx.axes, keepdims=ctx.keepdim)
        return total / tangent.dtype.type(ctx.count) if ctx.count else total


class Max(Function):
    """y = max of x over axes.   JVP: dy = the mean of t over the k elements equal to the max: the row
    of the Jacobian that backward's even split uses (1/k at each tie, 0 elsewhere), times t.
    """

    @staticmethod
    def forward(ctx, x, axes, keepdim):
        if x.size == 0:  # an empty result (the wrapper refuses an empty max with a non-empty result)
            y = np.zeros(tuple(1 if a in axes else n for a, n in enumerate(x.shape)), dtype=x.dtype)
        else:
            y = np.max(x, axis=axes, keepdims=True)
        ctx.axes, ctx.keepdim = axes, keepdim
        ctx.save_for_backward(x, y)
        return y if keepdim else np.squeeze(y, axis=axes)

    @staticmethod
    def backward(ctx, grad_out):
        x, y = ctx.saved_tensors
        # (x.shape) True at every element equal to its group's max, and at a NaN: a NaN is its group's
        # max (np.max propagates it), so it takes the gradient, as in PyTorch
        is_max = (x == y) | np.isnan(x)
        ties = np.sum(is_max, axis=ctx.axes, keepdims=True)
        grad = grad_out if ctx.keepdim else np.expand_dims(grad_out, ctx.axes)
        return np.where(is_max, grad / ties.astype(x.dtype), x.dtype.type(0)), None, None

    @staticmethod
    def jvp(ctx, tangent, _axes, _keepdim):
        x, y = ctx.saved_tensors
        if x.size == 0:
            tangent_y = np.zeros(y.shape, dtype=x.dtype)
        else:
            is_max = x == y  # (x.shape)
            ties = np.sum(is_max, axis=ctx.axes, keepdims=True)
            tangent_y = np.sum(np.where(is_max, tangent, x.dtype.type(0)), axis=ctx.axes, keepdims=True) / ties.astype(x.dtype)
        return tangent_y if ctx.keepdim else np.squeeze(tangent_y, axis=ctx.axes)


def _reduce(op, function, x, dim, keepdim):
    check_float(op, x)
    axes = _axes(op, dim, x.ndim)
    keepdim = check_flag(op, "keepdim", keepdim)
    if function is not Sum and math.prod(x.shape[a] for a in axes) == 0:
        result_size = math.prod(n for a, n in enumerate(x.shape) if a not in axes)
        if result_size > 0:
            where = f"the empty tensor of shape {x.shape}" if dim is None else f"dim {dim} of a tensor of shape {x.shape}"
            raise InputError(f"{op}: {where} holds no elements, so there is no {op} to take")
    return function.apply(x, axes, keepdim)


def sum(x, dim=None, keepdim=False):
    return _reduce("sum", Sum, x, dim, keepdim)


def mean(x, dim=None, keepdim=False):
    return _reduce("mean", Mean, x, dim, keepdim)


def max(x, dim=None, keepdim=False):
    return _reduce("max", Max, x, dim, keepdim)


# --------------------------------------------------------------------------------- gradcheck cases


def _reduction_case(function, reduce, distinct=False):
    def case(draw):
        x = draw.tensor(draw.shape(min_dims=1, max_dims=3), distinct=distinct)
        dims = [d for d in range(x.ndim) if draw.boolean()]
        dim = draw.choice((None, dims[0] if dims else -1, tuple(dims) if dims else None))
        keepdim = draw.boolean()
        return (lambda x: reduce(x, dim, keepdim)), (x,)

    return gradcheck_case(function)(case)


_reduction_case(Sum, sum)
_reduction_case(Mean, mean)
_reduction_case(Max, max, distinct=True)  # ties make max non-differentiable


@gradcheck_case(Max)
def _max_tie_case(draw):
    # At an exact tie the gradient is split evenly. Check the split where it is well defined:
    # y = max([u, u]) = u, and finite differences move both copies of u together, so dy/du = 1
    # only if each copy gets half.
    u = draw.tensor((draw.integer(1, 3), 1))
    return (lambda u: max(concat([u, u], dim=-1), dim=-1)), (u,)
