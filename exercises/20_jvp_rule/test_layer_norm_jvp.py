"""The checks of exercise 20. Run them with `python -m exercises check jvp_rule`."""
import numpy as np

import microtensor as mt
from exercises.checking import CheckFailed, expect, expect_close, gradcheck, random_tensor
from microtensor.gradcheck import JvpcheckError

SHAPES = [(3, 5), (2, 3, 4), (1, 2), (4, 1, 3), (3, 1)]  # (3, 1): C = 1, xhat = 0


def layer_norm_numpy(x, weight, bias, eps=1e-5):
    """LayerNorm over the last dim in numpy: (x - mean) / sqrt(var + eps) * weight + bias."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def _inputs(shape, seed, dtype=np.float64):
    C = shape[-1]
    x = random_tensor(shape, seed=seed, dtype=dtype)
    weight = random_tensor((C,), seed=seed + 1, low=0.5, high=1.5, dtype=dtype)
    bias = random_tensor((C,), seed=seed + 2, dtype=dtype)
    return x, weight, bias


def _tangent_of_xhat(impl, x, tangent):
    """Your normalized_tangent(tangent, xhat, rstd) for rows x (N, C), xhat and rstd from numpy."""
    mean = x.mean(axis=1, keepdims=True)  # (N, 1)
    rstd = 1 / np.sqrt(((x - mean) ** 2).mean(axis=1, keepdims=True) + 1e-5)  # (N, 1)
    xhat = (x - mean) * rstd  # (N, C)
    rows = np.asarray(impl.normalized_tangent(tangent, xhat, rstd))
    expect(rows.shape == x.shape, f"normalized_tangent returned shape {rows.shape} for a tangent of shape {x.shape}; dxhat has xhat's shape")
    return rows, xhat


def test_forward_matches_numpy(impl):
    """the forward equals a numpy LayerNorm (it is given)"""
    x, weight, bias = _inputs((3, 5), seed=1)
    expected = layer_norm_numpy(x.numpy(), weight.numpy(), bias.numpy())
    expect_close("layer_norm(x) of shape (3, 5)", impl.layer_norm(x, weight, bias), expected, "numpy's LayerNorm")


def test_given_backward_passes_gradcheck(impl):
    """gradcheck: the given backward against finite differences (the reference your JVP is held to)"""
    x, weight, bias = _inputs((3, 4), seed=2)
    gradcheck(lambda x, weight, bias: impl.layer_norm(x, weight, bias), [x, weight, bias])


def test_tangent_rows_sum_to_zero(impl):
    """the mean term: each row of normalized_tangent's dxhat sums to 0"""
    x = np.random.default_rng(4).uniform(-2, 2, size=(4, 6))
    tangent = np.random.default_rng(5).normal(size=(4, 6)) + 1.0  # rows of non-zero mean
    rows, _ = _tangent_of_xhat(impl, x, tangent)
    sums = rows.sum(axis=1)
    worst = int(np.argmax(np.abs(sums)))
    expect(
        np.all(np.abs(sums) < 1e-10),
        f"row {worst} of dxhat (shape (4, 6)) sums to {float(sums[worst]):.3g}, "
        "expected 0: every row of xhat has mean 0 whatever x is, so its tangent's rows do too. The − mean(tx) "
        "term (moving x moves μ) is missing, or it is not the mean of the same tx as the first term",
    )


def test_tangent_is_orthogonal_to_xhat(impl):
    """the variance term: normalized_tangent's dxhat is orthogonal to xhat (to within ε)"""
    x = np.random.default_rng(6).uniform(-2, 2, size=(4, 6))
    xhat = layer_norm_numpy(x, 1.0, 0.0)
    tangent = np.random.default_rng(7).normal(size=(4, 6)) + 2 * xhat  # a part along xhat, which must vanish
    rows, xhat = _tangent_of_xhat(impl, x, tangent)
    cosines = np.sum(rows * xhat, axis=1) / (np.linalg.norm(rows, axis=1) * np.linalg.norm(xhat, axis=1))
    worst = int(np.argmax(np.abs(cosines)))
    expect(
        np.all(np.abs(cosines) < 1e-4),
        f"row {worst} of dxhat (shape (4, 6)) is at cos {float(cosines[worst]):.3g} "
        "to xhat's row, expected about 0: every row of xhat has |xhat|² = C (up to ε), so it can only "
        "turn, and its tangent is orthogonal to it. The − xhat ⊙ mean(xhat ⊙ tx) term (moving x moves σ², so r) "
        "is missing or has the wrong sign or factor",
    )


def test_tangent_has_the_outputs_shape_and_dtype(impl):
    """the tangent has the output's shape and dtype (float64 and float32)"""
    for dtype in (np.float64, np.float32):
        x, weight, bias = _inputs((2, 3, 4), seed=3, dtype=dtype)
        tangents = tuple(np.ones(t.shape, dtype=dtype) for t in (x, weight, bias))
        out, tangent_y = mt.jvp(lambda x, w, b: impl.layer_norm(x, w, b), (x, weight, bias), tangents)
        expect(tangent_y.shape == out.shape and tangent_y.dtype == out.dtype,
               f"your tangent has shape {tangent_y.shape} and dtype {tangent_y.dtype}; the output has shape "
               f"{out.shape} and dtype {out.dtype}, and a tangent lives in the output's space")


def test_weight_and_bias_tangents(impl):
    """the tangents of weight and bias alone: dy = xhat ⊙ tw + tb"""
    x, weight, bias = _inputs((3, 5), seed=8)
    rng = np.random.default_rng(9)
    tangent_weight, tangent_bias = rng.normal(size=5), rng.normal(size=5)
    xhat = layer_norm_numpy(x.numpy(), 1.0, 0.0)
    for name, tangents, expected in (
        ("weight", (None, tangent_weight, None), xhat * tangent_weight),
        ("bias", (None, None, tangent_bias), np.broadcast_to(tangent_bias, (3, 5))),
    ):
        _, tangent_y = mt.jvp(lambda x, w, b: impl.layer_norm(x, w, b), (x, weight, bias), tangents)
        expect_close(f"dy along the tangent of {name} alone, shape (3, 5)", tangent_y, expected, f"dy = xhat ⊙ tw + tb")


def test_jvp_matches_finite_differences(impl):
    """jvpcheck: your dy against finite differences of the forward, x, weight and bias moving together"""
    for seed, shape in enumerate(SHAPES):
        inputs = _inputs(shape, seed=10 * seed + 20)
        try:
            mt.jvpcheck(lambda x, weight, bias: impl.layer_norm(x, weight, bias), list(inputs), seed=seed)
        except JvpcheckError as error:
            raise CheckFailed(f"for inputs of shape {shape}: {error}") from None


def test_jvp_agrees_with_the_backward(impl):
    """the dot-product test: <u, J v> from your JVP equals <Jᵀ u, v> from the given backward"""
    for seed, shape in enumerate(SHAPES):
        inputs = _inputs(shape, seed=10 * seed + 70)
        try:
            mt.dot_product_check(lambda x, weight, bias: impl.layer_norm(x, weight, bias), list(inputs), seed=seed)
        except JvpcheckError as error:
            raise CheckFailed(f"for inputs of shape {shape}: {error}") from None
