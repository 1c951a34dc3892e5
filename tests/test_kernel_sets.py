"""The switch between the two kernel sets, and what keeps them honest.

- Every registered op (every gradcheck case) gives the same output and the same input gradients
  with the readable kernels and with the fast ones, in float64 and in float32.
- An edit to any source file is seen on the next run, in every kernel that calls the edited code.
- Importing microtensor changes nothing outside it.
The whole GPT is compared across the sets in tests/test_gpt.py.
"""
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numba
import numpy as np
import pytest

import microtensor as mt
from microtensor.gradcheck import GRADCHECK_CASES, RandomDraw
from microtensor.ops.electives.quantize import quantize, quantized_matmul
from microtensor.tensor import Tensor
from helpers import SLOW_REGISTRY_CASES, needs_jit

ROOT = Path(__file__).resolve().parents[1]

# Tolerances between the sets: the same formulas with sums taken in another order (and, in the fast
# set, e^x, tanh and erf from vectorizable formulas accurate to a few ulp).
FLOAT64 = dict(rtol=1e-9, atol=1e-11)
FLOAT32 = dict(rtol=2e-4, atol=2e-5)

CASES = [
    pytest.param(function, case, id=f"{function.__name__}-{case.__name__.strip('_')}", marks=[pytest.mark.slow] if function.__name__ in SLOW_REGISTRY_CASES else [])
    for function, cases in sorted(GRADCHECK_CASES.items(), key=lambda item: item[0].__name__)
    for case in cases
]


def as_dtype(value, dtype):
    if isinstance(value, Tensor) and value.dtype.kind == "f":
        return Tensor(value.data.astype(dtype), requires_grad=value.requires_grad)
    return value


def run(kernel_set, fn, inputs, upstream_seed):
    """The output and every input's gradient of fn(*inputs) with one kernel set."""
    with mt.using_kernels(kernel_set):
        for x in inputs:
            if isinstance(x, Tensor):
                x.grad = None
        mt.manual_seed(0)  # dropout draws from the global generator
        out = fn(*inputs)
        upstream = np.random.default_rng(upstream_seed).standard_normal(out.shape).astype(out.dtype)
        out.backward(mt.tensor(upstream))
        grads = [x.grad.copy() if isinstance(x, Tensor) and x.grad is not None else None for x in inputs]
    return out.data.copy(), grads


@needs_jit
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("function, case", CASES)
def test_both_kernel_sets_agree(function, case, dtype):
    tolerance = FLOAT64 if dtype == np.float64 else FLOAT32
    for seed in range(3):
        fn, inputs, *_ = case(RandomDraw(seed))
        inputs = [as_dtype(x, dtype) for x in inputs]
        readable_out, readable_grads = run("readable", fn, inputs, seed)
        fast_out, fast_grads = run("fast", fn, inputs, seed)
        assert readable_out.dtype == fast_out.dtype
        scale = max(1.0, float(np.abs(readable_out).max(initial=0)))
        np.testing.assert_allclose(fast_out, readable_out, rtol=tolerance["rtol"], atol=tolerance["atol"] * scale)
        for index, (readable, fast) in enumerate(zip(readable_grads, fast_grads)):
            assert (readable is None) == (fast is None), f"input {index}: a gradient in one set only"
            if readable is not None:
                scale = max(1.0, float(np.abs(readable).max(initial=0)))
                np.testing.assert_allclose(
                    fast, readable, rtol=tolerance["rtol"], atol=tolerance["atol"] * scale,
                    err_msg=f"{function.__name__}: gradient of input {index}, seed {seed}",
                )  # fmt: skip


# --------------------------------------------------------------------------------- the switch


def test_the_switch_and_its_errors():
    before = mt.get_kernels()
    with mt.using_kernels("readable"):
        assert mt.get_kernels() == "readable"
    assert mt.get_kernels() == before
    with pytest.raises(ValueError, match=r"set_kernels: unknown kernel set 'turbo'; expected one of \('readable', 'fast'\)"):
        mt.set_kernels("turbo")
    assert mt.get_kernels() == before


