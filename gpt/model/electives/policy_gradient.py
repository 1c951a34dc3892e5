"""Policy-gradient fine-tuning with a reward (docs/electives/policy-gradient.md): sample completions
from the policy, score them, and step along an estimate of the gradient of the expected reward,
minus β times the KL from a frozen reference.

    rollouts = sample_completions(policy, prompts, group_size, max_new_tokens, temperature, stop_id, rng)
    rewards = np.array([reward(prompt, completion) for ...])                    # (N,)
    logp, ref = rollout_log_probs(policy, reference, rollouts, temperature)    # (N,) tensor, (N,) array
    shaped = shaped_rewards(rewards, logp.numpy() - ref, beta)                 # r - β k, (N,)
    advantages = baseline.advantages(shaped)        # REINFORCE: minus a running mean
    advantages = group_advantages(rewards, logp.numpy() - ref, beta, group_size)  # or within groups
    loss = policy_gradient_loss(logp, advantages); loss.backward()

The estimator. A completion y of a prompt x is drawn from π_θ(y|x), the product of the model's
next-token probabilities; the reward r(y) is a number (here 1 for a right answer, 0 for a wrong
one) with no gradient of its own. The gradient of its expectation moves under the sum onto the
probabilities, and ∇π = π ∇log π turns it back into an expectation:

    ∇_θ E_{y∼π}[r(y)] = Σ_y r(y) ∇π(y) = Σ_y π(y) r(y) ∇log π(y) = E_{y∼π}[r(y) ∇log π(y)]

so the mean over N samples of r(y_i) ∇log π(y_i) is an unbiased estimate (REINFORCE, Williams
1992). ∇log π(y) is the ordinary backward of the sequence's log-probability
(`sequence_log_probs`, shared with DPO): the loss whose gradient is the estimate is
-(1/N) Σ_i A_i log π(y_i), with the weights A_i (the advantages) held constant.

The baseline. Since Σ_y π(y) = 1, E[∇log π(y)] = Σ_y ∇π(y) = ∇1 = 0: any number b that does not
depend on the sample can be subtracted from the reward without moving the mean,
E[(r - b) ∇log π] = E[r ∇log π]. It changes the variance: per coordinate, E[(r - b)² g²] - μ²
(g = ∇log π), which is smallest near b ≈ E[r g²] / E[g²], roughly the mean reward. With r ∈ {0, 1}
and no baseline every right answer is pushed up and every wrong one left alone; with b the mean,
right answers go up and wrong ones down, by amounts that cancel on average. `RewardBaseline` keeps
a running mean of past steps' rewards: computed before this step's samples, it is independent of
them, so the estimate stays unbiased.

The group-relative variant (GRPO, Shao et al. 2024) draws G completions of each prompt and uses
the group's own mean, divided by the group's standard deviation, as the baseline and the scale:
A_i = (r_i - mean_g r) / (std_g r + ε). No running state, and a prompt the model always (or
never) gets right gives no gradient at all. Two costs, said plainly: the group's mean includes the
sample itself, which scales the expected gradient by (G - 1)/G (E[r_j ∇log π(y_i)] = 0 for j ≠ i),
and the division by the group's std reweights prompts by a random amount, so the expectation is no
longer exactly the gradient of E[r]: `normalize=False` drops the division, and then the
expectation is exactly (G - 1)/G times it (the tests check both facts). G = 1 has no group.

The KL term. The objective is J(θ) = E_{y∼π}[r(y)] - β KL(π ‖ π_ref), with the sequence KL

    KL(π ‖ π_ref) = E_{y∼π}[log π(y) - log π_ref(y)] = Σ_t E[KL(π(·|y_<t) ‖ π_ref(·|y_<t))]

(the chain rule splits it into one KL per token, each at the state the policy reached). Its
gradient, by the same steps as above, is E[(log π(y) - log π_ref(y)) ∇log π(y)] + E[∇log π(y)],
and the second term is 0. So the KL enters as a penalty on the reward: the shaped reward
R(y) = r(y) - β k(y), with k(y) = Σ_t (log π(y_t|y_<t) - log π_ref(y_t|y_<t)) the per-token log
ratios of the sampled tokens summed ("k1", the plain estimator of each token's KL), held constant
like r. This is the estimator used here, because its expectation is the gradient of the KL exactly
(through the states too). The other common choice, GRPO's per-token k3 = π_ref/π - log(π_ref/π) - 1
differentiated directly, estimates the KL's value with less variance, but its gradient's
expectation is -Σ_v π_ref(v) ∇log π(v) per position: the gradient of the reverse KL(π_ref ‖ π),
blind to how a token changes the states after it. In the group-relative variant the KL's part,
β (k_i - mean_g k), is centred within the group like the reward but not divided by its std, so
that β keeps one meaning whatever the group's spread.

The reference is a frozen copy of the starting checkpoint (gpt/model/electives/dpo.py's
`frozen_copy`), run under no_grad. Dropout is off in the policy (eval mode): at step 0 k(y) = 0.
"""
import dataclasses

