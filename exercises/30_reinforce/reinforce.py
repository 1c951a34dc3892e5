"""Exercise 30: the REINFORCE estimator with a baseline. The task is in README.md; write the TODOs below.

    ∇ E_{y∼π}[r(y)] = E_{y∼π}[(r(y) − b) ∇log π(y)]       for any b that does not depend on y
    loss = −(1/N) Σ_i (r_i − b) log π(y_i)                 (): its gradient is the estimate
"""
import numpy as np

import microtensor as mt


def reinforce_loss(log_probs, rewards, baseline):
    """log_probs: (N,) Tensor, log π(y_i) of N sampled sequences, with its graph; rewards: (N,) numpy
    array; baseline: a number. Returns the 0-d Tensor −(1/N) Σ_i (r_i − b) log π(y_i)."""
    # TODO: the advantages r_i − b as a constant tensor (no gradient; the dtype of log_probs), and
    # the loss: minus the mean of advantage times log-probability (README: The loss).
    raise NotImplementedError("TODO: reinforce_loss (exercise 30)")


def running_baseline(value, rewards, decay):
    """REINFORCE's running baseline for one step: returns (advantages (N,), the new value). The
    advantages use the value from before this step; then value ← decay·value + (1 − decay)·mean(r)."""
    # TODO: advantages with the old value (README: The baseline, and why it must come first), then
    # the new value.
    raise NotImplementedError("TODO: running_baseline (exercise 30)")