def test_the_environment_variable_chooses_the_default():
    for name in ("readable", "fast") if not numba.config.DISABLE_JIT else ("readable",):
        code = "import microtensor as mt; print(mt.get_kernels())"
        out = subprocess.run(
            [sys.executable, "-c", code], env=dict(os.environ, MICROTENSOR_KERNELS=name), capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == name
    bad = subprocess.run(
        [sys.executable, "-c", "import microtensor as mt; mt.functional.softmax(mt.ones(3))"],
        env=dict(os.environ, MICROTENSOR_KERNELS="turbo"), capture_output=True, text=True,
    )  # fmt: skip
    assert "the environment variable MICROTENSOR_KERNELS: unknown kernel set 'turbo'" in bad.stderr


def test_without_the_jit_the_readable_set_is_the_only_one():
    code = textwrap.dedent(
        """
        import microtensor as mt
        print(mt.get_kernels())
        try:
            mt.set_kernels("fast")
        except ValueError as error:
            print(error)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=dict(os.environ, NUMBA_DISABLE_JIT="1"), capture_output=True, text=True, check=True
    )
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "readable"
    assert "the fast kernels need Numba's compiler, and NUMBA_DISABLE_JIT=1 is set" in lines[1]


def test_set_matmul_is_an_alias_that_says_so():
    before = mt.get_kernels()
    try:
        with pytest.warns(DeprecationWarning, match=r'set_matmul\("numba"\) is now set_kernels\("readable"\)'):
            mt.set_matmul("numba")
        assert mt.get_kernels() == "readable"
    finally:
        mt.set_kernels(before)


# --------------------------------------------------------------------------------- no stale code


EDITED_HELPER_SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import microtensor as mt
import microtensor.functional as F
assert mt.__file__.startswith(sys.argv[1]), mt.__file__  # the copy, not the checkout
x = mt.tensor(np.array([[0.0, 1.0, 2.0]], dtype=np.float32))
with mt.using_kernels(sys.argv[2]):
    print(repr(float(F.softmax(x, dim=-1).numpy().sum())), repr(float(F.gelu(x).numpy()[0, 2])))
"""


def run_copy(folder, kernel_set):
    out = subprocess.run(
        [sys.executable, "-c", EDITED_HELPER_SCRIPT, str(folder), kernel_set],
        capture_output=True, text=True, check=True, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"),
    )  # fmt: skip
    return out.stdout.split()


def edit(path, old, new):
    text = path.read_text()
    assert old in text, f"{path.name} no longer holds {old!r}: update this test"
    path.write_text(text.replace(old, new, 1))


@pytest.mark.slow
@needs_jit
def test_an_edited_helper_in_another_file_is_seen_on_the_next_run(tmp_path):
    """Fast kernels call e^r's polynomial from fast/vector_math.py; doubling it there must change
    softmax and GELU on the next run, although neither kernel's own file changed (Numba's own cache
    would keep the old kernels). The readable set must keep giving the right values."""
    shutil.copytree(ROOT / "microtensor", tmp_path / "microtensor", ignore=shutil.ignore_patterns("__pycache__"))
    before = run_copy(tmp_path, "fast")
    assert run_copy(tmp_path, "fast") == before  # the second run loads the cached kernels
    assert abs(float(before[0]) - 1) < 1e-6
    vector_math = tmp_path / "microtensor" / "fast" / "vector_math.py"
    edit(vector_math, "    return p * r + real(1)\n", "    return 2 * (p * r + real(1))\n")  # float32's, the first
    after = run_copy(tmp_path, "fast")
    assert after != before and abs(float(after[0]) - 1) < 1e-6  # softmax's sum still 1 (the 2 cancels)...
    assert float(after[1]) != float(before[1])  # ...but GELU's tanh, built from e^t, changed
    readable = run_copy(tmp_path, "readable")
    assert abs(float(readable[1]) - float(before[1])) < 1e-6


@pytest.mark.slow
@needs_jit
def test_an_edited_readable_kernel_is_seen_on_the_next_run(tmp_path):
    shutil.copytree(ROOT / "microtensor", tmp_path / "microtensor", ignore=shutil.ignore_patterns("__pycache__"))
    before = run_copy(tmp_path, "readable")
    assert abs(float(before[0]) - 1) < 1e-6
    checks = tmp_path / "microtensor" / "checks.py"  # a file no kernel lives in
    edit(checks, '"""Every check of', '"""(edited) Every check of')
    assert run_copy(tmp_path, "readable") == before  # recompiled, same values
    gelu = tmp_path / "microtensor" / "ops" / "gelu.py"
    edit(gelu, "        y[i] = x[i] * s\n", "        y[i] = two * x[i] * s\n")
    after = run_copy(tmp_path, "readable")
    assert after[0] == before[0] and float(after[1]) == pytest.approx(2 * float(before[1]), rel=1e-6)


# --------------------------------------------------------------------------------- no side effects


SIDE_EFFECTS_SCRIPT = """
import ctypes, glob, json, os, sys
import numpy as np

def blas_threads():
    here = os.path.dirname(np.__file__)
    for path in glob.glob(os.path.join(here, "../numpy.libs/*openblas*")) + glob.glob(os.path.join(here, ".libs/*openblas*")):
        library = ctypes.CDLL(path)
        for name in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads"):
            if hasattr(library, name):
                return getattr(library, name)()
    return None

def state():
    return {"environ": dict(os.environ), "blas_threads": blas_threads()}

before = state()
import microtensor as mt
import microtensor.functional as F
after_import = state()
x = mt.randn(64, 96, requires_grad=True)
w = mt.randn(96, 128, requires_grad=True)
qkv = mt.randn(2, 8, 3 * 16, requires_grad=True)
loss = F.softmax(x @ w, dim=-1).sum() + F.multi_head_attention(qkv, 2).sum()
loss.backward()
after_use = state()
print(json.dumps([before, after_import, after_use, mt.get_kernels()]))
"""


def test_importing_and_using_microtensor_changes_nothing_outside_it():
    import json

    out = subprocess.run([sys.executable, "-c", SIDE_EFFECTS_SCRIPT], capture_output=True, text=True, check=True)
    before, after_import, after_use, kernel_set = json.loads(out.stdout)
    assert after_import["environ"] == before["environ"]
    assert after_use["environ"] == before["environ"]
    assert after_import["blas_threads"] == before["blas_threads"]
    assert after_use["blas_threads"] == before["blas_threads"]
    assert kernel_set == ("readable" if numba.config.DISABLE_JIT else "fast")


def test_microtensor_may_be_imported_after_numpy_or_before():
    for order in ("import numpy, microtensor", "import microtensor, numpy"):
        subprocess.run([sys.executable, "-c", f"{order}; microtensor.randn(3, 3).sum()"], check=True)


# --------------------------------------------------------------------------------- float32 stays float32


def compiled_kernels():
    """Every kernel of both sets that the package defines (Numba dispatchers), by qualified name."""
    import importlib
    import pkgutil

    import microtensor.fast  # noqa: F401

    found = {}
    for module_info in pkgutil.walk_packages(mt.__path__, "microtensor."):
        if module_info.name == "microtensor.demo":
            continue
        module = importlib.import_module(module_info.name)
        for name, value in vars(module).items():
            if isinstance(value, numba.core.registry.CPUDispatcher) and value.py_func.__module__ == module.__name__:
                found[f"{module.__name__}.{name}"] = value
    return found


# Kernels that compute in float64 on purpose, and why (their docstrings say so too).
DELIBERATE_FLOAT64 = {
    "microtensor.ops.electives.quantize.quantize_groups": "the quotient w / s in float64, so a float32 weight gets the code a float64 one would",
}


@pytest.mark.slow  # it compiles every float32 kernel again, uncached: 20 s of the default run's 5 minutes
@needs_jit
def test_float32_kernels_do_their_arithmetic_in_float32():
    """A Python number literal (`1 + x`, `0.5 * x`) can make a float32 kernel compute in float64.
    Run a float32 GPT step and generation in both sets, then compile again every kernel that was
    called with float32 arrays, for those argument types (one memory layout of each), and look at
    the types Numba inferred for its variables and arithmetic."""
    from gpt.model.transformer import GPT, GPTConfig

    for kernel_set in ("readable", "fast"):
        with mt.using_kernels(kernel_set):
            for options in (dict(), dict(norm="rmsnorm", mlp="swiglu", pos="rope", tie_weights=False, bias=True), dict(mixer="ssm", d_state=3)):
                mt.manual_seed(0)
                model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, **options))
                optimizer = mt.optim.AdamW(model.parameters(), lr=1e-3)
                idx = mt.tensor(np.arange(12).reshape(2, 6) % 11)
                _, loss = model(idx, idx)
                loss.backward()
                optimizer.step()
                model.generate(idx[:1, :3], 4, temperature=0)
                import microtensor.functional as F

                x = mt.randn(3, 5, requires_grad=True)
                (F.gelu(x, approximate="none") + F.silu(x) + F.log_softmax(x, dim=-1)).sum().backward()
                for bits, group_size in ((8, None), (4, 2)):  # the quantized kernels of generate.py --quantize
                    quantized_matmul(mt.randn(2, 4), quantize(mt.randn(4, 3), bits, group_size))
    promoted, checked = {}, 0
    for name, dispatcher in compiled_kernels().items():
        if name in DELIBERATE_FLOAT64:
            continue
        seen = set()  # the arithmetic's types do not depend on the arrays' layouts: one of each is enough
        for signature in dispatcher.signatures:
            if not any(isinstance(t, numba.types.Array) and t.dtype == numba.float32 for t in signature):
                continue
            without_layouts = tuple((t.dtype, t.ndim) if isinstance(t, numba.types.Array) else t for t in signature)
            if without_layouts in seen:
                continue
            seen.add(without_layouts)
            fresh = numba.njit(dispatcher.py_func)  # a compilation of our own, with type annotations
            fresh.compile(signature)
            checked += 1
            typemap = fresh.overloads[signature].type_annotation.typemap
            names = [n for n, t in typemap.items() if t == numba.float64 and (not n.startswith("$") or n.startswith("$binop"))]
            if names:
                promoted[name] = names
    assert checked >= 20, f"only {checked} float32 kernels were found: is the search still right?"
    assert not promoted, f"float64 arithmetic in float32 kernels: {promoted}"



