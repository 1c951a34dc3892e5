"""Optimizers, gradient clipping and the learning-rate schedule, against formulas computed by hand.
Tests taking `kernel_set` run once with each kernel set (the update kernels have no fast twins
today; these tests would hold one to the same formulas, to the last bit in float32)."""
import math

import numpy as np
import pytest

import microtensor.nn as nn
import microtensor.optim as optim
from microtensor.errors import InputError, InputTypeError, MicrotensorError
from microtensor.nn import StateDictError
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
    # With m and v bias-corrected, step 1 is lr * g / (|g| + eps): a move of ~lr against the sign of g
    # (eps must be > 0; at 1e-30 it is far below the rounding of |g| ~ 1).
    params = make_params()
    start = [p.data.copy() for p in params]
    grads = grads_for_steps(params, 1)
    run(Adam(params, lr=0.1, eps=1e-30), params, grads)
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


# ================================================================================= checks (issue 12)
# Each test below failed before the checks it names were written: the bad value was accepted, and
# the optimizer went on to produce nan weights, to read outside an array, or to do nothing.


BAD_HYPERPARAMETERS = [
    (SGD, {"lr": float("nan")}, InputError, "lr must be >= 0 and finite"),
    (SGD, {"lr": float("inf")}, InputError, "lr must be >= 0 and finite"),
    (SGD, {"lr": "0.1"}, InputTypeError, "lr must be a number"),
    (SGD, {"lr": 0.1, "momentum": 1.0}, InputError, r"momentum must be in \[0, 1\)"),
    (SGD, {"lr": 0.1, "momentum": -0.5}, InputError, r"momentum must be in \[0, 1\)"),
    (SGD, {"lr": 0.1, "weight_decay": -1e-3}, InputError, "weight_decay must be >= 0"),
    (Adam, {"eps": 0.0}, InputError, "eps must be > 0 and finite"),
    (Adam, {"eps": float("nan")}, InputError, "eps must be > 0 and finite"),
    (Adam, {"betas": (2, 2)}, InputError, r"betas must be in \[0, 1\)"),
    (Adam, {"betas": (0.9, float("nan"))}, InputError, r"betas must be in \[0, 1\)"),
    (AdamW, {"betas": (-0.1, 0.9)}, InputError, r"betas must be in \[0, 1\)"),
    (AdamW, {"betas": 0.9}, InputTypeError, "betas must be a pair"),
    (AdamW, {"betas": (0.9, 0.99, 0.999)}, InputTypeError, "betas must be a pair"),
    (AdamW, {"weight_decay": float("inf")}, InputError, "weight_decay must be >= 0 and finite"),
    (AdamW, {"lr": True}, InputTypeError, "lr must be a number"),
]


@pytest.mark.parametrize("cls, kwargs, error, message", BAD_HYPERPARAMETERS, ids=lambda x: repr(x)[:30])
def test_bad_hyperparameters_are_refused_in_the_constructor_and_in_param_groups(cls, kwargs, error, message):
    with pytest.raises(error, match=message):
        cls(make_params(), **kwargs)
    good = {"lr": 0.1} if cls is SGD else {}
    with pytest.raises(error, match="param group 1: " + message):
        cls([{"params": make_params()[:1]}, {"params": make_params(seed=1)[1:], **kwargs}], **good)


def test_a_group_holding_a_single_parameter_takes_it_whole_not_its_rows():
    p = nn.Parameter(np.ones((3, 2)))
    opt = SGD([{"params": p}], lr=0.5)  # iterating p would give its 3 rows, non-leaf Tensors
    assert opt.param_groups[0]["params"] == [p] or opt.param_groups[0]["params"][0] is p
    p.grad = np.ones((3, 2))
    opt.step()
    np.testing.assert_array_equal(p.data, np.full((3, 2), 0.5))


@pytest.mark.parametrize("value", [float("nan"), -0.1, float("inf")])
def test_a_schedule_setting_a_bad_lr_is_refused_at_the_step_before_any_weight_moves(value):
    params = make_params()
    start = [p.data.copy() for p in params]
    opt = AdamW(weight_decay_groups(params, 0.1), lr=0.01)
    for p in params:
        p.grad = np.ones_like(p.data)
    opt.param_groups[1]["lr"] = value  # the second group: the first one's weights must not move either
    with pytest.raises(InputError, match=r"AdamW.step: param group 1: lr must be >= 0 and finite"):
        opt.step()
    for p, p0 in zip(params, start):
        assert np.array_equal(p.data, p0)
    assert opt.state == {} or all(state["step"] == 0 for state in opt.state.values())


