"""The mixture-of-experts layer (gpt/model/electives/moe.py) and its ops (microtensor/ops/electives/moe.py).

- Each op against numpy written here; the layer against a dense numpy MoE written here (every
  expert on every token, weighted by the renormalized top-k gates (top-1: the probability itself),
  zero for the experts not chosen).
- The whole layer's gradients (input, router, experts, with and without biases, GELU and SwiGLU)
  and the aux loss's against finite differences, at inputs drawn so that no token's k-th and
  (k+1)-th probabilities are close (a tie would let a finite-difference step swap experts).
- top_k = E is the dense, softly weighted mixture; tokens_per_expert sums to N k; the errors name
  the flag; no_grad computes the same; both kernel sets agree.
"""
import math

import numpy as np
import pytest

import microtensor as mt
from microtensor.errors import InputError, InputTypeError
from microtensor.ops.electives import moe as ops
from helpers import needs_jit
from gpt.model.electives.moe import MixtureOfExperts, expert_utilization, total_aux_loss

TIE_GAP = 1e-2  # the least gap between a token's k-th and (k+1)-th probability in gradient checks


@pytest.fixture(autouse=True)
def one_thread():
    """Every test here runs on one thread: its shapes are a few numbers, and waking other threads
    for each of the thousands of small kernel calls a gradient check makes costs more than the work."""
    with mt.num_threads(1):
        yield


# --------------------------------------------------------------------------------- numpy, written here


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def silu(x):
    return x / (1 + np.exp(-x))


def softmax_rows(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def linear(x, layer):
    y = x @ layer.weight.data
    return y if layer.bias is None else y + layer.bias.data


def expert_numpy(expert, x, kind):
    if kind == "swiglu":
        h = silu(linear(x, expert.c_fc)) * linear(x, expert.c_up)
    else:
        h = gelu_tanh(linear(x, expert.c_fc))
    return linear(h, expert.c_proj)


def router_probs(layer, x):
    """The router's probabilities (N, E) for x (..., C), in float64."""
    rows = x.reshape(-1, x.shape[-1]).astype(np.float64)
    return softmax_rows(rows @ layer.router.weight.data.astype(np.float64))


def dense_moe(layer, x):
    """Every expert on every token; each token's output is the sum over its k most probable experts
    (largest first, ties to the lower number) of gate * answer, gates the k probabilities / their sum
    (for k = 1, Switch's gate: the probability itself)."""
    rows = x.reshape(-1, x.shape[-1])
    p = router_probs(layer, x)  # (N, E)
    N, E, k = p.shape[0], layer.n_expert, layer.top_k
    answers = np.stack([expert_numpy(ex, rows, layer.kind) for ex in layer.experts])  # (E, N, C)
    weights = np.zeros((N, E))  # the renormalized gate of each (token, expert), zero when not chosen
    for n in range(N):
        chosen = sorted(range(E), key=lambda e: (-p[n, e], e))[:k]
        total = sum(p[n, e] for e in chosen) if k > 1 else 1.0
        for e in chosen:
            weights[n, e] = p[n, e] / total
    out = np.einsum("ne,enc->nc", weights, answers)
    return out.reshape(x.shape), weights, p


def make_layer(seed=0, C=4, E=4, k=2, hidden=6, bias=False, kind="gelu", dtype=mt.float64):
    mt.manual_seed(seed)
    layer = MixtureOfExperts(C, E, k, hidden, bias=bias, dtype=dtype, kind=kind)
    # a router with weights of about unit size: probabilities far apart, so ties are rare
    layer.router.weight.data[...] = np.random.default_rng(seed).standard_normal(layer.router.weight.shape)
    return layer


def untied_input(layer, shape, seed=0):
    """x of `shape` whose every token's k-th and (k+1)-th router probabilities differ by at least
    TIE_GAP: redrawn until they do."""
    rng = np.random.default_rng(seed)
    for _ in range(1000):
        x = rng.uniform(-1.5, 1.5, shape)
        p = np.sort(router_probs(layer, x), axis=1)[:, ::-1]  # (N, E), largest first
        if layer.top_k == layer.n_expert or np.min(p[:, layer.top_k - 1] - p[:, layer.top_k]) > TIE_GAP:
            return mt.tensor(x.astype(layer.router.weight.dtype), requires_grad=True)
    raise AssertionError("no untied input found in 1000 draws")


def params(layer):
    return list(layer.parameters())


# --------------------------------------------------------------------------------- the ops


def test_ops_match_numpy(kernel_set):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 3))
    rows = np.array([4, 0, 4, 2])
    np.testing.assert_array_equal(ops.gather_rows(mt.tensor(x), rows).data, x[rows])

    values, weights = rng.standard_normal((4, 3)), rng.standard_normal(4)
    expected = np.zeros((6, 3))
    for m, row in enumerate(rows):  # row 4 twice: both added
        expected[row] += weights[m] * values[m]
    np.testing.assert_allclose(ops.scatter_add_rows(mt.tensor(values), rows, 6, mt.tensor(weights)).data, expected, rtol=1e-15)
    np.testing.assert_allclose(ops.scatter_add_rows(mt.tensor(values), rows, 6).data, ops.scatter_add_rows_reference(values, rows, 6), rtol=1e-15)

    probs = softmax_rows(rng.standard_normal((5, 4)))
    experts = ops.top_k_experts(probs, 2)
    gates = ops.top_k_gates(mt.tensor(probs), experts).data
    for n in range(5):
        first, second = np.argsort(-probs[n])[:2]
        np.testing.assert_allclose(gates[n], probs[n, [first, second]] / (probs[n, first] + probs[n, second]), rtol=1e-14)
    np.testing.assert_allclose(gates.sum(axis=1), 1.0, rtol=1e-14)


