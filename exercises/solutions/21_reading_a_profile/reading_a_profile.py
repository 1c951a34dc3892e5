"""Exercise 21: reading a profile as a roofline (the reference solution).

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
    if not bytes_moved > 0:
        raise ValueError(f"arithmetic_intensity: bytes_moved must be > 0, got {bytes_moved}")
    return flops / bytes_moved


def attainable(intensity, peak, bandwidth):
    """The FLOP/s an op of this intensity can reach at most on a machine of peak FLOP/s `peak` and
    memory bandwidth `bandwidth` bytes/s: the lower of the two roofs."""
    return min(peak, intensity * bandwidth)


def classify(rows, peak, bandwidth):
    """{(op, phase): COMPUTE_BOUND | MEMORY_BOUND | DATA_MOVEMENT} for the rows whose flops are
    known: DATA_MOVEMENT when flops == 0, else by the intensity against the ridge point
    peak / bandwidth (at or above it: compute-bound)."""
    ridge = peak / bandwidth
    kinds = {}
    for row in rows:
        if row["flops"] is None:
            continue
        if row["flops"] == 0:
            kinds[(row["op"], row["phase"])] = DATA_MOVEMENT
        elif arithmetic_intensity(row["flops"], row["bytes_moved"]) >= ridge:
            kinds[(row["op"], row["phase"])] = COMPUTE_BOUND
        else:
            kinds[(row["op"], row["phase"])] = MEMORY_BOUND
    return kinds


def first_to_optimise(rows, peak, bandwidth):
    """(op, phase) of the row with flops > 0 whose time is furthest above its roof: the largest
    seconds - flops / attainable(intensity)."""

    def headroom(row):
        roof = attainable(arithmetic_intensity(row["flops"], row["bytes_moved"]), peak, bandwidth)
        return row["seconds"] - row["flops"] / roof

    candidates = [row for row in rows if row["flops"]]
    best = max(candidates, key=headroom)
    return best["op"], best["phase"]
