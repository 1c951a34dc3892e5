"""The checks of exercise 10. Run them with `python -m exercises check softplus`."""
import numpy as np

import microtensor as mt
from exercises.checking import CheckFailed, expect, expect_close, expect_raises, float64_arithmetic, gradcheck, random_tensor
from microtensor.errors import InputError, InputTypeError
from microtensor.gradcheck import GRADCHECK_CASES, RandomDraw

# x = ±100 and ±1000 overflow e^x in float32 (past 88.7) and ±1000 in float64 (past 709.8);
# x = -30 needs log1p: 1 + e^-30 rounds to 1 in float32, and log(1) = 0 instead of 9.4e-14
EXTREMES = np.array([-1000.0, -100.0, -30.0, -5.0, 0.0, 5.0, 30.0, 100.0, 1000.0])


def softplus_numpy(x):
    """log(1 + e^x) = log(e^0 + e^x), numpy's own stable log-add-exp, in float64."""
    return np.logaddexp(0.0, np.asarray(x, dtype=np.float64))


def sigmoid_numpy(x):
    """σ(x) = 1 / (1 + e^-x) = e^-log(1 + e^-x), which no x overflows, in float64."""
    return np.exp(-np.logaddexp(0.0, -np.asarray(x, dtype=np.float64)))


def mish_numpy(x):
    return np.asarray(x, dtype=np.float64) * np.tanh(softplus_numpy(x))


def tolerance(dtype):
    """(atol, rtol): float32 keeps about 7 digits, and its tiniest values are subnormals 1.4e-45 apart."""
    return (1e-43, 2e-6) if dtype == np.float32 else (1e-300, 1e-12)


def expect_softplus_values(what, got, x, atol, rtol):
    """got (float64) against np.logaddexp(0, x); a finite result wrong at x = -30 adds: use log1p."""
    expected = softplus_numpy(x)
    try:
        expect_close(what, got, expected, "np.logaddexp(0, x)", atol=atol, rtol=rtol)
    except CheckFailed as failure:
        at = x == -30
        if got.shape == x.shape and np.all(np.isfinite(got)) and not np.all(np.abs(got[at] - expected[at]) <= atol + rtol * np.abs(expected[at])):
            raise CheckFailed(f"{failure} (at x = -30, 1 + e^-30 rounds e^-30's digits away, to exactly 1 in float32: use log1p)") from None
        raise


def test_reference_matches_numpy(impl):
    """softplus_reference equals numpy's log-add-exp, also at x = ±100, ±1000"""
    for dtype in (np.float64, np.float32):
        x = np.concatenate([np.random.default_rng(0).uniform(-6, 6, size=8), EXTREMES]).astype(dtype)
        atol, rtol = tolerance(dtype)
        with np.errstate(all="ignore"):  # an unstable formula overflows: the comparison says so
            got = np.asarray(impl.softplus_reference(x))
        expect(got.shape == x.shape, f"softplus_reference of shape {x.shape} returned shape {got.shape}")
        expect_softplus_values(
            f"softplus_reference(x) for x = {x.tolist()} ({np.dtype(dtype).name}, compared in float64)",
            got.astype(np.float64), x, atol, rtol,
        )  # fmt: skip


def test_forward_matches_numpy(impl):
    """the forward equals numpy's log-add-exp, for several shapes and a transposed input"""
    for seed, shape in enumerate([(7,), (3, 5), (2, 3, 2)]):
        x = random_tensor(shape, seed=seed, low=-6, high=6)
        expect_close(f"softplus(x) of shape {shape}", impl.softplus(x), softplus_numpy(x.numpy()), "np.logaddexp(0, x)")
    values = np.random.default_rng(5).uniform(-6, 6, size=(4, 3))
    x = mt.tensor(np.asfortranarray(values))  # the same numbers laid out column by column
    expect_close(
        "softplus(x) of a (4, 3) x stored column by column (not C-contiguous)", impl.softplus(x),
        softplus_numpy(values), "np.logaddexp(0, x)",
    )  # fmt: skip


def test_stable_at_large_inputs(impl):
    """x = ±100, ±1000 (e^x overflows) and -30: output and gradient finite and right, float32 and float64"""
    upstream = np.linspace(-1.0, 2.0, EXTREMES.size)
    for dtype in (np.float64, np.float32):
        name = np.dtype(dtype).name
        atol, rtol = tolerance(dtype)
        x = mt.tensor(EXTREMES.astype(dtype), requires_grad=True)
        with np.errstate(all="ignore"):  # overflow warnings from an unstable formula: the values say it
            y = impl.softplus(x)
            expect(y.dtype == dtype, f"softplus of a {name} tensor returned {y.dtype}; keep the input's dtype")
            y.backward(mt.tensor(upstream.astype(dtype)))
        expect_softplus_values(
            f"softplus(x) in {name} for x = {EXTREMES.tolist()} (compared in float64)", y.numpy().astype(np.float64),
            EXTREMES, atol, rtol,
        )  # fmt: skip
        expected = upstream.astype(dtype).astype(np.float64) * sigmoid_numpy(EXTREMES)
        moderate = np.abs(EXTREMES) <= 5  # nothing overflows there: wrong there is not this check's cause
        if not np.allclose(x.grad.astype(np.float64)[moderate], expected[moderate], atol=atol, rtol=rtol):
            continue  # the gradient is wrong at every scale: gradcheck, next, names that
        expect_close(
            f"dL/dx in {name} at x = {EXTREMES.tolist()} (compared in float64)", x.grad.astype(np.float64),
            expected, "g * σ(x) in numpy", atol=atol, rtol=rtol,
        )  # fmt: skip


