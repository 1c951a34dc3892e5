"""16-bit training against float32: train.py's default recipe trained for --iters steps with
--dtype float32, float16 and bfloat16, and one training step of each measured.

    python bench/run.py mixed_precision [--iters 500] [--repeat 20]

The runs: train.py's defaults (4 layers, 4 heads, 128 wide, block 64, batch 12, AdamW, warmup and
cosine decay ending at the last step, the same seed, so the same initial weights and batches) on
tinyshakespeare, --iters steps each, evaluated once at the end (20 batches of each split); float16
with train.py's loss scaling (--loss-scale-interval 200), and once more with S fixed at 1 (an
overflow still skips the step), to see what the scaling is for. Per dtype:

- val loss at the end, and its difference from float32's at the same step;
- skipped steps and the final loss scale (float16 only);
- saved for backward: the bytes of the arrays the graph's ops saved other than their inputs and
  outputs (`mixed_precision.saved_bytes`), what 16-bit storage shrinks; graph keeps: every array
  the graph of one forward holds (tensors and saved arrays, the parameters excepted);
- peak traced: the highest memory numpy allocated during one forward+backward above its level
  before it (tracemalloc);
- ms: the median of one training step (forward, backward, AdamW), the three alternating in
  blocks (bench/harness.py's `alternate`). The losses do not depend on the machine's load; the
  times do, and are noisy on a shared machine.
"""
import statistics
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np
from harness import TINYSHAKESPEARE, alternate, conditions_line, graph_bytes

import microtensor as mt
import train
from microtensor.ops.electives import mixed_precision as mp

DTYPES = ("float32", "float16", "bfloat16")
UNSCALED = "float16, no loss scaling"  # a fourth run: what loss scaling is for
VOCAB = 65  # tinyshakespeare's characters


def options(p):
    p.add_argument("--data", default=str(TINYSHAKESPEARE), help="the text to train on")
    p.add_argument("--iters", type=int, default=500, help="training steps of each run")


class NoLossScaling(mt.LossScaler):
    """S = 1 for good: float16 without loss scaling (a step whose gradients overflow is still skipped)."""

    def __init__(self, growth_interval=200):
        super().__init__(init_scale=1.0, growth_interval=growth_interval)

    def update(self):
        self.found_inf = False


def train_run(data, dtype, iters, folder):
    if dtype == UNSCALED:  # train.py builds its scaler as mt.LossScaler: this run, one that never scales
        scaler_class, mt.LossScaler = mt.LossScaler, NoLossScaling
        try:
            return train_run(data, "float16", iters, folder / "unscaled")
        finally:
            mt.LossScaler = scaler_class
    argv = ["--data", data, "--out-dir", str(folder / dtype), "--dtype", dtype, "--max-iters", str(iters),
            "--lr-decay-iters", str(iters), "--warmup-iters", str(min(100, iters)), "--eval-interval", str(max(iters, 1)),
            "--eval-iters", "20", "--sample-chars", "0"]  # fmt: skip
    return train.train(train.build_parser().parse_args(argv))


def step_parts(dtype, seed=0):
    """(one training step, its model, the batch) of the default recipe in `dtype`."""
    from gpt.model.transformer import GPT, GPTConfig

    mt.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=VOCAB))
    rng = np.random.default_rng(seed)
    idx, targets = (mt.tensor(rng.integers(0, VOCAB, (12, 64))) for _ in range(2))
    optimizer = mt.optim.AdamW(mt.optim.weight_decay_groups(list(model.parameters()), 0.1), lr=1e-4)
    scaler = mt.LossScaler() if dtype == "float16" else None

    def block():
        return mt.autocast(dtype, model.parameters()) if dtype != "float32" else _nothing()

    def step():
        with block():
            _, loss = model(idx, targets)
            (loss if scaler is None else scaler.scale(loss)).backward()
        if scaler is not None:
            scaler.unscale(model.parameters())
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad()

    def memory():
        with block():
            _, loss = model(idx, targets)
            saved, kept = mp.saved_bytes(loss), graph_bytes(loss, model.parameters(), unpack=lambda a: a.bits if isinstance(a, mp.Packed) else a)
            del loss
        optimizer.zero_grad()
        tracemalloc.start()
        with block():
            _, loss = model(idx, targets)
            loss.backward()
            del loss
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        optimizer.zero_grad()
        return saved, kept, peak

    return step, memory


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False


def measure(args, machine):
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for dtype in (*DTYPES, UNSCALED):
            results = train_run(args.data, dtype, args.iters, Path(folder))
            rows.append({
                "dtype": dtype, "val_loss": results["final_val_loss"], "train_loss": results["final_train_loss"],
                "skipped_steps": results["skipped_steps"], "loss_scale": results["loss_scale"], "train_time_s": results["train_time_s"],
            })  # fmt: skip
            print(f"{dtype}: val loss {results['final_val_loss']:.4f}, skipped {results['skipped_steps']}", flush=True)
    steps = {}
    with mt.using_kernels("fast"):
        for row in rows[: len(DTYPES)]:
            step, memory = step_parts(row["dtype"])
            step()  # compiles, and touches every path once
            row["saved_bytes"], row["graph_bytes"], row["peak_traced_bytes"] = memory()
            steps[row["dtype"]] = step
        times = alternate(steps, {}, None, args.repeat or 20, block=5, warmup=1)
    for row in rows[: len(DTYPES)]:
        row["step_median_s"] = statistics.median(times[row["dtype"]])
    return {"machine": machine, "iters": args.iters, "data": Path(args.data).name, "rows": rows}


def fmt_bytes(n):
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def markdown(data):
    """The table of a run's JSON (the dict measure() returns), and the conditions it ran under."""
    rows = {row["dtype"]: row for row in data["rows"]}
    base = rows["float32"]
    lines = [
        f"train.py's default recipe (4 layers, 128 wide, block 64, batch 12) for {data['iters']} steps on {data['data']}, "
        "each dtype from the same seed; memory and time of one training step (times noisy: a shared machine):",
        "",
        "| dtype | val loss | vs float32 | skipped steps | loss scale at the end | saved for backward | graph keeps | peak traced | step, median (ms) | step / float32's |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in data["rows"]:
        scale = "-" if row["loss_scale"] is None else f"{row['loss_scale']:g}"
        skipped = f"{row['skipped_steps']}" if row["dtype"].startswith("float16") else "-"
        measured = "step_median_s" in row  # the unscaled run's step is float16's
        lines.append(
            f"| {row['dtype']} | {row['val_loss']:.4f} | {row['val_loss'] - base['val_loss']:+.4f} | {skipped} | {scale} | "
            + (
                f"{fmt_bytes(row['saved_bytes'])} | {fmt_bytes(row['graph_bytes'])} | {fmt_bytes(row['peak_traced_bytes'])} | "
                f"{row['step_median_s'] * 1e3:.1f} | {row['step_median_s'] / base['step_median_s']:.2f}× |"
                if measured else "as float16 | | | | |"
            )
        )
    lines += ["", conditions_line(data["machine"])]
    return "\n".join(lines)
