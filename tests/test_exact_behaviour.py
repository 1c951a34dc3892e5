"""Behaviour the other tests left open, pinned down exactly: each test here kills a mutant of
mutation/mutants.py (named in its docstring) that survived the rest of the suite, or that the rest
caught only by chance: for some hypothesis seeds, through a shape error, or in a test that needs
PyTorch and is skipped without it.

The gradients are checked against finite differences (gradcheck) and against an independent
statement of what they must be (each output element's gradient sent back, by explicit indexing,
to the input element it came from), never against the code under test."""
import numpy as np
import pytest

import microtensor as mt
import microtensor.functional as F
from microtensor import Function, gradcheck


def leaf(values, dtype=np.float64):
    return mt.tensor(np.asarray(values, dtype=dtype), requires_grad=True)


def upstream(shape, seed=0):
    """A gradient whose elements are all different, so that a gradient sent to the wrong place shows."""
    return np.random.default_rng(seed).permutation(int(np.prod(shape, dtype=np.int64))).reshape(shape) + 1.0


# --------------------------------------------------------------------------------- relu at its kink


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_gradient_at_exactly_zero_is_zero(dtype):
    """relu's derivative is 0 at x = 0 exactly (PyTorch's convention), 1 above and 0 below, through
    F.relu and Tensor.relu. Kills relu.backward_at_zero: the gradient check keeps its inputs away
    from the kink, where > 0 and >= 0 agree."""
    values = [-2.0, -0.0, 0.0, 1e-30, 3.0]
    expected = np.array([0.0, 0.0, 0.0, 1.0, 1.0]) * np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    for relu in (F.relu, lambda t: t.relu()):
        x = leaf(values, dtype)
        relu(x).backward(np.array([1.0, 2.0, 3.0, 4.0, 5.0], dtype=dtype))
        assert x.grad.dtype == dtype
        np.testing.assert_array_equal(x.grad, expected.astype(dtype))


# --------------------------------------------------------------------------------- reductions


REDUCTION_DIMS = [None, 0, 1, -1, (0, 1), (0, -1)]


