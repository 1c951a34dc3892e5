"""The gradient checker itself: it passes correct backwards and reports wrong ones."""
import numpy as np
import pytest

import microtensor as mt
from microtensor import Function, GradcheckError, gradcheck


def make_function(backward):
    """An op y = softmax(x @ w) over the last dim, whose backward is the given function."""

    class Candidate(Function):
        @staticmethod
        def forward(ctx, x, w):
            scores = x @ w
            e = np.exp(scores - scores.max(axis=-1, keepdims=True))
            y = e / e.sum(axis=-1, keepdims=True)
            ctx.save_for_backward(x, w, y)
            return y

        @staticmethod
        def backward(ctx, grad_out):
            return backward(ctx, grad_out)

    return Candidate


def correct_backward(ctx, g):
    x, w, y = ctx.saved_tensors
    d_scores = y * (g - (g * y).sum(axis=-1, keepdims=True))  # (N, M)
    return d_scores @ w.T, x.T @ d_scores


def zeros_backward(ctx, g):
    x, w, _ = ctx.saved_tensors
    return np.zeros_like(x), np.zeros_like(w)


def transposed_backward(ctx, g):
    # a classic slip: dW transposed (w is square here, so the shape check cannot catch it)
    x, w, y = ctx.saved_tensors
    d_scores = y * (g - (g * y).sum(axis=-1, keepdims=True))
    return d_scores @ w.T, (x.T @ d_scores).T


def missing_term_backward(ctx, g):
    # softmax backward without the "- sum(g * y)" term: right on the diagonal, wrong off it
    x, w, y = ctx.saved_tensors
    d_scores = y * g
    return d_scores @ w.T, x.T @ d_scores


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    x = mt.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    w = mt.tensor(rng.standard_normal((4, 4)), requires_grad=True)
    return x, w


def test_correct_backward_passes():
    assert gradcheck(make_function(correct_backward).apply, inputs())


@pytest.mark.parametrize("backward", [zeros_backward, transposed_backward, missing_term_backward])
def test_wrong_backward_is_reported(backward):
    with pytest.raises(GradcheckError, match=r"gradcheck failed for input \d \(shape \(\d, \d\)\): at index"):
        gradcheck(make_function(backward).apply, inputs())


def test_zeros_backward_of_softmax_would_pass_a_sum_check():
    # Why the upstream gradient is random: softmax rows sum to 1, so sum(out) is constant and its
    # gradient is zero; a zero backward "passes" a check against out.sum().
    fn = make_function(zeros_backward).apply
    assert gradcheck(lambda x, w: fn(x, w).sum(), inputs())
    with pytest.raises(GradcheckError):
        gradcheck(fn, inputs())


def test_failure_reports_the_worst_element():
    def off_by_one_element(ctx, g):
        grad_x, grad_w = correct_backward(ctx, g)
        grad_w = grad_w.copy()
        grad_w[2, 3] += 0.5
        return grad_x, grad_w

    with pytest.raises(GradcheckError) as info:
        gradcheck(make_function(off_by_one_element).apply, inputs())
    assert info.value.input_index == 1
    assert info.value.element_index == (2, 3)
    assert abs(info.value.analytic - info.value.numeric - 0.5) < 1e-6


def test_raise_exception_false_returns_false():
    assert gradcheck(make_function(zeros_backward).apply, inputs(), raise_exception=False) is False


def test_max_elements_samples_a_subset():
    assert gradcheck(make_function(correct_backward).apply, inputs(), max_elements=3)


def test_float32_inputs_are_refused():
    x = mt.randn(3, requires_grad=True)
    with pytest.raises(TypeError, match="float64"):
        gradcheck(mt.functional.exp, [x])


def test_nan_input_is_refused():
    x = mt.tensor(np.array([1.0, np.nan, 2.0]), requires_grad=True)
    with pytest.raises(ValueError, match=r"input 0 .* nan at index \(1,\)"):
        gradcheck(mt.functional.exp, [x])


