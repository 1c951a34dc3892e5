"""Finite-difference gradient checking, and the registry of a gradient check for every op.

`gradcheck(fn, inputs)` compares the gradients that backward computes with central differences.
To test a whole Jacobian with one backward pass, the output is contracted with a random upstream
gradient v: the scalar L(x) = sum(fn(x) * v) has dL/dx_i = sum_j v_j dfn_j/dx_i, which backward
computes with grad_out = v, and which finite differences estimate as

    (L(x + eps e_i) - L(x - eps e_i)) / (2 eps)        (error O(eps^2)).

A random v matters: with v = ones (i.e. `fn(x).sum()`), a softmax's rows always sum to 1, so a
backward returning zeros would pass. Checks run in float64, where eps = 1e-6 leaves ~1e-10 of
rounding noise in the difference quotient.

A failed check is described by a GradcheckReport (the message of the GradcheckError that
`gradcheck` raises, or what `gradcheck_report` returns): fn and the ops of its graph, which input,
its worst element, backward's and the finite differences' values there, the error against the
tolerance, and a hint for the next step. The checker's own frames set `__tracebackhide__`, so that
under pytest a failure shows the test's line and the report, not this file's source.

Forward mode is checked two ways (`jvpcheck`, `dot_product_check`). Against finite differences:
the JVP along random tangents v of the inputs, J v, against (f(x + eps v) - f(x - eps v)) / (2 eps),
the whole output at once. Against backward, by the transpose identity <u, J v> = <Jᵀ u, v> for a
random u shaped like the output and a random v shaped like each input (the dot-product test): the
JVP rule and the backward are two independent derivations of the same Jacobian, so agreeing on a
random pair checks each against the other, with no step size and to ~1e-12 in float64.

Every op registers a case with `@gradcheck_case(TheFunction)`: a function that, given a `draw`
(random shapes and tensors; the test suite passes one driven by hypothesis), returns the function
to check and its inputs, and optionally a dict of gradcheck options where a case has a reason to
change them (written beside the case). `tests/test_gradcheck_cases.py` runs every case and fails if any Function
in the package has none; `tests/test_forward_mode.py` runs the two forward-mode checks on every case
and fails if any Function has no `jvp`.
"""
import inspect
import math
import os

import numpy as np

from .autograd import Function, is_grad_enabled, jvp, no_grad, topological_order
from .checks import check_flag, check_int, check_real, describe, float64
from .errors import InputError, InputTypeError, MicrotensorError
from .tensor import Tensor


