"""The public graph API (grad_fn, is_leaf, register_hook, the engine's run_op) and microtensor.debug:
the tracer, the graph tree, the DOT export and its rendering."""
import io
import re
import shutil
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

import microtensor as mt
import microtensor.debug as debug
import microtensor.functional as F
from microtensor import autograd
from microtensor.errors import GraphError, InputError, InputTypeError

ROOT = Path(__file__).resolve().parents[1]


def small_graph():
    """x (2, 3) -> LayerNorm -> @ w (3, 4) -> cross-entropy: three ops, four leaves that need a gradient."""
    mt.manual_seed(0)
    x = mt.randn(2, 3, dtype=mt.float64, requires_grad=True)
    norm = mt.nn.LayerNorm(3, dtype=mt.float64)
    w = mt.randn(3, 4, dtype=mt.float64, requires_grad=True)
    loss = F.cross_entropy(norm(x) @ w, mt.tensor([1, 3]))
    return loss, {"x": x, "w": w, "norm.weight": norm.weight, "norm.bias": norm.bias}


def recording_console():
    return Console(file=io.StringIO(), width=120, color_system=None)


# --------------------------------------------------------------------------------- grad_fn, is_leaf


def test_grad_fn_names_the_op_its_inputs_and_what_it_saved():
    x = mt.randn(2, 3, dtype=mt.float64, requires_grad=True)
    w = mt.randn(3, 4, dtype=mt.float64, requires_grad=True)
    y = x @ w
    assert x.is_leaf and x.grad_fn is None
    assert not y.is_leaf and y.grad_fn.name == "MatMul"
    assert y.grad_fn.inputs[0] is x and y.grad_fn.inputs[1] is w
    saved = y.grad_fn.saved_tensors
    assert len(saved) == 2 and saved[0] is x.data and saved[1] is w.data  # matmul keeps both operands
    z = y.relu().sum()
    assert z.grad_fn.name == "Sum" and z.grad_fn.inputs[0].grad_fn.name == "Relu"
    assert z.grad_fn.inputs[0].grad_fn.inputs[0] is y  # follow the graph back to the matmul
    assert "MatMul(Tensor(2, 3), Tensor(3, 4)), 2 arrays saved" in repr(y.grad_fn)


def test_a_tensor_that_needs_no_gradient_is_a_leaf_without_grad_fn():
    a, b = mt.randn(2), mt.randn(2)
    c = a + b
    assert c.is_leaf and c.grad_fn is None
    with mt.no_grad():
        d = mt.randn(2, requires_grad=True) * 2
    assert d.is_leaf and d.grad_fn is None


# --------------------------------------------------------------------------------- register_hook


def test_a_hook_sees_the_complete_gradient_once():
    x = mt.tensor([1.0, 2.0, 3.0], dtype=mt.float64, requires_grad=True)
    y = x * 2
    seen = []
    y.register_hook(lambda grad: seen.append(grad.data.copy()))
    (y * y + y * 3).sum().backward()  # y is used by three ops: dL/dy = 2y + 3
    assert len(seen) == 1
    np.testing.assert_array_equal(seen[0], 2 * y.data + 3)
    np.testing.assert_array_equal(x.grad, 2 * (2 * y.data + 3))


def test_a_hook_may_replace_the_gradient_and_it_flows_on():
    x = mt.tensor([1.0, -2.0], dtype=mt.float64, requires_grad=True)
    y = x * x
    y.register_hook(lambda grad: grad * 10)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad, 10 * 2 * x.data)


def test_a_hook_on_a_leaf_changes_what_lands_in_grad():
    x = mt.tensor([1.0, -2.0], dtype=mt.float64, requires_grad=True)
    x.register_hook(lambda grad: np.clip(grad.data, -1.0, 1.0))
    (x * 3).sum().backward()
    np.testing.assert_array_equal(x.grad, [1.0, 1.0])


def test_hooks_run_in_order_and_can_be_removed():
    x = mt.tensor([1.0, 2.0], dtype=mt.float64, requires_grad=True)
    calls = []
    first = x.register_hook(lambda grad: calls.append("first") or grad * 2)
    x.register_hook(lambda grad: calls.append(("second", grad.data.tolist())))
    x.sum().backward()
    assert calls == ["first", ("second", [2.0, 2.0])]
    first.remove()
    first.remove()  # a second remove does nothing
    calls.clear()
    x.grad = None
    x.sum().backward()
    assert calls == [("second", [1.0, 1.0])]
    np.testing.assert_array_equal(x.grad, [1.0, 1.0])


def test_a_hook_cannot_write_into_the_shared_gradient():
    x = mt.tensor([1.0, 2.0], dtype=mt.float64, requires_grad=True)
    y = x * 1.0

    def scale_in_place(grad):
        grad.data[...] *= 2

    y.register_hook(scale_in_place)
    with pytest.raises(ValueError, match="read-only"):
        y.sum().backward()


