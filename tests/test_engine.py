"""The autograd engine: graph building, the backward walk, accumulation, modes and errors."""
import numpy as np
import pytest

import microtensor as mt
import microtensor.functional as F
from microtensor import Function


def leaf(values, dtype=np.float64):
    return mt.tensor(np.array(values, dtype=dtype), requires_grad=True)


def test_tensor_used_twice_gets_both_contributions():
    a = leaf([1.0, -2.0, 3.0])
    b = a + a  # db/da = 2
    c = b * b  # dc/db = 2b = 4a
    c.sum().backward()
    np.testing.assert_allclose(a.grad, 8 * a.data)


def test_diamond_graph_accumulates():
    x = leaf([0.5, 1.5])
    y = x.exp()
    z = y * x + y.log()  # dz/dx = e^x * x + e^x + 1
    z.backward(np.ones(2))
    np.testing.assert_allclose(x.grad, np.exp(x.data) * x.data + np.exp(x.data) + 1)


def test_ten_thousand_op_chain_needs_no_recursion():
    x = leaf([1.0])
    y = x
    for _ in range(10_000):
        y = y * 1.0001
    y.sum().backward()
    np.testing.assert_allclose(x.grad, [1.0001**10_000], rtol=1e-9)


def test_broadcasting_is_undone_in_backward():
    a = leaf(np.ones((3, 1)))
    b = leaf(np.arange(4.0))
    (a * b).backward(np.ones((3, 4)))
    assert a.grad.shape == (3, 1) and b.grad.shape == (4,)
    np.testing.assert_allclose(a.grad, np.full((3, 1), 6.0))
    np.testing.assert_allclose(b.grad, np.full(4, 3.0))


def test_unbroadcast_sums_leading_and_size_one_dims():
    grad = np.arange(24.0).reshape(2, 3, 4)
    np.testing.assert_allclose(mt.unbroadcast(grad, (3, 1)), grad.sum(axis=(0, 2)).reshape(3, 1))
    np.testing.assert_allclose(mt.unbroadcast(grad, (4,)), grad.sum(axis=(0, 1)))
    assert mt.unbroadcast(grad, (2, 3, 4)) is grad


def test_leaf_gradients_accumulate_across_backward_calls():
    x = leaf([2.0])
    (x * x).sum().backward()
    (x * 3.0).sum().backward()
    np.testing.assert_allclose(x.grad, [4.0 + 3.0])
    x.zero_grad()
    assert x.grad is None


def test_each_leaf_gets_a_gradient_array_of_its_own():
    """Add's backward hands the same array to both inputs, and broadcasting's backward can hand a
    read-only view: each leaf's .grad must still be its own writable array, so that scaling one
    (as gradient clipping does) or accumulating into it leaves every other gradient as it was."""
    a, b = mt.randn(3, 4, requires_grad=True), mt.randn(3, 4, requires_grad=True)
    upstream = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    (a + b).backward(mt.tensor(upstream))
    assert a.grad is not b.grad and not np.shares_memory(a.grad, b.grad)
    a.grad *= 2
    np.testing.assert_array_equal(b.grad, upstream)
    np.testing.assert_array_equal(a.grad, 2 * upstream)

    class ReadOnlyGradient(Function):  # passes on a read-only view of its upstream gradient
        @staticmethod
        def forward(ctx, x):
            return x.copy()

        @staticmethod
        def backward(ctx, grad_out):
            view = grad_out.view()
            view.flags.writeable = False
            return view

    x = mt.randn(3, 4, requires_grad=True)
    ReadOnlyGradient.apply(x).backward(mt.tensor(upstream))
    ReadOnlyGradient.apply(x).backward(mt.tensor(upstream))  # the second adds into the first
    assert x.grad.flags.writeable
    np.testing.assert_array_equal(x.grad, 2 * upstream)


def test_no_grad_records_nothing():
    x = leaf([1.0, 2.0])
    with mt.no_grad():
        y = x * 2
    assert not y.requires_grad and y._ctx is None
    z = x * 2
    assert z.requires_grad and z._ctx is not None

    @mt.no_grad()
    def double(t):
        return t * 2

    assert not double(x).requires_grad
    assert mt.is_grad_enabled()


class Recording(Function):
    """y = 2x, keeping its context where the test can see it."""

    last_ctx = None

    @staticmethod
    def forward(ctx, x):
        Recording.last_ctx = ctx
        ctx.save_for_backward(x)
        return 2 * x

    @staticmethod
    def backward(ctx, grad_out):
        return 2 * grad_out


