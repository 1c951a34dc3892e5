"""Exercise 18: a mixture-of-experts router and its load-balancing loss. The reference solution.

    p       = softmax(x W_r)                               (N, E)   router probabilities
    experts = each row's k largest p, largest first         (N, k)   integers: no gradient
    gates   = the chosen p divided by their sum (k >= 2)   (N, k)   the chosen p itself when k = 1
    aux     = E · sum_e f_e P_e,   f_e = slots of e / (N k) (a constant),   P_e = mean_n p[n, e]

Routing is numpy-level code: a selection, a small Function whose backward goes through the
renormalization, and a loss built from ops.
"""
import numpy as np

import microtensor as mt
import microtensor.functional as F
from microtensor.autograd import Function


def top_k_experts(probs, k):
    """The k most probable experts of each row of probs (N, E), a float numpy array: (N, k) int64,
    the most probable first; two equal probabilities go in order of expert number, lower first."""
    order = np.argsort(-probs, axis=1, kind="stable")  # (N, E): a stable sort keeps equal values in index order
    return np.ascontiguousarray(order[:, :k], dtype=np.int64)


class TopKGates(Function):
    """gates[n, j] = probs[n, experts[n, j]] / s_n,  s_n = sum_j probs[n, experts[n, j]]."""

    @staticmethod
    def forward(ctx, probs, experts):
        picked = np.take_along_axis(probs, experts, axis=1)  # (N, k): q[n, j] = probs[n, experts[n, j]]
        sums = picked.sum(axis=1)  # (N,): s_n
        gates = picked / sums[:, None]  # (N, k)
        ctx.save_for_backward(experts, gates, sums)
        ctx.probs_shape = probs.shape
        return gates

    @staticmethod
    def backward(ctx, grad_out):
        experts, gates, sums = ctx.saved_tensors
        # dL/dq_i = (g_i - <g, gates>) / s, one row at a time: (N, k)
        dot = np.sum(grad_out * gates, axis=1, keepdims=True)  # (N, 1)
        grad_picked = (grad_out - dot) / sums[:, None]  # (N, k)
        # each chosen probability gets its slot's gradient; the experts not chosen get 0
        grad_probs = np.zeros(ctx.probs_shape, dtype=grad_out.dtype)  # (N, E)
        np.put_along_axis(grad_probs, experts, grad_picked, axis=1)  # the k experts of a row are distinct
        return grad_probs, None


def route(x, router_weight, k):
    """Route the tokens x (N, C) with router_weight (C, E) to k experts each.
    Returns (experts (N, k) int64 array, gates (N, k) Tensor, probs (N, E) Tensor)."""
    probs = F.softmax(x @ router_weight, dim=-1)  # (N, E)
    experts = top_k_experts(probs.data, k)  # (N, k), from the values: no gradient
    if k > 1:
        gates = TopKGates.apply(probs, experts)  # (N, k), rows sum to 1
    else:  # Switch's gate: p / p would be 1 and give the router no gradient; keep p itself
        one_hot = np.zeros(probs.shape, dtype=probs.dtype)  # (N, E)
        one_hot[np.arange(probs.shape[0]), experts[:, 0]] = 1
        gates = (probs * mt.tensor(one_hot)).sum(dim=-1, keepdim=True)  # (N, 1)
    return experts, gates, probs


def load_balancing_loss(probs, experts):
    """Switch Transformer's aux loss E · sum_e f_e P_e, a scalar Tensor, for probs (N, E) (a
    Tensor) and experts (N, k) (an int array): f_e, the fraction of the N k slots routed to e,
    is a constant; P_e, the mean probability of e over the tokens, carries the gradient."""
    N, E = probs.shape
    k = experts.shape[1]
    counts = np.bincount(experts.reshape(-1), minlength=E)  # (E,): slots per expert, summing to N k
    fraction = mt.tensor((counts / (N * k)).astype(probs.dtype))  # f (E,): no gradient
    mean_probs = F.mean(probs, dim=0)  # P (E,)
    return (fraction * mean_probs).sum() * E
