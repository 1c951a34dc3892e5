"""Where a step's time, FLOPs and memory go, per op and phase.

    import microtensor.debug as debug

    with debug.profile() as prof:            # prints the table when the block ends
        _, loss = model(x, y)                # the ops applied here: phase "forward"
        loss.backward()                      # each op's backward in the walk: phase "backward"
        with prof.phase("optimizer"):        # a phase named by hand: its ops, and its time outside ops
            opt.step()
    prof.report.rows                         # the same numbers as data (ProfileReport, OpStats)

For each (op, phase) the report gives:
- calls and seconds: the op's forward as `Function.apply` runs it (the engine's bookkeeping
  included), or its backward as the walk calls it;
- FLOPs, counted from the shapes by the rules in FLOP_RULES below (one line per op, derived in its
  comment), and GFLOP/s; an op without a rule shows "-", not a guess;
- bytes moved: the arrays the op must read and write at least once (forward: its Tensor inputs and
  its output; backward: the gradient in, the arrays it saved, the gradients out). FLOPs / bytes
  moved is the op's arithmetic intensity, the x-axis of a roofline (docs/profiling.md);
- bytes saved for backward: the activations `save_for_backward` keeps alive until backward, each
  array counted once however many ops save it, parameters and data not counted (that memory is
  there anyway). This is what gradient checkpointing trades for recomputing the forward.

And for the whole block: its wall time; "everything else", the wall time spent in no op (the
backward walk's own work, Python between ops, an optimizer that runs no Function); the FLOPs of all
ops and the model FLOPs utilization (MFU): FLOPs / wall time / the GEMM peak, the FLOP/s numpy's
matrix product reaches on the computer it runs on (measure_gemm_peak, measured once per process at a square
shape); and the peak memory, two ways: `peak_bytes` counts the arrays the ops made (outputs and
gradients, from when each is made until it is freed: an array's memory is known exactly, and
counting it costs a dict entry per array instead of tracemalloc's hook on every allocation), and
`rss_peak_bytes` is the process's largest resident set so far (getrusage: everything, including
what was there before the block).

A block that raises prints the partial table and lets the error through unchanged.

Off, the profiler costs nothing: it is a watcher (anomaly.py's OpObserver) that `Function.apply`
and the backward walk call only while `autograd._observer` is set.
"""
import math
import resource
import sys
import time
import weakref
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import numpy as np
from rich.console import Console
from rich.table import Table

from .anomaly import OpObserver
from .checks import describe
from .errors import InputError, InputTypeError
from .tensor import Tensor


# --------------------------------------------------------------------------------- FLOPs from shapes


def _size(shape):
    return math.prod(shape) if shape is not None else 0


def _visible_pairs(tq, tk, causal):
    """Query-key pairs attention computes per head: all of them, or those a causal mask leaves
    (query i sits at position tk - tq + i and sees keys 0..that position)."""
    if not causal:
        return tq * tk
    return tq * (tk - tq) + tq * (tq + 1) // 2


def _attention(b, h, tq, tk, d, causal):
    """(forward, backward) FLOPs of attention: S = q kᵀ (2 D per pair), softmax (5 per pair),
    O = P v (2 D per pair); backward: dV = Pᵀ dO, dP = dO vᵀ, dq = dS k, dk = dSᵀ q (8 D per pair)
    and the softmax's backward (4 per pair)."""
    pairs = b * h * _visible_pairs(tq, tk, causal)
    return pairs * (4 * d + 5), pairs * (8 * d + 4)


def _matmul(call):
    """a (..., n, k) @ b (..., k, m): each of the n·m outputs is k multiplies and k adds; backward
    is two such products (dA = dC bᵀ, dB = aᵀ dC)."""
    a = call.shapes[0]
    k = a[-1] if len(a) else 1
    forward = 2 * _size(call.out) * k
    return forward, 2 * forward