def test_nothing_is_saved_when_no_input_needs_a_gradient():
    y = Recording.apply(mt.tensor(np.ones(2)))
    assert Recording.last_ctx.saved_tensors == ()
    assert y._ctx is None
    with mt.no_grad():
        Recording.apply(leaf([1.0]))
    assert Recording.last_ctx.saved_tensors == ()


def test_saved_arrays_are_freed_after_backward():
    y = Recording.apply(leaf([1.0]))
    ctx = y._ctx
    assert len(ctx.saved_tensors) == 1
    y.sum().backward()
    assert ctx.saved_tensors == () and ctx.freed


def test_second_backward_through_a_freed_graph_is_an_error():
    x = leaf([1.0, 2.0])
    y = (x.exp() * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="second time.*retain_graph=True"):
        y.backward()


def test_retain_graph_allows_a_second_backward():
    x = leaf([1.0, 2.0])
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad, 4 * x.data)


def test_non_scalar_backward_needs_a_gradient():
    y = leaf([1.0, 2.0]) * 2
    with pytest.raises(RuntimeError, match=r"non-scalar output of shape \(2,\)"):
        y.backward()
    with pytest.raises(ValueError, match="gradient has shape"):
        y.backward(np.ones(3))


def test_backward_on_a_tensor_without_grad_is_an_error():
    with pytest.raises(RuntimeError, match="does not require a gradient"):
        mt.tensor([1.0]).backward()


def test_retain_grad_keeps_a_non_leaf_gradient():
    x = leaf([1.0, 2.0])
    h = x * 3
    h.retain_grad()
    (h * h).sum().backward()
    np.testing.assert_allclose(h.grad, 2 * h.data)
    unretained = x * 3
    (unretained * 1).sum().backward()
    assert unretained.grad is None


def test_a_wrong_gradient_shape_names_the_function():
    class BadShape(Function):
        @staticmethod
        def forward(ctx, x):
            return x.sum(axis=0)

        @staticmethod
        def backward(ctx, grad_out):
            return grad_out  # forgot to broadcast back to the input's shape

    with pytest.raises(RuntimeError, match=r"BadShape.backward returned a gradient of shape \(3,\)"):
        BadShape.apply(leaf(np.ones((2, 3)))).sum().backward()


def test_a_promoted_gradient_dtype_names_the_function():
    class Promotes(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad_out):
            return grad_out * np.float64(2.0)  # a numpy float64 scalar promotes float32 to float64

    x = mt.tensor(np.ones(3, dtype=np.float32), requires_grad=True)
    with pytest.raises(RuntimeError, match="Promotes.backward.*float64.*float32"):
        Promotes.apply(x).sum().backward()


def test_detach_cuts_the_graph():
    x = leaf([1.0])
    y = (x * 2).detach()
    assert not y.requires_grad and y.is_leaf
    np.testing.assert_array_equal(y.numpy(), [2.0])


# ------------------------------------------------------------------------------ dtypes and errors


def test_dtype_defaults():
    assert mt.tensor([1.0, 2.0]).dtype == mt.float32
    assert mt.tensor([1, 2]).dtype == mt.int64
    assert mt.tensor(np.ones(2)).dtype == mt.float64
    assert mt.randn(2, 3).dtype == mt.float32
    assert mt.zeros(2, dtype=mt.float64).dtype == mt.float64
    assert mt.arange(5).dtype == mt.int64
    assert mt.arange(0.0, 1.0, 0.5).dtype == mt.float32


def test_float32_stays_float32_through_scalars():
    x = mt.randn(3, requires_grad=True)
    y = (x * 2.5 + 1.0) / 3.0 - 0.5
    y = y**2.0
    assert y.dtype == mt.float32
    y.sum().backward()
    assert x.grad.dtype == mt.float32


def test_seeded_generator_is_repeatable():
    mt.manual_seed(123)
    a = mt.randn(4).numpy().copy()
    mt.manual_seed(123)
    np.testing.assert_array_equal(a, mt.randn(4).numpy())


def test_mixed_float_dtypes_are_an_error():
    with pytest.raises(TypeError, match=r"add: inputs have different dtypes \(float32 \(2,\), float64 \(2,\)\)"):
        mt.ones(2) + mt.ones(2, dtype=mt.float64)


