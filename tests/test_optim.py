"""Optimizers, gradient clipping and the learning-rate schedule, against formulas computed by hand.
Tests taking `kernel_set` run once with each kernel set (the update kernels have no fast twins
today; these tests would hold one to the same formulas, to the last bit in float32)."""
import math

import numpy as np
import pytest

import microtensor.nn as nn
import microtensor.optim as optim
from microtensor.optim import SGD, Adam, AdamW, clip_grad_norm, cosine_with_warmup, weight_decay_groups


def make_params(dtype=np.float64, seed=0, shapes=((3, 4), (4,))):
    rng = np.random.default_rng(seed)
    return [nn.Parameter(rng.standard_normal(shape).astype(dtype)) for shape in shapes]


def grads_for_steps(params, steps, seed=1):
    """A different random gradient for every step and every parameter."""
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(p.shape).astype(p.dtype) for p in params] for _ in range(steps)]


def run(optimizer, params, grads):
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.copy()
        optimizer.step()
    return [p.data.copy() for p in params]


# ================================================================================= Adam and AdamW


@pytest.mark.parametrize("decoupled", [False, True], ids=["Adam", "AdamW"])
def test_first_three_steps_match_the_formulas(decoupled, kernel_set):
    lr, beta1, beta2, eps, wd = 0.01, 0.8, 0.95, 1e-6, 0.1
    params = make_params()
    start = [p.data.copy() for p in params]
    grads = grads_for_steps(params, 3)
    cls = AdamW if decoupled else Adam
    result = run(cls(params, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd), params, grads)

    for k, p0 in enumerate(start):  # the same updates, written out by hand in float64
        p, m, v = p0.copy(), np.zeros_like(p0), np.zeros_like(p0)
        for t in (1, 2, 3):
            g = grads[t - 1][k] + (0.0 if decoupled else wd * p)
            m = beta1 * m + (1 - beta1) * g
            v = beta2 * v + (1 - beta2) * g**2
            m_hat = m / (1 - beta1**t)
            v_hat = v / (1 - beta2**t)
            p = p - lr * m_hat / (np.sqrt(v_hat) + eps) - (lr * wd * p if decoupled else 0.0)
        np.testing.assert_allclose(result[k], p, rtol=1e-13, atol=1e-15)


