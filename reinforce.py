"""Fine-tune a GPT trained on addition with a reward: 1 for a right sum, 0 for a wrong one.

    python train.py --data addition --out-dir out-add               # a model that adds, partly
    python reinforce.py --init-from out-add                         # group-relative, G = 8, β = 0.05
    python reinforce.py --init-from out-add --estimator reinforce --beta 0.1
    python reinforce.py --out-dir out-reinforce --resume --steps 400    # continue
    python generate.py --out-dir out-reinforce                      # sample the fine-tuned model

Each step draws --samples-per-step / --group-size training problems, samples --group-size answers
to each from the policy at --temperature, rewards each by checking its digits, and steps along

    -(1/N) Σ_i A_i ∇log π(y_i)        A_i: the reward minus β times the sampled tokens' log-ratio
                                      to the reference, minus a baseline (--estimator reinforce:
                                      a running mean; group: the group's mean, over its std)

(gpt/model/electives/policy_gradient.py, docs/electives/policy-gradient.md). The reference is a
frozen copy of --init-from's model. Measured every --eval-interval steps on the held-out sums: the
exact-match accuracy of greedy answers, and of one sampled answer per problem the mean reward, the
per-token KL to the reference and the answer's length.

It reads like dpo.py, top to bottom (the flags, main() -> fine_tune(): set-up, the loop, the
results) and shares its pieces: the flag errors and signals (programs/cli.py), the checkpoints
(gpt/checkpoints/checkpoint.py), the reference (gpt/model/electives/dpo.py). Its checkpoint is a
full fine-tuning's, as train.py writes it, so generate.py samples it; --resume continues exactly
(the model, AdamW's moments, the step, the baseline and the generator of problems and samples).
"""
import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from rich.markup import escape
from rich.table import Table

import microtensor as mt
from microtensor import MicrotensorError, optim
from gpt.checkpoints import checkpoint
from gpt.model.electives import dpo
from gpt.model.electives import policy_gradient as pg
from gpt.text.electives.addition import AdditionTask
from programs import cli, training
from programs.cli import FlagError, TrainingStopped, console