def test_integer_tensors_are_refused_by_float_ops():
    with pytest.raises(TypeError, match="exp: expected a float32 or float64 tensor, got int64"):
        mt.arange(3).exp()
    with pytest.raises(TypeError, match="only float"):
        mt.tensor([1, 2], requires_grad=True)


def test_shapes_that_do_not_broadcast_are_an_error():
    with pytest.raises(ValueError, match=r"mul: shapes \(2, 3\), \(2,\) cannot be broadcast"):
        mt.ones(2, 3) * mt.ones(2)


def test_item_and_bool():
    assert mt.tensor([3.5]).item() == 3.5
    with pytest.raises(ValueError, match="item"):
        mt.ones(2).item()
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(mt.ones(2))


def test_comparisons_give_boolean_tensors_outside_the_graph():
    x = leaf([1.0, 2.0, 3.0])
    mask = x > 1.5
    assert mask.dtype == mt.bool_ and not mask.requires_grad
    np.testing.assert_array_equal(mask.numpy(), [False, True, True])
    np.testing.assert_array_equal((x == 2.0).numpy(), [False, True, False])


def test_split_concat_stack_round_trip():
    x = leaf(np.arange(12.0).reshape(3, 4))
    a, b = x.split([1, 3], dim=1)
    assert a.shape == (3, 1) and b.shape == (3, 3)
    y = mt.concat([b, a], dim=1)
    np.testing.assert_array_equal(y.numpy()[:, 3], x.numpy()[:, 0])
    s = mt.stack([x, x], dim=0)
    assert s.shape == (2, 3, 4)
    (y.sum() + s.sum()).backward()
    np.testing.assert_array_equal(x.grad, np.full((3, 4), 3.0))


def test_repeated_indices_accumulate():
    x = leaf(np.arange(3.0))
    x[np.array([0, 0, 2, 0])].sum().backward()
    np.testing.assert_array_equal(x.grad, [3.0, 0.0, 1.0])


def test_masked_fill_and_where():
    x = leaf(np.arange(4.0))
    mask = np.array([True, False, True, False])
    y = x.masked_fill(mask, -1.0)
    np.testing.assert_array_equal(y.numpy(), [-1.0, 1.0, -1.0, 3.0])
    z = mt.where(mask, x, 10.0)
    np.testing.assert_array_equal(z.numpy(), [0.0, 10.0, 2.0, 10.0])
    (y.sum() + z.sum()).backward()
    np.testing.assert_array_equal(x.grad, [1.0, 1.0, 1.0, 1.0])
    with pytest.raises(TypeError, match="masked_fill: the mask must be boolean"):
        x.masked_fill(np.array([1, 0, 1, 0]), 0.0)
    with pytest.raises(ValueError, match="masked_fill: a mask of shape"):
        x.masked_fill(np.ones((2, 4), dtype=bool), 0.0)


def test_shape_errors_name_the_op():
    x = mt.ones(2, 3)
    with pytest.raises(ValueError, match=r"reshape: cannot reshape a tensor of shape \(2, 3\)"):
        x.reshape(4, 2)
    with pytest.raises(ValueError, match="permute"):
        x.permute(0, 0)
    with pytest.raises(IndexError, match="sum: dim 2 is out of range"):
        x.sum(dim=2)
    with pytest.raises(ValueError, match="concat: shapes"):
        mt.concat([x, mt.ones(3, 3)], dim=1)
    with pytest.raises(IndexError, match="getitem"):
        x[5]
    with pytest.raises(ValueError, match="split: sizes"):
        x.split([1, 1], dim=1)


def test_reshape_resolves_minus_one_and_flatten():
    x = mt.ones(2, 3, 4)
    assert x.reshape(-1, 4).shape == (6, 4)
    assert x.flatten().shape == (24,)
    assert x.flatten(1).shape == (2, 12)
    assert x.T.shape == (4, 3, 2)
    assert x.transpose(0, 2).shape == (4, 3, 2)


def test_max_splits_ties_evenly():
    x = leaf([[1.0, 3.0, 3.0], [0.0, -1.0, 2.0]])
    x.max(dim=1).backward(np.array([1.0, 1.0]))
    np.testing.assert_array_equal(x.grad, [[0.0, 0.5, 0.5], [0.0, 0.0, 1.0]])


def test_functional_and_methods_agree():
    x = mt.tensor(np.linspace(-1, 1, 6).reshape(2, 3))
    np.testing.assert_array_equal(F.sum(x, 1).numpy(), x.sum(dim=1).numpy())
    np.testing.assert_array_equal(F.relu(x).numpy(), x.relu().numpy())
