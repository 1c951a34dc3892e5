"""The checks of exercise 9. Run them with `python -m exercises check adamw`."""
import math

import numpy as np

import microtensor as mt
from exercises.checking import CheckSkipped, expect, expect_close

BETAS, EPS, DECAY = (0.9, 0.99), 1e-8, 0.1
SHAPES = [(3, 4), (4,)]  # a matrix and a vector


def gradients(seed, step, dtype):
    """Gradients of every scale, different at each step (as training gives)."""
    rng = np.random.default_rng(1000 * seed + step)
    return [(rng.normal(size=shape) * 10.0 ** rng.integers(-2, 2, size=shape)).astype(dtype) for shape in SHAPES]


def schedule(steps):
    """Learning rates that change from step to step, as a schedule sets them (microtensor's own)."""
    return [mt.optim.cosine_with_warmup(step, 0.1, 0.01, 2, steps - 1) for step in range(steps)]


def run_against_microtensor(impl, dtype, steps=5):
    """Run the student's AdamW and mt.optim.AdamW side by side; yield both at every step."""
    start = [np.random.default_rng(7).uniform(-1, 1, size=shape).astype(dtype) for shape in SHAPES]
    mine = [p.copy() for p in start]
    optimizer = impl.AdamW(mine, lr=0.1, betas=BETAS, eps=EPS, weight_decay=DECAY)
    reference = [mt.nn.Parameter(p.copy()) for p in start]
    mt_optimizer = mt.optim.AdamW(reference, lr=0.1, betas=BETAS, eps=EPS, weight_decay=DECAY)
    for step, lr in enumerate(schedule(steps)):
        grads = gradients(3, step, dtype)
        optimizer.lr = lr
        mt_optimizer.param_groups[0]["lr"] = lr
        optimizer.step([g.copy() for g in grads])
        for param, grad in zip(reference, grads):
            param.grad = grad.copy()
        mt_optimizer.step()
        yield step, optimizer, mine, [p.numpy() for p in reference]


def test_first_step_moves_each_weight_by_lr(impl):
    """the first step moves every weight by lr, whatever the scale of its gradient (bias correction, ε outside the root)"""
    lr, betas = 0.01, (0.9, 0.999)  # PyTorch's default betas (with β2 = 0.99 the two errors would cancel)
    grad = np.array([[0.02, -0.5], [3.0, -40.0], [700.0, -0.1]])  # (3, 2): gradients over 5 decades
    param = np.zeros((3, 2))
    impl.AdamW([param], lr=lr, betas=betas, eps=EPS, weight_decay=0.0).step([grad])
    expected = -lr * np.sign(grad)  # m_hat = g and v_hat = g² at t = 1, so the step is lr g / |g|
    too_large = (1 - betas[0]) / np.sqrt(1 - betas[1])  # the step over lr without the corrections: 3.16
    expect(
        np.all(np.isfinite(param)),
        f"after one step the weights hold {param.ravel().tolist()}: a nan or inf (t starts at 1, so 1 - beta^t is never 0)",
    )
    ratio = np.abs(param).max() / lr
    without = {  # the first step over lr when a bias correction is left out
        too_large: "neither m nor v was divided",
        1 - betas[0]: "m was not divided by 1 - β1^t",
        1 / np.sqrt(1 - betas[1]): "v was not divided by 1 - β2^t",
    }
    for step_over_lr, what_is_missing in without.items():
        expect(
            not np.isclose(ratio, step_over_lr, rtol=1e-3),
            f"the first step moved weights by {ratio:.4g} × lr, expected 1 × lr ({what_is_missing}): "
            "divide m by 1 - β1^t and v by 1 - β2^t (bias correction)",
        )
    eps_inside = -lr * grad / np.sqrt(grad * grad + EPS)  # m̂ / √(v̂ + ε): off only where g² is near ε
    expect(
        np.allclose(param, expected, atol=1e-9, rtol=1e-6) or not np.allclose(param, eps_inside, atol=1e-12, rtol=1e-9),
        "the first step is lr g / √(g² + ε) (ε inside the square root): ε goes after it, m̂ / (√v̂ + ε)",
    )
    expect_close("the weights after one step from 0", param, expected, "-lr · sign(g)", atol=1e-9, rtol=1e-6)


def test_weight_decay_is_decoupled(impl):
    """with a zero gradient, AdamW only shrinks the weights: θ (1 - lr λ)"""
    param = np.array([1.0, -2.0, 0.5])
    lr, decay = 0.1, 0.2
    impl.AdamW([param], lr=lr, betas=BETAS, eps=EPS, weight_decay=decay).step([np.zeros(3)])
    expected = np.array([1.0, -2.0, 0.5]) * (1 - lr * decay)
    expect_close(
        "the weights after a step with g = 0 (a decay added to g would go through m and v instead)",
        param, expected, "θ (1 - lr λ)", atol=1e-12,
    )  # fmt: skip


def test_moments_change_in_place(impl):
    """after one step the optimizer's own m and v hold (1 - β1) g and (1 - β2) g² (changed in place)"""
    grad = np.array([0.5, -2.0, 3.0])
    optimizer = impl.AdamW([np.ones(3)], lr=0.1, betas=BETAS, eps=EPS, weight_decay=DECAY)
    optimizer.step([grad.copy()])
    for name, array in (("m", optimizer.m[0]), ("v", optimizer.v[0])):
        expect(
            np.any(array != 0),
            f"optimizer.{name}[0] is still all zeros after a step: change m and v in place "
            f"(m[...] = ..., m *= ...); `{name} = ...` only rebinds the local name",
        )
    expect_close("optimizer.m[0] after one step", optimizer.m[0], (1 - BETAS[0]) * grad,
                 "(1 - β1) g: m keeps the uncorrected mean (m_hat is a new array)")  # fmt: skip
    expect_close("optimizer.v[0] after one step", optimizer.v[0], (1 - BETAS[1]) * grad**2,
                 "(1 - β2) g²: v keeps the uncorrected mean (v_hat is a new array)")  # fmt: skip


