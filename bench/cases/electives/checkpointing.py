"""Gradient checkpointing: the GPT's training step with and without --checkpoint-activations, at
block sizes 64, 256 and 1024: what the graph keeps, the peak memory, and the time.

    python bench/run.py checkpointing [--max-t 1024] [--repeat 20]

The default recipe's model (4 layers, 4 heads, 128 wide, float32, fast kernels), the same weights
and batch for both, B · T = 768 tokens per step at every T (B = 12, 3, 1), standard attention at
64 and 256 and online attention at 1024 (the standard kernel's (T, T) probabilities alone would
dwarf the rest there). Per row, for each side:

- graph keeps: the bytes of the distinct arrays the loss's graph holds when the forward ends (every
  tensor reachable from the loss and every array an op saved, the parameters excepted);
- peak RSS growth: how far the resident memory rises above its level before one
  forward+backward, in a process of its own (after a warm-up step, malloc set to give freed
  memory back, the kernel's peak counter reset through /proc/self/clear_refs; "-" where that file
  cannot be written). With checkpointing it includes the one block run again in backward;
- ms: the median time of one forward+backward, the two sides' calls alternating in blocks
  (bench/harness.py's `alternate`), and their ratio (checkpointed over plain: above 1, slower).
"""
import gc
import json
import subprocess
import sys
import time
from pathlib import Path

from harness import HERE, alternate, conditions_line, graph_bytes

RECIPE = dict(n_layer=4, n_head=4, n_embd=128, dropout=0.0)
VOCAB = 65  # tinyshakespeare's characters
TOKENS_PER_STEP = 768  # nanoGPT's laptop recipe: batch 12 of 64
T_VALUES = (64, 256, 1024)
ONLINE_FROM_T = 1024
SECONDS_PER_SIDE = 4.0  # timed calls per side and T: as many as fit, within [MIN_CALLS, --repeat]
MIN_CALLS = 5


