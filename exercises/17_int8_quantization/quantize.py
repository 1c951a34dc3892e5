"""Exercise 17: int8 weight quantization. The task is in README.md; write the TODOs below.

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
    # TODO: for each column m: its largest |w[k, m]| (start from w.dtype.type(0)); s = largest /
    # w.dtype.type(Q_MAX); scale[m] = s; then for each k: q[k, m] = 0 if s is 0 (no division by
    # zero), else np.rint(np.float64(w[k, m]) / np.float64(s)).
    raise NotImplementedError("TODO: quantize_columns (exercise 17)")


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
    # TODO: each column c of q times scale[c] (numpy broadcasting), in scale's dtype.
    raise NotImplementedError("TODO: dequantize (exercise 17)")


@kernel
def int8_matmul_kernel(x, q, scale, out):
    """out (N, M) = x (N, K) @ Ŵ with Ŵ = q (K, M) int8 times scale (M,) per column:

        out[n, m] = scale[m] · Σ_k x[n, k] q[k, m]

    out has x's dtype; the scale multiplies once per output, after the sum."""
    # TODO: for each row n: set out[n, :] to 0; for each k, add x[n, k] * q[k, m] into out[n, m]
    # for every m (loop order n, k, m: q is read along its rows); then multiply out[n, m] by scale[m].
    # x.dtype.type(q[k, m]) makes the code's type explicit (float32 × int8 is float32 already).
    raise NotImplementedError("TODO: int8_matmul_kernel (exercise 17)")


def int8_matmul(x, q, scale):
    """y = x @ Ŵ (N, M) for x (N, K) float of scale's dtype and the codes q (K, M), scale (M,)."""
    x = np.ascontiguousarray(x)
    if x.ndim != 2 or x.shape[1] != q.shape[0] or x.dtype != scale.dtype:
        raise ValueError(f"int8_matmul: expected x (N, K) of dtype {scale.dtype} with K = {q.shape[0]}, got {x.dtype} {x.shape}")
    out = np.empty((x.shape[0], q.shape[1]), dtype=x.dtype)  # (N, M)
    int8_matmul_kernel(x, q, scale, out)
    return out
