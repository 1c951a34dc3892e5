"""Watch a backward pass: a tracer, a tree view of the graph, and a Graphviz export.

    import microtensor.debug as debug
    debug.trace_backward(loss)                    # backward, printing one row per op as the engine visits it
    debug.trace_backward(loss, stop_at="LayerNorm")   # ... and stop in pdb inside LayerNorm's backward
    debug.show_graph(loss)                        # the graph behind `loss`, as a tree
    print(debug.to_dot(loss))                     # the same graph in Graphviz's DOT language
    debug.render(loss, "graph.svg")               # drawn, where Graphviz is installed
    with debug.profile() as prof: ...             # time, FLOPs and memory per op and phase (profiler.py)

The graph is made of `Context`s (`tensor.grad_fn`): each holds the Function that made a tensor,
its inputs and the arrays it saved. The tracer runs the real engine (`autograd.backward`) and only
watches: every op's backward is called through `run_op`, which times it and measures the
gradients going in and out.
"""
import math
import os
import pdb
import shutil
import subprocess
import time
from collections import Counter

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.tree import Tree

from . import autograd
from .checks import describe
from .errors import InputError, InputIndexError, InputTypeError, MicrotensorError
from .profiler import OpStats, ProfileReport, measure_gemm_peak, measure_memory_bandwidth, profile  # noqa: F401 (the profiler's public names)
from .tensor import Tensor


def _norm(array):
    return float(np.sqrt(np.sum(np.square(array, dtype=np.float64)))) if array is not None else math.nan


def _values(array, limit, indent=4):
    """The values of a small array as text (continuation lines indented), or "" for a large one."""
    if array is None or array.size > limit:
        return ""
    text = np.array2string(np.asarray(array), precision=4, separator=", ", max_line_width=72)
    return text.replace("\n", "\n" + " " * indent)


def trace_backward(loss, grad=None, stop_at=None, show_values=False, max_value_elements=16, console=None, retain_graph=False):
    """Run `loss.backward(grad)` and print one row per op, in the order the engine visits them.

    Each row: the visit's index, the op, its inputs' shapes and output's shape, the norm of the
    gradient arriving at its output, the norms of the gradients it sends to each input, and the
    time its backward took.

    stop_at: an index (int) or an op name ("LayerNorm"): that op's backward runs under pdb, which
        stops at its first line with `ctx` (its inputs, `ctx.saved_tensors`) and `grad_out` at hand;
        `c` continues the backward pass. A negative index counts from the end, as in Python: -1 is
        the graph's last op in the engine's order (the one nearest the inputs), counted before the
        walk starts; one below -(number of ops) is refused. (A backward that returns None for an
        input leaves the ops only it reached unvisited, so fewer ops may run than the graph has.)
    show_values: print the gradients themselves for tensors of at most `max_value_elements`.
    Returns the rows as a list of dicts (the same numbers as printed).
    """
    if not isinstance(loss, Tensor):
        raise InputTypeError(f"trace_backward: expected a Tensor, got {describe(loss)}")
    if stop_at is not None and (not isinstance(stop_at, (int, str)) or isinstance(stop_at, bool)):
        raise InputTypeError(f"trace_backward: stop_at must be an op's index (int) or name (str), got {describe(stop_at)}")
    console = console or Console()
    rows = []
    given = stop_at  # as the user wrote it, for the messages
    if isinstance(stop_at, int) and stop_at < 0 and loss.requires_grad:  # without a graph, backward says so below
        # the engine visits the graph's ops in reversed topological order, so their number is known before the walk
        count = sum(tensor.grad_fn is not None for tensor in autograd.topological_order(loss))
        stop_at += count
        if stop_at < 0:
            raise InputIndexError(
                f"trace_backward: stop_at={given}, but the graph has {count} op{'s' if count != 1 else ''}"
                + (f": expected an index from {-count} to {count - 1}" if count else ", so there is nothing to stop at")
            )

    def run_op(ctx, grad_out):
        index, name = len(rows), ctx.name
        stop_here = stop_at == index if isinstance(stop_at, int) else stop_at == name and not any(r["op"] == name for r in rows)
        start = time.perf_counter()
        if stop_here:
            console.print(f"[bold]stopping in {name}.backward[/] (op {index}): `ctx.saved_tensors`, `grad_out`; `c` goes on")
            if os.environ.get("NUMBA_DISABLE_JIT") != "1":
                console.print("[yellow]the kernels are compiled: `s` will not step into them; run with NUMBA_DISABLE_JIT=1 for that[/]")
            grads = pdb.runcall(ctx.function.backward, ctx, grad_out)
        else:
            grads = ctx.function.backward(ctx, grad_out)
        seconds = time.perf_counter() - start
        listed = grads if isinstance(grads, tuple) else (grads,)
        tensors = [(x, g, needs) for x, g, needs in zip(ctx.inputs, listed, ctx.needs_input_grad) if isinstance(x, Tensor)]
        rows.append(
            {
                "index": index,
                "op": name,
                "input_shapes": [tuple(x.shape) for x, _, _ in tensors],
                "output_shape": tuple(grad_out.shape),
                "grad_out_norm": _norm(grad_out),
                "grad_input_norms": [_norm(g) if needs and g is not None else None for _, g, needs in tensors],
                "seconds": seconds,
                "grad_out": grad_out if show_values else None,
                "grad_inputs": [g if needs else None for _, g, needs in tensors] if show_values else None,
            }
        )
        return grads

    autograd.backward(loss, grad, retain_graph=retain_graph, run_op=run_op)
    console.print(_trace_table(rows))
    if show_values:
        _print_values(console, rows, max_value_elements)
    names = [row["op"] for row in rows]
    if isinstance(stop_at, str) and stop_at not in names:
        console.print(f"[yellow]trace_backward: no op named {stop_at!r} ran; the ops were {', '.join(dict.fromkeys(names))}[/]")
    elif isinstance(stop_at, int) and not 0 <= stop_at < len(rows):
        console.print(f"[yellow]trace_backward: stop_at={given}, but the backward ran ops 0 to {len(rows) - 1}[/]")
    return rows


