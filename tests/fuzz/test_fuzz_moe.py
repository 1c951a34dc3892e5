"""The fuzz entries of microtensor/ops/electives/moe.py: the mixture of experts' gathers, scatters and routing (an elective).

How an entry draws its arguments and judges the call: fuzzing.py."""
import numpy as np

import microtensor.functional as F
from microtensor import Tensor
from fuzzing import assert_close, fuzz, fuzz_test, run


def some_indices(draw, shape, high, name):
    """Integers in [0, high) of `shape` as an int64 Tensor, an int32 array or a list; rarely (marked
    invalid) one out of range, floats, or one dim too many."""
    ids = draw.rng.integers(0, max(high, 1), shape)
    if draw.rarely():
        kind = draw.choice(("out of range", "float", "extra dim"))
        if kind == "out of range":
            ids = np.where(np.arange(ids.size).reshape(shape) == 0, draw.choice((-1, high, high + 5)), ids) if ids.size else ids
            if ids.size:
                draw.mark_invalid(f"{name}: {kind}")
        else:
            draw.mark_invalid(f"{name}: {kind}")
            ids = ids.astype(np.float64) if kind == "float" else ids[..., None]
    elif high == 0 and ids.size:
        draw.mark_invalid(f"{name}: no valid index below 0")
    form = draw.choice(("tensor", "array", "list"))
    if form == "list" and ids.size == 0:
        form = "array"  # (a list of an empty shape loses the dims after the first 0)
    argument = {"tensor": lambda: Tensor(ids if ids.dtype.kind == "f" else ids.astype(np.int64)), "array": lambda: ids if ids.dtype.kind == "f" else ids.astype(np.int32), "list": lambda: ids.tolist()}[form]()
    return argument, ids


@fuzz("gather_rows")
def _gather_rows(draw):
    N, C, M, dtype = draw.integer(0 if draw.rarely() else 1, 4), draw.integer(0, 3), draw.integer(0, 5), draw.float_dtype()
    x = draw.float_operand((N, C), dtype)
    if draw.one_in(15):
        x = draw.tensor((N,), dtype)
        draw.mark_invalid("a 1-d x")
    rows, ids = some_indices(draw, (M,), N, "rows")
    run(draw, "gather_rows", lambda: F.gather_rows(x, rows), lambda result: assert_close("gather_rows", result, x.numpy()[ids], exact=True))


@fuzz("scatter_add_rows")
def _scatter_add_rows(draw):
    n, C, M, dtype = draw.integer(0 if draw.rarely() else 1, 4), draw.integer(0, 3), draw.integer(0, 5), draw.float_dtype()
    values = draw.float_operand((M, C), dtype)
    if draw.one_in(15):
        values = draw.tensor((M,), dtype)
        draw.mark_invalid("a 1-d values")
    rows, ids = some_indices(draw, (M,), n, "rows")
    if draw.one_in(12):
        rows, ids = ids[:-1] if M else [0], None  # one entry too few, or one for no row of values
        draw.mark_invalid("rows of another length")
    weights = draw.choice((None, "tensor", "tensor"))
    if weights == "tensor":
        weights = draw.same_dtype_operand((M,) if not draw.one_in(12) else (M + 1,), dtype)
        if isinstance(weights, Tensor) and weights.shape != (M,):
            draw.mark_invalid("weights of the wrong shape")
    size = draw.choice((-1, 2.0, True)) if draw.one_in(12) else n
    if size is not n:
        draw.mark_invalid(f"n = {size!r}")

    def expect(result):
        v = values.numpy()
        w = np.ones(M, dtype) if weights is None else weights.numpy()
        terms = w[:, None] * v  # (M, C), in the dtype
        expected = np.zeros((n, C), dtype)
        np.add.at(expected, ids, terms)  # in the order of m, one by one
        with np.errstate(all="ignore"):
            bound = np.zeros((n, C))
            np.add.at(bound, ids, np.abs(terms.astype(np.float64)))
        finite = bound[np.isfinite(bound)]
        assert_close("scatter_add_rows", result, expected, scale=max(1.0, float(finite.max(initial=0))))

    run(draw, "scatter_add_rows", lambda: F.scatter_add_rows(values, rows, size, weights), expect)


