"""The training step of the default recipe, split into forward, backward and optimizer, against the
same GPT in PyTorch; and the model FLOP utilization (MFU) of the step.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_train.py [--json FILE]

Both models start from the same weights and see the same batches; the script checks that their
losses agree before it times anything. Steps alternate between the two libraries, so a noisy
neighbour slows both alike; each phase's figure is its median over the timed steps.

MFU is the step's matmul FLOPs per second (forward, plus twice that for backward) divided by the
GEMM peak measured here: the best of numpy's and PyTorch's float32 matmul on large square matrices.
"""
import statistics
import time

import microtensor as mt  # isort: skip  (before numpy: it sets up OpenBLAS's threads)
import numpy as np
import torch_gpt
from common import console, fmt_ratio, fmt_time, machine_info, parser, print_machine, ratio, try_import_torch, write_json
from rich.table import Table

from microtensor import optim
from models.gpt import GPT, GPTConfig

RECIPE = dict(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128)
BATCH = 12
LR, WEIGHT_DECAY, BETAS, CLIP = 1e-3, 0.1, (0.9, 0.99), 1.0
PHASES = ("forward", "backward", "optimizer")


class OursStep:
    def __init__(self, model):
        self.model = model
        self.opt = optim.AdamW(optim.weight_decay_groups(model, WEIGHT_DECAY), lr=LR, betas=BETAS)

    def __call__(self, x, y):
        t0 = time.perf_counter()
        _, loss = self.model(mt.tensor(x), mt.tensor(y))
        value = loss.item()
        t1 = time.perf_counter()
        self.opt.zero_grad()
        loss.backward()
        t2 = time.perf_counter()
        optim.clip_grad_norm(self.model.parameters(), CLIP)
        self.opt.step()
        t3 = time.perf_counter()
        return value, (t1 - t0, t2 - t1, t3 - t2)


class TheirsStep:
    def __init__(self, torch, model):
        self.torch, self.model = torch, model
        self.opt = torch_gpt.adamw(torch, model, LR, WEIGHT_DECAY, BETAS)

    def __call__(self, x, y):
        torch = self.torch
        t0 = time.perf_counter()
        _, loss = self.model(torch.from_numpy(x), torch.from_numpy(y))
        value = loss.item()
        t1 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP)
        self.opt.step()
        t3 = time.perf_counter()
        return value, (t1 - t0, t2 - t1, t3 - t2)


def gemm_peak(torch, n=1024, repeat=20):
    """The machine's float32 GEMM rate in FLOP/s: the best median of numpy's and PyTorch's n×n×n."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    rates = {"numpy": 2 * n**3 / _median_time(lambda: a @ b, repeat)}
    if torch is not None:
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        rates["torch"] = 2 * n**3 / _median_time(lambda: ta @ tb, repeat)
    return rates


def _median_time(fn, repeat):
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(steps, warmup):
    torch = try_import_torch()
    mt.manual_seed(0)
    config = GPTConfig(**RECIPE)
    model = GPT(config)
    runners = {"microtensor": OursStep(model)}
    if torch is not None:
        runners["pytorch"] = TheirsStep(torch, torch_gpt.from_microtensor(torch, model))
    rng = np.random.default_rng(0)

    def batch():
        x = rng.integers(0, config.vocab_size, (BATCH, config.block_size + 1))
        return np.ascontiguousarray(x[:, :-1]), np.ascontiguousarray(x[:, 1:])

    # the first step from identical weights must give the same loss, or the comparison is void
    x, y = batch()
    losses = {name: run(x, y)[0] for name, run in runners.items()}
    if torch is not None and abs(losses["microtensor"] - losses["pytorch"]) > 1e-4 * abs(losses["pytorch"]):
        raise SystemExit(f"bench_train: the two models disagree on the first loss: {losses}")
    for _ in range(warmup):
        x, y = batch()
        for run in runners.values():
            run(x, y)
    phases = {name: [] for name in runners}
    for _ in range(steps):
        x, y = batch()
        for name, run in runners.items():
            phases[name].append(run(x, y)[1])
    results = {}
    tokens = BATCH * config.block_size
    for name, rows in phases.items():
        medians = {phase: statistics.median(r[i] for r in rows) for i, phase in enumerate(PHASES)}
        step = statistics.median(sum(r) for r in rows)
        results[name] = dict(medians, step=step, tokens_per_s=tokens / step)
    peak = gemm_peak(torch)
    step_flops = 3 * torch_gpt.matmul_flops_per_token(config) * tokens
    for name in results:
        results[name]["mfu"] = step_flops / results[name]["step"] / max(peak.values())
    return {"config": dict(RECIPE, batch_size=BATCH), "first_loss": losses, "step_matmul_flops": step_flops, "gemm_peak_flops": peak, "libraries": results}


def show(results):
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
    peak = ", ".join(f"{k} {v / 1e9:.0f}" for k, v in results["gemm_peak_flops"].items())
    console.print(f"step matmul work {results['step_matmul_flops'] / 1e9:.2f} GFLOP; GEMM peak (GFLOP/s, 1024³ float32): {peak}")


def main():
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--warmup", type=int, default=10, help="untimed steps before timing")
    args = p.parse_args()
    info = machine_info()
    print_machine(info)
    results = measure(args.repeat or 60, args.warmup)
    show(results)
    write_json(args.json, {"machine": info, "train": results})


if __name__ == "__main__":
    main()
