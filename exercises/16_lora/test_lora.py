"""The checks of exercise 16. Run them with `python -m exercises check lora`."""
import numpy as np

import microtensor as mt
import microtensor.functional as F
from exercises.checking import CheckFailed, expect, expect_close, expect_equal, gradcheck, random_tensor
from gpt.model.electives.lora import LoRALinear as MicrotensorLoRALinear

N_IN, N_OUT, RANK, ALPHA = 4, 5, 2, 3.0  # s = α / r = 1.5: a scale forgotten anywhere shows


def layer(seed, dtype=np.float64, shape=(3, N_IN, N_OUT, RANK)):
    """x (N, in), W (in, out) frozen, A (in, r), B (r, out) nonzero (so every path carries a gradient)."""
    N, n_in, n_out, rank = shape
    x = random_tensor((N, n_in), seed=seed, dtype=dtype)
    weight = random_tensor((n_in, n_out), seed=seed + 1, dtype=dtype, requires_grad=False)
    lora_a = random_tensor((n_in, rank), seed=seed + 2, dtype=dtype)
    lora_b = random_tensor((rank, n_out), seed=seed + 3, dtype=dtype)
    return x, weight, lora_a, lora_b


def run(function, x, weight, lora_a, lora_b, upstream):
    """y and the gradients of x, A and B (copies of the inputs, so two runs do not mix)."""
    inputs = [mt.tensor(t.numpy(), requires_grad=True) for t in (x, lora_a, lora_b)]
    y = function(inputs[0], weight, inputs[1], inputs[2])
    try:
        y.backward(mt.tensor(upstream))
    except mt.GraphError as error:  # the engine's shape and dtype check, in a student's words
        raise CheckFailed(f"backward in {y.dtype}: {error} (each gradient keeps its input's shape and dtype)") from None
    return y, [t.grad for t in inputs]