class GradcheckReport:
    """What a failed gradcheck found, and what to try next. `print(report)` shows it in a few lines;
    every fact in those lines is also an attribute, to inspect or to test:

        function       fn's name ("layer_norm", "Softmax.apply", "<lambda>"), or None when it has none
        ops            the names of the ops in fn's graph, in the order forward ran them: ("Softmax", "MatMul")
        op_source      "file:line" of the backward when fn is one op (else None)
        output_shape   the shape of fn's output, and so of the random upstream gradient
        input_index    which of `inputs` failed (the first one that did, in order)
        input_name     its parameter name in fn ("w" for `lambda x, w: ...`), or None
        shape, dtype   that input's
        element_index  the index, in that input, of the element furthest past the tolerance (a tuple)
        analytic       backward's value there (a float), or None when no gradient reached the input
        numeric        the finite differences' value there (a float)
        error          |analytic - numeric| (analytic counted as 0 when None); relative_error is error / |numeric|
        allowed        atol + rtol * |numeric|: the error the element may have
        failed, checked, size   elements out of tolerance, elements compared, elements in the input
        eps, atol, rtol, seed   the options the check ran with

    Why a report and not only a message: a student (or a test) can ask `report.element_index`
    instead of parsing text, and `gradcheck_report` hands it over without raising.
    """

    def __init__(self, *, function, ops, op_source, output_shape, input_index, input_name, shape, dtype,
                 element_index, analytic, numeric, failed, checked, size, eps, atol, rtol, seed):  # fmt: skip
        self.function, self.ops, self.op_source, self.output_shape = function, tuple(ops), op_source, tuple(output_shape)
        self.input_index, self.input_name, self.shape, self.dtype = input_index, input_name, tuple(shape), dtype
        self.element_index, self.analytic, self.numeric = tuple(element_index), analytic, numeric
        self.failed, self.checked, self.size = failed, checked, size
        self.eps, self.atol, self.rtol, self.seed = eps, atol, rtol, seed

    @property
    def error(self):
        return abs((0.0 if self.analytic is None else self.analytic) - self.numeric)

    @property
    def allowed(self):
        return self.atol + self.rtol * abs(self.numeric)

    @property
    def relative_error(self):
        return self.error / abs(self.numeric) if self.numeric != 0 else math.inf

    def __repr__(self):
        return (
            f"<GradcheckReport input {self.input_index} at {self.element_index}: "
            f"analytic {self.analytic!r}, numeric {self.numeric!r}>"
        )

    def __str__(self):
        element = f"{self.input_name or f'inputs[{self.input_index}]'}[{', '.join(str(i) for i in self.element_index)}]"
        sampled = " sampled" if self.checked < self.size else ""
        analytic = "None (no gradient reached the input)" if self.analytic is None else f"{self.analytic:.8g}"
        lines = [
            f"gradcheck failed for {self._subject()}",
            (
                f"  input {self.input_index}{f' ({self.input_name})' if self.input_name else ''}: shape {self.shape}, "
                f"{self.dtype}; {self.failed} of {self.checked}{sampled} elements out of tolerance, the worst {element}:"
            ),
            f"  analytic (backward) {analytic}  vs  numeric (finite differences) {self.numeric:.8g}",
            (
                f"  error {self.error:.3g} (relative {self.relative_error:.3g}) > allowed {self.allowed:.3g} "
                f"= atol {self.atol:g} + rtol {self.rtol:g} * |numeric|"
            ),
        ]
        for side, value in (("backward", self.analytic), ("the finite differences", self.numeric)):
            if value is not None and math.isnan(value):
                lines.append(f"  {side} gave NaN (not a number), which agrees with nothing")
            elif value is not None and math.isinf(value):
                lines.append(f"  {side} gave {value:g}, which agrees with nothing")
        if self.output_shape == ():  # one output: the upstream gradient is one number
            lines.append(f"  Both are d (upstream * f) / d {element}, upstream a random number (seed {self.seed}): f's output is a scalar.")
        else:
            lines += [
                f"  Both are d sum(upstream * f) / d {element}, upstream a random array shaped like f's output",
                f"  {self.output_shape} (seed {self.seed}): every output's derivative, weighted, not the derivative of one output.",
            ]
        hint = self._hint()
        lines.append(f"  Hint: {hint[0]}")
        lines += [f"  {line}" for line in hint[1:]]
        return "\n".join(lines)

    def _subject(self):
        if not self.ops:
            graph = "no op in its graph"
        elif len(self.ops) <= 6:
            graph = f"ops: {' -> '.join(self.ops)}"
        else:
            graph = f"{len(self.ops)} ops: {' -> '.join(self.ops[:3])} -> ... -> {' -> '.join(self.ops[-2:])}"
        name = {"<lambda>": "a lambda", None: "fn"}.get(self.function, self.function)
        return f"{name} ({graph})"

    def _hint(self):
        """The next step, as lines: what a student can do about this failure."""
        if self.analytic is None:
            return [
                f"no op's backward sent a gradient to input {self.input_index}: a backward returned None for it,",
                "or f used it through .data, numpy or .detach(), which the graph does not record.",
            ]
        if not math.isfinite(self.numeric):
            return ["f is not finite within eps of this element (log(0)? x/0? sqrt(-x)?): check it at other values."]
        if len(set(self.ops)) > 1:
            return [
                "f is composite: gradcheck each op alone, e.g. mt.gradcheck(lambda x: F.softmax(x, dim=-1), [x]),",
                "and read the backward of the op that fails.",
            ]
        where = f" ({self.op_source})" if self.op_source else ""
        return [f"f is one op: read {self.ops[0] if self.ops else 'its'}.backward{where} and what it calls (its kernels): they compute this input's gradient."]


class GradcheckError(MicrotensorError, AssertionError):
    """A gradient that disagrees with finite differences. `str(error)` is the report's text; the
    facts are attributes: `report` (the GradcheckReport, with everything above), and, for short,
    `input_index`, `element_index`, `analytic` (None when no gradient reached the input) and
    `numeric`. An AssertionError too, so that a failed check in a test reads as a failed assertion.
    """

    def __init__(self, report):
        super().__init__(str(report))
        self.report = report
        self.input_index = report.input_index
        self.element_index = report.element_index
        self.analytic = report.analytic
        self.numeric = report.numeric

    def __reduce__(self):  # rebuilt from the report, for pickling (e.g. from a worker process)
        return (type(self), (self.report,))


