"""GELU, the Gaussian error linear unit: y = x Φ(x), with Φ the standard normal CDF.

Two forms, as in PyTorch:

    approximate="none":  y = x Φ(x) = x/2 (1 + erf(x / √2))
        dy/dx = Φ(x) + x φ(x),        φ(x) = e^(-x²/2) / √(2π)   (product rule; Φ' = φ)

    approximate="tanh":  y = x/2 (1 + tanh u),   u = k (x + a x³),  k = √(2/π),  a = 0.044715
        dy/dx = 1/2 (1 + tanh u) + x/2 (1 - tanh² u) k (1 + 3 a x²)   (tanh' = 1 - tanh²)

Elementwise, so backward is dL/dx = g * dy/dx. The kernels run over a flat view; backward
recomputes dy/dx from the saved input instead of saving intermediates. Constants are passed in
the input's dtype so that float32 math stays float32. tanh and e^t come from vector_math.py,
written so that the loop vectorizes (the C library's tanh, one number at a time, made the tanh form
~10x slower).

erf is written here for the same reason, in two versions chosen by the float type when numba
compiles (`erf` below; the plain Python version makes the same choice, so NUMBA_DISABLE_JIT=1 runs
the same arithmetic):

    float32 (training): one rational function, erf a ~ a P(a²)/Q(a²) with a = min(|x|, 3.92),
        no branches, so the loop vectorizes; within 3 × float32's eps of math.erf.
    float64 (gradient checks, tests): fdlibm's four-interval method, within 1 ulp of math.erf, so
        that float64 results agree with PyTorch's to 1e-12; its branches keep the loop scalar.

Measured on a 2-core Xeon VM, 768 x 512 float32, forward on one thread: the C library's erf one
number at a time ~2.2 ms (on 2 threads); the rational form ~190 µs, about as fast as the erf
form's neighbour SiLU, whose e^t costs more than a rational function's 10 multiply-adds and one
division.
"""
import math

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from ..autograd import Function
from ..gradcheck import gradcheck_case
from .checks import check_float
from .vector_math import exp_of_nonpositive, tanh

SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
INV_SQRT_2 = 1 / math.sqrt(2)
INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)
CUBIC = 0.044715


def gelu_reference(x, approximate="tanh"):
    """Plain numpy GELU (the test oracle); the erf form through math.erf, one number at a time."""
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(SQRT_2_OVER_PI * (x + CUBIC * x**3)))
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1 + erf(x * INV_SQRT_2))


@njit(cache=True, parallel=True, error_model="numpy")
def gelu_tanh_forward(x, y, half, k, cubic):
    one = x.dtype.type(1)  # a bare 1 would make float32 math float64
    for i in prange(x.shape[0]):
        xi = x[i]
        y[i] = half * xi * (one + tanh(k * (xi + cubic * xi * xi * xi)))


@njit(cache=True, parallel=True, error_model="numpy")
def gelu_tanh_backward(grad_out, x, grad_x, half, k, cubic):
    one, three = x.dtype.type(1), x.dtype.type(3)
    for i in prange(x.shape[0]):
        xi = x[i]
        t = tanh(k * (xi + cubic * xi * xi * xi))
        dy_dx = half * (one + t) + half * xi * (one - t * t) * k * (one + three * cubic * xi * xi)
        grad_x[i] = grad_out[i] * dy_dx


@njit(error_model="numpy", fastmath={"contract"})
def erf_float32(x):
    """erf x in float32: a = min(|x|, 3.92), erf = sign(x) a P(a²) / Q(a²), P and Q of degree 5.

    Branch-free, so that the loops calling it vectorize. P/Q is a rational fit of erf(a)/a in a²,
    made for this file (minimax in relative error on [0, 3.92], error 2e-8 before rounding);
    above 3.92, erf rounds to 1 in float32. Measured error against math.erf: below 4e-7 absolute and
    3 × float32's eps relative (tests/test_activations.py).
    """
    real = type(x)
    a = abs(x)
    a = real(3.92) if a > real(3.92) else a  # a NaN fails the test and stays NaN
    z = a * a
    p = real(2.050009009915606e-06)
    p = p * z + real(0.00028487772882269995)
    p = p * z + real(0.0037656276933324424)
    p = p * z + real(0.05274872319333557)
    p = p * z + real(0.19040743174367022)
    p = p * z + real(1.1283791461432506)  # 2/√π: erf a ~ 2a/√π near 0
    q = real(3.809064657959585e-05)
    q = q * z + real(0.001162528665687633)
    q = q * z + real(0.014969236605558744)
    q = q * z + real(0.11410939624193382)
    q = q * z + real(0.5020769338682672)
    q = q * z + real(1)
    y = a * p / q
    y = real(1) if y > real(1) else y
    return y if x >= real(0) else -y


