"""The ops of a mixture-of-experts layer: choose each token's experts, renormalize their gates,
send each expert its tokens' rows, and add the experts' answers back, weighted by the gates.

A router gives every token n a probability p[n, e] for every expert e (a softmax, N tokens by E
experts). Each token goes to its k most probable experts, and its output is the sum of their
outputs weighted by the gates, the k chosen probabilities divided by their sum:

    experts[n, :] = the k experts with the largest p[n, e]        (N, k)  integers: no gradient
    gates[n, j]   = p[n, experts[n, j]] / s_n,   s_n = sum_j p[n, experts[n, j]]      (N, k)
    out[n]        = sum_j gates[n, j] Expert_{experts[n, j]}(x[n])                    (N, C)

An expert runs only on the rows routed to it: gather them (`gather_rows`), run the expert on those
M rows, and add its answers back into their tokens' rows, each times its gate (`scatter_add_rows`).
The model (gpt/model/electives/moe.py) strings these together; this file holds the ops and their backward.

The choice itself, `top_k_experts`, is a selection made with numpy: it has no gradient (a small
change of p either keeps the same experts, and then the choice's derivative is 0, or swaps two
experts, where the output jumps and has no derivative at all). The gradient reaches the router
through the gates alone.

gather_rows(x, rows): x (N, C), rows (M,) integers in [0, N) -> y (M, C)

    y[m, :] = x[rows[m], :]

Each output row is a copy of one input row, so, as for an embedding (ops/embedding.py), backward
adds each output row's gradient into the row it was copied from; with g = dL/dy (M, C):

    dL/dx[i, :] = sum over the m with rows[m] = i of g[m, :]                      (N, C)

a row picked twice collects both gradients, a row never picked gets zero. That is a scatter-add.

scatter_add_rows(values, rows, n, weights): values (M, C), rows (M,) in [0, n), weights (M,) -> out (n, C)

    out[i, :] = sum over the m with rows[m] = i of weights[m] values[m, :]

(weights None means all ones). With g = dL/dout (n, C), out[rows[m], c] depends on values[m, c]
through the factor weights[m], and on weights[m] through values[m, c], for every c:

    dL/dvalues[m, :] = weights[m] g[rows[m], :]                                   (M, C)
    dL/dweights[m]   = sum_c g[rows[m], c] values[m, c]                           (M,)

The first line is a gather of g's rows (scaled). Gather and scatter-add are each other's
transpose: as matrices, gather is y = S x with S (M, N) holding a single 1 per row, S[m, rows[m]],
and scatter-add (unit weights) is out = Sᵀ values; the backward of a product by S is the product by
Sᵀ, and the other way round. So each op's backward is the other op's forward, and the kernels here
say so: GatherRows.backward calls scatter_add_rows_forward with unit weights.

top_k_gates(probs, experts): probs (N, E) > 0, experts (N, k) in [0, E) -> gates (N, k)

    q_j = probs[n, experts[n, j]],   s = sum_j q_j,   gates[n, j] = q_j / s       (one row n)

Backward. Within a row, gates_j = q_j / s and ds/dq_i = 1, so

    dgates_j/dq_i = δ_ij / s - q_j / s² = (δ_ij - gates_j) / s
    dL/dq_i = sum_j g_j (δ_ij - gates_j) / s = (g_i - <g, gates>) / s           (k,) per row

(the same shape of formula as the softmax's backward, y (g - <g, y>): both divide by a sum of the
inputs), and dL/dprobs[n, e] adds dL/dq_j for every j with experts[n, j] = e: zero for the experts
not chosen. Forward saves the sums s (N,) and the gates; backward needs nothing else.

Forward mode (JVP). Gather, scatter-add and the gates are moved by tangents as values are: along a
tangent tx of x, gather gives tx[rows]; along tangents tvalues, tweights, the scatter-add gives
out[rows[m]] += weights[m] tvalues[m] + tweights[m] values[m] (the product rule); and along a tangent
tp of probs, with tq_j = tp[n, experts[n, j]] and ds = sum_j tq_j,

    dgates_j = sum_i (δ_ij - gates_j) / s tq_i = (tq_j - gates_j ds) / s             (k,) per row

The kernels are plain serial loops, one row of C numbers at a time: a scatter-add must be serial
as written (two tokens routed to one row would add into the same numbers at once), and a gather
is memory traffic the compiler already turns into vector loads. There is no fast twin
(microtensor/fast/__init__.py says why). The indices are checked in Python before any kernel runs:
the kernels index without bounds checks.
"""
import numpy as np

