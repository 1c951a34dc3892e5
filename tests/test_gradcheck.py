"""The gradient checker itself: it passes correct backwards and reports wrong ones, in a few lines
a student can act on."""
import os
import pickle
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import microtensor as mt
from microtensor import Function, GradcheckError, gradcheck
from microtensor.gradcheck import GradcheckReport, RandomDraw, gradcheck_report


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
    with pytest.raises(GradcheckError, match=r"gradcheck failed for Candidate.apply \(ops: Candidate\)\n  input \d: shape \(\d, \d\)"):
        gradcheck(make_function(backward).apply, inputs())


def test_zeros_backward_of_softmax_would_pass_a_sum_check():
    # Why the upstream gradient is random: softmax rows sum to 1, so sum(out) is constant and its
    # gradient is zero; a zero backward "passes" a check against out.sum().
    fn = make_function(zeros_backward).apply
    assert gradcheck(lambda x, w: fn(x, w).sum(), inputs())
    with pytest.raises(GradcheckError):
        gradcheck(fn, inputs())


def off_by_half_at_2_3(ctx, g):
    """Right everywhere but at w[2, 3], which is 0.5 too big."""
    grad_x, grad_w = correct_backward(ctx, g)
    grad_w = grad_w.copy()
    grad_w[2, 3] += 0.5
    return grad_x, grad_w


def test_failure_reports_the_worst_element():
    with pytest.raises(GradcheckError) as info:
        gradcheck(make_function(off_by_half_at_2_3).apply, inputs())
    error = info.value
    assert error.input_index == 1
    assert error.element_index == (2, 3)
    assert abs(error.analytic - error.numeric - 0.5) < 1e-6
    assert error.report.failed == 1 and error.report.checked == 16


def test_a_scalar_output_gets_one_random_number_as_upstream():
    """f's output is a single number (a loss): the report says the upstream is one number, not an array of shape ()."""

    class HalfSquare(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return np.asarray((x * x).sum() / 2)

        @staticmethod
        def backward(ctx, grad_out):
            (x,) = ctx.saved_tensors
            return 2 * x * grad_out  # the 1/2 forgotten: twice the gradient

    text = str(gradcheck_report(HalfSquare.apply, [mt.tensor(np.linspace(0.5, 1.5, 4), requires_grad=True)]))
    assert "Both are d (upstream * f) / d inputs[0][" in text and "upstream a random number (seed 0): f's output is a scalar." in text
    assert "shaped like f's output" not in text, text


def test_the_report_says_what_failed_and_what_to_do():
    with pytest.raises(GradcheckError) as info:
        gradcheck(make_function(off_by_half_at_2_3).apply, inputs())
    report = info.value.report
    text = str(info.value)
    assert text == str(report)
    lines = text.splitlines()
    assert len(lines) <= 8, text
    assert lines[0] == "gradcheck failed for Candidate.apply (ops: Candidate)"
    assert "input 1: shape (4, 4), float64; 1 of 16 elements out of tolerance, the worst inputs[1][2, 3]" in text
    assert f"analytic (backward) {report.analytic:.8g}  vs  numeric (finite differences) {report.numeric:.8g}" in text
    assert f"error {report.error:.3g} (relative {report.relative_error:.3g}) > allowed {report.allowed:.3g} = atol 1e-05 + rtol 0.001" in text
    assert "Both are d sum(upstream * f) / d inputs[1][2, 3], upstream a random array shaped like f's output\n  (3, 4) (seed 0)" in text
    assert "not the derivative of one output" in text
    # one op: the hint points at its backward, file and line
    source = Path(__file__).read_text()
    line = source[: source.index("        def backward(ctx, grad_out):\n            return backward(")].count("\n") + 1
    assert f"Hint: f is one op: read Candidate.backward (tests/test_gradcheck.py:{line}) and what it calls" in text
    assert report.allowed == pytest.approx(1e-5 + 1e-3 * abs(report.numeric))
    assert report.error == pytest.approx(0.5, abs=1e-6)
    assert (report.input_name, report.shape, report.dtype, report.seed) == (None, (4, 4), "float64", 0)


def test_a_composite_function_gets_its_ops_and_the_hint_to_check_them_one_by_one():
    candidate = make_function(off_by_half_at_2_3).apply

    def block(x, w):
        return candidate(x, w) * 2.0 + x  # elementwise ops: numpy, nothing to compile

    with pytest.raises(GradcheckError) as info:
        gradcheck(block, inputs())
    text = str(info.value)
    assert info.value.report.ops == ("Candidate", "Mul", "Add")
    assert text.startswith("gradcheck failed for block (ops: Candidate -> Mul -> Add)\n")
    assert "input 1 (w): shape (4, 4)" in text and "the worst w[" in text  # the parameter's own name
    assert "f is composite: gradcheck each op alone, e.g. mt.gradcheck(lambda x: F.softmax(x, dim=-1), [x])" in text


def test_a_long_graph_is_shortened():
    x = mt.tensor(np.linspace(0.1, 1.0, 4), requires_grad=True)
    candidate = make_function(zeros_backward).apply

    def deep(x):
        return candidate((((x * 2 + 1) * 3 - 1) * 0.5).reshape(2, 2), mt.tensor(np.eye(2)))

    with pytest.raises(GradcheckError, match=r"failed for deep \(7 ops: Mul -> Add -> Mul -> \.\.\. -> Reshape -> Candidate\)"):
        gradcheck(deep, [x])


def test_an_input_that_got_no_gradient_is_reported_as_such():
    class ForgetsX(Function):
        """y = x @ w, whose backward returns None for x."""

        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x)
            return x @ w

        @staticmethod
        def backward(ctx, grad_out):
            (x,) = ctx.saved_tensors
            return None, x.T @ grad_out

    x, w = inputs()
    with pytest.raises(GradcheckError) as info:
        gradcheck(lambda x, w: ForgetsX.apply(x, w), [x, w])
    assert info.value.input_index == 0 and info.value.analytic is None and x.grad is None
    text = str(info.value)
    assert text.startswith("gradcheck failed for a lambda (ops: ForgetsX)\n  input 0 (x): shape (3, 4)")
    assert "analytic (backward) None (no gradient reached the input)" in text
    assert "no op's backward sent a gradient to input 0: a backward returned None for it" in text


