"""The fast twins of layer_norm's kernels (microtensor/ops/layer_norm.py): the readable loops, with
the rows shared among the threads.

- layer_norm_forward, layer_norm_backward_input: each row is normalized on its own, so the rows
  run in parallel (`prange`); compiled with REDUCE_FASTMATH, which lets the compiler add a row's
  sums in any order, so that they vectorize (the readable kernels add them in the order written,
  one number at a time).
- layer_norm_backward_params has no twin: every row adds into the same C sums, and its loop already
  vectorizes across the columns in the order written.

Why two threads for so little arithmetic: a LayerNorm does a few operations per number it reads,
so its time is the time to bring the rows in from memory (or from the cache of the core whose kernel
wrote them), and one core alone cannot draw all of the memory bandwidth (on many-core server chips it
gets well under half). Two cores reading half the rows each take about half the time.

Why not always: rows that give each thread fewer than a page of numbers (`MIN_ELEMENTS_PER_THREAD`,
memory.py's rule for every elementwise kernel), such as the one row of a token being generated, cost
less than waking a second thread. Those run the same loop compiled without threads (`*_serial`).
"""
import numba
import numpy as np
from numba import prange

from ..kernels import fast_twin, kernel
from ..ops import layer_norm as readable
from .memory import MIN_ELEMENTS_PER_THREAD
from .vector_math import REDUCE_FASTMATH


def _worth_sharing(x):
    return x.size >= MIN_ELEMENTS_PER_THREAD * numba.get_num_threads()


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


@fast_twin(readable.layer_norm_forward)
def layer_norm_forward(x, weight, bias, eps, y, mean, rstd):
    forward = layer_norm_forward_in_parallel if _worth_sharing(x) else layer_norm_forward_serial
    forward(x, weight, bias, eps, y, mean, rstd)


@fast_twin(readable.layer_norm_backward_input)
def layer_norm_backward_input(grad_out, x, weight, mean, rstd, grad_x):
    backward = layer_norm_backward_input_in_parallel if _worth_sharing(x) else layer_norm_backward_input_serial
    backward(grad_out, x, weight, mean, rstd, grad_x)
