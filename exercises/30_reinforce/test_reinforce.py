"""The checks of exercise 30. Run them with `python -m exercises check reinforce`.

The policy: two tokens drawn one after the other from 3, π(a, b) = softmax(θ1)[a] · softmax(θ2[a])[b],
θ1 (3,) and θ2 (3, 3). Its 9 sequences can all be listed, so the exact gradient of E[r] is a sum
the engine differentiates; the estimate's mean over many samples must come within a few of its
own standard errors of it."""
import numpy as np

import microtensor as mt
import microtensor.functional as F
from exercises.checking import expect, expect_close

REWARD = np.array([0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])  # r(a, b) at index 3a + b
Z = 5.0  # standard errors allowed per coordinate (12 coordinates: a false alarm about once in 10^5 runs)


def policy_parameters():
    rng = np.random.default_rng(0)
    return mt.tensor(rng.normal(size=3), requires_grad=True), mt.tensor(rng.normal(size=(3, 3)), requires_grad=True)


def log_probs(theta1, theta2, sequences):
    """log π(a, b) of sequences (N, 2) as a (N,) Tensor."""
    first, second = sequences[:, 0], sequences[:, 1]
    return F.log_softmax(theta1, dim=-1)[first] + F.log_softmax(theta2, dim=-1)[first, second]


def every_sequence():
    return np.array([[a, b] for a in range(3) for b in range(3)])


def gradient_of(loss, parameters):
    for p in parameters:
        p.zero_grad()
    loss.backward()
    return np.concatenate([p.grad.reshape(-1) for p in parameters])


def exact():
    """(probabilities (9,), scores ∇log π (9, 12), ∇E[r] (12,)), by enumeration."""
    parameters = policy_parameters()
    logp = log_probs(*parameters, every_sequence())
    probabilities = np.exp(logp.numpy())
    gradient = gradient_of((logp.exp() * mt.tensor(REWARD)).sum(), parameters)
    scores = np.array([gradient_of(log_probs(*parameters, every_sequence()[i : i + 1]).sum(), parameters) for i in range(9)])
    return probabilities, scores, gradient


def test_the_loss_is_minus_the_mean_of_advantage_times_log_prob(impl):
    """the value −(1/N) Σ (r − b) log π, and its gradient −(r − b)/N on each log π"""
    logp = mt.tensor(np.array([-1.0, -2.0, -0.5, -3.0]), requires_grad=True)
    rewards = np.array([1.0, 0.0, 1.0, 0.0])
    loss = impl.reinforce_loss(logp, rewards, 0.25)
    expect(isinstance(loss, mt.Tensor) and loss.shape == (), f"reinforce_loss should return a 0-d Tensor, got {type(loss).__name__} {getattr(loss, 'shape', '')}")
    expect_close("the loss", loss.numpy(), np.asarray(-np.mean((rewards - 0.25) * logp.numpy())), "−mean((r − b) log π)")
    loss.backward()
    expect_close("d loss / d log π", logp.grad, -(rewards - 0.25) / 4, "−(r − b)/N")


def test_the_estimate_matches_the_enumerated_gradient(impl):
    """the mean over 100,000 samples, without and with a baseline, within Z standard errors of ∇E[r]"""
    probabilities, scores, gradient = exact()
    for baseline in (0.0, float(probabilities @ REWARD)):
        drawn = np.random.default_rng(1).choice(9, size=100_000, p=probabilities / probabilities.sum())
        parameters = policy_parameters()
        estimate = -gradient_of(impl.reinforce_loss(log_probs(*parameters, every_sequence()[drawn]), REWARD[drawn], baseline), parameters)
        per_sample = (REWARD[drawn] - baseline)[:, None] * scores[drawn]  # (M, 12): what each sample contributes
        standard_error = per_sample.std(axis=0) / np.sqrt(len(drawn))
        error = np.abs(estimate - gradient)
        expect(
            np.all(error <= Z * standard_error + 1e-12),
            f"with baseline {baseline:.3f}: the estimate's mean is {error.max():.3g} from the exact gradient in some coordinate, "
            f"more than {Z} standard errors ({(Z * standard_error)[np.argmax(error)]:.3g}): is the sign right, and the mean over N?",
        )


def test_the_baseline_lowers_the_variance(impl):
    """with b = E[r] the per-sample estimates vary less than with b = 0"""
    probabilities, scores, _ = exact()
    drawn = np.random.default_rng(2).choice(9, size=20_000, p=probabilities / probabilities.sum())
    variance = {}
    for baseline in (0.0, float(probabilities @ REWARD)):
        per_sample = []
        for i in range(9):  # every sample of sequence i contributes −N times the gradient of its own loss
            parameters = policy_parameters()
            per_sample.append(-gradient_of(impl.reinforce_loss(log_probs(*parameters, every_sequence()[i : i + 1]), REWARD[i : i + 1], baseline), parameters))
        variance[baseline] = np.array(per_sample)[drawn].var(axis=0).sum()
    low, high = variance[max(variance)], variance[0.0]
    expect(low < high, f"the total variance with b = E[r] is {low:.4g}, not below the {high:.4g} without a baseline")


def test_the_running_baseline_uses_the_value_from_before_the_step(impl):
    """advantages r − (old value), then value ← decay·value + (1 − decay)·mean(r)"""
    advantages, value = impl.running_baseline(0.5, np.array([1.0, 0.0, 1.0, 1.0]), 0.9)
    expect_close("the advantages", np.asarray(advantages, dtype=np.float64), np.array([0.5, -0.5, 0.5, 0.5]), "r − 0.5 (the old value)")
    expect_close("the new value", np.float64(value), np.float64(0.9 * 0.5 + 0.1 * 0.75), "0.9·0.5 + 0.1·mean(r)")