@needs_jit
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(), (5,), (3, 7), (12, 64, 128)])
@pytest.mark.parametrize("which", ["add_gradients", "add_arrays"])
def test_the_sum_of_two_arrays_is_numpys_bit_for_bit(shape, dtype, which):
    """The walk adds the gradients reaching one tensor along two paths, and Add's forward two
    arrays of one shape; the fast twins add them on every thread, element by element (numpy below a
    page per thread): the same sums as numpy's, in a new array."""
    from microtensor import autograd
    from microtensor.fast import memory
    from microtensor.ops import elementwise

    readable = {"add_gradients": autograd.add_gradients, "add_arrays": elementwise.add_arrays}[which]
    rng = np.random.default_rng(len(shape))
    held, more = (np.asarray(rng.standard_normal(shape)).astype(dtype) for _ in range(2))
    for a, b in ((held, more), (held.T, more.T)):  # transposed: numpy's own sum
        total = getattr(memory, which)(a, b)
        np.testing.assert_array_equal(total, readable(a, b))
        assert not np.shares_memory(total, a) and not np.shares_memory(total, b)


@needs_jit
@pytest.mark.parametrize("size", [7, 12 * 64 * 128])  # on the calling thread, and shared among the threads
def test_the_copy_of_a_first_gradient_is_exact_and_new(size):
    """The fast copy_gradient (the elements in bands, one per thread, from a page per thread) gives
    the gradient's values bit for bit, in a new array."""
    from microtensor.fast import memory

    grad = np.random.default_rng(size).standard_normal(size).astype(np.float32).reshape(-1, 1)
    copy = memory.copy_gradient(grad)
    np.testing.assert_array_equal(copy, grad)
    assert copy.shape == grad.shape and not np.shares_memory(copy, grad)