@pytest.mark.parametrize("cls", [SGD, Adam, AdamW])
@pytest.mark.parametrize(
    "grad, error, message",
    [
        (np.ones(2), InputError, r"\.grad has shape \(2,\), expected the shape of \.data, \(3, 4\)"),
        (np.ones((4, 3)), InputError, r"\.grad has shape \(4, 3\)"),
        (np.ones((3, 4), dtype=np.float32), InputTypeError, r"\.grad has dtype float32, expected the dtype of \.data, float64"),
        ([[1.0] * 4] * 3, InputTypeError, r"\.grad must be a numpy array like \.data, got list"),
    ],
    ids=["too-small", "transposed", "float32", "list"],
)
def test_a_user_assigned_grad_that_does_not_fit_is_an_error_not_a_read_outside_it(cls, grad, error, message, kernel_set):
    params = make_params()  # (3, 4) and (4,), float64
    start = [p.data.copy() for p in params]
    opt = cls(params, lr=0.1)
    params[1].grad = np.ones(4)
    params[0].grad = grad
    with pytest.raises(error, match=r"step: parameter 0 \(param group 0, shape \(3, 4\)\): " + message):
        opt.step()
    for p, p0 in zip(params, start):  # checked before any kernel ran: nothing moved
        assert np.array_equal(p.data, p0)


def test_a_non_contiguous_grad_is_used_by_value():
    p = nn.Parameter(np.zeros((3, 4)))
    p.grad = np.arange(12.0).reshape(4, 3).T  # the right shape, transposed in memory
    expected = -0.5 * np.arange(12.0).reshape(4, 3).T
    SGD([p], lr=0.5).step()
    np.testing.assert_array_equal(p.data, expected)


@pytest.mark.parametrize("cls", [SGD, Adam, AdamW])
@pytest.mark.parametrize("new_data", [np.zeros((30, 40)), np.zeros((3, 4), dtype=np.float32)], ids=["larger", "float32"])
def test_param_data_replaced_after_the_first_step_is_an_error_naming_the_parameter(cls, new_data, kernel_set):
    params = make_params()
    opt = cls(params, lr=0.1)
    for p in params:
        p.grad = np.ones_like(p.data)
    opt.step()
    params[0].data = new_data  # the state (momentum buffer, m, v) still has the old shape and dtype
    params[0].grad = np.ones_like(new_data)
    with pytest.raises(InputError, match=r"parameter 0 \(param group 0, .*\.data is now .* but the optimizer's state .* was made for \(3, 4\) float64"):
        opt.step()


def test_load_state_dict_refuses_nan_lr_bad_betas_and_bad_state_values():
    params = make_params()
    opt = Adam(params, lr=0.01)
    run(opt, params, grads_for_steps(params, 2))
    good = opt.state_dict()
    cases = {
        "group.0.lr": (np.array(np.nan), "group.0.lr: lr must be >= 0 and finite, got nan"),
        "group.0.betas": (np.array([2.0, 2.0]), r"group.0.betas: betas must be in \[0, 1\), got \(2.0, 2.0\)"),
        "group.0.eps": (np.array(0.0), "group.0.eps: eps must be > 0"),
        "group.0.num_params": (np.array(2.5), "group 0 holds 2 params, the state dict"),
        "param.0.step": (np.array(-1), r"param.0.step must be an integer >= 0"),
        "param.1.v": (-np.ones(4), "param.1.v holds a negative value"),
        "param.0.m": (np.full((3, 4), np.nan), "param.0.m holds an inf or a nan"),
    }
    for key, (value, message) in cases.items():
        fresh_params = make_params()
        fresh = Adam(fresh_params, lr=0.5)
        with pytest.raises(StateDictError, match=message):
            fresh.load_state_dict({**good, key: value})
        assert fresh.param_groups[0]["lr"] == 0.5 and fresh.state == {}  # nothing was loaded
    with pytest.raises(InputTypeError, match="Adam.load_state_dict: expected a dict"):
        Adam(make_params()).load_state_dict([("group.0.lr", 0.1)])
    # The error is the project's, and still the RuntimeError it always was.
    assert issubclass(StateDictError, MicrotensorError) and issubclass(StateDictError, RuntimeError)


def test_a_key_added_to_a_group_after_construction_is_kept_and_saved():
    params = make_params()
    opt = SGD(params, lr=0.1)
    opt.param_groups[0]["initial_lr"] = 0.1  # as a schedule may note it
    for p in params:
        p.grad = np.ones_like(p.data)
    opt.step()
    other = SGD(make_params(), lr=0.5)
    other.param_groups[0]["initial_lr"] = 0.0
    other.load_state_dict(opt.state_dict())
    assert other.param_groups[0]["initial_lr"] == 0.1 and other.param_groups[0]["lr"] == 0.1


def test_optimizer_constructor_type_errors():
    with pytest.raises(InputTypeError, match="SGD: expected a list of Parameters"):
        SGD(3, lr=0.1)
    with pytest.raises(InputTypeError, match="put a single param group in a list"):
        SGD({"params": make_params()}, lr=0.1)
    with pytest.raises(InputError, match="weight_decay_groups: weight_decay must be >= 0"):
        weight_decay_groups(make_params(), -0.1)


