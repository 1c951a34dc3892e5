"""Exercise 9: AdamW with bias correction, warmup and cosine decay. The reference solution.

    m = β1 m + (1 − β1) g            v = β2 v + (1 − β2) g²
    m̂ = m / (1 − β1^t)              v̂ = v / (1 − β2^t)
    θ = θ − lr (m̂ / (√v̂ + ε) + λ θ)

An optimizer has no backward: it is numpy code that changes the weights in place, once a step.
"""
import math

import numpy as np


def adamw_update(param, grad, m, v, t, lr, beta1, beta2, eps, weight_decay):
    """One AdamW step for one parameter, IN PLACE: param, m and v are changed, nothing is returned.

    param, grad, m, v: numpy arrays of one shape and one dtype (float32 or float64); m and v are
    this parameter's running means, zeros before the first step. t: the step number, 1 for the
    first step. lr, beta1, beta2, eps, weight_decay: Python floats."""
    m[...] = beta1 * m + (1 - beta1) * grad  # running mean of the gradient, in place
    v[...] = beta2 * v + (1 - beta2) * grad * grad  # running mean of its square
    m_hat = m / (1 - beta1**t)  # bias correction: m and v started at 0
    v_hat = v / (1 - beta2**t)
    param -= lr * (m_hat / (np.sqrt(v_hat) + eps) + weight_decay * param)  # the right side uses the old param


class AdamW:
    """AdamW over a list of numpy arrays, each updated in place by `step(grads)`. Every array given
    is decayed (a model that spares its biases and norm weights gives those to a second AdamW with
    weight_decay=0). Set `optimizer.lr` before a step to follow a schedule."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        self.params = list(params)  # numpy float arrays, changed in place
        self.lr, self.eps, self.weight_decay = lr, eps, weight_decay
        self.beta1, self.beta2 = betas
        self.t = 0  # steps taken so far
        self.m = [np.zeros_like(p) for p in self.params]  # running mean of each gradient
        self.v = [np.zeros_like(p) for p in self.params]  # running mean of its square

    def step(self, grads):
        """One step: grads[i] is the gradient of params[i] (same shape and dtype)."""
        self.t += 1  # t counts from 1: the bias corrections 1 - beta^t are then never 0
        for param, grad, m, v in zip(self.params, grads, self.m, self.v):
            adamw_update(param, grad, m, v, self.t, self.lr, self.beta1, self.beta2, self.eps, self.weight_decay)


def learning_rate_at(step, max_lr, min_lr, warmup_iters, lr_decay_iters):
    """The learning rate at `step` (counted from 0): a linear warmup, then a cosine decay to min_lr.

        step < warmup_iters:                     lr = max_lr (step + 1) / (warmup_iters + 1)
        warmup_iters <= step <= lr_decay_iters:  r  = (step - warmup_iters) / (lr_decay_iters - warmup_iters)
                                                 lr = min_lr + (1 + cos(π r)) / 2 · (max_lr - min_lr)
        step > lr_decay_iters:                   lr = min_lr

    Integers step, warmup_iters <= lr_decay_iters; floats max_lr, min_lr. Returns a Python float."""
    if step < warmup_iters:
        return max_lr * (step + 1) / (warmup_iters + 1)
    if step > lr_decay_iters or lr_decay_iters == warmup_iters:
        return min_lr
    r = (step - warmup_iters) / (lr_decay_iters - warmup_iters)  # 0 at the end of the warmup, 1 at the end
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * r)) * (max_lr - min_lr)