def test_steps_match_microtensor_adamw(impl):
    """five steps, changing lr, weight decay: the weights equal microtensor's mt.optim.AdamW"""
    for step, _, mine, reference in run_against_microtensor(impl, np.float64):
        for index, (param, expected) in enumerate(zip(mine, reference)):
            expect_close(
                f"parameter {index} of shape {param.shape} after step {step + 1}", param, expected,
                "mt.optim.AdamW", atol=1e-12, rtol=1e-10,
            )  # fmt: skip


def test_float32_matches_microtensor_adamw(impl):
    """in float32, five steps: the weights equal mt.optim.AdamW's to float32's precision"""
    for step, optimizer, mine, reference in run_against_microtensor(impl, np.float32):
        for index, (param, expected) in enumerate(zip(mine, reference)):
            for name, array in (("m", optimizer.m[index]), ("v", optimizer.v[index])):
                expect(array.dtype == np.float32, f"step {step + 1}: {name} of parameter {index} became {array.dtype}; keep float32")
            expect_close(
                f"float32 parameter {index} of shape {param.shape} after step {step + 1}", param, expected,
                "mt.optim.AdamW", atol=1e-6, rtol=1e-5,
            )  # fmt: skip


def test_steps_match_pytorch(impl):
    """five steps equal PyTorch's torch.optim.AdamW (skipped where torch is not installed)"""
    start = [np.random.default_rng(8).uniform(-1, 1, size=shape) for shape in SHAPES]
    mine = [p.copy() for p in start]
    optimizer = impl.AdamW(mine, lr=0.05, betas=BETAS, eps=EPS, weight_decay=DECAY)
    after_each_step = []
    for step in range(5):
        optimizer.step(gradients(4, step, np.float64))
        after_each_step.append([p.copy() for p in mine])
    try:
        import torch  # only now: the import takes seconds, and an unfinished AdamW has already stopped above
    except ImportError:
        raise CheckSkipped("torch is not installed") from None
    reference = [torch.tensor(p.copy(), requires_grad=True) for p in start]
    torch_optimizer = torch.optim.AdamW(reference, lr=0.05, betas=BETAS, eps=EPS, weight_decay=DECAY)
    for step in range(5):
        for param, grad in zip(reference, gradients(4, step, np.float64)):
            param.grad = torch.tensor(grad)
        torch_optimizer.step()
        for index, (param, expected) in enumerate(zip(after_each_step[step], reference)):
            expect_close(
                f"parameter {index} of shape {param.shape} after step {step + 1}", param,
                expected.detach().numpy(), "torch.optim.AdamW", atol=1e-12, rtol=1e-10,
            )  # fmt: skip


def reference_schedule(step, max_lr, min_lr, warmup, decay_end):
    """The schedule, written again here: linear warmup, then a cosine from max_lr down to min_lr."""
    if step < warmup:
        return max_lr * (step + 1) / (warmup + 1)
    if step > decay_end or decay_end == warmup:
        return min_lr
    return min_lr + (max_lr - min_lr) * (1 + np.cos(np.pi * (step - warmup) / (decay_end - warmup))) / 2


def test_schedule_at_its_key_points(impl):
    """the schedule at step 0, the end of the warmup, the middle of the cosine, its end and beyond"""
    max_lr, min_lr, warmup, decay_end = 1e-3, 1e-4, 10, 50
    points = {
        "step 0 (the first warmup step, never 0)": (0, max_lr / 11),
        "step 9 (the last warmup step)": (9, max_lr * 10 / 11),
        "step 10 (the end of the warmup: the peak)": (10, max_lr),
        "step 30 (the middle of the cosine)": (30, (max_lr + min_lr) / 2),
        "step 50 (the end of the cosine)": (50, min_lr),
        "step 80 (beyond the decay)": (80, min_lr),
    }
    for what, (step, expected) in points.items():
        got = impl.learning_rate_at(step, max_lr, min_lr, warmup, decay_end)
        expect(got is not None and math.isclose(got, expected, rel_tol=1e-12),
               f"learning_rate_at at {what}: yours {got!r}, expected {expected!r}")  # fmt: skip


def test_schedule_matches_the_formula_and_microtensor(impl):
    """the schedule at every step equals the formula and microtensor's cosine_with_warmup, edge cases too"""
    cases = [(3e-3, 3e-4, 5, 25), (1.0, 0.0, 0, 12), (2e-3, 1e-4, 6, 6)]  # no warmup; no decay phase
    for max_lr, min_lr, warmup, decay_end in cases:
        for step in range(decay_end + 4):
            got = impl.learning_rate_at(step, max_lr, min_lr, warmup, decay_end)
            expected = reference_schedule(step, max_lr, min_lr, warmup, decay_end)
            from_microtensor = mt.optim.cosine_with_warmup(step, max_lr, min_lr, warmup, decay_end)
            where = f"learning_rate_at({step}, max_lr={max_lr}, min_lr={min_lr}, warmup_iters={warmup}, lr_decay_iters={decay_end})"
            expect(got is not None and math.isclose(got, expected, rel_tol=1e-12, abs_tol=1e-15),
                   f"{where}: yours {got!r}, expected {expected!r} (the formula)")  # fmt: skip
            expect(math.isclose(got, from_microtensor, rel_tol=1e-12, abs_tol=1e-15),
                   f"{where}: yours {got!r}, mt.optim.cosine_with_warmup gives {from_microtensor!r}")  # fmt: skip