from ...autograd import Function, add_tangents
from ...checks import check_float, check_int, check_ndim, check_tensor, describe
from ...errors import InputError, InputTypeError
from ...gradcheck import gradcheck_case
from ...kernels import active, kernel
from ...tensor import Tensor

# --------------------------------------------------------------------------------- numpy reference


def top_k_experts_reference(probs, k):
    """The k largest of each row of probs (N, E), largest first, by plain Python sorting (the test oracle)."""
    chosen = [sorted(range(probs.shape[1]), key=lambda e: (-row[e], e))[:k] for row in probs]
    return np.array(chosen, dtype=np.int64).reshape(probs.shape[0], k)


def gather_rows_reference(x, rows):
    """x (N, C), rows (M,) -> x[rows] (M, C)."""
    return x[rows]


def scatter_add_rows_reference(values, rows, n, weights=None):
    """out (n, C): out[rows[m]] += weights[m] values[m] (np.add.at adds repeated rows one by one)."""
    out = np.zeros((n, values.shape[1]), dtype=values.dtype)
    w = np.ones(values.shape[0], dtype=values.dtype) if weights is None else weights
    np.add.at(out, rows, w[:, None] * values)
    return out


def top_k_gates_reference(probs, experts):
    """probs (N, E), experts (N, k) -> the chosen probabilities, each row divided by its sum (N, k)."""
    picked = np.take_along_axis(probs, experts, axis=1)
    return picked / picked.sum(axis=1, keepdims=True)


# --------------------------------------------------------------------------------- the choice (numpy, no gradient)


def top_k_experts(probs, k):
    """Each row's k most probable experts, most probable first: probs (N, E) -> (N, k) int64.

    A selection made with numpy on the values, outside the graph: the indices get no gradient (the
    module docstring says why). Two equal probabilities are ranked by expert number, lower first
    (a stable sort), so the choice is the same on every run. probs: a float array or Tensor, with
    no NaN (a NaN has no rank: it is refused, naming where it is).
    """
    if isinstance(probs, Tensor):
        probs = probs.data
    if not isinstance(probs, np.ndarray) or probs.dtype.kind != "f" or probs.ndim != 2:
        raise InputTypeError(f"top_k_experts: probs must be a 2-d float array (N, E), got {describe(probs)}")
    k = check_int("top_k_experts", "k", k, low=1, high=probs.shape[1])
    if np.isnan(probs).any():
        # A NaN ranks nowhere: the router has already failed, and top_k_gates refuses its row anyway
        n, e = np.argwhere(np.isnan(probs))[0]
        raise InputError(f"top_k_experts: probs[{n}, {e}] is NaN; expected probabilities (the router's softmax gave NaN: look for an inf or NaN logit)")
    order = np.argsort(-probs, axis=1, kind="stable")  # (N, E): experts from the most probable down
    return np.ascontiguousarray(order[:, :k], dtype=np.int64)


# --------------------------------------------------------------------------------- readable kernels


@kernel
def gather_rows_forward(x, rows, y):
    """x (N, C), rows (M,) -> y (M, C): y[m] = x[rows[m]]."""
    M, C = y.shape
    for m in range(M):
        row = rows[m]
        for c in range(C):
            y[m, c] = x[row, c]


@kernel
def scatter_add_rows_forward(values, rows, weights, out):
    """values (M, C), rows (M,), weights (M,) -> out (n, C), zeroed first:
    out[rows[m]] += weights[m] values[m]. Serial: two m with the same row add into the same numbers."""
    M, C = values.shape
    out[:] = 0
    for m in range(M):
        row, w = rows[m], weights[m]
        for c in range(C):
            out[row, c] += w * values[m, c]


@kernel
def scatter_add_rows_backward(grad_out, values, rows, weights, grad_values, grad_weights):
    """grad_values (M, C) = weights[m] grad_out[rows[m]];  grad_weights (M,) = <grad_out[rows[m]], values[m]>."""
    M, C = values.shape
    zero = values.dtype.type(0)
    for m in range(M):
        row, w = rows[m], weights[m]
        dot = zero
        for c in range(C):
            grad_values[m, c] = w * grad_out[row, c]
            dot += grad_out[row, c] * values[m, c]
        grad_weights[m] = dot


