"""Embedding: look up one row of a weight table per id.

    y[..., :] = W[ids[...], :]          ids (...) integers in [0, V), W (V, C) -> y (..., C)

Each output row is a copy of one row of W, so backward adds each output row's gradient into the
row it was copied from:

    dL/dW[v, :] = sum over positions p with ids[p] = v of g[p, :]          (V, C)

An id that appears several times collects all its gradients. Done in parallel over rows this would
race (two threads adding into the same row of dW), so the scatter-add runs over the columns in
parallel instead: every thread owns a band of columns c and walks all positions, so no element of
dW is written by two threads. ids need no gradient.
"""
import numpy as np
from numba import njit, prange

from ..autograd import Function
from ..gradcheck import gradcheck_case
from ..tensor import Tensor
from .checks import check_float, check_integer


def embedding_reference(ids, weight):
    return weight[ids]


@njit(cache=True)
def embedding_forward(ids, weight, y):
    """ids (N,), weight (V, C) -> y (N, C)."""
    for n in range(ids.shape[0]):
        y[n, :] = weight[ids[n], :]


@njit(cache=True, parallel=True, error_model="numpy")
def embedding_backward(grad_out, ids, grad_weight):
    """grad_out (N, C), ids (N,) -> grad_weight (V, C), zeroed first; parallel over columns."""
    N, C = grad_out.shape
    grad_weight[:] = 0
    for c in prange(C):
        for n in range(N):
            grad_weight[ids[n], c] += grad_out[n, c]


class Embedding(Function):
    @staticmethod
    def forward(ctx, ids, weight):
        flat_ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        w = np.ascontiguousarray(weight)
        y = np.empty((flat_ids.shape[0], w.shape[1]), dtype=w.dtype)
        embedding_forward(flat_ids, w, y)
        ctx.save_for_backward(flat_ids)
        ctx.weight_shape = w.shape
        return y.reshape(ids.shape + (w.shape[1],))

    @staticmethod
    def backward(ctx, grad_out):
        (flat_ids,) = ctx.saved_tensors
        g = np.ascontiguousarray(grad_out).reshape(flat_ids.shape[0], -1)
        grad_weight = np.empty(ctx.weight_shape, dtype=grad_out.dtype)
        embedding_backward(g, flat_ids, grad_weight)
        return None, grad_weight


def embedding(ids, weight):
    """Rows of weight (V, C) picked by integer ids of any shape: output ids.shape + (C,)."""
    if not isinstance(ids, Tensor):
        ids = Tensor(np.asarray(ids))
    check_integer("embedding", "ids", ids)
    check_float("embedding", weight)
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be (num_embeddings, dim), got shape {weight.shape}")
    if ids.data.size and (ids.data.min() < 0 or ids.data.max() >= weight.shape[0]):
        bad = ids.data[(ids.data < 0) | (ids.data >= weight.shape[0])].reshape(-1)[0]
        raise IndexError(f"embedding: id {bad} is out of range for a table of {weight.shape[0]} rows (ids must be in [0, {weight.shape[0]}))")
    return Embedding.apply(ids, weight)


@gradcheck_case(Embedding)
def _embedding_case(draw):
    V, C = draw.integer(1, 5), draw.integer(1, 4)
    ids = draw.indices(draw.shape(min_dims=1, max_dims=2), V)  # small V: ids repeat
    return (lambda w: embedding(ids, w)), (draw.tensor((V, C)),)
