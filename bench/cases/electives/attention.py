"""Standard against online (FlashAttention-style) attention, T = 64 to 4096: what each keeps for
backward, the memory a forward+backward needs at its peak, and its time.

Causal self-attention of B = 1, H = 4 heads of D = 32, float32, forward then backward with a
fixed upstream gradient. The fast kernel set at every T; the readable one too up to T = 512
(its plain loops take seconds beyond). Per row:

- saved: the bytes of the arrays the op keeps for backward besides q, k and v themselves: the
  standard op's P (B, H, T, T), the online op's O (B, H, T, D) and L (B, H, T).
- peak RSS growth: how far the process's resident memory rises above where it was, during one
  forward+backward, measured in a process of its own (after a warm-up call at the same T, with
  malloc set to give freed memory back, and the kernel's peak counter reset through
  /proc/self/clear_refs); "-" where that file cannot be written.
- ms: the median time of one forward+backward, calls of the two ops alternating in blocks
  (bench/harness.py's `alternate`); their ratio (above 1: online is faster).

--tile-sizes 32,64,128,256 adds, for the fast set, the online op's time at each tile size.
"""
import gc
import json
import subprocess
import sys
import time
from pathlib import Path

from harness import HERE, alternate, conditions_line

B, H, D = 1, 4, 32
T_VALUES = (64, 128, 256, 512, 1024, 2048, 4096)
READABLE_MAX_T = 512
SECONDS_PER_OP = 4.0  # timed calls per op and T: as many as fit in this, within [MIN_CALLS, --repeat]
MIN_CALLS = 5


def attention_ops(tile_size=None):
    """{name: fn(q, k, v)} of the two ops compared."""
    import microtensor.functional as F
    from microtensor.ops.electives.online_attention import online_attention

    return {
        "standard": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=True),
        "online": lambda q, k, v: online_attention(q, k, v, causal=True, tile_size=tile_size),
    }


def make_inputs(T, seed=0):
    """q, k, v (B, H, T, D) float32 leaves and the upstream gradient."""
    import numpy as np

    import microtensor as mt

    rng = np.random.default_rng(seed)
    q, k, v = (mt.tensor(rng.standard_normal((B, H, T, D)).astype(np.float32), requires_grad=True) for _ in range(3))
    return q, k, v, rng.standard_normal((B, H, T, D)).astype(np.float32)


def forward_backward(fn, q, k, v, upstream):
    fn(q, k, v).backward(upstream)
    for t in (q, k, v):
        t.grad = None


# --------------------------------------------------------------------------------- peak memory, in a child process


def status_kib(field):
    """A field of /proc/self/status (VmRSS, VmHWM) in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def measure_peak_in_this_process(op, kernels, T):
    """Bytes by which the resident memory peaks above its level before one forward+backward; None
    where the peak counter cannot be reset. Run as a child (see peak_rss_growth)."""
    import microtensor as mt
    from microtensor.fast.process import keep_freed_memory

    keep_freed_memory(mmap_threshold=64 << 10, trim_threshold=64 << 10)  # freed arrays leave the process at once
    fn = attention_ops()[op]
    q, k, v, upstream = make_inputs(T)
    with mt.using_kernels(kernels):
        forward_backward(fn, q, k, v, upstream)  # compiles, and touches every code path once
        gc.collect()
        before = status_kib("VmRSS")
        try:
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        except OSError:
            return None
        forward_backward(fn, q, k, v, upstream)
        peak = status_kib("VmHWM")
    return (peak - before) * 1024


def peak_rss_growth(op, kernels, T):
    command = [sys.executable, "-m", "cases.electives.attention", op, kernels, str(T)]
    result = subprocess.run(command, capture_output=True, text=True, check=True, cwd=HERE)
    return json.loads(result.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------- the case


def saved_bytes(fn, q, k, v):
    """Bytes of the arrays fn's Function keeps for backward, besides the inputs q, k, v."""
    import numpy as np

    out = fn(q, k, v)
    inputs = [t.numpy() for t in (q, k, v)]
    kept = [a for a in out._ctx.saved_tensors if isinstance(a, np.ndarray) and not any(a is x for x in inputs)]
    return sum(a.nbytes for a in kept)


