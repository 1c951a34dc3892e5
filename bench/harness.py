"""The benchmark harness: what every case shares. A case (bench/cases/) says what to build, what to
measure and how to render its table; this module does the rest:

- the process: each case runs in a process of its own (bench/run.py starts it), tuned as train.py
  tunes itself (`tune_process`), and PyTorch and JAX in others (`PeerProcess`, bench/torch_side.py, bench/jax_side.py);
- timing: a figure is the median of many timed calls after warm-up, and a comparison is a ratio
  measured at the same time, in blocks of calls that alternate between the two sides (`alternate`);
- the conditions: the machine, its CPU (named by `cpu_name`) and vector ISA, the versions and the
  load average before and after the run, recorded in every result (`machine_info`);
- the results: bench/results/CPU/NAME.json per case, one folder per CPU measured (CPU is the CPU's
  name made into a folder name, `cpu_slug`), and bench/README.md built from them, one section per
  CPU (`report`).
"""
import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from xml.sax.saxutils import escape

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# The corpus the benchmarks train on: kept beside the checkout, never inside it.
TINYSHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
RESULTS = HERE / "results"  # one folder per CPU in it
# The vector instruction sets that decide which kernels and BLAS paths are fast, as /proc/cpuinfo
# spells them (amx: Intel's matrix tiles, flag amx_tile; neon: ARM's asimd; sve: ARM's scalable vectors).
VECTOR_ISAS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx", "neon", "sve")
# Two OpenBLAS settings some shared machines set and laptops do not; they slow numpy's BLAS.
SLOWING_VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
if str(ROOT) not in sys.path:  # the cases import microtensor and gpt from the checkout, installed or not
    sys.path.insert(0, str(ROOT))

# The environment before tune_process adds its settings: PyTorch's process gets this one.
ENVIRONMENT_BEFORE_TUNING = dict(os.environ)
TUNED = {}  # {setting: value} that tune_process applied, recorded with the machine


def tune_process():
    """Tune this process as train.py does (malloc, OpenMP spin), so that what is measured is what
    training runs. Called once, before a case imports anything that starts threads."""
    import microtensor.fast.process

    ENVIRONMENT_BEFORE_TUNING.clear()
    ENVIRONMENT_BEFORE_TUNING.update(os.environ)
    TUNED.update(microtensor.fast.process.tune_for_training())


# --------------------------------------------------------------------------------- the other libraries' sides


class PeerProcess:
    """Another library's side of a case: bench/torch_side.py or bench/jax_side.py in a process of
    its own (see torch_side.py why), asked for setups and timings one JSON line at a time."""

    def __init__(self, script, library):
        self.library = library  # "PyTorch", "JAX": for messages
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=ENVIRONMENT_BEFORE_TUNING, cwd=str(HERE),
        )  # fmt: skip
        self.hello = json.loads(self.process.stdout.readline())

    def ask(self, **request):
        self.process.stdin.write(json.dumps(request, default=_jsonable) + "\n")
        self.process.stdin.flush()
        reply = json.loads(self.process.stdout.readline())
        if "error" in reply:
            raise RuntimeError(f"{self.library} side failed on {request}: {reply['error']}")
        return reply["ok"]

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def _jsonable(value):
    return value.tolist() if isinstance(value, np.ndarray) else value.item()


def start_torch(args):
    """PyTorch's PeerProcess when PyTorch is installed (and not --no-torch), else None: the case then
    measures microtensor alone."""
    if args.no_torch or importlib.util.find_spec("torch") is None:
        return None
    return PeerProcess("torch_side.py", "PyTorch")


def start_jax(args):
    """JAX's PeerProcess when JAX is installed (and not --no-jax), else None."""
    if args.no_jax or importlib.util.find_spec("jax") is None:
        return None
    return PeerProcess("jax_side.py", "JAX")