def test_bad_hooks_are_clear_errors():
    x = mt.tensor([1.0, 2.0], dtype=mt.float64, requires_grad=True)
    with pytest.raises(InputTypeError, match="register_hook: expected a function"):
        x.register_hook("not a function")
    with pytest.raises(GraphError, match="does not require a gradient"):
        mt.tensor([1.0]).register_hook(lambda grad: None)

    def wrong_shape(grad):
        return np.zeros(3)

    (x * 2).register_hook(wrong_shape)
    y = x * 2
    y.register_hook(wrong_shape)
    with pytest.raises(GraphError, match=r"hook wrong_shape returned a gradient of shape \(3,\) and dtype float64 for a tensor of shape \(2,\)"):
        y.sum().backward()
    z = x * 2
    z.register_hook(lambda grad: "oops")
    with pytest.raises(GraphError, match="returned str; expected None, a Tensor or a numpy array"):
        z.sum().backward()


# --------------------------------------------------------------------------------- run_op


def test_run_op_sees_every_op_once_and_changes_nothing():
    loss, leaves = small_graph()
    loss.backward(retain_graph=True)
    expected = {name: t.grad.copy() for name, t in leaves.items()}
    for t in leaves.values():
        t.grad = None
    visited = []

    def run_op(ctx, grad_out):
        visited.append(ctx.name)
        return ctx.function.backward(ctx, grad_out)

    autograd.backward(loss, run_op=run_op)
    assert visited == ["CrossEntropy", "MatMul", "LayerNorm"]
    for name, t in leaves.items():
        np.testing.assert_array_equal(t.grad, expected[name], err_msg=name)
    with pytest.raises(InputTypeError, match="run_op must be a function"):
        autograd.backward(small_graph()[0], run_op=3)


# --------------------------------------------------------------------------------- the tracer


def test_trace_rows_follow_the_engine_and_measure_the_real_gradients():
    loss, leaves = small_graph()
    console = recording_console()
    rows = debug.trace_backward(loss, console=console)
    assert [r["op"] for r in rows] == ["CrossEntropy", "MatMul", "LayerNorm"]
    assert [r["index"] for r in rows] == [0, 1, 2]
    assert rows[0]["grad_out_norm"] == 1.0  # d loss / d loss
    assert rows[1]["input_shapes"] == [(2, 3), (3, 4)] and rows[1]["output_shape"] == (2, 4)
    # MatMul's second input is w, LayerNorm's are x, its weight and bias: each used once, so the
    # norm of what the op sent is the norm of the leaf's final gradient
    assert rows[1]["grad_input_norms"][1] == pytest.approx(np.linalg.norm(leaves["w"].grad), rel=1e-12)
    for i, name in enumerate(["x", "norm.weight", "norm.bias"]):
        assert rows[2]["grad_input_norms"][i] == pytest.approx(np.linalg.norm(leaves[name].grad), rel=1e-12)
    # what one op sends on is what the next one receives
    assert rows[1]["grad_out_norm"] == pytest.approx(rows[0]["grad_input_norms"][0], rel=1e-12)
    assert rows[2]["grad_out_norm"] == pytest.approx(rows[1]["grad_input_norms"][0], rel=1e-12)
    assert all(r["seconds"] >= 0 for r in rows)
    text = console.file.getvalue()
    for line in ("CrossEntropy", "MatMul", "LayerNorm", "(2, 3), (3, 4) -> (2, 4)"):
        assert line in text


def test_trace_shows_the_values_of_small_tensors():
    loss, leaves = small_graph()
    console = recording_console()
    rows = debug.trace_backward(loss, show_values=True, console=console)
    text = console.file.getvalue()
    assert "grad of input 1:" in text
    w_grad = np.array2string(leaves["w"].grad, precision=4, separator=", ", max_line_width=72).splitlines()[0]
    assert w_grad in text
    np.testing.assert_array_equal(rows[1]["grad_inputs"][1], leaves["w"].grad)
    loss, _ = small_graph()
    console = recording_console()
    debug.trace_backward(loss, show_values=True, max_value_elements=4, console=console)
    assert "(too large to print)" in console.file.getvalue()


def test_trace_says_when_the_op_to_stop_at_never_ran():
    for stop_at, said in (("Softmax", "no op named 'Softmax' ran; the ops were CrossEntropy, MatMul, LayerNorm"),
                          (7, "stop_at=7, but the backward ran ops 0 to 2")):  # fmt: skip
        loss, _ = small_graph()
        console = recording_console()
        debug.trace_backward(loss, stop_at=stop_at, console=console)
        assert said in " ".join(console.file.getvalue().split())
    with pytest.raises(InputTypeError, match="stop_at must be"):
        debug.trace_backward(small_graph()[0], stop_at=1.5)
    with pytest.raises(InputTypeError, match="expected a Tensor"):
        debug.trace_backward(np.ones(3))


