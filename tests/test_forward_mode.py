"""Forward mode: mt.jvp, and every Function's `jvp` rule checked two ways through the registry of
gradcheck cases, in both kernel sets.

For every registered case: the JVP along random tangents against central finite differences of the
forward, and against the op's backward by the dot-product test <u, J v> = <Jᵀ u, v>. And, as for
gradcheck cases, a Function anywhere in the package without a `jvp` fails the registry test.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import microtensor as mt
import microtensor.functional as F
from microtensor.autograd import Function
from microtensor.errors import GraphError, InputError, InputTypeError
from microtensor.gradcheck import JvpcheckError, dot_product_report, jvpcheck_report
from strategies import HypothesisDraw
from test_gradcheck_cases import CASES, RecordedData, all_functions, describe_inputs


def test_every_function_has_a_jvp():
    missing = sorted(f"{f.__module__}.{f.__name__}" for f in all_functions() if f.jvp is Function.jvp)
    assert not missing, f"Functions without a jvp (forward-mode rule): {missing}"


def _fail(case, kernel_set, data, inputs, options, report):
    pytest.fail(
        f"case {case.__module__}.{case.__name__}, {kernel_set} kernels\n"
        f"  hypothesis drew {', '.join(data.drawn)}: inputs {describe_inputs(inputs)}"
        f"{f', options {options}' if options else ''}\n{report}",
        pytrace=False,
    )


@pytest.mark.parametrize("case", CASES)
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # kernel_set is the same for every example
@given(data=st.data())
def test_jvp_against_finite_differences(case, data, kernel_set):
    data = RecordedData(data)
    fn, inputs, *options = case(HypothesisDraw(data))
    options = options[0] if options else {}
    # a case's step and tolerances are about its forward (e.g. float32 legs), so they hold here too
    forward_options = {key: value for key, value in options.items() if key in ("eps", "atol", "rtol", "seed")}
    report = jvpcheck_report(fn, inputs, **forward_options)
    if report is not None:
        _fail(case, kernel_set, data, inputs, options, report)


@pytest.mark.parametrize("case", CASES)
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_jvp_against_backward(case, data, kernel_set):
    data = RecordedData(data)
    fn, inputs, *options = case(HypothesisDraw(data))
    report = dot_product_report(fn, inputs)
    if report is not None:
        _fail(case, kernel_set, data, inputs, options[0] if options else {}, report)


# --------------------------------------------------------------------------------- mt.jvp itself


def _x(shape=(3,), seed=0, requires_grad=False, dtype=np.float64):
    values = np.random.default_rng(seed).uniform(0.5, 2.0, shape).astype(dtype)
    return mt.tensor(values, requires_grad=requires_grad)


def test_jvp_of_a_square_is_two_x_v():
    x, v = _x(), np.array([1.0, -2.0, 0.5])
    out, tangent = mt.jvp(lambda x: x * x, (x,), (v,))
    np.testing.assert_allclose(out.data, x.data**2)
    np.testing.assert_allclose(tangent.data, 2 * x.data * v)
    assert isinstance(tangent, mt.Tensor) and tangent.shape == out.shape and tangent.dtype == out.dtype


def test_jvp_takes_one_tensor_and_gives_columns_of_the_jacobian():
    x = _x((4,))
    for j in range(4):
        e = np.zeros(4)
        e[j] = 1
        _, column = mt.jvp(lambda x: F.softmax(x, dim=-1), x, e)
        y = F.softmax(x, dim=-1).data
        np.testing.assert_allclose(column.data, y * ((np.arange(4) == j) - y[j]), atol=1e-15)


def test_jvp_adds_the_tangents_of_several_inputs_and_skips_none():
    a, b = _x(seed=1), _x(seed=2)
    va, vb = np.ones(3), np.full(3, 2.0)
    _, both = mt.jvp(lambda a, b: a * b, (a, b), (va, vb))
    _, only_a = mt.jvp(lambda a, b: a * b, (a, b), (va, None))
    np.testing.assert_allclose(both.data, va * b.data + a.data * vb)
    np.testing.assert_allclose(only_a.data, va * b.data)


def test_jvp_of_an_output_that_does_not_move_is_zero_and_of_a_tuple_is_a_tuple():
    x, w = _x(), _x(seed=3)
    outs, tangents = mt.jvp(lambda x, w: (x.exp(), w * 2.0), (x, w), (np.ones(3), None))
    assert isinstance(outs, tuple) and isinstance(tangents, tuple)
    np.testing.assert_allclose(tangents[0].data, np.exp(x.data))
    np.testing.assert_array_equal(tangents[1].data, np.zeros(3))


def test_jvp_carries_a_tangent_through_indexing_of_a_primal_that_needs_no_gradient():
    # getitem skips its Function for tensors without requires_grad; under jvp it must not, or the
    # tangent is lost and the derivative comes out 0
    x = _x((3,))
    assert not x.requires_grad
    _, tangent = mt.jvp(lambda x: x[0] * 3.0, x, np.ones(3))
    np.testing.assert_array_equal(tangent.data, 3.0)
    _, picked = mt.jvp(lambda x: x[np.array([2, 2, 0])], x, np.array([1.0, 2.0, 4.0]))
    np.testing.assert_array_equal(picked.data, [4.0, 4.0, 1.0])


def test_jvp_of_the_identity_is_the_tangent():
    x, v = _x(), np.array([3.0, 1.0, 2.0])
    _, tangent = mt.jvp(lambda x: x, x, v)
    np.testing.assert_array_equal(tangent.data, v)


def test_jvp_leaves_reverse_mode_alone():
    x = _x(requires_grad=True)
    _, tangent = mt.jvp(lambda x: (x * x).sum(), x, np.ones(3))
    loss = (x * x).sum()
    loss.backward()
    np.testing.assert_allclose(x.grad, 2 * x.data)
    np.testing.assert_allclose(tangent.data, np.sum(2 * x.data))


def test_outside_jvp_a_context_saves_nothing_when_no_input_needs_a_gradient():
    seen = []

    class Spy(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            seen.append(ctx)
            return x * 2

        @staticmethod
        def backward(ctx, grad_out):
            return grad_out * 2

        @staticmethod
        def jvp(ctx, tangent):
            return tangent * 2

    x = _x()
    Spy.apply(x)
    assert seen[-1].saved_tensors == () and not seen[-1].forward_mode  # reverse mode pays nothing
    mt.jvp(lambda x: Spy.apply(x), x, np.ones(3))
    assert len(seen[-1].saved_tensors) == 1 and seen[-1].forward_mode  # kept for the jvp rule


def test_a_tangent_of_the_wrong_shape_or_dtype_is_an_error_naming_it():
    x, w = _x(), _x(seed=4)
    with pytest.raises(InputError, match=r"tangents\[1\] has shape \(4,\).*primal has shape \(3,\)"):
        mt.jvp(lambda x, w: x * w, (x, w), (np.ones(3), np.ones(4)))
    with pytest.raises(InputError, match=r"tangents\[0\] has shape \(3,\) and dtype float32"):
        mt.jvp(lambda x, w: x * w, (x, w), (np.ones(3, dtype=np.float32), None))
    with pytest.raises(InputError, match=r"^jvp: tangents has shape \(2,\)"):
        mt.jvp(lambda x: x * x, x, np.ones(2))
    with pytest.raises(InputTypeError, match=r"tangents\[0\] must be a numpy array"):
        mt.jvp(lambda x: x * x, (x,), ([1.0, 2.0, 3.0],))
    with pytest.raises(InputError, match="2 tangents for 1 primals"):
        mt.jvp(lambda x: x * x, (x,), (np.ones(3), None))
    with pytest.raises(InputTypeError, match="only float tensors have tangents"):
        mt.jvp(lambda i: i, (mt.tensor(np.arange(3)),), (np.ones(3, dtype=np.int64),))


def test_an_op_without_a_jvp_is_an_error_naming_it():
    class NoForwardRule(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 3

        @staticmethod
        def backward(ctx, grad_out):
            return grad_out * 3

    x = _x()
    with pytest.raises(GraphError, match="NoForwardRule has no forward-mode rule"):
        mt.jvp(lambda x: NoForwardRule.apply(x).exp(), x, np.ones(3))
    # with no tangent flowing into it, the op runs as usual
    mt.jvp(lambda x: NoForwardRule.apply(x), x, None)


def test_a_jvp_rule_returning_the_wrong_shape_is_an_error_naming_the_op():
    class WrongShape(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 3

        @staticmethod
        def backward(ctx, grad_out):
            return grad_out * 3

        @staticmethod
        def jvp(ctx, tangent):
            return tangent[:1]

    with pytest.raises(GraphError, match=r"WrongShape.jvp returned a tangent of shape \(1,\)"):
        mt.jvp(lambda x: WrongShape.apply(x), _x(), np.ones(3))


def test_nested_jvp_is_refused():
    x = _x()
    with pytest.raises(GraphError, match="inside another mt.jvp"):
        mt.jvp(lambda x: mt.jvp(lambda y: y * y, x, np.ones(3))[0], x, np.ones(3))
    _, tangent = mt.jvp(lambda x: x * x, x, np.ones(3))  # and the outer one left forward mode off
    np.testing.assert_allclose(tangent.data, 2 * x.data)


# --------------------------------------------------------------------------------- the checks can fail


class _Cube(Function):
    """y = x^3, dy/dx = 3 x^2, with a correct backward and a wrong JVP (2 x^2 instead of 3 x^2)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x**3

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * 3 * x**2

    @staticmethod
    def jvp(ctx, tangent):
        (x,) = ctx.saved_tensors
        return tangent * 2 * x**2


class _CubeWrongBackward(_Cube):
    """The same cube with a right JVP and a wrong backward."""

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * 2 * x**2

    @staticmethod
    def jvp(ctx, tangent):
        (x,) = ctx.saved_tensors
        return tangent * 3 * x**2


def test_a_wrong_jvp_fails_both_checks():
    x = _x((2, 3), requires_grad=True)
    report = jvpcheck_report(_Cube.apply, [x])
    assert report is not None and "forward mode (jvp)" in report and "_Cube.jvp" in report
    report = dot_product_report(_Cube.apply, [x])
    assert report is not None and "dot-product test failed" in report
    with pytest.raises(JvpcheckError):
        mt.jvpcheck(_Cube.apply, [x])


def test_a_wrong_backward_fails_the_dot_product_test_only():
    x = _x((2, 3), requires_grad=True)
    assert jvpcheck_report(_CubeWrongBackward.apply, [x]) is None
    with pytest.raises(JvpcheckError, match="<Jᵀ u, v> from backward"):
        mt.dot_product_check(_CubeWrongBackward.apply, [x])
    assert mt.dot_product_check(lambda x: F.softmax(x, dim=-1), [x])
    assert mt.jvpcheck(lambda x: F.layer_norm(x), [x])