def serve(hello, setups):
    """The loop of a peer process (torch_side.py, jax_side.py): print `hello` (its library's version
    and threads), then answer one JSON request per line of stdin, one JSON reply per line of stdout.
    Requests: {"setup": kind, ...arguments} calls setups[kind](**arguments), which builds timed
    functions into TIMED and returns what the case compares (a first loss); {"time": name, "n": n}
    returns n timings of TIMED[name] (seconds, or the phase seconds it returns itself);
    {"call": name} returns TIMED[name]()."""
    print(json.dumps(hello), flush=True)
    for line in sys.stdin:
        try:
            request = json.loads(line)
            if "setup" in request:
                result = setups[request.pop("setup")](**request)
            elif "time" in request:
                result = _timings(TIMED[request["time"]], request["n"])
            elif "call" in request:
                result = TIMED[request["call"]]()
            else:
                raise ValueError(f"unknown request {request}")
            reply = {"ok": result}
        except Exception as error:  # reported to the benchmark, which stops with it
            reply = {"error": f"{type(error).__name__}: {error}"}
        print(json.dumps(reply), flush=True)


TIMED = {}  # in a peer process: name -> function that a setup built


def _timings(fn, n):
    result = []
    for _ in range(n):
        start = time.perf_counter()
        phases = fn()
        result.append(phases if isinstance(phases, tuple) else time.perf_counter() - start)
    return result


def float_inputs(seed, shapes):
    """float32 standard-normal arrays of these shapes: the same in both processes for one seed."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for shape in shapes]


def integer_inputs(seed, high, shape):
    """Integer ids in [0, high): the same in both processes for one seed."""
    return np.random.default_rng(seed).integers(0, high, shape)


def random_batch(rng, batch_size, block_size, vocab_size):
    """Inputs and next-token targets (B, T), from the generator's next draw."""
    x = rng.integers(0, vocab_size, (batch_size, block_size + 1))
    return np.ascontiguousarray(x[:, :-1]), np.ascontiguousarray(x[:, 1:])


# --------------------------------------------------------------------------------- timing


