"""The autograd engine: graph building, the backward walk, accumulation, modes and errors."""
import re

import numba
import numpy as np
import pytest

import microtensor as mt
import microtensor.functional as F
from microtensor import Function

pytestmark = pytest.mark.all_threads  # parallel loops run split across threads here (conftest.py)


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


def test_mixed_dtypes_beside_a_non_tensor_name_the_non_tensor():
    # the dtype message describes every input, so a list after a float64 must be refused first, by name
    pair = mt.ones(2), mt.ones(2, dtype=mt.float64)
    with pytest.raises(mt.InputTypeError, match="dpo_loss: expected a Tensor, got list of length 2"):
        F.dpo_loss(*pair, [0.0, 0.0], mt.ones(2), 0.1)


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
    with pytest.raises(mt.InputError, match="ambiguous"):  # a ValueError, as in numpy
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


@pytest.mark.parametrize("kernels", ["readable", "fast"])
def test_max_of_a_nan_is_the_nan_and_it_takes_the_gradient(kernels, recwarn):
    """np.max propagates NaN, so a NaN is its group's max: it takes the gradient (split evenly
    between several NaNs), as in PyTorch, and no numpy warning escapes."""
    if kernels == "fast" and numba.config.DISABLE_JIT:
        pytest.skip("the fast kernels need Numba's compiler")
    with mt.using_kernels(kernels):
        x = leaf([[1.0, np.nan, 2.0], [np.nan, 0.0, np.nan], [3.0, 1.0, 3.0]])
        y = x.max(dim=1)
        y.backward(np.array([1.0, 2.0, 4.0]))
        z = leaf([1.0, np.nan])
        F.max(z).backward()
    np.testing.assert_array_equal(y.data, [np.nan, np.nan, 3.0])
    np.testing.assert_array_equal(x.grad, [[0.0, 1.0, 0.0], [1.0, 0.0, 1.0], [2.0, 0.0, 2.0]])
    np.testing.assert_array_equal(z.grad, [0.0, 1.0])
    assert not recwarn.list, [str(w.message) for w in recwarn.list]


def test_functional_and_methods_agree():
    x = mt.tensor(np.linspace(-1, 1, 6).reshape(2, 3))
    np.testing.assert_array_equal(F.sum(x, 1).numpy(), x.sum(dim=1).numpy())
    np.testing.assert_array_equal(F.relu(x).numpy(), x.relu().numpy())


# ------------------------------------------------------------------------------ the version counter


def test_an_input_changed_in_place_after_forward_is_an_error_at_backward():
    x = leaf([1.0, 2.0, 3.0])
    y = (x * x).sum()  # Mul saves x's array for backward
    x.data -= 1.0  # the same array, changed and assigned back: counted
    with pytest.raises(mt.GraphError, match=r"input 0 of Mul .* was modified in place after forward \(its version went from 0 to 1\)"):
        y.backward()


def test_an_optimizer_style_bump_is_seen_and_an_unsaved_input_may_change():
    w = leaf(np.ones((3, 2)))
    x = leaf(np.arange(6.0).reshape(2, 3))
    loss = (x @ w).sum()
    w.data[...] = 0.5  # a write through the array is not seen by itself ...
    w._bump_version()  # ... an optimizer's step reports it
    with pytest.raises(mt.GraphError, match="input 1 of MatMul"):
        loss.backward()
    a = leaf([1.0, 2.0])
    y = (a + 1.0).sum()  # Add keeps nothing: its gradient does not depend on a's values
    a.data *= 3
    y.backward()
    np.testing.assert_array_equal(a.grad, [1.0, 1.0])


def test_an_op_output_changed_in_place_is_an_error_and_a_replaced_array_is_not():
    x = leaf([0.5, 1.0])
    y = x.exp()  # Exp saves its output
    z = (y + 2.0).sum()  # Add saves nothing
    y.data += 1.0
    with pytest.raises(mt.GraphError, match="the output of Exp .* was modified in place"):
        z.backward()
    x = leaf([0.5, 1.0])
    y = (x * x).sum()
    x.data = np.array([7.0, 7.0])  # a new array: the saved one still holds the forward's values
    y.backward()
    np.testing.assert_array_equal(x.grad, [1.0, 2.0])


def test_layer_norm_names_itself_when_its_input_changed():
    x = leaf(np.arange(12.0).reshape(3, 4))
    y = F.layer_norm(x)
    x.data += 1
    with pytest.raises(mt.GraphError, match=r"^backward: input 0 of LayerNorm"):
        y.backward(np.ones((3, 4)))


