"""Anomaly mode: stop at the first op whose forward or backward makes a NaN or an infinity.

    with mt.detect_anomaly():
        _, loss = model(x, y)
        loss.backward()          # AnomalyError: names the op, the array at fault and the line that called the op

A loss that turns NaN says only that something, somewhere, went wrong: by the time it is printed,
every op after the first bad one has passed the NaN on. Inside `detect_anomaly()` every op is
watched as it runs, so the error names the first one:

- forward: the op's output is checked; when it is not finite, the error names the op, the output's
  shape and dtype, how many of its elements are NaN or infinite, and where in the user's code the op
  was called (the first frame outside microtensor). When an input was already not finite, that
  input is named instead (it was made before anomaly mode was on, or given as data), since the op
  only passed it on.
- backward: every gradient an op's backward returns is checked; the error names the op, which
  input the gradient flows into, its shape, dtype and count of bad elements, and where the op was
  called in the forward (noted at forward time, so only for a forward run inside anomaly mode).

An infinity asked for is not an anomaly: an op given a number that is itself infinite
(`masked_fill(x, mask, -inf)`) may make infinities, and only a NaN in its output counts.

What it costs. Outside anomaly mode nothing: `Function.apply` and the backward walk each test one
module variable (`autograd._observer`) and go on. Inside, every op's output and gradients are
scanned once (`np.isfinite`) and the caller's frame is looked up: a few times slower, for finding
a bug, not for training.

How it hooks in. `autograd._observer`, while set, receives each `Function.apply` call
(`apply(function, args, kwargs)`) and each op's backward during the walk (`backward_op(ctx,
grad_out)`). `OpObserver` below is the base of the watchers (this one, and the profiler in
profiler.py): it runs the call it watches with itself switched off, so the ops a watcher's own code
runs are not watched, and watchers nest (a profile inside anomaly mode runs both).
"""
import os
import sys

import numpy as np

from . import autograd
from .errors import MicrotensorError
from .tensor import Tensor

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep  # frames in here are microtensor's, not the user's


class AnomalyError(MicrotensorError, FloatingPointError):
    """An op's forward or backward made a NaN or an infinity inside detect_anomaly()."""


class OpObserver:
    """The base of a watcher of every op: `with watcher:` installs it as `autograd._observer`
    (above any watcher already there, which still runs), and the two methods run one op each."""

    _below = None  # the watcher that was installed when this one came in
    _installed = False

    def __enter__(self):
        if self._installed:
            raise MicrotensorError(f"{type(self).__name__}: already in use; enter a new one instead of entering it twice")
        self._below, self._installed = autograd._observer, True
        autograd._observer = self
        return self

    def __exit__(self, *exc_info):
        autograd._observer, self._installed = self._below, False
        return False

    def run_forward(self, function, args, kwargs):
        """function.apply(*args, **kwargs), watched by the watchers below this one only."""
        autograd._observer = self._below
        try:
            return function.apply(*args, **kwargs)
        finally:
            autograd._observer = self

    def run_backward(self, ctx, grad_out):
        """The op's backward, watched by the watchers below this one only."""
        if self._below is not None:
            return self._below.backward_op(ctx, grad_out)
        return ctx.function.backward(ctx, grad_out)

    def apply(self, function, args, kwargs):
        return self.run_forward(function, args, kwargs)

    def backward_op(self, ctx, grad_out):
        return self.run_backward(ctx, grad_out)