@pytest.mark.parametrize("shape", [(3, 3), (2, 3, 4)])
@pytest.mark.parametrize("dim", REDUCTION_DIMS, ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
def test_sum_mean_and_max_send_each_gradient_back_to_the_elements_it_came_from(shape, dim, keepdim):
    """For every dim (one, several, all) and keepdim: input element i gets the gradient of the
    output element it was reduced into (g for sum, g / n for mean, g at the maximum for max), found
    by explicit indexing. A square input tells a gradient broadcast along the wrong axis from the
    right one (the shapes agree); the registered checks draw a dim and keepdim per example, so a
    fixed seed may never reduce a leading dim without keepdim. Kills sum.backward_keeps_dims."""
    x_values = np.random.default_rng(2).permutation(int(np.prod(shape))).reshape(shape) / 7.0  # distinct: one max
    axes = range(len(shape)) if dim is None else [d % len(shape) for d in (dim if isinstance(dim, tuple) else (dim,))]
    count = int(np.prod([shape[a] for a in axes]))
    for op in ("sum", "mean", "max"):
        x = mt.tensor(x_values, requires_grad=True)
        out = getattr(F, op)(x, dim, keepdim)
        g = upstream(out.shape)
        out.backward(g)
        expected = np.zeros(shape)
        for i in np.ndindex(shape):
            o = tuple(0 if a in axes else i[a] for a in range(len(shape))) if keepdim else tuple(i[a] for a in range(len(shape)) if a not in axes)
            if op == "sum":
                expected[i] = g[o]
            elif op == "mean":
                expected[i] = g[o] / count
            else:
                group = tuple(slice(None) if a in axes else i[a] for a in range(len(shape)))
                expected[i] = g[o] if x_values[i] == x_values[group].max() else 0.0
        np.testing.assert_allclose(x.grad, expected, rtol=1e-15, err_msg=f"{op} over {dim}, keepdim={keepdim}")


# --------------------------------------------------------------------------------- shape ops


def expected_permute_gradient(grad_out, dims):
    """dL/dx for y = permute(x, dims): y[o] = x[i] with i[dims[k]] = o[k], so dL/dx[i] = g[o]."""
    grad = np.zeros(tuple(grad_out.shape[dims.index(d)] for d in range(len(dims))))
    for o in np.ndindex(grad_out.shape):
        i = [0] * len(dims)
        for k, d in enumerate(dims):
            i[d] = o[k]
        grad[tuple(i)] = grad_out[o]
    return grad


@pytest.mark.parametrize("dims", [(1, 2, 0), (2, 0, 1), (1, 3, 0, 2), (3, 2, 0, 1)])
def test_permute_gradient_for_permutations_that_are_not_their_own_inverse(dims):
    """permute's backward applies the inverse permutation. Only a permutation that is not its own
    inverse (a 3-cycle, say) tells the inverse from the permutation itself; the registered gradient
    check draws only transpositions and reversals. Kills permute.backward_inverse."""
    shape = (2, 3, 4, 5)[: len(dims)]
    x = mt.tensor(np.random.default_rng(1).standard_normal(shape), requires_grad=True)
    g = upstream(tuple(shape[d] for d in dims))
    F.permute(x, dims).backward(g)
    np.testing.assert_array_equal(x.grad, expected_permute_gradient(g, list(dims)))
    x.grad = None
    assert gradcheck(lambda x: x.permute(*dims), [x])


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_concat_sends_each_input_its_own_slice(dim):
    """concat's backward gives input i the slice of the gradient that x_i filled, in order. With
    inputs of equal shapes a mix-up of the slices keeps every shape right, so only the values can
    show it: the registered check concatenates [a, b, a], whose order reversed is the same, and the
    other tests see the order only through pieces of different sizes, where a mix-up is a shape
    error. Kills concat.backward_order by its values."""
    a, b, c = (mt.tensor(np.random.default_rng(s).standard_normal((2, 3)), requires_grad=True) for s in range(3))
    out = F.concat([a, b, c], dim)
    g = upstream(out.shape)
    out.backward(g)
    axis = dim % 2
    for index, t in enumerate((a, b, c)):
        expected = np.take(g, range(index * t.shape[axis], (index + 1) * t.shape[axis]), axis=axis)
        np.testing.assert_array_equal(t.grad, expected)
    assert gradcheck(lambda a, b: F.concat([a, b], dim), [a, b])


@pytest.mark.parametrize("shape", [(), (3,), (2, 3), (2, 3, 4)])
def test_stack_gradient_at_every_dim(shape):
    """stack's backward gives input i the slice g[..., i, ...] at the stacking dim, for every dim
    of every rank, with three inputs so that no slice count matches a size by chance. The
    registered check draws one dim per example and often the last one, where a split along the
    last dim is right by accident. Kills stack.backward_dim."""
    for dim in range(-len(shape) - 1, len(shape) + 1):
        inputs = [mt.tensor(np.random.default_rng(s).standard_normal(shape), requires_grad=True) for s in range(3)]
        out = F.stack(inputs, dim)
        g = upstream(out.shape, seed=len(shape))
        out.backward(g)
        for index, t in enumerate(inputs):
            np.testing.assert_array_equal(t.grad, np.take(g, index, axis=dim % out.ndim), err_msg=f"dim {dim}, input {index}")
        assert gradcheck(lambda a, b, dim=dim: F.stack([a, b], dim), inputs[:2])


# --------------------------------------------------------------------------------- gradcheck itself


def scaled_by_three(backward):
    """The op y = 3 x, with the given backward(grad_out, x) -> grad_x."""

    class Scale(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return 3 * x

        @staticmethod
        def backward(ctx, grad_out):
            (x,) = ctx.saved_tensors
            return backward(grad_out, x)

    return Scale.apply


@pytest.mark.parametrize("factor, passes", [(0.5, True), (0.9, True), (1.2, False), (1.9, False)])
def test_gradcheck_tolerance_is_exactly_atol_plus_rtol_times_numeric(factor, passes):
    """An element fails when |analytic - numeric| > atol + rtol |numeric|, no sooner and no later:
    an error of `factor` times the allowed one passes below 1 and fails above, once through atol
    alone (a constant added to the gradient) and once through rtol alone (the gradient scaled by
    1 + factor * rtol). Kills gradcheck.tolerance_doubled."""
    x = leaf(np.linspace(-1.0, 1.0, 12).reshape(3, 4))
    atol, rtol = 1e-4, 1e-3
    through_atol = scaled_by_three(lambda g, x: 3 * g + factor * atol)
    through_rtol = scaled_by_three(lambda g, x: 3 * g * (1 + factor * rtol))
    for fn, options in ((through_atol, {"atol": atol, "rtol": 1e-12}), (through_rtol, {"atol": 1e-12, "rtol": rtol})):
        assert gradcheck(fn, [x], raise_exception=False, **options) is passes
