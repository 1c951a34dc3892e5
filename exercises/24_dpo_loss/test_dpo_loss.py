"""The checks of exercise 24. Run them with `python -m exercises check dpo_loss`."""
import numpy as np

import microtensor as mt
from exercises.checking import expect, expect_close, gradcheck, random_tensor


def plain_loss(values, beta):
    """mean(log(1 + e^-βm)) as the formula reads: fine for moderate margins."""
    pc, pr, rc, rr = values
    m = (pc - rc) - (pr - rr)
    return np.mean(np.log(1 + np.exp(-beta * m)))


def inputs(batch, seed):
    return [random_tensor((batch,), seed=seed + i, low=-3.0, high=3.0) for i in range(4)]


def test_the_loss_matches_the_formula_and_never_overflows(impl):
    """the loss against the plain formula; 800 and 0 (not inf or NaN) at margins of -800 and +800"""
    tensors = inputs(5, seed=1)
    loss = impl.dpo_loss(*tensors, 0.5)
    expect_close("dpo_loss of 5 pairs, β = 0.5", loss.numpy(), plain_loss([t.numpy() for t in tensors], 0.5), "the plain formula")
    zeros = [mt.tensor(np.zeros(1)) for _ in range(3)]
    low = impl.dpo_loss(mt.tensor(np.array([-800.0])), *zeros, 1.0).item()
    expect(low == 800.0, f"dpo_loss at a margin of -800, β = 1: got {low}, expected 800 (use max(-z, 0) + log1p(exp(-|z|)))")
    high = impl.dpo_loss(mt.tensor(np.array([800.0])), *zeros, 1.0).item()
    expect(high == 0.0, f"dpo_loss at a margin of +800, β = 1: got {high}, expected 0")


def test_gradients_match_finite_differences(impl):
    """gradcheck of the four inputs, random upstream gradient, β = 0.1, 0.5 and 2"""
    for seed, beta in ((10, 0.1), (20, 0.5), (30, 2.0)):
        gradcheck(lambda a, b, c, d, beta=beta: impl.dpo_loss(a, b, c, d, beta), inputs(4, seed))


def test_the_gradient_raises_the_chosen_and_lowers_the_rejected(impl):
    """descending the gradient raises log π(y⁺), lowers log π(y⁻); finite at margins of ∓800"""
    tensors = inputs(3, seed=40)
    impl.dpo_loss(*tensors, 0.5).backward()
    expect(np.all(tensors[0].grad < 0), f"dL/d log π(y⁺) should be negative (a step raises it), got {tensors[0].grad}")
    expect(np.all(tensors[1].grad > 0), f"dL/d log π(y⁻) should be positive (a step lowers it), got {tensors[1].grad}")
    chosen = mt.tensor(np.array([-800.0, 800.0]), requires_grad=True)
    zeros = [mt.tensor(np.zeros(2)) for _ in range(3)]
    impl.dpo_loss(chosen, *zeros, 1.0).backward()
    expect_close("dL/d log π(y⁺) at margins -800 and +800, β = 1, B = 2", chosen.grad, np.array([-0.5, 0.0]), "-β σ(-βm) / B")