def test_gradient_matches_finite_differences(impl):
    """gradcheck: the backward against finite differences, random upstream gradient"""
    for seed, shape in enumerate([(7,), (3, 4), (2, 3, 2)]):
        gradcheck(impl.softplus, [random_tensor(shape, seed=seed, low=-6, high=6)])


def test_float32_stays_float32(impl):
    """a float32 input gives a float32 output and a float32 gradient, equal to float64 numpy's"""
    values = np.random.default_rng(3).uniform(-8, 8, size=(4, 6)).astype(np.float32)
    upstream = np.random.default_rng(4).normal(size=(4, 6)).astype(np.float32)
    x = mt.tensor(values, requires_grad=True)
    y = impl.softplus(x)
    y.backward(mt.tensor(upstream))
    expect(y.dtype == np.float32, f"softplus of a float32 (4, 6) tensor returned {y.dtype}; keep the input's dtype")
    expect(x.grad.dtype == np.float32, f"dL/dx of a float32 (4, 6) tensor is {x.grad.dtype}; keep the input's dtype")
    expect_close("softplus(x) in float32", y, softplus_numpy(values).astype(np.float32), "np.logaddexp(0, x)", atol=1e-6, rtol=1e-6)
    expect_close("dL/dx in float32", x.grad, (upstream * sigmoid_numpy(values)).astype(np.float32), "g * σ(x) in numpy", atol=1e-6, rtol=1e-5)


def test_float32_arithmetic_stays_float32(impl):
    """compiled, both kernels compute in float32 for float32 arrays (no bare 0.0 or 1.0)"""
    x, grad_out = np.linspace(-3, 3, 7).astype(np.float32), np.linspace(2, -1, 7).astype(np.float32)
    arguments_of = {"softplus_forward": (x, np.empty_like(x)), "softplus_backward": (grad_out, x, np.empty_like(x))}
    for name, arguments in arguments_of.items():
        kernel = getattr(impl, name)
        kernel(*arguments)  # runs at all (not a TODO any more)
        promoted = float64_arithmetic(kernel, *arguments)
        expect(not promoted, f"{name} computes {', '.join(promoted)} in float64 for float32 arrays: a bare Python "
               "number such as 0.0 or 1.0 is a float64 to Numba; write x.dtype.type(0) and x.dtype.type(1)")


def test_registered_case_passes_gradcheck(impl):
    """your @gradcheck_case(Softplus) is registered, checks Softplus, and passes for several draws"""
    cases = GRADCHECK_CASES.get(impl.Softplus, [])
    expect(
        len(cases) > 0,
        "Softplus has no gradcheck case in microtensor.gradcheck.GRADCHECK_CASES: "
        "put @gradcheck_case(Softplus) above _softplus_case",
    )
    for case in cases:
        for seed in range(6):
            fn, inputs, *options = case(RandomDraw(seed))
            options = options[0] if options else {}
            out = fn(*inputs)
            made_by = out.grad_fn.function if out.grad_fn is not None else None
            expect(
                made_by is impl.Softplus,
                f"{case.__name__}(RandomDraw({seed})) returned a function whose output was made by "
                f"{getattr(made_by, '__name__', 'no op')}, not by Softplus: return softplus itself",
            )
            gradcheck(fn, inputs, **options)


def test_non_float_input_raises_an_error_naming_softplus(impl):
    """an integer tensor (or a numpy array) raises microtensor's error, and the message names softplus"""
    for what, value in (("an int64 tensor", mt.tensor(np.arange(6).reshape(2, 3))), ("a numpy array", np.ones(3))):
        error = expect_raises(f"softplus of {what}", (InputTypeError, InputError), impl.softplus, value)
        expect("softplus" in str(error), f"softplus of {what} raised {type(error).__name__}({str(error)!r}), which does not name softplus")


def test_mish_matches_numpy(impl):
    """mish(x) equals x tanh(softplus(x)) in numpy, in float64 and float32 (dtype kept)"""
    values = np.concatenate([np.random.default_rng(6).uniform(-6, 6, size=10), [-100.0, 100.0]])
    for dtype, atol in ((np.float64, 1e-12), (np.float32, 1e-6)):
        y = impl.mish(mt.tensor(values.astype(dtype)))
        expect_close(
            f"mish(x) in {np.dtype(dtype).name}", y, mish_numpy(values.astype(dtype)).astype(dtype),
            "x * tanh(np.logaddexp(0, x))", atol=atol, rtol=1e-6,
        )  # fmt: skip


def test_mish_gradient_matches_finite_differences(impl):
    """gradcheck of mish, through the graph of the ops it is built from"""
    for seed, shape in enumerate([(6,), (3, 4)]):
        x = random_tensor(shape, seed=10 + seed, low=-5, high=5)
        out = impl.mish(x)
        expect(
            isinstance(out, mt.Tensor) and out.requires_grad,
            "mish(x) of a tensor that requires grad gives no graph to differentiate: build it from tensor "
            "ops (softplus, F.tanh, *), not from numpy arrays",
        )
        gradcheck(impl.mish, [x])