def test_first_adam_step_moves_each_weight_by_lr():
    # With m and v bias-corrected, step 1 is lr * g / (|g| + eps): a move of ~lr against the sign of g.
    params = make_params()
    start = [p.data.copy() for p in params]
    grads = grads_for_steps(params, 1)
    run(Adam(params, lr=0.1, eps=0.0), params, grads)
    for p, p0, g in zip(params, start, grads[0]):
        np.testing.assert_allclose(p.data, p0 - 0.1 * np.sign(g), rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adamw_without_weight_decay_equals_adam_bit_for_bit(dtype):
    grads = grads_for_steps(make_params(dtype), 5)
    results = []
    for cls in (Adam, AdamW):
        params = make_params(dtype)
        results.append(run(cls(params, lr=0.01, weight_decay=0.0), params, grads))
    for a, b in zip(*results):
        assert np.array_equal(a, b)


def test_adamw_decay_differs_from_adam_l2():
    # The two kinds of weight decay are not the same update (a test that they could be told apart).
    grads = grads_for_steps(make_params(), 3)
    results = []
    for cls in (Adam, AdamW):
        params = make_params()
        results.append(run(cls(params, lr=0.01, weight_decay=0.5), params, grads))
    assert not np.allclose(results[0][0], results[1][0])


def test_float32_stays_float32_and_matches_float32_numpy_bit_for_bit(kernel_set):
    # If a kernel computed in float64 and rounded at the end, some elements would differ in the last
    # bit from the same operations done in float32 by numpy (each rounded to float32).
    params = make_params(np.float32, shapes=((50, 40),))
    start = params[0].data.copy()
    grads = grads_for_steps(params, 3)
    lr, beta1, beta2, eps, wd = 0.01, 0.9, 0.99, 1e-8, 0.1
    opt = AdamW(params, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd)
    run(opt, params, grads)
    assert params[0].dtype == np.float32
    assert opt.state[params[0]]["m"].dtype == np.float32 and opt.state[params[0]]["v"].dtype == np.float32

    f = np.float32
    p, m, v = start.copy(), np.zeros_like(start), np.zeros_like(start)
    for t in (1, 2, 3):
        g = grads[t - 1][0] + f(0) * p
        m = f(beta1) * m + (f(1) - f(beta1)) * g
        v = f(beta2) * v + (f(1) - f(beta2)) * g * g
        m_hat = m / f(1 - beta1**t)
        v_hat = v / f(1 - beta2**t)
        p = p - f(lr) * (m_hat / (np.sqrt(v_hat) + f(eps)) + f(wd) * p)
        assert p.dtype == np.float32
    assert np.array_equal(params[0].data, p)


def test_adam_and_adamw_match_torch():
    torch = pytest.importorskip("torch")
    for cls, torch_cls in ((Adam, torch.optim.Adam), (AdamW, torch.optim.AdamW)):
        params = make_params(shapes=((3, 4), (4,), (2, 2)))
        ours = cls(weight_decay_groups(params, 0.3), lr=0.02, betas=(0.85, 0.9), eps=1e-7)
        theirs_params = [torch.nn.Parameter(torch.tensor(p.data)) for p in params]
        groups = weight_decay_groups(theirs_params, 0.3)
        theirs = torch_cls(groups, lr=0.02, betas=(0.85, 0.9), eps=1e-7, foreach=False)
        for step_grads in grads_for_steps(params, 6):
            for p, t, g in zip(params, theirs_params, step_grads):
                p.grad, t.grad = g.copy(), torch.tensor(g)
            ours.step()
            theirs.step()
        for p, t in zip(params, theirs_params):
            np.testing.assert_allclose(p.data, t.detach().numpy(), rtol=1e-12, atol=1e-14)


# ================================================================================= SGD


def test_sgd_momentum_by_hand(kernel_set):
    lr, momentum, wd = 0.1, 0.9, 0.01
    params = make_params()
    start = [p.data.copy() for p in params]
    grads = grads_for_steps(params, 3)
    result = run(SGD(params, lr=lr, momentum=momentum, weight_decay=wd), params, grads)
    for k, p0 in enumerate(start):
        p, buf = p0.copy(), None
        for step_grads in grads:
            g = step_grads[k] + wd * p
            buf = g if buf is None else momentum * buf + g
            p = p - lr * buf
        np.testing.assert_allclose(result[k], p, rtol=1e-14, atol=1e-15)


def test_plain_sgd_is_p_minus_lr_g(kernel_set):
    params = make_params(np.float32)
    start = [p.data.copy() for p in params]
    grads = grads_for_steps(params, 1)
    run(SGD(params, lr=0.5), params, grads)
    for p, p0, g in zip(params, start, grads[0]):
        assert p.dtype == np.float32
        assert np.array_equal(p.data, p0 - np.float32(0.5) * g)


def test_sgd_matches_torch():
    torch = pytest.importorskip("torch")
    params = make_params()
    theirs_params = [torch.nn.Parameter(torch.tensor(p.data)) for p in params]
    ours = SGD(params, lr=0.05, momentum=0.8, weight_decay=0.1)
    theirs = torch.optim.SGD(theirs_params, lr=0.05, momentum=0.8, weight_decay=0.1, foreach=False)
    for step_grads in grads_for_steps(params, 4):
        for p, t, g in zip(params, theirs_params, step_grads):
            p.grad, t.grad = g.copy(), torch.tensor(g)
        ours.step()
        theirs.step()
    for p, t in zip(params, theirs_params):
        np.testing.assert_allclose(p.data, t.detach().numpy(), rtol=1e-13, atol=1e-15)


# ================================================================================= shared behaviour


@pytest.mark.parametrize("cls", [SGD, Adam, AdamW])
def test_params_without_grad_are_skipped(cls):
    params = make_params()
    start = [p.data.copy() for p in params]
    opt = cls(params, lr=0.1)
    params[0].grad = np.ones_like(params[0].data)
    opt.step()
    opt.step()
    assert not np.array_equal(params[0].data, start[0])
    assert np.array_equal(params[1].data, start[1])
    assert params[1] not in opt.state
    if cls is not SGD:
        assert opt.state[params[0]]["step"] == 2


def test_zero_grad_sets_grads_to_none():
    params = make_params()
    for p in params:
        p.grad = np.ones_like(p.data)
    opt = SGD(params, lr=0.1)
    opt.zero_grad()
    assert all(p.grad is None for p in params)


def test_non_contiguous_param_data_is_still_updated_in_place_of_the_parameter():
    p = nn.Parameter(np.zeros((4, 3)))
    p.data = np.arange(12.0).reshape(3, 4).T  # a transposed (non-contiguous) view
    p.grad = np.ones((4, 3))
    expected = p.data - 0.5
    SGD([p], lr=0.5).step()
    np.testing.assert_array_equal(p.data, expected)


# ================================================================================= param groups


def test_param_groups_use_their_own_hyperparameters():
    a, b = make_params(shapes=((2, 3), (2, 3)))
    a0, b0 = a.data.copy(), b.data.copy()
    opt = SGD([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=0.1)
    a.grad = np.ones((2, 3))
    b.grad = np.ones((2, 3))
    opt.step()
    np.testing.assert_allclose(a.data, a0 - 0.1)
    np.testing.assert_allclose(b.data, b0 - 0.5)
    assert opt.param_groups[0]["momentum"] == 0.0  # a default filled in


def test_setting_group_lr_changes_the_next_step():
    (p,) = make_params(shapes=((3,),))
    p0 = p.data.copy()
    opt = SGD([p], lr=0.1)
    for group in opt.param_groups:
        group["lr"] = 0.25
    p.grad = np.ones(3)
    opt.step()
    np.testing.assert_allclose(p.data, p0 - 0.25)


def test_weight_decay_groups_decay_only_matrices():
    model = nn.Linear(3, 4, dtype=np.float64)
    groups = weight_decay_groups(model, 0.1)
    assert [p.shape for p in groups[0]["params"]] == [(3, 4)] and groups[0]["weight_decay"] == 0.1
    assert [p.shape for p in groups[1]["params"]] == [(4,)] and groups[1]["weight_decay"] == 0.0
    # The bias is not decayed: with a zero gradient it does not move, while the weight shrinks.
    w0, b0 = model.weight.data.copy(), model.bias.data.copy()
    opt = AdamW(groups, lr=0.1)
    for p in model.parameters():
        p.grad = np.zeros_like(p.data)
    opt.step()
    np.testing.assert_array_equal(model.bias.data, b0)
    np.testing.assert_allclose(model.weight.data, w0 * (1 - 0.1 * 0.1), rtol=1e-12)


def test_bad_arguments_are_errors():
    params = make_params()
    with pytest.raises(ValueError, match="SGD: got an empty list"):
        SGD([], lr=0.1)
    with pytest.raises(TypeError, match="Adam: expected a list of Parameters"):
        Adam(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="AdamW: param group 0 has unknown keys \\['weight_deacy'\\]"):
        AdamW([{"params": params, "weight_deacy": 0.1}])
    with pytest.raises(ValueError, match="appears twice"):
        Adam([{"params": params}, {"params": params[:1]}])
    with pytest.raises(ValueError, match="lr must be >= 0"):
        SGD(params, lr=-1)
    with pytest.raises(ValueError, match="betas must be in"):
        Adam(params, betas=(0.9, 1.0))
    with pytest.raises(TypeError, match="not a float Tensor requiring a gradient"):
        SGD([np.zeros(3)], lr=0.1)


# ================================================================================= state dict


@pytest.mark.parametrize("cls", [SGD, AdamW])
def test_resume_from_npz_equals_uninterrupted_training(cls, tmp_path):
    grads = grads_for_steps(make_params(np.float32), 5)
    kwargs = {"lr": 0.05, "momentum": 0.9} if cls is SGD else {"lr": 0.05, "weight_decay": 0.1}

    params = make_params(np.float32)
    uninterrupted = run(cls(params, **kwargs), params, grads)

    params = make_params(np.float32)
    opt = cls(params, **kwargs)
    run(opt, params, grads[:3])
    np.savez(tmp_path / "ckpt.npz", **opt.state_dict())
    weights = [p.data.copy() for p in params]

    params = make_params(np.float32)
    for p, w in zip(params, weights):
        p.data[...] = w
    opt = cls(params, lr=123.0)  # the hyperparameters come back from the checkpoint too
    with np.load(tmp_path / "ckpt.npz") as saved:
        opt.load_state_dict(dict(saved))
    assert opt.param_groups[0]["lr"] == 0.05
    resumed = run(opt, params, grads[3:])
    for a, b in zip(uninterrupted, resumed):
        assert np.array_equal(a, b)


def test_state_dict_is_flat_and_holds_copies():
    params = make_params()
    opt = AdamW(weight_decay_groups(params, 0.1), lr=0.01, betas=(0.8, 0.9))
    run(opt, params, grads_for_steps(params, 2))
    state = opt.state_dict()
    assert state["group.0.weight_decay"] == 0.1 and state["group.1.weight_decay"] == 0.0
    assert list(state["group.0.betas"]) == [0.8, 0.9]
    assert state["group.0.num_params"] == 1 and state["param.0.step"] == 2
    assert state["param.0.m"].shape == (3, 4) and state["param.1.v"].shape == (4,)
    assert all(np.isscalar(v) or isinstance(v, np.ndarray) for v in state.values())
    state["param.0.m"][...] = 0
    assert not np.all(opt.state[params[0]]["m"] == 0)


def test_load_state_dict_errors_name_the_problem():
    params = make_params()
    opt = Adam(params)
    run(opt, params, grads_for_steps(params, 1))
    state = opt.state_dict()

    other = Adam(make_params(shapes=((3, 5), (4,))))
    with pytest.raises(RuntimeError, match=r"param\.0\.m has shape \(3, 4\) float64, the Parameter \(3, 5\)"):
        other.load_state_dict(state)
    assert other.state == {}  # nothing was loaded

    with pytest.raises(RuntimeError, match="group 0 holds 1 params, the state dict 2"):
        Adam(make_params(shapes=((3, 4),))).load_state_dict(state)
    with pytest.raises(RuntimeError, match="unexpected keys: extra"):
        Adam(make_params()).load_state_dict({**state, "extra": 1})
    with pytest.raises(RuntimeError, match="missing group.0.lr"):
        Adam(make_params()).load_state_dict({k: v for k, v in state.items() if k != "group.0.lr"})


# ================================================================================= clipping


def test_clip_grad_norm_by_hand():
    a, b, c = make_params(np.float32, shapes=((2, 2), (3,), (2,)))
    a.grad = np.array([[3.0, 0.0], [0.0, 0.0]], dtype=np.float32)
    b.grad = np.array([0.0, 4.0, 0.0], dtype=np.float32)
    c.grad = None  # skipped
    total = clip_grad_norm([a, b, c], max_norm=4.0)
    assert isinstance(total, float) and total == pytest.approx(5.0)
    scale = 4.0 / (5.0 + 1e-6)
    np.testing.assert_allclose(a.grad, [[3 * scale, 0], [0, 0]], rtol=1e-6)
    np.testing.assert_allclose(b.grad, [0, 4 * scale, 0], rtol=1e-6)
    assert a.grad.dtype == np.float32
    # The clipped gradients have norm max_norm, and a second clip leaves them alone.
    assert clip_grad_norm([a, b], max_norm=4.0) == pytest.approx(4.0, rel=1e-5)
    np.testing.assert_allclose(b.grad, [0, 4 * scale, 0], rtol=1e-6)


def test_clip_grad_norm_below_max_changes_nothing_and_matches_numpy():
    params = make_params(shapes=((5, 7), (7,), (1,)))
    grads = grads_for_steps(params, 1)[0]
    for p, g in zip(params, grads):
        p.grad = g.copy()
    expected = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads))
    assert clip_grad_norm(params, max_norm=1e6) == pytest.approx(expected, rel=1e-12)
    for p, g in zip(params, grads):
        assert np.array_equal(p.grad, g)


