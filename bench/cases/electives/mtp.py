"""Multi-token prediction: the next-token head's val loss with --mtp 1 (the baseline), 2 and 4, at
equal steps and at equal time, and self-speculative decoding's acceptance rate and speed against
plain greedy decoding of the same model.

    python bench/run.py mtp [--iters 200] [--mtp 1,2,4] [--tokens 200]

Training: train.py's default recipe (4 layers, 128 wide, block 64, batch 12, learning rate 1e-3
with 30 steps of warmup and a cosine decay to the last step) on tinyshakespeare, --iters steps for
each --mtp n; the val loss is the next-token head's, over 40 batches. Equal time: one training
step of each model is timed alternately (medians), and the baseline trains again for the steps
that take it as long as --iters steps of model n (same recipe, the decay ending at its last step).

Decoding: from each trained model with extra heads, at temperature 0 after a newline, as many
tokens as fill the block (--tokens, if given, fewer), so that no window moves (a move rebuilds the
cache through the modules, a cost that is neither side's): plain greedy decoding (GPT.generate:
the decode kernel, and the modules with the KV cache) and self-speculative decoding (the decode
kernel's rounds in one call; its tokens must be greedy's: checked), the three timed in turns
(medians of --repeat, default 15).
"""
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from harness import TINYSHAKESPEARE, conditions_line, decode_kernel_off, in_turns, train_in_process, training_step_seconds

import microtensor as mt
from gpt.checkpoints import checkpoint
from gpt.generation.electives.self_speculative import self_speculative_generate


def decoding(folder, tokens, repeat):
    """Plain greedy (kernel, modules) and self-speculative decoding of one model, timed in turns."""
    model = checkpoint.load_model(folder)[0]
    tokens = min(tokens or model.config.block_size, model.config.block_size - 1)  # from 1 token to a full block
    prompt = np.array([[0]])
    results = {}

    def plain():
        results["plain"] = model.generate(prompt, tokens, temperature=0).numpy()[0, 1:]

    def modules():
        with decode_kernel_off():
            results["modules"] = model.generate(prompt, tokens, temperature=0).numpy()[0, 1:]

    def drafted():
        results["self"], results["stats"] = self_speculative_generate(model, prompt, tokens, temperature=0)

    times = in_turns({"plain": plain, "modules": modules, "self": drafted}, repeat)
    stats = results["stats"]
    return {
        "same_tokens_as_greedy": bool(np.array_equal(results["self"], results["plain"])),
        "acceptance_rate": stats.acceptance_rate, "tokens_per_forward": stats.tokens_per_round,
        "proposed": stats.proposed, "accepted": stats.accepted,
        "tokens": tokens,
        **{f"{name}_tokens_per_s": tokens / statistics.median(values) for name, values in times.items()},
        "self_over_plain_by_round": statistics.median(p / s for p, s in zip(times["plain"], times["self"])),
    }  # fmt: skip


def options(p):
    p.add_argument("--data", default=str(TINYSHAKESPEARE), help="the text to train on")
    p.add_argument("--iters", type=int, default=200, help="training steps of each model")
    p.add_argument("--mtp", default="1,2,4", help="values of --mtp to train, comma-separated (1, the baseline, is added)")
    p.add_argument("--tokens", type=int, default=0, help="tokens to generate in the decoding comparison (0: as many as fill the block)")


def measure(args, machine):
    heads = sorted({1, *(int(n) for n in args.mtp.split(","))})
    rows, equal_time, decode_rows = [], [], []
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        folders = {}
        for n in heads:
            folders[n] = folder / f"mtp{n}"
            started = time.perf_counter()
            results = train_in_process(args.data, folders[n], ["--mtp", str(n)], args.iters)
            rows.append({
                "mtp": n, "steps": args.iters, "val_loss": results["final_val_loss"], "train_loss": results["final_train_loss"],
                "val_head_losses": results.get("final_val_head_losses", [results["final_val_loss"]]),
                "parameters": results["parameters"], "train_time_s": results["train_time_s"], "wall_time_s": time.perf_counter() - started,
            })  # fmt: skip
            print(f"--mtp {n}: val loss {results['final_val_loss']:.4f} after {args.iters} steps", flush=True)
        with mt.using_kernels("fast"):
            medians = training_step_seconds(folders, args.repeat or 30)
        for row in rows:
            row["step_median_s"] = medians[row["mtp"]]
        for n in heads[1:]:
            steps = round(args.iters * medians[n] / medians[1])
            results = train_in_process(args.data, folder / f"base-for-{n}", ["--mtp", "1"], steps)
            equal_time.append({"mtp": n, "baseline_steps": steps, "baseline_val_loss": results["final_val_loss"]})
            print(f"baseline for the time of --mtp {n}: {steps} steps, val loss {results['final_val_loss']:.4f}", flush=True)
        with mt.using_kernels("fast"):
            for n in heads[1:]:
                decode_rows.append({"mtp": n, **decoding(folders[n], args.tokens, args.repeat or 15)})
    recipe_text = {"iters": args.iters, "data": Path(args.data).name}
    return {"machine": machine, "recipe": recipe_text, "training": rows, "equal_time": equal_time, "decoding": decode_rows}


def markdown(data):
    """The tables of a run's JSON (the dict measure() returns), and the conditions it ran under."""
    training, by_n = data["training"], {row["mtp"]: row for row in data["training"]}
    base = by_n[1]
    lines = [
        f"train.py's default recipe on {data['recipe']['data']}; val loss of the next-token head (40 batches). "
        "Equal time: the baseline (--mtp 1) trained for as many steps as take it the time of the model's steps "
        "(one step of each timed alternately, medians).",
        "",
        "| --mtp | parameters | one step (ms) | val loss, equal steps | baseline at equal steps | val loss of heads 2 .. n | baseline at equal time (its steps) |",
        "|---:|---:|---:|---:|---:|---|---:|",
    ]
    equal = {row["mtp"]: row for row in data["equal_time"]}
    for row in training:
        same_time = equal.get(row["mtp"])
        lines.append(
            f"| {row['mtp']} | {row['parameters']:,} | {row['step_median_s'] * 1e3:,.1f} | {row['val_loss']:.4f} | "
            f"{base['val_loss']:.4f} ({row['steps']}) | {' '.join(f'{v:.3f}' for v in row['val_head_losses'][1:]) or '-'} | "
            + (f"{same_time['baseline_val_loss']:.4f} ({same_time['baseline_steps']}) |" if same_time else "- |")
        )
    if data["decoding"]:
        lines += [
            "",
            f"Greedy decoding of {data['decoding'][0]['tokens']} tokens after a newline from each model (medians of runs in turns):",
            "",
            "| --mtp | self-speculative = greedy | acceptance rate | tokens per forward | plain greedy, decode kernel (tok/s) | plain greedy, modules (tok/s) | self-speculative (tok/s) | speed-up over modules | over the kernel |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in data["decoding"]:
            lines.append(
                f"| {row['mtp']} | {'yes' if row['same_tokens_as_greedy'] else 'NO'} | {row['acceptance_rate']:.0%} | "
                f"{row['tokens_per_forward']:.2f} | {row['plain_tokens_per_s']:,.0f} | {row['modules_tokens_per_s']:,.0f} | "
                f"{row['self_tokens_per_s']:,.0f} | {row['self_tokens_per_s'] / row['modules_tokens_per_s']:.2f}× | "
                f"{row['self_tokens_per_s'] / row['plain_tokens_per_s']:.2f}× |"
            )
    lines += ["", conditions_line(data["machine"])]
    return "\n".join(lines)
