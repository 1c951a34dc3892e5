"""The training step of the default recipe, split into forward, backward and optimizer, against the
same GPT in PyTorch; the model FLOP utilization (MFU) of the step; and the readable kernel set's
step against the fast set's.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_train.py [--json FILE]

Both models start from the same weights and see the same batches; the script checks that their
first losses agree before it times anything. PyTorch runs in a process of its own with its own
thread settings (bench/torch_side.py); blocks of 5 steps alternate between the two, so a noisy
neighbour slows both alike; each phase's figure is its median over the timed steps, and the
spread of the step's ratio over the blocks shows how much the machine moved during the run.

MFU is the step's matmul FLOPs per second (forward, plus twice that for backward) divided by the
GEMM peak measured here: microtensor's float32 matmul on large square matrices with the fast
kernels (numpy's OpenBLAS, its rows split across the cores as in the step).

The readable kernels (`mt.set_kernels("readable")`: plain loops, no BLAS) train the same recipe
far more slowly, so only --readable-steps steps are timed, in blocks of 2 alternating with steps of
the fast set; their ratio is the readable step's median over the fast step's median in that run.
"""
import statistics
import tempfile
import time
from pathlib import Path

from common import alternate, block_ratios, console, fmt_ratio, fmt_time, machine_info, parser, print_machine, ratio, spread, start_torch, write_json  # isort: skip  (before models: it puts the checkout on sys.path, and tunes the process)
import numpy as np
import torch_gpt
from rich.table import Table

import microtensor as mt
from microtensor import optim
from models.gpt import GPT, GPTConfig

RECIPE = dict(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128)
BATCH = 12
LR, WEIGHT_DECAY, BETAS, CLIP = 1e-3, 0.1, (0.9, 0.99), 1.0
PHASES = ("forward", "backward", "optimizer")


BLOCK = 5  # steps per alternating block against PyTorch
READABLE_BLOCK = 2  # steps per alternating block, readable set against fast set


class OursStep:
    """One training step of a microtensor GPT with the kernel set `kernels`; returns its phases' seconds."""

    def __init__(self, model, seed, kernels="fast"):
        self.model, self.rng, self.kernels = model, np.random.default_rng(seed), kernels
        self.opt = optim.AdamW(optim.weight_decay_groups(model, WEIGHT_DECAY), lr=LR, betas=BETAS)
        self.losses = []

    def __call__(self):
        with mt.using_kernels(self.kernels):
            return self._step()

    def _step(self):
        config = self.model.config
        x, y = torch_gpt.random_batch(self.rng, BATCH, config.block_size, config.vocab_size)
        t0 = time.perf_counter()
        _, loss = self.model(mt.tensor(x), mt.tensor(y))
        self.losses.append(loss.item())
        t1 = time.perf_counter()
        self.opt.zero_grad()
        loss.backward()
        t2 = time.perf_counter()
        optim.clip_grad_norm(self.model.parameters(), CLIP)
        self.opt.step()
        t3 = time.perf_counter()
        return (t1 - t0, t2 - t1, t3 - t2)


def gemm_peak(n=1024, repeat=20):
    """The machine's float32 GEMM rate in FLOP/s: microtensor's n×n×n matmul."""
    a, b = (mt.tensor(x) for x in torch_gpt.float_inputs(0, [(n, n), (n, n)]))
    with mt.no_grad(), mt.using_kernels("fast"):
        for _ in range(3):
            a @ b
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times)


def measure(args, steps, warmup):
    mt.manual_seed(0)
    config = GPTConfig(**RECIPE)
    model = GPT(config)
    ours = OursStep(model, seed=1)
    torch_process = start_torch(args)
    remote = {}
    first = {}
    with tempfile.TemporaryDirectory() as folder:
        weights = Path(folder) / "weights.npz"
        np.savez(weights, **model.state_dict())  # before any step: both start from these weights
        ours()
        first["microtensor"] = ours.losses[0]
        if torch_process is not None:
            reply = torch_process.ask(
                setup="train", config=config.to_dict(), weights=str(weights), batch_size=BATCH, seed=1,
                lr=LR, weight_decay=WEIGHT_DECAY, betas=BETAS, clip=CLIP,
            )  # fmt: skip
            first["pytorch"] = reply["first_loss"]
            remote["pytorch"] = "train_step"
    # the first step from identical weights on the same batch must give the same loss
    if "pytorch" in first and abs(first["microtensor"] - first["pytorch"]) > 1e-4 * abs(first["pytorch"]):
        raise SystemExit(f"bench_train: the two models disagree on the first loss: {first}")
    # Blocks of BLOCK steps alternate between the libraries; the median is over every step.
    timings = alternate({"microtensor": ours}, remote, torch_process, steps, block=BLOCK, warmup=warmup)
    if torch_process is not None:
        torch_process.close()
    results = {}
    tokens = BATCH * config.block_size
    for name, rows in timings.items():
        results[name] = phase_medians(rows, tokens)
    peak = gemm_peak()
    step_flops = 3 * torch_gpt.matmul_flops_per_token(config) * tokens
    for name in results:
        results[name]["mfu"] = step_flops / results[name]["step"] / peak
    step_seconds = {name: [sum(r) for r in rows] for name, rows in timings.items()}
    spreads = {f"{name}_step_s": spread(seconds) for name, seconds in step_seconds.items()}
    if "pytorch" in step_seconds:
        spreads["step_ratio_by_block"] = spread(block_ratios(step_seconds["pytorch"], step_seconds["microtensor"], BLOCK))
    return {
        "config": dict(RECIPE, batch_size=BATCH), "first_loss": first, "step_matmul_flops": step_flops,
        "gemm_peak_flops": peak, "libraries": results, "block": BLOCK, "spread": spreads,
    }  # fmt: skip


