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
        # TODO: the sum of the partials (a new array: do not add into an input), stacked once per rank.
        raise NotImplementedError("TODO: AllReduce.forward (exercise 28)")

    @staticmethod
    def backward(ctx, grad_out):
        """grad_out (k, ..., out): the gradient of each rank's copy. Returns one gradient per partial."""
        # TODO: derive it (README: The backward): which ranks' copies does partial i reach? Return a
        # tuple of k arrays, one per partial, each shaped like one partial.
        raise NotImplementedError("TODO: AllReduce.backward (exercise 28)")

    @staticmethod
    def jvp(ctx, *tangents):
        """A linear map is its own derivative: the all-reduce of the tangents (none: zeros)."""
        present = next(t for t in tangents if t is not None)
        return AllReduce.forward(ctx, *(np.zeros_like(present) if t is None else t for t in tangents))


def row_parallel_linear(x_shards, weight_shards):
    """x_shards: k tensors (N, in/k), rank r's columns of x; weight_shards: k tensors (in/k, out),
    rank r's rows of W. Returns k tensors (N, out): every rank's copy of x W."""
    # TODO: each rank's partial product, the all-reduce of them (AllReduce.apply), and the k rows of
    # its stacked output as a list (README: The forward).
    raise NotImplementedError("TODO: row_parallel_linear (exercise 28)")
