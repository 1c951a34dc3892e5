"""The training step of the default recipe, split into forward, backward and optimizer, against the
same GPT in PyTorch; the model FLOP utilization (MFU) of the step; and the readable kernel set's
step against the fast set's.

Both models start from the same weights and see the same batches; the case checks that their
first losses agree before it times anything. Blocks of 5 steps alternate between the two; each
phase's figure is its median over the timed steps, and the spread of the step's ratio over the
blocks shows how much the machine moved during the run.

MFU is the step's matmul FLOPs per second (forward, plus twice that for backward) divided by the
GEMM peak measured here: microtensor's float32 matmul on large square matrices with the fast
kernels (numpy's OpenBLAS, its rows split across the cores as in the step).

--torch-compile also times PyTorch's step with the model under torch.compile (compiled before
timing, by its first step), as a third side of the same alternating blocks. Where JAX is installed
(and not --no-jax), bench/jax_side.py's step, the whole of it under jax.jit, is one more side; its
step is not split into phases, as jit compiles them into one program.

The readable kernels (`mt.set_kernels("readable")`: plain loops, no BLAS) train the same recipe
far more slowly, so only --readable-steps steps are timed, in blocks of 2 alternating with steps of
the fast set; their ratio is the readable step's median over the fast step's median in that run.
"""
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from harness import alternate, block_ratios, float_inputs, number, over_blocks, random_batch, spread, start_jax, start_torch, x

import microtensor as mt
from microtensor import optim
from gpt.model.transformer import GPT, GPTConfig

RECIPE = dict(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128)
BATCH = 12
LR, WEIGHT_DECAY, BETAS, CLIP = 1e-3, 0.1, (0.9, 0.99), 1.0
PHASES = ("forward", "backward", "optimizer")
BLOCK = 5  # steps per alternating block against PyTorch
READABLE_BLOCK = 2  # steps per alternating block, readable set against fast set


def options(p):
    p.add_argument("--warmup", type=int, default=10, help="untimed steps before timing")
    p.add_argument("--readable-steps", type=int, default=6, help="timed steps of the readable kernel set (and as many of the fast set)")
    p.add_argument("--torch-compile", action="store_true", help="also time PyTorch's step under torch.compile")


def measure(args, machine):
    train = measure_against_pytorch(args, args.repeat or 60, args.warmup)
    return {"machine": machine, "train": train, "kernel_sets": measure_readable(args.readable_steps, warmup=1)}


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
        x, y = random_batch(self.rng, BATCH, config.block_size, config.vocab_size)
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


def matmul_flops_per_token(config):
    """Multiply-adds ×2 of one token's forward pass through every matmul (Linear layers, QKᵀ and PV
    over the whole causal block as computed, and the output layer)."""
    C, L, T, V = config.n_embd, config.n_layer, config.block_size, config.vocab_size
    linear = 2 * (C * 3 * C + C * C + C * 4 * C + 4 * C * C)  # c_attn, attn c_proj, c_fc, mlp c_proj
    attention = 2 * 2 * T * C  # QKᵀ and PV: T keys × C (= H × D) per query
    return L * (linear + attention) + 2 * C * V


def gemm_peak(n=1024, repeat=20):
    """The machine's float32 GEMM rate in FLOP/s: microtensor's n×n×n matmul."""
    a, b = (mt.tensor(x) for x in float_inputs(0, [(n, n), (n, n)]))
    with mt.no_grad(), mt.using_kernels("fast"):
        for _ in range(3):
            a @ b
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times)


