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