def test_views_share_the_version_counter():
    x = leaf(np.arange(6.0))
    rows = x.reshape(2, 3)  # a view of x's memory
    w = leaf(np.ones((3, 2)))
    y = (rows @ w).sum()  # MatMul saves the view's array, not x's
    x.data *= 2  # changes the view's values too
    with pytest.raises(mt.GraphError, match="input 0 of MatMul"):
        y.backward()
    x = leaf(np.arange(6.0))
    y = (x * x).sum()
    x[2:].detach().data += 1.0  # through a slice, detached: still x's memory
    with pytest.raises(mt.GraphError, match="input 0 of Mul"):
        y.backward()
    x = leaf(np.arange(6.0).reshape(2, 3))
    y = (x.T * 1.0).sum()  # Mul saves the transposed view; a copy made by a reshape is not a view:
    copy = x.T.reshape(6)  # (the transpose's values in another order need a copy)
    copy.data += 1.0
    y.backward()
    np.testing.assert_array_equal(x.grad, np.ones((2, 3)))


def test_a_write_through_the_array_alone_is_not_seen_as_documented():
    """The documented limit (tensor.py's module docstring): numpy writes through `.data[...]` do not
    pass through microtensor, so only the assignment forms and _bump_version are counted."""
    x = leaf([1.0, 2.0])
    y = (x * x).sum()
    x.data[0] = 5.0
    assert x._version == 0
    y.backward()  # silently computed at the new values: the limit the docstring states
    np.testing.assert_array_equal(x.grad, [10.0, 4.0])


def test_data_assignment_is_checked():
    x = leaf([1.0])
    with pytest.raises(mt.InputTypeError, match="Tensor.data: expected a numpy array, got list"):
        x.data = [1.0]
    with pytest.raises(mt.InputTypeError, match="requires a gradient, so its values must be float32 or float64, got int64"):
        x.data = np.array([1])
    with pytest.raises(mt.InputTypeError, match="complex128 is not supported"):
        x.data = np.array([1j])


# ------------------------------------------------------------------------------ numpy interop


def test_numpy_operators_hand_over_to_the_tensor():
    t = leaf([1.0, 2.0, 3.0])
    for result, expected in [
        (np.ones(3) + t, [2.0, 3.0, 4.0]),
        (np.ones(3) - t, [0.0, -1.0, -2.0]),
        (np.full(3, 2.0) * t, [2.0, 4.0, 6.0]),
        (np.ones(3) / t, [1.0, 0.5, 1 / 3]),
        (np.float64(2.0) ** t, [2.0, 4.0, 8.0]),
        (np.arange(3) + t, [1.0, 3.0, 5.0]),  # integers take the tensor's dtype
    ]:
        assert isinstance(result, mt.Tensor) and result.dtype == mt.float64
        np.testing.assert_allclose(result.numpy(), expected)
    (np.ones(3) * t).sum().backward()
    np.testing.assert_array_equal(t.grad, np.ones(3))
    assert isinstance(np.ones((2, 3)) @ t, mt.Tensor)
    np.testing.assert_array_equal((np.ones(3) < t).numpy(), [False, True, True])
    with pytest.raises(mt.InputTypeError, match="add: inputs have different dtypes"):
        np.ones(3, dtype=np.float32) + t
    with pytest.raises(TypeError, match="does not support ufuncs"):
        np.exp(t)  # numpy's own refusal: t.exp() or F.exp is the op


def test_asarray_gives_the_values():
    t = mt.tensor(np.arange(4.0))
    assert np.asarray(t) is t.data
    assert np.array(t) is not t.data and np.array_equal(np.array(t), t.data)
    assert np.asarray(t, dtype=np.float32).dtype == np.float32
    assert np.concatenate([t, t]).shape == (8,)
    assert mt.tensor([t, t]).shape == (2, 4)


# ------------------------------------------------------------------------------ constructors