def _multi_head(call, n_head, n_kv_head, causal):
    b, t, width = call.shapes[0]
    return _attention(b, n_head, t, t, width // (n_head + 2 * n_kv_head), causal)


def _lora(call):
    x, weight, lora_a = call.shapes[0], call.shapes[1], call.shapes[3]
    rank, rows = min(lora_a), _size(x) // x[-1]
    forward = 2 * rows * weight[0] * weight[1] + 2 * rows * rank * (weight[0] + weight[1])
    return forward, 2 * forward


def _per_element(forward, backward, of="out"):
    """An elementwise rule: so many FLOPs per element of the output (or of input 0) each way."""

    def rule(call):
        n = _size(call.out) if of == "out" else _size(call.shapes[0])
        return forward * n, backward * n

    return rule


def _no_arithmetic(call):
    return 0, 0


# One rule per op: call -> (forward FLOPs, backward FLOPs), with call.shapes (each positional
# input's shape, None for a non-Tensor), call.out (the output's shape) and call.args.
FLOP_RULES = {
    "MatMul": _matmul,
    "ScaledDotProductAttention": lambda c: _attention(*c.shapes[0][:3], c.shapes[1][2], c.shapes[0][3], c.args[3]),
    "OnlineAttention": lambda c: _attention(*c.shapes[0][:3], c.shapes[1][2], c.shapes[0][3], c.args[3]),
    "MultiHeadAttention": lambda c: _multi_head(c, c.args[1], c.args[2], c.args[3]),
    "MultiHeadOnlineAttention": lambda c: _multi_head(c, c.args[1], c.args[2], c.args[3]),
    "LoRALinear": _lora,
    # LayerNorm: mean (1), centre (1), variance (2), times rstd (1), weight (1), bias (1) per element;
    # backward: dx̂ = dy w (1), dw and db (3), two row means (3), dx = rstd (dx̂ - m1 - x̂ m2) (4).
    "LayerNorm": _per_element(7, 11),
    "RMSNorm": _per_element(5, 9),  # mean square (2), times rstd (1), weight (1), ...; backward ~ LayerNorm's less the mean
    # Softmax: max, subtract, exp, sum, divide; backward y (dy - sum(dy y)): multiply, sum, subtract, multiply.
    "Softmax": _per_element(5, 4),
    "LogSoftmax": _per_element(5, 3),
    "CrossEntropy": _per_element(5, 3, of="input"),  # per logit: log-softmax; backward softmax - one-hot, scaled
    "GELU": _per_element(9, 17),  # tanh form: x³, two scalings, add, tanh, add, two products; backward twice that
    "SiLU": _per_element(4, 6),
    "SwiGLU": _per_element(5, 8),
    "RoPE": _per_element(3, 3),  # x cos + rotate(x) sin
    "Add": _per_element(1, 1), "Sub": _per_element(1, 1), "Mul": _per_element(1, 2), "Div": _per_element(1, 3),
    "Neg": _per_element(1, 1), "Pow": _per_element(1, 3), "Exp": _per_element(1, 1), "Log": _per_element(1, 1),
    "Sqrt": _per_element(1, 2), "Tanh": _per_element(1, 3), "Relu": _per_element(1, 1), "Sigmoid": _per_element(1, 3),
    "Dropout": _per_element(1, 1),
    "Sum": _per_element(1, 1, of="input"), "Mean": _per_element(1, 1, of="input"), "Max": _per_element(1, 1, of="input"),
    "Embedding": lambda c: (0, _size(c.out)),  # a gather; backward adds each row's gradient into its token's row
    # Only data moved: no arithmetic either way.
    **{name: _no_arithmetic for name in ("Reshape", "Permute", "GetItem", "Concat", "Stack", "MaskedFill", "Where", "Cast", "GatherRows")},
}


@dataclass
class _Call:
    shapes: list
    out: tuple
    args: tuple


def count_flops(function, args, out_shape):
    """(forward, backward) FLOPs of one call of `function` (a Function subclass) on `args` that
    made an output of `out_shape`; None for an op with no rule in FLOP_RULES."""
    rule = FLOP_RULES.get(function.__name__)
    if rule is None:
        return None
    shapes = [tuple(a.shape) if isinstance(a, Tensor) else None for a in args]
    return rule(_Call(shapes, tuple(out_shape), args))


# --------------------------------------------------------------------------------- the machine's peaks

_measured = {}  # what measure_gemm_peak and measure_memory_bandwidth found, by their arguments


def measure_gemm_peak(n=512, dtype=np.float32, repeats=30):
    """FLOP/s of numpy's matrix product (BLAS) of two (n, n) matrices: the best of `repeats`, each
    2 n³ FLOPs. Measured once per process and argument (a tenth of a second). The best, not the
    median: other programs running at the same time only ever slow a run down."""
    key = ("gemm", n, np.dtype(dtype).name, repeats)
    if key not in _measured:
        rng = np.random.default_rng(0)
        a, b = rng.standard_normal((n, n)).astype(dtype), rng.standard_normal((n, n)).astype(dtype)
        out = np.empty((n, n), dtype=dtype)
        np.matmul(a, b, out=out)  # the first call wakes BLAS's threads
        best = min(_timed(lambda: np.matmul(a, b, out=out)) for _ in range(repeats))
        _measured[key] = 2 * n**3 / best
    return _measured[key]


def measure_memory_bandwidth(nbytes=64 * 2**20, repeats=10):
    """Bytes per second a copy of an `nbytes` array moves (it reads and writes each byte: 2 nbytes
    per copy), the best of `repeats`: the roof of an op that reads and writes once, larger than
    the caches so that it is main memory's. Measured once per process and argument."""
    key = ("copy", nbytes, repeats)
    if key not in _measured:
        src = np.ones(nbytes // 4, dtype=np.float32)
        dst = np.empty_like(src)
        np.copyto(dst, src)
        best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(repeats))
        _measured[key] = 2 * src.nbytes / best
    return _measured[key]


def _timed(work):
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


# --------------------------------------------------------------------------------- the report


@dataclass
class OpStats:
    """One op in one phase, summed over its calls."""

    op: str
    phase: str
    calls: int = 0
    seconds: float = 0.0
    flops: float = None  # None: no rule counts this op's FLOPs
    bytes_moved: int = 0
    saved_bytes: int = 0

    @property
    def gflops_per_s(self):
        return None if self.flops is None or self.seconds == 0 else self.flops / self.seconds / 1e9

    @property
    def intensity(self):
        """FLOPs per byte moved: above the machine's peak FLOP/s / bandwidth, the op can be compute-bound."""
        return None if self.flops is None or self.bytes_moved == 0 else self.flops / self.bytes_moved


@dataclass
class ProfileReport:
    """What profile() measured; `to_dict()` gives plain data (for JSON)."""

    rows: list = field(default_factory=list)  # OpStats, largest time first
    wall_seconds: float = 0.0
    everything_else_seconds: float = 0.0  # wall time in no op
    flops: float = 0.0  # of every op with a rule
    gemm_peak_flops_per_s: float = None
    mfu: float = None  # flops / wall_seconds / gemm_peak_flops_per_s
    saved_bytes: int = 0
    peak_bytes: int = 0  # the arrays the ops made, alive at once (counted)
    rss_peak_bytes: int = 0  # the process's largest resident set so far (getrusage)
    error: str = None  # the exception that ended the block, if one did: the report is partial

    def phase_seconds(self):
        """Seconds per phase, summed over the ops (and the phase's time outside ops)."""
        totals = {}
        for row in self.rows:
            totals[row.phase] = totals.get(row.phase, 0.0) + row.seconds
        return totals

    def row(self, op, phase="forward"):
        """The OpStats of `op` in `phase`, or None when it did not run there."""
        return next((r for r in self.rows if r.op == op and r.phase == phase), None)

    def to_dict(self):
        data = asdict(self)
        for row, stats in zip(data["rows"], self.rows):
            row["gflops_per_s"], row["intensity"] = stats.gflops_per_s, stats.intensity
        data["phase_seconds"] = self.phase_seconds()
        return data

    def table(self, top=None):
        """The report as a rich Table (the `top` largest rows, the rest summed in one)."""
        title = "profile" + (f" (partial: {self.error})" if self.error else "")
        peak = self.gemm_peak_flops_per_s
        caption = (
            f"wall {self.wall_seconds * 1e3:.1f} ms; {self.flops / 1e9:.3f} GFLOP"
            + (f"; MFU {100 * self.mfu:.1f}% of numpy's GEMM peak, {peak / 1e9:.0f} GFLOP/s" if self.mfu is not None else "")
            + (" (above 100%: the peak was measured while the machine was busy; give profile(gemm_peak=...))" if (self.mfu or 0) > 1 else "")
            + f"; saved for backward {self.saved_bytes / 2**20:.1f} MiB; peak of the ops' arrays {self.peak_bytes / 2**20:.1f} MiB"
            + f" (counted), process RSS peak {self.rss_peak_bytes / 2**20:.0f} MiB"
        )
        table = Table(title=title, caption=caption)
        table.add_column("op", no_wrap=True)
        table.add_column("phase", no_wrap=True)
        for name in ("calls", "ms", "%", "GFLOP", "GFLOP/s", "FLOP/byte", "saved MiB"):
            table.add_column(name, justify="right")
        shown = self.rows if top is None else self.rows[:top]
        wall = self.wall_seconds or 1.0
        for r in shown:
            table.add_row(
                r.op, r.phase, str(r.calls), f"{r.seconds * 1e3:.2f}", f"{100 * r.seconds / wall:.1f}",
                _maybe(r.flops, 1e-9, ".3g"), _maybe(r.gflops_per_s, 1, ".3g"), _maybe(r.intensity, 1, ".3g"),
                f"{r.saved_bytes / 2**20:.2f}" if r.saved_bytes else "",
            )  # fmt: skip
        rest = self.rows[len(shown):]
        if rest:
            seconds = sum(r.seconds for r in rest)
            table.add_row(f"{len(rest)} more", "", "", f"{seconds * 1e3:.2f}", f"{100 * seconds / wall:.1f}", "", "", "", "")
        table.add_row("everything else", "", "", f"{self.everything_else_seconds * 1e3:.2f}",
                      f"{100 * self.everything_else_seconds / wall:.1f}", "", "", "", "")  # fmt: skip
        return table

    def print(self, console=None, top=None):
        (console or Console()).print(self.table(top))


def _maybe(value, scale, spec):
    return "-" if value is None else format(value * scale, spec)


OUTSIDE_OPS = "(outside ops)"  # the op name of a hand-named phase's time that no op accounts for


# --------------------------------------------------------------------------------- the watcher


def _root(array):
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


class profile(OpObserver):
    """Context manager: profile the ops run inside it (see the module docstring).

    show: print the table when the block ends (it is printed anyway when the block raises).
    console: the rich Console to print to (default: a new one on stdout). top: rows printed.
    gemm_peak: the FLOP/s the MFU is measured against (default: measure_gemm_peak()).
    After the block, `.report` holds the ProfileReport.
    """

    def __init__(self, show=True, console=None, top=None, gemm_peak=None):
        if gemm_peak is not None:
            if not isinstance(gemm_peak, (int, float)) or isinstance(gemm_peak, bool):
                raise InputTypeError(f"profile: gemm_peak must be a number of FLOP/s (or None: measured), got {describe(gemm_peak)}")
            if not gemm_peak > 0:
                raise InputError(f"profile: gemm_peak must be a positive number of FLOP/s, got {gemm_peak}")
        self.show, self.console, self.top, self.gemm_peak = show, console, top, gemm_peak
        self.report = None
        self._phase = "forward"

    def __enter__(self):
        super().__enter__()
        self._stats = {}  # (op, phase) -> OpStats
        self._saved = {}  # id of a saved array's memory -> a weak reference to it (each counted once)
        self._counted = {}  # the same for the arrays counted in peak_bytes
        self._live = self._peak = 0
        self._started = time.perf_counter()
        return self

    def __exit__(self, kind, error, traceback):
        wall = time.perf_counter() - self._started
        super().__exit__(kind, error, traceback)
        try:
            self.report = self._finish(wall, None if error is None else f"{type(error).__name__}: {error}")
            if self.show or error is not None:
                self.report.print(self.console, self.top)
        except Exception as failure:  # the user's error goes first: never replace it with the profiler's
            if error is None:
                raise
            print(f"profile: the partial table could not be made ({type(failure).__name__}: {failure})", file=sys.stderr)
        return False  # an error in the block goes on, unchanged

    @contextmanager
    def phase(self, name):
        """Ops applied inside are counted under phase `name`; its wall time outside ops gets the row
        (OUTSIDE_OPS, name): an optimizer that runs no Function is all there."""
        if not isinstance(name, str) or name in ("", "backward"):
            raise InputError(f"profile.phase: name must be a phase's name other than 'backward' (the walk's), got {name!r}")
        previous, self._phase = self._phase, name
        in_ops_before = self._phase_seconds(name)
        start = time.perf_counter()
        try:
            yield self
        finally:
            outside = time.perf_counter() - start - (self._phase_seconds(name) - in_ops_before)
            self._phase = previous
            self._add(OUTSIDE_OPS, name, outside, None, 0)

    def _phase_seconds(self, name):
        return sum(s.seconds for (op, phase), s in self._stats.items() if phase == name and op != OUTSIDE_OPS)

    def _add(self, op, phase, seconds, flops, bytes_moved, saved=0):
        stats = self._stats.get((op, phase))
        if stats is None:
            stats = self._stats[(op, phase)] = OpStats(op, phase, flops=None if flops is None else 0)
        stats.calls += op != OUTSIDE_OPS
        stats.seconds += seconds
        if flops is not None:
            stats.flops += flops
        stats.bytes_moved += bytes_moved
        stats.saved_bytes += saved

    def _made(self, array, inputs):
        """Count an array an op made, until it is freed (views of the inputs made nothing)."""
        if not isinstance(array, np.ndarray):
            return
        root = _root(array)
        if any(root is _root(a) for a in inputs if isinstance(a, np.ndarray)):
            return
        key = id(root)
        known = self._counted.get(key)
        if known is not None and known() is root:
            return
        self._counted[key] = weakref.ref(root)
        self._live += root.nbytes
        self._peak = max(self._peak, self._live)
        weakref.finalize(root, self._freed, root.nbytes)

    def _freed(self, nbytes):
        self._live -= nbytes

    def apply(self, function, args, kwargs):
        start = time.perf_counter()
        result = self.run_forward(function, args, kwargs)
        seconds = time.perf_counter() - start
        phase = self._phase
        out = result._data
        inputs = [a._data for a in args if isinstance(a, Tensor)]
        flops = count_flops(function, args, out.shape)
        saved = 0
        if result._ctx is not None:
            saved = self._count_saved(result._ctx)
        self._made(out, inputs)
        self._add(function.__name__, phase, seconds, None if flops is None else flops[0],
                  sum(a.nbytes for a in inputs) + out.nbytes, saved)  # fmt: skip
        return result

    def _count_saved(self, ctx):
        """Bytes of the arrays ctx saved that are activations: not a leaf's (a parameter's, the
        data's), and not counted before."""
        leaves = [_root(a._data) for a in ctx.inputs if isinstance(a, Tensor) and a._ctx is None]
        total = 0
        for array in ctx.saved_tensors:
            if not isinstance(array, np.ndarray):
                continue
            root = _root(array)
            if any(root is leaf for leaf in leaves):
                continue
            known = self._saved.get(id(root))
            if known is not None and known() is root:
                continue
            self._saved[id(root)] = weakref.ref(root)
            total += root.nbytes
        return total

    def backward_op(self, ctx, grad_out):
        moved = grad_out.nbytes + sum(a.nbytes for a in ctx.saved_tensors if isinstance(a, np.ndarray))
        start = time.perf_counter()
        grads = self.run_backward(ctx, grad_out)
        seconds = time.perf_counter() - start
        listed = grads if isinstance(grads, tuple) else (grads,)
        for grad in listed:
            if isinstance(grad, np.ndarray):
                moved += grad.nbytes
                self._made(grad, [grad_out])
        flops = count_flops(ctx.function, ctx.inputs, grad_out.shape)  # ctx.inputs: the args of apply
        self._add(ctx.name, "backward", seconds, None if flops is None else flops[1], moved)
        return grads

    def _finish(self, wall, error):
        rows = sorted(self._stats.values(), key=lambda r: -r.seconds)
        in_ops = sum(r.seconds for r in rows)
        flops = sum(r.flops for r in rows if r.flops is not None)
        peak = self.gemm_peak or measure_gemm_peak()
        return ProfileReport(
            rows=rows, wall_seconds=wall, everything_else_seconds=wall - in_ops, flops=flops,
            gemm_peak_flops_per_s=peak, mfu=flops / wall / peak if wall > 0 else None,
            saved_bytes=sum(r.saved_bytes for r in rows), peak_bytes=self._peak,
            rss_peak_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, error=error,
        )  # fmt: skip