def test_no_input_requiring_grad_is_refused():
    with pytest.raises(ValueError, match="requires_grad"):
        gradcheck(mt.functional.exp, [mt.tensor(np.ones(3))])


def test_inputs_are_restored_after_the_check():
    x, w = inputs()
    before = x.data.copy()
    gradcheck(make_function(correct_backward).apply, (x, w))
    np.testing.assert_array_equal(x.data, before)


def nan_backward(ctx, g):
    grad_x, grad_w = correct_backward(ctx, g)
    grad_w = grad_w.copy()
    grad_w[1, 2] = np.nan  # one NaN among right values
    return grad_x, grad_w


def test_a_nan_from_backward_fails_with_a_clear_report():
    with pytest.raises(GradcheckError, match=r"at index \(1, 2\) backward gives nan .* backward gave NaN \(not a number\)") as info:
        gradcheck(make_function(nan_backward).apply, inputs())
    assert info.value.input_index == 1 and np.isnan(info.value.analytic)
    assert gradcheck(make_function(nan_backward).apply, inputs(), raise_exception=False) is False


def test_a_nan_from_the_finite_differences_fails_too():
    class NanAway(Function):
        """y = 2x at x, NaN anywhere else: the finite differences see NaN, backward says 2."""

        @staticmethod
        def forward(ctx, x):
            return np.where(x == ORIGIN, 2 * x, np.nan)

        @staticmethod
        def backward(ctx, grad_out):
            return 2 * grad_out

    ORIGIN = np.array([0.5, 1.5])
    x = mt.tensor(ORIGIN.copy(), requires_grad=True)
    with pytest.raises(GradcheckError, match="the finite differences gave NaN"):
        gradcheck(NanAway.apply, [x])


def test_tolerances_of_zero_pass_only_exact_agreement():
    x = mt.tensor(np.array([1.0, 2.0]), requires_grad=True)
    assert gradcheck(lambda x: x * 0.0, [x], atol=0.0, rtol=0.0)  # 0 == 0 exactly
    with pytest.raises(GradcheckError):
        gradcheck(mt.functional.exp, [x], atol=0.0, rtol=0.0)  # rounding in the differences


@pytest.mark.parametrize(
    "options, kind, message",
    [
        ({"eps": 0}, mt.InputError, r"gradcheck: eps must be > 0 and finite, got 0"),
        ({"eps": -1e-6}, mt.InputError, "eps must be > 0"),
        ({"eps": float("nan")}, mt.InputError, "eps must be > 0 and finite, got nan"),
        ({"atol": -1.0}, mt.InputError, "atol must be >= 0 and finite"),
        ({"rtol": float("inf")}, mt.InputError, "rtol must be >= 0 and finite, got inf"),
        ({"eps": "small"}, mt.InputTypeError, "eps must be a number"),
        ({"max_elements": 0}, mt.InputError, "max_elements must be >= 1"),
        ({"seed": 1.5}, mt.InputTypeError, "seed must be an int"),
        ({"raise_exception": "no"}, mt.InputTypeError, "raise_exception must be True or False"),
    ],
)
def test_options_are_checked(options, kind, message):
    with pytest.raises(kind, match=message):
        gradcheck(make_function(correct_backward).apply, inputs(), **options)


def test_fn_and_inputs_are_checked():
    x, w = inputs()
    with pytest.raises(mt.InputTypeError, match="fn must be callable"):
        gradcheck("exp", [x])
    with pytest.raises(mt.InputTypeError, match="inputs must be a list or tuple"):
        gradcheck(mt.functional.exp, x)
    with pytest.raises(mt.InputTypeError, match="fn must return a Tensor, got ndarray"):
        gradcheck(lambda x: x.data, [x])


def test_gradcheck_error_is_a_microtensor_error_and_an_assertion():
    assert issubclass(GradcheckError, mt.MicrotensorError) and issubclass(GradcheckError, AssertionError)
