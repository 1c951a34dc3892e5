"""The mutation suite: prove that the tests catch wrong gradients by planting bugs, one at a time.

    python mutation/run.py                      # every mutant, 2 at a time
    python mutation/run.py --list               # what the mutants are, and whether each still applies
    python mutation/run.py --only 'softmax.*' relu.backward_at_zero
    python mutation/run.py --jobs 1 --timeout 600 --baseline

Each mutant (mutation/mutants.py) is one deliberate bug: a file, a snippet of its source that must
occur exactly once, the snippet's replacement, and the tests that should notice. For each mutant
this script copies the project into a temporary folder (the working tree is never touched),
replaces the snippet in the copy, and runs

    python -m pytest -x -q -p no:cacheprovider -n 0 <the mutant's tests>

with the copy as the working directory. The mutant is *killed* when that run fails, and *survives*
when it passes: then the tests cannot tell the bug from the real code, and a better test is needed
(the mutant is never dropped for it). A snippet that is missing or occurs more than once (the
source changed under the mutant), a run that cannot even collect its tests, selects none, or
outlives the timeout is an *error*: nothing was learned about the tests.

Why each choice:
- A fresh copy per mutant, at the same path for every mutant a worker runs: nothing one mutant did
  (a changed file, a .pyc, a hypothesis database) can leak into the next, and Numba's cache (kept
  beside the copy, keyed on every source file and its path) is reused where the sources are
  unchanged: by the mutants outside microtensor/, and by the baseline.
- A mutant of a readable kernel runs with NUMBA_DISABLE_JIT=1 when its tests need nothing else:
  any edit in microtensor/ makes every kernel compile again, and the plain Python kernels on the
  tests' small inputs cost less than compiling them. A mutant of a fast twin runs compiled. Both
  draw as many hypothesis examples as the default test run.
- Hypothesis draws from a fixed seed (--hypothesis-seed, default 0), so a kill is repeatable; run
  with `--hypothesis-seed random` to check that a kill does not depend on the seed.
- Each run gets cpus / jobs threads (NUMBA_NUM_THREADS, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS), so
  parallel runs do not fight over the cores.

Exit status: 0 if every mutant chosen was killed, 1 otherwise (a survivor or an error).
"""
import argparse
import concurrent.futures
import fnmatch
import importlib.util
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# What is not copied: version control, caches (Python's, Numba's, pytest's, hypothesis's) and outputs.
IGNORED = shutil.ignore_patterns(
    ".git", "__pycache__", "*.pyc", "*.nbi", "*.nbc", "*.egg-info", ".venv*", ".hypothesis",
    ".pytest_cache", ".ruff_cache", "out", "build", "dist", "results",
)  # fmt: skip

# pytest's exit codes (pytest.ExitCode): what each says about a mutant.
PYTEST_PASSED, PYTEST_FAILED = 0, 1
PYTEST_NOT_RUN = {2: "interrupted or a collection error", 3: "internal error", 4: "usage error", 5: "no tests collected"}


def load_mutants():
    spec = importlib.util.spec_from_file_location("mutation_mutants", HERE / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module.MUTANTS


@dataclass
class Outcome:
    mutant: object  # a Mutant, or None for a baseline run
    label: str
    status: str  # "killed", "SURVIVED" or "error"
    seconds: float
    detail: str = ""  # the failing test for a kill, the reason for an error
    output: str = ""


def problem_with(mutant, root=ROOT):
    """Why `mutant` cannot be applied to the sources under `root` (None if it can)."""
    path = root / mutant.file
    if not path.is_file():
        return f"{mutant.file} does not exist"
    count = path.read_text(encoding="utf-8").count(mutant.original)
    if count != 1:
        where = "is not in" if count == 0 else f"occurs {count} times in"
        return f"stale mutant: its snippet {where} {mutant.file} (it must occur exactly once)"
    if mutant.replacement == mutant.original:
        return "the replacement equals the original"
    return None


def copy_project(destination):
    if destination.exists():
        shutil.rmtree(destination)
    shutil.copytree(ROOT, destination, ignore=IGNORED)


def apply(mutant, project):
    path = project / mutant.file
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace(mutant.original, mutant.replacement, 1), encoding="utf-8")


def environment(worker_dir, jit, threads):
    env = dict(os.environ)
    for name in ("NUMBA_DISABLE_JIT", "MICROTENSOR_KERNELS", "HYPOTHESIS_PROFILE", "PYTHONPATH"):
        env.pop(name, None)  # the defaults the tests expect; the copy is found first on sys.path
    if not jit:
        env["NUMBA_DISABLE_JIT"] = "1"
    # As many hypothesis examples as a compiled run draws (tests/conftest.py would take its
    # "nojit" profile's fewer): a kill must not hinge on a handful of draws.
    env["HYPOTHESIS_PROFILE"] = "default"
    env["NUMBA_CACHE_DIR"] = str(worker_dir / "numba-cache")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    for name in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = str(threads)
    return env


