"""Every Function's backward against finite differences, through the registry of gradcheck cases.

Each op file registers its cases with `@gradcheck_case`; this file runs them all with shapes,
dims and layouts drawn by hypothesis, and fails if any Function in the package has no case.
"""
import pytest
from hypothesis import given
from hypothesis import strategies as st

import microtensor  # noqa: F401  (imports every op, which registers its cases)
from microtensor.autograd import Function
from microtensor.gradcheck import GRADCHECK_CASES, gradcheck
from strategies import HypothesisDraw


def all_functions():
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
@given(data=st.data())
def test_gradcheck(case, data):
    fn, inputs, *options = case(HypothesisDraw(data))
    assert gradcheck(fn, inputs, **(options[0] if options else {}))