def step_parts(T, checkpointing, seed=0):
    """(model, idx, targets) for one row: the same weights and batch whatever `checkpointing`."""
    import numpy as np

    import microtensor as mt
    from gpt.model.transformer import GPT, GPTConfig

    attention = "online" if T >= ONLINE_FROM_T else "standard"
    config = GPTConfig(vocab_size=VOCAB, block_size=T, attention=attention, checkpoint_activations=checkpointing, **RECIPE)
    mt.manual_seed(seed)
    model = GPT(config)
    rng = np.random.default_rng(seed)
    B = max(1, TOKENS_PER_STEP // T)
    idx, targets = (mt.tensor(rng.integers(0, VOCAB, (B, T))) for _ in range(2))
    return model, idx, targets


def forward_backward(model, idx, targets):
    _, loss = model(idx, targets)
    loss.backward()
    for p in model.parameters():
        p.grad = None
    return loss


# --------------------------------------------------------------------------------- peak memory, in a child process


def status_kib(field):
    """A field of /proc/self/status (VmRSS, VmHWM) in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def measure_peak_in_this_process(T, checkpointing):
    """Bytes by which the resident memory peaks above its level before one forward+backward; None
    where the peak counter cannot be reset. Run as a child (see peak_rss_growth)."""
    from microtensor.fast.process import keep_freed_memory

    keep_freed_memory(mmap_threshold=64 << 10, trim_threshold=64 << 10)  # freed arrays leave the process at once
    model, idx, targets = step_parts(T, checkpointing)
    forward_backward(model, idx, targets)  # compiles, and touches every code path once
    gc.collect()
    before = status_kib("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    except OSError:
        return None
    forward_backward(model, idx, targets)
    return (status_kib("VmHWM") - before) * 1024


def peak_rss_growth(T, checkpointing):
    command = [sys.executable, "-m", "cases.electives.checkpointing", str(T), str(int(checkpointing))]
    result = subprocess.run(command, capture_output=True, text=True, check=True, cwd=HERE)
    return json.loads(result.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------- the case


def options(p):
    p.add_argument("--max-t", type=int, default=max(T_VALUES), help="the largest block size to measure")


def measure(args, machine):
    print(f"GPT {RECIPE}, {TOKENS_PER_STEP} tokens per step, float32, fast kernels; forward+backward", flush=True)
    return {"machine": machine, "recipe": {**RECIPE, "tokens_per_step": TOKENS_PER_STEP}, "rows": measure_rows(args)}


def measure_rows(args):
    import numpy as np

    import microtensor as mt

    rows = []
    for T in [t for t in T_VALUES if t <= args.max_t]:
        sides = {"plain": step_parts(T, False), "checkpointed": step_parts(T, True)}
        row = {"T": T, "B": sides["plain"][1].shape[0], "attention": sides["plain"][0].config.attention}
        with mt.using_kernels("fast"):
            losses = {}
            for name, (model, idx, targets) in sides.items():
                _, loss = model(idx, targets)
                row[f"{name}_graph_bytes"] = graph_bytes(loss, model.parameters())
                losses[name] = loss.item()
                del loss
            assert losses["plain"] == losses["checkpointed"], losses  # the same numbers, before anything is timed
            calls = {name: (lambda parts=parts: forward_backward(*parts)) for name, parts in sides.items()}
            start = time.perf_counter()
            for call in calls.values():
                call()
            one_round = time.perf_counter() - start
            n_calls = int(min(args.repeat or 60, max(MIN_CALLS, SECONDS_PER_SIDE * len(calls) / max(one_round, 1e-9))))
            block = 5 if n_calls >= 20 else 1
            times = alternate(calls, {}, None, n_calls, block=block, warmup=1)
        for name in sides:
            row[f"{name}_s"] = float(np.median(times[name]))
            row[f"{name}_peak_rss_growth_bytes"] = peak_rss_growth(T, name == "checkpointed")
        row["checkpointed_over_plain"] = row["checkpointed_s"] / row["plain_s"]
        rows.append(row)
        print_row(row)
    return rows


def fmt_bytes(n):
    if n is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


COLUMNS = (
    "T", "B", "attention", "graph keeps: plain", "graph keeps: checkpointed", "peak RSS growth: plain",
    "peak RSS growth: checkpointed", "ms: plain", "ms: checkpointed", "checkpointed / plain",
)  # fmt: skip


def row_cells(r):
    return [
        str(r["T"]), str(r["B"]), r["attention"], fmt_bytes(r["plain_graph_bytes"]), fmt_bytes(r["checkpointed_graph_bytes"]),
        fmt_bytes(r["plain_peak_rss_growth_bytes"]), fmt_bytes(r["checkpointed_peak_rss_growth_bytes"]),
        f"{r['plain_s'] * 1e3:.1f}", f"{r['checkpointed_s'] * 1e3:.1f}", f"{r['checkpointed_over_plain']:.2f}×",
    ]  # fmt: skip


def print_row(r):
    print("  " + " | ".join(row_cells(r)), flush=True)


def markdown(data):
    """The table of a run's JSON (the dict measure() returns), and the conditions it ran under."""
    recipe = data["recipe"]
    lines = [
        f"GPT of {recipe['n_layer']} layers, {recipe['n_head']} heads, {recipe['n_embd']} wide, float32, "
        f"{recipe['tokens_per_step']} tokens per step; one forward+backward:",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" if i == 2 else "---:" for i in range(len(COLUMNS))) + "|",
    ]
    lines += ["| " + " | ".join(row_cells(r)) + " |" for r in data["rows"]]
    lines += ["", conditions_line(data["machine"])]
    return "\n".join(lines)


if __name__ == "__main__":  # the peak-memory child: python -m cases.electives.checkpointing T CHECKPOINTING
    print(json.dumps(measure_peak_in_this_process(int(sys.argv[1]), sys.argv[2] == "1")))