def _contracted_output(fn, inputs, upstream):
    """sum(fn(inputs) * upstream): the scalar whose gradient backward computes with grad_out = upstream."""
    out = fn(*inputs)
    return float(np.sum(out.data * upstream))


def gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-3, seed=0, max_elements=None, raise_exception=True):
    """Check the backward of `fn` at `inputs` against central finite differences.

    fn: takes the tensors in `inputs` and returns one float64 Tensor.
    inputs: Tensors; those with requires_grad=True are checked and must be leaves (backward fills
        .grad only there), float64, without NaN/inf. Gradients must be enabled (not inside no_grad()).
    eps, atol, rtol: step and tolerance; an element fails when |analytic - numeric| > atol + rtol |numeric|.
    seed: for the random upstream gradient (and the sampled elements).
    max_elements: check at most this many randomly chosen elements of each input (for big inputs).
    Returns True, or raises GradcheckError, whose message is a GradcheckReport: which input, the
    worst element, both values, the error against the tolerance, and a hint. With
    raise_exception=False it returns False instead; `gradcheck_report` (same arguments) returns
    the report itself. A NaN on either side (backward's or the finite differences') is a failure:
    it agrees with nothing.
    """
    __tracebackhide__ = True  # pytest shows the test's line and the report, not this function's source
    raise_exception = check_flag("gradcheck", "raise_exception", raise_exception)
    report = gradcheck_report(fn, inputs, eps=eps, atol=atol, rtol=rtol, seed=seed, max_elements=max_elements)
    if report is None:
        return True
    if raise_exception:
        raise GradcheckError(report)
    return False