# ================================================================================= clipping checks


@pytest.mark.parametrize("max_norm", [-1.0, 0.0, float("nan"), float("inf")])
def test_clip_grad_norm_refuses_a_max_norm_that_is_not_finite_and_positive(max_norm):
    # Before: -1 flipped every gradient's sign, 0 erased them all.
    (p,) = make_params(shapes=((3,),))
    p.grad = np.array([3.0, 4.0, 0.0])
    with pytest.raises(InputError, match=f"clip_grad_norm: max_norm must be > 0 and finite, got {max_norm}"):
        clip_grad_norm([p], max_norm)
    np.testing.assert_array_equal(p.grad, [3.0, 4.0, 0.0])
    with pytest.raises(InputTypeError, match="max_norm must be a number"):
        clip_grad_norm([p], "1.0")


def test_clip_grad_norm_takes_a_single_tensor_as_one_parameter():
    # Before: it iterated the Tensor's rows (Tensors without a gradient) and clipped nothing.
    p = nn.Parameter(np.zeros((2, 2)))
    p.grad = np.array([[3.0, 0.0], [0.0, 4.0]])
    assert clip_grad_norm(p, 1.0) == pytest.approx(5.0)
    np.testing.assert_allclose(p.grad, np.array([[3.0, 0.0], [0.0, 4.0]]) / (5.0 + 1e-6), rtol=1e-12)
    with pytest.raises(InputTypeError, match="got the Linear itself"):
        clip_grad_norm(nn.Linear(2, 2), 1.0)


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_clip_grad_norm_with_a_non_finite_norm(bad):
    a, b = make_params(shapes=((2,), (2,)))
    a.grad, b.grad = np.array([1.0, bad]), np.array([3.0, 4.0])
    total = clip_grad_norm([a, b], 1.0)  # the default: report it, change nothing
    assert not math.isfinite(total)
    np.testing.assert_array_equal(b.grad, [3.0, 4.0])
    with pytest.raises(InputError, match=f"total norm of the gradients is {total}"):
        clip_grad_norm([a, b], 1.0, error_if_nonfinite=True)
    np.testing.assert_array_equal(b.grad, [3.0, 4.0])
    with pytest.raises(InputTypeError, match="error_if_nonfinite must be True or False"):
        clip_grad_norm([a, b], 1.0, error_if_nonfinite="yes")


def test_clip_grad_norm_of_large_float32_gradients_does_not_overflow():
    # 1e20 squared overflows float32 (max ~3.4e38); the true norm, 5e20, is an ordinary float32.
    p = nn.Parameter(np.zeros(2, dtype=np.float32))
    p.grad = np.array([3e20, 4e20], dtype=np.float32)
    assert clip_grad_norm([p], 1.0) == pytest.approx(5e20, rel=1e-6)
    np.testing.assert_allclose(p.grad, [0.6, 0.8], rtol=1e-5)


# ================================================================================= schedule checks


@pytest.mark.parametrize(
    "args, error, message",
    [
        ((0, 1.0, 0.1, -1, 5), InputError, "warmup_iters must be >= 0"),
        ((-1, 1.0, 0.1, 0, 5), InputError, "step must be >= 0"),
        ((0, float("nan"), 0.1, 0, 5), InputError, "max_lr must be >= 0 and finite"),
        ((0, 1.0, float("inf"), 0, 5), InputError, "min_lr must be >= 0 and finite"),
        ((0, -1.0, 0.1, 0, 5), InputError, "max_lr must be >= 0"),
        ((0, 1.0, 0.1, 2.5, 5), InputTypeError, "warmup_iters must be an integer"),
        ((0, "1e-3", 0.1, 0, 5), InputTypeError, "max_lr must be a number"),
        ((0, 1.0, 0.1, 10, 5), InputError, r"lr_decay_iters \(5\) must be >= warmup_iters \(10\)"),
    ],
)
def test_cosine_with_warmup_refuses_bad_arguments(args, error, message):
    with pytest.raises(error, match="cosine_with_warmup: " + message):
        cosine_with_warmup(*args)


def test_the_version_of_a_parameter_changes_with_each_in_place_update():
    """A backward through a graph that saved a Parameter's old values must be able to tell that the
    optimizer changed them in place (the engine's version counter)."""
    p = make_params(shapes=((3,),))[0]
    for opt in (SGD([p], lr=0.1), AdamW([p], lr=0.1)):
        before = p._version
        p.grad = np.ones(3)
        opt.step()
        assert p._version != before
    # And the engine refuses the backward through the old values.
    loss = (p * p).sum()
    p.grad = np.ones(3)
    SGD([p], lr=0.1).step()
    with pytest.raises(MicrotensorError, match="in place"):
        loss.backward()
