"""Running an exercise's checks on a file and saying what came out, in a student's words.

The checks run in this process, one after the other, each on the module loaded from the student's
file (or the solution). Every check runs, so the verdict counts them all; the first failure is
printed in full. Kernels run as the process was started: compiled by Numba, or as plain Python
under NUMBA_DISABLE_JIT=1 (`python -m exercises check` runs both, each in a process of its own).
"""
import argparse
import inspect
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numba

import microtensor as mt
from microtensor.gradcheck import GradcheckError

from . import catalog
from .checking import CheckFailed, CheckSkipped, load, load_exercise

STATUSES = ("not started", "failing", "passing")


@dataclass
class CheckResult:
    name: str  # the first line of the check's docstring
    passed: bool
    seconds: float
    message: str = ""  # what went wrong, for a student: empty when passed
    todo: bool = False  # failed on a TODO the student has not written yet
    skipped: bool = False  # cannot run in this mode (message: why); counts as passed


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
    if isinstance(error, numba.core.errors.NumbaError):  # a typing error: long, and about compiled code
        text = str(error).strip().splitlines()
        shown = "\n".join(text[:12]) + ("\n  ..." if len(text) > 12 else "")
        return (
            f"Numba could not compile your kernel ({kind}):\n{shown}\n"
            "Run the check as plain Python to see the same code fail with a Python traceback: "
            "add --python."
        )
    where = _student_traceback(error, path)
    message = f"{kind}: {error}"
    if where:
        return f"{message}\nraised in your file at\n{where}"
    detail = "".join(traceback.format_exception(error)).rstrip()  # outside the student's file: show it all
    return f"{message}\n{detail}"


def run_checks(exercise, source="student"):
    """Run every check of `exercise` on the student's file or the solution: a list of CheckResult."""
    path = exercise.student_path() if source == "student" else exercise.solution_path()
    try:
        module = load_exercise(exercise, source)
    except Exception as error:  # the file does not even import: one failed check that says why
        message = explain(error, path)
        return [CheckResult(f"{path.name} imports", False, 0.0, message, todo=False)]
    results = []
    for check in checks_of(exercise):
        start = time.perf_counter()
        try:
            with mt.num_threads(1):  # a check's tensors are tiny: waking more threads costs more than it brings
                check(module)
        except CheckSkipped as reason:
            results.append(CheckResult(describe_check(check), True, time.perf_counter() - start, str(reason), skipped=True))
        except Exception as error:
            todo = isinstance(error, NotImplementedError) and str(error).startswith("TODO")
            results.append(CheckResult(describe_check(check), False, time.perf_counter() - start, explain(error, path), todo))
        else:
            results.append(CheckResult(describe_check(check), True, time.perf_counter() - start))
    return results


def status_of(exercise, results=None):
    """not started (the file's TODOs are all still there), failing or passing."""
    if exercise.not_started():
        return "not started"
    results = run_checks(exercise) if results is None else results
    return "passing" if all(r.passed for r in results) else "failing"


def mode():
    return "as plain Python (NUMBA_DISABLE_JIT=1)" if numba.config.DISABLE_JIT else "compiled by Numba"


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
    failed = [r for r in results if not r.passed]
    skipped = sum(r.skipped for r in results)
    if not failed:
        print(f"Verdict: passing, all {len(results)} checks" + (f" ({skipped} skipped in this mode)." if skipped else "."), file=out)
        return True
    print(f"Verdict: failing, {passed} of {len(results)} checks pass.", file=out)
    print(f"First failing check: {failed[0].name}", file=out)
    print("  " + failed[0].message.replace("\n", "\n  "), file=out)
    others = [r for r in failed[1:] if not r.todo]
    if others:  # a later check may name the mistake more precisely: one line of each
        print("The other failing checks say:", file=out)
        for result in others:
            first_line = result.message.splitlines()[0] if result.message else ""
            shortened = first_line if len(first_line) <= 160 else first_line[:157] + "..."
            print(f"  - {result.name}: {shortened}", file=out)
    return False


def main(argv=None):
    """One run of an exercise's checks in this process (what `python -m exercises check` starts)."""
    parser = argparse.ArgumentParser(prog="python -m exercises.runner")
    parser.add_argument("name")
    parser.add_argument("--solution", action="store_true")
    parser.add_argument("--pdb", action="store_true", help="stop in pdb where the first failing check failed")
    args = parser.parse_args(argv)
    exercise = catalog.find(args.name)
    source = "solution" if args.solution else "student"
    if args.pdb:
        return debug_first_failure(exercise, source)
    return 0 if report(exercise, source, run_checks(exercise, source)) else 1


def debug_first_failure(exercise, source):
    """Run the checks until one fails, then open pdb at the line that raised."""
    import pdb

    module = load_exercise(exercise, source)
    for check in checks_of(exercise):
        try:
            check(module)
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
