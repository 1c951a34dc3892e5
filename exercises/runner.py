"""Running an exercise's checks on a file and saying what came out, in a student's words.

The checks run in this process, one after the other, each on the module loaded from the student's
file (or the solution). Every check runs, so the verdict counts them all; the first failure is
printed in full. Kernels run as the process was started: compiled by Numba, or as plain Python
under NUMBA_DISABLE_JIT=1 (`python -m exercises check` runs both, each in a process of its own).

`grade` is the one verdict that `check NAME`, `check --all` and `list` all give: every check in
every mode `check NAME` runs (`modes_of`), a check skipped in every one of them counted apart,
never as passed.
"""
import argparse
import dataclasses
import inspect
import json
import linecache
import re
import sys
import tempfile
import textwrap
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numba

import microtensor as mt
from microtensor.gradcheck import GradcheckError

from . import catalog, run_in_process
from .checking import CheckFailed, CheckSkipped, load, load_exercise

STATUSES = ("not started", "failing", "incomplete", "passing")  # incomplete: none failed, some could run in no mode
PLAIN, COMPILED = "as plain Python", "compiled"  # a result's mode, as a verdict names it


@dataclass
class CheckResult:
    name: str  # the first line of the check's docstring
    passed: bool
    seconds: float
    message: str = ""  # what went wrong, for a student: empty when passed
    todo: bool = False  # failed on a TODO the student has not written yet
    skipped: bool = False  # could not run in this mode (message: why): neither passed nor failed
    mode: str = ""  # PLAIN or COMPILED: where it ran (for a combined result, where it failed)

    @property
    def failed(self):
        return not self.passed and not self.skipped


def checks_of(exercise):
    """The check functions of an exercise, in the order its test file defines them."""
    module = load(exercise.checks_path(), f"checks_{exercise.key}")
    functions = [f for name, f in vars(module).items() if name.startswith("test_") and inspect.isfunction(f)]
    return sorted(functions, key=lambda f: f.__code__.co_firstlineno)


def describe_check(check):
    doc = inspect.getdoc(check)
    return doc.splitlines()[0] if doc else check.__name__.removeprefix("test_").replace("_", " ")


def _student_traceback(error, path):
    """The traceback's frames that lie in the student's file (the ones a student can act on)."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if Path(f.filename).resolve() == path.resolve()]
    lines = [f"  {Path(f.filename).name}:{f.lineno}, in {f.name}: {(f.line or '').strip()}" for f in frames]
    return "\n".join(lines)


def explain(error, path):
    """A failed check's message: the check's own words, or where the student's code broke."""
    if isinstance(error, (CheckFailed, GradcheckError)):
        return str(error)
    if isinstance(error, NotImplementedError) and str(error).startswith("TODO"):
        where = _student_traceback(error, path)
        return f"not written yet: {error}" + (f"\n{where}" if where else "")
    kind = type(error).__name__
    if isinstance(error, numba.core.errors.NumbaError):
        return _explain_compile_error(error, kind)
    where = _student_traceback(error, path)
    message = f"{kind}: {error}"
    if where:
        return f"{message}\nraised in your file at\n{where}"
    detail = "".join(traceback.format_exception(error)).rstrip()  # outside the student's file: show it all
    return f"{message}\n{detail}"


def _explain_compile_error(error, kind):
    """Numba refused to compile a kernel: its first line, the line of the student's file it stopped
    at, and what to write instead. Not "add --python": as plain Python numpy runs the same code."""
    text = str(error).strip().splitlines()
    reason = next((line.strip() for line in text if line.strip() and not line.startswith("Failed in ")), kind)
    kernel_name = re.search(r"^def (\w+)\(", str(error), re.MULTILINE)
    loc = getattr(error, "loc", None)
    source_line = linecache.getline(loc.filename, loc.line).strip() if loc is not None and loc.line else ""
    lines = [f"Numba could not compile your kernel{f' {kernel_name[1]}' if kernel_name else ''} ({kind}): {reason}"]
    if source_line:
        lines.append(f"  at {Path(loc.filename).name}:{loc.line}: {source_line}")
    else:  # no line to point at: show the start of Numba's own report
        lines += ["  " + line for line in text[:12]] + (["  ..."] if len(text) > 12 else [])
    lines.append(
        "Numba compiles a subset of numpy and Python: write the loop, element by element with scalar "
        "arithmetic (for i in range(...): ...), instead of that construct. This fails only compiled: "
        "run as plain Python, numpy accepts the same code, so only a compiled run shows the mistake."
    )
    return "\n".join(lines)