def test_gather_and_scatter_add_are_each_others_transpose(kernel_set):
    # <gather(x), v> = <x, scatter_add(v)> for all x, v: as matrices, S and Sᵀ
    rng = np.random.default_rng(2)
    rows = np.array([1, 1, 3, 0, 1])
    x, v = rng.standard_normal((4, 2)), rng.standard_normal((5, 2))
    left = np.sum(ops.gather_rows(mt.tensor(x), rows).data * v)
    right = np.sum(x * ops.scatter_add_rows(mt.tensor(v), rows, 4).data)
    assert left == pytest.approx(right, rel=1e-14)


def test_op_gradients_match_numpy(kernel_set):
    rng = np.random.default_rng(3)
    rows = np.array([2, 0, 2])
    values = mt.tensor(rng.standard_normal((3, 2)), requires_grad=True)
    weights = mt.tensor(rng.standard_normal(3), requires_grad=True)
    g = rng.standard_normal((4, 2))
    ops.scatter_add_rows(values, rows, 4, weights).backward(g)
    np.testing.assert_allclose(values.grad, weights.data[:, None] * g[rows], rtol=1e-15)
    np.testing.assert_allclose(weights.grad, np.sum(g[rows] * values.data, axis=1), rtol=1e-14)

    probs = mt.tensor(softmax_rows(rng.standard_normal((3, 4))), requires_grad=True)
    experts = np.array([[1, 3], [0, 2], [2, 1]])
    g = rng.standard_normal((3, 2))
    ops.top_k_gates(probs, experts).backward(g)
    expected = np.zeros((3, 4))
    for n in range(3):  # d(q_j / s)/dq_i = (δ_ij - gates_j) / s, written as the full k x k Jacobian
        q = probs.data[n, experts[n]]
        s = q.sum()
        jacobian = (np.eye(2) - (q / s)[:, None]) / s  # [j, i]
        expected[n, experts[n]] = g[n] @ jacobian
    np.testing.assert_allclose(probs.grad, expected, rtol=1e-13)


