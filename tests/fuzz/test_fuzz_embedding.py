"""The fuzz entries of microtensor/ops/embedding.py.

How an entry draws its arguments and judges the call: fuzzing.py."""
import numpy as np

import microtensor.functional as F
from microtensor import Tensor
from fuzzing import assert_close, fuzz, fuzz_test, run


@fuzz("embedding")
def _embedding(draw):
    vocab, dim, dtype = draw.integer(0, 5), draw.integer(0, 4), draw.float_dtype()
    weight = draw.float_operand((vocab, dim), dtype)
    if draw.one_in(10):
        weight = draw.tensor((vocab,), dtype)
        draw.mark_invalid("a 1-d table")
    ids = draw.rng.integers(-1, vocab + 1, draw.shape(0, 2)) if draw.rarely() else draw.rng.integers(0, max(vocab, 1), draw.shape(0, 2))
    if draw.valid and ids.size and (ids.min() < 0 or ids.max() >= vocab):
        draw.mark_invalid("an id out of range")
    kind = draw.choice(("float tensor", "bool array", "huge")) if draw.rarely() else draw.choice(("int64 tensor", "int32 array", "list"))
    if kind == "list" and ids.size == 0:
        kind = "int32 array"  # (a list of an empty shape loses the dims after the first 0)
    if kind == "float tensor" or kind == "bool array":
        draw.mark_invalid(f"ids as a {kind}")
    if kind == "huge":
        ids = np.array([10**6, 2**40], np.int64)[: draw.integer(1, 2)]
        draw.mark_invalid("an id far out of range")
    argument = {
        "int64 tensor": lambda: Tensor(ids.astype(np.int64)),
        "int32 array": lambda: ids.astype(np.int32),
        "list": lambda: ids.tolist(),
        "float tensor": lambda: Tensor(ids.astype(np.float64)),
        "bool array": lambda: ids > 0,
        "huge": lambda: Tensor(ids),
    }[kind]()
    run(draw, "embedding", lambda: F.embedding(argument, weight), lambda result: assert_close("embedding", result, weight.numpy()[ids], exact=True))


test_fuzz = fuzz_test(__name__)