def run_checks(exercise, source="student"):
    """Run every check of `exercise` on the student's file or the solution: a list of CheckResult."""
    path = exercise.student_path() if source == "student" else exercise.solution_path()
    where = mode_name()
    try:
        module = load_exercise(exercise, source)
    except Exception as error:  # the file does not even import: one failed check that says why
        message = explain(error, path)
        return [CheckResult(f"{path.name} imports", False, 0.0, message, todo=False, mode=where)]
    results = []
    for check in checks_of(exercise):
        start = time.perf_counter()
        try:
            with mt.num_threads(1):  # a check's tensors are tiny: waking more threads costs more than it brings
                check(module)
        except CheckSkipped as reason:
            results.append(CheckResult(describe_check(check), False, time.perf_counter() - start, str(reason), skipped=True, mode=where))
        except Exception as error:
            todo = isinstance(error, NotImplementedError) and str(error).startswith("TODO")
            results.append(CheckResult(describe_check(check), False, time.perf_counter() - start, explain(error, path), todo, mode=where))
        else:
            results.append(CheckResult(describe_check(check), True, time.perf_counter() - start, mode=where))
    return results


def modes_of(exercise, source="student"):
    """The modes `check NAME` runs, in order (True: plain Python): both, or plain Python only for a
    file without a kernel, where a compiled run would run the very same numpy code again."""
    path = exercise.solution_path() if source == "solution" else exercise.student_path()
    return [True, False] if "@kernel" in path.read_text() else [True]


def combine(runs):
    """One result per check from the runs of several modes: failed if it failed in any, passed if it
    ran in some and failed in none, skipped only if it ran in none."""
    by_name = {}
    for results in runs:
        for result in results:
            by_name.setdefault(result.name, []).append(result)
    combined = []
    for results in by_name.values():
        failed = [r for r in results if r.failed]
        ran = [r for r in results if not r.skipped]
        if failed:
            combined.append(failed[0])
        elif ran:
            combined.append(dataclasses.replace(ran[0], mode=", ".join(r.mode for r in ran)))
        else:
            combined.append(results[0])
    return combined


def verdict(results):
    """(status, "4/5 checks, 1 skipped") of one exercise's results: passing only when every check ran and passed."""
    passed = sum(r.passed for r in results)
    skipped = sum(r.skipped for r in results)
    status = "failing" if any(r.failed for r in results) else "incomplete" if skipped else "passing"
    return status, f"{passed}/{len(results)} checks" + (f", {skipped} skipped" if skipped else "")


def _run_modes(keys, source, plain_python):
    """The results of the checks of `keys` in a process of its own, in one mode: {key: [CheckResult]}.
    An exercise whose run crashed the process gets one failed result that says so."""
    with tempfile.TemporaryDirectory() as folder:
        saved = Path(folder) / "results.json"
        finished = run_in_process(keys, source == "solution", plain_python, ["--quiet", "--save", str(saved)], capture_output=True, text=True)
        found = load_results(saved) if saved.exists() else {}
    where = PLAIN if plain_python else COMPILED
    crash = (finished.stderr.strip().splitlines() or [f"exit status {finished.returncode}"])[-1]
    for key in keys:
        found.setdefault(key, [CheckResult("the checks run to the end", False, 0.0, f"the run stopped: {crash}", mode=where)])
    return found


def grade(exercises, source="student"):
    """Every exercise's (status, combined results), graded as `check NAME` grades it: as plain Python,
    then, for a file with a kernel that passed there, compiled. Two processes for all of them."""
    graded = {e.key: ("not started", []) for e in exercises if source == "student" and e.not_started()}
    started = [e for e in exercises if e.key not in graded]
    plain = _run_modes([e.key for e in started], source, True) if started else {}
    to_compile = [e for e in started if False in modes_of(e, source) and not any(r.failed for r in plain[e.key])]
    compiled = _run_modes([e.key for e in to_compile], source, False) if to_compile else {}
    for exercise in started:
        runs = [plain[exercise.key]] + ([compiled[exercise.key]] if exercise.key in compiled else [])
        results = combine(runs)
        graded[exercise.key] = (verdict(results)[0], results)
    return {e.key: graded[e.key] for e in exercises}


def save_results(path, results_of):
    Path(path).write_text(json.dumps({key: [dataclasses.asdict(r) for r in results] for key, results in results_of.items()}))


def load_results(path):
    return {key: [CheckResult(**r) for r in results] for key, results in json.loads(Path(path).read_text()).items()}


def status_of(exercise, results=None):
    """not started (the file's TODOs are all still there), failing, incomplete or passing: of
    `results` if given, else graded as `check NAME` grades it (every mode it runs)."""
    if exercise.not_started():
        return "not started"
    return grade([exercise])[exercise.key][0] if results is None else verdict(results)[0]


def mode():
    return "as plain Python (NUMBA_DISABLE_JIT=1)" if numba.config.DISABLE_JIT else "compiled by Numba"


