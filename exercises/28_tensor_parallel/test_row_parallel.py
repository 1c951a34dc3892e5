"""The checks of exercise 28. Run them with `python -m exercises check tensor_parallel`."""
import numpy as np

import microtensor as mt
from exercises.checking import expect, expect_close, gradcheck, random_tensor


def shards(x, weight, k):
    """x's columns and W's rows, cut into k equal slices: new leaf tensors."""
    n = weight.shape[0] // k
    xs = [mt.tensor(x[:, r * n : (r + 1) * n].copy(), requires_grad=True) for r in range(k)]
    ws = [mt.tensor(weight[r * n : (r + 1) * n].copy(), requires_grad=True) for r in range(k)]
    return xs, ws


def test_the_forward_is_the_unsplit_product_on_every_rank(impl):
    """every rank's copy equals x W (k = 1, 2, 4); the partials are left as they were"""
    x, weight = random_tensor((3, 8), seed=1).numpy(), random_tensor((8, 5), seed=2).numpy()
    for k in (1, 2, 4):
        xs, ws = shards(x, weight, k)
        outputs = impl.row_parallel_linear(xs, ws)
        expect(isinstance(outputs, list) and len(outputs) == k, f"row_parallel_linear over {k} ranks: expected a list of {k} tensors, got {type(outputs).__name__}")
        for r, y in enumerate(outputs):
            expect_close(f"rank {r}'s copy of x W, k = {k}", y.numpy(), x @ weight, "the unsplit x @ W")
    partials = [np.ones((2, 3)), np.full((2, 3), 2.0)]
    before = [p.copy() for p in partials]
    impl.AllReduce.forward(None, *partials)
    expect(all(np.array_equal(p, b) for p, b in zip(partials, before)), "AllReduce.forward changed an input: add into a new array")


def test_the_all_reduce_matches_finite_differences(impl):
    """gradcheck of AllReduce, a random upstream gradient for every rank's copy"""
    partials = [random_tensor((2, 3), seed=10 + r) for r in range(3)]
    gradcheck(lambda *ps: impl.AllReduce.apply(*ps), partials)


def test_the_shards_gradients_are_the_unsplit_ones(impl):
    """x_r and W_r's gradients are the unsplit Linear's columns and rows (k = 2, 4)"""
    x, weight = random_tensor((3, 8), seed=20).numpy(), random_tensor((8, 5), seed=21).numpy()
    grad_y = np.random.default_rng(22).normal(size=(3, 5))
    x_full, w_full = mt.tensor(x, requires_grad=True), mt.tensor(weight, requires_grad=True)
    ((x_full @ w_full) * mt.tensor(grad_y)).sum().backward()
    for k in (2, 4):
        for reader in ("rank 0's copy", "the mean of every copy"):
            xs, ws = shards(x, weight, k)
            outputs = impl.row_parallel_linear(xs, ws)
            if reader == "rank 0's copy":
                loss = (outputs[0] * mt.tensor(grad_y)).sum()
            else:
                loss = sum((y * mt.tensor(grad_y / k)).sum() for y in outputs)
            loss.backward()
            n = 8 // k
            for r in range(k):
                expect_close(f"x_{r}'s gradient, k = {k}, loss from {reader}", xs[r].grad, x_full.grad[:, r * n : (r + 1) * n], "the unsplit x's gradient, its columns")
                expect_close(f"W_{r}'s gradient, k = {k}, loss from {reader}", ws[r].grad, w_full.grad[r * n : (r + 1) * n], "the unsplit W's gradient, its rows")
