"""The checks of exercise 18. Run them with `python -m exercises check moe_router`."""
import numpy as np

import microtensor as mt
import microtensor.functional as F
from exercises.checking import CheckFailed, as_array, expect, expect_close, expect_equal, gradcheck, random_tensor
from gpt.model.electives.moe import MixtureOfExperts


def positive_probs(shape, seed):
    """Router-like probabilities: positive rows that sum to 1, float64, as a leaf tensor."""
    values = np.random.default_rng(seed).uniform(0.1, 1.0, size=shape)
    return mt.tensor(values / values.sum(axis=1, keepdims=True), requires_grad=True)


def softmax_rows(logits):
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_top_k_matches_microtensor(impl):
    """top_k_experts equals microtensor's F.top_k_experts for every k, most probable first"""
    for seed in range(3):
        probs = softmax_rows(np.random.default_rng(seed).normal(size=(5, 6)))
        for k in range(1, 7):
            got = np.asarray(impl.top_k_experts(probs, k))
            expect(got.dtype == np.int64, f"top_k_experts(probs (5, 6), k={k}) has dtype {got.dtype}, expected int64")
            expect_equal(f"top_k_experts(probs (5, 6), k={k})", got, F.top_k_experts(probs, k), "F.top_k_experts")


def test_top_k_breaks_ties_by_expert_number(impl):
    """equal probabilities: the lower expert number comes first, as microtensor ranks them"""
    rows = np.array([[0.25, 0.25, 0.25, 0.25], [0.1, 0.4, 0.1, 0.4], [0.4, 0.1, 0.4, 0.1], [0.3, 0.2, 0.2, 0.3]])
    many = np.round(np.random.default_rng(7).uniform(0, 1, size=(4, 24)), 1)  # 24 experts, values repeated
    many /= many.sum(axis=1, keepdims=True)
    cases = [(f"top_k_experts(k={k}) of rows with ties {rows.tolist()}", rows, k) for k in (1, 2, 3)]
    cases.append(("top_k_experts(k=8) of 4 rows of 24 probabilities with many ties", many, 8))
    for what, probs, k in cases:
        try:
            expect_equal(what, impl.top_k_experts(probs, k), F.top_k_experts(probs, k), "F.top_k_experts")
        except CheckFailed as failure:
            raise CheckFailed(
                f"{failure} (equal probabilities go lower expert first; np.argsort's default sort is not stable: "
                "sort -probs with kind='stable', and do not reverse an ascending sort)"
            ) from None


def test_gates_gradient_matches_finite_differences(impl):
    """gradcheck of the gates with respect to the probabilities, random upstream, k = 2, 3 and E"""
    for seed, k in enumerate((2, 3, 5)):
        probs = positive_probs((4, 5), seed)
        experts = F.top_k_experts(probs, k)  # (4, k), distinct experts per row
        gradcheck(lambda p: impl.TopKGates.apply(p, experts), [probs])


def test_gates_gradient_matches_microtensor(impl):
    """dL/dprobs through the gates equals microtensor's F.top_k_gates backward, float64 and float32"""
    for dtype, atol in ((np.float64, 1e-12), (np.float32, 1e-6)):
        values = positive_probs((5, 6), 11).numpy().astype(dtype)
        experts = F.top_k_experts(values, 3)
        upstream = np.random.default_rng(12).normal(size=(5, 3)).astype(dtype)
        probs = mt.tensor(values, requires_grad=True)
        impl.TopKGates.apply(probs, experts).backward(mt.tensor(upstream))
        reference = mt.tensor(values, requires_grad=True)
        F.top_k_gates(reference, experts).backward(mt.tensor(upstream))
        name = np.dtype(dtype).name
        expect(probs.grad is not None, "TopKGates.backward sent no gradient to probs")
        expect_close(f"dL/dprobs (5, 6) in {name}, k = 3", probs.grad, reference.grad, "F.top_k_gates's backward", atol=atol, rtol=1e-5)


def test_route_matches_microtensor(impl):
    """route's experts, gates and probs equal microtensor's (k = 1: the gate is p itself), float64 and float32"""
    for dtype, atol in ((np.float64, 1e-12), (np.float32, 1e-6)):
        x = random_tensor((6, 4), seed=20, dtype=dtype)
        w = random_tensor((4, 5), seed=21, dtype=dtype)
        probs_reference = F.softmax(x @ w, dim=-1).numpy()  # (6, 5)
        name = np.dtype(dtype).name
        for k in (1, 2, 3):
            with mt.num_threads(1):  # tiny arrays: waking threads would cost more than the work
                experts, gates, probs = impl.route(x, w, k)
            expected_experts = F.top_k_experts(probs_reference, k)
            expect_close(f"probs (6, 5) in {name}", probs, probs_reference, "F.softmax(x @ w)", atol=atol, rtol=1e-5)
            expect_equal(f"experts (6, {k}) in {name}", experts, expected_experts, "F.top_k_experts")
            if k == 1:  # gpt/model/electives/moe.py's Switch gate: the chosen probability, not renormalized
                expected_gates = np.take_along_axis(probs_reference, expected_experts, axis=1)
                reference = "the chosen probability p[n, e] (gpt/model/electives/moe.py with top_k = 1)"
                expect(
                    not (np.shape(gates) == (6, 1) and np.allclose(as_array(gates), 1.0)),
                    f"gates (6, 1) in {name}: every k = 1 gate is 1.0: q/q = 1 does not depend on the router; "
                    "use the chosen probability itself (README, k = 1)",
                )
            else:
                expected_gates = F.top_k_gates(mt.tensor(probs_reference), expected_experts).numpy()
                reference = "F.top_k_gates"
            expect_close(f"gates (6, {k}) in {name}", gates, expected_gates, reference, atol=atol, rtol=1e-5)


