"""A guided walk through microtensor: `python -m microtensor.demo`.

Five short steps, each printed with what to look at:
1. a tiny graph, forward: two tokens of three numbers through a Linear layer, LayerNorm and a
   cross-entropy loss, and the graph that forward recorded (`microtensor.debug.show_graph`);
2. backward, watched: the tracer prints every op the engine visits, the gradients it receives and
   sends, and their values (`microtensor.debug.trace_backward`);
3. one gradient checked by hand: dL/dlogits = softmax(logits) - onehot(target), divided by the
   number of rows, against what backward put there;
4. a hook: the gradient arriving at an intermediate tensor (`register_hook`);
5. gradcheck: every op's backward against finite differences, then a small MLP learning.
Where to go next is printed at the end (the docs, the debugger walk).
"""
import numpy as np
from rich.console import Console
from rich.rule import Rule
from rich.table import Table

import microtensor as mt
import microtensor.functional as F
from microtensor import debug


def step(console, number, title, what_to_see):
    console.print(Rule(f"[bold]{number}. {title}"))
    console.print(what_to_see.replace("\n", " "), style="italic")  # one paragraph, wrapped to the terminal


def tiny_graph():
    """x (2, 3) -> Linear(3, 4) -> LayerNorm(4) -> cross-entropy against targets (2,)."""
    mt.manual_seed(0)
    x = mt.randn(2, 3, dtype=mt.float64, requires_grad=True)
    linear = mt.nn.Linear(3, 4, dtype=mt.float64)
    norm = mt.nn.LayerNorm(4, dtype=mt.float64)
    targets = mt.tensor([2, 0])
    logits = norm(linear(x))  # (2, 4)
    loss = F.cross_entropy(logits, targets)
    names = {"x": x, "linear.weight": linear.weight, "linear.bias": linear.bias, "norm.weight": norm.weight, "norm.bias": norm.bias}
    return x, logits, targets, loss, names


def main(console=None):
    console = console or Console()
    np.set_printoptions(precision=4, suppress=True)

    step(console, 1, "forward: a tiny graph", (
        "Two tokens of three numbers go through a Linear layer (y = x @ W + b), LayerNorm and a\n"
        "cross-entropy loss. Every op records a node: the tensor it made points to it (.grad_fn),\n"
        "and the node to its inputs. The tree below is that record, read from the loss down."
    ))  # fmt: skip
    x, logits, targets, loss, names = tiny_graph()
    console.print(f"logits (2, 4):\n{logits.numpy()}\nloss = {loss.item():.6f}   loss.grad_fn = {loss.grad_fn!r}")
    debug.show_graph(loss, names=names, console=console)

    step(console, 2, "backward, watched", (
        "loss.backward() walks that graph from the loss to the leaves: each op's backward turns the\n"
        "gradient of its output into gradients of its inputs. The tracer runs the same walk and\n"
        "prints it; a leaf's .grad is the sum of what reached it."
    ))  # fmt: skip
    logits.retain_grad()
    debug.trace_backward(loss, show_values=True, console=console)

    step(console, 3, "one gradient, by hand", (
        "Cross-entropy with a mean over rows has dL/dlogits = (softmax(logits) - onehot(targets)) / rows.\n"
        "Computed here with numpy, it must equal what backward left in logits.grad."
    ))  # fmt: skip
    z = logits.numpy()
    probs = np.exp(z - z.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    by_hand = (probs - np.eye(4)[targets.numpy()]) / 2
    console.print(f"by hand:\n{by_hand}\nbackward:\n{logits.grad}")
    console.print(f"largest difference: {np.abs(by_hand - logits.grad).max():.2e}")

    step(console, 4, "a hook: see a gradient as it arrives", (
        "register_hook(fn) calls fn with a tensor's gradient once it is complete; returning a new\n"
        "gradient would replace it. Here it only prints the gradient reaching the Linear layer's output."
    ))  # fmt: skip
    x, logits, targets, loss, names = tiny_graph()
    hidden = logits.grad_fn.inputs[0]  # LayerNorm's input: the Linear layer's output (2, 4)
    hidden.register_hook(lambda grad: console.print(f"dL/d(linear output), arriving:\n{grad.numpy()}"))
    loss.backward()

    step(console, 5, "gradcheck, then learning", (
        "mt.gradcheck compares an op's backward with finite differences, both contracted with a\n"
        "random upstream gradient. Then a 2-32-4 MLP learns which quadrant a point is in."
    ))  # fmt: skip
    x = mt.randn(3, 5, dtype=mt.float64, requires_grad=True)
    ok = mt.gradcheck(lambda x: F.layer_norm(F.softmax(x, dim=-1), eps=1e-5), [x])
    console.print(f"gradcheck of layer_norm(softmax(x)) against finite differences: {'passed' if ok else 'FAILED'}")
    train_quadrants(console)

    console.print(Rule("[bold]next"))
    for line in (
        "docs/README.md: the architecture, how autodiff works here, and each op's derivation linked to its code.",
        "docs/debugging.md: stop inside LayerNorm's backward kernel in pdb (with NUMBA_DISABLE_JIT=1).",
        'debug.trace_backward(loss, stop_at="LayerNorm") stops in pdb inside that op\'s backward.',
        'debug.to_dot(loss) gives the graph in Graphviz\'s language; debug.render(loss, "graph.svg") draws it.',
    ):
        console.print("- " + line)


def train_quadrants(console):
    """A 2-32-4 MLP fits a toy problem: the quadrant of a point in the plane."""
    mt.manual_seed(0)
    points = mt.randn(256, 2)
    labels = mt.tensor((points.numpy()[:, 0] > 0).astype(np.int64) * 2 + (points.numpy()[:, 1] > 0))
    w1, w2 = mt.nn.Linear(2, 32), mt.nn.Linear(32, 4)
    optimizer = mt.optim.AdamW(list(w1.parameters()) + list(w2.parameters()), lr=0.05, weight_decay=0.0)
    table = Table(title="a 2-32-4 MLP learns the quadrants")
    table.add_column("step", justify="right")
    table.add_column("loss", justify="right")
    table.add_column("accuracy", justify="right")
    for iteration in range(201):
        logits = w2(F.gelu(w1(points)))  # (256, 4)
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if iteration % 50 == 0:
            accuracy = (logits.numpy().argmax(axis=1) == labels.numpy()).mean()
            table.add_row(str(iteration), f"{loss.item():.4f}", f"{accuracy:.1%}")
    console.print(table)


if __name__ == "__main__":
    main()
