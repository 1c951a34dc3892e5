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
from microtensor.gradcheck import GRADCHECK_CASES, gradcheck
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
    pytest.param(case, id=f"{function.__name__}-{case.__name__.strip('_')}")
    for function, cases in sorted(GRADCHECK_CASES.items(), key=lambda item: item[0].__name__)
    for case in cases
]


@pytest.mark.parametrize("case", CASES)
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # kernel_set is the same for every example
@given(data=st.data())
def test_gradcheck(case, data, kernel_set):
    fn, inputs, *options = case(HypothesisDraw(data))
    assert gradcheck(fn, inputs, **(options[0] if options else {}))
