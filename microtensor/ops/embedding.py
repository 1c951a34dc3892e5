"""Embedding: look up one row of a weight table per id.

    y[..., :] = W[ids[...], :]          ids (...) integers in [0, V), W (V, C) -> y (..., C)

Each output row is a copy of one row of W, so backward adds each output row's gradient into the
row it was copied from:

    dL/dW[v, :] = sum over positions p with ids[p] = v of g[p, :]          (V, C)

An id that appears several times collects all its gradients.

The kernels are serial loops. The backward must be, as written: two positions with the same id add
into the same row of dW, and two threads doing that at once would lose one of the additions.
Both copy and add one number at a time in an explicit loop over the columns, which the compiler
turns into vector loads and stores anyway. ids need no gradient.
"""
import numpy as np

from ..autograd import Function
from ..checks import check_float, check_integer, describe
from ..errors import InputError, InputIndexError, InputTypeError
from ..gradcheck import gradcheck_case
from ..kernels import active, kernel
from ..tensor import Tensor


def embedding_reference(ids, weight):
    """Plain numpy embedding: the rows of weight (V, C) picked by ids (...) (the test oracle)."""
    return weight[ids]


@kernel
def first_id_out_of_range(ids, num_embeddings):
    """The position of the first id outside [0, num_embeddings) in ids (N,), or -1 if there is none."""
    for n in range(ids.shape[0]):
        if ids[n] < 0 or ids[n] >= num_embeddings:
            return n
    return -1


@kernel
def embedding_forward(ids, weight, y):
    """ids (N,), weight (V, C) -> y (N, C): y[n] = weight[ids[n]]."""
    N, C = y.shape
    for n in range(N):
        row = ids[n]
        for c in range(C):
            y[n, c] = weight[row, c]


@kernel
def embedding_backward(grad_out, ids, grad_weight):
    """grad_out (N, C), ids (N,) -> grad_weight (V, C), zeroed first: grad_weight[ids[n]] += grad_out[n]."""
    N, C = grad_out.shape
    grad_weight[:] = 0
    for n in range(N):
        row = ids[n]
        for c in range(C):
            grad_weight[row, c] += grad_out[n, c]


class Embedding(Function):
    """y[n] = weight[ids[n]].   dL/dweight = the scatter-add of g into the rows ids picked.

    JVP: dy[n] = tw[ids[n]], ids.shape + (C,): the rows of the weight's tangent that forward picks
    (ids are integers and have no tangent).
    """

    @staticmethod
    def forward(ctx, ids, weight):
        flat_ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)  # (N,), no copy for int64 ids
        w = np.ascontiguousarray(weight)  # (V, C)
        y = np.empty((flat_ids.shape[0], w.shape[1]), dtype=w.dtype)  # (N, C)
        active(embedding_forward)(flat_ids, w, y)
        ctx.save_for_backward(flat_ids)
        ctx.weight_shape = w.shape
        return y.reshape(ids.shape + (w.shape[1],))

    @staticmethod
    def backward(ctx, grad_out):
        (flat_ids,) = ctx.saved_tensors
        g = np.ascontiguousarray(grad_out).reshape(flat_ids.shape[0], ctx.weight_shape[1])  # (N, C)
        grad_weight = np.empty(ctx.weight_shape, dtype=grad_out.dtype)  # (V, C)
        active(embedding_backward)(g, flat_ids, grad_weight)
        return None, grad_weight

    @staticmethod
    def jvp(ctx, _ids, tangent_weight):
        (flat_ids,) = ctx.saved_tensors
        return tangent_weight[flat_ids].reshape(ctx.inputs[0].shape + (ctx.weight_shape[1],))


def embedding(ids, weight):
    """Rows of weight (V, C) picked by integer ids of any shape: output ids.shape + (C,).
    ids: an integer Tensor, numpy array or list, every id in [0, V)."""
    if not isinstance(ids, Tensor):
        if not isinstance(ids, (np.ndarray, list, tuple, int, np.integer)) or isinstance(ids, (bool, np.bool_)):
            raise InputTypeError(f"embedding: ids must be an integer Tensor, numpy array or list, got {describe(ids)}")
        try:
            array = np.asarray(ids)
        except ValueError as error:  # a ragged list
            raise InputError(f"embedding: ids are not a valid array: {error}") from None
        if array.size == 0 and isinstance(ids, (list, tuple)):
            array = array.astype(np.int64)  # an empty list has no dtype of its own (numpy says float64)
        ids = Tensor._from_array(array)
    check_integer("embedding", "ids", ids)
    check_float("embedding", weight)
    if weight.ndim != 2:
        raise InputError(f"embedding: weight must be (num_embeddings, dim), got shape {weight.shape}")
    flat_ids = ids.data.reshape(-1)  # (N,)
    if flat_ids.dtype == np.uint64 and flat_ids.size and flat_ids.max() > np.iinfo(np.int64).max:
        bad_position = int(np.argmax(flat_ids))  # beyond int64: no table is that long
    else:
        bad_position = active(first_id_out_of_range)(flat_ids, weight.shape[0])
    if bad_position >= 0:
        bad = flat_ids[bad_position]
        raise InputIndexError(f"embedding: id {bad} is out of range for a table of {weight.shape[0]} rows (ids must be in [0, {weight.shape[0]}))")
    return Embedding.apply(ids, weight)


@gradcheck_case(Embedding)
def _embedding_case(draw):
    V, C = draw.integer(1, 5), draw.integer(1, 4)
    ids = draw.indices(draw.shape(min_dims=1, max_dims=2), V)  # small V: ids repeat
    return (lambda w: embedding(ids, w)), (draw.tensor((V, C)),)
