"""Every Function's backward against finite differences, through the registry of gradcheck cases,
in both kernel sets.

Each op file registers its cases with `@gradcheck_case`; this file runs them all with shapes,
dims and layouts drawn by hypothesis, once with the readable kernels and once with the fast ones
(forward and backward both inside the set), and fails if any Function subclass defined anywhere in
the package has no case, whether or not it is exported.
"""
import importlib
import pkgutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import microtensor
from microtensor.autograd import Function
from microtensor.gradcheck import GRADCHECK_CASES, gradcheck_report
from microtensor.tensor import Tensor
from helpers import SLOW_REGISTRY_CASES
from strategies import HypothesisDraw


def import_every_module():
    """Import every module of the package, so that a Function nobody imports is still found."""
    for module in pkgutil.walk_packages(microtensor.__path__, "microtensor."):
        if not module.name.startswith("microtensor.fast") and module.name != "microtensor.demo":
            importlib.import_module(module.name)


def all_functions():
    import_every_module()
    found, stack = [], [Function]
    while stack:
        for sub in stack.pop().__subclasses__():
            found.append(sub)
            stack.append(sub)
    return [f for f in found if f.__module__.startswith("microtensor.")]


def test_every_function_has_a_gradcheck_case():
    missing = sorted(f"{f.__module__}.{f.__name__}" for f in all_functions() if f not in GRADCHECK_CASES)
    assert not missing, f"Functions without a gradcheck case: {missing}"


CASES = [
    pytest.param(case, id=f"{function.__name__}-{case.__name__.strip('_')}", marks=[pytest.mark.slow] if function.__name__ in SLOW_REGISTRY_CASES else [])
    for function, cases in sorted(GRADCHECK_CASES.items(), key=lambda item: item[0].__name__)
    for case in cases
]


class RecordedData:
    """hypothesis's `data`, keeping what each draw returned, so that a failure can say what was drawn."""

    def __init__(self, data):
        self.data, self.drawn = data, []

    def draw(self, strategy, label=None):
        value = self.data.draw(strategy, label=label)
        self.drawn.append(f"{label}={value}" if label else str(value))
        return value


def describe_inputs(inputs):
    """The drawn inputs in one line: "(2, 3) float64 requires_grad, (2,) int64, -1"."""
    return ", ".join(
        f"{x.shape} {x.dtype}{' requires_grad' if x.requires_grad else ''}" if isinstance(x, Tensor) else repr(x)
        for x in inputs
    )


@pytest.mark.parametrize("case", CASES)
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # kernel_set is the same for every example
@given(data=st.data())
def test_gradcheck(case, data, kernel_set):
    # A failure prints the case, what hypothesis drew, and gradcheck's report, with no traceback:
    # pages of hypothesis's and gradcheck's source would bury the few lines that say what is wrong.
    # (Hypothesis shrinks the example first, and replays it from its database on the next run.)
    data = RecordedData(data)
    fn, inputs, *options = case(HypothesisDraw(data))
    options = options[0] if options else {}
    report = gradcheck_report(fn, inputs, **options)
    if report is not None:
        pytest.fail(
            f"case {case.__module__}.{case.__name__}, {kernel_set} kernels\n"
            f"  hypothesis drew {', '.join(data.drawn)}: inputs {describe_inputs(inputs)}"
            f"{f', options {options}' if options else ''}\n{report}",
            pytrace=False,
        )