@njit(error_model="numpy")
def erf_float64(x):
    """erf x in float64, to within 1 ulp: fdlibm's method (s_erf.c, Sun Microsystems 1993, freely
    distributable), four intervals of |x|, each with its own rational approximation:

        |x| < 0.84375:       erf x = x + x P(x²)/Q(x²)
        0.84375 <= |x| < 1.25:  erf x = c + P(s)/Q(s),   s = |x| - 1,  c = 0.845062911510467529297
        1.25 <= |x| < 6:     erf x = 1 - erfc x,   erfc x = e^(-x² - 0.5625 + R(1/x²)/S(1/x²)) / |x|
                             (one R/S up to 1/0.35, another above)
        6 <= |x|:            erf x = 1 (erfc 6 ~ 2e-17, below half an ulp of 1)

    with the sign of x. The coefficients are fdlibm's. fdlibm splits x² in two parts to keep erfc
    accurate to the last bit; erf needs only 1 - erfc, and erfc < 0.08 here, so the rounding of x²
    (relative error x² × 1.1e-16 in erfc) moves erf by less than a fifth of an ulp.

    The branches keep a loop over float64 from vectorizing; float64 is for gradient checks and
    tests, where exactness matters more than speed.
    """
    real = type(x)
    a = abs(x)
    if a != a:  # NaN
        return x
    if a < real(0.84375):
        z = x * x
        p = real(1.28379167095512558561e-01) + z * (real(-3.25042107247001499370e-01) + z * (
            real(-2.84817495755985104766e-02) + z * (real(-5.77027029648944159157e-03) + z * real(-2.37630166566501626084e-05))))
        q = real(1) + z * (real(3.97917223959155352819e-01) + z * (real(6.50222499887672944485e-02) + z * (
            real(5.08130628187576562776e-03) + z * (real(1.32494738004321644526e-04) + z * real(-3.96022827877536812320e-06)))))
        return x + x * (p / q)
    if a < real(1.25):
        s = a - real(1)
        p = real(-2.36211856075265944077e-03) + s * (real(4.14856118683748331666e-01) + s * (
            real(-3.72207876035701323847e-01) + s * (real(3.18346619901161753674e-01) + s * (
                real(-1.10894694282396677476e-01) + s * (real(3.54783043256182359371e-02) + s * real(-2.16637559486879084300e-03))))))
        q = real(1) + s * (real(1.06420880400844228286e-01) + s * (real(5.40397917702171048937e-01) + s * (
            real(7.18286544141962662868e-02) + s * (real(1.26171219808761642112e-01) + s * (
                real(1.36370839120290507362e-02) + s * real(1.19844998467991074170e-02))))))
        y = real(8.45062911510467529297e-01) + p / q
    elif a < real(6):
        s = real(1) / (a * a)
        if a < real(1 / 0.35):
            r = real(-9.86494403484714822705e-03) + s * (real(-6.93858572707181764372e-01) + s * (
                real(-1.05586262253232909814e+01) + s * (real(-6.23753324503260060396e+01) + s * (
                    real(-1.62396669462573470355e+02) + s * (real(-1.84605092906711035994e+02) + s * (
                        real(-8.12874355063065934246e+01) + s * real(-9.81432934416914548592e+00)))))))
            q = real(1) + s * (real(1.96512716674392571292e+01) + s * (real(1.37657754143519042600e+02) + s * (
                real(4.34565877475229228821e+02) + s * (real(6.45387271733267880336e+02) + s * (
                    real(4.29008140027567833386e+02) + s * (real(1.08635005541779435134e+02) + s * (
                        real(6.57024977031928170135e+00) + s * real(-6.04244152148580987438e-02))))))))
        else:
            r = real(-9.86494292470009928597e-03) + s * (real(-7.99283237680523006574e-01) + s * (
                real(-1.77579549177547519889e+01) + s * (real(-1.60636384855821916062e+02) + s * (
                    real(-6.37566443368389627722e+02) + s * (real(-1.02509513161107724954e+03) + s * real(-4.83519191608651397019e+02))))))
            q = real(1) + s * (real(3.03380607434824582924e+01) + s * (real(3.25792512996573918826e+02) + s * (
                real(1.53672958608443695994e+03) + s * (real(3.19985821950859553908e+03) + s * (
                    real(2.55305040643316442583e+03) + s * (real(4.74528541206955367215e+02) + s * real(-2.24409524465858183362e+01)))))))
        y = real(1) - exp_of_nonpositive(-a * a - real(0.5625) + r / q) / a
    else:
        y = real(1)
    return y if x >= real(0) else -y