def gradcheck_report(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-3, seed=0, max_elements=None):
    """The check of `gradcheck` (same arguments and meaning), returning None when every checked
    gradient agrees, else the GradcheckReport of the first input that does not."""
    __tracebackhide__ = True
    eps, atol, rtol, seed, max_elements = _check_options(fn, eps, atol, rtol, seed, max_elements)
    if isinstance(inputs, Tensor) or not hasattr(inputs, "__iter__"):
        raise InputTypeError(f"gradcheck: inputs must be a list or tuple of Tensors (and other arguments), got {describe(inputs)}")
    inputs = tuple(inputs)
    if not is_grad_enabled():
        raise InputError(
            "gradcheck: gradients are disabled (it was called inside mt.no_grad()), so fn's ops record no graph "
            "for backward to check; call gradcheck outside no_grad()"
        )
    checked = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]
    if not checked:
        raise InputError("gradcheck: no input has requires_grad=True, so there is nothing to check")
    for i in checked:
        x = inputs[i]
        if not x.is_leaf:
            # backward fills .grad on leaves only, and the ops that made x ran outside fn
            raise InputError(
                f"gradcheck: input {i} (shape {x.shape}) is not a leaf (it was made by {x.grad_fn.name}), so backward "
                "does not fill its .grad: pass a leaf tensor, e.g. x.detach().requires_grad_()"
            )
        if x.dtype != float64:
            raise InputTypeError(
                f"gradcheck: input {i} (shape {x.shape}) is {x.dtype}; finite differences need float64 "
                "(use x.double() or make it with dtype=float64)"
            )
        if not np.all(np.isfinite(x.data)):
            bad = tuple(int(j) for j in np.argwhere(~np.isfinite(x.data))[0])
            raise InputError(f"gradcheck: input {i} (shape {x.shape}) holds {x.data[bad]} at index {bad}")
        if not x.data.flags.writeable:
            raise InputError(f"gradcheck: input {i} (shape {x.shape}) is read-only; finite differences change its values one at a time")

    rng = np.random.default_rng(seed)
    for x in inputs:
        if isinstance(x, Tensor):
            x.grad = None
    out = fn(*inputs)
    if not isinstance(out, Tensor):
        raise InputTypeError(f"gradcheck: fn must return a Tensor, got {describe(out)}")
    if out.dtype != float64:
        # float32's rounding (~1e-7 relative) swamps a step of eps = 1e-6, and would read as a wrong backward
        raise InputTypeError(
            f"gradcheck: fn returned an output of dtype {out.dtype} and shape {out.shape}; expected float64, "
            "which finite differences need: compute fn in float64, or end it with .double()"
        )
    if not np.all(np.isfinite(out.data)):
        raise InputError(f"gradcheck: fn returned an output of shape {out.shape} with non-finite values (nan or inf)")
    if not out.requires_grad:
        raise InputError("gradcheck: the output does not depend on any input that requires a gradient")
    ops = _op_names(out)  # before backward, which frees what the ops saved (the graph's shape stays)
    upstream = rng.standard_normal(out.shape).astype(out.dtype)
    out.backward(upstream)

    for i in checked:
        x = inputs[i]
        analytic_grad = x.grad if x.grad is not None else np.zeros_like(x.data)
        flat_indices = np.arange(x.data.size)
        if max_elements is not None and x.data.size > max_elements:
            flat_indices = rng.choice(x.data.size, size=max_elements, replace=False)
        worst = None  # (error / tolerance, index, analytic, numeric)
        failed = 0
        for flat in flat_indices:
            index = np.unravel_index(flat, x.data.shape)
            original = x.data[index]
            try:
                x.data[index] = original + eps
                plus = _contracted_output(fn, inputs, upstream)
                x.data[index] = original - eps
                minus = _contracted_output(fn, inputs, upstream)
            finally:
                x.data[index] = original
            numeric = (plus - minus) / (2 * eps)
            analytic = float(analytic_grad[index])
            error = abs(analytic - numeric)
            allowed = atol + rtol * abs(numeric)
            # error / allowed, how far past the tolerance; inf when either side is NaN or inf, or when
            # nothing is allowed (atol = rtol = 0) and the two differ at all
            ratio = error / allowed if allowed > 0 else (0.0 if error == 0 else math.inf)
            if not math.isfinite(ratio):
                ratio = math.inf
            failed += ratio > 1
            if worst is None or ratio > worst[0]:
                worst = (ratio, tuple(int(j) for j in index), analytic, numeric)
        if worst is not None and worst[0] > 1:
            _, index, analytic, numeric = worst
            return GradcheckReport(
                function=_name_of(fn), ops=ops, op_source=_backward_source(out) if len(set(ops)) == 1 else None,
                output_shape=out.shape, input_index=i, input_name=_parameter_name(fn, i, len(inputs)),
                shape=x.shape, dtype=str(x.dtype), element_index=index,
                analytic=None if x.grad is None else analytic, numeric=numeric,
                failed=int(failed), checked=len(flat_indices), size=x.data.size,
                eps=eps, atol=atol, rtol=rtol, seed=seed,
            )  # fmt: skip
    return None


def _op_names(out):
    """The names of the ops that made `out`, in the order forward ran them (the engine's own order)."""
    names = []
    for tensor in topological_order(out):
        node = getattr(tensor, "grad_fn", tensor._ctx)
        if node is not None:
            names.append(getattr(node, "name", None) or node.function.__name__)
    return tuple(names)


def _name_of(fn):
    """fn's name for the report ("Softmax.apply" for a Function's apply), or None when it has none."""
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, type) and getattr(fn, "__name__", None) == "apply":
        return f"{owner.__name__}.apply"
    name = getattr(fn, "__name__", None)
    return name if isinstance(name, str) else None