@kernel
def top_k_gates_forward(probs, experts, gates, sums):
    """probs (N, E), experts (N, k) -> gates (N, k) = the chosen probabilities / their sum;
    saves sums (N,), each row's sum s_n."""
    N, K = experts.shape
    zero = probs.dtype.type(0)
    for n in range(N):
        s = zero
        for j in range(K):
            s += probs[n, experts[n, j]]
        for j in range(K):
            gates[n, j] = probs[n, experts[n, j]] / s
        sums[n] = s


@kernel
def top_k_gates_backward(grad_out, experts, gates, sums, grad_probs):
    """grad_probs (N, E), zeroed first: grad_probs[n, experts[n, j]] += (g[n, j] - <g[n], gates[n]>) / s_n.
    (The experts of a row differ, so each chosen element gets one term; an expert not chosen gets 0.)"""
    N, K = experts.shape
    zero = gates.dtype.type(0)
    grad_probs[:] = 0
    for n in range(N):
        dot = zero
        for j in range(K):
            dot += grad_out[n, j] * gates[n, j]
        for j in range(K):
            grad_probs[n, experts[n, j]] += (grad_out[n, j] - dot) / sums[n]


# --------------------------------------------------------------------------------- Functions


class GatherRows(Function):
    """y = x[rows].   dL/dx = the scatter-add of g into the rows: scatter_add_rows's forward.

    JVP: dy = tx[rows].
    """

    @staticmethod
    def forward(ctx, x, rows):
        x = np.ascontiguousarray(x)  # (N, C)
        y = np.empty((rows.shape[0], x.shape[1]), dtype=x.dtype)  # (M, C)
        active(gather_rows_forward)(x, rows, y)
        ctx.save_for_backward(rows)
        ctx.input_shape = x.shape
        return y

    @staticmethod
    def backward(ctx, grad_out):
        (rows,) = ctx.saved_tensors
        g = np.ascontiguousarray(grad_out)  # (M, C)
        grad_x = np.empty(ctx.input_shape, dtype=g.dtype)  # (N, C)
        unit_weights = np.ones(rows.shape[0], dtype=g.dtype)  # (M,): the plain transpose of the gather
        active(scatter_add_rows_forward)(g, rows, unit_weights, grad_x)
        return grad_x, None

    @staticmethod
    def jvp(ctx, tangent_x, _rows):
        (rows,) = ctx.saved_tensors
        return tangent_x[rows]  # (M, C): the tangent's rows, picked as forward picks x's


class ScatterAddRows(Function):
    """out[rows[m]] += weights[m] values[m].   dL/dvalues[m] = weights[m] g[rows[m]] (a gather),
    dL/dweights[m] = <g[rows[m]], values[m]>.

    JVP: dout[rows[m]] += weights[m] tvalues[m] + tweights[m] values[m].
    """

    @staticmethod
    def forward(ctx, values, weights, rows, n):
        values = np.ascontiguousarray(values)  # (M, C)
        w = np.ones(values.shape[0], dtype=values.dtype) if weights is None else np.ascontiguousarray(weights)  # (M,)
        out = np.empty((n, values.shape[1]), dtype=values.dtype)  # (n, C)
        active(scatter_add_rows_forward)(values, rows, w, out)
        ctx.save_for_backward(values, w, rows)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        values, w, rows = ctx.saved_tensors
        g = np.ascontiguousarray(grad_out)  # (n, C)
        grad_values = np.empty_like(values)  # (M, C)
        grad_weights = np.empty_like(w)  # (M,)
        active(scatter_add_rows_backward)(g, values, rows, w, grad_values, grad_weights)
        return (
            grad_values if ctx.needs_input_grad[0] else None,
            grad_weights if ctx.needs_input_grad[1] else None,
            None,
            None,
        )

    @staticmethod
    def jvp(ctx, tangent_values, tangent_weights, _rows, _n):
        values, w, rows = ctx.saved_tensors
        dtype = next(t.dtype for t in (tangent_values, tangent_weights) if t is not None)
        moved = add_tangents(  # (M, C): the product rule on weights[m] values[m]
            values.shape,
            None if tangent_values is None else w[:, None] * tangent_values,
            None if tangent_weights is None else tangent_weights[:, None] * values,
        )
        tangent_out = np.zeros((ctx.inputs[3], values.shape[1]), dtype=dtype)  # (n, C)
        np.add.at(tangent_out, rows, moved)  # repeated rows add up, as in forward
        return tangent_out


