"""Start-up and memory: `import microtensor`, `train.py --max-iters 1` with an empty Numba cache
(cold: every kernel compiles) and with a filled one (warm), and the peak RSS of training the
default recipe, cold and warm.

Each time is the median over separate processes; each peak RSS is one process (it repeats closely
from run to run). The cold runs point NUMBA_CACHE_DIR at a fresh empty folder, so they compile
exactly what a new user's first run compiles. train.py runs with its default kernel set (fast).

The cold runs go through bench/compile_times.py, which lists what Numba compiled and how long each
kernel took (the section "What a cold start compiles"), and their CPU seconds are recorded beside
the wall time: on a busy machine the wall time grows with the load, the CPU time much less.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import HERE, ROOT, TINYSHAKESPEARE


def options(p):
    p.add_argument("--memory-iters", type=int, default=200, help="training steps for the peak-memory run")


def measure(args, machine):
    repeat = args.repeat or 3
    with tempfile.TemporaryDirectory() as folder:
        seconds_import = import_time(max(repeat, 5))
        runs = start_up(repeat, folder)
        peak_cold, peak_warm = peak_memory(folder, args.memory_iters)
    results = {
        "import_microtensor_s": seconds_import,
        "train_max_iters_1_cold_s": runs["cold_s"],
        "train_max_iters_1_cold_cpu_s": runs["cold_cpu_s"],
        "cold_compiled": runs["compiled"],
        "train_max_iters_1_warm_s": runs["warm_s"],
        "peak_rss_training_mib": peak_warm,
        "peak_rss_training_cold_mib": peak_cold,
        "peak_rss_iters": args.memory_iters,
    }
    return {"machine": machine, "startup": results}


def corpus_path(folder):
    """tinyshakespeare when it is beside the project, else generated text (no network)."""
    if TINYSHAKESPEARE.exists():
        return str(TINYSHAKESPEARE)
    path = Path(folder) / "corpus.txt"
    words = ["to", "be", "or", "not", "that", "is", "the", "question", "whether", "tis", "nobler"]
    path.write_text(" ".join(words[(i * 7) % len(words)] for i in range(200_000)))
    return str(path)


def run(command, env=None):
    """Wall seconds of one child process."""
    return run_timed(command, env)[0]


def run_timed(command, env=None):
    """(wall seconds, its output) of one child process."""
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bench startup: {' '.join(command)} failed:\n{done.stdout}")
    return time.perf_counter() - start, done.stdout


def import_time(repeat):
    code = "import time; t = time.perf_counter(); import microtensor; print(time.perf_counter() - t)"
    times = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True)
        times.append(float(out.stdout))
    return statistics.median(times)


def train_command(out_dir, data, iters):
    """train.py's command; --force, since the warm run trains again in the cold run's folder."""
    return [
        sys.executable, "train.py", "--max-iters", str(iters), "--eval-interval", "1000000",
        "--eval-iters", "1", "--out-dir", out_dir, "--data", data, "--force",
    ]  # fmt: skip


def start_up(repeat, folder):
    """Medians of the cold runs' wall and CPU seconds and of the warm runs' wall seconds, and what
    the cold run of median wall time compiled ({"compilations", "kernels": {name: seconds}}), by
    name: {"cold_s", "cold_cpu_s", "warm_s", "compiled"}."""
    data = corpus_path(folder)
    cold, warm = [], []  # cold: (wall, cpu, compiled) per run
    for i in range(repeat):
        env = dict(os.environ, NUMBA_CACHE_DIR=str(Path(folder) / f"numba-cache-{i}"))
        out_dir = str(Path(folder) / f"out-{i}")
        command = train_command(out_dir, data, 1)
        wall, output = run_timed([sys.executable, str(HERE / "compile_times.py"), *command[1:]], env)
        compiled = json.loads(output.strip().splitlines()[-1])
        cold.append((wall, compiled.pop("cpu_s"), compiled))
        warm.append(run(command, env))
    median_run = sorted(cold, key=lambda run: run[0])[len(cold) // 2]
    return {
        "cold_s": statistics.median(r[0] for r in cold),
        "cold_cpu_s": statistics.median(r[1] for r in cold),
        "warm_s": statistics.median(warm),
        "compiled": median_run[2],
    }


def peak_memory(folder, iters):
    """Peak RSS (MiB) of training the default recipe for `iters` steps, cold then warm: a process
    with an empty Numba cache, then one with the cache it filled. Compiling keeps far more of LLVM
    in memory than loading compiled kernels does, so the two differ."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(Path(folder) / "numba-cache-memory"))
    out_dir = str(Path(folder) / "out-memory")
    command = [sys.executable, str(HERE / "peak_rss.py")] + train_command(out_dir, corpus_path(folder), iters)[1:]
    peaks = []
    for _ in ("cold", "warm"):
        out = subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True, text=True)
        peaks.append(float(out.stdout.strip().splitlines()[-1]))
    return peaks