def build_parser():
    p = argparse.ArgumentParser(
        description="Fine-tune a GPT trained on addition with a verifiable reward (docs/electives/policy-gradient.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    run = p.add_argument_group("models and output")
    run.add_argument("--init-from", metavar="DIR", default=None, help="the checkpoint train.py --data addition wrote in DIR: the policy starts from it, and a frozen copy is the reference")
    run.add_argument("--out-dir", default="out-reinforce", help="folder for the fine-tuned checkpoint (ckpt.npz)")
    run.add_argument("--resume", action="store_true", help="continue the fine-tuning in --out-dir (its model, optimizer, step and settings); only --steps and --eval-interval may change")
    run.add_argument("--force", action="store_true", help="start a new run even though --out-dir holds a checkpoint")
    run.add_argument("--seed", type=int, default=1337, help="seed for the training problems and the samples")
    cli.add_kernels_argument(p, run)
    run.add_argument("--eval-problems", type=int, default=200, help="held-out sums measured (the checkpoint's task: never trained on)")
    tune = p.add_argument_group("fine-tuning")
    tune.add_argument("--estimator", choices=pg.ESTIMATORS, default="group", help="reinforce: the reward minus a running mean; group: normalized within each prompt's group of samples")
    tune.add_argument("--group-size", type=int, default=8, help="answers sampled per problem (G; at least 2 for --estimator group)")
    tune.add_argument("--samples-per-step", type=int, default=64, help="answers sampled per step (N, a multiple of --group-size)")
    tune.add_argument("--beta", type=float, default=0.05, help="β, the weight of the KL to the reference (0: none)")
    tune.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (> 0): the policy is softmax(logits / T)")
    tune.add_argument("--baseline-decay", type=float, default=0.9, help="the running mean's decay for --estimator reinforce")
    tune.add_argument("--steps", type=int, default=100, help="steps to fine-tune for")
    tune.add_argument("--learning-rate", type=float, default=1e-4, help="AdamW's learning rate (constant)")
    tune.add_argument("--weight-decay", type=float, default=0.0, help="AdamW's decoupled weight decay (2-D weights only)")
    tune.add_argument("--grad-clip", type=float, default=1.0, help="clip the global gradient norm to this (0: off)")
    tune.add_argument("--eval-interval", type=int, default=25, help="measure the held-out sums and save a checkpoint every this many steps")
    return p


# The settings a resumed run keeps from its checkpoint (the others may be given again).
KEPT_ON_RESUME = (
    "init_from", "eval_problems", "estimator", "group_size", "samples_per_step", "beta",
    "temperature", "baseline_decay", "learning_rate", "weight_decay", "grad_clip", "seed",
)  # fmt: skip


def main(argv=None):
    """The program: returns its exit code (0; 1 for an error; 130 or 143 after Ctrl-C or SIGTERM)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    explicit = cli.explicit_flags(parser, argv)
    try:
        fine_tune(args, explicit)
    except (MicrotensorError, MemoryError, KeyboardInterrupt) as error:
        return cli.exit_code(error, interrupted="{signal} before fine-tuning started; nothing was saved")
    return 0


def check_args(args, explicit=()):
    """Every flag before anything is read; the first that cannot work is a FlagError naming it."""

    need = cli.flag_check(args)
    if args.resume:
        cli.refuse_settings_on_resume(args, explicit, KEPT_ON_RESUME)
        return
    need(args.init_from is not None, "init_from", "a folder holding a checkpoint train.py --data addition wrote: --init-from DIR")
    need(math.isfinite(args.beta) and args.beta >= 0, "beta", "a finite number >= 0 (β < 0 would reward moving away from the reference)")
    need(math.isfinite(args.temperature) and args.temperature > 0, "temperature", "a finite number > 0 (0 is greedy: no distribution to take the gradient of)")
    need(args.group_size >= 1, "group_size", "an integer >= 1")
    if args.estimator == "group":
        need(args.group_size >= 2, "group_size", "at least 2 with --estimator group: its baseline is the mean of the other answers to the same problem")
    need(args.samples_per_step >= args.group_size and args.samples_per_step % args.group_size == 0, "samples_per_step", f"a multiple of --group-size ({args.group_size})")
    need(0 <= args.baseline_decay < 1, "baseline_decay", "a number in [0, 1)")
    for name in ("eval_problems", "eval_interval"):
        need(getattr(args, name) >= 1, name, "an integer >= 1")
    need(args.steps >= 0, "steps", "an integer >= 0")
    need(math.isfinite(args.learning_rate) and args.learning_rate > 0, "learning_rate", "a finite number > 0")
    for name in ("weight_decay", "grad_clip"):
        need(math.isfinite(getattr(args, name)) and getattr(args, name) >= 0, name, "a finite number >= 0")
    if Path(args.init_from).resolve() == Path(args.out_dir).resolve():
        raise FlagError("out_dir", args.out_dir, "a folder other than --init-from's: the fine-tuned checkpoint would replace its start")


def load_policy(args):
    """(model, task) of --init-from: the task its checkpoint records (train.py --data addition's
    digits and held-out set), refused unless the model's vocabulary is the task's."""
    model, tokenizer, meta = training.load_full_model("init_from", args.init_from)
    record = meta.get("addition") or {"digits": 2, "seed": 0}  # without a record, the vocabulary check below decides
    task = AdditionTask(record["digits"], record["seed"])
    if checkpoint.tokenizer_meta(tokenizer) != checkpoint.tokenizer_meta(task.tokenizer) or model.config.vocab_size != task.tokenizer.vocab_size:
        raise FlagError(
            "init_from", args.init_from,
            f"a checkpoint of the addition task's vocabulary ({task.tokenizer.vocab_size} tokens: digits, '+', '=' and newline); "
            f"this one has {model.config.vocab_size} tokens{', not the same ones' if model.config.vocab_size == task.tokenizer.vocab_size else ''}: train one with train.py --data addition",
        )  # fmt: skip
    if task.problem_length > model.config.block_size + 1 or args.eval_problems > len(task.val_codes):
        raise FlagError("init_from", args.init_from, f"a model whose block holds a problem ({task.problem_length} tokens) and a held-out set of --eval-problems {args.eval_problems} sums")
    return model, task


def set_up(args):
    """(policy, reference, optimizer, task, baseline, start step, generator, meta): a new run from
    --init-from, or the checkpoint of --resume with its settings."""
    path = checkpoint.path_in(args.out_dir)
    meta = None
    if args.resume:
        try:
            model_state, optim_state, meta = checkpoint.load(args.out_dir)
        except checkpoint.CheckpointError as error:
            raise FlagError("resume", f"with --out-dir {args.out_dir}", f"a reinforce.py checkpoint there ({error})") from None
        if "reinforce" not in meta:
            raise FlagError("resume", f"with --out-dir {args.out_dir}", f"a checkpoint reinforce.py wrote; {path} was not fine-tuned with a reward")
        for name in KEPT_ON_RESUME:
            setattr(args, name, meta["reinforce"]["settings"][name])
    else:
        checkpoint.prepare_out_dir(args.out_dir)
        if path.exists() and not args.force:
            raise FlagError("out_dir", args.out_dir, f"a folder without a checkpoint: {path} exists; pass --resume to continue it, --force to replace it")
    policy, task = load_policy(args)
    reference = dpo.Reference(dpo.frozen_copy(policy))
    base_record = {"base": str(Path(args.init_from).resolve()), "base_sha256": checkpoint.file_sha256(checkpoint.path_in(args.init_from))}
    optimizer = optim.AdamW(optim.weight_decay_groups(policy.parameters(), args.weight_decay), lr=args.learning_rate)
    baseline = pg.RewardBaseline(args.baseline_decay)
    rng = np.random.default_rng(args.seed)
    start = 0
    if meta is not None:
        if meta["init_from"]["base_sha256"] != base_record["base_sha256"]:
            raise checkpoint.CheckpointError(f"{path}: its start {args.init_from} has changed since the fine-tuning began; its reference is gone")
        policy.load_state_dict(model_state)
        optimizer.load_state_dict(optim_state)
        rng.bit_generator.state = meta["reinforce"]["rng"]
        baseline.value = meta["reinforce"]["baseline"]
        start = meta["iteration"]
        console.print(f"resuming from {escape(args.out_dir)} at step {start}")
    policy.eval()  # dropout off: at step 0 the policy's log-probabilities are the reference's exactly
    return policy, reference, optimizer, task, baseline, base_record, start, rng, meta


def save(args, step, policy, optimizer, task, baseline, base_record, rng, history):
    """The checkpoint of this step: a full fine-tuning's, as train.py writes it (generate.py reads it), plus the run's record."""
    meta = {
        "iteration": step, "config": policy.config.to_dict(), **checkpoint.tokenizer_meta(task.tokenizer),
        "args": vars(args), "global_rng": mt.random.get_state(), "init_from": base_record,
        "reinforce": {"settings": {name: getattr(args, name) for name in KEPT_ON_RESUME}, "rng": rng.bit_generator.state,
                      "baseline": baseline.value, "history": history},
    }  # fmt: skip
    try:
        checkpoint.save(args.out_dir, policy, optimizer, meta)
    except checkpoint.CheckpointSaveError as error:
        raise TrainingStopped(f"{error}; fine-tuning stopped at step {step}") from None


def evaluate(policy, reference, task, args, trained_tokens):
    """The held-out measures: greedy exact-match accuracy, and of one answer sampled per problem at
    --temperature, the mean reward, the exact per-token KL to the reference and the answer's length."""
    prompts = [p for p, _ in task.problems("val", args.eval_problems, None)]
    rollouts = pg.sample_completions(policy, [task.tokenizer.encode(p) for p in prompts], 1, task.answer_length, args.temperature, stop_id(task), np.random.default_rng(0))
    rewards = [task.reward(p, task.tokenizer.decode(c)) for p, c in zip(prompts, rollouts.completions)]
    return {
        "accuracy": task.accuracy(policy, args.eval_problems), "reward": float(np.mean(rewards)),
        "kl": pg.per_token_kl(policy, reference, rollouts, args.temperature),
        "length": float(rollouts.completion_lengths.mean()), "trained_tokens": trained_tokens,
    }  # fmt: skip


def stop_id(task):
    return int(task.tokenizer.encode(task.answer_end)[0])


def fine_tune(args, explicit=None):
    """Run the fine-tuning as `args` (from build_parser) says; returns the results dict (the measures over the steps)."""
    if explicit is None:
        explicit = cli.flags_unlike_defaults(build_parser(), args)
    check_args(args, explicit)
    run = cli.Run(checkpoint.path_in(args.out_dir))
    with mt.using_kernels(args.kernels), run.handling_signals():
        policy, reference, optimizer, task, baseline, base_record, start, rng, meta = set_up(args)
        params = list(policy.parameters())  # a list: clip_grad_norm reads it every step
        history = meta["reinforce"]["history"] if meta is not None else [{"step": 0, **evaluate(policy, reference, task, args, 0)}]
        trained_tokens = history[-1]["trained_tokens"]
        show_measures(history[0], "before")
        started = time.perf_counter()
        run.graceful = True
        for step in range(start, args.steps):
            if run.stop_signal is not None:
                save(args, step, policy, optimizer, task, baseline, base_record, rng, history)
                raise TrainingStopped(f"{cli.signal_name(run.stop_signal)}: interrupted at step {step}; saved to {run.path}; resume with --resume", 128 + run.stop_signal)
            if step % args.eval_interval == 0 and step > start:
                history.append({"step": step, **evaluate(policy, reference, task, args, trained_tokens)})
                show_measures(history[-1], f"step {step}")
                save(args, step, policy, optimizer, task, baseline, base_record, rng, history)
            prompts = [p for p, _ in task.problems("train", args.samples_per_step // args.group_size, rng)]
            rollouts = pg.sample_completions(policy, [task.tokenizer.encode(p) for p in prompts], args.group_size, task.answer_length, args.temperature, stop_id(task), rng)
            rewards = np.array([task.reward(prompts[i], task.tokenizer.decode(c)) for i, c in zip(rollouts.prompt_index, rollouts.completions)])
            logp, ref = pg.rollout_log_probs(policy, reference, rollouts, args.temperature)
            log_ratios = logp.numpy().astype(np.float64) - ref
            if args.estimator == "group":
                advantages = pg.group_advantages(rewards, log_ratios, args.beta, args.group_size)
            else:
                advantages = baseline.advantages(pg.shaped_rewards(rewards, log_ratios, args.beta))
            loss = pg.policy_gradient_loss(logp, advantages)
            if not math.isfinite(loss.item()):
                raise TrainingStopped(f"the loss became {loss.item()} at step {step}; try a lower --learning-rate")
            loss.backward()
            if args.grad_clip > 0:
                optim.clip_grad_norm(params, args.grad_clip)
            optimizer.step()
            optimizer.zero_grad()
            trained_tokens += int((rollouts.lengths - 1).sum())  # the positions the forward and backward ran over
            if (step + 1) % 10 == 0 or step == args.steps - 1:
                console.print(f"step {step + 1}/{args.steps}: mean reward {rewards.mean():.3f}, log-ratio to the reference {log_ratios.mean():+.4f} per answer")
        seconds = time.perf_counter() - started
        if history[-1]["step"] != args.steps:
            history.append({"step": args.steps, **evaluate(policy, reference, task, args, trained_tokens)})
        save(args, args.steps, policy, optimizer, task, baseline, base_record, rng, history)
        run.graceful = False
        results = {"before": history[0], "after": history[-1], "history": history, "seconds": seconds, "beta": args.beta, "estimator": args.estimator}
        show_results(results, args)
        return results


def show_measures(measures, when):
    console.print(
        f"{when}: held-out accuracy {measures['accuracy']:.3f} (greedy); sampled: mean reward {measures['reward']:.3f}, "
        f"KL to the reference {measures['kl']:.5f} per token, answer length {measures['length']:.2f} tokens"
    )


def show_results(results, args):
    table = Table(title=f"{args.estimator}, β = {args.beta:g}, G = {args.group_size} ({escape(str(checkpoint.path_in(args.out_dir)))})")
    for name in ("step", "accuracy", "mean reward", "KL per token", "answer length"):
        table.add_column(name, justify="right")
    for row in results["history"]:
        table.add_row(str(row["step"]), f"{row['accuracy']:.3f}", f"{row['reward']:.3f}", f"{row['kl']:.5f}", f"{row['length']:.2f}")
    console.print(table)
    console.print(f"sample with: python generate.py --out-dir {escape(args.out_dir)}")


if __name__ == "__main__":
    sys.exit(main())