@needs_jit
def test_worth_sharing_counts_the_threads_in_use():
    """The rule of a page of numbers per thread counts the threads in use (mt.num_threads), which
    may be fewer than the pool's; it asks how many only when the size alone does not settle it."""
    from microtensor.fast import memory

    page = memory.MIN_ELEMENTS_PER_THREAD
    for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
        with mt.num_threads(threads):
            assert memory.worth_sharing(page * threads)
            assert not memory.worth_sharing(page * threads - 1)


@needs_jit
def test_a_sum_is_shared_among_the_threads_from_a_page_per_thread(monkeypatch):
    """The default recipe's residual stream (12 × 64 × 128) is added by all the threads; a sum of
    less than a page of numbers per thread is numpy's, on the calling thread."""
    from microtensor.fast import memory

    ran = []
    monkeypatch.setattr(memory, "add_elements", lambda held, more, total: ran.append(held.size))
    threads = numba.get_num_threads()
    for size in (12 * 64 * 128, memory.MIN_ELEMENTS_PER_THREAD * threads, memory.MIN_ELEMENTS_PER_THREAD * threads - 1):
        memory.add_gradients(np.ones(size, np.float32), np.ones(size, np.float32))
    assert ran == [12 * 64 * 128, memory.MIN_ELEMENTS_PER_THREAD * threads]


