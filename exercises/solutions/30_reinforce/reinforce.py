"""Exercise 30: the REINFORCE estimator with a baseline. The task is in README.md; write the TODOs below.

    ∇ E_{y∼π}[r(y)] = E_{y∼π}[(r(y) − b) ∇log π(y)]       for any b that does not depend on y
    loss = −(1/N) Σ_i (r_i − b) log π(y_i)                 (): its gradient is the estimate
"""
import numpy as np

import microtensor as mt


def reinforce_loss(log_probs, rewards, baseline):
    """log_probs: (N,) Tensor, log π(y_i) of N sampled sequences, with its graph; rewards: (N,) numpy
    array; baseline: a number. Returns the 0-d Tensor −(1/N) Σ_i (r_i − b) log π(y_i)."""
    advantages = mt.tensor((np.asarray(rewards, dtype=np.float64) - baseline).astype(log_probs.dtype))  # (N,), a constant
    return -(log_probs * advantages).mean()


def running_baseline(value, rewards, decay):
    """REINFORCE's running baseline for one step: returns (advantages (N,), the new value). The
    advantages use the value from before this step; then value ← decay·value + (1 − decay)·mean(r)."""
    rewards = np.asarray(rewards, dtype=np.float64)
    advantages = rewards - value  # the old value: independent of these samples, so no bias
    return advantages, decay * value + (1 - decay) * float(rewards.mean())