def _parameter_name(fn, index, count):
    """The name fn gives its parameter number `index` (`lambda x, w:` calls input 1 "w"), if it has one."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # builtins and some callables have no signature
        return None
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return positional[index].name if index < len(positional) and len(positional) >= count else None


def _backward_source(out):
    """"file:line" of the backward of the op that made `out` (relative to the working directory when inside it)."""
    node = getattr(out, "grad_fn", out._ctx)
    try:
        backward = inspect.unwrap(node.function.backward)
        path, (lines, line) = inspect.getsourcefile(backward), inspect.getsourcelines(backward)
        relative = os.path.relpath(path)
    except (AttributeError, TypeError, OSError, ValueError):  # no file: defined in a REPL or by exec()
        return None
    line += next((k for k, text in enumerate(lines) if text.lstrip().startswith("def ")), 0)  # past @staticmethod
    return f"{path if relative.startswith('..') else relative}:{line}"


def _check_options(fn, eps, atol, rtol, seed, max_elements):
    if not callable(fn):
        raise InputTypeError(f"gradcheck: fn must be callable (a function of the inputs), got {describe(fn)}")
    eps = check_real("gradcheck", "eps", eps, low=0, low_open=True)
    atol = check_real("gradcheck", "atol", atol, low=0)
    rtol = check_real("gradcheck", "rtol", rtol, low=0)
    seed = check_int("gradcheck", "seed", seed, low=0)
    if max_elements is not None:
        max_elements = check_int("gradcheck", "max_elements", max_elements, low=1)
    return eps, atol, rtol, seed, max_elements


# --------------------------------------------------------------------------------- forward mode


class JvpcheckError(MicrotensorError, AssertionError):
    """A forward-mode derivative (an op's `jvp`) that disagrees with finite differences or with the
    op's backward; the message says which, where, and what to read next."""


def _forward_mode_inputs(where, fn, inputs):
    """The indices of the inputs to move (float64 tensors that require grad), checked as gradcheck checks them."""
    if not callable(fn):
        raise InputTypeError(f"{where}: fn must be callable (a function of the inputs), got {describe(fn)}")
    if isinstance(inputs, Tensor) or not hasattr(inputs, "__iter__"):
        raise InputTypeError(f"{where}: inputs must be a list or tuple of Tensors (and other arguments), got {describe(inputs)}")
    inputs = tuple(inputs)
    moved = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]
    if not moved:
        raise InputError(f"{where}: no input has requires_grad=True, so there is no direction to move in")
    for i in moved:
        x = inputs[i]
        if x.dtype != float64:
            raise InputTypeError(f"{where}: input {i} (shape {x.shape}) is {x.dtype}; the checks need float64 (use x.double())")
        if not np.all(np.isfinite(x.data)):
            raise InputError(f"{where}: input {i} (shape {x.shape}) holds values that are not finite")
    return inputs, moved


def _subject(fn, ops):
    name = {"<lambda>": "a lambda", None: "fn"}.get(_name_of(fn), _name_of(fn))
    return f"{name} (ops: {' -> '.join(ops) if ops else 'none'})"


def _jvp_hint(ops, rule):
    if len(set(ops)) == 1:
        return f"f is one op: read {ops[0]}.{rule} (and the derivation in its docstring)."
    return "f is composite: check each op alone, e.g. mt.jvpcheck(lambda x: F.softmax(x, dim=-1), [x])."


def jvpcheck_report(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-3, seed=0):
    """Forward mode against central finite differences: None when they agree, else the message.

    Draws a random tangent v (seed) for every input that requires grad and compares mt.jvp's J v
    with (fn(x + eps v) - fn(x - eps v)) / (2 eps), element by element of the output: an element
    fails when |jvp - numeric| > atol + rtol |numeric|. Inputs as for `gradcheck` (float64)."""
    __tracebackhide__ = True
    eps, atol, rtol, seed, _ = _check_options(fn, eps, atol, rtol, seed, None)
    inputs, moved = _forward_mode_inputs("jvpcheck", fn, inputs)
    rng = np.random.default_rng(seed)
    tangents = [rng.standard_normal(x.shape) if i in moved else None for i, x in enumerate(inputs)]
    out, tangent_out = jvp(fn, inputs, tangents)
    if not isinstance(out, Tensor) or out.dtype != float64:
        raise InputTypeError(f"jvpcheck: fn must return one float64 Tensor, got {describe(out)}")
    originals = [inputs[i].data.copy() for i in moved]
    try:
        with no_grad():
            for i, original in zip(moved, originals):
                inputs[i].data[...] = original + eps * tangents[i]
            plus = fn(*inputs).data.copy()
            for i, original in zip(moved, originals):
                inputs[i].data[...] = original - eps * tangents[i]
            minus = fn(*inputs).data.copy()
    finally:
        for i, original in zip(moved, originals):
            inputs[i].data[...] = original
    difference_quotient = (plus - minus) / (2 * eps)  # (f(x + eps v) - f(x - eps v)) / 2 eps
    analytic = tangent_out.data
    with np.errstate(invalid="ignore"):
        error = np.abs(analytic - difference_quotient)
        ratio = np.where(np.isfinite(error), error / (atol + rtol * np.abs(difference_quotient)), np.inf)
    if ratio.size == 0 or np.max(ratio) <= 1:
        return None
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    ops = _op_names(fn(*inputs)) if is_grad_enabled() else ()
    element = f"[{', '.join(str(int(j)) for j in worst)}]"
    return "\n".join([
        f"jvpcheck failed for {_subject(fn, ops)}",
        f"  output {out.shape}: {int(np.sum(ratio > 1))} of {ratio.size} elements out of tolerance, the worst {element}:",
        f"  forward mode (jvp) {float(analytic[worst]):.8g}  vs  numeric (finite differences) {float(difference_quotient[worst]):.8g}",
        f"  error {float(error[worst]):.3g} > allowed {atol + rtol * abs(float(difference_quotient[worst])):.3g} = atol {atol:g} + rtol {rtol:g} * |numeric|",
        f"  Both are d/dt f(x + t v) at t = 0, v random tangents (seed {seed}) of inputs {moved}.",
        f"  Hint: {_jvp_hint(ops, 'jvp')}",
    ])


