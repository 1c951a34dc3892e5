"""Class exercises: each folder holds a task (README.md), the student's file with its TODOs, the
checks that grade it (test_*.py), a hint (HINT.md) and its facts (exercise.toml). Reference
solutions live in `solutions/`, apart, so a teacher can delete them before handing out.

    python -m exercises list                 # every exercise and its status
    python -m exercises check tanh           # grade your file: a verdict and the first failing check
    python -m exercises check tanh --solution
"""
