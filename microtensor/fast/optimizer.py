"""The fast twins of the optimizers' update kernels (microtensor/optim.py): the same loop, its
elements shared among the threads.

An update reads and writes each element of four or five arrays once (the weights, the gradient,
Adam's two running means) and does a dozen operations on it, so its time is the time to move those
arrays through memory; and one core alone cannot draw all of a chip's memory bandwidth (on
many-core server chips it gets well under half). Each thread updates one contiguous band of
elements (`prange` hands them out so) with the readable kernel's arithmetic, so the result is the
readable kernel's bit for bit (no fastmath: fused multiply-adds would change the last bit).

An array too small to give every thread a page of elements (memory.py's `worth_sharing`: a
LayerNorm's weight, a bias) is updated on the calling thread by the readable kernel: waking the
other threads would cost more than the share they take over.
"""
import numpy as np
from numba import prange

from .. import optim as readable
from ..kernels import fast_twin, kernel
from .memory import worth_sharing


@kernel(parallel=True)
def sgd_update_in_parallel(param, grad, momentum_buffer, lr, momentum, weight_decay):
    """optim.sgd_update, its elements shared among the threads."""
    for i in prange(param.shape[0]):
        g = grad[i] + weight_decay * param[i]
        momentum_buffer[i] = momentum * momentum_buffer[i] + g
        param[i] -= lr * momentum_buffer[i]


@kernel(parallel=True)
def adamw_update_in_parallel(param, grad, m, v, lr, beta1, beta2, eps, weight_decay, l2, bias_correction1, bias_correction2):
    """optim.adamw_update, its elements shared among the threads."""
    one = param.dtype.type(1)
    for i in prange(param.shape[0]):
        g = grad[i] + l2 * param[i]
        m[i] = beta1 * m[i] + (one - beta1) * g
        v[i] = beta2 * v[i] + (one - beta2) * g * g
        m_hat = m[i] / bias_correction1
        v_hat = v[i] / bias_correction2
        param[i] -= lr * (m_hat / (np.sqrt(v_hat) + eps) + weight_decay * param[i])


@fast_twin(readable.sgd_update)
def sgd_update(param, grad, momentum_buffer, lr, momentum, weight_decay):
    update = sgd_update_in_parallel if worth_sharing(param.shape[0]) else readable.sgd_update
    update(param, grad, momentum_buffer, lr, momentum, weight_decay)


@fast_twin(readable.adamw_update)
def adamw_update(param, grad, m, v, lr, beta1, beta2, eps, weight_decay, l2, bias_correction1, bias_correction2):
    update = adamw_update_in_parallel if worth_sharing(param.shape[0]) else readable.adamw_update
    update(param, grad, m, v, lr, beta1, beta2, eps, weight_decay, l2, bias_correction1, bias_correction2)