def test_a_negative_stop_at_before_the_first_op_is_refused_before_the_backward():
    loss, leaves = small_graph()
    with pytest.raises(mt.InputIndexError, match=r"trace_backward: stop_at=-4, but the graph has 3 ops: expected an index from -3 to 2"):
        debug.trace_backward(loss, stop_at=-4, console=recording_console())
    assert leaves["x"].grad is None  # refused up front: no backward ran


STOP_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from test_debug import small_graph
    import microtensor.debug as debug
    loss, leaves = small_graph()
    debug.trace_backward(loss, stop_at={stop_at!r})
    print("x.grad after the run:", leaves["x"].grad.round(6).tolist())
    """
)


@pytest.mark.parametrize("stop_at", ["LayerNorm", 2, -1])  # -1: the last of the three ops, LayerNorm
def test_stop_at_drops_into_pdb_inside_the_ops_backward(stop_at):
    script = STOP_SCRIPT.format(tests=str(ROOT / "tests"), stop_at=stop_at)
    commands = "p ctx.name\np [a.shape for a in ctx.saved_tensors]\np grad_out.shape\nc\n"
    done = subprocess.run([sys.executable, "-c", script], input=commands, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "stopping in LayerNorm.backward (op 2)" in out
    assert "'LayerNorm'" in out  # p ctx.name, answered inside the op's backward
    assert "[(2, 3), (3,), (2,), (2,)]" in out  # the rows, the weight, each row's mean and 1/std
    assert "x.grad after the run:" in out  # `c` finished the backward pass


# --------------------------------------------------------------------------------- graph views


def test_graph_tree_shows_ops_leaves_and_accumulation():
    x = mt.randn(2, 3, dtype=mt.float64, requires_grad=True)
    constant = mt.randn(2, 3, dtype=mt.float64)
    y = x * x + constant  # x feeds one op twice; the constant needs no gradient
    console = recording_console()
    debug.show_graph(y.sum(), names={"x": x}, console=console)
    text = console.file.getvalue()
    assert "Sum → (scalar, float64)" in text
    assert "Add → (2×3, float64)" in text and "Mul → (2×3, float64)" in text
    assert "x (2×3, float64)  .grad accumulates here; used 2 times: the gradients add up" in text  # Mul takes x twice
    assert "no gradient needed" in text
    z = (x * 2) + (x * 3)  # now two ops use x
    console = recording_console()
    debug.show_graph(z, names={"x": x}, console=console)
    assert "used 2 times: the gradients add up" in console.file.getvalue()
    assert "(shown above)" not in console.file.getvalue()


def test_graph_tree_shows_a_shared_part_once():
    x = mt.randn(3, dtype=mt.float64, requires_grad=True)
    shared = x.exp()
    console = recording_console()
    debug.show_graph(shared * 2 + shared * 3, console=console)
    text = console.file.getvalue()
    assert text.count("Exp →") == 2 and "(shown above)" in text


def test_graph_views_refuse_a_non_tensor(tmp_path):
    for view, call in (("show_graph", lambda: debug.show_graph(3)), ("graph_tree", lambda: debug.graph_tree(3)),
                       ("render", lambda: debug.render(3, tmp_path / "graph.svg"))):  # fmt: skip
        with pytest.raises(InputTypeError, match=f"{view}: expected a Tensor, got int"):
            call()


def parse_dot(text):
    nodes = dict(re.findall(r'^\s*(t\d+) \[label="([^"]*)"', text, flags=re.M))
    edges = re.findall(r"^\s*(t\d+) -> (t\d+);", text, flags=re.M)
    return nodes, edges


def test_to_dot_lists_every_node_and_edge():
    loss, leaves = small_graph()
    text = debug.to_dot(loss, names={"x": leaves["x"]})
    assert text.startswith("digraph microtensor {") and text.rstrip().endswith("}")
    nodes, edges = parse_dot(text)
    labels = sorted(nodes.values())
    assert labels == sorted(["CrossEntropy\\nscalar", "MatMul\\n2×4", "LayerNorm\\n2×3", "x\\n2×3", "leaf\\n3×4", "leaf\\n3", "leaf\\n3"])
    by_label = {v: k for k, v in nodes.items()}
    assert (by_label["MatMul\\n2×4"], by_label["CrossEntropy\\nscalar"]) in edges
    assert (by_label["x\\n2×3"], by_label["LayerNorm\\n2×3"]) in edges
    assert len(edges) == 6  # LayerNorm has 3 inputs, MatMul 2, CrossEntropy 1 that needs a gradient


def test_to_dot_escapes_names():
    x = mt.randn(2, dtype=mt.float64, requires_grad=True)
    text = debug.to_dot(x.sum(), names={'the "input" \\ x': x})
    assert 'label="the \\"input\\" \\\\ x\\n2"' in text


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_render_draws_an_svg(tmp_path):
    loss, leaves = small_graph()
    path = debug.render(loss, tmp_path / "graph.svg", names={"x": leaves["x"]})
    svg = ElementTree.parse(path).getroot()
    texts = [t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert "LayerNorm" in texts and "CrossEntropy" in texts and "x" in texts


def test_render_without_graphviz_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(debug.GraphvizMissing, match="apt-get install graphviz"):
        debug.render(small_graph()[0], tmp_path / "graph.svg")
    with pytest.raises(InputError, match="must end in .svg or .png"):
        debug.render(small_graph()[0], tmp_path / "graph.pdf")


def test_render_checks_the_folder_before_looking_for_graphviz(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)  # the check must not need dot
    path = tmp_path / "missing" / "graph.svg"
    with pytest.raises(InputError, match=f"render: the folder '{re.escape(str(path.parent))}' of .* is not an existing folder"):
        debug.render(small_graph()[0], path)


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_render_says_what_dot_said_when_it_fails(tmp_path):
    path = tmp_path / "taken.svg"
    path.mkdir()  # a folder where the file should go: dot cannot write it
    said = subprocess.run(["dot", "-Tsvg", "-o", str(path)], input=b"digraph {}", capture_output=True).stderr.decode().strip()
    assert said  # what dot says about it, in this Graphviz's words
    with pytest.raises(debug.GraphvizFailed, match=r"render: Graphviz's dot failed \(exit status \d+\) drawing .*taken\.svg'") as info:
        debug.render(small_graph()[0], path)
    assert said in str(info.value)


def test_the_pictured_graph_in_the_docs_is_current(tmp_path):
    """docs/images/tiny_graph.dot (and the SVG drawn from it) is what examples/draw_graph.py writes today."""
    done = subprocess.run([sys.executable, "examples/draw_graph.py", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "tiny_graph.dot").read_text() == (ROOT / "docs" / "images" / "tiny_graph.dot").read_text(), (
        "the graph changed: run `python examples/draw_graph.py` to draw docs/images/tiny_graph.* again"
    )
    svg = ElementTree.parse(ROOT / "docs" / "images" / "tiny_graph.svg").getroot()
    texts = {t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")}
    assert {"CrossEntropy", "LayerNorm", "Add", "MatMul", "x", "linear.weight"} <= texts


def test_the_guided_demo_walks_all_five_steps():
    from microtensor import demo

    console = recording_console()
    demo.main(console)
    text = console.file.getvalue()
    for title in ("1. forward: a tiny graph", "2. backward, watched", "3. one gradient, by hand",
                  "4. a hook: see a gradient as it arrives", "5. gradcheck, then learning"):  # fmt: skip
        assert title in text
    assert "backward pass, in the order the engine visits the ops" in text
    difference = float(re.search(r"largest difference: (\S+)", text).group(1))
    assert difference < 1e-12
    assert "dL/d(linear output), arriving:" in text
    assert "against finite differences: passed" in text
    assert re.search(r"│\s+200 │ \S+ │\s+100\.0% │", text)  # the MLP learned the quadrants


def test_a_hook_on_a_scalar_sees_the_summed_gradient():
    x = mt.tensor(2.0, dtype=mt.float64, requires_grad=True)
    arrived = []
    x.register_hook(lambda grad: arrived.append((grad.shape, grad.item())))
    (x * x + 3 * x).backward()  # two 0-d gradients add up to a numpy scalar in the engine
    assert arrived == [((), 7.0)]


def test_stepping_from_an_ops_backward_reaches_its_kernel_in_one_step():
    """docs/debugging.md: pdb's `s` on `active(kernel)(...)` in an op's backward lands in the kernel.
    `active` must therefore be no Python function of ours: choosing the kernel runs no Python frame."""
    import numba

    from microtensor.kernels import active
    from microtensor.ops.layer_norm import layer_norm_backward_input
    from microtensor.ops.softmax import softmax_forward

    for kernels in ("readable",) + (() if numba.config.DISABLE_JIT else ("fast",)):
        with mt.using_kernels(kernels):
            frames = []
            sys.settrace(lambda frame, event, arg: frames.append(frame.f_code.co_name))
            try:
                chosen = active(layer_norm_backward_input), active(softmax_forward)
            finally:
                sys.settrace(None)
            assert frames == [], f"{kernels}: choosing a kernel ran {frames}"
            assert (chosen[0] is layer_norm_backward_input) == (kernels == "readable")
