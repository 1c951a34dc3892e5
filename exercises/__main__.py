"""python -m exercises list | check NAME [--solution] [--python | --numba] [--pdb] | check --all"""
import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

from . import catalog, run_in_process

USAGE = """\
python -m exercises list                    every exercise: topic, time, status
python -m exercises list --markdown         the exercises as a markdown table (docs/teaching.md has it)
python -m exercises check NAME              grade your file (NAME: 05, layer_norm or 05_layer_norm)
python -m exercises check NAME --solution   the same checks on the reference solution
python -m exercises check NAME --python     only as plain Python (NUMBA_DISABLE_JIT=1)
python -m exercises check NAME --numba      only compiled by Numba
python -m exercises check NAME --pdb        stop in pdb where the first failing check failed
python -m exercises check --all             grade every exercise: one line each (for a teacher)
python -m exercises handout FOLDER          copy the project into FOLDER without the solutions
"""


def _run(name, solution, plain_python, extra=()):
    """Run one exercise's checks in a process of its own, plain Python or compiled: the exit code."""
    return run_in_process([name], solution, plain_python, extra).returncode


def check(args):
    exercise = catalog.find(args.name)
    path = exercise.solution_path() if args.solution else exercise.student_path()  # says so now if solutions were removed
    if args.pdb:  # breakpoints and post-mortem frames exist only in plain Python
        return _run(exercise.key, args.solution, plain_python=True, extra=["--pdb"])
    from .runner import (  # imports microtensor: only when needed
        combine,
        load_results,
        modes_of,
        verdict,
    )

    source = "solution" if args.solution else "student"
    default = not (args.python or args.numba)
    modes = modes_of(exercise, source) if default else [args.python]
    runs = []
    with tempfile.TemporaryDirectory() as folder:
        for plain_python in modes:
            saved = Path(folder) / f"{plain_python}.json"
            code = _run(exercise.key, args.solution, plain_python, extra=["--save", str(saved)])
            if code == 1 and len(modes) == 2 and plain_python:
                print("(the compiled run comes once this one passes)")
            if code != 0:
                return code
            runs.append(load_results(saved)[exercise.key])
            print()
    if modes == [True] and default:
        print(f"({path.name} has no kernel: the compiled run would repeat the same numpy code, so it is skipped)")
    if not default:
        return 0
    # the verdict `check --all` and `list` give too: a check skipped in every mode is not a passed one
    combined = combine(runs)
    status, counts = verdict(combined)
    if not args.solution and exercise.not_started():  # as `list` and `check --all` call it
        status = "not started"
    skipped = [r for r in combined if r.skipped]
    print(f"Overall ({' and '.join('as plain Python' if m else 'compiled' for m in modes)}): {status}, {counts}"
          + "".join(f"\n  not run in any mode: {r.name} ({r.message})" for r in skipped))
    return 0 if status == "passing" else 1


def check_all(args):
    """Every exercise, one line each: what a teacher reads when grading a student's folder, graded
    exactly as `check NAME` grades it (runner.grade: the same modes, skipped checks counted apart)."""
    from .runner import grade, verdict  # imports microtensor: only when needed

    exercises = catalog.all_exercises()
    width = max(len(e.key) for e in exercises)
    source = "solution" if args.solution else "student"
    graded = grade(exercises, source)
    for exercise in exercises:
        status, results = graded[exercise.key]
        if status == "not started":
            print(f"{exercise.key:<{width}}  not started")
            continue
        counts = verdict(results)[1]
        first = next((r for r in results if r.failed), None)
        skipped = next((r for r in results if r.skipped), None)
        tail = f"   first failing ({first.mode}): {first.name}" if first else f"   not run: {skipped.name} ({skipped.message})" if skipped else ""
        print(f"{exercise.key:<{width}}  {status:<10} {counts}{tail}")
    return 0 if all(status == "passing" for status, _ in graded.values()) else 1


def markdown_table():
    """The exercises as a markdown table, in order, with their times: docs/teaching.md holds it."""
    exercises = catalog.all_exercises()
    rows = ["| # | exercise | topic | time |", "|---|---|---|---|"]
    for e in exercises:
        rows.append(f"| {e.number} | [{e.title}](../exercises/{e.key}/README.md) | {e.topic} | {e.minutes} min |")
    total = sum(e.minutes for e in exercises)
    rows.append(f"| | **in all** | {len(exercises)} exercises | **{total // 60} h {total % 60:02d} min** |")
    return "\n".join(rows)


