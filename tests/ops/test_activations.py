"""The activations (microtensor/ops/gelu.py: GELU in both forms; ops/silu.py: SiLU, SwiGLU):
forward and backward in float32 and float64 against float64 evaluations of their formulas
(math.erf, numpy's tanh and exp), in both kernel sets; identities; the readable and fast kernels
called directly against each other; values far from 0; the errors. Tests taking `kernel_set` run
once with each kernel set. The gradients against finite differences are
tests/test_gradcheck_cases.py's."""
import math

import numpy as np
import pytest

import microtensor as mt
import microtensor.functional as F
from microtensor.kernels import active
from microtensor.ops import gelu as gelu_ops
from microtensor.ops.electives import silu as silu_ops
from microtensor.ops.electives.silu import silu_reference
from helpers import JIT_DISABLED, fast_twin_of, randn

N = 2_000 if JIT_DISABLED else 20_000  # plain Python is slow: fewer points without the JIT

# Allowed error, in units of the dtype's eps (float32 kernels compute in float32, float64 ones in
# float64: each is held to the same count of its own eps). Forward errors are measured against
# max(|y|, 1): near 0 the values themselves are small, and an absolute error of a few eps is what the
# formulas give there. Backward errors are measured against max(|g dy/dx|, |g| scale, 1), where
# `scale` (1 unless said otherwise) is how much the formula magnifies the roundings of its parts.
FORWARD_EPS = 8
BACKWARD_EPS = 16


# --------------------------------------------------------------------------------- float64 formulas


def erf64(x):
    return np.vectorize(math.erf)(x)


def gelu_tanh64(x):
    """y, dy/dx and scale of the tanh form, in float64, term by term from the formula.

    The scale: dy/dx holds x/2 (1 - tanh² u) du/dx, and 1 - tanh² u keeps the absolute rounding
    error δ of tanh u (a few eps) while losing its leading digits as tanh u nears ±1, so the term
    carries an error of |x| |tanh u| du/dx δ, up to ~|x| du/dx times eps: the errors of any
    evaluation in floating point, the float64 one here included, are that much larger."""
    k, a = math.sqrt(2 / math.pi), 0.044715
    tanh_u = np.tanh(k * (x + a * x**3))
    du_dx = k * (1 + 3 * a * x**2)
    y = 0.5 * x * (1 + tanh_u)
    dy_dx = 0.5 * (1 + tanh_u) + 0.5 * x * (1 - tanh_u**2) * du_dx
    return y, dy_dx, 1 + np.abs(x) * du_dx


def gelu_erf64(x):
    """y and dy/dx of the erf form: x Φ(x) and Φ(x) + x φ(x); scale 1."""
    cdf = 0.5 * (1 + erf64(x / math.sqrt(2)))
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    return x * cdf, cdf + x * pdf, 1


def sigmoid64(x):
    with np.errstate(over="ignore"):  # e^-x is inf for x << 0, and σ is 0 as it should be
        return 1 / (1 + np.exp(-x))


def silu64(x):
    """y = x σ(x) and dy/dx = σ (1 + x (1 - σ)); scale 1."""
    s = sigmoid64(x)
    return x * s, s * (1 + x * (1 - s)), 1


def points(rng, dtype, n=N):
    """Uniform points over the region where the activations bend, normal ones, and far values."""
    far = [0.0, -0.0, 1e-20, -1e-20, 6.0, -6.0, 88.0, -88.0, 1e4, -1e4]
    return np.concatenate([rng.uniform(-10, 10, n), rng.standard_normal(n), far]).astype(dtype)


def scaled_error(got, exact, scale=1):
    """max |got - exact| / max(|exact|, scale, 1), in float64."""
    got = np.asarray(got, dtype=np.float64)
    return (np.abs(got - exact) / np.maximum(np.maximum(np.abs(exact), scale), 1)).max()


UNARY = {
    "gelu_tanh": (lambda t: F.gelu(t, approximate="tanh"), gelu_tanh64),
    "gelu_erf": (lambda t: F.gelu(t, approximate="none"), gelu_erf64),
    "silu": (F.silu, silu64),
}


