"""The fast twins of layer_norm's kernels (microtensor/ops/layer_norm.py): the readable loops, with
the rows shared among the threads.

- layer_norm_forward, layer_norm_backward_input: each row is normalized on its own, so the rows
  run in parallel (`prange`); compiled with REDUCE_FASTMATH, which lets the compiler add a row's
  sums in any order, so that they vectorize (the readable kernels add them in the order written,
  one number at a time).
- layer_norm_backward_params: every row adds into the same C sums, so the rows are cut into one
  band per thread, each thread sums its band into a row of partial sums of its own, and the bands'
  sums are added in band order at the end (the order of the additions changes, not what is added).

Why two threads for so little arithmetic: a LayerNorm does a few operations per number it reads,
so its time is the time to bring the rows in from memory (or from the cache of the core whose kernel
wrote them), and one core alone cannot draw all of the memory bandwidth (on many-core server chips it
gets well under half). Two cores reading half the rows each take about half the time.

Why not always: rows that give each thread fewer than a page of numbers (`worth_sharing`,
memory.py's rule for every elementwise kernel), such as the one row of a token being generated, cost
less than waking a second thread. Those run the same loop compiled without threads (`*_serial`).
"""
import numpy as np
from numba import prange

from ..kernels import fast_twin, kernel
from ..ops import layer_norm as readable
from .memory import pool_size, worth_sharing
from .vector_math import REDUCE_FASTMATH


@kernel(parallel=True, fastmath=REDUCE_FASTMATH)
def layer_norm_forward_in_parallel(x, weight, bias, eps, y, mean, rstd):
    """x (N, C), weight (C,), bias (C,) -> y (N, C); saves mean (N,) and rstd (N,); rows in parallel."""
    N, C = x.shape
    zero, one, count = x.dtype.type(0), x.dtype.type(1), x.dtype.type(C)  # typed: no float64 creeps in
    for n in prange(N):
        total = zero
        for c in range(C):
            total += x[n, c]
        m = total / count
        squares = zero
        for c in range(C):
            squares += (x[n, c] - m) * (x[n, c] - m)
        r = one / np.sqrt(squares / count + eps)
        for c in range(C):
            y[n, c] = (x[n, c] - m) * r * weight[c] + bias[c]
        mean[n] = m
        rstd[n] = r


@kernel(parallel=True, fastmath=REDUCE_FASTMATH)
def layer_norm_backward_input_in_parallel(grad_out, x, weight, mean, rstd, grad_x):
    """grad_x (N, C) = rstd (d - mean(d) - xhat mean(d xhat)), d = grad_out * weight; rows in parallel."""
    N, C = x.shape
    zero, count = x.dtype.type(0), x.dtype.type(C)
    for n in prange(N):
        m, r = mean[n], rstd[n]
        d_sum = zero
        d_xhat_sum = zero
        for c in range(C):
            d = grad_out[n, c] * weight[c]
            d_sum += d
            d_xhat_sum += d * (x[n, c] - m) * r
        d_mean = d_sum / count
        d_xhat_mean = d_xhat_sum / count
        for c in range(C):
            xhat = (x[n, c] - m) * r
            grad_x[n, c] = r * (grad_out[n, c] * weight[c] - d_mean - xhat * d_xhat_mean)


# The same loops compiled without threads: `prange` runs as `range`.
layer_norm_forward_serial = kernel(fastmath=REDUCE_FASTMATH, tag="serial")(layer_norm_forward_in_parallel)
layer_norm_backward_input_serial = kernel(fastmath=REDUCE_FASTMATH, tag="serial")(layer_norm_backward_input_in_parallel)


@kernel(parallel=True, fastmath=REDUCE_FASTMATH)
def layer_norm_backward_params_in_bands(grad_out, x, mean, rstd, grad_weight, grad_bias, partial_weight, partial_bias):
    """grad_weight (C,) = sum over rows of grad_out * xhat, grad_bias (C,) = sum of grad_out, the rows
    in one band per row of partial_weight and partial_bias (bands, C), added in band order at the end."""
    N, C = x.shape
    bands = partial_weight.shape[0]
    for band in prange(bands):
        for c in range(C):
            partial_weight[band, c] = 0
            partial_bias[band, c] = 0
        for n in range(N * band // bands, N * (band + 1) // bands):
            m, r = mean[n], rstd[n]
            for c in range(C):
                partial_weight[band, c] += grad_out[n, c] * (x[n, c] - m) * r
                partial_bias[band, c] += grad_out[n, c]
    for c in range(C):
        grad_weight[c] = partial_weight[0, c]
        grad_bias[c] = partial_bias[0, c]
    for band in range(1, bands):
        for c in range(C):
            grad_weight[c] += partial_weight[band, c]
            grad_bias[c] += partial_bias[band, c]


@fast_twin(readable.layer_norm_backward_params)
def layer_norm_backward_params(grad_out, x, mean, rstd, grad_weight, grad_bias):
    if not worth_sharing(x.size):
        return readable.layer_norm_backward_params(grad_out, x, mean, rstd, grad_weight, grad_bias)
    bands = pool_size()  # one per thread of the pool
    partial_weight, partial_bias = (np.empty((bands, x.shape[1]), dtype=x.dtype) for _ in range(2))
    layer_norm_backward_params_in_bands(grad_out, x, mean, rstd, grad_weight, grad_bias, partial_weight, partial_bias)


@fast_twin(readable.layer_norm_forward)
def layer_norm_forward(x, weight, bias, eps, y, mean, rstd):
    forward = layer_norm_forward_in_parallel if worth_sharing(x.size) else layer_norm_forward_serial
    forward(x, weight, bias, eps, y, mean, rstd)


@fast_twin(readable.layer_norm_backward_input)
def layer_norm_backward_input(grad_out, x, weight, mean, rstd, grad_x):
    backward = layer_norm_backward_input_in_parallel if worth_sharing(x.size) else layer_norm_backward_input_serial
    backward(grad_out, x, weight, mean, rstd, grad_x)