def measure_against_pytorch(args, steps, warmup):
    mt.manual_seed(0)
    config = GPTConfig(**RECIPE)
    model = GPT(config)
    ours = OursStep(model, seed=1)
    torch_process, jax_process = start_torch(args), start_jax(args)
    remote = {}
    first = {}
    with tempfile.TemporaryDirectory() as folder:
        weights = Path(folder) / "weights.npz"
        np.savez(weights, **model.state_dict())  # before any step: both start from these weights
        ours()
        first["microtensor"] = ours.losses[0]
        # the same step for every side: recipe, weights, batches (seed 1) and optimizer
        setup = dict(
            setup="train", config=config.to_dict(), weights=str(weights), batch_size=BATCH, seed=1,
            lr=LR, weight_decay=WEIGHT_DECAY, betas=BETAS, clip=CLIP,
        )  # fmt: skip
        sides = {"pytorch": False, "pytorch_compiled": True} if args.torch_compile else {"pytorch": False}  # name: compiled
        for name, compiled in sides.items() if torch_process is not None else []:
            first[name] = torch_process.ask(**setup, compiled=compiled)["first_loss"]
            remote[name] = "train_step_compiled" if compiled else "train_step"
        if jax_process is not None:
            first["jax"] = jax_process.ask(**setup)["first_loss"]
            remote["jax"] = (jax_process, "train_step")
    # the first step from identical weights on the same batch must give the same loss
    if any(abs(first["microtensor"] - loss) > 1e-4 * abs(loss) for loss in first.values()):
        raise SystemExit(f"bench train: the models disagree on the first loss: {first}")
    # Blocks of BLOCK steps alternate between the libraries; the median is over every step.
    timings = alternate({"microtensor": ours}, remote, torch_process, steps, block=BLOCK, warmup=warmup)
    for process in (torch_process, jax_process):
        if process is not None:
            process.close()
    tokens = BATCH * config.block_size
    results = {name: phase_medians(rows, tokens) for name, rows in timings.items()}
    peak = gemm_peak()
    step_flops = 3 * matmul_flops_per_token(config) * tokens
    for name in results:
        results[name]["mfu"] = step_flops / results[name]["step"] / peak
    step_seconds = {name: [step_of(r) for r in rows] for name, rows in timings.items()}
    spreads = {f"{name}_step_s": spread(seconds) for name, seconds in step_seconds.items()}
    if "pytorch" in step_seconds:
        spreads["step_ratio_by_block"] = spread(block_ratios(step_seconds["pytorch"], step_seconds["microtensor"], BLOCK))
    if "jax" in step_seconds:
        spreads["jax_step_ratio_by_block"] = spread(block_ratios(step_seconds["jax"], step_seconds["microtensor"], BLOCK))
    versions = {"jax": jax_process.hello["jax"]} if jax_process is not None else {}
    return {
        "config": dict(RECIPE, batch_size=BATCH), "first_loss": first, "step_matmul_flops": step_flops,
        "gemm_peak_flops": peak, "libraries": results, "block": BLOCK, "spread": spreads, "versions": versions,
    }  # fmt: skip


def step_of(row):
    """A step's seconds from its row: the sum of its phases, or the step itself (JAX's, not split)."""
    return sum(row) if isinstance(row, (tuple, list)) else row


def phase_medians(rows, tokens):
    """{phase: median seconds, "step": median of the steps' sums, "tokens_per_s"} of (forward,
    backward, optimizer) rows; rows of whole steps give the step only."""
    split = isinstance(rows[0], (tuple, list))
    medians = {phase: statistics.median(r[i] for r in rows) for i, phase in enumerate(PHASES)} if split else {}
    step = statistics.median(step_of(r) for r in rows)
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
        raise SystemExit(f"bench train: the two kernel sets disagree on the first loss: {first}")
    tokens = BATCH * RECIPE["block_size"]
    results = {kernels: phase_medians(rows, tokens) for kernels, rows in timings.items()}
    results["readable_over_fast"] = results["readable"]["step"] / results["fast"]["step"]
    return results


def tokens_row(label, libraries):
    ours, theirs = libraries["microtensor"], libraries.get("pytorch")
    t = theirs["tokens_per_s"] if theirs else None
    return f"| {label} | {ours['tokens_per_s']:,.0f} | {number(t, ',.0f')} | {x(ours['tokens_per_s'] / t if t else None)} | |"


