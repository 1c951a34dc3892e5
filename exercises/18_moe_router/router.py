"""Exercise 18: a mixture-of-experts router and its load-balancing loss. The task is in README.md; write the TODOs below.

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
    # TODO: sort each row from the most probable down, equal values kept in expert order, and keep
    # the first k columns, as an int64 array (N, k). numpy is fine (np.argsort has a `kind`).
    raise NotImplementedError("TODO: top_k_experts (exercise 18)")


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
        # TODO: grad_out is g = dL/dgates (N, k). Compute dL/dq (N, k) for every row with the formula
        # you derived (README), then put it into a (N, E) array of zeros at the chosen experts'
        # columns (np.put_along_axis), of grad_out's dtype. Return (dL/dprobs, None): experts gets none.
        raise NotImplementedError("TODO: TopKGates.backward (exercise 18)")


def route(x, router_weight, k):
    """Route the tokens x (N, C) with router_weight (C, E) to k experts each.
    Returns (experts (N, k) int64 array, gates (N, k) Tensor, probs (N, E) Tensor)."""
    # TODO: probs = the softmax of the logits x @ router_weight over the experts (F.softmax);
    # experts = top_k_experts of probs' values (probs.data); gates = TopKGates.apply(probs, experts)
    # when k >= 2, and when k = 1 the chosen probability itself, (N, 1), taken with tensor ops so
    # that it stays in the graph (the README says why it is not renormalized).
    raise NotImplementedError("TODO: route (exercise 18)")


def load_balancing_loss(probs, experts):
    """Switch Transformer's aux loss E · sum_e f_e P_e, a scalar Tensor, for probs (N, E) (a
    Tensor) and experts (N, k) (an int array): f_e, the fraction of the N k slots routed to e,
    is a constant; P_e, the mean probability of e over the tokens, carries the gradient."""
    # TODO: f (E,) from counting the slots of each expert (np.bincount), as a tensor of probs'
    # dtype; P = F.mean(probs, dim=0); return E · sum(f P) as a scalar Tensor.
    raise NotImplementedError("TODO: load_balancing_loss (exercise 18)")