def test_clip_grad_norm_rejects_a_module():
    with pytest.raises(TypeError, match="clip_grad_norm: expected Parameters"):
        clip_grad_norm([nn.Linear(2, 2)], 1.0)


# ================================================================================= schedule


def test_cosine_with_warmup_at_key_steps():
    max_lr, min_lr, warmup, decay = 1e-3, 1e-4, 10, 110
    lr = lambda step: cosine_with_warmup(step, max_lr, min_lr, warmup, decay)  # noqa: E731
    assert lr(0) == pytest.approx(max_lr / 11)  # never 0
    assert lr(4) == pytest.approx(max_lr * 5 / 11)
    assert lr(9) == pytest.approx(max_lr * 10 / 11)
    assert lr(10) == pytest.approx(max_lr)  # warmup ends at the peak
    assert lr(60) == pytest.approx((max_lr + min_lr) / 2)  # cosine half way
    assert lr(35) == pytest.approx(min_lr + (max_lr - min_lr) * (1 + math.cos(math.pi / 4)) / 2)
    assert lr(110) == pytest.approx(min_lr)
    assert lr(111) == min_lr and lr(10_000) == min_lr
    after_warmup = [lr(s) for s in range(10, 112)]
    assert all(x >= y for x, y in zip(after_warmup, after_warmup[1:]))  # never increases after warmup


def test_cosine_with_warmup_edge_cases():
    assert cosine_with_warmup(0, 1.0, 0.1, 0, 100) == pytest.approx(1.0)  # no warmup: starts at the peak
    assert cosine_with_warmup(5, 1.0, 0.1, 5, 5) == 0.1  # no decay phase
    with pytest.raises(ValueError, match="lr_decay_iters"):
        cosine_with_warmup(0, 1.0, 0.1, 10, 5)


def test_kernels_are_compiled_for_float32_without_float64_scalars():
    if not hasattr(optim.adamw_update, "signatures"):
        pytest.skip("NUMBA_DISABLE_JIT=1: the kernels are plain Python")
    params = make_params(np.float32)
    run(AdamW(params), params, grads_for_steps(params, 1))
    run(SGD(params, lr=0.1), params, grads_for_steps(params, 1))
    for kernel in (optim.adamw_update, optim.sgd_update):
        float32_signatures = [s for s in kernel.signatures if "float32" in str(s[0])]
        assert float32_signatures and all("float64" not in str(s) for s in float32_signatures), kernel.signatures