@fuzz("top_k_experts")
def _top_k_experts(draw):
    N, E, dtype = draw.integer(0, 4), draw.integer(0 if draw.rarely() else 1, 5), draw.float_dtype()
    values = draw.rng.choice([0.1, 0.25, 0.5, 0.7], (N, E)).astype(dtype)  # ties among few values
    if draw.one_in(10) and values.size:
        values.flat[draw.integer(0, values.size - 1)] = np.nan
        draw.mark_invalid("a NaN probability")
    probs = draw.layout(values)
    form = draw.choice(("tensor", "array"))
    argument = Tensor(probs) if form == "tensor" else probs
    if draw.one_in(10):
        argument = draw.choice((probs.tolist(), probs.astype(np.int64), probs.reshape(-1)))
        draw.mark_invalid("probs not a 2-d float array or Tensor")
    k = draw.choice((0, E + 1, 1.0, True)) if draw.rarely() else draw.integer(1, max(E, 1))
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= E:
        draw.mark_invalid(f"k = {k!r} for E = {E}")

    def expect(result):
        expected = np.array([sorted(range(E), key=lambda e: (-row[e], e))[:k] for row in probs.tolist()], dtype=np.int64).reshape(N, k)
        assert isinstance(result, np.ndarray) and result.dtype == np.int64, f"top_k_experts: {type(result).__name__} {getattr(result, 'dtype', None)}"
        np.testing.assert_array_equal(result, expected, err_msg="top_k_experts")

    run(draw, "top_k_experts", lambda: F.top_k_experts(argument, k), expect)


@fuzz("top_k_gates")
def _top_k_gates(draw):
    N, E, dtype = draw.integer(0, 3), draw.integer(1, 4), draw.float_dtype()
    k = draw.integer(1, 3)
    probs = Tensor(draw.layout(draw.rng.uniform(0.01, 1, (N, E)).astype(dtype)), requires_grad=draw.boolean())
    if draw.one_in(10) and N:
        kind = draw.choice(("zeros", "nan"))
        values = probs.numpy().copy()
        values[draw.integer(0, N - 1)] = 0.0 if kind == "zeros" else np.nan
        probs = Tensor(values, requires_grad=probs.requires_grad)
        draw.mark_invalid(f"a row of {kind}: the chosen probabilities do not add up to more than 0")
    elif draw.one_in(10):
        kind = draw.choice(("1-d", "int tensor", "array"))
        values = probs.numpy()
        probs = {"1-d": lambda: Tensor(values.reshape(-1)), "int tensor": lambda: Tensor(np.ones((N, E), np.int64)), "array": lambda: values}[kind]()
        draw.mark_invalid(f"probs: a {kind} where a 2-d float Tensor is needed")
    experts, ids = some_indices(draw, (N, k), E, "experts")
    ordered = np.sort(ids, axis=-1)
    if ids.ndim == 2 and np.any(ordered[:, 1:] == ordered[:, :-1]):
        draw.mark_invalid("experts: an expert chosen twice in a row")
    if draw.one_in(12):
        experts = ids = np.zeros((N + 1, k) if draw.boolean() else (N, 0), np.int64)
        draw.mark_invalid("experts not (N, k) with k >= 1")

    def expect(result):
        picked = np.take_along_axis(probs.numpy(), ids, axis=1)  # (N, k)
        assert_close("top_k_gates", result, picked / picked.sum(axis=1, keepdims=True))

    run(draw, "top_k_gates", lambda: F.top_k_gates(probs, experts), expect)


test_fuzz = fuzz_test(__name__)
