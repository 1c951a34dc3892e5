"""The fuzz entries of microtensor/gradcheck.py.

How an entry draws its arguments and judges the call: fuzzing.py."""
import math

import numpy as np

import microtensor as mt
import microtensor.functional as F
from microtensor import Tensor
from fuzzing import fuzz, fuzz_test, run


SMOOTH_OPS = {
    "exp": lambda x: x.exp(),
    "tanh": F.tanh,
    "softmax": lambda x: F.softmax(x, dim=-1),
    "mul": lambda x: x * x,
    "sum": lambda x: x.sum(dim=-1),
    "gelu": F.gelu,
    "log_softmax": lambda x: F.log_softmax(x, dim=0),
}


@fuzz("gradcheck")
def _gradcheck(draw):
    name = draw.choice(tuple(SMOOTH_OPS))
    x = Tensor(draw.rng.uniform(-1, 1, draw.shape(1, 2, 1, 3)), requires_grad=True)
    kind = draw.choice(("float32", "nan", "no grad", "not callable", "a Tensor as inputs")) if draw.rarely() else "valid"
    fn, inputs = SMOOTH_OPS[name], [x]
    if kind == "float32":
        inputs = [Tensor(x.numpy().astype(np.float32), requires_grad=True)]
    elif kind == "nan":
        x.data[(0,) * x.ndim] = np.nan
    elif kind == "no grad":
        x.requires_grad_(False)
    elif kind == "not callable":
        fn = name
    elif kind == "a Tensor as inputs":
        inputs = x
    if kind != "valid":
        draw.mark_invalid(kind)
    options = {}
    for option, good, bad in (("eps", (1e-6, 1e-5), (0, -1e-6, float("nan"), "small")), ("atol", (1e-5, 1e-4), (-1.0, float("inf"))), ("rtol", (1e-3, 0.01), (-0.1, float("nan")))):
        if draw.one_in(3):
            options[option] = draw.choice(bad) if draw.rarely() and draw.boolean() else draw.choice(good)
            if options[option] in bad or (isinstance(options[option], float) and math.isnan(options[option])):
                draw.mark_invalid(f"{option}={options[option]!r}")
    if draw.one_in(5):
        options["max_elements"] = draw.choice((1, 3, 0, -2, 2.0))
        if options["max_elements"] in (0, -2) or isinstance(options["max_elements"], float):
            draw.mark_invalid(f"max_elements={options['max_elements']!r}")

    def expect(result):
        assert result is True, f"gradcheck of a correct {name} returned {result!r}"

    run(draw, "gradcheck", lambda: mt.gradcheck(fn, inputs, **options), expect)


test_fuzz = fuzz_test(__name__)