# --------------------------------------------------------------------------------- through the ops


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_activation_against_float64_formula(kernel_set, name, dtype):
    fn, exact = UNARY[name]
    rng = np.random.default_rng(3)
    x_in = points(rng, dtype)
    g_in = rng.standard_normal(x_in.shape).astype(dtype)
    x = mt.tensor(x_in, requires_grad=True)
    y = fn(x)
    y.backward(g_in)
    assert y.dtype == dtype and x.grad.dtype == dtype
    assert np.all(np.isfinite(y.numpy())) and np.all(np.isfinite(x.grad))
    y64, dy_dx64, scale = exact(x_in.astype(np.float64))  # the formula at the same (rounded) inputs
    g64 = g_in.astype(np.float64)
    eps = np.finfo(dtype).eps
    assert scaled_error(y.numpy(), y64) <= FORWARD_EPS * eps
    assert scaled_error(x.grad, g64 * dy_dx64, np.abs(g64) * scale) <= BACKWARD_EPS * eps


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_swiglu_against_float64_formula(kernel_set, dtype):
    rng = np.random.default_rng(4)
    a_in, b_in = points(rng, dtype), points(rng, dtype)[::-1].copy()
    g_in = rng.standard_normal(a_in.shape).astype(dtype)
    a, b = mt.tensor(a_in, requires_grad=True), mt.tensor(b_in, requires_grad=True)
    y = F.swiglu(a, b)
    y.backward(g_in)
    assert y.dtype == dtype and a.grad.dtype == dtype and b.grad.dtype == dtype
    a64, b64, g64 = (v.astype(np.float64) for v in (a_in, b_in, g_in))
    silu_a, dsilu_da, _ = silu64(a64)
    eps = np.finfo(dtype).eps
    # y = silu(a) b: the errors of silu(a) are multiplied by |b|, hence scales of |g b| and |g|.
    assert scaled_error(y.numpy(), silu_a * b64) <= FORWARD_EPS * eps
    assert scaled_error(a.grad, g64 * b64 * dsilu_da, np.abs(g64 * b64)) <= BACKWARD_EPS * eps
    assert scaled_error(b.grad, g64 * silu_a, np.abs(g64)) <= BACKWARD_EPS * eps


def test_shapes_are_kept_and_layouts_do_not_matter(kernel_set):
    """The kernels run over a flat contiguous copy: a transposed view gives the values of the
    contiguous array it shows, in its own shape, and its gradient has its input's shape."""
    rng = np.random.default_rng(5)
    x_in = rng.standard_normal((3, 4, 5))
    for name, (fn, _) in UNARY.items():
        contiguous = fn(mt.tensor(x_in)).numpy()
        x_transposed = mt.tensor(np.ascontiguousarray(x_in.transpose(2, 1, 0)), requires_grad=True)
        y = fn(x_transposed.permute(2, 1, 0))  # (3, 4, 5), a non-contiguous view
        y.backward(np.ones((3, 4, 5)))
        assert y.shape == (3, 4, 5) and x_transposed.grad.shape == (5, 4, 3), name
        np.testing.assert_array_equal(y.numpy(), contiguous)
    a, b = mt.tensor(x_in), mt.tensor(x_in + 1)
    y = F.swiglu(a.permute(2, 1, 0), b.permute(2, 1, 0))
    np.testing.assert_array_equal(y.numpy(), F.swiglu(a, b).numpy().transpose(2, 1, 0))


def test_nan_goes_through(kernel_set):
    for fn in (lambda t: F.gelu(t, approximate="tanh"), lambda t: F.gelu(t, approximate="none"), F.silu):
        for dtype in (np.float32, np.float64):
            y = fn(mt.tensor(np.array([np.nan, 1.0], dtype=dtype))).numpy()
            assert np.isnan(y[0]) and np.isfinite(y[1])


