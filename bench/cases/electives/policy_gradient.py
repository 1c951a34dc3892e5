"""Policy-gradient fine-tuning on 2-digit addition, for two values of β, against supervised training
on the same compute: held-out exact-match accuracy, mean reward, KL to the reference and answer
length over the steps.

    python bench/run.py policy_gradient [--base-iters 200] [--steps 120] [--betas 0.02,0.5]

The base: a GPT (2 layers, 64 wide, a block of one problem) trained by train.py --data addition
for --base-iters steps, on purpose only partly: it leaves room to improve. Then reinforce.py from
that base with the group-relative estimator (G = 8, 64 answers a step, temperature 1) for --steps
steps with each β, and once with REINFORCE and its running baseline at the first β; every run
draws the same problems (one seed). The supervised run is the base's own training continued
(train.py --resume) for as many steps as cover the same forward and backward tokens as a
fine-tuning: the positions of its rows (64 rows of one problem per step both ways); it is resumed
in parts and measured after each (a resumed run is the same run, bit for bit). Sampling and
the reference's forward are a fine-tuning's extra cost, left out of that count (they run without a
backward). Measured on the same held-out sums, never trained on: greedy exact match, and of one
answer sampled per sum, the mean reward, the per-token KL(π ‖ π_ref) and the answer's length.
"""
import math
import shutil
import tempfile
import time
from pathlib import Path

from harness import conditions_line

import reinforce
import train
from gpt.text.electives.addition import AdditionTask

BASE_FLAGS = ["--data", "addition", "--addition-digits", "2", "--n-layer", "2", "--n-head", "4", "--n-embd", "64", "--batch-size", "64", "--learning-rate", "3e-3", "--warmup-iters", "20"]  # fmt: skip


def markdown(data):
    summary = data["policy_gradient"]
    base = summary["base"]
    lines = [
        (
            f"The base: {base['steps']} steps of train.py --data addition (2-digit sums; 2 layers, 64 wide), greedy exact match "
            f"{base['accuracy']:.3f} on {summary['eval_problems']} held-out sums. Then {summary['steps']} steps of {summary['samples_per_step']} "
            f"sampled answers (G = {summary['group_size']}, learning rate {summary['learning_rate']:g}), or {summary['supervised']['steps']} more "
            f"supervised steps of {summary['supervised']['batch_size']} problems: {summary['supervised']['tokens']:,} forward and backward tokens, "
            f"the fine-tunings' {summary['runs'][0]['history'][-1]['trained_tokens']:,}."
        ),
        "",
        "| run | step | exact match | mean reward (sampled) | KL(π ‖ π_ref) per token | answer length (tokens) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for run in summary["runs"]:
        for row in run["history"]:
            lines.append(f"| {run['name']} | {row['step']} | {row['accuracy']:.3f} | {row['reward']:.3f} | {row['kl']:.4f} | {row['length']:.2f} |")
    sup = summary["supervised"]
    lines += [f"| supervised (train.py --resume) | {row['step']} | {row['accuracy']:.3f} | | | |" for row in sup["history"]]
    lines += ["", "| run | seconds |", "|---|---:|"]
    lines += [f"| {run['name']} | {run['seconds']:,.1f} |" for run in summary["runs"]] + [f"| supervised | {sup['seconds']:,.1f} |"]
    lines += ["", conditions_line(data["machine"])]
    return "\n".join(lines)


def options(p):
    p.add_argument("--base-iters", type=int, default=200, help="steps of the base's supervised training")
    p.add_argument("--steps", type=int, default=120, help="fine-tuning steps for each run")
    p.add_argument("--betas", default="0.02,0.5", help="values of β for the group-relative runs, comma-separated")
    p.add_argument("--learning-rate", type=float, default=1e-4, help="the fine-tunings' learning rate")
    p.add_argument("--eval-problems", type=int, default=500, help="held-out sums measured")


def measure(args, machine):
    samples, group = 64, 8
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        base_dir = folder / "base"
        decay = str(args.base_iters * 10)  # a slow cosine: the supervised run continues at about the same learning rate
        base = train.train(train.build_parser().parse_args([
            *BASE_FLAGS, "--out-dir", str(base_dir), "--max-iters", str(args.base_iters), "--lr-decay-iters", decay,
            "--eval-interval", str(args.base_iters), "--eval-iters", "2", "--sample-chars", "0",
        ]))  # fmt: skip
        settings = [(f"group, β = {beta}", "group", beta) for beta in args.betas.split(",")]
        settings.append((f"REINFORCE, β = {args.betas.split(',')[0]}", "reinforce", args.betas.split(",")[0]))
        runs = []
        for name, estimator, beta in settings:
            started = time.perf_counter()
            results = reinforce.fine_tune(reinforce.build_parser().parse_args([
                "--init-from", str(base_dir), "--out-dir", str(folder / f"run-{len(runs)}"), "--estimator", estimator, "--beta", beta,
                "--group-size", str(group), "--samples-per-step", str(samples), "--steps", str(args.steps),
                "--eval-interval", str(max(1, args.steps // 6)), "--eval-problems", str(args.eval_problems), "--learning-rate", str(args.learning_rate),
            ]))  # fmt: skip
            runs.append({"name": name, "estimator": estimator, "beta": float(beta), "history": results["history"], "seconds": time.perf_counter() - started})
        # The same forward and backward tokens: a supervised step runs batch_size rows of block_size positions.
        tokens = runs[0]["history"][-1]["trained_tokens"]
        block = AdditionTask(2).problem_length - 1  # train.py's block for the task: one problem, less its last token
        steps = math.ceil(tokens / (64 * block))
        supervised_dir = folder / "supervised"
        shutil.copytree(base_dir, supervised_dir)
        started = time.perf_counter()
        history = [{"step": 0, "accuracy": runs[0]["history"][0]["accuracy"]}]
        interval = max(1, args.steps // 6)
        for done in [*range(interval, steps, interval), steps]:  # resumed in parts (exactly as in one run), measured after each
            results = train.train(train.build_parser().parse_args([
                "--out-dir", str(supervised_dir), "--resume", "--max-iters", str(args.base_iters + done),
                "--eval-interval", str(args.base_iters + steps), "--eval-iters", "2", "--sample-chars", "0",
            ]))  # fmt: skip
            history.append({"step": done, "accuracy": results["val_exact_match"]})
        supervised_seconds = time.perf_counter() - started
    summary = {
        "base": {"steps": base["steps"], "accuracy": runs[0]["history"][0]["accuracy"], "final_val_loss": base["final_val_loss"]},
        "steps": args.steps, "samples_per_step": samples, "group_size": group, "learning_rate": args.learning_rate,
        "eval_problems": args.eval_problems, "runs": runs,
        "supervised": {"steps": steps, "batch_size": 64, "tokens": steps * 64 * block, "history": history, "seconds": supervised_seconds},
    }  # fmt: skip
    return {"machine": machine, "policy_gradient": summary}
