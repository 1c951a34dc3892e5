"""Policy gradients (docs/electives/policy-gradient.md): on a GPT of 3 tokens whose completions of 2
tokens can all be enumerated, the estimator's mean over many samples against the exact gradient of
E[r] - β KL(π ‖ π_ref) (computed by enumeration and the engine's backward), with and without a
baseline, and the group-relative variant; the baseline keeps the mean and lowers the variance; the
loss's backward is the mean of the per-sample estimates; sampling, its errors, and reinforce.py."""
import numpy as np
import pytest

import generate
import microtensor as mt
import reinforce
import train
from microtensor import InputError, optim
from gpt.checkpoints import checkpoint
from gpt.model.electives import dpo
from gpt.model.electives import policy_gradient as pg
from gpt.model.transformer import GPT, GPTConfig
from gpt.text.data import CharTokenizer
from gpt.text.electives.addition import AdditionTask

VOCAB, PROMPT, NEW = 3, np.array([0]), 2
REWARD = np.array([0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0])  # r(y) of completion y = (a, b) at index 3a + b
BETA, TEMPERATURE = 0.5, 0.8
# A coordinate of an estimate's mean may differ from the exact gradient by Z standard errors: about
# 1e-9 two-sided per coordinate, so that none of the few hundred parameters fails by chance.
Z = 6.0


def tiny_gpt(seed):
    mt.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=VOCAB, block_size=4, n_layer=1, n_head=1, n_embd=8), dtype=mt.float64)


def every_completion():
    """tokens (9, 3): the prompt, then each of the 3^2 completions, in the order of REWARD."""
    return np.array([[PROMPT[0], a, b] for a in range(VOCAB) for b in range(VOCAB)], dtype=np.int64)


def flat_grad(model):
    return np.concatenate([p.grad.reshape(-1) if p.grad is not None else np.zeros(p.data.size) for p in model.parameters()])


class Enumerated:
    """Everything exact about the tiny policy: each completion's probability, its log-ratio k to the
    reference, its score ∇log π(y) (a row per completion), and ∇(E[r] - β KL) by the engine's backward."""

    def __init__(self, policy, reference):
        tokens = every_completion()
        n = len(tokens)
        prompt_lengths, lengths = np.ones(n, np.int64), np.full(n, 3)
        with reference.running() as model:
            self.ref = dpo.sequence_log_probs(model, tokens, prompt_lengths, lengths, TEMPERATURE).numpy()
        policy.zero_grad()
        logp = dpo.sequence_log_probs(policy, tokens, prompt_lengths, lengths, TEMPERATURE)  # (9,)
        probs = logp.exp()
        objective = (probs * mt.tensor(REWARD)).sum() - BETA * (probs * (logp - mt.tensor(self.ref))).sum()
        objective.backward()
        self.gradient = flat_grad(policy)  # (P,): the exact ∇J
        self.probs, self.log_ratios = probs.numpy(), logp.numpy() - self.ref
        self.scores = []  # (9, P): ∇log π(y) of each completion
        for i in range(n):
            policy.zero_grad()
            dpo.sequence_log_probs(policy, tokens[i : i + 1], prompt_lengths[:1], lengths[:1], TEMPERATURE).sum().backward()
            self.scores.append(flat_grad(policy))
        self.scores = np.array(self.scores)
        self.shaped = pg.shaped_rewards(REWARD, self.log_ratios, BETA)  # R(y) = r - β k, (9,)

    def mean_and_variance(self, coefficients):
        """Per coordinate, the mean of the estimates c · scores (c one row of coefficients (M, 9) per
        estimate) and the variance of that mean (the sample variance over M)."""
        mean = coefficients.mean(axis=0) @ self.scores  # (P,)
        covariance = np.cov(coefficients, rowvar=False)  # (9, 9)
        variance = np.einsum("yp,yz,zp->p", self.scores, covariance, self.scores)  # (P,)
        return mean, variance / len(coefficients)


@pytest.fixture(scope="module")
def enumerated():
    policy = tiny_gpt(1)
    reference = dpo.Reference(dpo.frozen_copy(tiny_gpt(2)))  # another model: the KL term is not 0
    return Enumerated(policy, reference)


