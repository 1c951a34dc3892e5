"""The fuzz entries of microtensor/ops/cross_entropy.py.

How an entry draws its arguments and judges the call: fuzzing.py."""
import numpy as np

import microtensor.functional as F
from microtensor import Tensor
from fuzzing import assert_close, fuzz, fuzz_test, log_softmax_oracle, run


@fuzz("cross_entropy")
def _cross_entropy(draw):
    low = 0 if draw.rarely() else 1  # no rows at all: nothing to average over
    rows = draw.choice(((draw.integer(low, 4),), (draw.integer(low, 2), draw.integer(low, 3))))
    vocab = draw.integer(0 if draw.rarely() else 1, 5)
    logits = draw.float_operand(rows + (vocab,), draw.float_dtype())
    logits_without_classes = draw.one_in(10)
    if logits_without_classes:
        logits = draw.tensor(rows, requires_grad=False)  # no class dim
        draw.mark_invalid("logits of the wrong shape")
    ignore_index = draw.choice((1.5, True)) if draw.rarely() and draw.boolean() else draw.choice((-100, None, -1, -100, None, 0, 2))
    ignores = isinstance(ignore_index, int) and not isinstance(ignore_index, bool)
    if ignore_index is not None and not ignores:
        draw.mark_invalid("ignore_index not an int")
    targets = draw.rng.integers(-1, vocab + 1, rows) if draw.rarely() else draw.rng.integers(0, max(vocab, 1), rows)  # or some out of range
    if ignores:
        targets[draw.rng.random(rows) < 0.3] = ignore_index
    kind = draw.choice(("float tensor", "list", "wrong shape")) if draw.rarely() else draw.choice(("int64 tensor", "int32 tensor", "uint8 array"))
    if kind == "wrong shape" and logits_without_classes:
        kind = "int64 tensor"  # two wrong shapes can fit each other: (1, 2) logits and 1 target is a valid call
    if kind == "uint8 array" and targets.size and targets.min() < 0:
        kind = "int64 tensor"  # uint8 holds no negative target
    kept = [int(t) for t in targets.reshape(-1) if not (ignores and t == ignore_index)]
    if any(t < 0 or t >= vocab for t in kept):
        draw.mark_invalid("a target out of range")
    if not kept:
        draw.mark_invalid("no target to average over")
    if kind in ("float tensor", "list"):
        draw.mark_invalid(f"targets as a {kind}")
    if kind == "wrong shape":
        targets = targets.reshape(-1)[:-1] if targets.size else np.zeros(3, np.int64)
        draw.mark_invalid("targets of the wrong shape")
    argument = {
        "int64 tensor": lambda: Tensor(targets.astype(np.int64)),
        "int32 tensor": lambda: Tensor(targets.astype(np.int32)),
        "uint8 array": lambda: targets.astype(np.uint8),
        "float tensor": lambda: Tensor(targets.astype(np.float32)),
        "list": lambda: targets.tolist(),
        "wrong shape": lambda: Tensor(targets),
    }[kind]()

    def expect(result):
        x = logits.numpy().reshape(-1, vocab).astype(np.float64)
        t = targets.reshape(-1)
        keep = t != ignore_index if ignores else np.ones(t.shape, bool)
        expected = -np.mean(log_softmax_oracle(x[keep], 1)[np.arange(keep.sum()), t[keep]])
        scale = max(1.0, float(np.max(np.abs(np.nan_to_num(x, posinf=0, neginf=0)), initial=0)))
        assert_close("cross_entropy", result, np.asarray(expected, dtype=logits.dtype), scale=scale)

    run(draw, "cross_entropy", lambda: F.cross_entropy(logits, argument, ignore_index), expect)


test_fuzz = fuzz_test(__name__)