def test_conversions_that_would_change_a_value_are_refused():
    with pytest.raises(mt.InputTypeError, match="refusing to convert float64 values to int64"):
        mt.tensor([1.5], dtype=mt.int64)
    with pytest.raises(mt.InputTypeError, match="refusing to convert float32 values to int64"):
        mt.tensor(np.array([1.0], np.float32), dtype="int64")
    with pytest.raises(mt.InputError, match="values from 0 to 300 do not fit in int8"):
        mt.tensor([0, 300], dtype=np.int8)
    with pytest.raises(mt.InputTypeError, match="to bool"):
        mt.tensor([0, 1], dtype=mt.bool_)
    with pytest.raises(mt.InputError, match="too large for float32"):
        mt.tensor(np.array([1e300]), dtype=mt.float32)
    assert mt.tensor([1, 2], dtype=mt.float32).dtype == mt.float32
    assert mt.tensor([True, False]).dtype == mt.bool_
    assert mt.tensor(np.array([np.inf]), dtype=mt.float32).data[0] == np.inf  # inf stays inf


@pytest.mark.parametrize(
    "data, message",
    [
        ([1j], "complex numbers"),
        (["a"], "strings"),
        ([None], "Python objects"),
        ([2**70], "too large for 64 bits"),
        ([[1.0], [1.0, 2.0]], "inhomogeneous"),
        (np.ones(2, np.float16), "unsupported float dtype float16"),
    ],
)
def test_values_that_are_not_numbers_are_refused(data, message):
    with pytest.raises(mt.MicrotensorError, match=message):
        mt.tensor(data)


def test_constructors_check_shapes_dtypes_and_options():
    with pytest.raises(mt.InputError, match=r"zeros: sizes must be >= 0, got -1 in \(2, -1\)"):
        mt.zeros(2, -1)
    with pytest.raises(mt.InputTypeError, match=r"ones: sizes must be ints, got 2.5"):
        mt.ones(2.5)
    with pytest.raises(mt.InputTypeError, match="randn: sizes must be ints, got True"):
        mt.randn(True)
    with pytest.raises(mt.InputTypeError, match="zeros: dtype int64 is not supported; expected float32 or float64"):
        mt.zeros(2, dtype=mt.int64)
    with pytest.raises(mt.InputTypeError, match="rand: 'floaty' is not a dtype"):
        mt.rand(2, dtype="floaty")
    with pytest.raises(mt.AllocationError, match=r"^zeros: cannot allocate a tensor of shape \(10000000000, 10000000000\) and dtype float32"):
        mt.zeros(10**10, 10**10)
    with pytest.raises(mt.InputTypeError, match="generator must be a numpy Generator"):
        mt.randn(2, generator=0)
    with pytest.raises(mt.InputTypeError, match="requires_grad must be True or False"):
        mt.zeros(2, requires_grad="yes")
    with pytest.raises(mt.InputError, match="arange: step must not be 0"):
        mt.arange(0, 5, 0)
    with pytest.raises(mt.InputTypeError, match="arange: int64 values need int start"):
        mt.arange(0.5, 3.0, dtype=mt.int64)
    with pytest.raises(mt.InputError, match="arange: stop must be finite"):
        mt.arange(float("inf"))
    with pytest.raises(mt.InputTypeError, match="zeros_like: expected a Tensor, got list"):
        mt.zeros_like([1.0])
    with pytest.raises(mt.InputTypeError, match="set_default_dtype: dtype int64 is not supported"):
        mt.set_default_dtype(mt.int64)
    assert mt.zeros(0, 3).shape == (0, 3) and mt.zeros((2, 1)).shape == (2, 1) and mt.ones([]).shape == ()
    assert mt.zeros_like(mt.arange(3)).dtype == mt.int64


# ------------------------------------------------------------------------------ errors of the ops


