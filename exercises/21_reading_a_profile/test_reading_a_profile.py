"""The checks of exercise 21. Run them with `python -m exercises check reading_a_profile`."""
import numpy as np

import microtensor as mt
import microtensor.debug as debug
import microtensor.functional as F
from exercises.checking import expect, expect_close, expect_raises

PEAK, BANDWIDTH = 100e9, 10e9  # a machine of 100 GFLOP/s and 10 GB/s: its ridge point is 10 FLOP/byte


def row(op, seconds, flops, bytes_moved, phase="forward"):
    return {"op": op, "phase": phase, "seconds": seconds, "flops": flops, "bytes_moved": bytes_moved}


def test_intensity_of_a_matmul_and_of_gelu(impl):
    """intensity = FLOPs / bytes: a (64, 64) @ (64, 64) float32 product is 64 / 6, GELU's 9 / 8"""
    n = 64
    expect_close("arithmetic_intensity of a (64, 64) @ (64, 64) float32 matmul", impl.arithmetic_intensity(2 * n**3, 3 * n * n * 4),
                 n / 6, "2 n³ FLOPs over 3 n² float32 numbers")  # fmt: skip
    expect_close("arithmetic_intensity of GELU on 1000 float32 numbers", impl.arithmetic_intensity(9 * 1000, 8 * 1000), 9 / 8,
                 "9 FLOPs and 8 bytes per element")  # fmt: skip
    expect_raises("arithmetic_intensity(10, 0)", (ValueError,), impl.arithmetic_intensity, 10, 0)


def test_the_roofline_has_two_roofs(impl):
    """attainable(I) = min(peak, I · bandwidth): the memory roof below the ridge point, the peak above it"""
    for intensity, expected in ((1.0, 10e9), (5.0, 50e9), (10.0, 100e9), (40.0, 100e9)):
        expect_close(f"attainable({intensity}) on a 100 GFLOP/s, 10 GB/s machine", impl.attainable(intensity, PEAK, BANDWIDTH),
                     expected, "min(peak, intensity * bandwidth)")  # fmt: skip


def test_classify_worked_by_hand(impl):
    """the ridge point is peak / bandwidth: at or above it compute-bound, below memory-bound; no FLOPs is data movement"""
    rows = [
        row("MatMul", 0.010, 2e9, 40e6),  # 50 FLOP/byte
        row("MatMul", 0.020, 4e9, 60e6, "backward"),  # 66.7
        row("GELU", 0.004, 9e6, 8e6),  # 1.1
        row("Ridge", 0.001, 10e6, 1e6),  # exactly 10: compute-bound
        row("Reshape", 1e-6, 0, 4e6),
        row("Mystery", 0.001, None, 4e6),  # no FLOP rule: left out
    ]
    kinds = impl.classify(rows, PEAK, BANDWIDTH)
    expected = {("MatMul", "forward"): "compute-bound", ("MatMul", "backward"): "compute-bound", ("GELU", "forward"): "memory-bound",
                ("Ridge", "forward"): "compute-bound", ("Reshape", "forward"): "data movement"}  # fmt: skip
    expect(isinstance(kinds, dict), f"classify must return a dict {{(op, phase): kind}}, got {type(kinds).__name__}")
    expect(("Mystery", "forward") not in kinds, "a row whose flops is None (the profiler could not count them) is left out")
    for key, kind in expected.items():
        expect(kinds.get(key) == kind, f"classify: {key} is {kinds.get(key)!r}, expected {kind!r} (ridge point 10 FLOP/byte)")


def test_the_first_to_optimise_is_the_one_furthest_above_its_roof(impl):
    """the largest headroom (seconds - flops / attainable), not the largest time"""
    rows = [
        row("MatMul", 0.030, 2.9e9, 40e6),  # at 100 GFLOP/s it needs 29 ms: 1 ms of headroom
        row("GELU", 0.012, 9e6, 8e6),  # its roof: 1.125 FLOP/byte × 10 GB/s, 0.8 ms: 11.2 ms of headroom
        row("Add", 0.004, 1e6, 12e6),  # 1.2 ms at its roof: 2.8 ms
        row("Reshape", 0.050, 0, 1e6),  # no FLOPs: not a candidate
        row("Mystery", 0.050, None, 1e6),
    ]
    chosen = impl.first_to_optimise(rows, PEAK, BANDWIDTH)
    expect(
        tuple(chosen) == ("GELU", "forward"),
        f"first_to_optimise: yours {chosen}, expected ('GELU', 'forward'): MatMul takes the most time but runs at its roof "
        "(1 ms to gain), GELU is 11.2 ms above its memory roof",
    )


def test_a_live_profile_of_a_matmul_and_a_gelu(impl):
    """on microtensor.debug.profile's own rows: the matmul compute-bound, GELU and its backward memory-bound"""
    x = mt.randn(64, 64, requires_grad=True)  # a matmul of 64 / 6 FLOP/byte, above the ridge point of 10
    w = mt.randn(64, 64, requires_grad=True)
    with debug.profile(show=False, gemm_peak=PEAK) as prof:
        F.gelu(x @ w, approximate="tanh").sum().backward()
    rows = prof.report.to_dict()["rows"]
    kinds = impl.classify(rows, PEAK, BANDWIDTH)
    for key, kind in ((("MatMul", "forward"), "compute-bound"), (("MatMul", "backward"), "compute-bound"),
                      (("GELU", "forward"), "memory-bound"), (("GELU", "backward"), "memory-bound")):  # fmt: skip
        expect(kinds.get(key) == kind, f"classify of a live profile: {key} is {kinds.get(key)!r}, expected {kind!r}")
    for r in rows:
        if r["flops"]:
            expect_close(f"arithmetic_intensity of the profile's {r['op']} ({r['phase']})", impl.arithmetic_intensity(r["flops"], r["bytes_moved"]),
                         r["intensity"], "the profiler's own FLOP/byte column")  # fmt: skip
    chosen = impl.first_to_optimise(rows, PEAK, BANDWIDTH)
    expect(tuple(chosen) in {(r["op"], r["phase"]) for r in rows if r["flops"]}, f"first_to_optimise returned {chosen}, not a row with FLOPs")
    expect(np.isfinite(prof.report.flops) and prof.report.flops > 0, "the profile counted no FLOPs")
