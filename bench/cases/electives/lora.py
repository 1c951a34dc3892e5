"""LoRA fine-tuning against full fine-tuning: train a base on tinyshakespeare, then fine-tune it on
a second text with LoRA (ranks 4 and 8) and with every weight, and report the parameters trained,
the loss on the second text before and after, the time and the checkpoint's size.

    python bench/run.py lora [--base-iters 500] [--iters 200] [--ranks 4,8]

The base: train.py's default recipe (a character-level GPT, 4 layers, 128 wide) for --base-iters
steps on tinyshakespeare (the cosine decay ends at the last step). The second text: this project's
own documentation, docs/*.md and docs/ops/*.md joined in sorted order: English prose about
autodiff with formulas, far from Shakespeare. Its characters must be in the base's character
vocabulary, which tinyshakespeare's 65 characters are not all of (digits, brackets, `, _, |, ∂, ...):
each such character is replaced by a space, and the case says how many were. Every fine-tuning
run uses the same recipe (learning rate 1e-3 with warmup and cosine decay over --iters steps, the
default batch), alpha = rank, and the default targets c_attn,c_proj; each starts from the same
base, so the loss before is the same for every one (one number: a check).

Then one training step (forward, backward, AdamW's update) of each method, timed alternately in
one process (medians of --repeat steps, after warm-up): the runs above are long and a shared
machine's load moves during them, so their own times compare the methods less well.
"""
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from harness import ROOT, TINYSHAKESPEARE, alternate, conditions_line

import microtensor as mt
import train
from gpt.checkpoints import checkpoint
from gpt.model.electives.lora import add_lora

DOCS = sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "docs" / "ops").glob("*.md"))


def second_text(vocabulary):
    """The docs joined, each character outside the base's vocabulary replaced by a space; and how many were."""
    text = "\n".join(path.read_text(encoding="utf-8") for path in DOCS)
    replaced = sum(1 for c in text if c not in vocabulary)
    return "".join(c if c in vocabulary else " " for c in text), replaced


def run(argv):
    """train.train on argv (the defaults for the rest); its results dict and the wall time."""
    args = train.build_parser().parse_args(argv)
    started = time.perf_counter()
    results = train.train(args)
    return results, time.perf_counter() - started


def step_times(base_dir, ranks, repeat):
    """{method: median seconds of one training step} on the base's model, the methods timed in turns."""
    rng = np.random.default_rng(0)
    vocab_size = checkpoint.load(base_dir)[2]["config"]["vocab_size"]
    x, y = (mt.tensor(rng.integers(0, vocab_size, (12, 64))) for _ in range(2))  # the default batch and block
    steps = {}
    for name, rank in [(f"LoRA r={r}", int(r)) for r in ranks] + [("full fine-tuning", None)]:
        model = checkpoint.load_model(base_dir)[0]
        if rank is not None:
            add_lora(model, rank)
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = mt.optim.AdamW(mt.optim.weight_decay_groups(trainable, 0.1), lr=1e-4)

        def step(model=model, optimizer=optimizer):
            _, loss = model(x, y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

        steps[name] = step
    times = alternate(steps, {}, None, repeat)
    return {name: statistics.median(values) for name, values in times.items()}


def markdown(data):
    """The table of a run's JSON (the dict measure() returns), and the conditions it ran under."""
    summary = data["lora"]
    base, second = summary["base"], summary["second_text"]
    lines = [
        (
            f"The base: {base['steps']} steps on {Path(base['data']).name} ({base['train_time_s']:,.1f} s of training), "
            f"val loss {base['final_val_loss']:.4f}. The second text: {len(second['files'])} files of docs/, "
            f"{second['characters']:,} characters, {second['replaced_by_a_space']:,} of them replaced by a space (not in the base's vocabulary)."
        ),
        "",
        f"| method ({summary['fine_tuning_steps']} steps on docs/) | trainable parameters | val loss before | val loss after | training time (s) | one step, median (ms) | checkpoint (KiB) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in summary["runs"]:
        share = 100 * row["trainable_parameters"] / row["total_parameters"]
        lines.append(
            f"| {row['method']} | {row['trainable_parameters']:,} ({share:.2f}%) | {row['val_loss_before']:.4f} | "
            f"{row['val_loss_after']:.4f} | {row['train_time_s']:,.1f} | {row['step_median_s'] * 1e3:,.1f} | {row['checkpoint_bytes'] / 1024:,.0f} |"
        )
    lines += ["", conditions_line(data["machine"])]
    return "\n".join(lines)


def options(p):
    p.add_argument("--data", default=str(TINYSHAKESPEARE), help="the base's text")
    p.add_argument("--base-iters", type=int, default=500, help="steps of the base's training")
    p.add_argument("--iters", type=int, default=200, help="steps of each fine-tuning")
    p.add_argument("--ranks", default="4,8", help="LoRA ranks to compare, comma-separated")


def measure(args, machine):
    quiet = ["--sample-chars", "0", "--eval-iters", "20"]
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        base_dir = folder / "base"
        base, base_seconds = run(
            ["--data", args.data, "--out-dir", str(base_dir), "--max-iters", str(args.base_iters), "--lr-decay-iters", str(args.base_iters),
             "--warmup-iters", str(min(100, args.base_iters)), "--eval-interval", str(max(args.base_iters, 1)), *quiet]
        )  # fmt: skip
        vocabulary = checkpoint.load(base_dir)[2]["vocab"]
        text, replaced = second_text(set(vocabulary))
        text_path = folder / "docs.txt"
        text_path.write_text(text, encoding="utf-8")
        print(f"second text: {len(DOCS)} files of docs/, {len(text):,} characters, {replaced:,} ({100 * replaced / len(text):.1f}%) replaced by a space")
        ranks = args.ranks.split(",")
        methods = [(f"LoRA r={rank}", ["--lora-rank", rank]) for rank in ranks] + [("full fine-tuning", [])]
        rows = []
        for name, flags in methods:
            out_dir = folder / name.replace(" ", "-").replace("=", "")
            results, seconds = run(
                ["--data", str(text_path), "--out-dir", str(out_dir), "--init-from", str(base_dir), *flags,
                 "--max-iters", str(args.iters), "--lr-decay-iters", str(args.iters), "--warmup-iters", str(max(args.iters // 10, 1)),
                 "--eval-interval", str(max(args.iters, 1)), *quiet]
            )  # fmt: skip
            rows.append({
                "method": name, "trainable_parameters": results["trainable_parameters"], "total_parameters": results["parameters"],
                "val_loss_before": results["initial_val_loss"], "val_loss_after": results["final_val_loss"],
                "train_loss_after": results["final_train_loss"], "train_time_s": results["train_time_s"], "wall_time_s": seconds,
                "tokens_per_s": results["tokens_per_s"], "checkpoint_bytes": checkpoint.path_in(out_dir).stat().st_size,
            })  # fmt: skip
        with mt.using_kernels("fast"):
            medians = step_times(base_dir, ranks, args.repeat or 40)
        for row in rows:
            row["step_median_s"] = medians[row["method"]]
    summary = {
        "base": {"data": Path(args.data).name, "steps": base["steps"], "final_val_loss": base["final_val_loss"], "train_time_s": base["train_time_s"], "wall_time_s": base_seconds},
        "second_text": {"files": [str(path.relative_to(ROOT)) for path in DOCS], "characters": len(text), "replaced_by_a_space": replaced},
        "fine_tuning_steps": args.iters,
        "runs": rows,
    }  # fmt: skip
    return {"machine": machine, "lora": summary}
