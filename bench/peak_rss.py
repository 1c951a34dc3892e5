"""Run a Python script with its arguments; print its peak resident memory in MiB as the last line.

    python bench/peak_rss.py train.py --max-iters 200
"""
import resource
import runpy
import sys

script, *arguments = sys.argv[1:]
sys.argv = [script, *arguments]
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as exit_:
    if exit_.code not in (0, None):
        raise
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)  # Linux reports KiB