def alternate(local, remote, torch_process, calls, block=5, warmup=3):
    """Timings of many calls of each function, in blocks of `block` calls that alternate between
    the functions, so that a noisy neighbour slows all of them alike.

    local: {name: fn} run here; remote: {name: the name of a timed function in torch_process, or
    (another PeerProcess, the name of a timed function there)}.
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
    remote = {name: where if isinstance(where, tuple) else (torch_process, where) for name, where in remote.items()}
    for process, remote_name in remote.values():
        process.ask(time=remote_name, n=warmup)
    times = {name: [] for name in [*local, *remote]}
    for _ in range(max(1, calls // block)):
        for name, fn in local.items():
            fn()
            for _ in range(block):
                start = time.perf_counter()
                phases = fn()
                times[name].append(phases if isinstance(phases, tuple) else time.perf_counter() - start)
        for name, (process, remote_name) in remote.items():
            times[name] += process.ask(time=remote_name, n=block + 1)[1:]
    return times


def in_turns(runs, repeat):
    """{name: [seconds of each call]} of `repeat` rounds, each round one call of every run in turn:
    for runs long enough that one call is a measure (a whole generation)."""
    times = {name: [] for name in runs}
    for _ in range(repeat):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return times


def median_seconds(fn, repeat, warmup=0):
    """(median seconds of `repeat` calls of fn after `warmup` untimed ones, fn's last result)."""
    for _ in range(warmup):
        fn()
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def ratio(theirs, ours):
    """How many times faster microtensor is (PyTorch time / microtensor time); None without torch."""
    if theirs is None or ours is None or ours == 0:
        return None
    return theirs / ours


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


# --------------------------------------------------------------------------------- models the cases share


def trained_checkpoint(folder, data, iters, flags=(), retrain=False):
    """`folder`, holding a model trained by train.py for `iters` steps on `data` with `flags`:
    trained now, unless the folder holds one trained by exactly the same command (retrain=False)."""
    from gpt.checkpoints import checkpoint

    folder = Path(folder)
    command = [
        sys.executable, str(ROOT / "train.py"), "--data", str(data), "--out-dir", str(folder), "--max-iters", str(iters),
        "--lr-decay-iters", str(iters), "--eval-interval", str(iters), "--sample-chars", "0", *flags,
    ]  # fmt: skip
    record = folder / "bench-command.json"
    if not retrain and record.exists() and json.loads(record.read_text()) == command[1:] and checkpoint.path_in(folder).exists():
        print(f"reusing the model trained in {folder}")
        return folder
    print(f"training: {' '.join(command[1:])}", flush=True)
    started = time.perf_counter()
    subprocess.run([*command, "--force"], check=True, cwd=ROOT)
    record.write_text(json.dumps(command[1:]))
    print(f"trained in {time.perf_counter() - started:.0f} s")
    return folder


def train_in_process(data, out_dir, flags, iters):
    """train.train (in this process) with `flags` for `iters` steps on `data`: the learning rate
    decays over the run, one evaluation of 40 batches at its end, no sample. Its results dict."""
    import train

    recipe = ["--max-iters", str(iters), "--lr-decay-iters", str(iters), "--warmup-iters", str(min(30, iters)),
              "--eval-interval", str(max(iters, 1)), "--eval-iters", "40", "--sample-chars", "0"]  # fmt: skip
    return train.train(train.build_parser().parse_args(["--data", str(data), "--out-dir", str(out_dir), *flags, *recipe]))


def training_step_seconds(folders, repeat):
    """{name: median seconds of one training step (forward, backward, AdamW)} of the model in each of
    `folders` ({name: folder}), on one random batch of the default recipe's shape, timed in turns."""
    import microtensor as mt
    from gpt.checkpoints import checkpoint

    rng = np.random.default_rng(0)
    steps = {}
    for name, folder in folders.items():
        model = checkpoint.load_model(folder)[0]
        V = model.config.vocab_size
        x, y = (mt.tensor(rng.integers(0, V, (12, 64))) for _ in range(2))
        optimizer = mt.optim.AdamW(mt.optim.weight_decay_groups(list(model.parameters()), 0.1), lr=1e-4)

        def step(model=model, optimizer=optimizer, x=x, y=y):
            _, loss = model(x, y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

        steps[name] = step
    times = alternate(steps, {}, None, repeat)
    return {name: statistics.median(values) for name, values in times.items()}


def graph_bytes(loss, parameters, unpack=None):
    """Bytes of the distinct arrays the graph of `loss` holds (every tensor reachable from it and
    every array its ops saved for backward), the parameters' excepted: a step's activations,
    measured. Views count once, as their base array. unpack(saved) gives the array behind a saved
    value that is not one (16-bit training stores some packed)."""
    import numpy as np

    import microtensor as mt

    def base(array):
        while isinstance(array.base, np.ndarray):
            array = array.base
        return array

    kept, seen, stack = {}, set(), [loss]
    while stack:
        tensor = stack.pop()
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        kept[id(base(tensor.data))] = base(tensor.data)
        if tensor.grad_fn is not None:
            for saved in tensor.grad_fn.saved_tensors:
                saved = saved if unpack is None else unpack(saved)
                if isinstance(saved, np.ndarray):
                    kept[id(base(saved))] = base(saved)
            stack.extend(x for x in tensor.grad_fn.inputs if isinstance(x, mt.Tensor))
    weights = {id(base(p.data)) for p in parameters}
    return sum(array.nbytes for key, array in kept.items() if key not in weights)


def trained_model(folder):
    """(model in eval mode, tokenizer, meta) of the checkpoint in `folder`."""
    from gpt.checkpoints import checkpoint

    model, tokenizer, meta = checkpoint.load_model(folder)
    model.eval()
    return model, tokenizer, meta


@contextmanager
def decode_kernel_off():
    """Every one-token step of generation through the modules: the fast set's decode kernel is
    asked whether it fits the model, and answers no meanwhile."""
    import gpt.generation.decode_kernel

    original = gpt.generation.decode_kernel.decode_kernel_fits
    gpt.generation.decode_kernel.decode_kernel_fits = lambda config: False
    try:
        yield
    finally:
        gpt.generation.decode_kernel.decode_kernel_fits = original


# --------------------------------------------------------------------------------- the conditions


def machine_info():
    import numba

    cpu = cpu_name()
    info = {
        "date": datetime.date.today().isoformat(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": cpu,
        "cpu_slug": cpu_slug(cpu),
        "cpu_id": cpu_id(),
        "isa": vector_isa(),
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
    info["blas"] = kernels_blas()
    return info


def kernels_blas():
    """The BLAS the fast kernels call here, with its version ('MKL 2026.2.0'), or '(none)'."""
    from microtensor.fast import blas

    name = blas.library()
    if name == "MKL":
        try:
            return f"MKL {metadata.version('mkl')}"  # PyPI's package, which microtensor installs
        except metadata.PackageNotFoundError:
            return "MKL"  # from another installer
    return "(none)" if name is None else f"OpenBLAS (numpy {np.__version__}'s)"


def _cpuinfo(field):
    """The first value of `field` in /proc/cpuinfo, or None (no such file or field)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == field:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _sysctl(name):
    """macOS's `sysctl -n name`, or None (not macOS, or no such name)."""
    if sys.platform != "darwin":
        return None
    try:
        out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


# Intel's family 6 model numbers -> the generation (Intel's own list, the parts a laptop or a
# cloud machine is likely to have). A virtual machine may report another part's number: see cpu_name.
INTEL_MODELS = {
    78: "Skylake", 94: "Skylake", 85: "Skylake-SP / Cascade Lake", 142: "Kaby Lake / Coffee Lake",
    158: "Kaby Lake / Coffee Lake", 165: "Comet Lake", 126: "Ice Lake", 106: "Ice Lake-SP",
    140: "Tiger Lake", 141: "Tiger Lake", 167: "Rocket Lake", 151: "Alder Lake", 154: "Alder Lake",
    183: "Raptor Lake", 186: "Raptor Lake", 191: "Raptor Lake", 170: "Meteor Lake", 189: "Lunar Lake",
    197: "Arrow Lake", 198: "Arrow Lake", 143: "Sapphire Rapids", 207: "Emerald Rapids",
    173: "Granite Rapids", 175: "Sierra Forest",
}
INTEL_WITH_AMX = {"Sapphire Rapids", "Emerald Rapids", "Granite Rapids"}
# AMD's families -> the cores (family 25 covers both Zen 3 and Zen 4: the model tells them apart).
AMD_FAMILIES = {23: "Zen / Zen 2", 25: "Zen 3 / Zen 4", 26: "Zen 5"}


def cpu_id():
    """What the CPU says it is: "GenuineIntel family 6 model 143", or the ARM implementer and part,
    or macOS's brand string; "unknown" where none of these can be read."""
    vendor, family, model = _cpuinfo("vendor_id"), _cpuinfo("cpu family"), _cpuinfo("model")
    if vendor and family and model:
        return f"{vendor} family {family} model {model}"
    implementer, part = _cpuinfo("CPU implementer"), _cpuinfo("CPU part")
    if implementer and part:
        return f"ARM implementer {implementer} part {part}"
    return _sysctl("machdep.cpu.brand_string") or platform.processor() or "unknown"


def _brand(model_name):
    """ "Intel(R) Xeon(R) Processor @ 2.60GHz" -> "Intel Xeon": the trademarks, the clock and the
    words that name nothing dropped."""
    text = re.sub(r"\((R|TM|tm)\)|@.*$|\bCPU\b|\b(\d+-Core )?Processor\b", " ", model_name)
    return " ".join(text.split())


def cpu_name(model_name=None, vendor=None, family=None, model=None, flags=None):
    """A name for the CPU that tells machines apart: /proc/cpuinfo's model name, with the
    generation added from the vendor, family and model numbers when the name does not say it
    ("Intel(R) Xeon(R) Processor" is all a cloud machine may say). A model number that the CPU's
    own flags contradict (AMX on a generation that has none: a virtual machine reporting another
    part) is not trusted: the name then says what the flags prove. Unknown numbers give
    "family F model M". On macOS, the brand string (sysctl). The arguments, for tests, replace what
    /proc/cpuinfo says."""
    model_name = model_name if model_name is not None else _cpuinfo("model name")
    vendor = vendor if vendor is not None else _cpuinfo("vendor_id")
    family = family if family is not None else _cpuinfo("cpu family")
    model = model if model is not None else _cpuinfo("model")
    flags = set((flags if flags is not None else _cpuinfo("flags") or "").split())
    if not model_name:
        return _sysctl("machdep.cpu.brand_string") or cpu_id()
    brand = _brand(model_name)
    if not (vendor and family and model and family.isdigit() and model.isdigit()):
        return brand
    family, model = int(family), int(model)
    numbers = f"family {family} model {model}"
    if vendor == "GenuineIntel" and family == 6:
        generation = INTEL_MODELS.get(model)
        if "amx_tile" in flags and generation not in INTEL_WITH_AMX:
            proven = "with AMX and AVX512-FP16" if "avx512_fp16" in flags else "with AMX"
            return f"{brand} ({proven}: Sapphire Rapids or later; reports {numbers})"
    elif vendor == "AuthenticAMD":
        generation = AMD_FAMILIES.get(family)
    else:
        generation = None
    if generation is None:
        return f"{brand} ({numbers})"
    if any(word in brand for word in generation.replace("/", " ").split() if len(word) > 2):
        return brand  # the model name says it already
    return f"{brand} ({generation})"


def cpu_slug(name):
    """The CPU's name as a folder name: "Intel Xeon (Sapphire Rapids)" -> "intel-xeon-sapphire-rapids"
    (the parenthesis' "reports family F model M" and the AMX evidence left out: they are in the JSON)."""
    name = re.sub(r"; reports family \d+ model \d+|with AMX( and AVX512-FP16)?:", "", name)
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown-cpu"


def results_folder(root=None, machine=None):
    """Where this CPU's results go: root/CPU (root: bench/results)."""
    slug = (machine or {}).get("cpu_slug") or cpu_slug((machine or {}).get("processor") or cpu_name())
    return Path(root or RESULTS) / slug


def vector_isa():
    """The vector instruction sets among VECTOR_ISAS that the CPU has ("avx2, avx512f, amx"), from
    /proc/cpuinfo's flags (x86) or Features (ARM, where NEON is called asimd), or from macOS's
    sysctl hw.optional.* (Apple's ARM chips, Intel Macs)."""
    flags = set((_cpuinfo("flags") or _cpuinfo("Features") or "").split())
    if "asimd" in flags:
        flags.add("neon")
    if "amx_tile" in flags:
        flags.add("amx")
    if not flags and sys.platform == "darwin":
        names = {"avx2": "hw.optional.avx2_0", "avx512f": "hw.optional.avx512f", "neon": "hw.optional.neon", "sve": "hw.optional.arm.FEAT_SVE"}
        flags = {isa for isa, name in names.items() if _sysctl(name) == "1"}
    found = [isa for isa in VECTOR_ISAS if isa in flags]
    return ", ".join(found) if found else "none of " + ", ".join(VECTOR_ISAS)


def cpu_text(machine):
    """The CPU model and its vector ISA, for results that did not record the ISA too."""
    return f"{machine['processor']} (vector ISA: {machine.get('isa', 'not recorded')})"


def conditions_line(machine, load=None):
    """The line under a case's tables: when and on what it was measured, from the "machine" it
    recorded, and the load average (1 minute; before and after) where it was recorded."""
    parts = [cpu_text(machine), f"{machine['cores']} cores", f"numpy {machine['numpy']}", f"numba {machine['numba']}"]
    if machine.get("torch", "(not installed)") != "(not installed)":
        parts.append(f"PyTorch {machine['torch']}")
    load = load or machine.get("load_average_1min_before_after")
    if load:
        parts.append(f"load average {load[0]:.1f} before, {load[1]:.1f} after")
    return f"Measured on {machine['date']}: {', '.join(parts)}."


def machine_line(machine):
    """One line about the machine and the software, for the Results table."""
    when = f"Measured on {machine['date']}" if "date" in machine else "Measured"
    blas = ", ".join(f"{v}={machine[v]}" for v in SLOWING_VARIABLES if machine.get(v, "(unset)") != "(unset)") or "neither OpenBLAS variable set"
    tuned = f"; process tuned: {machine['tuned']}" if "tuned" in machine else ""
    kernels_library = machine.get("blas", "OpenBLAS (numpy's)")  # the only one before the choice was recorded
    return (
        f"{when} on: {cpu_text(machine)}, {machine['cores']} cores ({machine['platform']}); Python {machine['python']}, "
        f"numpy {machine['numpy']}, numba {machine['numba']} ({machine['numba_threads']} threads), PyTorch {machine['torch']}; "
        f"the fast kernels' BLAS: {kernels_library}; {blas}{tuned}."
    )


# --------------------------------------------------------------------------------- formatting


def x(value):
    """A ratio, "1.23×", or "-" where there is none."""
    return "-" if value is None else f"{value:.2f}×"


def number(value, format_spec):
    return "-" if value is None else format(value, format_spec)


def over_blocks(spread):
    """A ratio's range over the alternating blocks, from a {"min", "median", "max"} (or None)."""
    return "" if not spread else f"{spread['min']:.2f}-{spread['max']:.2f}×"


# --------------------------------------------------------------------------------- running one case


def case_parser(case, module):
    p = argparse.ArgumentParser(prog=f"bench/run.py {case.name}", description=module.__doc__.splitlines()[0])
    p.add_argument("--json", metavar="FILE", default=str(results_folder() / f"{case.name}.json"), help="where to write the results (default: %(default)s, this CPU's folder)")
    p.add_argument("--repeat", type=int, default=None, help="timed repeats per measurement (default: per case)")
    p.add_argument("--no-torch", action="store_true", help="measure microtensor alone, even where PyTorch is installed")
    p.add_argument("--no-jax", action="store_true", help="leave JAX out, even where it is installed")
    if hasattr(module, "options"):
        module.options(p)
    return p


def run_case(case, argv):
    """Run one case in this process: parse its flags, measure, print its tables, write its JSON."""
    module = case.module()
    args = case_parser(case, module).parse_args(argv)
    tune_process()
    machine = machine_info()
    print("machine: " + "; ".join(f"{key} {value}" for key, value in machine.items()), flush=True)
    before = os.getloadavg()[0]
    data = module.measure(args, machine)
    machine["load_average_1min_before_after"] = [before, os.getloadavg()[0]]
    print("\n" + "\n".join(case_lines(case, module, data)) + "\n")  # plain print: markdown must not be wrapped
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(data, indent=2, default=float))
    print(f"wrote {args.json}")


def part(module, name, data):
    """A case's rendering `name` (result_rows, noise_lines, sections) of data; [] where it has none."""
    return list(getattr(module, name, lambda data: [])(data))


def case_lines(case, module, data):
    """Everything a case renders of its data: its Results rows, its sections, its markdown."""
    lines = part(module, "result_rows", data) + part(module, "noise_lines", data)
    for title, section in part(module, "sections", data):
        lines += ["", f"## {title}", "", *section]
    if hasattr(module, "markdown"):
        lines.append(module.markdown(data))
    return lines


# --------------------------------------------------------------------------------- bench/README.md


def load(out, name):
    path = Path(out) / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def cpu_folders(out):
    """The folders of `out` that hold results, one per CPU: the one with the most results first."""
    folders = [folder for folder in Path(out).iterdir() if folder.is_dir() and any(folder.glob("*.json"))] if Path(out).is_dir() else []
    return sorted(folders, key=lambda folder: (-len(list(folder.glob("*.json"))), folder.name))


def folder_machine(folder, cases):
    """The "machine" a CPU folder's results recorded (the first case's, in the order of `cases`)."""
    for case in cases:
        data = load(folder, case.name)
        if data and "machine" in data:
            return data["machine"]
    return {"processor": folder.name}


def report(out, cases, header, notes):
    """bench/README.md's text (markdown) from the JSON files in `out`: the header, a table of the CPUs
    measured, then one section per CPU (a folder of `out`), each with its Results table (the core
    cases' rows), the core cases' sections and each elective case's section."""
    folders = cpu_folders(out)
    sections = [header]
    if not folders:
        return "\n".join(sections + ["## Results\n", f"No results yet in {out}: run `python bench/run.py`.\n"])
    sections += ["## The CPUs measured\n", CPUS_NOTE, "\n".join(cpus_table(folders, cases)) + "\n"]
    for folder in folders:
        sections += cpu_section(folder, cases, notes)
    return "\n".join(sections)


CPUS_NOTE = """\
Each CPU has a section of its own below, from the results in its folder of `bench/results/`: the
same code is faster or slower against PyTorch depending on the vector instructions and caches a CPU
has, so a ratio holds for the CPU it was measured on. A case not run on a CPU has no row there.
"""


def cpus_table(folders, cases):
    """One row per CPU: its name, vector ISA, folder, the cases measured, and the two ratios a reader
    looks for first (the training step against PyTorch; the readable kernel set against the fast)."""
    lines = ["| CPU | vector ISA | results | training step, PyTorch eager / microtensor | readable set / fast set |", "|---|---|---|---:|---:|"]
    for folder in folders:
        machine = folder_machine(folder, cases)
        measured = [case.name for case in cases if (folder / f"{case.name}.json").exists()]
        train = load(folder, "train") or {}
        libraries = train.get("train", {}).get("libraries", {})
        step_ratio = ratio(libraries.get("pytorch", {}).get("step"), libraries.get("microtensor", {}).get("step"))
        readable = train.get("kernel_sets", {}).get("readable_over_fast")
        lines.append(
            f"| {machine['processor']} | {machine.get('isa', 'not recorded')} | `bench/results/{folder.name}/`: "
            f"{len(measured)} of {len(cases)} cases | {x(step_ratio)} | {x(readable)} |"
        )
    return lines


def cpu_section(folder, cases, notes):
    """The sections of one CPU's results, under a heading that names the CPU and its vector ISA."""
    machine = folder_machine(folder, cases)
    measured = [case.name for case in cases if (folder / f"{case.name}.json").exists()]
    sections = [
        f"## {machine['processor']}\n",
        f"Vector ISA: {machine.get('isa', 'not recorded')}. From `bench/results/{folder.name}/` ({', '.join(measured)}).\n",
    ]
    core = [(case.module(), load(folder, case.name), load(folder, f"{case.name}_default_env")) for case in cases if not case.elective]
    measured_core = [(module, data) for module, data, _ in core if data]
    rows = []
    for module, data, rerun in core:
        rows += part(module, "result_rows", data) if data else []
        rows += module.default_environment_rows(rerun) if rerun else []
    if rows:
        table = ["| measure | microtensor | PyTorch | ratio | over blocks | target |", "|---|---:|---:|---:|---:|---|", *rows]
        sections += ["### Results\n", "\n".join(table) + "\n"]
        first = next((data["machine"] for _, data in measured_core if "machine" in data), None)
        if first:
            sections.append(machine_line(first) + "\n")
        noise = [line for module, data in measured_core for line in part(module, "noise_lines", data)]
        sections.append("### How much a run moves\n")
        sections.append(notes + ("\n" + "\n".join(noise) + "\n" if noise else ""))
    for module, data in measured_core:
        for title, lines in part(module, "sections", data):
            sections += [f"### {title}\n", "\n".join(lines) + "\n"]
    for case in cases:
        data = load(folder, case.name) if case.elective else None
        if data:
            # Formatted from the numbers now, not from text stored with them: --report-only then
            # shows a change of format without measuring again.
            sections.append(f"### {case.title}\n")
            sections.append(f"From `python bench/run.py {case.name}` ({case.doc} explains it).\n")
            sections.append(case.module().markdown(data).rstrip() + "\n")
    return sections


# --------------------------------------------------------------------- docs pages a case regenerates


def page_with_generated_part(case, page_text, generated, begin, end):
    """page_text with its part between the lines `begin` and `end` replaced by `generated`; a page
    without the two lines is an error naming the case (the prose would be lost otherwise)."""
    from microtensor import MicrotensorError

    if begin not in page_text or end not in page_text:
        raise MicrotensorError(f"{case}: the page lacks the lines that mark its generated part:\n{begin}\n{end}")
    head, rest = page_text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n\n{generated}\n{end}{tail}"


def write_figures_and_page(figures, figure_folder, page, with_results):
    """Write `figures` ({file name: SVG text}) into figure_folder and the page as `with_results`
    (page text -> page text) makes it; a page that does not exist yet starts empty. Returns the
    paths written."""
    figure_folder, page = Path(figure_folder), Path(page)
    figure_folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, svg in figures.items():
        (figure_folder / name).write_text(svg, encoding="utf-8")
        written.append(figure_folder / name)
    text = page.read_text(encoding="utf-8") if page.exists() else ""
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(with_results(text), encoding="utf-8")
    return [*written, page]


SVG_WIDTH, SVG_HEIGHT = 760, 440
SVG_MARGIN = {"left": 72, "right": 24, "top": 80, "bottom": 56}


def log_x_chart(title, note, x_range, y_range, x_ticks, y_ticks, x_label, y_label):
    """The start of an SVG chart whose x axis is logarithmic: (frame, parts). x_range: (low, high) of
    log10 x; y_range: (low, high); x_ticks: [(x, label)]; y_ticks: [(y, label)]; frame (programs/
    loss_plot.Frame) places a point at (frame.x(log10 x), frame.y(y)). The caller adds its series
    to parts, then "</svg>"."""
    from programs import loss_plot

    frame = loss_plot.Frame(
        left=SVG_MARGIN["left"], top=SVG_MARGIN["top"], width=SVG_WIDTH - SVG_MARGIN["left"] - SVG_MARGIN["right"],
        height=SVG_HEIGHT - SVG_MARGIN["top"] - SVG_MARGIN["bottom"],
        step_min=x_range[0], step_max=x_range[1], loss_min=y_range[0], loss_max=y_range[1],
    )  # fmt: skip
    right, bottom = frame.left + frame.width, frame.top + frame.height
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{SVG_WIDTH}" height="{SVG_HEIGHT}" viewBox="0 0 {SVG_WIDTH} {SVG_HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<rect width="{SVG_WIDTH}" height="{SVG_HEIGHT}" fill="white"/>',
        f'<text x="{SVG_WIDTH / 2}" y="24" text-anchor="middle" font-size="16" font-weight="bold">{escape(title)}</text>',
        f'<text x="{SVG_WIDTH / 2}" y="44" text-anchor="middle" fill="#555">{escape(note)}</text>',
    ]  # loss_plot.heading centres on its own, wider page
    for x_value, label in x_ticks:
        x = frame.x(math.log10(x_value))
        parts.append(f'<line x1="{x:.2f}" y1="{frame.top}" x2="{x:.2f}" y2="{bottom}" stroke="#e4e4e4"/>')
        parts.append(f'<text class="x-tick" x="{x:.2f}" y="{bottom + 16}" text-anchor="middle">{escape(label)}</text>')
    for y_value, label in y_ticks:
        y = frame.y(y_value)
        parts.append(f'<line x1="{frame.left}" y1="{y:.2f}" x2="{right}" y2="{y:.2f}" stroke="#e4e4e4"/>')
        parts.append(f'<text class="y-tick" x="{frame.left - 6}" y="{y + 4:.2f}" text-anchor="end">{label}</text>')
    middle_y = frame.top + frame.height / 2
    parts.append(f'<text id="x-label" x="{frame.left + frame.width / 2}" y="{SVG_HEIGHT - 14}" text-anchor="middle">{escape(x_label)}</text>')
    parts.append(f'<text id="y-label" x="22" y="{middle_y}" text-anchor="middle" transform="rotate(-90 22 {middle_y})">{escape(y_label)}</text>')
    parts.append(f'<rect id="plot-area" x="{frame.left}" y="{frame.top}" width="{frame.width}" height="{frame.height}" fill="none" stroke="#333"/>')
    return frame, parts
