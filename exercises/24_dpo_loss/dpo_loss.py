"""Exercise 24: DPO's loss. The task is in README.md; write the TODOs below.

    m = (pc - rc) - (pr - rr)          (B,)    the four inputs: log-probabilities of the pairs
    L = mean(-log σ(β m))              ()
    dL/dm = -β σ(-β m) / B             (B,)    signs +, -, -, + for the four inputs
"""
import numpy as np

from microtensor.autograd import Function


class DPOLoss(Function):
    @staticmethod
    def forward(ctx, policy_chosen, policy_rejected, reference_chosen, reference_rejected, beta):
        """Four (B,) arrays and β > 0. Returns the 0-d array mean(-log σ(β m)), never overflowing."""
        # TODO: the margin m, z = β m, save what backward needs (z and β), and return the mean of
        # -log σ(z) written so that no exponent is positive (README: The forward, without overflow).
        raise NotImplementedError("TODO: DPOLoss.forward (exercise 24)")

    @staticmethod
    def backward(ctx, grad_out):
        """grad_out: dL/dloss, a 0-d array. Returns the four inputs' gradients (B,) and None for β."""
        # TODO: dL/dm = -β σ(-z) / B times grad_out, σ(-z) computed from e^-|z|; then the four
        # gradients with m's signs +, -, -, + and None for β (README: The backward).
        raise NotImplementedError("TODO: DPOLoss.backward (exercise 24)")


def dpo_loss(policy_chosen, policy_rejected, reference_chosen, reference_rejected, beta):
    """The mean DPO loss of B pairs, a 0-d Tensor."""
    return DPOLoss.apply(policy_chosen, policy_rejected, reference_chosen, reference_rejected, beta)