def time_ops(ops, T, kernels, repeat):
    """{name: median seconds of one forward+backward}, the ops' calls alternating in blocks."""
    import numpy as np

    import microtensor as mt

    q, k, v, upstream = make_inputs(T)
    calls = {name: (lambda fn=fn: forward_backward(fn, q, k, v, upstream)) for name, fn in ops.items()}
    with mt.using_kernels(kernels):
        for call in calls.values():
            call()  # compile
        start = time.perf_counter()
        for call in calls.values():
            call()
        one_round = time.perf_counter() - start
        n_calls = int(min(repeat, max(MIN_CALLS, SECONDS_PER_OP * len(calls) / max(one_round, 1e-9))))
        block = 5 if n_calls >= 20 else 1
        times = alternate(calls, {}, None, n_calls, block=block, warmup=1)
    return {name: float(np.median(values)) for name, values in times.items()}


def options(p):
    p.add_argument("--max-t", type=int, default=max(T_VALUES), help="the largest T to measure")
    p.add_argument("--tile-sizes", type=lambda s: [int(n) for n in s.split(",")], default=None, help="e.g. 32,64,128,256")


def measure(args, machine):
    print(f"causal attention, B = {B}, H = {H}, D = {D}, float32; forward+backward", flush=True)
    return {"machine": machine, "shape": {"B": B, "H": H, "D": D, "dtype": "float32", "causal": True}, "rows": measure_rows(args)}


def measure_rows(args):
    import microtensor as mt

    rows = []
    for T in [t for t in T_VALUES if t <= args.max_t]:
        for kernels in ("fast", "readable"):
            if kernels == "readable" and T > READABLE_MAX_T:
                continue
            ops = attention_ops()
            q, k, v, _ = make_inputs(T)
            with mt.using_kernels(kernels):
                saved = {name: saved_bytes(fn, q, k, v) for name, fn in ops.items()}
            peaks = {name: peak_rss_growth(name, kernels, T) for name in ops}
            seconds = time_ops(ops, T, kernels, args.repeat or 60)
            row = {"T": T, "kernels": kernels}
            for name in ops:
                row[f"{name}_saved_bytes"] = saved[name]
                row[f"{name}_peak_rss_growth_bytes"] = peaks[name]
                row[f"{name}_forward_backward_s"] = seconds[name]
            row["standard_over_online"] = seconds["standard"] / seconds["online"]
            if kernels == "fast" and args.tile_sizes:
                tiled = {f"online tile {n}": attention_ops(n)["online"] for n in args.tile_sizes}
                row["online_by_tile_size_s"] = {name.split()[-1]: s for name, s in time_ops(tiled, T, kernels, args.repeat or 60).items()}
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


def fmt_ms(seconds):
    return f"{seconds * 1e3:.2f}"


COLUMNS = (
    "T", "kernels", "saved: standard", "saved: online", "peak RSS growth: standard", "peak RSS growth: online",
    "ms fwd+bwd: standard", "ms fwd+bwd: online", "standard / online",
)  # fmt: skip


def row_cells(r):
    return [
        str(r["T"]), r["kernels"], fmt_bytes(r["standard_saved_bytes"]), fmt_bytes(r["online_saved_bytes"]),
        fmt_bytes(r["standard_peak_rss_growth_bytes"]), fmt_bytes(r["online_peak_rss_growth_bytes"]),
        fmt_ms(r["standard_forward_backward_s"]), fmt_ms(r["online_forward_backward_s"]), f"{r['standard_over_online']:.2f}×",
    ]  # fmt: skip


def print_row(r):
    print("  " + " | ".join(row_cells(r)), flush=True)


def markdown(data):
    """The tables of a run's JSON (the dict measure() returns), and the conditions it ran under."""
    rows, shape = data["rows"], data["shape"]
    lines = [f"Causal attention, B = {shape['B']}, H = {shape['H']}, D = {shape['D']}, {shape['dtype']}; forward+backward:", ""]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---:" if i != 1 else "---" for i in range(len(COLUMNS))) + "|"]
    lines += ["| " + " | ".join(row_cells(r)) + " |" for r in rows]
    tiled = [r for r in rows if "online_by_tile_size_s" in r]
    if tiled:
        sizes = list(tiled[0]["online_by_tile_size_s"])
        lines += ["", "| T | " + " | ".join(f"ms online, tile {s}" for s in sizes) + " |", "|---:|" + "---:|" * len(sizes)]
        lines += ["| " + " | ".join([str(r["T"])] + [fmt_ms(r["online_by_tile_size_s"][s]) for s in sizes]) + " |" for r in tiled]
    lines += ["", conditions_line(data["machine"])]
    return "\n".join(lines)


if __name__ == "__main__":  # the peak-memory child: python -m cases.electives.attention OP KERNELS T
    print(json.dumps(measure_peak_in_this_process(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