def _trace_table(rows):
    table = Table(
        title="backward pass, in the order the engine visits the ops",
        caption="|g|: a gradient's norm; ms: the op's backward, including any time stopped in pdb and compiling a kernel the first time it runs for a dtype",
    )
    for column, justify in (("#", "right"), ("op", "left"), ("inputs -> output", "left"), ("|g out|", "right"),
                            ("|g in|, per input", "left"), ("ms", "right")):  # fmt: skip
        table.add_column(column, justify=justify)
    for row in rows:
        shapes = ", ".join(str(s) for s in row["input_shapes"]) + f" -> {row['output_shape']}"
        norms = ", ".join("-" if n is None else f"{n:.4g}" for n in row["grad_input_norms"])
        table.add_row(str(row["index"]), row["op"], shapes, f"{row['grad_out_norm']:.4g}", norms, f"{row['seconds'] * 1e3:.3f}")
    return table


def _print_values(console, rows, limit):
    """The gradients themselves, for the tensors small enough to read."""
    for row in rows:
        lines = [f"[bold]{row['index']} {row['op']}[/]"]
        lines.append(f"  grad out:\n    {_values(row['grad_out'], limit) or '(too large to print)'}")
        for i, g in enumerate(row["grad_inputs"]):
            if g is not None:
                lines.append(f"  grad of input {i}:\n    {_values(g, limit) or '(too large to print)'}")
        console.print("\n".join(lines))


# --------------------------------------------------------------------------------- the graph


def _graph_nodes(root):
    """Every tensor `root` depends on through ops that need a gradient, inputs first."""
    return autograd.topological_order(root)


def _uses(nodes):
    """How many times ops take each tensor as an input: more than once, and its gradients add up."""
    uses = Counter()
    for tensor in nodes:
        if tensor.grad_fn is not None:
            for inp in tensor.grad_fn.inputs:
                if isinstance(inp, Tensor) and inp.requires_grad:
                    uses[id(inp)] += 1
    return uses


def _label(tensor, names):
    dims = "×".join(str(n) for n in tensor.shape) or "scalar"
    name = names.get(id(tensor))
    if tensor.grad_fn is None:
        return f"{name or 'leaf'} ({dims}, {tensor.dtype})"
    return f"{tensor.grad_fn.name} → ({dims}, {tensor.dtype})" + (f" [{name}]" if name else "")


