"""What every benchmark shares: timing by medians, the machine's description, tables and JSON.

Machines are shared and noisy, so a figure is the median of many timed repeats after warm-up, and
every comparison with PyTorch is a ratio measured in the same process at the same time.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

console = Console()


def try_import_torch():
    """PyTorch if installed (the reference), else None; its threads match numpy's cores."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(os.cpu_count() or 1)
    return torch


def time_call(fn, repeat=50, warmup=5, min_time=0.0):
    """Median seconds per call of fn() over `repeat` timed calls (after `warmup` untimed ones)."""
    for _ in range(warmup):
        fn()
    times = []
    start_all = time.perf_counter()
    while len(times) < repeat or time.perf_counter() - start_all < min_time:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_medians(fns, repeat=50, warmup=5):
    """Median seconds per call of each fn, timed in alternation so that a noisy neighbour on the
    machine slows all of them alike and the ratios stay fair."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def machine_info():
    import numba

    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": _cpu_name(),
        "cores": os.cpu_count(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "numba_threads": numba.config.NUMBA_NUM_THREADS,
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE", "(unset)"),
        "OPENBLAS_L2_SIZE": os.environ.get("OPENBLAS_L2_SIZE", "(unset)"),
    }
    torch = try_import_torch()
    info["torch"] = torch.__version__ if torch is not None else "(not installed)"
    return info


def _cpu_name():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def print_machine(info):
    table = Table(title="machine", show_header=False)
    for key, value in info.items():
        table.add_row(key, str(value))
    console.print(table)


def ratio(theirs, ours):
    """How many times faster microtensor is (PyTorch time / microtensor time); None without torch."""
    if theirs is None or ours is None or ours == 0:
        return None
    return theirs / ours


def fmt_time(seconds):
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_ratio(value):
    return "-" if value is None else f"{value:.2f}×"


def parser(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--json", metavar="FILE", help="also write the results to this JSON file")
    p.add_argument("--repeat", type=int, default=None, help="timed repeats per measurement (default: per benchmark)")
    return p


def write_json(path, payload):
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(payload, indent=2, default=float))
        console.print(f"wrote {path}")