@needs_jit
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size", [7, 40_000])  # on the calling thread, and shared among the threads
def test_the_optimizers_fast_updates_are_the_readable_ones_bit_for_bit(size, dtype):
    """The fast twins share the elements among the threads, each element updated by the same
    arithmetic: equal, not merely close."""
    from microtensor import optim
    from microtensor.fast import optimizer

    rng = np.random.default_rng(size)
    param, grad, m, v = (rng.standard_normal(size).astype(dtype) for _ in range(4))
    v = np.abs(v)
    adam = [dtype(s) for s in (1e-3, 0.9, 0.99, 1e-8, 0.1, 0.01, 0.1, 0.01)]
    for readable_update, fast_update, arrays, scalars in (
        (optim.adamw_update, optimizer.adamw_update, (param, grad, m, v), adam),
        (optim.sgd_update, optimizer.sgd_update, (param, grad, m), adam[:3]),
    ):
        readable_arrays, fast_arrays = [a.copy() for a in arrays], [a.copy() for a in arrays]
        readable_update(*readable_arrays, *scalars)
        fast_update(*fast_arrays, *scalars)
        for readable_array, fast_array in zip(readable_arrays, fast_arrays):
            np.testing.assert_array_equal(fast_array, readable_array)


def test_the_cache_key_reads_every_source_and_no_cached_kernel(tmp_path, monkeypatch):
    """sources_hash, the key of the on-disk kernel cache, changes with an edit to any source of the
    package or a new one, sees microtensor/fast/ only for fast kernels, and never walks into the
    __pycache__ folders (hundreds of cached kernels: every kernel made walks the package)."""
    from microtensor import kernels

    package = tmp_path / "package"
    (package / "fast").mkdir(parents=True)
    (package / "__pycache__").mkdir()
    (package / "ops.py").write_text("a = 1\n")
    (package / "fast" / "twin.py").write_text("b = 1\n")
    monkeypatch.setattr(kernels, "PACKAGE_DIR", package)
    monkeypatch.setattr(kernels, "FAST_DIR", package / "fast")
    readable, fast = kernels.sources_hash(package / "ops.py"), kernels.sources_hash(package / "ops.py", include_fast=True)
    (package / "__pycache__" / "left_over.py").write_text("c = 1\n")
    assert kernels.sources_hash(package / "ops.py") == readable, "a file in __pycache__ is no source"
    (package / "fast" / "twin.py").write_text("b = 22\n")
    assert kernels.sources_hash(package / "ops.py") == readable, "a readable kernel never imports microtensor/fast/"
    assert kernels.sources_hash(package / "ops.py", include_fast=True) != fast
    (package / "ops.py").write_text("a = 333\n")
    edited = kernels.sources_hash(package / "ops.py")
    assert edited != readable
    (package / "new.py").write_text("d = 1\n")
    assert kernels.sources_hash(package / "ops.py") != edited
