"""A selective state-space model (--mixer ssm) against attention at about equal parameters: val loss
at equal steps and at equal time, training and generation speed, and the bytes generation keeps.

    python bench/run.py ssm [--iters 200] [--tokens 200] [--contexts 64,256,1024]

Training: train.py's default recipe (4 layers, 128 wide, block 64, batch 12, learning rate 1e-3
with 30 steps of warmup and a cosine decay to the last step) on tinyshakespeare, --iters steps for
each model; the SSM's blocks have --ssm-expand 1 (inner width 128) and --d-state 16, which keeps
their parameters within a few percent of attention's (the table gives both counts). Val loss over
40 batches. Equal time: one training step of each model is timed alternately (medians), and the
faster model trains again for the steps that take it as long as --iters steps of the slower one.

Generation: --tokens tokens at temperature 0 after a newline, timed in turns (medians of --repeat):
attention by the fast set's one-token decode kernel and through the modules, the SSM through the
modules (the kernel covers attention only).

State: the bytes generation keeps per sequence at contexts of --contexts tokens, and per token:
attention's KV cache grows by 2 · n_layer · C numbers a token, the SSM's state has one size.
"""
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from harness import TINYSHAKESPEARE, conditions_line, decode_kernel_off, in_turns, train_in_process, training_step_seconds

import microtensor as mt
from gpt.checkpoints import checkpoint
from gpt.model.electives.ssm import state_bytes

MODELS = {"attention": [], "ssm": ["--mixer", "ssm", "--ssm-expand", "1", "--d-state", "16"]}


def generation(folders, tokens, repeat):
    """{path: tokens/s} of greedy generation: attention by its kernel and by the modules, the SSM by the modules."""
    models = {name: checkpoint.load_model(folder)[0] for name, folder in folders.items()}
    prompt = np.array([[0]])

    def by(model, kernel=True):
        def go():
            if kernel:
                model.generate(prompt, tokens, temperature=0)
            else:
                with decode_kernel_off():
                    model.generate(prompt, tokens, temperature=0)

        return go

    runs = {"attention, decode kernel": by(models["attention"]), "attention, modules": by(models["attention"], kernel=False), "ssm, modules": by(models["ssm"])}
    times = in_turns(runs, repeat)
    return {name: tokens / statistics.median(values) for name, values in times.items()}


def state_rows(folders, contexts):
    """The bytes generation keeps for one sequence at each context length."""
    attention = checkpoint.load_model(folders["attention"])[0]
    ssm = checkpoint.load_model(folders["ssm"])[0]
    per_token = attention.kv_cache_bytes_per_token()
    fixed = state_bytes(ssm)
    return [
        {"context": T, "kv_cache_bytes": per_token * T, "kv_cache_bytes_per_token": per_token, "ssm_state_bytes": fixed, "ssm_state_bytes_per_token": fixed / T}
        for T in contexts
    ]  # fmt: skip


def options(p):
    p.add_argument("--data", default=str(TINYSHAKESPEARE), help="the text to train on")
    p.add_argument("--iters", type=int, default=200, help="training steps of each model")
    p.add_argument("--tokens", type=int, default=200, help="tokens to generate in the generation comparison")
    p.add_argument("--contexts", default="64,256,1024", help="context lengths of the state table, comma-separated")


def measure(args, machine):
    rows, folders = {}, {}
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        for name, flags in MODELS.items():
            folders[name] = folder / name
            started = time.perf_counter()
            results = train_in_process(args.data, folders[name], flags, args.iters)
            rows[name] = {
                "model": name, "flags": " ".join(flags), "steps": args.iters, "val_loss": results["final_val_loss"],
                "train_loss": results["final_train_loss"], "parameters": results["parameters"],
                "train_time_s": results["train_time_s"], "wall_time_s": time.perf_counter() - started,
            }  # fmt: skip
            print(f"{name}: val loss {results['final_val_loss']:.4f} after {args.iters} steps", flush=True)
        with mt.using_kernels("fast"):
            medians = training_step_seconds(folders, args.repeat or 30)
        for name, row in rows.items():
            row["step_median_s"] = medians[name]
            row["train_tokens_per_s"] = 12 * 64 / medians[name]
        slower = max(medians, key=medians.get)
        faster = min(medians, key=medians.get)
        steps = round(args.iters * medians[slower] / medians[faster])
        results = train_in_process(args.data, folder / f"{faster}-equal-time", MODELS[faster], steps)
        equal_time = {"model": faster, "steps": steps, "val_loss": results["final_val_loss"], "against": slower}
        print(f"{faster} for the time of {args.iters} steps of {slower}: {steps} steps, val loss {results['final_val_loss']:.4f}", flush=True)
        with mt.using_kernels("fast"):
            speeds = generation(folders, args.tokens, args.repeat or 5)
        states = state_rows(folders, [int(T) for T in args.contexts.split(",")])
    recipe_text = {"iters": args.iters, "data": Path(args.data).name, "tokens": args.tokens}
    return {"machine": machine, "recipe": recipe_text, "training": list(rows.values()), "equal_time": equal_time, "generation": speeds, "state": states}


def markdown(data):
    """The tables of a run's JSON (the dict measure() returns), and the conditions it ran under."""
    recipe = data["recipe"]
    equal = data["equal_time"]
    lines = [
        f"train.py's default recipe on {recipe['data']}, {recipe['iters']} steps; the SSM with --mixer ssm --ssm-expand 1 "
        "--d-state 16 in place of attention (val loss over 40 batches). Equal time: the faster model trained again "
        "for as many steps as take it the time of the slower one's (one step of each timed alternately, medians).",
        "",
        "| mixer | parameters | one step (ms) | training tokens/s | val loss, equal steps | val loss, equal time (its steps) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in data["training"]:
        at_equal_time = f"{equal['val_loss']:.4f} ({equal['steps']})" if row["model"] == equal["model"] else f"{row['val_loss']:.4f} ({row['steps']})"
        lines.append(
            f"| {row['model']} | {row['parameters']:,} | {row['step_median_s'] * 1e3:,.1f} | {row['train_tokens_per_s']:,.0f} | "
            f"{row['val_loss']:.4f} | {at_equal_time} |"
        )
    lines += [
        "",
        f"Greedy generation of {recipe['tokens']} tokens after a newline (medians of runs in turns):",
        "",
        "| path | tokens/s |",
        "|---|---:|",
        *(f"| {path} | {speed:,.0f} |" for path, speed in data["generation"].items()),
        "",
        "Bytes generation keeps for one sequence (float32): attention's KV cache grows with the context, the SSM's state does not.",
        "",
        "| context | KV cache | per token | SSM state | per token |",
        "|---:|---:|---:|---:|---:|",
        *(
            f"| {row['context']:,} | {row['kv_cache_bytes']:,} | {row['kv_cache_bytes_per_token']:,} | "
            f"{row['ssm_state_bytes']:,} | {row['ssm_state_bytes_per_token']:,.0f} |"
            for row in data["state"]
        ),
        "",
        conditions_line(data["machine"]),
    ]
    return "\n".join(lines)
