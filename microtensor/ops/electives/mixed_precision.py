"""16-bit training: float16 and bfloat16 activations and weight copies, float32 master weights, and
dynamic loss scaling for float16.

The two formats, beside float32 (sign, exponent bits, mantissa bits):

    float32    1 | 8 | 23   max 3.4e38    smallest normal 1.2e-38   precision 2^-24 (7 digits)
    float16    1 | 5 | 10   max 65504     smallest normal 6.1e-5    precision 2^-11 (3 digits)
    bfloat16   1 | 8 |  7   max 3.4e38    smallest normal 1.2e-38   precision 2^-8  (2 digits)

float16 spends its bits on precision and has little range: a gradient below 6e-8 (its smallest
subnormal) becomes 0, an activation or gradient above 65504 becomes inf. bfloat16 keeps float32's
8 exponent bits, so its range is float32's, and gives up precision instead. Gradients of a small
model are often 1e-6 to 1e-9: under float16 many of them vanish. Loss scaling multiplies the loss
by S (say 2^15) before backward, so every gradient is S times larger and lands in float16's range;
the gradients are divided by S again in float32 before the optimizer sees them. Too large an S
makes some gradient overflow to inf: then the step is skipped and S halved (`LossScaler`).
bfloat16 needs none of this: whatever float32 can hold, it can hold, only less exactly.

bfloat16 is the upper half of a float32. numpy has no bfloat16 dtype, and none is needed: take the
float32's 32 bits as a uint32, round away the lower 16 bits (to nearest, ties to even), and keep
the upper 16 as a uint16 (`to_bfloat16`). Back is a shift: the uint16 becomes the upper half of a
uint32 whose lower half is zero (`from_bfloat16`).

What this module does, and where. The kernels compute in float32 (as a CPU without 16-bit
arithmetic does: load 16 bits, compute in 32). `autocast(dtype, parameters)` is a `with` block in
which:
(a) each parameter's values are a copy rounded to the 16-bit grid (the weights' working copy); the
    float32 values, the master weights, are put back when the block ends, and the optimizer
    updates them, so that an update smaller than the 16-bit grid's spacing is not lost;
(b) the arrays an op saves for backward, other than its inputs and output (which the graph holds
    anyway), are stored as 16-bit arrays (float16, or bfloat16 as uint16) and made float32 again
    when backward reads them: half the bytes of what backward alone keeps;
(c) each op's float32 output, and each gradient flowing back between ops and into a parameter, is
    rounded to the 16-bit grid, so that float16's overflow and underflow happen where they would;
    a one-element output (the loss) and its gradient are kept in float32, as losses and
    reductions to one number are in 16-bit training elsewhere: rounding the loss to bfloat16's 8
    bits would round every loss printed to 0.016, and S, the gradient at a scaled loss, is no
    16-bit value.
Run backward inside the block: the parameters' gradient hook and the 16-bit copies live there.
Float64 arrays (gradient checks) are never rounded. The three hooks in microtensor/autograd.py
are one `if` each: `apply` calls `round_output`, the walk calls `before_backward`, and `Context`
notes the block it was made in.

`LossScaler` holds S: `scale(loss)`, backward, `unscale(parameters)` (divides in float32, and
notes whether any gradient is inf or nan), `step(optimizer)` (skips it then), `update()` (halves
S after an overflow; doubles it after `growth_interval` clean steps). docs/electives/mixed-precision.md
has the measured table.
"""
import math

import numpy as np

from ... import autograd
from ...checks import describe
from ...errors import GraphError, InputError, InputTypeError
from ...tensor import Tensor

DTYPES = ("float16", "bfloat16")

# ------------------------------------------------------------------------------ bfloat16 in numpy


def to_bfloat16(x):
    """The bfloat16 bit patterns (a uint16 array) of float32 values, rounded to nearest, ties to
    even; inf stays inf, nan stays nan (quiet), a value above bfloat16's largest becomes inf."""
    values = np.asarray(x, dtype=np.float32)
    bits = values.view(np.uint32)
    # Adding 0x7FFF, plus 1 when the kept half is odd, carries into bit 16 exactly when the lower
    # half is above one half, or exactly one half with an odd kept part: round to nearest even.
    rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    upper = ((bits + rounding) >> np.uint32(16)).astype(np.uint16)
    # A nan whose set bits are all in the lower half would round to inf: keep it a nan.
    return np.where(np.isnan(values), np.uint16(0x7FC0) | (upper & np.uint16(0x8000)), upper)


