"""Exercise 21: reading a profile as a roofline. The task is in README.md; write the TODOs below.

    I = flops / bytes_moved                  arithmetic intensity (FLOP/byte)
    attainable(I) = min(peak, I * bandwidth) the roofline (FLOP/s)
    ridge point I* = peak / bandwidth        below it memory-bound, at or above it compute-bound
    headroom = seconds - flops / attainable(I)

A row is one op in one phase of `microtensor.debug.profile`'s report, as `report.to_dict()["rows"]`
gives it: a dict with "op", "phase", "seconds", "flops" (None when the profiler cannot count the
op's FLOPs) and "bytes_moved". Nothing is differentiated here.
"""

COMPUTE_BOUND, MEMORY_BOUND, DATA_MOVEMENT = "compute-bound", "memory-bound", "data movement"


def arithmetic_intensity(flops, bytes_moved):
    """FLOPs per byte moved, a float. Raises ValueError unless bytes_moved > 0."""
    # TODO: refuse bytes_moved <= 0 with a ValueError; return flops / bytes_moved.
    raise NotImplementedError("TODO: arithmetic_intensity (exercise 21)")


def attainable(intensity, peak, bandwidth):
    """The FLOP/s an op of this intensity can reach at most on a machine of peak FLOP/s `peak` and
    memory bandwidth `bandwidth` bytes/s: the lower of the two roofs."""
    # TODO: the compute roof is peak; the memory roof is intensity * bandwidth.
    raise NotImplementedError("TODO: attainable (exercise 21)")


def classify(rows, peak, bandwidth):
    """{(op, phase): COMPUTE_BOUND | MEMORY_BOUND | DATA_MOVEMENT} for the rows whose flops are
    known: DATA_MOVEMENT when flops == 0, else by the intensity against the ridge point
    peak / bandwidth (at or above it: compute-bound)."""
    # TODO: skip rows whose flops is None; compare each intensity with the ridge point.
    raise NotImplementedError("TODO: classify (exercise 21)")


def first_to_optimise(rows, peak, bandwidth):
    """(op, phase) of the row with flops > 0 whose time is furthest above its roof: the largest
    seconds - flops / attainable(intensity)."""
    # TODO: the headroom of each row with known flops > 0; return the (op, phase) of the largest.
    raise NotImplementedError("TODO: first_to_optimise (exercise 21)")