def test_every_error_is_a_microtensor_error_that_names_the_op():
    x = mt.randn(2, 6)
    cases = [
        (lambda: F.gelu([1.0]), mt.InputTypeError, r"^gelu: expected a Tensor, got list of length 1"),
        (lambda: F.multi_head_attention(mt.randn(1, 2, 6), 0), mt.InputError, r"^multi_head_attention: n_head must be >= 1, got 0"),
        (lambda: F.multi_head_attention(mt.randn(1, 2, 6), 4), mt.InputError, r"C >= 1 divisible by n_head \(4\)"),
        (lambda: F.dropout(x, float("nan")), mt.InputError, r"^dropout: p must be in \[0, 1\), got nan"),
        (lambda: F.dropout(x, 0.5, training="yes"), mt.InputTypeError, "training must be True or False"),
        (lambda: F.layer_norm(x, eps=0.0), mt.InputError, r"^layer_norm: eps must be > 0 and finite, got 0.0"),
        (lambda: F.rms_norm(x, eps=float("inf")), mt.InputError, r"^rms_norm: eps must be > 0 and finite"),
        (lambda: F.layer_norm(x, weight=[1.0] * 6), mt.InputTypeError, r"^layer_norm: weight must be a Tensor"),
        (lambda: F.embedding(mt.tensor([0, 7]), x), mt.InputIndexError, r"^embedding: id 7 is out of range"),
        (lambda: F.embedding([0.5], x), mt.InputTypeError, "ids must be an integer tensor"),
        (lambda: F.rope(mt.randn(2, 4), 1.5), mt.InputTypeError, r"^rope: offset must be an int, got 1.5"),
        (lambda: F.softmax(x, dim=2), mt.InputIndexError, r"^softmax: dim 2 is out of range"),
        (lambda: x.sum(dim=1.0), mt.InputTypeError, r"^sum: dim must be an int, got 1.0"),
        (lambda: x.sum(keepdim=1), mt.InputTypeError, "keepdim must be True or False"),
        (lambda: x.reshape(3, 4.0), mt.InputTypeError, r"^reshape: sizes must be ints, got 4.0"),
        (lambda: x.flatten(1, 0), mt.InputError, "start_dim 1 comes after end_dim 0"),
        (lambda: x[0.5], mt.InputIndexError, r"^getitem: index 0.5 is invalid"),
        (lambda: mt.stack(x), mt.InputTypeError, r"^stack: expected a list or tuple of Tensors, got Tensor"),
        (lambda: mt.concat([]), mt.InputError, "non-empty list"),
        (lambda: x.split(2.0, dim=1), mt.InputTypeError, "split: expected a piece size"),
        (lambda: x.masked_fill(x > 0, "a"), mt.InputTypeError, "masked_fill: value must be a number"),
        (lambda: x + "a", mt.InputTypeError, r"^add: expected a Tensor, a numpy array or a Python number, got str"),
        (lambda: x < "a", mt.InputTypeError, "cannot compare a Tensor with str"),
        (lambda: x @ 2.0, mt.InputTypeError, "matmul: expected two Tensors"),
        (lambda: x.to(mt.int64), mt.InputTypeError, "cast: dtype int64 is not supported"),
        (lambda: x.argmax(dim=5), mt.InputIndexError, "argmax: dim 5 is out of range"),
        (lambda: mt.zeros(0).argmax(), mt.InputError, "argmax: no largest value in an empty tensor"),
        (lambda: mt.zeros(0).max(), mt.InputError, r"^max: the empty tensor of shape \(0,\) holds no elements"),
        (lambda: len(mt.tensor(1.0)), mt.InputTypeError, "len\\(\\) of a 0-d tensor"),
        (lambda: x.backward(), mt.GraphError, "does not require a gradient"),
        (lambda: mt.randn(2, requires_grad=True).backward([1.0, 2.0]), mt.InputTypeError, "the gradient must be a Tensor or a numpy array"),
    ]
    for call, kind, message in cases:
        with pytest.raises(kind, match=message):
            call()


def test_zero_size_operands_work():
    a, b = leaf(np.ones((3, 0))), leaf(np.ones((0, 4)))
    c = a @ b  # a sum of no terms: zeros
    np.testing.assert_array_equal(c.numpy(), np.zeros((3, 4)))
    c.backward(np.ones((3, 4)))
    assert a.grad.shape == (3, 0) and b.grad.shape == (0, 4)
    assert (leaf(np.ones((2, 3))) @ leaf(np.ones((3, 0)))).shape == (2, 0)
    assert mt.zeros(0).sum().item() == 0.0
    assert mt.zeros(2, 0).sum(dim=1).shape == (2,) and mt.zeros(0, 3).mean(dim=1).shape == (0,)
    assert F.softmax(mt.zeros(0, 5), dim=-1).shape == (0, 5)
    x = leaf(np.ones((4, 0)))
    y = F.layer_norm(x, mt.tensor(np.ones(0), requires_grad=True), mt.tensor(np.zeros(0)))
    assert y.shape == (4, 0)  # an empty last dim: an empty result (documented in layer_norm)
    y.backward(np.ones((4, 0)))
    assert x.grad.shape == (4, 0)
    assert F.rms_norm(mt.zeros(0, 3)).shape == (0, 3)
    assert F.multi_head_attention(mt.zeros(2, 0, 6), 2).shape == (2, 0, 2)


# ------------------------------------------------------------------------------ fork()