def reinforce_coefficients(exact, baseline, samples, seed):
    """(samples, 9): each REINFORCE estimate (R(y) - b) ∇log π(y) as coefficients on the scores,
    y drawn from the exact probabilities."""
    drawn = np.random.default_rng(seed).choice(len(exact.probs), size=samples, p=exact.probs / exact.probs.sum())
    advantages = pg.RewardBaseline(value=baseline).advantages(exact.shaped[drawn])  # (samples,)
    coefficients = np.zeros((samples, len(exact.probs)))
    coefficients[np.arange(samples), drawn] = advantages
    return coefficients


def assert_within_error(mean, variance, exact, what):
    error = np.abs(mean - exact)
    bound = Z * np.sqrt(variance) + 1e-12
    worst = int(np.argmax(error / bound))
    assert np.all(error <= bound), f"{what}: coordinate {worst} is {error[worst]:.3g} from the exact gradient, more than {Z} standard errors ({bound[worst]:.3g})"


@pytest.mark.parametrize("baseline", ["none", "mean"])
def test_reinforce_estimate_matches_the_enumerated_gradient(enumerated, baseline):
    """The mean of (R - b) ∇log π over 200,000 samples is ∇(E[r] - β KL) within Z standard errors."""
    b = 0.0 if baseline == "none" else float(enumerated.probs @ enumerated.shaped)
    mean, variance = enumerated.mean_and_variance(reinforce_coefficients(enumerated, b, 200_000, seed=3))
    assert_within_error(mean, variance, enumerated.gradient, f"REINFORCE, baseline {baseline}")