def dot_product_report(fn, inputs, seed=0, atol=1e-10, rtol=1e-6):
    """Forward mode against backward by the transpose identity: None when they agree, else the message.

    For a random u shaped like fn's output and, for each input x_i that requires grad, a random v_i
    shaped like it: <u, J_i v_i> (one mt.jvp with v_i as x_i's tangent) must equal <J_iᵀ u, v_i>
    (one backward with grad_out = u gives J_iᵀ u in x_i.grad), within atol + rtol times the sum of
    the absolute terms of both sums (their rounding)."""
    __tracebackhide__ = True
    _, atol, rtol, seed, _ = _check_options(fn, 1.0, atol, rtol, seed, None)
    inputs, moved = _forward_mode_inputs("dot_product_check", fn, inputs)
    if not is_grad_enabled():
        raise InputError("dot_product_check: gradients are disabled (inside mt.no_grad()), so there is no backward to compare with")
    rng = np.random.default_rng(seed)
    for x in inputs:
        if isinstance(x, Tensor):
            x.grad = None
    out = fn(*inputs)
    if not isinstance(out, Tensor) or out.dtype != float64:
        raise InputTypeError(f"dot_product_check: fn must return one float64 Tensor, got {describe(out)}")
    ops = _op_names(out)
    u = rng.standard_normal(out.shape)
    out.backward(u)
    for i in moved:
        x = inputs[i]
        v = rng.standard_normal(x.shape)
        _, tangent_out = jvp(fn, inputs, [v if j == i else None for j in range(len(inputs))])
        transposed = x.grad if x.grad is not None else np.zeros(x.shape)
        forward_side = float(np.sum(u * tangent_out.data))  # <u, J v>
        backward_side = float(np.sum(transposed * v))  # <Jᵀ u, v>
        scale = float(np.sum(np.abs(u * tangent_out.data)) + np.sum(np.abs(transposed * v)))
        allowed = atol + rtol * scale
        difference = abs(forward_side - backward_side)
        if not difference <= allowed:  # NaN fails too
            name = _parameter_name(fn, i, len(inputs))
            return "\n".join([
                f"dot-product test failed for {_subject(fn, ops)}, input {i}{f' ({name})' if name else ''} of shape {x.shape}:",
                f"  <u, J v> from forward mode (jvp) {forward_side:.12g}  vs  <Jᵀ u, v> from backward {backward_side:.12g}",
                f"  difference {difference:.3g} > allowed {allowed:.3g} = atol {atol:g} + rtol {rtol:g} * {scale:.3g} (the sums' absolute terms)",
                f"  u random of the output's shape {out.shape}, v random of the input's shape (seed {seed}).",
                "  Hint: the JVP and the backward disagree, so one of them is wrong: if gradcheck passes, read the",
                f"  jvp; if jvpcheck passes, read the backward. {_jvp_hint(ops, 'jvp and .backward')}",
            ])
    return None


def jvpcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-3, seed=0):
    """`jvpcheck_report`'s check: True, or raise JvpcheckError with its message."""
    __tracebackhide__ = True
    message = jvpcheck_report(fn, inputs, eps=eps, atol=atol, rtol=rtol, seed=seed)
    if message is not None:
        raise JvpcheckError(message)
    return True


