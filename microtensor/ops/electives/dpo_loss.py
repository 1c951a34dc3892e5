"""Direct preference optimization's loss (DPO, Rafailov et al. 2023).

A pair is a prompt x, a continuation y⁺ that is preferred (chosen) and one that is not (y⁻,
rejected). With the log-probabilities of each continuation under the model being trained (the
policy π) and under a frozen copy of where it started (the reference π_ref), all (B,):

    m = (log π(y⁺|x) - log π_ref(y⁺|x)) - (log π(y⁻|x) - log π_ref(y⁻|x))      the margin    (B,)
    L = (1 / B) Σ_i -log σ(β m_i)                                                 ()

β > 0 sets how far the policy may go from the reference: β (log π - log π_ref) is DPO's implicit
reward of a continuation, and the loss is a logistic regression that the chosen continuation's
reward beats the rejected one's.

Backward. With z = β m and σ'(z) = σ(z) σ(-z):

    d/dz [-log σ(z)] = -σ'(z) / σ(z) = -σ(-z)
    dL/dm_i = (1 / B) · -β σ(-β m_i)                                               (B,)

and m is a sum with signs, so each of the four inputs gets that gradient with m's sign for it:

    dL/d log π(y⁺)     = +dL/dm        dL/d log π(y⁻)     = -dL/dm
    dL/d log π_ref(y⁺) = -dL/dm        dL/d log π_ref(y⁻) = +dL/dm

Gradient descent therefore raises log π(y⁺) and lowers log π(y⁻), each by a weight σ(-β m): near
1 for a pair the policy gets wrong (m very negative), near 0 for one it already ranks well beyond
its reference, which is what keeps DPO from pushing without end. (The reference's gradients exist
for the gradcheck; in training the reference is a constant and gets none.)

Forward mode (JVP), with tangents t of the four inputs:

    dL = (1 / B) Σ_i -β σ(-β m_i) (t_π⁺ - t_π⁻ - t_ref⁺ + t_ref⁻)_i

Numerically: -log σ(z) = log(1 + e^-z) = max(-z, 0) + log1p(e^-|z|), whose exponent is never
positive, so nothing overflows for large |m| (a naive log(σ(z)) gives log(0) = -inf for z = -800
in float64); σ(-z) is computed the same way, from e^-|z|. The batch is B numbers, so the op is
plain numpy: a kernel would have nothing to loop over.
"""
import numpy as np

from ...autograd import Function, add_tangents
from ...checks import check_float, check_real
from ...errors import InputError
from ...gradcheck import gradcheck_case


def softplus_of_minus(z):
    """-log σ(z) = log(1 + e^-z), without overflow: max(-z, 0) + log1p(e^-|z|)."""
    return np.maximum(-z, 0) + np.log1p(np.exp(-np.abs(z)))


def sigmoid_of_minus(z):
    """σ(-z) = 1 / (1 + e^z), from e^-|z| <= 1: e^-z / (1 + e^-z) for z >= 0, 1 / (1 + e^z) for z < 0."""
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, e / (1 + e), 1 / (1 + e))


def dpo_loss_reference(policy_chosen, policy_rejected, reference_chosen, reference_rejected, beta):
    """Plain numpy DPO loss, as the formula reads (the test oracle; overflows for large |β m|)."""
    margin = (policy_chosen - reference_chosen) - (policy_rejected - reference_rejected)
    return np.mean(-np.log(1 / (1 + np.exp(-beta * margin))))


class DPOLoss(Function):
    """L = mean(-log σ(β m)), m = (π⁺ - ref⁺) - (π⁻ - ref⁻).   dL/dm = -β σ(-β m) / B (module docstring)."""

    @staticmethod
    def forward(ctx, policy_chosen, policy_rejected, reference_chosen, reference_rejected, beta):
        margin = (policy_chosen - reference_chosen) - (policy_rejected - reference_rejected)  # (B,)
        z = beta * margin
        ctx.save_for_backward(z)
        ctx.beta = beta
        return np.asarray(softplus_of_minus(z).mean(), dtype=policy_chosen.dtype)  # ()

    @staticmethod
    def backward(ctx, grad_out):
        (z,) = ctx.saved_tensors
        grad_margin = grad_out * (-ctx.beta * sigmoid_of_minus(z) / z.shape[0])  # (B,)
        grad_margin = grad_margin.astype(z.dtype)
        return grad_margin, -grad_margin, -grad_margin, grad_margin.copy(), None

    @staticmethod
    def jvp(ctx, tangent_pc, tangent_pr, tangent_rc, tangent_rr, _beta):
        (z,) = ctx.saved_tensors
        tangent_margin = add_tangents(
            z.shape, tangent_pc, None if tangent_pr is None else -tangent_pr, None if tangent_rc is None else -tangent_rc, tangent_rr
        )  # (B,)
        dl_dm = -ctx.beta * sigmoid_of_minus(z) / z.shape[0]  # (B,)
        return np.asarray((dl_dm * tangent_margin).sum(), dtype=z.dtype)


def dpo_loss(policy_chosen, policy_rejected, reference_chosen, reference_rejected, beta):
    """DPO's loss, the mean over B pairs of -log σ(β m), a 0-d tensor (the module docstring).

    Each argument is a (B,) float tensor of sequence log-probabilities (one dtype): the policy's of
    the chosen and rejected continuations, then the reference's. beta: a finite number > 0."""
    op = "dpo_loss"
    check_float(op, policy_chosen, policy_rejected, reference_chosen, reference_rejected)
    shapes = {t.shape for t in (policy_chosen, policy_rejected, reference_chosen, reference_rejected)}
    if len(shapes) != 1 or policy_chosen.ndim != 1 or policy_chosen.shape[0] < 1:
        raise InputError(
            f"{op}: expected four log-probability tensors of one shape (B,) with B >= 1, got shapes "
            f"{', '.join(str(t.shape) for t in (policy_chosen, policy_rejected, reference_chosen, reference_rejected))}"
        )
    beta = check_real(op, "beta", beta, low=0, low_open=True)
    return DPOLoss.apply(policy_chosen, policy_rejected, reference_chosen, reference_rejected, beta)


@gradcheck_case(DPOLoss)
def _dpo_loss_case(draw):
    batch = draw.integer(1, 5)
    inputs = tuple(draw.tensor((batch,), -3.0, 3.0) for _ in range(4))
    beta = draw.choice((0.1, 0.5, 2.0))

    def fn(policy_chosen, policy_rejected, reference_chosen, reference_rejected):
        return dpo_loss(policy_chosen, policy_rejected, reference_chosen, reference_rejected, beta)

    return fn, inputs
