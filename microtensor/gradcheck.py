"""Finite-difference gradient checking, and the registry of a gradient check for every op.

`gradcheck(fn, inputs)` compares the gradients that backward computes with central differences.
To test a whole Jacobian with one backward pass, the output is contracted with a random upstream
gradient v: the scalar L(x) = sum(fn(x) * v) has dL/dx_i = sum_j v_j dfn_j/dx_i, which backward
computes with grad_out = v, and which finite differences estimate as

    (L(x + eps e_i) - L(x - eps e_i)) / (2 eps)        (error O(eps^2)).

A random v matters: with v = ones (i.e. `fn(x).sum()`), a softmax's rows always sum to 1, so a
backward returning zeros would pass. Checks run in float64, where eps = 1e-6 leaves ~1e-10 of
rounding noise in the difference quotient.

Every op registers a case with `@gradcheck_case(TheFunction)`: a function that, given a `draw`
(random shapes and tensors; the test suite passes one driven by hypothesis), returns the function
to check and its inputs, and optionally a dict of gradcheck options where a case has a reason to
change them (written beside the case). `tests/test_gradcheck_cases.py` runs every case and fails if any Function
in the package has none.
"""
import math

import numpy as np

from .errors import InputError, InputTypeError, MicrotensorError
from .tensor import FLOAT_DTYPES, Tensor, check_flag, describe, float64


class GradcheckError(MicrotensorError, AssertionError):
    """A gradient that disagrees with finite differences; the message says where and by how much.
    (An AssertionError too, so that a failed check in a test reads as a failed assertion.)"""

    def __init__(self, message, input_index=None, element_index=None, analytic=None, numeric=None):
        super().__init__(message)
        self.input_index = input_index
        self.element_index = element_index
        self.analytic = analytic
        self.numeric = numeric


def _contracted_output(fn, inputs, upstream):
    """sum(fn(inputs) * upstream): the scalar whose gradient backward computes with grad_out = upstream."""
    out = fn(*inputs)
    return float(np.sum(out.data * upstream))


def gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-3, seed=0, max_elements=None, raise_exception=True):
    """Check the backward of `fn` at `inputs` against central finite differences.

    fn: takes the tensors in `inputs` and returns one Tensor.
    inputs: Tensors; those with requires_grad=True are checked and must be float64 without NaN/inf.
    eps, atol, rtol: step and tolerance; an element fails when |analytic - numeric| > atol + rtol |numeric|.
    seed: for the random upstream gradient (and the sampled elements).
    max_elements: check at most this many randomly chosen elements of each input (for big inputs).
    Returns True, or raises GradcheckError naming the input, the worst element, both values and the error
    (returns False instead when raise_exception=False). A NaN on either side (backward's or the finite
    differences') is a failure: it agrees with nothing.
    """
    eps, atol, rtol, seed, max_elements = _check_options(fn, eps, atol, rtol, seed, max_elements)
    raise_exception = check_flag("gradcheck", "raise_exception", raise_exception)
    if isinstance(inputs, Tensor) or not hasattr(inputs, "__iter__"):
        raise InputTypeError(f"gradcheck: inputs must be a list or tuple of Tensors (and other arguments), got {describe(inputs)}")
    inputs = tuple(inputs)
    checked = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]
    if not checked:
        raise InputError("gradcheck: no input has requires_grad=True, so there is nothing to check")
    for i in checked:
        x = inputs[i]
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
    if out.dtype not in FLOAT_DTYPES:
        raise InputTypeError(f"gradcheck: fn returned a {out.dtype} output of shape {out.shape}; expected float64")
    if not np.all(np.isfinite(out.data)):
        raise InputError(f"gradcheck: fn returned an output of shape {out.shape} with non-finite values (nan or inf)")
    if not out.requires_grad:
        raise InputError("gradcheck: the output does not depend on any input that requires a gradient")
    upstream = rng.standard_normal(out.shape).astype(out.dtype)
    out.backward(upstream)

    for i in checked:
        x = inputs[i]
        analytic_grad = x.grad if x.grad is not None else np.zeros_like(x.data)
        flat_indices = np.arange(x.data.size)
        if max_elements is not None and x.data.size > max_elements:
            flat_indices = rng.choice(x.data.size, size=max_elements, replace=False)
        worst = None  # (error / tolerance, index, analytic, numeric)
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
            if worst is None or ratio > worst[0]:
                worst = (ratio, tuple(int(j) for j in index), analytic, numeric)
        if worst is not None and worst[0] > 1:
            _, index, analytic, numeric = worst
            message = (
                f"gradcheck failed for input {i} (shape {x.shape}): at index {index} backward gives "
                f"{analytic:.8g} but finite differences give {numeric:.8g} "
                f"(error {abs(analytic - numeric):.3g}, allowed {atol + rtol * abs(numeric):.3g} = "
                f"atol {atol:g} + rtol {rtol:g} * |numeric|)"
            )
            if math.isnan(analytic) or math.isnan(numeric):
                side = "backward" if math.isnan(analytic) else "the finite differences"
                message += f"; {side} gave NaN (not a number), which agrees with nothing"
            if raise_exception:
                raise GradcheckError(message, i, index, analytic, numeric)
            return False
    return True


def _check_options(fn, eps, atol, rtol, seed, max_elements):
    from .ops.checks import check_int, check_real  # here: the ops import this module

    if not callable(fn):
        raise InputTypeError(f"gradcheck: fn must be callable (a function of the inputs), got {describe(fn)}")
    eps = check_real("gradcheck", "eps", eps, low=0, low_open=True)
    atol = check_real("gradcheck", "atol", atol, low=0)
    rtol = check_real("gradcheck", "rtol", rtol, low=0)
    seed = check_int("gradcheck", "seed", seed, low=0)
    if max_elements is not None:
        max_elements = check_int("gradcheck", "max_elements", max_elements, low=1)
    return eps, atol, rtol, seed, max_elements


# --------------------------------------------------------------------------------- the registry

GRADCHECK_CASES = {}  # Function subclass -> list of case functions


def gradcheck_case(*functions):
    """Register a case that checks the given Function classes: `case(draw) -> (fn, inputs[, options])`."""

    from .autograd import Function  # here: autograd imports the tensor module, which imports the ops

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

    def tensor(self, shape, low=-2.0, high=2.0, requires_grad=True, away_from=None, distinct=False):
        """A float64 tensor of uniform values in [low, high].

        away_from: a point (a kink, like 0 for relu) that no value comes within 0.05 of.
        distinct: values at least 4e-3 apart (for max, whose gradient jumps where two values tie).
        About half the time the values are stored non-contiguously (transposed or strided), because
        kernels must handle whatever layout reaches them.
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
        array = self._layout(values.reshape(shape))
        return Tensor(array, requires_grad=requires_grad)

    def indices(self, shape, high):
        """An int64 tensor of values in [0, high)."""
        return Tensor(self.rng.integers(0, high, size=shape).astype(np.int64))

    def _layout(self, array):
        """The same values in a randomly chosen memory layout."""
        layout = self.choice(("contiguous", "transposed", "strided"))
        if layout == "transposed" and array.ndim >= 2:
            return np.ascontiguousarray(array.T).T
        if layout == "strided":
            padded = np.zeros(array.shape[:-1] + (2 * array.shape[-1],), dtype=array.dtype) if array.ndim else None
            if padded is not None:
                padded[..., ::2] = array
                return padded[..., ::2]
        return array.copy()
