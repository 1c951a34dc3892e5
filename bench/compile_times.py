"""Run a Python script with its arguments; print what Numba compiled on the way as the last line
(JSON): each kernel with the seconds its compilation took, the kernels it calls included, and the
CPU seconds (user + system) of the whole run.

    python bench/compile_times.py train.py --max-iters 1

With an empty Numba cache this is where a cold start's time goes. A kernel that calls others
compiles them inside its own compilation: only the outermost compilations are listed, each with
its callees' time in its own, so that the seconds add up to the time spent compiling.
The script runs in this process, as in bench/peak_rss.py.
"""
import json
import os
import resource
import runpy
import sys
import time

from numba.core import event


class CompileTimes(event.Listener):
    def __init__(self):
        self.started, self.done = {}, []  # done: (start, end, kernel's qualified name, signature)

    def on_start(self, ev):
        self.started[id(ev.data["dispatcher"]), str(ev.data["args"])] = time.perf_counter()

    def on_end(self, ev):
        dispatcher, args = ev.data["dispatcher"], str(ev.data["args"])
        start = self.started.pop((id(dispatcher), args))
        function = dispatcher.py_func
        self.done.append((start, time.perf_counter(), f"{function.__module__}.{function.__qualname__}", args))

    def outermost(self):
        """{kernel: seconds} of the compilations that no other compilation contains."""
        seconds = {}
        for start, end, name, _ in self.done:
            if not any(s <= start and end <= e and (s, e) != (start, end) for s, e, _, _ in self.done):
                seconds[name] = seconds.get(name, 0.0) + end - start
        return seconds


listener = CompileTimes()
event.register("numba:compile", listener)
script, *arguments = sys.argv[1:]
sys.argv = [script, *arguments]
sys.path[0] = os.path.dirname(os.path.abspath(script))
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as exit_:
    if exit_.code not in (0, None):
        raise
outermost = listener.outermost()
usage = resource.getrusage(resource.RUSAGE_SELF)  # this process, every thread of it
print(json.dumps({
    "compilations": len(listener.done),
    "kernels": dict(sorted(outermost.items(), key=lambda item: -item[1])),
    "cpu_s": usage.ru_utime + usage.ru_stime,
}))  # fmt: skip