def graph_tree(root, names=None):
    """The graph behind `root` as a rich Tree: each op with the tensor it made, its inputs below
    it; leaves that require a gradient say so ('.grad' is filled there), and a tensor used several
    times says that its gradients add up. A part already shown is not repeated.

    names: an optional {name: tensor} (e.g. dict(model.named_parameters())) to label tensors."""
    if not isinstance(root, Tensor):
        raise InputTypeError(f"graph_tree: expected a Tensor, got {describe(root)}")
    names = {id(t): n for n, t in (names or {}).items()}
    uses = _uses(_graph_nodes(root)) if root.requires_grad else Counter()
    shown = set()

    def add(parent, tensor):
        label = _label(tensor, names)
        notes = []
        if tensor.grad_fn is None and tensor.requires_grad:
            notes.append("[green].grad accumulates here[/]")
        if uses[id(tensor)] > 1:
            notes.append(f"[yellow]used {uses[id(tensor)]} times: the gradients add up[/]")
        if id(tensor) in shown and tensor.grad_fn is not None:
            parent.add(f"{label} [dim](shown above)[/]")
            return
        shown.add(id(tensor))
        branch = parent.add(label + ("  " + "; ".join(notes) if notes else ""))
        if tensor.grad_fn is not None:
            for inp in tensor.grad_fn.inputs:
                if isinstance(inp, Tensor):
                    if inp.requires_grad:
                        add(branch, inp)
                    else:
                        branch.add(f"[dim]{_label(inp, names)}, no gradient needed[/]")

    tree = Tree("graph", guide_style="dim")
    add(tree, root)
    return tree


def show_graph(root, names=None, console=None):
    """Print `graph_tree(root, names)`."""
    if not isinstance(root, Tensor):  # checked here too, so that the error names the function called
        raise InputTypeError(f"show_graph: expected a Tensor, got {describe(root)}")
    (console or Console()).print(graph_tree(root, names))


def _dot_text(*lines):
    """A quoted DOT label of several lines: quotes and backslashes escaped, lines joined by DOT's \\n."""
    escaped = (line.replace("\\", "\\\\").replace('"', '\\"') for line in lines)
    return '"' + "\\n".join(escaped) + '"'


def to_dot(root, names=None):
    """The graph behind `root` in Graphviz's DOT language: ops as boxes, leaves as ellipses (green
    where `.grad` is filled), an edge from each input to the op that used it."""
    if not isinstance(root, Tensor):
        raise InputTypeError(f"to_dot: expected a Tensor, got {describe(root)}")
    names = {id(t): n for n, t in (names or {}).items()}
    nodes = _graph_nodes(root) if root.requires_grad else [root]
    ids = {id(t): f"t{i}" for i, t in enumerate(nodes)}
    lines = ["digraph microtensor {", "  rankdir=BT;", '  node [fontname="Helvetica", fontsize=10];']
    for tensor in nodes:
        dims = "×".join(str(n) for n in tensor.shape) or "scalar"
        if tensor.grad_fn is None:
            label = _dot_text(names.get(id(tensor), "leaf"), dims)
            style = 'shape=ellipse, style=filled, fillcolor="#d8f0d8"' if tensor.requires_grad else "shape=ellipse"
        else:
            label = _dot_text(tensor.grad_fn.name, dims)
            style = 'shape=box, style="rounded,filled", fillcolor="#dde6f5"'
        lines.append(f"  {ids[id(tensor)]} [label={label}, {style}];")
        if tensor.grad_fn is not None:
            for inp in tensor.grad_fn.inputs:
                if isinstance(inp, Tensor) and id(inp) in ids:
                    lines.append(f"  {ids[id(inp)]} -> {ids[id(tensor)]};")
    lines.append("}")
    return "\n".join(lines) + "\n"


class GraphvizMissing(MicrotensorError):
    """render() needs Graphviz's `dot` program, and it is not on the PATH."""


class GraphvizFailed(MicrotensorError, RuntimeError):
    """Graphviz's `dot` program ran and failed; the message includes what it said."""


def render(root, path, names=None):
    """Draw the graph to `path` (.svg or .png) with Graphviz's `dot` program; GraphvizMissing says
    so when it is not installed (to_dot still gives the text), and GraphvizFailed when dot fails,
    with what dot said. The folder of `path` must exist."""
    if not isinstance(root, Tensor):
        raise InputTypeError(f"render: expected a Tensor, got {describe(root)}")
    path = str(path)
    fmt = path.rsplit(".", 1)[-1].lower()
    if fmt not in ("svg", "png"):
        raise InputError(f"render: the file must end in .svg or .png, got {path!r}")
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise InputError(f"render: the folder {folder!r} of {path!r} is not an existing folder; create it first (os.makedirs) or pick another path")
    dot = to_dot(root, names)
    executable = shutil.which("dot")
    if executable is None:
        raise GraphvizMissing(
            "render: Graphviz's `dot` program is not installed (apt-get install graphviz, brew install graphviz, "
            "or conda install graphviz); to_dot() gives the DOT text, which https://dreampuf.github.io/GraphvizOnline draws"
        )
    done = subprocess.run([executable, f"-T{fmt}", "-o", path], input=dot.encode(), capture_output=True)
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip() or "nothing on stderr"
        raise GraphvizFailed(f"render: Graphviz's dot failed (exit status {done.returncode}) drawing {path!r}: {said}")
    return path