def test_top_k_experts_ranks_ties_by_number():
    probs = np.array([[0.25, 0.25, 0.25, 0.25], [0.1, 0.4, 0.1, 0.4], [0.7, 0.1, 0.1, 0.1]])
    np.testing.assert_array_equal(ops.top_k_experts(probs, 2), [[0, 1], [1, 3], [0, 1]])
    rng = np.random.default_rng(4)
    probs = np.round(softmax_rows(rng.standard_normal((20, 5))), 1)  # rounded: many ties
    for k in range(1, 6):
        np.testing.assert_array_equal(ops.top_k_experts(probs, k), ops.top_k_experts_reference(probs, k))


def test_top_k_experts_refuses_a_nan_probability():
    """A NaN has no rank (argsort put it last, as if it were the least probable): the router has
    failed, and top_k_gates would refuse the row anyway, so top_k_experts says where it is."""
    probs = np.array([[0.2, 0.3, 0.5], [0.1, np.nan, 0.5]])
    with pytest.raises(InputError, match=r"^top_k_experts: probs\[1, 1\] is NaN; expected probabilities"):
        ops.top_k_experts(probs, 2)
    with pytest.raises(InputError, match=r"^top_k_experts: probs\[1, 1\] is NaN"):
        ops.top_k_experts(mt.tensor(probs), 1)


def test_top_k_gates_refuses_an_expert_chosen_twice():
    probs = mt.tensor(np.array([[0.2, 0.3, 0.5], [0.1, 0.4, 0.5]]), requires_grad=True)
    with pytest.raises(InputError, match=r"^top_k_gates: row 1 of experts chooses expert 2 twice; expected k different experts per row"):
        ops.top_k_gates(probs, [[0, 1], [2, 2]])
    with pytest.raises(InputError, match=r"^top_k_gates: row 0 of experts chooses expert 0 twice"):
        ops.top_k_gates(probs, np.array([[0, 1, 0], [0, 1, 2]]))
    ops.top_k_gates(probs, [[2, 1, 0], [0, 2, 1]])  # every expert once: fine


def test_op_errors():
    x = mt.tensor(np.zeros((3, 2)))
    with pytest.raises(InputError, match=r"gather_rows: rows holds 3, out of range: every value must be in \[0, 3\)"):
        ops.gather_rows(x, [0, 3])
    with pytest.raises(InputError, match=r"gather_rows: rows holds -1"):
        ops.gather_rows(x, np.array([-1]))
    with pytest.raises(InputTypeError, match="gather_rows: rows must hold integers, got float64"):
        ops.gather_rows(x, np.array([0.0]))
    with pytest.raises(InputError, match=r"gather_rows: x must be a 2-d Tensor \(N, C\), got shape \(6,\)"):
        ops.gather_rows(x.reshape(6), [0])
    with pytest.raises(InputError, match=r"scatter_add_rows: rows holds 2, out of range: every value must be in \[0, 2\)"):
        ops.scatter_add_rows(x, [0, 1, 2], 2)
    with pytest.raises(InputError, match="scatter_add_rows: rows has 2 entries for 3 rows of values"):
        ops.scatter_add_rows(x, [0, 1], 2)
    with pytest.raises(InputError, match=r"scatter_add_rows: weights must have shape \(3,\)"):
        ops.scatter_add_rows(x, [0, 1, 1], 2, mt.tensor(np.ones(2)))
    with pytest.raises(InputTypeError, match="scatter_add_rows: inputs have different dtypes"):
        ops.scatter_add_rows(x, [0, 1, 1], 2, mt.tensor(np.ones(3, dtype=np.float32)))
    probs = mt.tensor(np.array([[0.0, 0.0, 1.0], [0.5, 0.25, 0.25]]))
    with pytest.raises(InputError, match="top_k_gates: the chosen probabilities of row 0 add up to 0.0"):
        ops.top_k_gates(probs, [[0, 1], [0, 1]])
    with pytest.raises(InputError, match=r"top_k_gates: experts holds 3, out of range: every value must be in \[0, 3\)"):
        ops.top_k_gates(probs, [[2, 3], [0, 1]])
    with pytest.raises(InputError, match=r"top_k_gates: experts must be \(N, k\) with N = 2"):
        ops.top_k_gates(probs, [[2, 1]])
    with pytest.raises(InputError, match=r"top_k_experts: k must be in \[1, 3\], got 4"):
        ops.top_k_experts(probs, 4)