def pytest_command(tests, hypothesis_seed):
    # -m "slow or not slow": a mutant's tests are chosen by its -k, slow ones included (setup.cfg leaves them out by default)
    # -n 0: one process (setup.cfg's -n 2 would start workers, which cost more than a mutant's few tests)
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "slow or not slow", "-n", "0"]
    if hypothesis_seed != "random":
        command.append(f"--hypothesis-seed={hypothesis_seed}")
    return command + shlex.split(tests)


def run_pytest(project, tests, env, timeout, hypothesis_seed):
    """(pytest's exit code or None on timeout, its output, seconds)."""
    start = time.monotonic()
    process = subprocess.Popen(
        pytest_command(tests, hypothesis_seed), cwd=project, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = process.communicate(timeout=timeout)
        code = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # its own session: the test run and anything it started
        output, _ = process.communicate()
        code = None
    return code, output, time.monotonic() - start


def first_failure(output):
    """The first failing test named in pytest's short summary, or its first error line."""
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" ", 1)[1].split(" - ", 1)[0].strip()
    for line in output.splitlines():
        if re.match(r"^E\s+\S", line):
            return line[1:].strip()
    return ""


def verdict(code, output, timeout):
    """(status, detail) of a mutant's test run."""
    if code is None:
        return "error", f"no result within the timeout of {timeout} s (raise --timeout if the machine is busy)"
    if code == PYTEST_PASSED:
        return "SURVIVED", ""
    if code == PYTEST_FAILED:
        return "killed", first_failure(output)
    if code < 0:
        return "killed", f"the test process died from signal {-code}"
    return "error", f"pytest exit code {code} ({PYTEST_NOT_RUN.get(code, 'unknown')})"


class Workers:
    """`jobs` folders, one per run in progress: a run takes a free folder and gives it back."""

    def __init__(self, base, jobs):
        self.free = queue.Queue()
        for index in range(jobs):
            folder = base / f"worker-{index}"
            folder.mkdir(parents=True, exist_ok=True)
            self.free.put(folder)

    def run(self, function, *args):
        folder = self.free.get()
        try:
            return function(folder, *args)
        finally:
            self.free.put(folder)


def run_mutant(worker_dir, mutant, options):
    project = worker_dir / "project"
    copy_project(project)
    problem = problem_with(mutant, project)
    if problem:
        return Outcome(mutant, mutant.name, "error", 0.0, problem)
    apply(mutant, project)
    env = environment(worker_dir, mutant.jit, options.threads)
    code, output, seconds = run_pytest(project, mutant.tests, env, options.timeout, options.hypothesis_seed)
    status, detail = verdict(code, output, options.timeout)
    return Outcome(mutant, mutant.name, status, seconds, detail, output)


def run_baseline(worker_dir, jit, tests, options):
    project = worker_dir / "project"
    copy_project(project)
    env = environment(worker_dir, jit, options.threads)
    code, output, seconds = run_pytest(project, tests, env, options.timeout, options.hypothesis_seed)
    label = f"baseline ({'compiled' if jit else 'NUMBA_DISABLE_JIT=1'}): {tests}"
    if code == PYTEST_PASSED:
        return Outcome(None, label, "passed", seconds)
    return Outcome(None, label, "error", seconds, first_failure(output) or f"pytest exit code {code}", output)


def check_imports(worker_dir, options):
    """None if a test run in a copy imports the copy's microtensor and gpt (not the working
    tree's, which an editable install also offers), else what it imports instead."""
    project = worker_dir / "project"
    copy_project(project)
    env = environment(worker_dir, False, options.threads)
    code = "import microtensor, gpt; print(microtensor.__file__); print(gpt.__file__)"
    result = subprocess.run([sys.executable, "-c", code], cwd=project, env=env, capture_output=True, text=True, check=False)
    found = result.stdout.split()
    if result.returncode != 0 or len(found) != 2 or not all(Path(f).resolve().is_relative_to(project.resolve()) for f in found):
        return (result.stdout + result.stderr).strip() or f"exit code {result.returncode}"
    return None


def choose(mutants, patterns):
    if not patterns:
        return list(mutants)
    chosen = [m for m in mutants if any(fnmatch.fnmatchcase(m.name, p) for p in patterns)]
    unknown = [p for p in patterns if not any(fnmatch.fnmatchcase(m.name, p) for m in mutants)]
    if unknown:
        sys.exit(f"mutation/run.py: no mutant is named {', '.join(unknown)} (see --list)")
    return chosen


def list_mutants(mutants):
    width = max(len(m.name) for m in mutants)
    for m in mutants:
        problem = problem_with(m)
        mode = "compiled" if m.jit else "no JIT  "
        print(f"{m.name:<{width}}  {mode}  {m.file:<32}  {m.tests}" + (f"\n{'':<{width}}  ERROR: {problem}" if problem else ""))
        if m.why:
            print(f"{'':<{width}}  {m.why}")
    stale = sum(problem_with(m) is not None for m in mutants)
    print(f"\n{len(mutants)} mutants ({sum(m.jit for m in mutants)} compiled, {sum(not m.jit for m in mutants)} without the JIT)"
          + (f"; {stale} cannot be applied" if stale else ""))  # fmt: skip
    return 1 if stale else 0


