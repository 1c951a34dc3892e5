"""Exercise 7: batched matmul backward. The task is in README.md; write the two TODOs below.

    C = A @ B, one product per batch element t:   C[t] = A[t] B[t]    or, B shared:   C[t] = A[t] B
    dA[t] = dC[t] B[t]ᵀ        dB[t] = A[t]ᵀ dC[t]        B shared:   dB = sum_t A[t]ᵀ dC[t]
"""
import numpy as np

from microtensor.autograd import Function
from microtensor.errors import InputError
from microtensor.kernels import kernel


@kernel
def batched_matmul_forward(a, b, c):
    """c[t] = a[t] @ b[t];  a (Bt, M, K), b (Bt, K, N), c (Bt, M, N):  c_tij = sum_p a_tip b_tpj."""
    Bt, M, K = a.shape
    N = b.shape[2]
    zero = a.dtype.type(0)  # typed: a bare 0.0 would make float32 math float64
    for t in range(Bt):
        for i in range(M):
            for j in range(N):
                total = zero
                for p in range(K):
                    total += a[t, i, p] * b[t, p, j]
                c[t, i, j] = total


@kernel
def shared_matmul_forward(a, b, c):
    """c[t] = a[t] @ b;  a (Bt, M, K), b (K, N) shared by every t, c (Bt, M, N):  c_tij = sum_p a_tip b_pj."""
    Bt, M, K = a.shape
    N = b.shape[1]
    zero = a.dtype.type(0)
    for t in range(Bt):
        for i in range(M):
            for j in range(N):
                total = zero
                for p in range(K):
                    total += a[t, i, p] * b[p, j]
                c[t, i, j] = total


@kernel
def batched_matmul_backward(grad_c, a, b, grad_a, grad_b):
    """From grad_c = dL/dC (Bt, M, N), for c[t] = a[t] @ b[t]:
    grad_a (Bt, M, K) = dC[t] B[t]ᵀ  and  grad_b (Bt, K, N) = A[t]ᵀ dC[t], for every t."""
    # TODO: for every batch element t, write dL/dA[t] = dC[t] B[t]ᵀ into grad_a[t] (M, K) and
    # dL/dB[t] = A[t]ᵀ dC[t] into grad_b[t] (K, N), as loops (each element is one sum; README).
    # Both arrive uninitialized: write every element. Sum in a typed zero, a.dtype.type(0).
    raise NotImplementedError("TODO: batched_matmul_backward (exercise 7)")


@kernel
def shared_matmul_backward(grad_c, a, b, grad_a, grad_b):
    """From grad_c = dL/dC (Bt, M, N), for c[t] = a[t] @ b with b (K, N) shared:
    grad_a (Bt, M, K) = dC[t] Bᵀ for every t, and grad_b (K, N) = sum_t A[t]ᵀ dC[t]."""
    # TODO: write dL/dA[t] = dC[t] Bᵀ into grad_a[t] (M, K) for every t, and dL/dB into grad_b (K, N).
    # b is one matrix that every batch element used, so dL/dB collects a term from each of them
    # (README). Both arrive uninitialized: write every element. Sum in a typed zero.
    raise NotImplementedError("TODO: shared_matmul_backward (exercise 7)")


class BatchedMatMul(Function):
    @staticmethod
    def forward(ctx, a, b):
        Bt, M, _ = a.shape
        N = b.shape[-1]
        a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
        c = np.empty((Bt, M, N), dtype=a.dtype)
        if b.ndim == 3:
            batched_matmul_forward(a, b, c)
        else:
            shared_matmul_forward(a, b, c)
        ctx.save_for_backward(a, b)
        return c

    @staticmethod
    def backward(ctx, grad_c):
        a, b = ctx.saved_tensors
        grad_c = np.ascontiguousarray(grad_c)
        grad_a = np.empty(a.shape, dtype=a.dtype)  # uninitialized: the kernel writes every element
        grad_b = np.empty(b.shape, dtype=b.dtype)
        if b.ndim == 3:
            batched_matmul_backward(grad_c, a, b, grad_a, grad_b)
        else:
            shared_matmul_backward(grad_c, a, b, grad_a, grad_b)
        return grad_a, grad_b


def batched_matmul(a, b):
    """a (Bt, M, K) @ b: b (Bt, K, N), one matrix per batch element, or b (K, N), one matrix
    shared by all of them (a weight). Returns c (Bt, M, N)."""
    if a.ndim != 3 or b.ndim not in (2, 3):
        raise InputError(f"batched_matmul: expected a (Bt, M, K) and b (Bt, K, N) or (K, N), got {a.shape} and {b.shape}")
    if b.shape[-2] != a.shape[2] or (b.ndim == 3 and b.shape[0] != a.shape[0]):
        raise InputError(f"batched_matmul: shapes {a.shape} and {b.shape} do not fit (a (Bt, M, K), b (Bt, K, N) or (K, N))")
    if a.dtype != b.dtype:
        raise InputError(f"batched_matmul: a is {a.dtype} and b is {b.dtype}; expected one float dtype")
    return BatchedMatMul.apply(a, b)