def mode_name():
    return PLAIN if numba.config.DISABLE_JIT else COMPILED


def report(exercise, source, results, out=sys.stdout):
    """Print one run's checks, its verdict and the first failing check in full; True if all passed."""
    whose = "the reference solution" if source == "solution" else "your file"
    shown = exercise.solution_path() if source == "solution" else exercise.student_path()
    print(f"{exercise.number}. {exercise.title}: {whose} {shown.relative_to(catalog.EXERCISES_DIR.parent)}, {mode()}", file=out)
    for result in results:
        mark = "skip" if result.skipped else "ok  " if result.passed else ("TODO" if result.todo else "FAIL")
        why = f": {result.message}" if result.skipped else ""
        print(f"  {mark} {result.name}  ({result.seconds:.2f} s){why}", file=out)
    passed = sum(r.passed for r in results)
    failed = [r for r in results if r.failed]
    skipped = sum(r.skipped for r in results)
    if not failed and not skipped:
        print(f"Verdict: passing, all {len(results)} checks.", file=out)
        return True
    if not failed:  # a skipped check is not a passed one: `check NAME` counts it only where it runs
        print(f"Verdict: no check fails in this mode: {passed} of {len(results)} pass, {skipped} skipped here.", file=out)
        return True
    if source == "student" and exercise.not_started():  # `list` and `check --all` say so too
        print(f"Verdict: not started: {shown.name} still holds every TODO. {first_todo(shown, failed)}", file=out)
    else:
        print(f"Verdict: failing, {passed} of {len(results)} checks pass" + (f", {skipped} skipped in this mode." if skipped else "."), file=out)
    print(f"First failing check: {failed[0].name}", file=out)
    print("  " + failed[0].message.replace("\n", "\n  "), file=out)
    others = [r for r in failed[1:] if not r.todo]
    if others:  # each check's first line whole, wrapped between words: a word cut in half reads as a typo
        print("The other failing checks say:", file=out)
        for result in others:
            first_line = result.message.splitlines()[0] if result.message else ""
            print(f"  - {result.name}:", file=out)
            print(textwrap.fill(first_line, width=100, initial_indent="    ", subsequent_indent="    ",
                                break_long_words=False, break_on_hyphens=False), file=out)
    return False


def first_todo(path, failed):
    """Which TODO to write first: the one the first check that reached a TODO stopped at (the checks
    run in the order the task builds the code), else the first in the file."""
    reached = next((r for r in failed if r.todo), None)
    if reached is not None:
        what = reached.message.splitlines()[0].removeprefix("not written yet: ")
        raised = re.findall(rf"{re.escape(path.name)}:(\d+)", reached.message)  # the last frame: the raise itself
        return f"Start with {what}" + (f", at line {raised[-1]}." if raised else ".")
    lines = path.read_text().splitlines()
    number = next((n for n, line in enumerate(lines, 1) if catalog.TODO_RAISE.search(line)), None)
    return f"Start with the TODO at line {number}." if number else ""


def main(argv=None):
    """One run of an exercise's checks in this process (what `python -m exercises check` starts)."""
    parser = argparse.ArgumentParser(prog="python -m exercises.runner")
    parser.add_argument("names", nargs="+")
    parser.add_argument("--solution", action="store_true")
    parser.add_argument("--pdb", action="store_true", help="stop in pdb where the first failing check failed")
    parser.add_argument("--save", metavar="FILE", help="write the results as JSON, after each exercise")
    parser.add_argument("--quiet", action="store_true", help="print no report")
    args = parser.parse_args(argv)
    exercises = [catalog.find(name) for name in args.names]
    source = "solution" if args.solution else "student"
    if args.pdb:
        return debug_first_failure(exercises[0], source)
    results_of, passed = {}, True
    for exercise in exercises:
        results_of[exercise.key] = run_checks(exercise, source)
        if args.save:  # after each: what ran before a crash still counts
            save_results(args.save, results_of)
        if not args.quiet:
            passed = report(exercise, source, results_of[exercise.key]) and passed
    return 0 if passed else 1


def debug_first_failure(exercise, source):
    """Run the checks until one fails, then open pdb at the line that raised."""
    import pdb

    module = load_exercise(exercise, source)
    for check in checks_of(exercise):
        try:
            check(module)
        except CheckSkipped:  # cannot run in this mode: not a failure to debug
            continue
        except Exception as error:
            print(f"check failed: {describe_check(check)}\n{explain(error, exercise.student_path())}")
            print("pdb: `bt` shows the stack, `up`/`down` move along it, `p name` prints a value, `q` quits")
            pdb.post_mortem(error.__traceback__)
            return 1
    print("every check passes: nothing to debug")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # the checks could not run at all: not a verdict on the student's code
        traceback.print_exc()
        sys.exit(3)
