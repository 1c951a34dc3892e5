import os

import pytest
from hypothesis import settings

import microtensor as mt

# The first call of a kernel compiles it, so no example may be timed out; examples are few so
# that the whole suite (and its run under NUMBA_DISABLE_JIT=1) stays within minutes.
settings.register_profile("default", deadline=None, max_examples=25, print_blob=True)
settings.register_profile("nojit", deadline=None, max_examples=8, print_blob=True)
settings.register_profile("thorough", deadline=None, max_examples=300, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "nojit" if os.environ.get("NUMBA_DISABLE_JIT") == "1" else "default"))


@pytest.fixture(params=["blas", "numba"])
def matmul_backend(request):
    """Run the test once with each way of computing products: numpy's BLAS and the Numba loops
    (matmul, and attention, whose path follows the same switch)."""
    previous = mt.get_matmul()
    mt.set_matmul(request.param)
    yield request.param
    mt.set_matmul(previous)