def test_errors_name_the_op_and_what_was_given():
    with pytest.raises(ValueError, match='gelu: approximate must be "tanh" or "none", got \'erf\''):
        F.gelu(mt.tensor([1.0]), approximate="erf")
    with pytest.raises(ValueError, match=r"swiglu: .*\(2,\) and \(3,\)"):
        F.swiglu(mt.tensor([1.0, 2.0]), mt.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(TypeError, match="silu: expected a float32 or float64 tensor"):
        F.silu(mt.tensor(np.array([1, 2])))


def test_gelu_and_silu_identities():
    x = np.linspace(-6, 6, 101)
    # erf form: x * Φ(x), Φ from math.erf one number at a time
    phi = np.array([0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x])
    np.testing.assert_allclose(F.gelu(mt.tensor(x), approximate="none").numpy(), x * phi, rtol=1e-12, atol=1e-15)
    # the tanh form is within 1e-3 of the exact one
    np.testing.assert_allclose(F.gelu(mt.tensor(x)).numpy(), x * phi, atol=1e-3)
    np.testing.assert_allclose(F.silu(mt.tensor(x)).numpy(), x / (1 + np.exp(-x)), rtol=1e-12)
    big = mt.tensor(np.array([-1e4, 1e4], dtype=np.float32))
    assert np.all(np.isfinite(F.silu(big).numpy())) and np.all(np.isfinite(F.gelu(big).numpy()))
    a, b = randn(4, 3), randn(4, 3, seed=1)
    np.testing.assert_allclose(F.swiglu(mt.tensor(a), mt.tensor(b)).numpy(), silu_reference(a) * b, rtol=1e-12)


# --------------------------------------------------------------------------------- kernels, directly


def tanh_backward_scale(x, other, g):
    return np.abs(g) * gelu_tanh64(x.astype(np.float64))[2]


# name: (readable kernel, its inputs from (x, other, g), how many outputs it writes, the scale of
# its errors from (x, other, g), as in the tests above)
KERNEL_CALLS = {
    "gelu_tanh_forward": (gelu_ops.gelu_tanh_forward, lambda x, other, g: [x], 1, None),
    "gelu_tanh_backward": (gelu_ops.gelu_tanh_backward, lambda x, other, g: [g, x], 1, tanh_backward_scale),
    "gelu_erf_forward": (gelu_ops.gelu_erf_forward, lambda x, other, g: [x], 1, None),
    "gelu_erf_backward": (gelu_ops.gelu_erf_backward, lambda x, other, g: [g, x], 1, None),
    "silu_forward": (silu_ops.silu_forward, lambda x, other, g: [x], 2, None),  # y and σ(x), saved for backward
    "swiglu_forward": (silu_ops.swiglu_forward, lambda x, other, g: [x, other], 1, None),
    "swiglu_backward": (silu_ops.swiglu_backward, lambda x, other, g: [g, x, other], 2, None),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(KERNEL_CALLS))
def test_readable_and_fast_kernels_agree(name, dtype):
    """Same arguments, same outputs (including the arrays forward saves for backward), within
    twice the tolerance each set is held to against the formula."""
    readable_kernel, make_inputs, n_outputs, error_scale = KERNEL_CALLS[name]
    fast_kernel = fast_twin_of(readable_kernel)
    rng = np.random.default_rng(6)
    x = points(rng, dtype)
    other, g = rng.standard_normal(x.shape).astype(dtype), rng.standard_normal(x.shape).astype(dtype)
    inputs = make_inputs(x, other, g)
    scale = 1 if error_scale is None else error_scale(x, other, g)
    results = []
    for kernel in (readable_kernel, fast_kernel):
        outputs = [np.full_like(x, np.nan) for _ in range(n_outputs)]  # every element must be written
        kernel(*inputs, *outputs)
        results.append(outputs)
    eps = np.finfo(dtype).eps
    for readable_out, fast_out in zip(*results):
        assert fast_out.dtype == dtype and np.all(np.isfinite(readable_out))
        assert scaled_error(fast_out, readable_out.astype(np.float64), scale) <= 2 * BACKWARD_EPS * eps


def test_silu_backward_reads_the_saved_sigmoid(kernel_set):
    """Both sets' silu_forward write σ(x), and silu_backward reads it instead of computing an
    exponential: given a σ that is not σ(x), it must use that σ."""
    x = np.array([-2.0, 0.5, 3.0])
    fake_sigmoid = np.array([0.5, 0.5, 0.5])
    grad_x = np.empty_like(x)
    active(silu_ops.silu_backward)(np.ones_like(x), x, fake_sigmoid, grad_x)
    np.testing.assert_allclose(grad_x, 0.5 * (1 + x * 0.5))


def test_readable_tanh_gelu_keeps_its_digits_in_the_left_tail():
    """Far left, 1 + tanh u nears 0, and computed as written it loses its digits (in float32 it is
    exactly 0 below x ≈ -4.6): the readable kernel computes 1/2 (1 + tanh u) as 1 / (1 + e^(-2u)),
    which keeps them. Each y is held to a few eps relative to itself, times 1 + |2u|: e^(-2u)
    magnifies the rounding of u that much, in any evaluation. float32 against float64, whose own
    1 + tanh u keeps 7 digits or more here."""
    dtype = np.float32
    x = np.linspace(-5.5, -3, 101).astype(dtype)
    x64 = x.astype(np.float64)
    u64 = math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)
    expected = 0.5 * x64 * (1 + np.tanh(u64))  # float64: 1 + tanh u is still above 1e-9 here
    y = np.full_like(x, np.nan)
    gelu_ops.gelu_tanh_forward(x, y)
    relative_error = np.abs(y.astype(np.float64) - expected) / np.abs(expected)
    assert np.all(relative_error <= FORWARD_EPS * np.finfo(dtype).eps * (1 + np.abs(2 * u64))), relative_error.max()