def test_raise_exception_false_returns_false():
    assert gradcheck(make_function(zeros_backward).apply, inputs(), raise_exception=False) is False


def test_gradcheck_report_returns_the_report_or_none():
    report = gradcheck_report(make_function(off_by_half_at_2_3).apply, inputs())
    assert isinstance(report, GradcheckReport)
    assert (report.input_index, report.element_index) == (1, (2, 3))
    assert str(report).startswith("gradcheck failed for Candidate.apply")
    assert repr(report).startswith("<GradcheckReport input 1 at (2, 3): analytic 0.")
    assert gradcheck_report(make_function(correct_backward).apply, inputs()) is None


def test_a_gradcheck_error_survives_pickling():
    error = GradcheckError(gradcheck_report(make_function(off_by_half_at_2_3).apply, inputs()))
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) and copy.element_index == (2, 3)


WRONG_GRADIENT_TEST = """
import numpy as np
import microtensor as mt


class Square(mt.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        grad = 2 * x * grad_out
        grad[1, 2] = x[1, 2] * grad_out[1, 2]  # the 2 forgotten in one element
        return (grad,)


def test_square():
    x = mt.tensor(np.linspace(0.5, 2.0, 12).reshape(3, 4), requires_grad=True)
    assert mt.gradcheck(Square.apply, [x])
"""


def test_a_failure_in_pytest_is_the_report_not_pages_of_source(tmp_path):
    """What a student sees under `pytest -q`: the test's line and the report, in about 25 lines,
    not the source of gradcheck's frames (they are hidden with __tracebackhide__)."""
    (tmp_path / "test_square.py").write_text(textwrap.dedent(WRONG_GRADIENT_TEST))
    environment = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")  # hypothesis's plugin: not needed, slow to load
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_square.py"],
        cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    # Newer pytest versions underline the failing expression with a line of carets: not ours to count.
    carets = re.compile(r"^E?\s*\^+\s*$")
    lines = [line for line in output.splitlines() if not carets.match(line)]
    assert len(lines) <= 25, output
    assert "gradcheck failed for Square.apply (ops: Square)" in output
    assert "1 of 12 elements out of tolerance, the worst inputs[0][1, 2]" in output
    assert "Hint: f is one op: read Square.backward (test_square.py:" in output
    assert "gradcheck.py" not in output and "gradcheck_report(" not in output, output


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
    with pytest.raises(GradcheckError, match=r"the worst inputs\[1\]\[1, 2\]:\n  analytic \(backward\) nan .*\n.*\n  backward gave NaN \(not a number\)") as info:
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