def user_frame(skip=PACKAGE_DIR):
    """Where the user's code called into microtensor: "file:line in function" of the innermost
    frame whose file is not inside the microtensor package (None when there is none)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        frame = frame.f_back
    if frame is None:
        return None
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def count_non_finite(array):
    """(NaNs, infinities) in a float array; (0, 0) for any other dtype, which cannot hold them."""
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "fc":
        return 0, 0
    if np.isfinite(array).all():  # the common case: one pass, no counting
        return 0, 0
    nans = int(np.count_nonzero(np.isnan(array)))
    return nans, int(array.size) - nans - int(np.count_nonzero(np.isfinite(array)))


def _bad(nans, infs):
    parts = ([f"{nans} NaN"] if nans else []) + ([f"{infs} inf"] if infs else [])
    return " and ".join(parts)


def _made_by(tensor):
    ctx = tensor._ctx
    if ctx is None:
        return "a leaf (data or a parameter, made by no op)"
    where = f", called at {ctx.created_at}" if ctx.created_at else ", by a forward run outside detect_anomaly()"
    return f"the output of {ctx.name}{where}"


class detect_anomaly(OpObserver):
    """Context manager (and decorator) in which the first op whose forward or backward makes a
    NaN or an infinity raises AnomalyError naming it (see the module docstring)."""

    def __call__(self, function):
        def with_anomaly_detection(*args, **kwargs):
            with detect_anomaly():
                return function(*args, **kwargs)

        with_anomaly_detection.__name__ = function.__name__
        with_anomaly_detection.__doc__ = function.__doc__
        return with_anomaly_detection

    def apply(self, function, args, kwargs):
        site = user_frame()
        result = self.run_forward(function, args, kwargs)
        if result._ctx is not None:
            result._ctx.created_at = site
        nans, infs = count_non_finite(result._data)
        if infs and not nans and any(_infinite_number(a) for a in args + tuple(kwargs.values())):
            return result  # an infinity asked for (a -inf mask), not made by accident
        if nans or infs:
            self._forward_anomaly(function, args, result, nans, infs, site)
        return result

    def _forward_anomaly(self, function, args, result, nans, infs, site):
        op = function.__name__
        for index, inp in enumerate(args):
            if isinstance(inp, Tensor):
                in_nans, in_infs = count_non_finite(inp._data)
                if in_nans or in_infs:
                    raise AnomalyError(
                        f"detect_anomaly: input {index} of {op} (shape {inp.shape}, {inp.dtype}) already holds "
                        f"{_bad(in_nans, in_infs)} of its {inp._data.size} elements when {op} runs at {site}; it is "
                        f"{_made_by(inp)}: look there, or at the data, not at {op}"
                    )
        raise AnomalyError(
            f"detect_anomaly: {op} (forward) made {_bad(nans, infs)} in its output (shape {result.shape}, "
            f"{result.dtype}: {nans + infs} of {result._data.size} elements not finite) from finite inputs; "
            f"{op} was called at {site}"
        )

    def backward_op(self, ctx, grad_out):
        grads = self.run_backward(ctx, grad_out)
        listed = grads if isinstance(grads, tuple) else (grads,)
        for index, grad in enumerate(listed):
            nans, infs = count_non_finite(grad)
            if nans or infs:
                self._backward_anomaly(ctx, grad_out, index, grad, nans, infs)
        return grads

    def _backward_anomaly(self, ctx, grad_out, index, grad, nans, infs):
        op = ctx.name
        site = ctx.created_at or "an unknown place (its forward ran outside detect_anomaly(); run the forward inside it too)"
        out_nans, out_infs = count_non_finite(grad_out)
        if out_nans or out_infs:
            raise AnomalyError(
                f"detect_anomaly: the gradient arriving at the output of {op} (shape {grad_out.shape}, {grad_out.dtype}) "
                f"already holds {_bad(out_nans, out_infs)} of its {grad_out.size} elements (given to backward(), or "
                f"returned by a hook); {op} was called at {site}"
            )
        raise AnomalyError(
            f"detect_anomaly: {op} (backward) made {_bad(nans, infs)} in the gradient flowing into its input {index} "
            f"(shape {grad.shape}, {grad.dtype}: {nans + infs} of {grad.size} elements not finite) from a finite "
            f"gradient of its output; {op} was called at {site}"
        )


def _infinite_number(value):
    return isinstance(value, (float, np.floating)) and not np.isfinite(value)