def erf(x):
    """erf x in x's float type: erf_float32 for float32 (fast, vectorizes, ~3 eps), erf_float64 for
    float64 (exact to 1 ulp, one number at a time). This plain version runs under
    NUMBA_DISABLE_JIT=1; compiled code uses the overload below, which makes the same choice once,
    when it compiles, from x's type."""
    return erf_float32(x) if isinstance(x, np.float32) else erf_float64(x)


@overload(erf)
def _erf_by_type(x):
    if x == types.float32:
        return lambda x: erf_float32(x)
    return lambda x: erf_float64(x)


@njit(cache=True, parallel=True, error_model="numpy")
def gelu_erf_forward(x, y, half, inv_sqrt_2):
    one = x.dtype.type(1)
    for i in prange(x.shape[0]):
        xi = x[i]
        y[i] = half * xi * (one + erf(xi * inv_sqrt_2))


@njit(cache=True, parallel=True, error_model="numpy")
def gelu_erf_backward(grad_out, x, grad_x, half, inv_sqrt_2, inv_sqrt_2pi):
    one = x.dtype.type(1)
    for i in prange(x.shape[0]):
        xi = x[i]
        cdf = half * (one + erf(xi * inv_sqrt_2))
        pdf = inv_sqrt_2pi * exp_of_nonpositive(-half * xi * xi)
        grad_x[i] = grad_out[i] * (cdf + xi * pdf)


class GELU(Function):
    @staticmethod
    def forward(ctx, x, approximate):
        flat = np.ascontiguousarray(x).reshape(-1)
        y = np.empty_like(flat)
        t = x.dtype.type
        if approximate == "tanh":
            gelu_tanh_forward(flat, y, t(0.5), t(SQRT_2_OVER_PI), t(CUBIC))
        else:
            gelu_erf_forward(flat, y, t(0.5), t(INV_SQRT_2))
        ctx.save_for_backward(flat)
        ctx.approximate, ctx.shape = approximate, x.shape
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, grad_out):
        (flat,) = ctx.saved_tensors
        g = np.ascontiguousarray(grad_out).reshape(-1)
        grad_x = np.empty_like(flat)
        t = flat.dtype.type
        if ctx.approximate == "tanh":
            gelu_tanh_backward(g, flat, grad_x, t(0.5), t(SQRT_2_OVER_PI), t(CUBIC))
        else:
            gelu_erf_backward(g, flat, grad_x, t(0.5), t(INV_SQRT_2), t(INV_SQRT_2PI))
        return grad_x.reshape(ctx.shape), None


def gelu(x, approximate="tanh"):
    check_float("gelu", x)
    if approximate not in ("tanh", "none"):
        raise ValueError(f'gelu: approximate must be "tanh" or "none", got {approximate!r}')
    return GELU.apply(x, approximate)


@gradcheck_case(GELU)
def _gelu_case(draw):
    x = draw.tensor(draw.shape(), -4.0, 4.0)
    approximate = draw.choice(("tanh", "none"))
    return (lambda x: gelu(x, approximate)), (x,)