import numpy as np

import microtensor as mt
import microtensor.functional as F
from microtensor import InputError

from .dpo import continuation_mask, pack_rows, sequence_log_probs

ESTIMATORS = ("reinforce", "group")


@dataclasses.dataclass
class Rollouts:
    """N = P·G completions: G of each of P prompts, rows grouped by prompt (prompt_index (N,) says
    which). tokens (N, L) int64, right-padded with 0, prompt then completion; prompt_lengths and
    lengths (N,) as in dpo.pack_rows; completions: each completion's ids, up to and including the
    stop token if it was drawn."""

    tokens: np.ndarray
    prompt_lengths: np.ndarray
    lengths: np.ndarray
    prompt_index: np.ndarray
    completions: list

    @property
    def completion_lengths(self):
        return self.lengths - self.prompt_lengths


def cut_at_stop(ids, stop_id):
    """ids up to and including the first stop_id (all of them if there is none, or stop_id is None)."""
    if stop_id is not None:
        hits = np.flatnonzero(ids == stop_id)
        if hits.size:
            return ids[: hits[0] + 1]
    return ids


def sample_completions(model, prompts, group_size, max_new_tokens, temperature, stop_id, rng):
    """Rollouts of group_size completions of each prompt (a list of id arrays), drawn from the model
    at `temperature` through GPT.generate (the one Decoder, with its KV cache), each cut after the
    first stop_id. Prompts of one length are sampled as one batch; rng (a numpy Generator) gives
    each batch its seed, so that a run is repeatable."""
    if group_size < 1 or max_new_tokens < 1 or not temperature > 0:
        raise InputError(
            f"sample_completions: expected group_size >= 1, max_new_tokens >= 1 and temperature > 0, "
            f"got {group_size}, {max_new_tokens} and {temperature}"
        )
    rows = [np.asarray(prompt, dtype=np.int64) for prompt in prompts for _ in range(group_size)]
    completions = [None] * len(rows)
    for length in sorted({len(row) for row in rows}):
        picked = [i for i, row in enumerate(rows) if len(row) == length]
        seed = int(rng.integers(2**31))
        out = model.generate(np.stack([rows[i] for i in picked]), max_new_tokens, temperature=temperature, seed=seed).numpy()
        for i, sequence in zip(picked, out):
            completions[i] = cut_at_stop(sequence[length:], stop_id)
    tokens, prompt_lengths, lengths = pack_rows(rows, completions, model.config.block_size)
    prompt_index = np.repeat(np.arange(len(prompts)), group_size)
    return Rollouts(tokens, prompt_lengths, lengths, prompt_index, completions)


def rollout_log_probs(policy, reference, rollouts, temperature=1.0):
    """(log π(y|x) (N,) tensor with its graph, log π_ref(y|x) (N,) float64 array): both at the
    sampling temperature, the distribution the completions were drawn from. reference: a
    dpo.Reference (the frozen copy)."""
    logp = sequence_log_probs(policy, rollouts.tokens, rollouts.prompt_lengths, rollouts.lengths, temperature)
    with reference.running() as model:
        ref = sequence_log_probs(model, rollouts.tokens, rollouts.prompt_lengths, rollouts.lengths, temperature)
    return logp, ref.numpy().astype(np.float64)