def phase_medians(rows, tokens):
    """{phase: median seconds, "step": median of the steps' sums, "tokens_per_s"} of (forward,
    backward, optimizer) rows."""
    medians = {phase: statistics.median(r[i] for r in rows) for i, phase in enumerate(PHASES)}
    step = statistics.median(sum(r) for r in rows)
    return dict(medians, step=step, tokens_per_s=tokens / step, steps=len(rows))


def measure_readable(steps, warmup):
    """The readable set's step against the fast set's, both microtensor, alternating in blocks of
    READABLE_BLOCK steps; the same recipe, weights and batches for both."""
    steppers = {}
    for kernels in ("fast", "readable"):
        mt.manual_seed(0)
        steppers[kernels] = OursStep(GPT(GPTConfig(**RECIPE)), seed=1, kernels=kernels)
    timings = alternate(steppers, {}, None, steps, block=READABLE_BLOCK, warmup=warmup)
    first = {kernels: stepper.losses[0] for kernels, stepper in steppers.items()}
    if abs(first["readable"] - first["fast"]) > 1e-4 * abs(first["fast"]):  # the same step, or nothing to compare
        raise SystemExit(f"bench_train: the two kernel sets disagree on the first loss: {first}")
    tokens = BATCH * RECIPE["block_size"]
    results = {kernels: phase_medians(rows, tokens) for kernels, rows in timings.items()}
    results["readable_over_fast"] = results["readable"]["step"] / results["fast"]["step"]
    return results


def show(results, readable):
    libs = results["libraries"]
    ours, theirs = libs["microtensor"], libs.get("pytorch")
    table = Table(title=f"training step, default recipe (batch {BATCH} × block {RECIPE['block_size']}), medians")
    table.add_column("measure")
    table.add_column("microtensor", justify="right")
    table.add_column("PyTorch", justify="right")
    table.add_column("PyTorch time / ours", justify="right")
    for key in PHASES + ("step",):
        t = theirs[key] if theirs else None
        table.add_row(key, fmt_time(ours[key]), fmt_time(t), fmt_ratio(ratio(t, ours[key])))
    t = theirs["tokens_per_s"] if theirs else None
    table.add_row("tokens/s", f"{ours['tokens_per_s']:,.0f}", "-" if t is None else f"{t:,.0f}", fmt_ratio(None if t is None else ours["tokens_per_s"] / t))
    table.add_row("MFU", f"{ours['mfu']:.0%}", "-" if theirs is None else f"{theirs['mfu']:.0%}", "")
    console.print(table)
    console.print(
        f"step matmul work {results['step_matmul_flops'] / 1e9:.2f} GFLOP; "
        f"GEMM peak {results['gemm_peak_flops'] / 1e9:.0f} GFLOP/s (microtensor matmul, 1024³ float32)"
    )
    by_block = results["spread"].get("step_ratio_by_block")
    if by_block:
        console.print(
            f"step ratio over the blocks of {results['block']} steps: {by_block['min']:.2f}-{by_block['max']:.2f}× "
            f"(median {by_block['median']:.2f}×)"
        )
    table = Table(title=f"kernel sets: readable against fast, {readable['readable']['steps']} steps each, medians")
    table.add_column("measure")
    table.add_column("readable", justify="right")
    table.add_column("fast", justify="right")
    table.add_column("readable time / fast", justify="right")
    for key in PHASES + ("step",):
        table.add_row(key, fmt_time(readable["readable"][key]), fmt_time(readable["fast"][key]), fmt_ratio(readable["readable"][key] / readable["fast"][key]))
    console.print(table)


def main():
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--warmup", type=int, default=10, help="untimed steps before timing")
    p.add_argument("--readable-steps", type=int, default=6, help="timed steps of the readable kernel set (and as many of the fast set)")
    args = p.parse_args()
    info = machine_info()
    print_machine(info)
    results = measure(args, args.repeat or 60, args.warmup)
    readable = measure_readable(args.readable_steps, warmup=1)
    show(results, readable)
    write_json(args.json, {"machine": info, "train": results, "kernel_sets": readable})


if __name__ == "__main__":
    main()