def tail(text, lines=25):
    return "\n".join("      " + line for line in text.rstrip().splitlines()[-lines:])


def main(argv=None):
    cpus = os.cpu_count() or 1
    parser = argparse.ArgumentParser(
        prog="mutation/run.py",
        description="Apply each deliberate bug of mutation/mutants.py to a copy of the project, one at a time, "
        "and check that the tests chosen for it fail.",
    )
    parser.add_argument("--list", action="store_true", help="list the mutants and check that each still applies; run nothing")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants (names or shell patterns, e.g. 'adam.*')")
    parser.add_argument("--jobs", type=int, default=min(2, cpus), help="mutants run at the same time (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one mutant's tests may take (default: %(default)s)")
    parser.add_argument("--baseline", action="store_true", help="first run every mutant's tests on the unchanged copy: they must pass")
    parser.add_argument("--hypothesis-seed", default="0", help="seed of hypothesis's draws, or 'random' (default: %(default)s)")
    parser.add_argument("--workdir", type=Path, help="where the copies go (default: a new temporary folder, removed afterwards)")
    parser.add_argument("--verbose", action="store_true", help="print the test output of every mutant, not only of survivors and errors")
    options = parser.parse_args(argv)
    if options.jobs < 1 or options.timeout <= 0:
        parser.error("--jobs and --timeout must be positive")
    if options.hypothesis_seed != "random" and not options.hypothesis_seed.isdigit():
        parser.error("--hypothesis-seed must be a non-negative integer or 'random'")
    options.threads = max(1, cpus // options.jobs)

    mutants = load_mutants()
    names = [m.name for m in mutants]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        sys.exit(f"mutation/run.py: mutant names must be unique: {', '.join(duplicates)}")
    if options.list:
        return list_mutants(mutants)
    chosen = choose(mutants, options.only)

    base = options.workdir or Path(tempfile.mkdtemp(prefix="microtensor-mutation-"))
    workers = Workers(base, options.jobs)
    started = time.monotonic()
    try:
        problem = workers.run(check_imports, options)
        if problem:
            print(f"mutation/run.py: a test run in the copy does not import the copy's packages, so no mutant would be seen:\n{problem}")
            return 1
        with concurrent.futures.ThreadPoolExecutor(options.jobs) as pool:
            if options.baseline:
                selections = sorted({(m.jit, m.tests) for m in chosen})
                print(f"baseline: {len(selections)} test selections on the unchanged copy")
                runs = [pool.submit(workers.run, run_baseline, jit, tests, options) for jit, tests in selections]
                failed = [o for o in (f.result() for f in runs) if o.status != "passed"]
                for outcome in failed:
                    print(f"  FAILED {outcome.label}\n    {outcome.detail}\n{tail(outcome.output)}")
                if failed:
                    print("the tests fail without any mutant: fix them first (a mutant's kill would mean nothing)")
                    return 1
                print(f"baseline passed ({time.monotonic() - started:.0f} s)\n")

            print(f"{len(chosen)} mutants, {options.jobs} at a time, {options.threads} thread(s) each; copies in {base}")
            width = max(len(m.name) for m in chosen)
            lock = threading.Lock()
            outcomes = []

            def report(future):
                outcome = future.result()
                with lock:
                    outcomes.append(outcome)
                    detail = f"  {outcome.detail}" if outcome.detail else ""
                    print(f"[{len(outcomes):>3}/{len(chosen)}] {outcome.status:<8} {outcome.seconds:6.1f} s  {outcome.label:<{width}}{detail}", flush=True)
                    if outcome.output and (options.verbose or outcome.status != "killed"):
                        print(tail(outcome.output), flush=True)

            futures = [pool.submit(workers.run, run_mutant, m, options) for m in chosen]
            for future in futures:
                future.add_done_callback(report)
            concurrent.futures.wait(futures)
    finally:
        if options.workdir is None:
            shutil.rmtree(base, ignore_errors=True)

    killed = [o for o in outcomes if o.status == "killed"]
    survived = [o for o in outcomes if o.status == "SURVIVED"]
    errors = [o for o in outcomes if o.status == "error"]
    elapsed = time.monotonic() - started
    print(f"\n{len(killed)}/{len(outcomes)} killed ({100 * len(killed) / max(1, len(outcomes)):.0f}%) in {elapsed / 60:.1f} min")
    for title, group in (("survived", survived), ("errors", errors)):
        if group:
            print(f"{title}:")
            for o in sorted(group, key=lambda o: o.label):
                print(f"  {o.label}: {o.mutant.file}" + (f"  ({o.detail})" if o.detail else ""))
                if o.mutant.why:
                    print(f"    {o.mutant.why}")
    return 1 if survived or errors else 0


if __name__ == "__main__":
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `run.py --list | head` ends quietly
    sys.exit(main())