def test_the_baseline_keeps_the_mean_and_lowers_the_variance(enumerated):
    """Exactly (by enumeration): E[b ∇log π] = 0, so the mean is the same with b = E[R] as with b = 0,
    and the total variance is lower; measured on samples, likewise."""
    p, scores = enumerated.probs, enumerated.scores
    exact = {}
    for name, b in (("none", 0.0), ("mean", float(p @ enumerated.shaped))):
        weights = enumerated.shaped - b  # (9,)
        mean = (p * weights) @ scores
        exact[name] = (mean, (p * weights**2) @ scores**2 - mean**2)  # per coordinate: the mean, the variance
    np.testing.assert_allclose(exact["mean"][0], exact["none"][0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(exact["none"][0], enumerated.gradient, rtol=1e-9, atol=1e-12)
    assert exact["mean"][1].sum() < 0.9 * exact["none"][1].sum()
    measured = {
        name: enumerated.mean_and_variance(reinforce_coefficients(enumerated, b, 50_000, seed=4))[1].sum()
        for name, b in (("none", 0.0), ("mean", float(p @ enumerated.shaped)))
    }
    assert measured["mean"] < 0.9 * measured["none"]


def group_coefficients(exact, group_size, groups, seed, normalize):
    drawn = np.random.default_rng(seed).choice(len(exact.probs), size=(groups, group_size), p=exact.probs / exact.probs.sum())
    advantages = pg.group_advantages(REWARD[drawn], exact.log_ratios[drawn], BETA, group_size, normalize=normalize).reshape(groups, group_size)
    coefficients = np.zeros((groups, len(exact.probs)))
    for i in range(group_size):
        np.add.at(coefficients, (np.arange(groups), drawn[:, i]), advantages[:, i] / group_size)
    return coefficients


def test_group_relative_estimate_is_the_gradient_times_g_minus_1_over_g(enumerated):
    """Without the std's division, the group-relative estimate's mean is exactly (G - 1)/G ∇J: the
    group's mean includes the sample itself."""
    G = 4
    mean, variance = enumerated.mean_and_variance(group_coefficients(enumerated, G, 100_000, seed=5, normalize=False))
    assert_within_error(mean * G / (G - 1), variance * (G / (G - 1)) ** 2, enumerated.gradient, "group-relative, G = 4")


def test_group_advantages_normalize_within_each_group_and_refuse_a_group_of_one():
    rewards = np.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    advantages = pg.group_advantages(rewards, np.zeros(8), 0.1, 4)
    np.testing.assert_allclose(advantages[:4], (rewards[:4] - 0.25) / (np.sqrt(0.1875) + 1e-6))
    np.testing.assert_allclose(advantages[4:], 0.0)  # a group all right teaches nothing
    with pytest.raises(InputError, match="group_size 1"):
        pg.group_advantages(rewards, np.zeros(8), 0.1, 1)


def test_the_running_baseline_uses_only_past_steps():
    baseline = pg.RewardBaseline(decay=0.5)
    np.testing.assert_allclose(baseline.advantages([1.0, 0.0]), [1.0, 0.0])  # b = 0 before any step
    assert baseline.value == 0.25
    np.testing.assert_allclose(baseline.advantages([1.0, 1.0]), [0.75, 0.75])
    with pytest.raises(InputError, match="decay"):
        pg.RewardBaseline(decay=1.0)


def test_the_loss_gradient_is_the_mean_of_the_per_sample_estimates():
    """-∇ of policy_gradient_loss on sampled rollouts (prompts of two lengths, cut at a stop token)
    equals (1/N) Σ_i A_i ∇log π(y_i), each score computed alone."""
    policy = tiny_gpt(1)
    reference = dpo.Reference(dpo.frozen_copy(tiny_gpt(2)))
    rollouts = pg.sample_completions(policy, [np.array([0]), np.array([1, 2])], 3, 2, TEMPERATURE, stop_id=2, rng=np.random.default_rng(0))
    assert rollouts.tokens.shape[0] == 6 and list(rollouts.prompt_index) == [0, 0, 0, 1, 1, 1]
    for completion in rollouts.completions:
        assert 1 <= len(completion) <= 2 and (len(completion) == 2 or completion[-1] == 2)
    logp, ref = pg.rollout_log_probs(policy, reference, rollouts, TEMPERATURE)
    advantages = pg.group_advantages(np.arange(6.0) % 2, logp.numpy() - ref, BETA, 3)
    policy.zero_grad()
    pg.policy_gradient_loss(logp, advantages).backward()
    estimate = -flat_grad(policy)
    per_sample = []
    for i in range(6):
        policy.zero_grad()
        row = slice(i, i + 1)
        dpo.sequence_log_probs(policy, rollouts.tokens[row], rollouts.prompt_lengths[row], rollouts.lengths[row], TEMPERATURE).sum().backward()
        per_sample.append(advantages[i] * flat_grad(policy))
    np.testing.assert_allclose(estimate, np.mean(per_sample, axis=0), rtol=1e-9, atol=1e-12)


def test_sampling_is_repeatable_and_the_kl_starts_at_zero():
    policy = tiny_gpt(1)
    reference = dpo.Reference(dpo.frozen_copy(policy))
    draw = [pg.sample_completions(policy, [np.array([0, 1])], 4, 3, 1.0, None, np.random.default_rng(7)) for _ in range(2)]
    np.testing.assert_array_equal(draw[0].tokens, draw[1].tokens)
    logp, ref = pg.rollout_log_probs(policy, reference, draw[0])
    np.testing.assert_allclose(logp.numpy(), ref, rtol=0, atol=1e-12)
    assert pg.per_token_kl(policy, reference, draw[0]) == pytest.approx(0.0, abs=1e-12)
    assert pg.per_token_kl(policy, dpo.Reference(dpo.frozen_copy(tiny_gpt(2))), draw[0]) > 0
    with pytest.raises(InputError, match="temperature"):
        pg.sample_completions(policy, [np.array([0])], 2, 2, 0.0, None, np.random.default_rng(0))


def test_sequence_log_probs_at_a_temperature_divides_the_logits():
    policy = tiny_gpt(1)
    tokens = every_completion()[:4]
    ones, threes = np.ones(4, np.int64), np.full(4, 3)
    logits = policy(tokens[:, :-1])[0].numpy() / TEMPERATURE  # (4, 2, V)
    log_probs = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    expected = log_probs[np.arange(4), 0, tokens[:, 1]] + log_probs[np.arange(4), 1, tokens[:, 2]]
    np.testing.assert_allclose(dpo.sequence_log_probs(policy, tokens, ones, threes, TEMPERATURE).numpy(), expected, rtol=1e-12)


# ================================================================================= reinforce.py


def save_tiny_checkpoint(folder, tokenizer, block_size=16):
    mt.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=block_size, n_layer=1, n_head=2, n_embd=16))
    meta = {"iteration": 0, "config": model.config.to_dict(), **checkpoint.tokenizer_meta(tokenizer), "addition": {"digits": 2, "seed": 0}}
    checkpoint.save(folder, model, optim.AdamW(model.parameters()), meta)
    return folder


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny untrained GPT of the addition task's vocabulary, and one of another vocabulary."""
    folder = tmp_path_factory.mktemp("reinforce")
    save_tiny_checkpoint(folder / "other", CharTokenizer.from_text("0123456789+-=\n"))
    return save_tiny_checkpoint(folder / "base", AdditionTask(2).tokenizer)