# --------------------------------------------------------------------------------- the layer against numpy


@pytest.mark.parametrize(
    "E, k, bias, kind",
    [(4, 2, False, "gelu"), (3, 1, True, "gelu"), (4, 3, True, "swiglu"), (1, 1, False, "gelu")],
)
def test_layer_matches_dense_numpy(kernel_set, E, k, bias, kind):
    layer = make_layer(seed=E + k, E=E, k=k, bias=bias, kind=kind)
    x = mt.tensor(np.random.default_rng(5).uniform(-1.5, 1.5, (2, 5, 4)))
    expected, weights, _ = dense_moe(layer, x.data)
    np.testing.assert_allclose(layer(x).data, expected, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(layer.tokens_per_expert, np.count_nonzero(weights, axis=0))


def test_layer_in_float32_matches_numpy(kernel_set):
    layer = make_layer(seed=6, dtype=mt.float32)
    x = mt.tensor(np.random.default_rng(6).uniform(-1.5, 1.5, (3, 4, 4)).astype(np.float32))
    out = layer(x)
    assert out.dtype == mt.float32 and layer.aux_loss.dtype == mt.float32
    expected, _, _ = dense_moe(layer, x.data.astype(np.float64))
    np.testing.assert_allclose(out.data, expected, rtol=1e-4, atol=1e-5)


def test_top_k_equal_to_n_expert_is_the_dense_soft_mixture(kernel_set):
    layer = make_layer(seed=7, E=3, k=3)
    x = mt.tensor(np.random.default_rng(7).uniform(-1.5, 1.5, (2, 3, 4)))
    rows = x.data.reshape(-1, 4)
    p = router_probs(layer, x.data)  # every expert chosen: the gates are the probabilities themselves
    soft = sum(p[:, [e]] * expert_numpy(layer.experts[e], rows, "gelu") for e in range(3))
    np.testing.assert_allclose(layer(x).data.reshape(-1, 4), soft, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(layer.tokens_per_expert, [6, 6, 6])
    # and then f_e = 1/E for every e, so the aux loss is E sum_e (1/E) P_e = sum_e P_e = 1
    assert layer.aux_loss.item() == pytest.approx(1.0, rel=1e-12)


def test_aux_loss_and_tokens_per_expert_by_hand(kernel_set):
    layer = make_layer(seed=8, E=4, k=2)
    x = mt.tensor(np.random.default_rng(8).uniform(-1.5, 1.5, (3, 5, 4)))
    layer(x)
    _, weights, p = dense_moe(layer, x.data)
    N, E, k = 15, 4, 2
    chosen = weights > 0  # (N, E)
    assert layer.tokens_per_expert.dtype.kind == "i" and layer.tokens_per_expert.shape == (E,)
    assert layer.tokens_per_expert.sum() == N * k
    np.testing.assert_array_equal(layer.tokens_per_expert, chosen.sum(axis=0))
    f = chosen.sum(axis=0) / (N * k)
    P = p.mean(axis=0)
    assert layer.aux_loss.shape == () and layer.aux_loss.item() == pytest.approx(E * np.sum(f * P), rel=1e-12)


def test_unused_expert_does_no_work_and_gets_no_gradient():
    layer = make_layer(seed=9, E=3, k=1)
    layer.router.weight.data[...] = 0
    layer.router.weight.data[:, 2] = -5.0  # expert 2 loses for every token whose entries are positive
    x = mt.tensor(np.random.default_rng(9).uniform(0.5, 1.5, (2, 3, 4)), requires_grad=True)
    (layer(x).sum() + layer.aux_loss).backward()
    assert layer.tokens_per_expert[2] == 0
    assert all(p.grad is None for p in layer.experts[2].parameters())
    assert layer.router.weight.grad is not None and x.grad is not None


# --------------------------------------------------------------------------------- gradients


def test_with_top_1_the_gate_is_the_probability_so_the_router_learns_from_the_output(kernel_set):
    # a renormalized single gate would be p / p = 1 and send the router nothing; Switch's gate p does
    layer = make_layer(seed=17, C=3, E=3, k=1, hidden=4)
    x = untied_input(layer, (2, 3, 3), seed=17)
    out = layer(x)
    expected, weights, p = dense_moe(layer, x.data)
    np.testing.assert_allclose(out.data, expected, rtol=1e-12, atol=1e-12)
    assert np.all((weights == 0) | (weights == p))  # each token's one gate is its top probability
    out.sum().backward()
    assert np.any(layer.router.weight.grad != 0)


@pytest.mark.parametrize(
    "E, k, bias, kind",
    [(4, 2, False, "gelu"), (3, 1, True, "gelu"), (3, 2, True, "swiglu"), (3, 3, False, "gelu")],
)
def test_layer_gradcheck(kernel_set, E, k, bias, kind):
    layer = make_layer(seed=10 + E + k, C=3, E=E, k=k, hidden=4, bias=bias, kind=kind)
    x = untied_input(layer, (2, 3, 3), seed=E + k)
    # the output and the aux loss together, so one check covers both paths to the router
    coefficient = 0.7

    def output(x, *weights):
        out = layer(x)
        return out + coefficient * layer.aux_loss

    assert mt.gradcheck(output, [x, *params(layer)])


def test_aux_loss_gradcheck_and_its_gradient_by_hand(kernel_set):
    layer = make_layer(seed=11, C=3, E=4, k=2, hidden=4)
    x = untied_input(layer, (2, 4, 3), seed=11)
    assert mt.gradcheck(lambda x, w: (layer(x), layer.aux_loss)[1], [x, layer.router.weight])
    # by hand: aux = E sum_e f_e mean_n p[n, e], f constant, so d aux / d p[n, e] = E f_e / N, and
    # through the softmax (rows of p, logits z = x W_r): d aux / d z = p (a - <a, p>), a = E f / N
    layer.router.weight.grad = None
    layer(x)
    layer.aux_loss.backward()
    p = router_probs(layer, x.data)
    N, E = p.shape
    a = E * (layer.tokens_per_expert / (N * layer.top_k)) / N  # (E,)
    dz = p * (a - (p @ a)[:, None])  # (N, E)
    np.testing.assert_allclose(layer.router.weight.grad, x.data.reshape(N, -1).T @ dz, rtol=1e-12, atol=1e-15)


# --------------------------------------------------------------------------------- errors, no_grad, sets


def test_constructor_errors_name_the_flag():
    with pytest.raises(InputError, match=r"top_k \(expert_top_k, --expert-top-k\) must be in \[1, n_expert\] = \[1, 4\].*got 5"):
        MixtureOfExperts(4, 4, 5, 8)
    with pytest.raises(InputError, match=r"top_k \(expert_top_k, --expert-top-k\) must be in \[1, n_expert\] = \[1, 4\].*got 0"):
        MixtureOfExperts(4, 4, 0, 8)
    with pytest.raises(InputTypeError, match=r"top_k \(expert_top_k, --expert-top-k\) must be an int, got float 2.0"):
        MixtureOfExperts(4, 4, 2.0, 8)
    with pytest.raises(InputError, match=r"n_expert \(--n-expert\) must be >= 1, got 0"):
        MixtureOfExperts(4, 0, 1, 8)
    with pytest.raises(InputTypeError, match=r"n_expert \(--n-expert\) must be an int, got bool True"):
        MixtureOfExperts(4, True, 1, 8)
    with pytest.raises(InputError, match=r"kind must be one of \('gelu', 'swiglu'\), got 'relu'"):
        MixtureOfExperts(4, 2, 1, 8, kind="relu")


def test_forward_errors():
    layer = make_layer(seed=12)
    with pytest.raises(InputError, match=r"last dim is n_embd = 4, got shape \(2, 3\)"):
        layer(mt.tensor(np.zeros((2, 3))))
    with pytest.raises(InputTypeError, match="expected a float64 input"):
        layer(mt.tensor(np.zeros((2, 4), dtype=np.float32)))
    with pytest.raises(InputError, match="has no tokens to route"):
        layer(mt.tensor(np.zeros((0, 3, 4))))


def test_no_grad_computes_the_same_without_a_graph(kernel_set):
    layer = make_layer(seed=13)
    x = mt.tensor(np.random.default_rng(13).uniform(-1.5, 1.5, (2, 4, 4)))
    with_graph = layer(x)
    aux, counts = layer.aux_loss.item(), layer.tokens_per_expert.copy()
    with mt.no_grad():
        without = layer(x)
    assert with_graph.requires_grad and not without.requires_grad and not layer.aux_loss.requires_grad
    np.testing.assert_array_equal(without.data, with_graph.data)
    assert layer.aux_loss.item() == aux
    np.testing.assert_array_equal(layer.tokens_per_expert, counts)
    # one token at a time (as generation with a KV cache feeds them) gives each token's same output
    with mt.no_grad():
        one_by_one = [layer(x[:, t : t + 1]).data for t in range(4)]
    np.testing.assert_allclose(np.concatenate(one_by_one, axis=1), with_graph.data, rtol=1e-14, atol=1e-16)


@needs_jit
def test_both_kernel_sets_agree():
    layer = make_layer(seed=14, C=8, E=4, k=2, hidden=16, dtype=mt.float32)
    x = mt.tensor(np.random.default_rng(14).uniform(-1.5, 1.5, (4, 8, 8)).astype(np.float32), requires_grad=True)
    upstream = np.random.default_rng(15).standard_normal(x.shape).astype(np.float32)
    results = {}
    for name in ("readable", "fast"):
        with mt.using_kernels(name):
            x.grad = None
            layer.zero_grad()
            out = layer(x)
            (out * mt.tensor(upstream)).sum().backward()
            results[name] = [out.data.copy(), x.grad.copy()] + [p.grad.copy() for p in params(layer)]
            results[name].append(layer.aux_loss.data.copy())
    for readable, fast in zip(results["readable"], results["fast"]):
        scale = max(1.0, float(np.abs(readable).max()))
        np.testing.assert_allclose(fast, readable, rtol=2e-4, atol=2e-5 * scale)


def test_model_helpers():
    from microtensor import nn

    class TwoLayers(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = make_layer(seed=15)
            self.second = make_layer(seed=16)

        def forward(self, x):
            return self.second(self.first(x))

    model = TwoLayers()
    with pytest.raises(InputError, match="has not run a forward yet"):
        total_aux_loss(model)
    model(mt.tensor(np.random.default_rng(16).uniform(-1, 1, (2, 3, 4))))
    total = total_aux_loss(model)
    assert total.item() == pytest.approx(model.first.aux_loss.item() + model.second.aux_loss.item())
    use = expert_utilization(model)
    assert list(use) == ["first", "second"]
    for name, fractions in use.items():
        np.testing.assert_allclose(fractions, getattr(model, name).tokens_per_expert / 12)
    assert total_aux_loss(nn.Linear(2, 2)) is None
