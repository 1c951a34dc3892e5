"""Small helpers shared by the test files."""
import numba
import numpy as np
import pytest

import microtensor as mt
from microtensor.kernels import active
from models import checkpoint

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


# Functions whose registry cases run in the slow suite only (CI runs it too): each new shape of
# the packed multi-head online attention compiles its two large kernels again (size-1 sides change
# the arrays' contiguity flags), which alone would cost a minute of the default run; the default
# run still checks it through tests/test_online_attention.py and the GPT with attention="online".
SLOW_REGISTRY_CASES = {"MultiHeadOnlineAttention"}


def rewrite_checkpoint(folder, change):
    """Rewrite folder's checkpoint with change(arrays) applied to its raw entries (no checks on the way)."""
    path = checkpoint.path_in(folder)
    with np.load(path) as archive:
        arrays = {name: archive[name] for name in archive.files}
    change(arrays)
    np.savez(path, **arrays)
