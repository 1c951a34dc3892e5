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
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def to_bfloat16(x):
    """The bfloat16 bit patterns of float32 values: a uint16 array of x's shape. Rounded to nearest,
    ties to even; a value past bfloat16's largest becomes inf; a nan stays a nan. x is not changed."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)  # the same bytes, read as integers
    lowest_kept = (bits >> np.uint32(16)) & np.uint32(1)  # 1 when the kept half is odd
    # 0x7FFF + 1 carries into bit 16 when the lower half is past one half, or is one half exactly
    # and the kept half is odd: that is round to nearest, ties to even
    upper = ((bits + np.uint32(0x7FFF) + lowest_kept) >> np.uint32(16)).astype(np.uint16)
    # a nan whose set mantissa bits are all in the lower half would round to inf (or wrap to 0)
    is_nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(is_nan, np.uint16(0x7FC0), upper)


def loss_scale_step(grads, scale, clean_steps, growth_interval):
    """One step of dynamic loss scaling, after backward ran from loss * scale.

    grads: the parameters' gradients (float32 arrays), S times too large: divide each by S in
    place. scale: S. clean_steps: the steps in a row without an inf or nan before this one.
    Returns (take_step, scale, clean_steps): whether the optimizer may step (no gradient is inf or
    nan), and the S and the count of clean steps for the next step."""
    found_inf = False
    for grad in grads:
        grad /= np.float32(scale)
        if not np.isfinite(grad).all():
            found_inf = True
    if found_inf:
        return False, scale * BACKOFF_FACTOR, 0
    clean_steps += 1
    if clean_steps == growth_interval:
        return True, scale * GROWTH_FACTOR, 0
    return True, scale, clean_steps
