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
        margin = (policy_chosen - reference_chosen) - (policy_rejected - reference_rejected)  # (B,)
        z = beta * margin
        ctx.save_for_backward(z)
        ctx.beta = beta
        return np.asarray((np.maximum(-z, 0) + np.log1p(np.exp(-np.abs(z)))).mean())

    @staticmethod
    def backward(ctx, grad_out):
        """grad_out: dL/dloss, a 0-d array. Returns the four inputs' gradients (B,) and None for β."""
        (z,) = ctx.saved_tensors
        e = np.exp(-np.abs(z))
        sigma_of_minus_z = np.where(z >= 0, e / (1 + e), 1 / (1 + e))  # σ(-z), from e^-|z| <= 1
        grad_margin = grad_out * (-ctx.beta * sigma_of_minus_z / z.shape[0])  # (B,)
        return grad_margin, -grad_margin, -grad_margin, grad_margin, None


def dpo_loss(policy_chosen, policy_rejected, reference_chosen, reference_rejected, beta):
    """The mean DPO loss of B pairs, a 0-d Tensor."""
    return DPOLoss.apply(policy_chosen, policy_rejected, reference_chosen, reference_rejected, beta)
