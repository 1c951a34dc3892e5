"""The checks of exercise 5. Run them with `python -m exercises check layer_norm`."""
import numpy as np

import microtensor as mt
import microtensor.functional as F
from exercises.checking import expect, expect_close, float64_arithmetic, gradcheck, random_tensor


def layer_norm_numpy(x, weight, bias, eps=1e-5):
    """LayerNorm over the last dim in numpy: (x - mean) / sqrt(var + eps) * weight + bias."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def test_forward_matches_numpy(impl):
    """the forward equals a numpy LayerNorm (it is given)"""
    x, weight, bias = random_tensor((3, 5), seed=1), random_tensor((5,), seed=2), random_tensor((5,), seed=3)
    expected = layer_norm_numpy(x.numpy(), weight.numpy(), bias.numpy())
    expect_close("layer_norm(x) of shape (3, 5)", impl.layer_norm(x, weight, bias), expected, "numpy's LayerNorm")


def test_input_gradient_rows_sum_to_zero(impl):
    """each row of dL/dx sums to 0 (shifting a row by a constant changes nothing after normalizing)"""
    x, weight, bias = random_tensor((4, 6), seed=4), random_tensor((6,), seed=5), random_tensor((6,), seed=6)
    impl.layer_norm(x, weight, bias).backward(np.random.default_rng(7).normal(size=(4, 6)))
    row_sums = np.asarray(x.grad).sum(axis=-1)
    worst = int(np.argmax(np.abs(row_sums)))
    expect(
        np.all(np.abs(row_sums) < 1e-10),
        f"row {worst} of dL/dx of shape (4, 6) sums to {float(row_sums[worst]):.3g}, expected 0 (to rounding). "
        "The xhat_j term sums to 0 by itself (sum_j xhat_j = 0), so a row sums to 0 only if the mean(d) term "
        "is there and it and the d_j term use the same d_i = g_i w_i (not g_i alone)",
    )


def test_gradients_match_finite_differences(impl):
    """gradcheck: dL/dx, dL/dweight and dL/dbias against finite differences, random upstream"""
    for seed, shape in enumerate([(3, 5), (2, 3, 4), (1, 2), (4, 1, 3), (3, 1)]):  # (3, 1): C = 1, xhat = 0
        C = shape[-1]
        x = random_tensor(shape, seed=10 * seed)
        weight = random_tensor((C,), seed=10 * seed + 1, low=0.5, high=1.5)
        bias = random_tensor((C,), seed=10 * seed + 2)
        gradcheck(lambda x, weight, bias: impl.layer_norm(x, weight, bias), [x, weight, bias])
    x, weight, bias = random_tensor((3, 4), seed=8), random_tensor((4,), seed=9), random_tensor((4,), seed=10)
    gradcheck(lambda x, weight, bias: impl.layer_norm(x, weight, bias), [x, weight, bias])  # weights of either sign


def test_float32_gradients_match_microtensor(impl):
    """in float32 the three gradients equal microtensor's own F.layer_norm's"""
    rng = np.random.default_rng(11)
    values = {
        "x": rng.uniform(-2, 2, size=(2, 3, 5)).astype(np.float32),
        "weight": rng.uniform(0.5, 1.5, size=5).astype(np.float32),
        "bias": rng.uniform(-1, 1, size=5).astype(np.float32),
    }
    upstream = rng.normal(size=(2, 3, 5)).astype(np.float32)
    yours = {name: mt.tensor(v, requires_grad=True) for name, v in values.items()}
    impl.layer_norm(yours["x"], yours["weight"], yours["bias"]).backward(mt.tensor(upstream))
    reference = {name: mt.tensor(v, requires_grad=True) for name, v in values.items()}
    F.layer_norm(reference["x"], reference["weight"], reference["bias"]).backward(mt.tensor(upstream))
    for name in ("x", "weight", "bias"):
        shape = values[name].shape
        expect_close(f"dL/d{name} of shape {shape} in float32", yours[name].grad, reference[name].grad,
                     "F.layer_norm's backward", atol=1e-5, rtol=1e-4)


def test_float32_arithmetic_stays_float32(impl):
    """compiled, both backward kernels compute in float32 for float32 arrays (no bare 0.0, no bare C)"""
    rng = np.random.default_rng(12)
    x = rng.uniform(-2, 2, size=(3, 4)).astype(np.float32)
    weight = rng.uniform(0.5, 1.5, size=4).astype(np.float32)
    grad_y = rng.normal(size=(3, 4)).astype(np.float32)
    mean = x.mean(axis=-1).astype(np.float32)  # (N,)
    rstd = (1 / np.sqrt(x.var(axis=-1) + 1e-5)).astype(np.float32)  # (N,)
    grad_x, grad_weight, grad_bias = np.empty_like(x), np.zeros_like(weight), np.zeros_like(weight)
    arguments_of = {
        "layer_norm_backward_input": (grad_y, x, weight, mean, rstd, grad_x),
        "layer_norm_backward_params": (grad_y, x, mean, rstd, grad_weight, grad_bias),
    }
    for name, arguments in arguments_of.items():
        kernel = getattr(impl, name)
        kernel(*arguments)  # runs at all (not a TODO any more)
        promoted = float64_arithmetic(kernel, *arguments)
        expect(not promoted, f"{name} computes {', '.join(promoted)} in float64 for float32 arrays: a bare Python "
               "number (0.0, or C, an int, in a division) makes float32 math float64 under Numba; "
               "write x.dtype.type(0) and x.dtype.type(C)")
