"""DPO on the built-in preference task, for two values of β: held-out preference accuracy, the
implicit reward margin and the KL from the reference, before and after.

    python bench/run.py dpo [--base-iters 300] [--iters 100] [--betas 0.1,0.5]

The base: a small character-level GPT (2 layers, 64 wide, block 64) trained by train.py for
--base-iters steps on tinyshakespeare, briefly on purpose: a model that already knows word order
well leaves DPO little to do. Then dpo.py from that base on the built-in task (a line, its real
next line against the same line with its words shuffled; held out: the pairs from the text's last
10%) for --iters steps with each β, every weight trained, the same pairs in the same order (one
seed), and once more with LoRA adapters (--lora-rank, learning rate 3e-3: an adapter starts at
zero and needs larger steps) at the first β, whose reference is the base itself. Measured on the
same --eval-pairs held-out pairs: the fraction whose implicit reward margin
β m is > 0 (0 before: the policy is the reference), the fraction the policy itself prefers the
right way (log π(y⁺) > log π(y⁻)), the mean implicit reward margin, and the mean per-token
KL(π ‖ π_ref) at the chosen continuations' positions.
"""
import tempfile
import time
from pathlib import Path

from harness import TINYSHAKESPEARE, conditions_line

import dpo
import train


def markdown(data):
    summary = data["dpo"]
    base = summary["base"]
    lines = [
        (
            f"The base: {base['steps']} steps of train.py on {base['data']} (2 layers, 64 wide, block 64; val loss "
            f"{base['final_val_loss']:.4f}). Then {summary['iters']} DPO steps of {summary['batch_size']} pairs "
            f"(learning rate {summary['learning_rate']:g} for every weight, 3e-3 for LoRA), measured on {summary['eval_pairs']} held-out pairs."
        ),
        "",
        "| β | trained | preference accuracy before → after | log π(y⁺) > log π(y⁻) before → after | reward margin before → after | DPO loss before → after | KL(π ‖ π_ref) per token after | time (s) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in summary["runs"]:
        b, a = row["before"], row["after"]
        lines.append(
            f"| {row['beta']:g} | {row.get('trained', 'every weight')} | {b['accuracy']:.3f} → {a['accuracy']:.3f} | {b['likelihood_accuracy']:.3f} → {a['likelihood_accuracy']:.3f} | "
            f"{b['reward_margin']:+.3f} → {a['reward_margin']:+.3f} | {b['loss']:.4f} → {a['loss']:.4f} | {a['kl']:.4f} | {row['seconds']:,.1f} |"
        )
    lines += ["", conditions_line(data["machine"])]
    return "\n".join(lines)


def options(p):
    p.add_argument("--data", default=str(TINYSHAKESPEARE), help="the base's text, and the built-in task's")
    p.add_argument("--base-iters", type=int, default=300, help="steps of the base's training")
    p.add_argument("--iters", type=int, default=100, help="DPO steps for each β")
    p.add_argument("--betas", default="0.1,0.5", help="values of β, comma-separated")
    p.add_argument("--eval-pairs", type=int, default=128, help="held-out pairs measured")
    p.add_argument("--lora-rank", type=int, default=8, help="the rank of the LoRA run (0: none)")


def measure(args, machine):
    batch_size, learning_rate = 8, 3e-4
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        base_dir = folder / "base"
        base = train.train(train.build_parser().parse_args([
            "--data", args.data, "--out-dir", str(base_dir), "--n-layer", "2", "--n-head", "4", "--n-embd", "64", "--block-size", "64",
            "--max-iters", str(args.base_iters), "--lr-decay-iters", str(args.base_iters), "--warmup-iters", str(min(50, args.base_iters)),
            "--eval-interval", str(max(args.base_iters, 1)), "--eval-iters", "10", "--sample-chars", "0",
        ]))  # fmt: skip
        runs = []
        betas = args.betas.split(",")
        settings = [(beta, "every weight", [], learning_rate) for beta in betas]
        if args.lora_rank:
            settings.append((betas[0], f"LoRA r={args.lora_rank}", ["--lora-rank", str(args.lora_rank)], 3e-3))
        for beta, trained, flags, lr in settings:
            started = time.perf_counter()
            results = dpo.fine_tune(dpo.build_parser().parse_args([
                "--init-from", str(base_dir), "--data", args.data, "--out-dir", str(folder / f"dpo-{beta}-{len(runs)}"), "--beta", beta,
                "--max-iters", str(args.iters), "--eval-interval", str(max(args.iters, 1)), "--eval-pairs", str(args.eval_pairs),
                "--batch-size", str(batch_size), "--learning-rate", str(lr), *flags,
            ]))  # fmt: skip
            runs.append({
                "beta": float(beta), "trained": trained, "learning_rate": lr, "before": results["before"], "after": results["after"],
                "seconds": time.perf_counter() - started, "trainable_parameters": results["trainable_parameters"],
            })  # fmt: skip
    summary = {
        "base": {"data": Path(args.data).name, "steps": base["steps"], "final_val_loss": base["final_val_loss"]},
        "iters": args.iters, "batch_size": batch_size, "learning_rate": learning_rate, "eval_pairs": args.eval_pairs, "runs": runs,
    }  # fmt: skip
    return {"machine": machine, "dpo": summary}
