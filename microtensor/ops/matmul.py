"""Matrix multiplication (minimal BLAS version; the Numba kernel and the backend switch come next)."""
import numpy as np

from ..autograd import Function, unbroadcast
from ..gradcheck import gradcheck_case
from ..tensor import Tensor
from .checks import check_float


class MatMul(Function):
    """C = A @ B.   dL/dA = dC @ B^T,  dL/dB = A^T @ dC (batch dims unbroadcast)."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return np.matmul(a, b)

    @staticmethod
    def backward(ctx, grad_out):
        a, b = ctx.saved_tensors
        grad_a = unbroadcast(np.matmul(grad_out, np.swapaxes(b, -1, -2)), a.shape) if ctx.needs_input_grad[0] else None
        grad_b = unbroadcast(np.matmul(np.swapaxes(a, -1, -2), grad_out), b.shape) if ctx.needs_input_grad[1] else None
        return grad_a, grad_b


def matmul(a, b):
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError("matmul: expected two Tensors")
    check_float("matmul", a, b)
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul: cannot multiply {a.shape} by {b.shape}")
    return MatMul.apply(a, b)


@gradcheck_case(MatMul)
def _matmul_case(draw):
    n, k, m = draw.integer(1, 4), draw.integer(1, 4), draw.integer(1, 4)
    return matmul, (draw.tensor((n, k)), draw.tensor((k, m)))
