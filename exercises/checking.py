"""What the exercises' checks are written with: the student's module, loaded from their file or from
the reference solution, and comparisons whose failures say what to look at in a student's words.

A check is a plain function `test_...(impl)` in an exercise's test file: `impl` is the module under
test, and the first line of the docstring is what the verdict calls the check. A failed check raises
`CheckFailed` (or gradcheck's `GradcheckError`, whose report already says which input and element
went wrong); anything else it raises is a bug in the student's file, shown as a short traceback.
"""
import importlib.util
import sys

import numpy as np

import microtensor as mt


class CheckFailed(AssertionError):
    """A check's verdict on the student's code: the message says what was expected and what came."""


class CheckSkipped(Exception):
    """A check that cannot run in this mode (one that reads compiled code, run as plain Python)."""


def load(path, module_name):
    """Import the Python file at `path` as a fresh module (a second load reads the file again)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look a module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def load_exercise(exercise, source="student"):
    """The module under test: the student's file ("student") or the reference ("solution")."""
    path = exercise.student_path() if source == "student" else exercise.solution_path()
    return load(path, f"exercise_{exercise.key}_{source}")


def random_tensor(shape, seed, low=-2.0, high=2.0, dtype=np.float64, requires_grad=True):
    """A tensor of uniform values in [low, high], the same for the same seed."""
    values = np.random.default_rng(seed).uniform(low, high, size=shape).astype(dtype)
    return mt.tensor(values, requires_grad=requires_grad)


def as_array(value):
    return value.numpy() if isinstance(value, mt.Tensor) else np.asarray(value)


def _where(index):
    return "[" + ", ".join(str(int(i)) for i in index) + "]"


def _number(value):
    """A numpy scalar as a student reads it: 0.0625, not np.float64(0.0625)."""
    return repr(value.item()) if isinstance(value, np.generic) else repr(value)


def expect_close(what, actual, expected, reference, atol=1e-10, rtol=1e-7):
    """Fail unless `actual` equals `expected` (computed by `reference`, named in the message) to
    within atol + rtol * |expected|, with the same shape."""
    actual, expected = as_array(actual), as_array(expected)
    if actual.shape != expected.shape:
        raise CheckFailed(f"{what}: yours has shape {actual.shape}, expected {expected.shape} (as {reference} gives)")
    if actual.dtype != expected.dtype:
        raise CheckFailed(f"{what}: yours is {actual.dtype}, expected {expected.dtype} (keep the input's dtype)")
    error = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    allowed = atol + rtol * np.abs(expected.astype(np.float64))
    bad = ~(error <= allowed)  # NaN counts as bad
    if bad.any():
        if bad.ndim == 0:  # one number: no index to name
            raise CheckFailed(f"{what}: yours {_number(actual[()])}, expected {_number(expected[()])} (from {reference})")
        worst = np.unravel_index(np.argmax(np.where(bad, np.nan_to_num(error, nan=np.inf), -1.0)), bad.shape)
        raise CheckFailed(
            f"{what}: {int(bad.sum())} of {bad.size} values differ from {reference}; "
            f"the worst at {_where(worst)}: yours {_number(actual[worst])}, expected {_number(expected[worst])}"
        )


def expect_equal(what, actual, expected, reference):
    """Fail unless `actual` equals `expected` exactly (integers, token ids, booleans)."""
    actual, expected = as_array(actual), as_array(expected)
    if actual.shape != expected.shape:
        raise CheckFailed(f"{what}: yours has shape {actual.shape}, expected {expected.shape} (as {reference} gives)")
    different = actual != expected
    if np.any(different) and different.ndim == 0:  # one number: no index to name
        raise CheckFailed(f"{what}: yours {_number(actual[()])}, expected {_number(expected[()])} (from {reference})")
    if np.any(different):
        first = np.argwhere(different)[0]
        raise CheckFailed(
            f"{what}: {int(np.sum(different))} of {different.size} values differ from {reference}; "
            f"the first at {_where(first)}: yours {_number(actual[tuple(first)])}, expected {_number(expected[tuple(first)])}"
        )


def expect(condition, message):
    """Fail with `message` unless `condition` holds."""
    if not condition:
        raise CheckFailed(message)


def expect_raises(what, error_types, function, *args, **kwargs):
    """Fail unless `function(*args, **kwargs)` raises one of `error_types`; return the error."""
    try:
        function(*args, **kwargs)
    except error_types as error:
        return error
    error_types = error_types if isinstance(error_types, tuple) else (error_types,)
    names = " or ".join(t.__name__ for t in error_types)
    raise CheckFailed(f"{what}: expected {names}, but it returned normally")


def gradcheck(function, inputs, **options):
    """mt.gradcheck with a random upstream gradient: raises its report when a gradient is wrong."""
    __tracebackhide__ = True
    mt.gradcheck(function, inputs, **options)


def float64_arithmetic(kernel, *arguments):
    """Where a compiled kernel computes in float64 when called with `arguments` (float32 arrays,
    say): Numba types a bare Python `1.0` as float64, and float32 math mixed with it becomes float64.
    A list of the lines of the student's file, as "line 23 of tanh.py (`the line`)", empty when all
    is float32; Numba's internal names ($binop_mul12.3) never reach a student. Under
    NUMBA_DISABLE_JIT=1 there are no compiled types to read: the check is skipped."""
    import linecache
    from pathlib import Path

    import numba

    if numba.config.DISABLE_JIT:
        raise CheckSkipped("it reads the types Numba compiles, and the kernels run as plain Python here")
    function = getattr(kernel, "py_func", kernel)
    signature = tuple(numba.typeof(argument) for argument in arguments)
    fresh = numba.njit(function)  # a compilation of our own, which keeps the inferred types
    fresh.compile(signature)
    annotation = fresh.overloads[signature].type_annotation
    types = annotation.typemap
    promoted = {name for name, t in types.items() if t == numba.float64 and (not name.startswith("$") or name.startswith("$binop"))}
    if not promoted:
        return []
    lines = {}  # (file, line) -> the variables computed there, from the typed IR's locations
    for block in annotation.blocks.values():
        for instruction in block.body:
            target = getattr(instruction, "target", None)
            if isinstance(instruction, numba.core.ir.Assign) and target.name in promoted and instruction.loc.line:
                lines.setdefault((instruction.loc.filename, instruction.loc.line), set()).add(target.name)
    placed = set().union(*lines.values()) if lines else set()
    where = []
    for (filename, number) in sorted(lines):
        text = linecache.getline(filename, number).strip()
        where.append(f"line {number} of {Path(filename).name}" + (f" (`{text}`)" if text else ""))
    unplaced = promoted - placed  # no location known: your variables by name, Numba's own counted
    where += sorted(name.split(".")[0] for name in unplaced if not name.startswith("$"))
    if any(name.startswith("$") for name in unplaced):
        where.append("some intermediate results")
    return where
