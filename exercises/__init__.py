"""Class exercises: each folder holds a task (README.md), the student's file with its TODOs, the
checks that grade it (test_*.py), a hint (HINT.md) and its facts (exercise.toml). Reference
solutions live in `solutions/`, apart, so a teacher can delete them before handing out.

    python -m exercises list                 # every exercise and its status
    python -m exercises check tanh           # grade your file: a verdict and the first failing check
    python -m exercises check tanh --solution
"""
import os
import subprocess
import sys


def run_in_process(keys, solution, plain_python, extra=(), **options):
    """`python -m exercises.runner KEYS` in a process of its own, as plain Python
    (NUMBA_DISABLE_JIT=1) or compiled: its CompletedProcess (options go to subprocess.run)."""
    from .catalog import EXERCISES_DIR

    environment = dict(os.environ)
    if plain_python:
        environment["NUMBA_DISABLE_JIT"] = "1"
    else:
        environment.pop("NUMBA_DISABLE_JIT", None)
    command = [sys.executable, "-m", "exercises.runner", *keys, *(["--solution"] if solution else []), *extra]
    return subprocess.run(command, env=environment, cwd=EXERCISES_DIR.parent, check=False, **options)
