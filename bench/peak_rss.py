"""Run a Python script with its arguments; print its peak resident memory in MiB as the last line.

    python bench/peak_rss.py train.py --max-iters 200

The script runs in this process, as `python SCRIPT ...` would run it: its own folder first on
sys.path, so that it imports the microtensor beside it.
"""
import os
import resource
import runpy
import sys

script, *arguments = sys.argv[1:]
sys.argv = [script, *arguments]
sys.path[0] = os.path.dirname(os.path.abspath(script))
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as exit_:
    if exit_.code not in (0, None):
        raise
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)  # Linux reports KiB: the peak of this process
