import os

import numba
import pytest
from hypothesis import settings

import microtensor as mt

# The first call of a kernel compiles it, so no example may be timed out; examples are few so
# that the whole suite (and its run under NUMBA_DISABLE_JIT=1) stays within minutes.
settings.register_profile("default", deadline=None, max_examples=25, print_blob=True)
settings.register_profile("nojit", deadline=None, max_examples=8, print_blob=True)
settings.register_profile("thorough", deadline=None, max_examples=300, print_blob=True)
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
