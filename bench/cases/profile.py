"""Where a training step's time goes: each Function's forward and backward, per step.

A thin user of microtensor.debug.profile: the default recipe trains for --steps steps after a
warm-up with the kernel set --kernels, inside one profile (the optimizer as a phase of its own), and
a table gives, per Function, milliseconds per step, calls per step and µs per call, largest first,
with the FLOPs the profile counts from the shapes. What no Function accounts for (the backward walk,
gradient accumulation, Python between ops, the optimizer's own kernels) is the difference between
the step and the sum of the rows: the row "everything else".
"""
import contextlib
import statistics
import time
from collections import defaultdict

import numpy as np

import microtensor as mt
import microtensor.debug as debug
from microtensor import optim
from microtensor.profiler import OUTSIDE_OPS
from gpt.model.transformer import GPT, GPTConfig

RECIPE = dict(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128)
BATCH = 12

def options(p):
    p.add_argument("--steps", type=int, default=40, help="timed training steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before timing")
    p.add_argument("--kernels", choices=mt.kernels.KERNEL_SETS, default="fast", help="the kernel set to profile")


def measure(args, machine):
    with mt.using_kernels(args.kernels):
        results = _profile(args.steps, args.warmup)
    results["kernels"] = args.kernels
    return {"machine": machine, "profile": results}


def _profile(steps, warmup):
    mt.manual_seed(0)
    model = GPT(GPTConfig(**RECIPE))
    opt = optim.AdamW(optim.weight_decay_groups(model, 0.1), lr=1e-3, betas=(0.9, 0.99))
    rng = np.random.default_rng(0)
    phases = defaultdict(list)

    def step(optimizer_phase):
        x, y = (rng.integers(0, RECIPE["vocab_size"], (BATCH, RECIPE["block_size"])) for _ in range(2))
        t0 = time.perf_counter()
        _, loss = model(mt.tensor(x), mt.tensor(y))
        t1 = time.perf_counter()
        opt.zero_grad()
        loss.backward()
        t2 = time.perf_counter()
        with optimizer_phase:
            optim.clip_grad_norm(model.parameters(), 1.0)
            opt.step()
        t3 = time.perf_counter()
        return (("forward", t1 - t0), ("backward", t2 - t1), ("optimizer", t3 - t2), ("step", t3 - t0))

    for _ in range(warmup):
        step(contextlib.nullcontext())
    with debug.profile(show=False) as profiler:
        for _ in range(steps):
            for name, seconds in step(profiler.phase("optimizer")):
                phases[name].append(seconds)
    report = profiler.report
    rows = [
        {"function": r.op, "phase": r.phase, "ms_per_step": r.seconds / steps * 1e3, "calls_per_step": r.calls / steps,
         "us_per_call": r.seconds / r.calls * 1e6, "gflops_per_s": r.gflops_per_s, "flop_per_byte": r.intensity}
        for r in report.rows if r.op != OUTSIDE_OPS
    ]  # fmt: skip
    phases_ms = {k: statistics.median(v) * 1e3 for k, v in phases.items()}
    mean_step_ms = sum(phases["step"]) / steps * 1e3  # the rows are means per step: compare them with the mean
    outside = mean_step_ms - sum(row["ms_per_step"] for row in rows)
    return {"steps": steps, "phases_ms": phases_ms, "mean_step_ms": mean_step_ms, "outside_functions_ms": outside, "functions": rows,
            "gflop_per_step": report.flops / steps / 1e9, "mfu": report.mfu, "gemm_peak_gflops": report.gemm_peak_flops_per_s / 1e9,
            "saved_mib_per_step": report.saved_bytes / steps / 2**20, "memory_gbs": debug.measure_memory_bandwidth() / 1e9}  # fmt: skip


def sections(data, top=12):
    p = data["profile"]
    phases = p["phases_ms"]
    lines = [
        f"`python bench/run.py profile`: each Function's forward and backward measured by microtensor.debug.profile over "
        f"{p['steps']} steps of the default recipe with the {p.get('kernels', 'fast')} kernels (the profiler adds a little to "
        f"each call). Median step "
        f"{phases['step']:.1f} ms: forward {phases['forward']:.1f}, backward {phases['backward']:.1f}, optimizer "
        f"{phases['optimizer']:.1f}.",
        "",
        "| Function | phase | ms / step | calls / step | µs / call |",
        "|---|---|---:|---:|---:|",
    ]
    rows = p["functions"]
    for row in rows[:top]:
        lines.append(
            f"| {row['function']} | {row['phase']} | {row['ms_per_step']:.2f} | {row['calls_per_step']:.0f} | {row['us_per_call']:.0f} |"
        )
    rest = rows[top:]
    if rest:
        lines.append(f"| {len(rest)} more rows | | {sum(r['ms_per_step'] for r in rest):.2f} | | |")
    lines.append(f"| all Functions | | {sum(r['ms_per_step'] for r in rows):.2f} | | |")
    if "mfu" in p:
        lines[0] += (f" {p['gflop_per_step']:.2f} GFLOP per step (counted from the shapes), MFU {100 * p['mfu']:.1f}% of numpy's "
                     f"GEMM peak ({p['gemm_peak_gflops']:.0f} GFLOP/s); {p['saved_mib_per_step']:.1f} MiB saved for backward.")
    if "memory_gbs" in p:  # the roofline of docs/profiling.md: the ridge point, and which side of it each op is
        ridge = p["gemm_peak_gflops"] / p["memory_gbs"]
        lines[0] += (f" Roofline: a copy moves {p['memory_gbs']:.1f} GB/s, so the ridge point is {ridge:.0f} FLOP/byte; above it "
                     + ", ".join(sorted({f"{r['function']} ({r['flop_per_byte']:.0f})" for r in rows if r.get('flop_per_byte') and r['flop_per_byte'] >= ridge}))
                     + "; below it " + ", ".join(sorted({r["function"] for r in rows if r.get("flop_per_byte") and r["flop_per_byte"] < ridge})) + ".")
    if "outside_functions_ms" in p:
        lines.append(f"| everything else (the backward walk, Python between ops, the optimizer's loop) | | {p['outside_functions_ms']:.2f} | | |")
        lines.append(f"| the step (mean) | | {p['mean_step_ms']:.2f} | | |")
    return [("Where a step's time goes", lines)]
