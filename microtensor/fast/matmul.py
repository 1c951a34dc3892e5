"""The fast twins of matmul's kernels (microtensor/ops/matmul.py): the same arguments, the same results.

- matmul_forward(a, b, c): c = a @ b by BLAS, the rows of c cut into one slice per Numba thread,
  each slice one gemm call (fast/blas.py). BLAS blocks the product for the caches and keeps
  partial sums in vector registers, which the readable three loops do not; the slices run on
  Numba's threads so that products and kernels share one pool.
- matmul_backward(grad, a, b, grad_a, grad_b): dA = g Bᵀ and dB = Aᵀ g by BLAS, both products
  in ONE parallel call, each on its share of the threads, so that the threads meet once per
  backward instead of twice. Bᵀ and Aᵀ are views: BLAS reads a transposed matrix through its
  transpose flag, without a copy.

Where numpy's BLAS cannot be called from compiled code (`blas.available()` is False), both call
np.matmul: numpy's own BLAS, whatever it is, is still far faster than loops.
"""
import numpy as np

from ..kernels import fast_twin
from ..ops import matmul as readable
from . import blas


@fast_twin(readable.matmul_forward)
def matmul_forward(a, b, c):
    """c (n, m) = a (n, k) @ b (k, m), written into c; any strides."""
    if not blas.available():
        np.matmul(a, b, out=c)
        return
    blas.multiply_into((a, b, c))


@fast_twin(readable.matmul_backward)
def matmul_backward(grad, a, b, grad_a, grad_b):
    """grad_a (n, k) = grad (n, m) @ bᵀ and grad_b (k, m) = aᵀ @ grad, written in place; either
    output may be None (not needed)."""
    products = []
    if grad_a is not None:
        products.append((grad, b.T, grad_a))  # dA = g Bᵀ
    if grad_b is not None:
        products.append((a.T, grad, grad_b))  # dB = Aᵀ g
    if not blas.available():
        for x, y, out in products:
            np.matmul(x, y, out=out)
        return
    if products:
        blas.multiply_into(*products)