FORK_SCRIPT = """
import multiprocessing, sys
import numpy as np
import numba
import microtensor as mt
import microtensor.functional as F

def work(seed):
    x = mt.tensor(np.random.default_rng(seed).standard_normal((4, 8)))
    with mt.using_kernels("readable"):  # the readable softmax is a parallel kernel
        return round(F.softmax(x, dim=-1).sum().item(), 6)

if __name__ == "__main__":
    work(0)  # a parallel kernel runs in the parent before the fork
    print("gnu openmp started:", mt.autograd.gnu_openmp_started(), flush=True)
    with multiprocessing.get_context("fork").Pool(2) as pool:
        try:
            print("results:", pool.map(work, [1, 2]), flush=True)
        except mt.ThreadingError as error:
            print("ThreadingError:", error, flush=True)
"""


@pytest.mark.parametrize("layer", [None, "workqueue"], ids=["default-layer", "workqueue"])
def test_a_forked_pool_after_a_parallel_kernel_answers_and_never_hangs(tmp_path, layer):
    """With GNU OpenMP (Numba's default layer on Linux) a forked child that ran a parallel kernel
    would be killed and the pool would wait for it forever: the child raises ThreadingError instead,
    which the pool hands to the parent. With a layer that survives fork, the pool just works."""
    import os
    import subprocess
    import sys

    script = tmp_path / "fork_after_kernel.py"
    script.write_text(FORK_SCRIPT)
    env = dict(os.environ)
    env.pop("NUMBA_THREADING_LAYER", None)
    if layer:
        env["NUMBA_THREADING_LAYER"] = layer
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    if "gnu openmp started: True" in result.stdout:
        assert "ThreadingError: microtensor cannot run its parallel kernels in this process" in result.stdout
        assert "'spawn'" in result.stdout and "NUMBA_THREADING_LAYER=workqueue" in result.stdout
    else:
        assert "results: [4.0, 4.0]" in result.stdout, result.stdout + result.stderr
    if layer == "workqueue":
        assert "gnu openmp started: False" in result.stdout


# ------------------------------------------------------------------ values and gradients set by hand


def test_one_no_grad_object_entered_inside_itself_restores_the_mode_on_leaving():
    no_grad = mt.no_grad()
    with no_grad:
        with no_grad:
            assert not mt.is_grad_enabled()
        assert not mt.is_grad_enabled()
    assert mt.is_grad_enabled()


def test_load_state_dict_between_forward_and_backward_is_refused_like_an_optimizer_step():
    linear = mt.nn.Linear(3, 2, dtype=mt.float64)
    loss = linear(leaf([[1.0, 2.0, 3.0]])).sum()
    linear.load_state_dict({"weight": np.zeros((3, 2)), "bias": np.zeros(2)})
    with pytest.raises(mt.GraphError, match="input 1 of MatMul .* was modified in place after forward"):
        loss.backward()


def test_values_replaced_with_another_shape_after_forward_are_named_not_the_op():
    x = leaf([1.0, 2.0, 3.0])
    y = (x * 2).sum()
    x.data = np.zeros(5)
    with pytest.raises(mt.GraphError, match=r"input 0 of Mul had shape \(3,\) and dtype float64 when the forward ran, and now has shape \(5,\)"):
        y.backward()


def test_module_cast_after_forward_is_named_not_the_op():
    linear = mt.nn.Linear(3, 2, dtype=mt.float64)
    y = linear(mt.ones(1, 3, dtype=mt.float64)).sum()
    linear.to(mt.float32)
    with pytest.raises(mt.GraphError, match=r"dtype float64 when the forward ran, and now has shape \(\d+,?\d*\) and dtype float32"):
        y.backward()


@pytest.mark.parametrize(
    "held",
    [np.zeros(2), np.zeros((1, 3)), np.zeros(3, dtype=np.float32), mt.zeros(3, dtype=mt.float64)],
    ids=["shape", "broadcastable shape", "dtype", "a Tensor"],
)
def test_a_grad_set_by_hand_that_cannot_hold_the_gradient_is_refused(held):
    x = leaf([1.0, 2.0, 3.0])
    x.grad = held
    with pytest.raises(mt.GraphError, match=r"holds a \.grad that is a .*; expected None or a numpy array of the tensor's shape and dtype"):
        (x * 2).sum().backward()


def test_a_grad_set_by_hand_of_the_right_kind_is_added_to():
    x = leaf([1.0, 2.0, 3.0])
    x.grad = np.ones(3)
    (x * 2).sum().backward()
    np.testing.assert_array_equal(x.grad, [3.0, 3.0, 3.0])