def result_rows(data):
    s = data["startup"]
    lines = [
        f"| `import microtensor` (s) | {s['import_microtensor_s']:.2f} | | | | ≤ 0.5 s |",
        f"| `train.py --max-iters 1`, empty Numba cache (s) | {s['train_max_iters_1_cold_s']:.1f} | | | | ≤ 10 s |",
        f"| `train.py --max-iters 1`, filled cache (s) | {s['train_max_iters_1_warm_s']:.1f} | | | | ≤ 3 s |",
        f"| peak RSS training the default recipe for {s.get('peak_rss_iters', 200)} steps, filled Numba cache (MiB) | "
        f"{s['peak_rss_training_mib']:.0f} | | | | ≤ 200 MiB |",
    ]
    if "train_max_iters_1_cold_cpu_s" in s:
        lines.insert(2, f"| the same, CPU seconds (user + system) | {s['train_max_iters_1_cold_cpu_s']:.1f} | | | | |")
    if "peak_rss_training_cold_mib" in s:
        lines.append(f"| peak RSS, the same with an empty Numba cache (MiB) | {s['peak_rss_training_cold_mib']:.0f} | | | | |")
    return lines


def sections(data):
    """What the cold start compiled, the slowest kernels first (from bench/compile_times.py): in CPU
    seconds where the results have them, which a busy machine inflates far less than wall seconds."""
    s = data["startup"]
    compiled = s.get("cold_compiled")
    if not compiled:
        return []
    cpu = "kernels_cpu" in compiled
    kernels = list(compiled["kernels_cpu" if cpu else "kernels"].items())
    total = sum(seconds for _, seconds in kernels)
    lines = [
        f"`train.py --max-iters 1` with an empty Numba cache: {s['train_max_iters_1_cold_s']:.1f} s wall"
        + (f", {s['train_max_iters_1_cold_cpu_s']:.1f} s CPU" if "train_max_iters_1_cold_cpu_s" in s else "")
        + f"; {total:.1f} {'CPU seconds' if cpu else 's'} of it compiling {len(kernels)} kernels ({compiled['compilations']} compilations, "
        "a kernel's callees counted in its own time)"
        + (f", and {compiled['children_cpu_s']:.1f} CPU seconds in the second process that compiles generation's one-token kernel "
           "meanwhile (its kernels are not listed)" if compiled.get("children_cpu_s") else "")
        + ". The slowest:",
        "",
        f"| kernel | compile{' CPU' if cpu else ''} (s) | share of compiling |",
        "|---|---:|---:|",
    ]
    for name, seconds in kernels[:12]:
        lines.append(f"| `{name}` | {seconds:.2f} | {seconds / total:.0%} |")
    if len(kernels) > 12:
        rest = sum(seconds for _, seconds in kernels[12:])
        lines.append(f"| {len(kernels) - 12} more | {rest:.2f} | {rest / total:.0%} |")
    return [("What a cold start compiles", lines)]
