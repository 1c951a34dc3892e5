"""Exercise 25: bfloat16 by hand, and loss scaling's rule. The task is in README.md; write the TODOs below.

    float32   s | eeeeeeee | mmmmmmm mmmmmmmmmmmmmmmm      32 bits, as a uint32
    bfloat16  s | eeeeeeee | mmmmmmm                       its upper 16 bits, as a uint16

    from_bfloat16: the 16 bits on top of 16 zero bits
    to_bfloat16: round the lower 16 bits away, to nearest, ties to even; a nan stays a nan
    loss_scale_step: unscale the gradients; skip the step and halve S on inf or nan,
                     double S after growth_interval clean steps in a row
"""
import numpy as np

GROWTH_FACTOR = 2.0  # S after growth_interval clean steps in a row: S * 2
BACKOFF_FACTOR = 0.5  # S after an inf or a nan: S / 2


def from_bfloat16(bits):
    """float32 values of bfloat16 bit patterns (a uint16 array): each the upper half of a float32."""
    bits = np.asarray(bits, dtype=np.uint16)
    # TODO: widen to uint32, shift into the upper half, read the bytes as float32 (README: bfloat16 to float32).
    raise NotImplementedError("TODO: from_bfloat16 (exercise 25)")


def to_bfloat16(x):
    """The bfloat16 bit patterns of float32 values: a uint16 array of x's shape. Rounded to nearest,
    ties to even; a value past bfloat16's largest becomes inf; a nan stays a nan. x is not changed."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)  # the same bytes, read as integers
    # TODO: round the lower 16 bits away with one uint32 addition (to nearest, ties to even), shift
    # the upper 16 down, keep them as uint16, and make every nan input a nan pattern (README:
    # float32 to bfloat16). Stay in uint32: every constant np.uint32(...).
    raise NotImplementedError("TODO: to_bfloat16 (exercise 25)")


def loss_scale_step(grads, scale, clean_steps, growth_interval):
    """One step of dynamic loss scaling, after backward ran from loss * scale.

    grads: the parameters' gradients (float32 arrays), S times too large: divide each by S in
    place. scale: S. clean_steps: the steps in a row without an inf or nan before this one.
    Returns (take_step, scale, clean_steps): whether the optimizer may step (no gradient is inf or
    nan), and the S and the count of clean steps for the next step."""
    # TODO: unscale in place; then the rule (README: Loss scaling's rule, one step).
    raise NotImplementedError("TODO: loss_scale_step (exercise 25)")