def constant_factor(yours, expected, rtol):
    """c when yours = c · expected in every element (to rtol), else None."""
    yours, expected = np.asarray(yours, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    if yours.shape != expected.shape or not np.all(np.abs(expected) > 1e-6):
        return None
    ratios = yours / expected
    factor = float(ratios.flat[0])
    return factor if np.allclose(ratios, factor, rtol=rtol, atol=0) else None


def name_the_mistake(what, yours, expected, scale, rtol, where=""):
    """Fail with a sentence when yours is expected times s or 1/s (a factor s doubled or missing)."""
    factor = constant_factor(yours, expected, rtol)
    if factor is None or abs(factor - 1) < 100 * rtol:
        return
    for value, name, verdict in ((1 / scale, "1/s", "is missing"), (scale, "s", "is applied twice")):
        if abs(factor - value) < 100 * rtol * value:
            raise CheckFailed(
                f"{what}: yours is F.lora_linear's times {factor:.4g} = {name} everywhere{where}: "
                f"a factor s = {scale} {verdict} (one s multiplies the low-rank term of y)"
            )
    raise CheckFailed(f"{what}: yours is F.lora_linear's times {factor:.4g} everywhere{where}: a constant factor is off")


def test_matches_microtensor_lora_linear(impl):
    """y and the gradients equal microtensor's F.lora_linear, in float64 and in float32 (kept float32)"""
    scale = ALPHA / RANK
    for dtype, atol, rtol in [(np.float64, 1e-12, 1e-9), (np.float32, 1e-5, 1e-5)]:
        x, weight, lora_a, lora_b = layer(10, dtype)
        upstream = np.random.default_rng(11).normal(size=(3, N_OUT)).astype(dtype)
        mine = run(lambda x, w, a, b: impl.lora_linear(x, w, a, b, ALPHA), x, weight, lora_a, lora_b, upstream)
        reference = run(lambda x, w, a, b: F.lora_linear(x, w, None, a, b, scale), x, weight, lora_a, lora_b, upstream)
        name = np.dtype(dtype).name
        expect_close(f"y (3, {N_OUT}) in {name}", mine[0], reference[0], "F.lora_linear", atol=atol, rtol=1e-5)
        base_path = upstream.astype(np.float64) @ weight.numpy().T.astype(np.float64)  # g Wᵀ (3, 4), in numpy
        for what, grad, expected in zip(("dL/dx (3, 4)", "dL/dA (4, 2)", "dL/dB (2, 5)"), mine[1], reference[1]):
            what = f"{what} in {name}"
            expect(grad is not None, f"{what}: no gradient reached it (did backward return None there?)")
            name_the_mistake(what, grad, expected, scale, rtol)
            if what.startswith("dL/dx"):
                yours, theirs = np.asarray(grad, dtype=np.float64), np.asarray(expected, dtype=np.float64)
                expect(not np.allclose(yours, theirs - base_path, rtol=1e-4, atol=1e-6),
                       f"{what} lacks the path through W: x reaches y along two paths, x W and s (x A) B, "
                       "and dx is the sum of both paths' gradients")  # fmt: skip
                name_the_mistake(what, yours - base_path, theirs - base_path, scale, 1e-4, " in the path through A and B")
            expect_close(what, grad, expected, "F.lora_linear's backward", atol=atol, rtol=1e-5)


def test_gradients_match_finite_differences(impl):
    """gradcheck: dL/dx, dL/dA and dL/dB against finite differences, random upstream, B nonzero"""
    for seed, shape, alpha in [(1, (3, N_IN, N_OUT, RANK), ALPHA), (5, (2, 3, 6, 1), 0.5)]:
        x, weight, lora_a, lora_b = layer(seed, shape=shape)
        gradcheck(lambda x, lora_a, lora_b: impl.lora_linear(x, weight, lora_a, lora_b, alpha), [x, lora_a, lora_b])


def test_the_frozen_weight_gets_no_gradient(impl):
    """W gets no gradient, even when it is a Tensor that requires one: the base stays frozen"""
    x, weight, lora_a, lora_b = layer(20)
    weight = mt.tensor(weight.numpy(), requires_grad=True)
    impl.lora_linear(x, weight, lora_a, lora_b, ALPHA).backward(mt.tensor(np.ones((3, N_OUT))))
    expect(weight.grad is None, "W received a gradient: backward must return None for the weight (it is frozen, and dW would cost as much as the forward)")
    expect(x.grad is not None and lora_a.grad is not None and lora_b.grad is not None, "x, A and B must each receive a gradient")


def test_init_starts_as_the_base_layer(impl):
    """init: A uniform in ±1/√in from rng, B = 0, and then the output is exactly x W"""
    n_in, n_out, rank = 64, 6, 8
    for dtype in (np.float64, np.float32):
        lora_a, lora_b = impl.init_adapter(n_in, n_out, rank, np.random.default_rng(0), dtype)
        name = np.dtype(dtype).name
        expect(lora_a.shape == (n_in, rank) and lora_b.shape == (rank, n_out),
               f"init_adapter({n_in}, {n_out}, {rank}): A {lora_a.shape} and B {lora_b.shape}, expected ({n_in}, {rank}) and ({rank}, {n_out})")  # fmt: skip
        expect(lora_a.dtype == dtype and lora_b.dtype == dtype, f"init_adapter in {name} gave A {lora_a.dtype} and B {lora_b.dtype}")
        expect_equal(f"B ({rank}, {n_out}) at init", lora_b, np.zeros((rank, n_out), dtype=dtype), "zeros")
        bound = 1 / np.sqrt(n_in)
        spread = lora_a.std() / (bound / np.sqrt(3))  # a uniform on [-b, b] has standard deviation b / √3
        expect(np.abs(lora_a).max() <= bound * (1 + 1e-6) and 0.85 < spread < 1.15,
               f"A at init: values in [{lora_a.min():.4f}, {lora_a.max():.4f}] with std {lora_a.std():.4f}; "
               f"expected uniform in ±1/√in = ±{bound:.4f} (std {bound / np.sqrt(3):.4f})")  # fmt: skip
    first, again, other = (impl.init_adapter(n_in, n_out, rank, np.random.default_rng(seed))[0] for seed in (0, 0, 1))
    expect(np.array_equal(first, again) and not np.array_equal(first, other),
           "init_adapter must draw A from the rng it is given: the same seed must give the same A, another seed another A")  # fmt: skip
    x = random_tensor((3, N_IN), seed=30, requires_grad=False)
    weight = random_tensor((N_IN, N_OUT), seed=31, requires_grad=False)
    lora_a, lora_b = impl.init_adapter(N_IN, N_OUT, RANK, np.random.default_rng(2))
    y = impl.lora_linear(x, weight, mt.tensor(lora_a), mt.tensor(lora_b), ALPHA)
    expect_equal("y at init (B = 0)", y, x.numpy() @ weight.numpy(), "x W computed by numpy (bit for bit)")


def test_merge_gives_the_same_layer(impl):
    """merge: W + (α/r) A B equals gpt.model.electives.lora's merged weight, and x W' equals the LoRA output"""
    for dtype, atol in [(np.float64, 1e-12), (np.float32, 1e-5)]:
        x, weight, lora_a, lora_b = layer(40, dtype)
        merged = impl.merge(weight.numpy(), lora_a.numpy(), lora_b.numpy(), ALPHA)
        linear = mt.nn.Linear(N_IN, N_OUT, bias=False, dtype=dtype)
        linear.weight.data = weight.numpy().copy()
        reference = MicrotensorLoRALinear(linear, RANK, ALPHA)
        reference.lora_a.data, reference.lora_b.data = lora_a.numpy().copy(), lora_b.numpy().copy()
        name = np.dtype(dtype).name
        expect_close(f"the merged weight ({N_IN}, {N_OUT}) in {name}", merged, reference.merged_weight(),
                     "gpt.model.electives.lora.LoRALinear.merged_weight", atol=atol, rtol=1e-5)  # fmt: skip
        y = impl.lora_linear(x, weight, lora_a, lora_b, ALPHA)
        expect_close(f"x W' with your merged weight, in {name}", x.numpy() @ merged, y, "the LoRA layer's y", atol=atol, rtol=1e-5)
