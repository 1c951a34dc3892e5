"""Exercise 28: a row-parallel Linear. The task is in README.md; write the TODOs below.

    x W = Σ_r x_r W_r          x_r = x[:, rows r] (N, in/k), W_r = W[rows r, :] (in/k, out)
    all-reduce: y_r = Σ_i p_i on every rank r        backward: p̄_i = Σ_r ȳ_r (an all-reduce too)
"""
import numpy as np

from microtensor.autograd import Function


class AllReduce(Function):
    """k partial sums, each (..., out), one per rank -> the stacked (k, ..., out): row r is rank r's
    copy of the sum."""

    @staticmethod
    def forward(ctx, *partials):
        total = partials[0].copy()
        for p in partials[1:]:
            total += p  # in rank order, as a ring would add them
        return np.stack([total] * len(partials))

    @staticmethod
    def backward(ctx, grad_out):
        """grad_out (k, ..., out): the gradient of each rank's copy. Returns one gradient per partial."""
        summed = grad_out.sum(axis=0)  # every copy holds every partial: each partial gets them all
        return tuple(summed.copy() for _ in range(grad_out.shape[0]))

    @staticmethod
    def jvp(ctx, *tangents):
        """A linear map is its own derivative: the all-reduce of the tangents (none: zeros)."""
        present = next(t for t in tangents if t is not None)
        return AllReduce.forward(ctx, *(np.zeros_like(present) if t is None else t for t in tangents))


def row_parallel_linear(x_shards, weight_shards):
    """x_shards: k tensors (N, in/k), rank r's columns of x; weight_shards: k tensors (in/k, out),
    rank r's rows of W. Returns k tensors (N, out): every rank's copy of x W."""
    partials = [x_r @ w_r for x_r, w_r in zip(x_shards, weight_shards)]  # k × (N, out), summing to x W
    stacked = AllReduce.apply(*partials)  # (k, N, out)
    return [stacked[r] for r in range(len(partials))]
