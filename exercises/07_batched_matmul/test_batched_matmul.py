"""The checks of exercise 7. Run them with `python -m exercises check batched_matmul`."""
import numpy as np

import microtensor as mt
from exercises.checking import CheckFailed, expect, expect_close, float64_arithmetic, gradcheck, random_tensor

BATCH, M, K, N = 2, 3, 4, 5  # every side different: a transposed index cannot go unnoticed


def upstream_gradient(shape, seed, dtype=np.float64):
    return np.random.default_rng(seed).normal(size=shape).astype(dtype)


def gradients(impl, a, b, upstream):
    """dL/da and dL/db through the student's op, for L = sum(C * upstream)."""
    impl.batched_matmul(a, b).backward(mt.tensor(upstream))
    return a.grad, b.grad


def test_forward_matches_numpy(impl):
    """the forward equals numpy's a @ b, with B batched and with B shared"""
    a = random_tensor((BATCH, M, K), seed=1)
    for b in (random_tensor((BATCH, K, N), seed=2), random_tensor((K, N), seed=3)):
        expect_close(f"C for a {a.shape} @ b {b.shape}", impl.batched_matmul(a, b), a.numpy() @ b.numpy(), "numpy's a @ b")


def test_gradcheck_batched(impl):
    """gradcheck, B batched (Bt, K, N): dA and dB against finite differences, random upstream gradient"""
    a, b = random_tensor((BATCH, M, K), seed=4), random_tensor((BATCH, K, N), seed=5)
    gradcheck(impl.batched_matmul, [a, b])


def test_batched_gradients_match_numpy(impl):
    """B batched: dA = dC Bᵀ and dB = Aᵀ dC per batch element, as numpy computes them"""
    a, b = random_tensor((BATCH, M, K), seed=10), random_tensor((BATCH, K, N), seed=11)
    g = upstream_gradient((BATCH, M, N), seed=12)
    grad_a, grad_b = gradients(impl, a, b, g)
    expect_close(f"dL/dA of shape {a.shape}", grad_a, g @ np.swapaxes(b.numpy(), 1, 2), "numpy's dC @ Bᵀ")
    expect_close(f"dL/dB of shape {b.shape}", grad_b, np.swapaxes(a.numpy(), 1, 2) @ g, "numpy's Aᵀ @ dC")


def test_shared_gradients_sum_over_the_batch(impl):
    """B shared: dB = sum over the batch of Aᵀ dC, and dA = dC Bᵀ, as numpy computes them"""
    a, b = random_tensor((BATCH, M, K), seed=13), random_tensor((K, N), seed=14)
    g = upstream_gradient((BATCH, M, N), seed=15)
    grad_a, grad_b = gradients(impl, a, b, g)
    expect_close(f"dL/dA of shape {a.shape}", grad_a, g @ b.numpy().T, "numpy's dC @ Bᵀ")
    per_element = np.swapaxes(a.numpy(), 1, 2) @ g  # (Bt, K, N): each batch element's A[t]ᵀ dC[t]
    if grad_b is not None and grad_b.shape == (K, N):
        for t in range(BATCH):
            expect(
                not np.allclose(grad_b, per_element[t]),
                f"dL/dB of shape {b.shape} equals batch element {t}'s Aᵀ dC alone: B is used by every batch "
                "element, so its gradient is the SUM over t of A[t]ᵀ dC[t]",
            )
    expect_close(f"dL/dB of shape {b.shape}", grad_b, per_element.sum(axis=0), "numpy's sum over t of A[t]ᵀ dC[t]")


def test_gradcheck_shared(impl):
    """gradcheck, B shared (K, N): dA and dB against finite differences, random upstream gradient"""
    a, b = random_tensor((BATCH, M, K), seed=6), random_tensor((K, N), seed=7)
    gradcheck(impl.batched_matmul, [a, b])
    a, b = random_tensor((3, 1, 2), seed=8), random_tensor((2, 3), seed=9)  # rows of one, a batch of 3
    gradcheck(impl.batched_matmul, [a, b])


def test_kernels_write_every_element(impl):
    """the backward kernels write every element of grad_a and grad_b (they arrive holding old values)"""
    a = np.random.default_rng(16).normal(size=(BATCH, M, K))
    g = upstream_gradient((BATCH, M, N), seed=17)
    rng = np.random.default_rng(18)
    cases = (
        (impl.batched_matmul_backward, rng.normal(size=(BATCH, K, N))),  # B batched
        (impl.shared_matmul_backward, rng.normal(size=(K, N))),  # B shared
    )
    for kernel, b in cases:
        grad_a, grad_b = np.full(a.shape, np.nan), np.full(b.shape, np.nan)  # leftovers: NaN shows where one stays
        kernel(g, a, b, grad_a, grad_b)
        name = kernel.__name__
        for what, grad in (("grad_a", grad_a), ("grad_b", grad_b)):
            if np.isnan(grad).any():
                raise CheckFailed(
                    f"{name}: {int(np.isnan(grad).sum())} of {grad.size} elements of {what} {grad.shape} still hold "
                    "what was there before (NaN here): write every element, or set it to 0 before adding into it"
                )


def test_float32_matches_microtensor(impl):
    """in float32 the gradients equal microtensor's own matmul's (both layouts)"""
    rng = np.random.default_rng(20)
    a_values = rng.normal(size=(BATCH, M, K)).astype(np.float32)
    for b_shape in ((BATCH, K, N), (K, N)):
        b_values = rng.normal(size=b_shape).astype(np.float32)
        g = upstream_gradient((BATCH, M, N), seed=21, dtype=np.float32)
        a, b = mt.tensor(a_values, requires_grad=True), mt.tensor(b_values, requires_grad=True)
        grad_a, grad_b = gradients(impl, a, b, g)
        a_ref, b_ref = mt.tensor(a_values, requires_grad=True), mt.tensor(b_values, requires_grad=True)
        (a_ref @ b_ref).backward(mt.tensor(g))
        layout = "B batched" if len(b_shape) == 3 else "B shared"
        expect_close(f"dL/dA in float32, {layout}", grad_a, a_ref.grad, "microtensor's a @ b", atol=1e-5, rtol=1e-5)
        expect_close(f"dL/dB in float32, {layout}", grad_b, b_ref.grad, "microtensor's a @ b", atol=1e-5, rtol=1e-5)


def test_float32_arithmetic_stays_float32(impl):
    """compiled, both backward kernels compute in float32 for float32 arrays (no bare 0.0)"""
    rng = np.random.default_rng(22)
    a = rng.normal(size=(BATCH, M, K)).astype(np.float32)
    g = upstream_gradient((BATCH, M, N), seed=23, dtype=np.float32)
    for kernel, b_shape in ((impl.batched_matmul_backward, (BATCH, K, N)), (impl.shared_matmul_backward, (K, N))):
        b = rng.normal(size=b_shape).astype(np.float32)
        arguments = (g, a, b, np.empty_like(a), np.empty_like(b))
        kernel(*arguments)  # runs at all (not a TODO any more)
        promoted = float64_arithmetic(kernel, *arguments)
        expect(not promoted, f"{kernel.__name__} computes {', '.join(promoted)} in float64 for float32 arrays: "
               "a bare Python number such as 0.0 is a float64 to Numba; start each sum at a.dtype.type(0)")