def shaped_rewards(rewards, log_ratios, beta):
    """R = r - β k (N,): the reward with the KL's penalty, k = log π(y) - log π_ref(y) the sampled
    tokens' summed log-ratios (the module docstring says why this estimator)."""
    return np.asarray(rewards, dtype=np.float64) - beta * np.asarray(log_ratios, dtype=np.float64)


class RewardBaseline:
    """REINFORCE's baseline: a running mean of the shaped reward over past steps,
    b ← decay·b + (1 - decay)·mean(R), starting at 0. `advantages` uses b before this step's samples
    update it, so that b never depends on the samples it is subtracted from (no bias)."""

    def __init__(self, decay=0.9, value=0.0):
        if not 0 <= decay < 1:
            raise InputError(f"RewardBaseline: decay must be in [0, 1), got {decay}")
        self.decay, self.value = decay, float(value)

    def advantages(self, shaped):
        """A = R - b (N,), then b moves toward this step's mean."""
        shaped = np.asarray(shaped, dtype=np.float64)
        advantages = shaped - self.value
        self.value = self.decay * self.value + (1 - self.decay) * float(shaped.mean())
        return advantages


def group_advantages(rewards, log_ratios, beta, group_size, normalize=True, eps=1e-6):
    """The group-relative advantages (N,), rows in groups of group_size consecutive samples of one
    prompt: the reward minus the group's mean, divided by the group's std (normalize=True, as GRPO),
    minus β times the log-ratio k minus the group's mean of k (centred, not scaled, so that β keeps
    its meaning: the price of one nat of KL in units of the reward's spread)."""
    if group_size < 2:
        raise InputError(f"group_advantages: the group-relative estimator needs a group of at least 2 samples per prompt, got group_size {group_size}")
    rewards = np.asarray(rewards, dtype=np.float64).reshape(-1, group_size)  # (P, G)
    log_ratios = np.asarray(log_ratios, dtype=np.float64).reshape(-1, group_size)  # (P, G)
    centred = rewards - rewards.mean(axis=1, keepdims=True)
    if normalize:
        centred = centred / (rewards.std(axis=1, keepdims=True) + eps)
    kl_centred = log_ratios - log_ratios.mean(axis=1, keepdims=True)
    return (centred - beta * kl_centred).reshape(-1)


def policy_gradient_loss(log_probs, advantages):
    """-(1/N) Σ_i A_i log π(y_i): its gradient is the estimator (the advantages are constants).
    Divided by the number of samples, not of tokens, so that a long completion weighs no less per
    token than a short one: dividing by each one's length would bias the estimate."""
    advantages = mt.tensor(np.asarray(advantages, dtype=log_probs.dtype))  # (N,), no gradient
    return -(log_probs * advantages).mean()


@mt.no_grad()
def per_token_kl(policy, reference, rollouts, temperature=1.0):
    """The mean KL(π ‖ π_ref) per completion token, exact over the vocabulary at every position
    whose token was sampled: Σ_v π(v) (log π(v) - log π_ref(v)) (a measure, not a loss)."""
    inputs = rollouts.tokens[:, :-1]
    mask = continuation_mask(rollouts.prompt_lengths, rollouts.lengths, inputs.shape[1])  # (N, L-1)
    was_training = policy.training
    policy.eval()
    try:
        policy_log = F.log_softmax(policy(inputs)[0] / temperature, dim=-1).numpy().astype(np.float64)  # (N, L-1, V)
    finally:
        policy.train(was_training)
    with reference.running() as model:
        reference_log = F.log_softmax(model(inputs)[0] / temperature, dim=-1).numpy().astype(np.float64)
    kl = (np.exp(policy_log) * (policy_log - reference_log)).sum(axis=-1)  # (N, L-1)
    return float((kl * mask).sum() / mask.sum())
