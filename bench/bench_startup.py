"""Start-up and memory: `import microtensor`, `train.py --max-iters 1` with an empty Numba cache
(cold: every kernel compiles) and with a filled one (warm), and the peak RSS of training the
default recipe, cold and warm.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_startup.py [--json FILE]

Each time is the median over separate processes; each peak RSS is one process (it repeats closely
from run to run). The cold runs point NUMBA_CACHE_DIR at a fresh empty folder, so they compile
exactly what a new user's first run compiles. train.py runs with its default kernel set (fast).
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, TINYSHAKESPEARE, console, fmt_time, machine_info, parser, print_machine, write_json
from rich.table import Table



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
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - start


def import_time(repeat):
    code = "import time; t = time.perf_counter(); import microtensor; print(time.perf_counter() - t)"
    times = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True)
        times.append(float(out.stdout))
    return statistics.median(times)


def train_command(out_dir, data, iters):
    return [
        sys.executable, "train.py", "--max-iters", str(iters), "--eval-interval", "1000000",
        "--eval-iters", "1", "--out-dir", out_dir, "--data", data,
    ]  # fmt: skip


def start_up(repeat, folder):
    data = corpus_path(folder)
    cold, warm = [], []
    for i in range(repeat):
        env = dict(os.environ, NUMBA_CACHE_DIR=str(Path(folder) / f"numba-cache-{i}"))
        out_dir = str(Path(folder) / f"out-{i}")
        cold.append(run(train_command(out_dir, data, 1), env))
        warm.append(run(train_command(out_dir, data, 1), env))
    return statistics.median(cold), statistics.median(warm)


def peak_memory(folder, iters):
    """Peak RSS (MiB) of training the default recipe for `iters` steps, cold then warm: a process
    with an empty Numba cache, then one with the cache it filled. Compiling keeps far more of LLVM
    in memory than loading compiled kernels does, so the two differ."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(Path(folder) / "numba-cache-memory"))
    out_dir = str(Path(folder) / "out-memory")
    command = [sys.executable, str(Path(__file__).with_name("peak_rss.py"))] + train_command(out_dir, corpus_path(folder), iters)[1:]
    peaks = []
    for _ in ("cold", "warm"):
        out = subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True, text=True)
        peaks.append(float(out.stdout.strip().splitlines()[-1]))
    return peaks


def main():
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--memory-iters", type=int, default=200, help="training steps for the peak-memory run")
    args = p.parse_args()
    info = machine_info()
    print_machine(info)
    repeat = args.repeat or 3
    with tempfile.TemporaryDirectory() as folder:
        seconds_import = import_time(max(repeat, 5))
        cold, warm = start_up(repeat, folder)
        peak_cold, peak_warm = peak_memory(folder, args.memory_iters)
    results = {
        "import_microtensor_s": seconds_import,
        "train_max_iters_1_cold_s": cold,
        "train_max_iters_1_warm_s": warm,
        "peak_rss_training_mib": peak_warm,
        "peak_rss_training_cold_mib": peak_cold,
        "peak_rss_iters": args.memory_iters,
    }
    table = Table(title="start-up and memory (separate processes; times are medians)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    table.add_row("import microtensor", fmt_time(seconds_import), "≤ 0.5 s")
    table.add_row("train.py --max-iters 1, cold Numba cache", fmt_time(cold), "≤ 15 s")
    table.add_row("train.py --max-iters 1, warm Numba cache", fmt_time(warm), "≤ 3 s")
    table.add_row(f"peak RSS, default recipe, {args.memory_iters} steps, warm cache", f"{peak_warm:.0f} MiB", "≤ 200 MiB")
    table.add_row(f"peak RSS, default recipe, {args.memory_iters} steps, cold cache", f"{peak_cold:.0f} MiB", "")
    console.print(table)
    write_json(args.json, {"machine": info, "startup": results})


if __name__ == "__main__":
    main()