def result_rows(data):
    train = data["train"]
    ours, theirs = train["libraries"]["microtensor"], train["libraries"].get("pytorch")
    step_spread = train.get("spread", {}).get("step_ratio_by_block")
    lines = []
    for phase in ("forward", "backward", "optimizer", "step"):
        t = theirs[phase] * 1e3 if theirs else None
        ratio = theirs[phase] / ours[phase] if theirs else None
        target = "≥ 1.5×" if phase == "step" else ""
        spread = over_blocks(step_spread) if phase == "step" else ""
        lines.append(f"| training {phase} (ms) | {ours[phase] * 1e3:.1f} | {number(t, '.1f')} | {x(ratio)} | {spread} | {target} |")
    lines.append(tokens_row("training tokens/s", train["libraries"]) + " ≥ 1.5× |")
    peak = train["gemm_peak_flops"] / 1e9
    lines.append(
        f"| model FLOP utilization (GEMM peak {peak:.0f} GFLOP/s) | {ours['mfu']:.0%} | "
        f"{'-' if theirs is None else format(theirs['mfu'], '.0%')} | | | ≥ 50% |"
    )
    compiled = train["libraries"].get("pytorch_compiled")
    if compiled:
        lines.append(
            f"| training step, PyTorch under torch.compile (ms) | {ours['step'] * 1e3:.1f} | {compiled['step'] * 1e3:.1f} | "
            f"{x(compiled['step'] / ours['step'])} | | |"
        )
    jax = train["libraries"].get("jax")
    if jax:
        version = train.get("versions", {}).get("jax", "")
        lines.append(
            f"| training step, JAX {version} with the whole step under jax.jit, in the PyTorch column (ms) | "
            f"{ours['step'] * 1e3:.1f} | {jax['step'] * 1e3:.1f} | {x(jax['step'] / ours['step'])} | "
            f"{over_blocks(train.get('spread', {}).get('jax_step_ratio_by_block'))} | |"
        )
    return lines


def default_environment_rows(data):
    """The row of the run that kept the OpenBLAS variables (bench/run.py starts it where they are set)."""
    return [tokens_row("training tokens/s, OPENBLAS variables kept", data["train"]["libraries"]) + " |"]


def noise_lines(data):
    """What the training step measured about its own noise."""
    train = data["train"]
    spread = train.get("spread") or {}
    lines = []
    for name, label in (("microtensor", "microtensor"), ("pytorch", "PyTorch"), ("jax", "JAX")):
        s = spread.get(f"{name}_step_s")
        if s:
            lines.append(
                f"- {label}'s training step over the run's {train['libraries'][name].get('steps', '')} timed steps: "
                f"{s['min'] * 1e3:.1f}-{s['max'] * 1e3:.1f} ms (median {s['median'] * 1e3:.1f})."
            )
    by_block = spread.get("step_ratio_by_block")
    if by_block:
        lines.append(
            f"- the step's ratio over the blocks of {train.get('block', 5)} steps: "
            f"{by_block['min']:.2f}-{by_block['max']:.2f}× (median {by_block['median']:.2f}×)."
        )
    return lines


def sections(data):
    """The readable kernel set's training step against the fast set's."""
    sets = data.get("kernel_sets")
    if not sets:
        return []
    readable, fast = sets["readable"], sets["fast"]
    lines = [
        f"`mt.set_kernels(\"readable\")` runs the plain-loop kernels of `microtensor/ops/` (what a student reads "
        f"and steps through), the default \"fast\" their twins in `microtensor/fast/`; the same recipe, "
        f"{readable['steps']} timed steps of each, in alternating blocks:",
        "",
        "| training step phase | readable (ms) | fast (ms) | readable time / fast |",
        "|---|---:|---:|---:|",
    ]
    for phase in ("forward", "backward", "optimizer", "step"):
        lines.append(f"| {phase} | {readable[phase] * 1e3:.1f} | {fast[phase] * 1e3:.1f} | {readable[phase] / fast[phase]:.2f}× |")
    lines.append(f"| tokens/s | {readable['tokens_per_s']:,.0f} | {fast['tokens_per_s']:,.0f} | |")
    return [("The two kernel sets", lines)]
