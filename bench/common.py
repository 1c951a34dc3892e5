"""What every benchmark shares: the process settings, timing by medians, the machine's
description, tables and JSON.

Machines are shared and noisy, so a figure is the median of many timed repeats after warm-up, and
every comparison with PyTorch is a ratio measured at the same time: blocks of calls alternate
between microtensor, here, and PyTorch, in a process of its own (bench/torch_side.py).

Importing this module tunes the process as train.py does (microtensor.fast.process.
tune_for_training), so that what is measured is what training runs; PyTorch's process gets the
environment as it was before.
"""
import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The corpus the benchmarks train on: kept beside the checkout, never inside it.
TINYSHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
if str(ROOT) not in sys.path:  # the benchmarks run from a checkout, installed or not
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import microtensor.fast.process  # noqa: E402

# The environment before the tuning below adds its settings: PyTorch's process gets this one.
ENVIRONMENT_BEFORE_TUNING = dict(os.environ)
TUNED = microtensor.fast.process.tune_for_training()  # {setting: value}, recorded with the machine

console = Console()


class TorchProcess:
    """The PyTorch side of a benchmark: bench/torch_side.py in a process of its own (see there why),
    asked for setups and timings one JSON line at a time."""

    def __init__(self):
        script = Path(__file__).with_name("torch_side.py")
        self.process = subprocess.Popen(
            [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=ENVIRONMENT_BEFORE_TUNING, cwd=str(script.parent),
        )  # fmt: skip
        self.hello = json.loads(self.process.stdout.readline())

    def ask(self, **request):
        self.process.stdin.write(json.dumps(request, default=_jsonable) + "\n")
        self.process.stdin.flush()
        reply = json.loads(self.process.stdout.readline())
        if "error" in reply:
            raise RuntimeError(f"PyTorch side failed on {request}: {reply['error']}")
        return reply["ok"]

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def _jsonable(value):
    return value.tolist() if isinstance(value, np.ndarray) else value.item()


def start_torch(args):
    """A TorchProcess when PyTorch is installed (and not --no-torch), else None: the benchmarks then
    measure microtensor alone."""
    if args.no_torch or importlib.util.find_spec("torch") is None:
        return None
    return TorchProcess()


def alternate(local, remote, torch_process, calls, block=5, warmup=3):
    """Timings of many calls of each function, in blocks of `block` calls that alternate between
    the functions, so that a noisy neighbour slows all of them alike.

    local: {name: fn} run here; remote: {name: the name of a timed function in torch_process}.
    A function that returns a tuple (its own phase timings) is recorded by that tuple, any other by
    the seconds it took. Returns {name: [one entry per call]}.

    The first call of each block is run but not recorded: after its last call each library's
    idle threads keep spinning for a while (OpenMP's spin count) and take a core from the other
    library's first call; and that first call wakes its own threads. (Sleeping between blocks until
    they stop is no better: on a shared host, a core left idle may take long to come back.)
    """
    for fn in local.values():
        for _ in range(warmup):
            fn()
    for remote_name in remote.values():
        torch_process.ask(time=remote_name, n=warmup)
    times = {name: [] for name in [*local, *remote]}
    for _ in range(max(1, calls // block)):
        for name, fn in local.items():
            fn()
            for _ in range(block):
                start = time.perf_counter()
                phases = fn()
                times[name].append(phases if isinstance(phases, tuple) else time.perf_counter() - start)
        for name, remote_name in remote.items():
            times[name] += torch_process.ask(time=remote_name, n=block + 1)[1:]
    return times


def machine_info():
    import numba

    info = {
        "date": datetime.date.today().isoformat(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": _cpu_name(),
        "cores": os.cpu_count(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "numba_threads": numba.config.NUMBA_NUM_THREADS,
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE", "(unset)"),
        "OPENBLAS_L2_SIZE": os.environ.get("OPENBLAS_L2_SIZE", "(unset)"),
        "tuned": ", ".join(f"{key}={value}" for key, value in TUNED.items()) or "(nothing)",
    }
    try:
        info["torch"] = metadata.version("torch")
    except metadata.PackageNotFoundError:
        info["torch"] = "(not installed)"
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
    p.add_argument("--no-torch", action="store_true", help="measure microtensor alone, even where PyTorch is installed")
    return p


def write_json(path, payload):
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(payload, indent=2, default=float))
        console.print(f"wrote {path}")


def trained_checkpoint(folder, data, iters, flags=(), retrain=False):
    """`folder`, holding a model trained by train.py for `iters` steps on `data` with `flags`:
    trained now, unless the folder holds one trained by exactly the same command (retrain=False)."""
    from models import checkpoint  # models is importable once ROOT is on sys.path (above)

    folder = Path(folder)
    command = [
        sys.executable, str(ROOT / "train.py"), "--data", str(data), "--out-dir", str(folder), "--max-iters", str(iters),
        "--lr-decay-iters", str(iters), "--eval-interval", str(iters), "--sample-chars", "0", *flags,
    ]  # fmt: skip
    record = folder / "bench-command.json"
    if not retrain and record.exists() and json.loads(record.read_text()) == command[1:] and checkpoint.path_in(folder).exists():
        console.print(f"reusing the model trained in {folder}")
        return folder
    console.print(f"training: {' '.join(command[1:])}")
    started = time.perf_counter()
    subprocess.run([*command, "--force"], check=True, cwd=ROOT)
    record.write_text(json.dumps(command[1:]))
    console.print(f"trained in {time.perf_counter() - started:.0f} s")
    return folder


def blocks(values, block):
    """values cut into consecutive blocks of `block` (as `alternate` records them)."""
    return [values[i : i + block] for i in range(0, len(values) - block + 1, block)]


def block_ratios(theirs, ours, block):
    """PyTorch's median over microtensor's, block by block: how the ratio moved during the run."""
    return [statistics.median(t) / statistics.median(o) for t, o in zip(blocks(theirs, block), blocks(ours, block))]


def spread(values):
    """{"min", "median", "max"} of values, or None when there are none."""
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}