def test_route_gradient_matches_finite_differences(impl):
    """gradcheck of the gates with respect to x and the router weight, k = 1, 2, 3 (no near-ties)"""
    for k in (1, 2, 3):
        x, w = random_tensor((5, 3), seed=30 + k), random_tensor((3, 4), seed=40 + k)
        with mt.num_threads(1):  # tiny arrays: waking threads would cost more than the work
            gates = impl.route(x, w, k)[1]
            expect(
                isinstance(gates, mt.Tensor) and gates.requires_grad,
                f"route(x, w, k={k}) returned gates that do not depend on x and w: compute them from the probs Tensor "
                "with tensor ops (or TopKGates.apply(probs, ...)), not from probs.data",
            )
            gradcheck(lambda x, w: impl.route(x, w, k)[1], [x, w])


def test_aux_loss_matches_models_moe(impl):
    """the aux loss and its gradient in the router weight equal gpt/model/electives/moe.py's, k = 1 and 2"""
    with mt.num_threads(1):  # tiny arrays: waking threads would cost more than the work
        for k in (1, 2):
            check_aux_loss_against_models_moe(impl, k)


def check_aux_loss_against_models_moe(impl, k):
    """The aux loss of a MixtureOfExperts layer with top_k = k, and yours on the same router."""
    mt.manual_seed(k)
    layer = MixtureOfExperts(n_embd=4, n_expert=4, top_k=k, hidden=4, dtype=mt.float64)
    x = random_tensor((6, 4), seed=50 + k, requires_grad=False)
    layer(x)
    layer.aux_loss.backward()
    w = mt.tensor(layer.router.weight.numpy().copy(), requires_grad=True)
    probs = F.softmax(x @ w, dim=-1)
    loss = impl.load_balancing_loss(probs, F.top_k_experts(probs, k))
    expect(isinstance(loss, mt.Tensor) and loss.shape == (), f"load_balancing_loss must return a scalar Tensor, got {loss!r}")
    expect_close(f"the aux loss, k = {k}", loss, layer.aux_loss, "MixtureOfExperts.aux_loss (gpt/model/electives/moe.py)")
    loss.backward()
    expect(w.grad is not None, "no gradient reached the router weight through your aux loss: build it from tensor ops")
    expect_close(f"d aux / d W_r (4, 4), k = {k}", w.grad, layer.router.weight.grad, "gpt/model/electives/moe.py's aux loss backward", atol=1e-12)


def test_aux_loss_known_values(impl):
    """uniform routing gives exactly 1; a collapsed router gives E · P_0 > 1"""
    uniform = mt.tensor(np.full((8, 4), 0.25), requires_grad=True)
    balanced = {1: np.arange(8).reshape(8, 1) % 4, 2: (np.arange(16).reshape(8, 2) % 4)}
    for k, experts in balanced.items():
        loss = impl.load_balancing_loss(uniform, experts)
        expect_close(f"the aux loss of a uniform router, every expert 2k of the 8k slots (k = {k})", loss, np.array(1.0), "E · sum (1/E)(1/E) = 1")
    collapsed = mt.tensor(np.tile([0.97, 0.01, 0.01, 0.01], (8, 1)), requires_grad=True)
    loss = impl.load_balancing_loss(collapsed, np.zeros((8, 1), dtype=np.int64))
    expect_close("the aux loss when all 8 tokens go to expert 0 with p = 0.97", loss, np.array(4 * 0.97), "E · f_0 P_0 = 4 · 1 · 0.97")


def test_aux_loss_gradient(impl):
    """gradcheck of the aux loss in p; f is a constant, so dL/dp[n, e] = E f_e / N"""
    probs = positive_probs((6, 4), 60)
    experts = F.top_k_experts(probs, 2)
    gradcheck(lambda p: impl.load_balancing_loss(p, experts), [probs])
    probs.grad = None  # gradcheck left its own (random upstream) gradient there
    impl.load_balancing_loss(probs, experts).backward()
    fraction = np.bincount(experts.reshape(-1), minlength=4) / 12
    expected = np.tile(4 * fraction / 6, (6, 1))
    expect_close("dL/dp (6, 4) of the aux loss", probs.grad, expected, "E f_e / N, the same for every token")