class TopKGates(Function):
    """gates = the chosen probabilities / their sum, per row.   dL/dq = (g - <g, gates>) / s.

    JVP: dgates = (tq - gates ds) / s, tq the tangent's chosen probabilities and ds their sum.
    """

    @staticmethod
    def forward(ctx, probs, experts):
        probs = np.ascontiguousarray(probs)  # (N, E)
        gates = np.empty(experts.shape, dtype=probs.dtype)  # (N, k)
        sums = np.empty(experts.shape[0], dtype=probs.dtype)  # (N,)
        active(top_k_gates_forward)(probs, experts, gates, sums)
        ctx.save_for_backward(experts, gates, sums)
        ctx.probs_shape = probs.shape
        return gates

    @staticmethod
    def backward(ctx, grad_out):
        experts, gates, sums = ctx.saved_tensors
        grad_probs = np.empty(ctx.probs_shape, dtype=grad_out.dtype)  # (N, E)
        active(top_k_gates_backward)(np.ascontiguousarray(grad_out), experts, gates, sums, grad_probs)
        return grad_probs, None

    @staticmethod
    def jvp(ctx, tangent_probs, _experts):
        experts, gates, sums = ctx.saved_tensors
        tangent_chosen = np.take_along_axis(tangent_probs, experts, axis=1)  # tq (N, k)
        tangent_sums = tangent_chosen.sum(axis=1, keepdims=True)  # ds (N, 1)
        return (tangent_chosen - gates * tangent_sums) / sums[:, None]


# --------------------------------------------------------------------------------- public functions


def _index_array(op, name, indices, ndim, high, what):
    """indices as a C-contiguous int64 array of `ndim` dims with every value in [0, high), or an
    error naming the op: the kernels index without bounds checks."""
    if isinstance(indices, Tensor):
        indices = indices.data
    elif isinstance(indices, (list, tuple)):
        try:
            indices = np.asarray(indices)
        except ValueError as error:  # a ragged list
            raise InputError(f"{op}: {name} is not a valid array of indices: {error}") from None
        if indices.size == 0:
            indices = indices.astype(np.int64)  # an empty list has no dtype of its own (numpy says float64)
    if not isinstance(indices, np.ndarray):
        raise InputTypeError(f"{op}: {name} must be an integer Tensor, numpy array or list, got {describe(indices)}")
    if indices.dtype.kind not in "iu":
        raise InputTypeError(f"{op}: {name} must hold integers, got {indices.dtype} of shape {indices.shape}")
    if indices.ndim != ndim:
        raise InputError(f"{op}: {name} must be {what}, got shape {indices.shape}")
    if indices.size and (indices.min() < 0 or indices.max() >= high):
        bad = indices[(indices < 0) | (indices >= high)].flat[0]
        raise InputError(f"{op}: {name} holds {bad}, out of range: every value must be in [0, {high})")
    return np.ascontiguousarray(indices, dtype=np.int64)


def gather_rows(x, rows):
    """The rows of x (N, C) picked by rows (M,), integers in [0, N) that may repeat: (M, C).
    Backward scatter-adds the gradient into the picked rows (a row picked twice collects both)."""
    check_tensor("gather_rows", x, "x")
    check_float("gather_rows", x)
    check_ndim("gather_rows", "x", x, (2,), "a 2-d Tensor (N, C)")
    rows = _index_array("gather_rows", "rows", rows, 1, x.shape[0], "a 1-d array (M,) of row numbers")
    return GatherRows.apply(x, rows)