def test_a_non_leaf_input_is_refused_with_the_way_to_make_a_leaf():
    leaf = mt.randn(2, 3, dtype=mt.float64, requires_grad=True)
    softmax = lambda x: mt.functional.softmax(x, dim=-1)  # noqa: E731
    message = r"gradcheck: input 0 \(shape \(2, 3\)\) is not a leaf \(it was made by Mul\), .*x\.detach\(\)\.requires_grad_\(\)"
    with pytest.raises(mt.InputError, match=message):
        gradcheck(softmax, [leaf * 2])
    with pytest.raises(mt.InputError, match=message):
        gradcheck_report(softmax, [leaf * 2])
    assert gradcheck(softmax, [(leaf * 2).detach().requires_grad_()])  # the fix the message suggests


def test_a_float32_output_is_refused_not_reported_as_a_wrong_backward():
    x = mt.randn(3, dtype=mt.float64, requires_grad=True)
    to_float32 = lambda x: (x * 2).float()  # noqa: E731
    message = r"gradcheck: fn returned an output of dtype float32 and shape \(3,\); expected float64"
    # a refused input raises from all three, as the other input checks do; only a gradient mismatch is a report
    with pytest.raises(mt.InputTypeError, match=message):
        gradcheck(to_float32, [x])
    with pytest.raises(mt.InputTypeError, match=message):
        gradcheck(to_float32, [x], raise_exception=False)
    with pytest.raises(mt.InputTypeError, match=message):
        gradcheck_report(to_float32, [x])


def test_gradcheck_under_no_grad_says_gradients_are_disabled():
    x = mt.randn(3, dtype=mt.float64, requires_grad=True)
    with mt.no_grad():
        with pytest.raises(mt.InputError, match=r"gradcheck: gradients are disabled \(it was called inside mt\.no_grad\(\)\)"):
            gradcheck(mt.functional.exp, [x])
    assert gradcheck(mt.functional.exp, [x])  # and no_grad's end turned them back on


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 5)])
def test_random_draw_stores_each_layout_as_it_says(shape):
    # The registry's cases reach the kernels in these layouts: a copy into contiguous memory would hide them.
    draws = {layout: RandomDraw(0).tensor(shape, layout=layout) for layout in RandomDraw.LAYOUTS}
    assert draws["contiguous"].data.flags.c_contiguous
    transposed = draws["transposed"].data
    assert transposed.flags.f_contiguous and not transposed.flags.c_contiguous
    strided = draws["strided"].data
    assert not strided.flags.c_contiguous and not strided.flags.f_contiguous
    assert strided.strides[-1] == 2 * strided.itemsize  # every other element of a padded buffer
    for tensor in draws.values():
        np.testing.assert_array_equal(tensor.data, draws["contiguous"].data)  # the same values, drawn from one seed
        assert tensor.requires_grad and tensor.dtype == mt.float64


class DoubleWrongAtTheLast(Function):
    """y = 2x, whose backward is right everywhere but at the last element, where it gives 0."""

    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, grad_out):
        grad_x = 2 * grad_out
        grad_x[-1] = 0
        return grad_x


def test_max_elements_samples_at_random_so_some_seed_checks_the_last_element():
    """max_elements picks a random sample, not the first elements: checking 3 of 12, the seeds
    between them check the one wrong element (the last), which the first 3 would never include.
    Kills the mutant gradcheck.max_elements_checks_the_first."""
    x = mt.tensor(np.linspace(-1.0, 1.0, 12), requires_grad=True)
    with pytest.raises(GradcheckError) as info:
        gradcheck(DoubleWrongAtTheLast.apply, [x])  # every element checked: caught
    assert info.value.element_index == (11,) and info.value.report.checked == 12
    reports = [gradcheck_report(DoubleWrongAtTheLast.apply, [x], seed=seed, max_elements=3) for seed in range(10)]
    caught = [report for report in reports if report is not None]
    assert caught, "no seed sampled the last element: max_elements does not sample at random"
    assert all(report.element_index == (11,) and report.checked == 3 and report.size == 12 for report in caught)
    assert len(caught) < len(reports)  # a sample of 3 in 12 misses it too, for some seeds


class DoubleWithAbsoluteUpstream(Function):
    """y = 2x, whose backward uses |grad_out| where it should use grad_out: right only where the
    upstream gradient is positive."""

    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, grad_out):
        return 2 * np.abs(grad_out)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_upstream_gradient_has_both_signs(seed):
    """The random upstream gradient is not all positive, so a backward that drops grad_out's sign
    is reported. Kills the mutant gradcheck.upstream_positive."""
    x = mt.tensor(np.linspace(-1.0, 1.0, 8), requires_grad=True)
    with pytest.raises(GradcheckError) as info:
        gradcheck(DoubleWithAbsoluteUpstream.apply, [x], seed=seed)
    assert info.value.analytic == pytest.approx(-info.value.numeric)  # the sign is what it got wrong
