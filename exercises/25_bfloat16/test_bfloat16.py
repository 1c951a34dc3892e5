"""The checks of exercise 25. Run them with `python -m exercises check bfloat16`.

The references are written another way than the task asks: bfloat16 values from Python's own
float32 bytes (struct) and exact fractions, and loss scaling's rule as a table worked by hand; and
PyTorch's torch.bfloat16 and its GradScaler's kernels where torch is installed."""
import struct
from fractions import Fraction

import numpy as np

from exercises.checking import CheckSkipped, expect, expect_equal

INF_BITS = 0x7F80  # bfloat16's +inf: exponent all ones, mantissa 0


def float32_of(bits32):
    """The float32 whose bits are the integer bits32, as a Python float (exact)."""
    return struct.unpack("<f", struct.pack("<I", bits32))[0]


def bfloat16_value(pattern):
    """The exact value of a non-negative bfloat16 pattern below inf; 0x7F80 counts as 2^128, where
    the next step past the largest bfloat16 lands (IEEE rounds to inf from half a step past it)."""
    return Fraction(2) ** 128 if pattern == INF_BITS else Fraction(float32_of(pattern << 16))


def nearest_bfloat16(bits32):
    """The bfloat16 pattern nearest the float32 with bits `bits32` (not a nan), ties to the even
    pattern: found by comparing the exact distances to the two neighbours, not by bit arithmetic."""
    sign, magnitude = bits32 >> 31, bits32 & 0x7FFFFFFF
    if magnitude == 0x7F800000:
        return (sign << 15) | INF_BITS
    value = Fraction(float32_of(magnitude))
    below = magnitude >> 16  # the truncated pattern: its value is at most x's, the next one's above
    above = below + 1
    to_below, to_above = value - bfloat16_value(below), bfloat16_value(above) - value
    if to_below == to_above:
        nearest = below if below % 2 == 0 else above
    else:
        nearest = below if to_below < to_above else above
    return (sign << 15) | nearest


def is_nan_pattern(pattern):
    return (pattern & 0x7F80) == 0x7F80 and (pattern & 0x007F) != 0


def chosen_patterns():
    """float32 bit patterns (uint32) where rounding is decided: every kind of upper half (zero,
    subnormal, the smallest normal, 1, odd and even kept halves, the largest finite, inf), each with
    lower halves just under, at and over one half, and 0 and the largest; both signs; and random ones."""
    uppers = [0x0000, 0x0001, 0x0002, 0x007F, 0x0080, 0x0081, 0x3F80, 0x3F81, 0x3F82, 0x4049, 0x7F7E, 0x7F7F]
    lowers = [0x0000, 0x0001, 0x7FFE, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFF]
    patterns = [(upper << 16) | lower for upper in uppers for lower in lowers] + [0x7F800000]
    random = np.random.default_rng(25).integers(0, 0x7F800000, size=1500, dtype=np.uint32)  # finite, positive
    positive = np.concatenate([np.array(patterns, dtype=np.uint32), random])
    return np.concatenate([positive, positive | np.uint32(0x80000000)])


def rounding_slip(bits32, yours, expected):
    """What a wrong pattern says about the rounding written."""
    truncated = bits32 >> 16
    lower = bits32 & 0xFFFF
    if yours == truncated and expected != truncated:
        return "yours is the upper half cut off (truncation): round to nearest"
    if lower == 0x8000 and yours != expected:
        return "the lower half is exactly one half (a tie): go to the neighbour whose last kept bit is 0 (even)"
    return "compare the lower half with one half, 0x8000"


def test_from_bfloat16_reads_every_pattern(impl):
    """from_bfloat16 of all 65,536 patterns equals the float32 whose upper half they are"""
    patterns = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    values = impl.from_bfloat16(patterns)
    expect(isinstance(values, np.ndarray) and values.dtype == np.float32 and values.shape == (65536,),
           f"from_bfloat16 of 65536 patterns: expected a float32 array (65536,), got {getattr(values, 'dtype', type(values))} {np.shape(values)}")  # fmt: skip
    expected = np.array([struct.unpack(">f", struct.pack(">HH", int(p), 0))[0] for p in patterns], dtype=np.float32)
    nan = np.isnan(expected)  # a float32 nan's payload may change on its way through a Python float: compare nan-ness
    expect_equal("which patterns from_bfloat16 reads as nan", np.isnan(values), nan, "Python's float32 of the bytes (pattern, 0x0000)")
    expect_equal("from_bfloat16's float32 bits, every pattern but the nans", values[~nan].view(np.uint32),
                 expected[~nan].view(np.uint32), "Python's float32 of the bytes (pattern, 0x0000)")  # fmt: skip
    square = impl.from_bfloat16(np.array([[0x3F80, 0xC000], [0x7F80, 0x0001]], dtype=np.uint16))
    expect(square.shape == (2, 2), f"from_bfloat16 of a (2, 2) array returned shape {square.shape}: keep the input's shape")


