"""The fast twins of microtensor/ops/gelu.py: the same loops, with tanh, erf and e^t taken from
vector_math.py instead of the C library.

Why: the readable kernels call the C library's tanh, erf and exp once per element, and a loop that
makes a call per element cannot use the CPU's vector instructions; vector_math's versions are plain
arithmetic that Numba inlines, so each loop below handles several elements per instruction.
Arguments, results and saved arrays are those of the readable kernels (x, y, grad_out, grad_x: (N,)).
"""
from numba import prange

from ..kernels import fast_twin, kernel
from ..ops import gelu as readable
from ..ops.gelu import CUBIC, INV_SQRT_2, INV_SQRT_2PI, SQRT_2_OVER_PI
from .vector_math import erf, exp_of_nonpositive, tanh


@fast_twin(readable.gelu_tanh_forward)
@kernel(parallel=True)
def gelu_tanh_forward(x, y):
    """y = x/2 (1 + tanh u), u = k (x + a x³), with vector_math's tanh so that the loop vectorizes."""
    real = x.dtype.type
    half, one, k, a = real(0.5), real(1), real(SQRT_2_OVER_PI), real(CUBIC)
    for i in prange(x.shape[0]):
        xi = x[i]
        y[i] = half * xi * (one + tanh(k * (xi + a * xi * xi * xi)))


@fast_twin(readable.gelu_tanh_backward)
@kernel(parallel=True)
def gelu_tanh_backward(grad_out, x, grad_x):
    """grad_x = grad_out * dy/dx, with vector_math's tanh so that the loop vectorizes."""
    real = x.dtype.type
    half, one, three, k, a = real(0.5), real(1), real(3), real(SQRT_2_OVER_PI), real(CUBIC)
    for i in prange(x.shape[0]):
        xi = x[i]
        t = tanh(k * (xi + a * xi * xi * xi))
        dy_dx = half * (one + t) + half * xi * (one - t * t) * k * (one + three * a * xi * xi)
        grad_x[i] = grad_out[i] * dy_dx


@fast_twin(readable.gelu_erf_forward)
@kernel(parallel=True)
def gelu_erf_forward(x, y):
    """y = x/2 (1 + erf(x/√2)), with vector_math's erf: branch-free in float32, so the loop vectorizes."""
    real = x.dtype.type
    half, one, inv_sqrt_2 = real(0.5), real(1), real(INV_SQRT_2)
    for i in prange(x.shape[0]):
        xi = x[i]
        y[i] = half * xi * (one + erf(xi * inv_sqrt_2))


@fast_twin(readable.gelu_erf_backward)
@kernel(parallel=True)
def gelu_erf_backward(grad_out, x, grad_x):
    """grad_x = grad_out * (Φ(x) + x φ(x)), with vector_math's erf and e^t so that the loop vectorizes."""
    real = x.dtype.type
    half, one, inv_sqrt_2, inv_sqrt_2pi = real(0.5), real(1), real(INV_SQRT_2), real(INV_SQRT_2PI)
    for i in prange(x.shape[0]):
        xi = x[i]
        cdf = half * (one + erf(xi * inv_sqrt_2))
        pdf = inv_sqrt_2pi * exp_of_nonpositive(-half * xi * xi)
        grad_x[i] = grad_out[i] * (cdf + xi * pdf)