def scatter_add_rows(values, rows, n, weights=None):
    """A new (n, C) tensor of zeros, into whose row rows[m] each values[m] (M, C) is added, times
    weights[m] when weights (M,) is given: out[rows[m]] += weights[m] values[m]. rows: integers in
    [0, n) that may repeat (their rows add up); a row no m names stays zero."""
    check_tensor("scatter_add_rows", values, "values")
    if weights is not None:
        check_tensor("scatter_add_rows", weights, "weights")
    check_float("scatter_add_rows", *[t for t in (values, weights) if t is not None])
    check_ndim("scatter_add_rows", "values", values, (2,), "a 2-d Tensor (M, C)")
    n = check_int("scatter_add_rows", "n", n, low=0)
    rows = _index_array("scatter_add_rows", "rows", rows, 1, n, "a 1-d array (M,) of row numbers")
    if rows.shape[0] != values.shape[0]:
        raise InputError(f"scatter_add_rows: rows has {rows.shape[0]} entries for {values.shape[0]} rows of values {values.shape}; expected one per row")
    if weights is not None and weights.shape != (values.shape[0],):
        raise InputError(f"scatter_add_rows: weights must have shape ({values.shape[0]},), one per row of values {values.shape}, got {weights.shape}")
    return ScatterAddRows.apply(values, weights, rows, n)


def top_k_gates(probs, experts):
    """The gates of a top-k routing: for each row n of probs (N, E), the probabilities of the experts
    experts[n] (N, k) (from `top_k_experts`), divided by their sum, so that each row of the result
    (N, k) sums to 1. The gradient reaches only the chosen probabilities. Each row names k different
    experts, and their probabilities must add up to more than 0 (a softmax's are all positive)."""
    check_tensor("top_k_gates", probs, "probs")
    check_float("top_k_gates", probs)
    check_ndim("top_k_gates", "probs", probs, (2,), "a 2-d Tensor (N, E)")
    experts = _index_array("top_k_gates", "experts", experts, 2, probs.shape[1], "a 2-d array (N, k) of expert numbers")
    if experts.shape[0] != probs.shape[0] or experts.shape[1] < 1:
        raise InputError(f"top_k_gates: experts must be (N, k) with N = {probs.shape[0]} (the rows of probs) and k >= 1, got shape {experts.shape}")
    ordered = np.sort(experts, axis=1)  # (N, k)
    repeated = ordered[:, 1:] == ordered[:, :-1]  # (N, k - 1)
    if repeated.any():
        n, j = np.argwhere(repeated)[0]
        raise InputError(f"top_k_gates: row {n} of experts chooses expert {ordered[n, j]} twice; expected k different experts per row (as top_k_experts gives)")
    sums = np.take_along_axis(probs.data, experts, axis=1).sum(axis=1)  # (N,)
    if not np.all(sums > 0):
        n = int(np.argmin(sums > 0))
        raise InputError(f"top_k_gates: the chosen probabilities of row {n} add up to {sums[n]}; they must add up to more than 0 (they are divided by their sum)")
    return TopKGates.apply(probs, experts)


# --------------------------------------------------------------------------------- gradcheck cases


@gradcheck_case(GatherRows)
def _gather_rows_case(draw):
    N, C = draw.integer(1, 4), draw.integer(1, 4)
    rows = draw.indices((draw.integer(1, 5),), N).data  # more rows than N: some repeat, some are never picked
    return (lambda x: gather_rows(x, rows)), (draw.tensor((N, C)),)


@gradcheck_case(ScatterAddRows)
def _scatter_add_rows_case(draw):
    M, C, n = draw.integer(1, 4), draw.integer(1, 4), draw.integer(1, 4)
    rows = draw.indices((M,), n).data  # rows may repeat (their values add) or be missed (zeros)
    values = draw.tensor((M, C))
    if draw.boolean():
        return (lambda values, weights: scatter_add_rows(values, rows, n, weights)), (values, draw.tensor((M,)))
    return (lambda values: scatter_add_rows(values, rows, n)), (values,)


@gradcheck_case(TopKGates)
def _top_k_gates_case(draw):
    N, E = draw.integer(1, 4), draw.integer(1, 4)
    k = draw.integer(1, E)
    probs = draw.tensor((N, E), 0.1, 1.0)  # positive, as a softmax's are (they need not sum to 1 here)
    # k different experts per row, as top_k_experts gives, in a drawn order
    experts = np.argsort(draw.tensor((N, E)).data, axis=1)[:, :k]  # (N, k)
    return (lambda probs: top_k_gates(probs, experts)), (probs,)