def test_to_bfloat16_rounds_to_nearest_even(impl):
    """to_bfloat16 rounds to nearest, ties to even: each chosen float32 against its exact nearest"""
    bits = chosen_patterns()
    x = bits.view(np.float32)
    before = x.copy()
    yours = impl.to_bfloat16(x)
    expect(isinstance(yours, np.ndarray) and yours.dtype == np.uint16 and yours.shape == x.shape,
           f"to_bfloat16 of {x.shape[0]} float32 values: expected a uint16 array {x.shape}, got {getattr(yours, 'dtype', type(yours))} {np.shape(yours)}")  # fmt: skip
    expect(np.array_equal(x.view(np.uint32), before.view(np.uint32)), "to_bfloat16 changed its input: work on new arrays")
    for b, y in zip(bits.tolist(), yours.tolist()):
        expected = nearest_bfloat16(b)
        if y != expected:
            expect(False, f"to_bfloat16 of the float32 0x{b:08X} ({float32_of(b)!r}): yours 0x{y:04X}, expected 0x{expected:04X}, "
                          f"the nearest bfloat16 (exact distances to 0x{b >> 16:04X} and the next); {rounding_slip(b, y, expected)}")  # fmt: skip
    square = impl.to_bfloat16(np.ones((2, 3), dtype=np.float32))
    expect(square.shape == (2, 3), f"to_bfloat16 of a (2, 3) array returned shape {square.shape}: keep the input's shape")


def test_to_bfloat16_keeps_nan_and_inf(impl):
    """a nan stays a nan (its bits in the lower half too), ±inf stays ±inf, past the largest is inf"""
    nans = np.array([0x7FC00000, 0x7F800001, 0x7F808000, 0x7FFFFFFF, 0xFF800001, 0xFFFFFFFF, 0x7FBFFFFF], dtype=np.uint32)
    for b, y in zip(nans.tolist(), impl.to_bfloat16(nans.view(np.float32)).tolist()):
        if not is_nan_pattern(y):
            what = "inf" if y & 0x7FFF == INF_BITS else ("0" if y & 0x7FFF == 0 else f"a number, {float32_of(y << 16)!r}")
            expect(False, f"to_bfloat16 of the nan 0x{b:08X}: yours 0x{y:04X}, which is {what}; expected a nan (exponent 0xFF, "
                          "mantissa not 0): adding to a nan's bits can carry into the exponent or past bit 31; set nans apart")  # fmt: skip
    edges = np.array([np.inf, -np.inf, 3.4e38, -3.4e38, 3.38e38], dtype=np.float32)
    expect_equal("to_bfloat16 of inf, -inf, 3.4e38, -3.4e38 and 3.38e38", impl.to_bfloat16(edges),
                 np.array([0x7F80, 0xFF80, 0x7F80, 0xFF80, 0x7F7E], dtype=np.uint16),
                 "IEEE: 3.4e38 is more than half a step past bfloat16's largest, 3.39e38")  # fmt: skip


