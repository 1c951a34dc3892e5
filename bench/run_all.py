"""The whole suite in one command: every benchmark, then the results table that the README shows.

    python bench/run_all.py                 # about 5 minutes on 2 cores
    python bench/run_all.py --report-only   # rebuild the table from the JSON files already written

Each benchmark runs in a process of its own with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed
from its environment (a laptop has neither; they slow numpy's BLAS). When the calling
environment sets them, the training step is measured a second time with them kept, and reported
as the default-environment figure. JSON files go to --out (default bench/results/).
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SLOWING_VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")

BENCHMARKS = [  # (JSON name, script, extra arguments)
    ("ops", "bench_ops.py", []),
    ("train", "bench_train.py", []),
    ("generate", "bench_generate.py", []),
    ("startup", "bench_startup.py", []),
    ("convergence", "bench_convergence.py", []),
]


def run(script, json_path, extra, keep_environment=False):
    env = dict(os.environ)
    if not keep_environment:
        for name in SLOWING_VARIABLES:
            env.pop(name, None)
    command = [sys.executable, str(HERE / script), "--json", str(json_path), *extra]
    print(f"$ {' '.join(command)}", flush=True)
    subprocess.run(command, env=env, check=True)


def load(out, name):
    path = out / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def x(value):
    return "-" if value is None else f"{value:.2f}×"


def report(out):
    """The README's results table (markdown) from the JSON files in `out`."""
    lines = ["| measure | microtensor | PyTorch | ratio | target |", "|---|---:|---:|---:|---|"]
    machine = None
    train = load(out, "train")
    if train:
        machine = train["machine"]
        ours, theirs = train["train"]["libraries"]["microtensor"], train["train"]["libraries"].get("pytorch")
        for phase in ("forward", "backward", "optimizer", "step"):
            t = theirs[phase] * 1e3 if theirs else None
            ratio = theirs[phase] / ours[phase] if theirs else None
            target = "≥ 1.5×" if phase == "step" else ""
            lines.append(f"| training {phase} (ms) | {ours[phase] * 1e3:.1f} | {'-' if t is None else f'{t:.1f}'} | {x(ratio)} | {target} |")
        t = theirs["tokens_per_s"] if theirs else None
        lines.append(
            f"| training tokens/s | {ours['tokens_per_s']:,.0f} | {'-' if t is None else f'{t:,.0f}'} | "
            f"{x(ours['tokens_per_s'] / t if t else None)} | ≥ 1.5× |"
        )
        peak = train["train"]["gemm_peak_flops"] / 1e9
        lines.append(f"| model FLOP utilization (GEMM peak {peak:.0f} GFLOP/s) | {ours['mfu']:.0%} | {theirs['mfu']:.0%} | | ≥ 50% |" if theirs else f"| MFU | {ours['mfu']:.0%} | - | | ≥ 50% |")
    default_env = load(out, "train_default_env")
    if default_env:
        ours, theirs = (default_env["train"]["libraries"].get(k) for k in ("microtensor", "pytorch"))
        t = theirs["tokens_per_s"] if theirs else None
        lines.append(
            f"| training tokens/s, OPENBLAS variables kept | {ours['tokens_per_s']:,.0f} | {'-' if t is None else f'{t:,.0f}'} | "
            f"{x(ours['tokens_per_s'] / t if t else None)} | |"
        )
    ops = load(out, "ops")
    if ops:
        for row in ops["ops"]:
            ours_t, theirs_t = row["forward_backward_s"], row["torch_forward_backward_s"]
            lines.append(
                f"| {row['op']}, fwd+bwd (µs) | {ours_t * 1e6:.0f} | {'-' if theirs_t is None else f'{theirs_t * 1e6:.0f}'} | "
                f"{x(row['forward_backward_ratio'])} | ≥ 1× |"
            )
    generate = load(out, "generate")
    if generate:
        g = generate["generate"]
        lines.append(
            f"| generation with KV cache, 1→{g.get('tokens', 255) + 1} tokens (tokens/s) | {g['microtensor_kv_cache_tokens_per_s']:,.0f} | "
            f"{_maybe(g.get('pytorch_kv_cache_tokens_per_s'))} | {x(g.get('kv_cache_vs_pytorch'))} | ≥ 2× |"
        )
        lines.append(
            f"| generation recomputing the context (tokens/s) | {g['microtensor_recompute_tokens_per_s']:,.0f} | "
            f"{_maybe(g.get('pytorch_recompute_tokens_per_s'))} | cache {x(g.get('kv_cache_vs_recompute'))} faster | cache ≥ 5× |"
        )
    startup = load(out, "startup")
    if startup:
        s = startup["startup"]
        lines.append(f"| `import microtensor` (s) | {s['import_microtensor_s']:.2f} | | | ≤ 0.5 s |")
        lines.append(f"| `train.py --max-iters 1`, empty Numba cache (s) | {s['train_max_iters_1_cold_s']:.1f} | | | ≤ 15 s |")
        lines.append(f"| `train.py --max-iters 1`, filled cache (s) | {s['train_max_iters_1_warm_s']:.1f} | | | ≤ 3 s |")
        lines.append(f"| peak RSS training the default recipe, filled Numba cache (MiB) | {s['peak_rss_training_mib']:.0f} | | | ≤ 200 MiB |")
        if "peak_rss_training_cold_mib" in s:
            lines.append(f"| peak RSS, the same with an empty Numba cache (MiB) | {s['peak_rss_training_cold_mib']:.0f} | | | |")
    convergence = load(out, "convergence")
    if convergence:
        c = convergence["convergence"]
        lines.append(f"| val loss after {c['steps']} steps on tinyshakespeare | {c['final_val_loss']:.4f} | | | ≤ 1.90 |")
    if machine:
        lines.append("")
        lines.append(
            f"Machine: {machine['processor']}, {machine['cores']} cores; Python {machine['python']}, numpy {machine['numpy']}, "
            f"numba {machine['numba']}, PyTorch {machine['torch']}. Ratios are PyTorch's time over microtensor's "
            "(above 1: microtensor is faster), measured at the same time: blocks of calls alternate between "
            "microtensor and PyTorch, which runs in a process of its own with its own thread settings."
        )
    return "\n".join(lines)


def _maybe(value):
    return "-" if value is None else f"{value:,.0f}"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(HERE / "results"), help="folder for the JSON files")
    p.add_argument("--report-only", action="store_true", help="only rebuild the table from existing JSON files")
    p.add_argument("--skip", nargs="*", default=[], help="benchmarks to leave out (ops, train, generate, startup, convergence)")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        for name, script, extra in BENCHMARKS:
            if name not in args.skip:
                run(script, out / f"{name}.json", extra)
        if "train" not in args.skip and any(name in os.environ for name in SLOWING_VARIABLES):
            run("bench_train.py", out / "train_default_env.json", [], keep_environment=True)
    print(report(out))


if __name__ == "__main__":
    main()
