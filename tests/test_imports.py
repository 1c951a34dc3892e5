"""microtensor's import graph: one circle, Tensor <-> the ops, closed in one place.

Tensor's methods (+, @, .sum(), .backward()) call the ops and the backward walk, and those make and
take Tensors: that circle is the textbook one, closed by the imports at the end of tensor.py. Every
other module imports only modules below it, so a student who adds an import to an op, a check or a
layer never meets a circular-import error. The graph is read from the source (module-level imports,
with ast), so the test needs no import order and runs nothing.
"""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "microtensor"

# The imports at the end of tensor.py that close the circle, and the only function-level import
# inside the package (the fast kernel set, loaded when first chosen, so the readable set never loads it).
CLOSING = {"microtensor.autograd", "microtensor.ops.elementwise", "microtensor.ops.matmul", "microtensor.ops.reduce", "microtensor.ops.shape"}
LAZY = {("microtensor.kernels", "microtensor.fast")}


def module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name):
    relative = Path(*name.split("."))
    return (PACKAGE.parent / relative).with_suffix(".py").exists() or (PACKAGE.parent / relative / "__init__.py").exists()


def imported_modules(node, name, path):
    """The microtensor modules an Import or ImportFrom node loads (`from . import x` loads module x)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name.startswith("microtensor")}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    if node.level:
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    if not source.startswith("microtensor"):
        return set()
    return {f"{source}.{a.name}" if is_module(f"{source}.{a.name}") else source for a in node.names}


def import_graph():
    """{module: ({modules imported at module level}, {modules imported inside functions})}."""
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name, tree = module_name(path), ast.parse(path.read_text(), str(path))
        top, local = set(), set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    if isinstance(inner, (ast.Import, ast.ImportFrom)):
                        local |= imported_modules(inner, name, path)
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                top |= imported_modules(node, name, path)
        graph[name] = (top - {name}, local - {name})
    return graph


def find_cycle(edges):
    """One cycle of the directed graph `edges` (a list of modules), or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_only_import_circle_is_tensor_and_the_ops():
    graph = import_graph()
    assert graph["microtensor.tensor"][0] >= CLOSING
    edges = {name: set(top) for name, (top, _) in graph.items()}
    edges["microtensor.tensor"] -= CLOSING
    cycle = find_cycle(edges)
    assert cycle is None, "an import circle besides Tensor <-> ops: " + " -> ".join(cycle)


def test_the_circle_is_closed_at_the_end_of_tensor_py():
    tree = ast.parse((PACKAGE / "tensor.py").read_text())
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    last_definition = max(node.lineno for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef)))
    closing = {m for node in imports if node.lineno > last_definition for m in imported_modules(node, "microtensor.tensor", PACKAGE / "tensor.py")}
    assert closing == CLOSING


def test_checks_and_errors_are_leaves():
    graph = import_graph()
    assert graph["microtensor.errors"] == (set(), set())
    assert graph["microtensor.checks"] == ({"microtensor.errors"}, set())


def test_no_function_level_import_inside_the_package():
    local = {(name, imported) for name, (_, imports) in import_graph().items() for imported in imports}
    assert local == LAZY


# The model package is written against microtensor's public API, as a user's model would be: the
# package itself, its functions and modules, its checks, and the fast set's vector math, which the
# one-token decode kernel (gpt/generation/decode_kernel.py) compiles with.
PUBLIC = {"microtensor", "microtensor.functional", "microtensor.nn", "microtensor.checks", "microtensor.fast"}
MODEL_PACKAGE = PACKAGE.parent / "gpt"


def test_the_model_package_imports_only_microtensors_public_api():
    found = {}
    for path in sorted(MODEL_PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = {node.module}
            else:
                continue
            for name in names:
                if name.startswith("microtensor") and name not in PUBLIC:
                    found.setdefault(str(path.relative_to(PACKAGE.parent)), set()).add(name)
    assert not found, f"gpt/ imports microtensor's internals: {found}; use microtensor, .functional, .nn, .checks or .fast"