def test_to_bfloat16_matches_pytorch(impl):
    """to_bfloat16 equals PyTorch's torch.bfloat16 on 100,000 random bit patterns (skipped without torch)"""
    try:
        import torch  # only now: the import takes seconds, and an unfinished file has already stopped above
    except ImportError:
        raise CheckSkipped("torch is not installed") from None
    bits = np.random.default_rng(2500).integers(0, 2**32, size=100_000, dtype=np.uint32)
    bits = np.concatenate([bits, chosen_patterns()])
    x = bits.view(np.float32)
    expected = torch.from_numpy(x.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    yours = impl.to_bfloat16(x)
    nan = np.isnan(x)
    expect(np.all((yours[nan] & 0x7F80 == 0x7F80) & (yours[nan] & 0x7F != 0)), "to_bfloat16 turned a nan into a number or inf")
    expect_equal(f"to_bfloat16 of {int((~nan).sum())} random float32 values (no nans)", yours[~nan], expected[~nan], "torch's .to(torch.bfloat16)")


# Loss scaling: S = 2^16 at first, a growth interval of 3; each step's gradients are clean, or hold
# an inf or a nan. The table gives, after each step: whether the optimizer steps, S, the clean count.
STEPS = ["clean", "clean", "clean", "inf", "clean", "inf", "nan", "clean", "clean", "clean", "clean"]
EXPECTED = [
    (True, 2.0**16, 1), (True, 2.0**16, 2), (True, 2.0**17, 0),  # three clean steps in a row: S doubles
    (False, 2.0**16, 0),  # an inf: no step, S halves, the count starts again
    (True, 2.0**16, 1),
    (False, 2.0**15, 0), (False, 2.0**14, 0),  # an inf, then a nan: halved twice
    (True, 2.0**14, 1), (True, 2.0**14, 2), (True, 2.0**15, 0), (True, 2.0**15, 1),
]  # fmt: skip


def gradients(kind, seed):
    """Two float32 gradients of a scaled loss; one element inf or nan for those steps."""
    rng = np.random.default_rng(seed)
    grads = [rng.normal(size=(3, 4)).astype(np.float32) * 1000, rng.normal(size=5).astype(np.float32)]
    if kind != "clean":
        grads[1][2] = np.inf if kind == "inf" else np.nan
    return grads


def test_loss_scale_rule(impl):
    """eleven steps of clean, inf and nan gradients: the step taken or skipped, S and the clean count"""
    scale, clean_steps = 2.0**16, 0
    for number, (kind, expected) in enumerate(zip(STEPS, EXPECTED), 1):
        result = impl.loss_scale_step(gradients(kind, number), scale, clean_steps, 3)
        expect(isinstance(result, tuple) and len(result) == 3, f"loss_scale_step returned {result!r}: expected (take_step, scale, clean_steps)")
        take_step, scale, clean_steps = result
        after = f"step {number} ({kind} gradients; the steps so far: {', '.join(STEPS[:number])}; growth interval 3)"
        expect(bool(take_step) == expected[0], f"{after}: take_step {take_step!r}, expected {expected[0]}")
        expect(scale == expected[1], f"{after}: S = {scale!r}, expected {expected[1]!r}")
        expect(clean_steps == expected[2], f"{after}: clean_steps = {clean_steps!r}, expected {expected[2]}"
               + (" (the count starts again after S grows, and after an overflow)" if expected[2] == 0 else ""))  # fmt: skip


def test_loss_scale_unscales_in_place(impl):
    """each gradient is divided by S in place, in float32 (the same arrays, S a power of 2: exact)"""
    grads = gradients("clean", 50)
    arrays, expected = list(grads), [g / np.float32(2.0**10) for g in grads]
    impl.loss_scale_step(grads, 2.0**10, 0, 3)
    for index, (array, grad, want) in enumerate(zip(arrays, grads, expected)):
        expect(grad is array, f"grads[{index}] is a new list entry: divide the arrays in place (grad /= S), the parameters hold them")
        expect(array.dtype == np.float32, f"grads[{index}] became {array.dtype}: keep float32")
        expect_equal(f"grads[{index}] after loss_scale_step with S = 2^10", array, want, "the gradient of the scaled loss / S")


def test_loss_scale_matches_pytorch(impl):
    """200 steps with random overflows equal PyTorch's GradScaler kernels (skipped without torch)"""
    try:
        import torch
    except ImportError:
        raise CheckSkipped("torch is not installed") from None
    rng = np.random.default_rng(77)
    scale, clean_steps = 2.0**16, 0
    torch_scale, torch_clean = torch.tensor([2.0**16]), torch.tensor([0], dtype=torch.int32)
    for number in range(1, 201):
        kind = rng.choice(["clean"] * 6 + ["inf", "nan"])
        grads = gradients(kind, 100 + number)
        torch_grads = [torch.from_numpy(g.copy()) for g in grads]
        found_inf = torch.zeros(1)
        torch._amp_foreach_non_finite_check_and_unscale_(torch_grads, found_inf, 1.0 / torch_scale)
        torch._amp_update_scale_(torch_scale, torch_clean, found_inf, 2.0, 0.5, 5)
        take_step, scale, clean_steps = impl.loss_scale_step(grads, scale, clean_steps, 5)
        after = f"step {number} ({kind} gradients, growth interval 5)"
        expect(bool(take_step) == (found_inf.item() == 0), f"{after}: take_step {take_step!r}, GradScaler's found_inf {found_inf.item()}")
        expect((scale, clean_steps) == (torch_scale.item(), torch_clean.item()),
               f"{after}: S = {scale!r}, clean_steps = {clean_steps!r}; GradScaler: {torch_scale.item()!r}, {torch_clean.item()}")  # fmt: skip
        if take_step:
            for index, (grad, reference) in enumerate(zip(grads, torch_grads)):
                expect_equal(f"{after}: grads[{index}] unscaled", grad, reference.numpy(), "GradScaler's unscale")
