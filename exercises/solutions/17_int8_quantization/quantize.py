"""Exercise 17: int8 weight quantization. The reference solution.

    s_c  = max_i |W_ic| / 127                   (M,)    one scale per output channel (column) c
    q_ic = round(W_ic / s_c)                    (K, M)  int8 codes in [−127, 127]; 0 where s_c = 0
    Ŵ_ic = s_c q_ic,   |W_ic − Ŵ_ic| <= s_c / 2
    y[n, c] = s_c Σ_i x[n, i] q_ic              the product, dequantized on the fly

Inference only: there is no Function and no backward here (rounding has no useful derivative).
"""
import numpy as np

from microtensor.kernels import kernel

Q_MAX = 127  # int8 codes are symmetric: −127 .. 127 (−128 stays unused)


@kernel
def quantize_columns(w, q, scale):
    """w (K, M) float -> q (K, M) int8 codes and scale (M,) of w's dtype, column by column:
    scale[m] = max_k |w[k, m]| / 127 (divided in w's dtype), then q[k, m] = round(w[k, m] / scale[m])
    with the quotient taken in float64 and rounded by np.rint; an all-zero column gets codes 0."""
    K, M = w.shape
    zero = w.dtype.type(0)
    for m in range(M):
        largest = zero
        for k in range(K):
            largest = max(largest, abs(w[k, m]))
        s = largest / w.dtype.type(Q_MAX)  # the largest weight gets the code ±127
        scale[m] = s
        for k in range(K):
            if s == zero:  # an all-zero column: codes 0, and no division by zero
                q[k, m] = 0
            else:
                q[k, m] = np.rint(np.float64(w[k, m]) / np.float64(s))  # |w / s| <= 127: no clip needed


def quantize(w):
    """A float32 or float64 weight W (K, M), as (q (K, M) int8, scale (M,) of W's dtype)."""
    w = np.ascontiguousarray(w)
    if w.ndim != 2 or w.dtype not in (np.float32, np.float64) or not np.all(np.isfinite(w)):
        raise ValueError(f"quantize: W must be a finite float32 or float64 matrix (K, M), got {w.dtype} {w.shape}")
    q = np.empty(w.shape, dtype=np.int8)  # (K, M)
    scale = np.empty(w.shape[1], dtype=w.dtype)  # (M,)
    quantize_columns(w, q, scale)
    return q, scale


def dequantize(q, scale):
    """Ŵ = q · s (K, M) from q (K, M) int8 and scale (M,): a float array of scale's dtype. For
    inspection and checks: the matmul below never makes it."""
    return q.astype(scale.dtype) * scale[None, :]  # (K, M) * (1, M)


@kernel
def int8_matmul_kernel(x, q, scale, out):
    """out (N, M) = x (N, K) @ Ŵ with Ŵ = q (K, M) int8 times scale (M,) per column:

        out[n, m] = scale[m] · Σ_k x[n, k] q[k, m]

    out has x's dtype; the scale multiplies once per output, after the sum."""
    N, K = x.shape
    M = q.shape[1]
    for n in range(N):
        for m in range(M):
            out[n, m] = 0
        for k in range(K):
            x_nk = x[n, k]
            for m in range(M):
                out[n, m] += x_nk * x.dtype.type(q[k, m])  # the plain sum Σ_k x q, no scale inside
        for m in range(M):
            out[n, m] *= scale[m]  # once per output: the scale comes out of the sum


def int8_matmul(x, q, scale):
    """y = x @ Ŵ (N, M) for x (N, K) float of scale's dtype and the codes q (K, M), scale (M,)."""
    x = np.ascontiguousarray(x)
    if x.ndim != 2 or x.shape[1] != q.shape[0] or x.dtype != scale.dtype:
        raise ValueError(f"int8_matmul: expected x (N, K) of dtype {scale.dtype} with K = {q.shape[0]}, got {x.dtype} {x.shape}")
    out = np.empty((x.shape[0], q.shape[1]), dtype=x.dtype)  # (N, M)
    int8_matmul_kernel(x, q, scale, out)
    return out
