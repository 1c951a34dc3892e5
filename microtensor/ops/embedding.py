"""Embedding: look up one row of a weight table per id.

    y[..., :] = W[ids[...], :]          ids (...) integers in [0, V), W (V, C) -> y (..., C)

Each output row is a copy of one row of W, so backward adds each output row's gradient into the
row it was copied from:

    dL/dW[v, :] = sum over positions p with ids[p] = v of g[p, :]          (V, C)

An id that appears several times collects all its gradients.

The kernels are serial. At the GPT's shapes (768 ids into a (65, 128) table, float32) a kernel
copies or adds ~100k numbers, ~10-20 µs on one core, less than it costs here to wake the second
core's thread (~75 µs). Measured at that shape, forward / forward+backward: 46 / 186 µs with the
earlier kernels (a parallel backward, row copies by slices, the range check by numpy), 17 / 34 µs
with these.
Serial also makes the scatter-add trivially race-free: in parallel, two threads handling positions
with the same id would add into the same row of dW at once (the earlier parallel kernel ran over
columns instead, each thread owning a band of columns, which reads grad_out with a stride of C and
was slower). Both kernels walk rows with an explicit loop over columns, which the compiler turns
into vector loads and stores; `y[n, :] = weight[ids[n], :]` built two array views per row.
The range check of the ids is a loop too: `ids.min()` and `ids.max()` cost two numpy calls.
ids need no gradient.
"""
import numpy as np
from numba import njit

from ..autograd import Function
from ..gradcheck import gradcheck_case
from ..tensor import Tensor
from .checks import check_float, check_integer


def embedding_reference(ids, weight):
    return weight[ids]


@njit(cache=True)
def first_id_out_of_range(ids, num_embeddings):
    """The position of the first id outside [0, num_embeddings) in ids (N,), or -1 if there is none."""
    for n in range(ids.shape[0]):
        if ids[n] < 0 or ids[n] >= num_embeddings:
            return n
    return -1


@njit(cache=True, error_model="numpy")
def embedding_forward(ids, weight, y):
    """ids (N,), weight (V, C) -> y (N, C): y[n] = weight[ids[n]]."""
    N, C = y.shape
    for n in range(N):
        row = ids[n]
        for c in range(C):
            y[n, c] = weight[row, c]


@njit(cache=True, error_model="numpy")
def embedding_backward(grad_out, ids, grad_weight):
    """grad_out (N, C), ids (N,) -> grad_weight (V, C), zeroed first: grad_weight[ids[n]] += grad_out[n]."""
    N, C = grad_out.shape
    grad_weight[:] = 0
    for n in range(N):
        row = ids[n]
        for c in range(C):
            grad_weight[row, c] += grad_out[n, c]


class Embedding(Function):
    @staticmethod
    def forward(ctx, ids, weight):
        flat_ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)  # (N,), no copy for int64 ids
        w = np.ascontiguousarray(weight)  # (V, C)
        y = np.empty((flat_ids.shape[0], w.shape[1]), dtype=w.dtype)  # (N, C)
        embedding_forward(flat_ids, w, y)
        ctx.save_for_backward(flat_ids)
        ctx.weight_shape = w.shape
        return y.reshape(ids.shape + (w.shape[1],))

    @staticmethod
    def backward(ctx, grad_out):
        (flat_ids,) = ctx.saved_tensors
        g = np.ascontiguousarray(grad_out).reshape(flat_ids.shape[0], -1)  # (N, C)
        grad_weight = np.empty(ctx.weight_shape, dtype=grad_out.dtype)  # (V, C)
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
    bad_position = first_id_out_of_range(ids.data.reshape(-1), weight.shape[0])
    if bad_position >= 0:
        bad = ids.data.reshape(-1)[bad_position]
        raise IndexError(f"embedding: id {bad} is out of range for a table of {weight.shape[0]} rows (ids must be in [0, {weight.shape[0]}))")
    return Embedding.apply(ids, weight)


@gradcheck_case(Embedding)
def _embedding_case(draw):
    V, C = draw.integer(1, 5), draw.integer(1, 4)
    ids = draw.indices(draw.shape(min_dims=1, max_dims=2), V)  # small V: ids repeat
    return (lambda w: embedding(ids, w)), (draw.tensor((V, C)),)