def test_a_number_is_the_gradient_of_any_one_element_output():
    x = leaf([2.0])
    (x * 3).backward(0.5)
    np.testing.assert_array_equal(x.grad, [1.5])
    with pytest.raises(mt.InputError, match=r"a number is a gradient only for a one-element output; this output has shape \(2,\)"):
        (leaf([1.0, 2.0]) * 3).backward(1.0)


def test_float_int_and_format_take_the_value_of_a_one_element_tensor():
    loss = mt.tensor(1.23456, dtype=mt.float64)
    assert f"{loss:.3f}" == "1.235"
    assert float(loss) == 1.23456
    assert int(mt.tensor([7])) == 7
    assert f"{mt.ones(2)}" == str(mt.ones(2))
    for convert in (float, int, lambda t: f"{t:.2f}"):
        with pytest.raises(mt.InputError, match=r"the tensor has 2 elements \(shape \(2,\)\), expected 1"):
            convert(mt.ones(2))


# ------------------------------------------------------------------------------ impossible sizes

HUGE = 10**6  # a (HUGE, HUGE) float32 array is 3.6 TiB: no computer that runs these tests has it


@pytest.mark.parametrize(
    "name, call, op",
    [
        ("matmul", lambda: mt.zeros(HUGE, 1) @ mt.zeros(1, HUGE), "MatMul"),
        ("embedding", lambda: F.embedding(mt.tensor(np.zeros(HUGE, dtype=np.int64)), mt.zeros(2, 10 * HUGE)), "Embedding"),
        ("attention", lambda: F.scaled_dot_product_attention(*[mt.zeros(1, 1, HUGE, 1)] * 3), "ScaledDotProductAttention"),
        ("scatter_add_rows", lambda: F.scatter_add_rows(mt.zeros(1, HUGE), np.array([0]), 10 * HUGE), "ScatterAddRows"),
        ("softmax_jacobian", lambda: F.softmax_jacobian(mt.zeros(HUGE)), "softmax_jacobian"),
        ("Linear", lambda: mt.nn.Linear(HUGE, HUGE), "Linear"),
        ("Embedding", lambda: mt.nn.Embedding(10 * HUGE, HUGE), "Embedding"),
        ("Linear beyond any address", lambda: mt.nn.Linear(10**10, 10**10), "Linear"),
    ],
)
def test_an_impossible_size_is_an_allocation_error_naming_the_op(name, call, op):
    """numpy's MemoryError (or its ValueError for a size beyond any address) becomes an
    AllocationError (an InputError and a MemoryError) that names the op and numpy's shape and dtype."""
    with pytest.raises(mt.AllocationError, match=rf"^{op}\b.*cannot allocate .*(shape \(|too big)") as caught:
        call()
    assert isinstance(caught.value, mt.InputError) and isinstance(caught.value, MemoryError)


def test_an_allocation_refused_in_a_backward_names_the_op():
    class Greedy(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad_out):
            return np.empty((HUGE, HUGE), dtype=grad_out.dtype)

    x = leaf([1.0, 2.0])
    with pytest.raises(mt.AllocationError, match=r"^Greedy \(backward\): cannot allocate its arrays for inputs of shape and dtype \(2,\) float64"):
        Greedy.apply(x).sum().backward()


def test_an_error_of_a_forward_that_is_not_about_size_passes_unchanged():
    class Picky(Function):
        @staticmethod
        def forward(ctx, x):
            raise ValueError("not this one")

    with pytest.raises(ValueError, match="^not this one$") as caught:
        Picky.apply(leaf([1.0]))
    assert not isinstance(caught.value, mt.MicrotensorError)


# ------------------------------------------------------------------------------ seeds


@pytest.mark.parametrize("seed, error, message", [
    (-1, mt.InputError, "manual_seed: seed must be >= 0, got -1"),
    ("abc", mt.InputTypeError, "manual_seed: seed must be an int, got 'abc' (str)"),
    (1.5, mt.InputTypeError, "manual_seed: seed must be an int, got 1.5 (float)"),
    (True, mt.InputTypeError, "manual_seed: seed must be an int, got True (bool)"),
])
def test_manual_seed_refuses_what_is_not_a_seed(seed, error, message):
    with pytest.raises(error, match="^" + re.escape(message) + "$"):
        mt.manual_seed(seed)
    assert mt.manual_seed(np.int64(7)).random() == np.random.default_rng(7).random()
