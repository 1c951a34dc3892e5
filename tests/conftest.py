import os

import numba
import pytest
from hypothesis import settings

import microtensor as mt

# The first call of a kernel compiles it, so no example may be timed out; examples are few so
# that the whole suite (and its run under NUMBA_DISABLE_JIT=1) stays within minutes.
# Each profile starts from hypothesis's own defaults, not from whatever profile it loaded: where a
# CI variable is set, hypothesis loads its "ci" profile, whose derandomize=True would make
# --hypothesis-seed a no-op and give CI other draws than the same command anywhere else.
HYPOTHESIS_DEFAULTS = settings.get_profile("default")
settings.register_profile("default", HYPOTHESIS_DEFAULTS, deadline=None, max_examples=25, print_blob=True)
settings.register_profile("nojit", HYPOTHESIS_DEFAULTS, deadline=None, max_examples=8, print_blob=True)
settings.register_profile("thorough", HYPOTHESIS_DEFAULTS, deadline=None, max_examples=300, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "nojit" if os.environ.get("NUMBA_DISABLE_JIT") == "1" else "default"))


KERNEL_SETS = [
    "readable",
    pytest.param("fast", marks=pytest.mark.skipif(numba.config.DISABLE_JIT, reason="the fast kernels need Numba's compiler")),
]


@pytest.fixture(params=KERNEL_SETS)
def kernel_set(request):
    """Run the test once with each kernel set (forward and backward both inside it)."""
    with mt.using_kernels(request.param):
        yield request.param


@pytest.fixture(autouse=True)
def one_thread_unless_marked(request):
    """Run Numba's parallel kernels on one thread, except in tests marked `all_threads`.

    Most tests call kernels thousands of times on tensors of a few elements (gradcheck perturbs
    every element), where waking a second thread costs more than the work; and with two test
    workers on two cores, each such call would wait for a core. The tests marked `all_threads`
    (the model in both kernel sets, the engine, matmul, attention on views) run every parallel
    loop on all threads, so the loops are still run split across threads and races would show."""
    if request.node.get_closest_marker("all_threads"):
        yield
        return
    with mt.num_threads(1):
        yield
