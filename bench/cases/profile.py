"""Where a training step's time goes: each Function's forward and backward, per step.

Every Function subclass's forward and backward is wrapped in a timer for the length of the run
(nothing in microtensor itself changes), the default recipe trains for --steps steps after a
warm-up with the kernel set --kernels, and a table gives, per Function, milliseconds per step,
calls per step and µs per call, largest first. What no Function accounts for (the backward walk,
gradient accumulation, Python between ops, the optimizer's own kernels) is the difference between
the step and the sum of the rows: the row "everything else".
"""
import statistics
import time
from collections import defaultdict

import numpy as np

import microtensor as mt
from microtensor import optim
from microtensor.autograd import Function
from gpt.model.transformer import GPT, GPTConfig

RECIPE = dict(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128)
BATCH = 12


def all_functions(cls=Function):
    for sub in cls.__subclasses__():
        yield sub
        yield from all_functions(sub)


class FunctionTimers:
    """Seconds and calls per (Function name, "forward" | "backward"), while installed."""

    def __init__(self):
        self.seconds, self.calls, self.originals = defaultdict(float), defaultdict(int), []

    def _timed(self, key, method):
        def run(*args, **kwargs):
            start = time.perf_counter()
            result = method(*args, **kwargs)
            self.seconds[key] += time.perf_counter() - start
            self.calls[key] += 1
            return result

        return staticmethod(run)

    def install(self):
        for cls in set(all_functions()):
            for phase in ("forward", "backward"):
                if phase in vars(cls):
                    self.originals.append((cls, phase, vars(cls)[phase]))
                    setattr(cls, phase, self._timed((cls.__name__, phase), getattr(cls, phase)))

    def uninstall(self):
        for cls, phase, original in reversed(self.originals):
            setattr(cls, phase, original)
        self.originals.clear()

    def reset(self):
        self.seconds.clear()
        self.calls.clear()


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
    timers = FunctionTimers()
    timers.install()
    phases = defaultdict(list)
    try:
        for step in range(warmup + steps):
            if step == warmup:
                timers.reset()
            x, y = (rng.integers(0, RECIPE["vocab_size"], (BATCH, RECIPE["block_size"])) for _ in range(2))
            t0 = time.perf_counter()
            _, loss = model(mt.tensor(x), mt.tensor(y))
            t1 = time.perf_counter()
            opt.zero_grad()
            loss.backward()
            t2 = time.perf_counter()
            optim.clip_grad_norm(model.parameters(), 1.0)
            opt.step()
            t3 = time.perf_counter()
            if step >= warmup:
                for name, seconds in (("forward", t1 - t0), ("backward", t2 - t1), ("optimizer", t3 - t2), ("step", t3 - t0)):
                    phases[name].append(seconds)
    finally:
        timers.uninstall()
    rows = [
        {"function": name, "phase": phase, "ms_per_step": seconds / steps * 1e3, "calls_per_step": timers.calls[(name, phase)] / steps,
         "us_per_call": seconds / timers.calls[(name, phase)] * 1e6}
        for (name, phase), seconds in timers.seconds.items()
    ]  # fmt: skip
    rows.sort(key=lambda row: -row["ms_per_step"])
    phases_ms = {k: statistics.median(v) * 1e3 for k, v in phases.items()}
    mean_step_ms = sum(phases["step"]) / steps * 1e3  # the rows are means per step: compare them with the mean
    outside = mean_step_ms - sum(row["ms_per_step"] for row in rows)
    return {"steps": steps, "phases_ms": phases_ms, "mean_step_ms": mean_step_ms, "outside_functions_ms": outside, "functions": rows}


def sections(data, top=12):
    p = data["profile"]
    phases = p["phases_ms"]
    lines = [
        f"`python bench/run.py profile`: each Function's forward and backward timed over {p['steps']} steps of the default "
        f"recipe with the {p.get('kernels', 'fast')} kernels (the timers add a little to each call). Median step "
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
    if "outside_functions_ms" in p:
        lines.append(f"| everything else (the backward walk, Python between ops, the optimizer's loop) | | {p['outside_functions_ms']:.2f} | | |")
        lines.append(f"| the step (mean) | | {p['mean_step_ms']:.2f} | | |")
    return [("Where a step's time goes", lines)]