def from_bfloat16(bits):
    """float32 values of bfloat16 bit patterns (a uint16 array): the upper half of each float32."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def round_to(dtype, x):
    """x (float32) rounded to the grid of `dtype` ("float16" or "bfloat16"), as float32: a new array."""
    if dtype == "float16":
        with np.errstate(over="ignore"):  # above 65504 is inf: that is float16
            return x.astype(np.float16).astype(np.float32)
    return from_bfloat16(to_bfloat16(x))


def pack(dtype, x):
    """x (float32) stored in 16 bits: a float16 array, or bfloat16's bit patterns as uint16."""
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16)
    return to_bfloat16(x)


def unpack(dtype, x):
    """A packed array back as float32."""
    return x.astype(np.float32) if dtype == "float16" else from_bfloat16(x)


class Packed:
    """An array an op saved for backward, kept in 16 bits until backward reads it."""

    __slots__ = ("bits",)

    def __init__(self, bits):
        self.bits = bits

    @property
    def nbytes(self):
        return self.bits.nbytes


# ------------------------------------------------------------------------------ the autocast block


def _round_in_place(dtype, x):
    if dtype == "float16":
        with np.errstate(over="ignore"):
            np.copyto(x, x.astype(np.float16))
    else:
        x.view(np.uint32)[...] = from_bfloat16(to_bfloat16(x)).view(np.uint32)


class Policy:
    """The active 16-bit format: what autograd's hooks call (one per Context made in the block)."""

    def __init__(self, dtype):
        self.dtype = dtype

    def round_output(self, ctx, arrays, out):
        """After a forward: round a float32 output to the grid (in place when forward made it, else a
        copy) and pack what the op saved, other than its inputs and output, into 16 bits."""
        if out.dtype == np.float32:
            inputs = [a for a in arrays if isinstance(a, np.ndarray)]
            if out.size == 1:
                pass  # a loss: kept in float32, its value and the gradient backward starts from
            elif any(np.may_share_memory(out, a) for a in inputs):
                out = round_to(self.dtype, out)  # a view of an input: never change the input
            else:
                _round_in_place(self.dtype, out)
            if ctx.requires_grad and ctx.saved_tensors and not ctx.forward_mode:
                kept = inputs + [out]
                ctx.saved_tensors = tuple(
                    Packed(pack(self.dtype, s))
                    if isinstance(s, np.ndarray) and s.dtype == np.float32 and not any(np.may_share_memory(s, k) for k in kept)
                    else s
                    for s in ctx.saved_tensors
                )
        return out

    def before_backward(self, ctx, grad_out):
        """Before an op's backward: its saved arrays back in float32, its output's gradient on the grid."""
        if any(isinstance(s, Packed) for s in ctx.saved_tensors):
            ctx.saved_tensors = tuple(unpack(self.dtype, s.bits) if isinstance(s, Packed) else s for s in ctx.saved_tensors)
        if grad_out.dtype == np.float32 and grad_out.size > 1:
            grad_out = round_to(self.dtype, grad_out)
        return grad_out


def check_dtype(where, dtype):
    if dtype not in DTYPES:
        raise InputError(f"{where}: dtype {dtype!r} is not a 16-bit format microtensor trains in; expected 'float16' or 'bfloat16'")
    return dtype


class autocast:
    """`with autocast("float16" | "bfloat16", model.parameters()):` forward and backward with 16-bit
    activations, gradients and weight copies; the parameters' float32 values come back at the end.

        with mt.autocast("bfloat16", model.parameters()):
            logits, loss = model(idx, targets)
            loss.backward()
        optimizer.step()          # on the float32 master weights, with float32 gradients

    Only float32 parameters are copied (a float64 model stays as it is)."""

    def __init__(self, dtype, parameters=()):
        self.dtype = check_dtype("autocast", dtype)
        self.parameters = list(parameters)
        for index, p in enumerate(self.parameters):
            if not isinstance(p, Tensor):
                raise InputTypeError(f"autocast: parameters[{index}] is {describe(p)}; expected Tensors (model.parameters())")
        self.masters, self.hooks = [], []

    def __enter__(self):
        if autograd._low_precision is not None:
            raise GraphError("autocast: already inside an autocast block; blocks do not nest")
        dtype = self.dtype
        for p in self.parameters:
            if p._data.dtype != np.float32:
                continue
            self.masters.append((p, p._data))
            p._data = round_to(dtype, p._data)  # the working copy; the master is kept aside
            if p.requires_grad:
                self.hooks.append(p.register_hook(lambda grad: round_to(dtype, grad.data)))
        autograd._low_precision = Policy(dtype)
        return self

    def __exit__(self, *exc_info):
        autograd._low_precision = None
        for hook in self.hooks:
            hook.remove()
        for p, master in self.masters:
            p._data = master
        self.masters, self.hooks = [], []