def list_exercises(markdown=False):
    if markdown:
        print(markdown_table())
        return 0
    from .runner import grade

    exercises = catalog.all_exercises()
    # The status column is the verdict `check NAME` would give (runner.grade, both modes), not a quicker
    # guess: a teacher reads "passing" as "check passes"; only started files run, and the kernel cache
    # keeps the compiled run to seconds after the first.
    graded = grade(exercises)
    width = max(len(e.key) for e in exercises)
    print(f"{'exercise':<{width}}  {'topic':<44} {'time':>7}  status")
    for exercise in exercises:
        print(f"{exercise.key:<{width}}  {exercise.topic:<44} {exercise.minutes:>4} min  {graded[exercise.key][0]}")
    total = sum(e.minutes for e in exercises)
    print(f"\n{len(exercises)} exercises, about {total // 60} h {total % 60:02d} min in all. "
          "Statuses are `check NAME`'s verdicts: as plain Python, then compiled.")
    return 0


HANDOUT_LEFT_OUT = (".git", ".venv*", "__pycache__", "*.egg-info", ".hypothesis", ".pytest_cache", "out", "results", "*.nbi", "*.nbc")


def handout(folder):
    """Copy the project into `folder` without the reference solutions: what students receive."""
    import shutil
    from pathlib import Path

    root, target = catalog.EXERCISES_DIR.parent, Path(folder).resolve()
    if target.exists():
        raise FileExistsError(f"handout: {target} exists already; give a folder that does not exist yet")
    if root in target.parents:
        raise ValueError(f"handout: {target} lies inside the project; give a folder outside {root}")
    ignore_common = shutil.ignore_patterns(*HANDOUT_LEFT_OUT)

    def ignore(directory, names):
        left_out = set(ignore_common(directory, names))
        if Path(directory).resolve() == catalog.EXERCISES_DIR:
            left_out.add(catalog.SOLUTIONS_DIR.name)
        return left_out

    try:
        shutil.copytree(root, target, ignore=ignore)
    except OSError as error:  # a read-only folder, a full disk: leave no half copy behind
        shutil.rmtree(target, ignore_errors=True)
        reason = error.strerror or str(error)
        raise HandoutError(f"handout: cannot copy the project to {target}: {reason}; give a folder you can write to") from None
    print(f"copied the project to {target}, without exercises/{catalog.SOLUTIONS_DIR.name}/")
    return 0


def _check_environment():
    """The exercises need the project's packages: say so plainly when this Python lacks them."""
    missing = [name for name in ("numpy", "numba", "microtensor") if importlib.util.find_spec(name) is None]
    if missing:
        raise EnvironmentMissing(
            f"{', '.join(missing)} cannot be imported by this Python ({sys.executable}): activate the project's "
            "environment first (the README's test command makes it: . .venv/bin/activate)"
        )


class EnvironmentMissing(RuntimeError):
    pass


class HandoutError(RuntimeError):
    pass


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m exercises", usage=USAGE)
    commands = parser.add_subparsers(dest="command", required=True)
    lister = commands.add_parser("list")
    lister.add_argument("--markdown", action="store_true", help="the table of docs/teaching.md, without statuses")
    checker = commands.add_parser("check")
    checker.add_argument("name", nargs="?")
    checker.add_argument("--all", action="store_true")
    checker.add_argument("--solution", action="store_true")
    how = checker.add_mutually_exclusive_group()
    how.add_argument("--python", action="store_true")
    how.add_argument("--numba", action="store_true")
    how.add_argument("--pdb", action="store_true")
    handing_out = commands.add_parser("handout")
    handing_out.add_argument("folder")
    args = parser.parse_args(argv)
    try:
        _check_environment()
        if args.command == "handout":
            return handout(args.folder)
        if args.command == "list":
            return list_exercises(args.markdown)
        if args.all == bool(args.name):
            parser.error("check: give an exercise's NAME, or --all")
        return check_all(args) if args.all else check(args)
    except (catalog.UnknownExercise, catalog.SolutionMissing, catalog.BrokenExercise, EnvironmentMissing, HandoutError, FileExistsError, ValueError) as error:
        print(f"python -m exercises: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `python -m exercises list | head`: the reader stopped early
        sys.stderr.close()
        sys.exit(0)