def run_reinforce(base, out, *flags):
    return reinforce.main(["--init-from", str(base), "--out-dir", str(out), "--eval-problems", "8", "--samples-per-step", "8", "--group-size", "4", *flags])


@pytest.mark.parametrize(
    "flags, named",
    [(["--beta", "-0.1"], "--beta: given -0.1"), (["--beta", "nan"], "--beta: given nan"), (["--group-size", "1", "--samples-per-step", "4"], "--group-size: given 1"),
     (["--samples-per-step", "6"], "--samples-per-step: given 6"), (["--temperature", "0"], "--temperature: given 0")],
)  # fmt: skip
def test_reinforce_refuses_bad_flags_naming_them(base, tmp_path, capsys, flags, named):
    assert run_reinforce(base, tmp_path / "out", *flags) == 1
    assert named in capsys.readouterr().out


def test_reinforce_refuses_a_checkpoint_of_another_vocabulary(base, tmp_path, capsys):
    assert run_reinforce(base.parent / "other", tmp_path / "out") == 1
    out = capsys.readouterr().out.replace("\n", "")
    assert "--init-from" in out and "vocabulary" in out


@pytest.fixture(scope="module")
def partly_trained(tmp_path_factory):
    """A tiny GPT trained briefly by train.py on 2-digit sums: right often enough for the reward to teach."""
    folder = tmp_path_factory.mktemp("reinforce") / "partly"
    flags = ["--data", "addition", "--addition-digits", "2", "--n-layer", "2", "--n-head", "4", "--n-embd", "64", "--batch-size", "64", "--max-iters", "200",
             "--learning-rate", "3e-3", "--warmup-iters", "20", "--eval-interval", "200", "--eval-iters", "1", "--sample-chars", "0"]  # fmt: skip
    assert train.main([*flags, "--out-dir", str(folder)]) == 0
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["reinforce", "group"])
def test_reinforce_resumes_exactly_and_samples(partly_trained, tmp_path, estimator):
    base, whole, halves = partly_trained, tmp_path / "whole", tmp_path / "halves"
    flags = ["--estimator", estimator, "--beta", "0.1", "--learning-rate", "1e-3", "--eval-interval", "2"]
    assert run_reinforce(base, whole, *flags, "--steps", "4") == 0
    assert run_reinforce(base, halves, *flags, "--steps", "2") == 0
    assert reinforce.main(["--out-dir", str(halves), "--resume", "--steps", "4"]) == 0
    (a, _, meta), (b, _, resumed) = checkpoint.load(whole), checkpoint.load(halves)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert meta["reinforce"]["history"] == resumed["reinforce"]["history"] and meta["reinforce"]["baseline"] == resumed["reinforce"]["baseline"]
    assert any(not np.array_equal(a[k], checkpoint.load(base)[0][k]) for k in a)  # it trained
    assert generate.main(["--out-dir", str(whole), "--prompt", "12+34=", "--max-new-tokens", "4"]) == 0
