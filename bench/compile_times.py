"""Run a Python script with its arguments; print what Numba compiled on the way as the last line
(JSON): each kernel with the seconds its compilation took, the kernels it calls included, as wall
seconds ("kernels") and as CPU seconds of the compiling thread ("kernels_cpu"), and the CPU seconds
(user + system) of the whole run, the processes it started included ("cpu_s"; train.py's second
process compiling generation's kernel is one, whose own kernels are not listed: "children_cpu_s"). Numba compiles in the thread that calls the kernel, so on a busy
machine the CPU seconds are the figure to compare: the wall seconds grow with the load.

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
        self.started, self.done = {}, []  # done: (start, end, CPU seconds, kernel's qualified name, signature)

    def on_start(self, ev):
        self.started[id(ev.data["dispatcher"]), str(ev.data["args"])] = time.perf_counter(), time.thread_time()

    def on_end(self, ev):
        dispatcher, args = ev.data["dispatcher"], str(ev.data["args"])
        start, cpu_start = self.started.pop((id(dispatcher), args))
        function = dispatcher.py_func
        tag = getattr(getattr(getattr(dispatcher, "_cache", None), "_impl_class", None), "tag", "")  # microtensor's kernel(tag=...)
        name = f"{function.__module__}.{function.__qualname__}" + (f" ({tag})" if tag else "")
        self.done.append((start, time.perf_counter(), time.thread_time() - cpu_start, name, args))

    def outermost(self):
        """({kernel: wall seconds}, {kernel: CPU seconds}) of the compilations that no other
        compilation contains (told by their wall-clock intervals)."""
        seconds, cpu_seconds = {}, {}
        for start, end, cpu, name, _ in self.done:
            if not any(s <= start and end <= e and (s, e) != (start, end) for s, e, _, _, _ in self.done):
                seconds[name] = seconds.get(name, 0.0) + end - start
                cpu_seconds[name] = cpu_seconds.get(name, 0.0) + cpu
        return seconds, cpu_seconds


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
outermost, outermost_cpu = listener.outermost()
usage = resource.getrusage(resource.RUSAGE_SELF)  # this process, every thread of it
children = resource.getrusage(resource.RUSAGE_CHILDREN)  # the processes it started and waited for
print(json.dumps({
    "compilations": len(listener.done),
    "kernels": dict(sorted(outermost.items(), key=lambda item: -item[1])),
    "kernels_cpu": dict(sorted(outermost_cpu.items(), key=lambda item: -item[1])),
    "cpu_s": usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime,
    "children_cpu_s": children.ru_utime + children.ru_stime,
}))  # fmt: skip