def saved_bytes(root):
    """Bytes of the arrays the ops of root's graph saved for backward other than their inputs and
    outputs (those the graph holds anyway): what 16-bit storage shrinks. Packed arrays count their 16 bits."""
    total = 0
    for tensor in autograd.topological_order(root):
        ctx = tensor._ctx
        if ctx is None:
            continue
        kept = [x._data for x in ctx.inputs if isinstance(x, Tensor)] + [tensor._data]
        for s in ctx.saved_tensors:
            if isinstance(s, Packed) or (isinstance(s, np.ndarray) and not any(np.may_share_memory(s, k) for k in kept)):
                total += s.nbytes
    return total


# ------------------------------------------------------------------------------ dynamic loss scaling


class LossScaler:
    """Dynamic loss scaling for float16: the loss times S, so that small gradients survive float16;
    S halves (and the step is skipped) when a gradient overflows, and doubles after
    `growth_interval` steps in a row without one.

        scaled = scaler.scale(loss); scaled.backward()    # inside autocast
        scaler.unscale(parameters)                         # grads / S in float32; notes inf/nan
        stepped = scaler.step(optimizer)                   # skipped after an overflow
        scaler.update()                                    # S halves, or grows after N clean steps

    init_scale: 2^16, as PyTorch's GradScaler (a guess: too large a guess costs a few skipped
    steps at the start). growth_interval: 200, not PyTorch's 2000 (the docs page says why)."""

    def __init__(self, init_scale=2.0**16, growth_interval=200, growth_factor=2.0, backoff_factor=0.5):
        for name, value in (("init_scale", init_scale), ("growth_factor", growth_factor)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not (math.isfinite(value) and value > 0):
                raise InputError(f"LossScaler: {name} must be a finite number > 0, got {value!r}")
        if not isinstance(backoff_factor, (int, float)) or not 0 < backoff_factor < 1:
            raise InputError(f"LossScaler: backoff_factor must be a number in (0, 1), got {backoff_factor!r}")
        if not isinstance(growth_interval, int) or isinstance(growth_interval, bool) or growth_interval < 1:
            raise InputError(f"LossScaler: growth_interval must be an integer >= 1, got {growth_interval!r}")
        self.scale_value = float(init_scale)
        self.growth_interval, self.growth_factor, self.backoff_factor = growth_interval, float(growth_factor), float(backoff_factor)
        self.clean_steps = 0  # steps in a row without an overflow
        self.skipped_steps = 0  # steps skipped so far
        self.found_inf = False

    def scale(self, loss):
        """loss * S: its backward starts from S instead of 1, so every gradient is S times larger."""
        if not isinstance(loss, Tensor):
            raise InputTypeError(f"LossScaler.scale: expected the loss Tensor, got {describe(loss)}")
        return loss * self.scale_value

    def unscale(self, parameters):
        """Divide each parameter's .grad by S, in float32, in place; note whether any is inf or nan."""
        self.found_inf = False
        inverse = np.float32(1.0 / self.scale_value)
        for p in parameters:
            if p.grad is None:
                continue
            p.grad *= inverse
            if not np.isfinite(p.grad).all():
                self.found_inf = True
        return self.found_inf

    def step(self, optimizer):
        """optimizer.step(), unless unscale found an inf or nan: then the weights stay as they are.
        Returns True when the step was taken."""
        if self.found_inf:
            self.skipped_steps += 1
            return False
        optimizer.step()
        return True

    def update(self):
        """After each step: S times backoff_factor after an overflow, times growth_factor after
        growth_interval clean steps in a row."""
        if self.found_inf:
            self.scale_value *= self.backoff_factor
            self.clean_steps = 0
        else:
            self.clean_steps += 1
            if self.clean_steps == self.growth_interval:
                self.scale_value *= self.growth_factor
                self.clean_steps = 0
        self.found_inf = False

    def state_dict(self):
        return {"scale": self.scale_value, "clean_steps": self.clean_steps, "skipped_steps": self.skipped_steps, "growth_interval": self.growth_interval}

    def load_state_dict(self, state):
        """Put back what state_dict() returned: the scale, the counts, and the growth interval."""
        try:
            scale, clean, skipped = float(state["scale"]), int(state["clean_steps"]), int(state["skipped_steps"])
            interval = int(state.get("growth_interval", self.growth_interval))
        except (AttributeError, KeyError, TypeError, ValueError) as error:
            raise InputError(f"LossScaler.load_state_dict: expected scale, clean_steps and skipped_steps, got {state!r} ({error!r})") from None
        if not (math.isfinite(scale) and scale > 0) or clean < 0 or skipped < 0 or interval < 1:
            raise InputError(f"LossScaler.load_state_dict: a scale > 0, counts >= 0 and an interval >= 1 expected, got {state!r}")
        self.scale_value, self.clean_steps, self.skipped_steps, self.growth_interval = scale, clean, skipped, interval