def dot_product_check(fn, inputs, seed=0, atol=1e-10, rtol=1e-6):
    """`dot_product_report`'s check: True, or raise JvpcheckError with its message."""
    __tracebackhide__ = True
    message = dot_product_report(fn, inputs, seed=seed, atol=atol, rtol=rtol)
    if message is not None:
        raise JvpcheckError(message)
    return True


# --------------------------------------------------------------------------------- the registry

GRADCHECK_CASES = {}  # Function subclass -> list of case functions


def gradcheck_case(*functions):
    """Register a case that checks the given Function classes: `case(draw) -> (fn, inputs[, options])`."""

    if not functions or not all(isinstance(f, type) and issubclass(f, Function) for f in functions):
        raise InputTypeError(f"gradcheck_case: expected Function subclasses, got {', '.join(describe(f) for f in functions) or 'none'}")

    def register(case):
        if not callable(case):
            raise InputTypeError(f"gradcheck_case: the case must be a function of a draw, got {describe(case)}")
        for function in functions:
            GRADCHECK_CASES.setdefault(function, []).append(case)
        return case

    return register


class RandomDraw:
    """Random shapes and float64 tensors for gradcheck cases, from a seeded numpy generator.

    The test suite uses a subclass whose choices come from hypothesis (so failures shrink and
    replay); students can call a case themselves with `case(RandomDraw(seed))`.
    """

    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)

    def integer(self, low, high):
        """An integer in [low, high], both included."""
        return int(self.rng.integers(low, high + 1))

    def boolean(self):
        return self.integer(0, 1) == 1

    def choice(self, options):
        return options[self.integer(0, len(options) - 1)]

    def shape(self, min_dims=1, max_dims=3, min_side=1, max_side=4):
        return tuple(self.integer(min_side, max_side) for _ in range(self.integer(min_dims, max_dims)))

    def broadcastable_shape(self, shape):
        """A shape that broadcasts against `shape`: some leading dims dropped, some sides set to 1."""
        dropped = self.integer(0, len(shape))
        return tuple(1 if self.boolean() else n for n in shape[dropped:])

    LAYOUTS = ("contiguous", "transposed", "strided")

    def layout(self):
        """One of LAYOUTS, to give several tensors of a case the same one."""
        return self.choice(self.LAYOUTS)

    def tensor(self, shape, low=-2.0, high=2.0, requires_grad=True, away_from=None, distinct=False, layout=None):
        """A float64 tensor of uniform values in [low, high].

        away_from: a point (a kink, like 0 for relu) that no value comes within 0.05 of.
        distinct: values at least 4e-3 apart (for max, whose gradient jumps where two values tie).
        layout: how the values are stored, one of LAYOUTS; drawn when None. About half the time
        they are stored non-contiguously (transposed or strided), because kernels must handle
        whatever layout reaches them.
        """
        shape = tuple(shape)
        size = int(np.prod(shape, dtype=np.int64))
        if distinct:
            values = low + (high - low) * (self.rng.permutation(size) + 0.5) / max(size, 1)
        else:
            values = self.rng.uniform(low, high, size)
        if away_from is not None:
            too_close = np.abs(values - away_from) < 0.05
            values[too_close] = away_from + np.where(values[too_close] >= away_from, 0.05, -0.05) * 2
        array = self._layout(values.reshape(shape), layout)
        # Tensor(array) would copy a strided array into contiguous memory: keep the layout as drawn.
        return Tensor._from_array(array, requires_grad)

    def indices(self, shape, high):
        """An int64 tensor of values in [0, high)."""
        return Tensor(self.rng.integers(0, high, size=shape).astype(np.int64))

    def _layout(self, array, layout=None):
        """The same values in the memory layout `layout` (drawn when None)."""
        if layout is None:
            layout = self.layout()
        elif layout not in self.LAYOUTS:
            raise InputError(f"RandomDraw.tensor: layout {layout!r} is not one of {self.LAYOUTS}")
        if layout == "transposed" and array.ndim >= 2:
            return np.ascontiguousarray(array.T).T
        if layout == "strided":
            padded = np.zeros(array.shape[:-1] + (2 * array.shape[-1],), dtype=array.dtype) if array.ndim else None
            if padded is not None:
                padded[..., ::2] = array
                return padded[..., ::2]
        return array.copy()
