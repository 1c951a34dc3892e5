"""Small helpers shared by the test files."""
import numba
import numpy as np
import pytest

import microtensor as mt
from microtensor.kernels import active

JIT_DISABLED = numba.config.DISABLE_JIT
needs_jit = pytest.mark.skipif(JIT_DISABLED, reason="the fast kernels need Numba's compiler")


def randn(*shape, seed=0, dtype=np.float64):
    """Standard normal values from a generator of their own (the same for the same seed)."""
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def fast_twin_of(readable_kernel):
    """The fast set's kernel for `readable_kernel` (skips the test without the JIT)."""
    if JIT_DISABLED:
        pytest.skip("the fast kernels need Numba's compiler")
    with mt.using_kernels("fast"):
        twin = active(readable_kernel)
    assert twin is not readable_kernel, f"{readable_kernel.__name__} has no fast twin"
    return twin
