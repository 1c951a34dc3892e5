"""Gradient checkpointing (microtensor/ops/electives/checkpointing.py, GPTConfig.checkpoint_activations):
the gradients equal those without it bit for bit in float64, with dropout (its masks replayed),
through parameters fn uses, nested checkpoints, several outputs and inputs without gradients; the
graph holds one node per checkpointed block; bad uses are clear errors. Tests taking `kernel_set`
run once with each kernel set. The gradient check of the op itself is in the registry."""
import io

import numpy as np
import pytest
from rich.console import Console

import microtensor as mt
import microtensor.functional as F
import train
from microtensor import debug
from microtensor.errors import GraphError, InputError, InputTypeError
from gpt.model.transformer import GPT, ConfigError, GPTConfig, training_step_bytes
from test_gpt import bytes_the_graph_keeps
from test_programs import TINY, corpus, parameters, said  # noqa: F401 (corpus is a fixture)


def leaf(*shape, seed=0):
    return mt.tensor(np.random.default_rng(seed).uniform(-1.5, 1.5, shape), requires_grad=True)


def gradients_of(step, tensors):
    """Run step() -> loss, backward, and return the .grad of each tensor (copies), clearing them."""
    for t in tensors:
        t.grad = None
    step().backward()
    grads = [None if t.grad is None else t.grad.copy() for t in tensors]
    for t in tensors:
        t.grad = None
    return grads


def assert_bitwise_equal(got, expected):
    for index, (a, b) in enumerate(zip(got, expected)):
        assert (a is None) == (b is None), index
        if a is not None:
            assert a.dtype == b.dtype and np.array_equal(a, b), f"gradient {index} differs by {np.max(np.abs(a - b))}"


def two_layers(weights):
    """A small segment using weights it does not take as inputs, its input twice, and dropout."""
    w1, b1, w2 = weights

    def segment(x):
        h = F.gelu(x @ w1 + b1, approximate="tanh")
        return F.dropout(h @ w2, 0.25) + x

    return segment


def test_gradients_equal_without_checkpointing_bit_for_bit(kernel_set):
    x, weights = leaf(4, 6), [leaf(6, 8, seed=1), leaf(8, seed=2), leaf(8, 6, seed=3)]
    segment = two_layers(weights)
    upstream = mt.tensor(np.random.default_rng(9).standard_normal((4, 6)))

    def loss(run):
        mt.manual_seed(5)
        y = run(x)
        return (y * upstream).sum() + F.dropout(y, 0.5).sum()  # a draw after the segment, too

    plain = gradients_of(lambda: loss(segment), [x, *weights])
    kept = gradients_of(lambda: loss(lambda x: mt.checkpoint(segment, x)), [x, *weights])
    assert all(g is not None for g in kept)  # the weights fn closes over get theirs
    assert_bitwise_equal(kept, plain)


def test_a_weight_used_inside_and_outside_gets_its_sum_in_another_order():
    """w's three contributions (two inside fn, one after it) are added as (a + b) + c with
    checkpointing, in the walk's order of the whole graph without: equal to a few ulps, not bit for bit."""
    x, w = leaf(5, 7), leaf(7, 7, seed=1)
    upstream = mt.tensor(np.random.default_rng(2).standard_normal((5, 7)))

    def segment(x):
        h = x @ w
        return (h.tanh() @ w) * h

    plain = gradients_of(lambda: ((segment(x) @ w).tanh() * upstream).sum(), [x, w])
    kept = gradients_of(lambda: ((mt.checkpoint(segment, x) @ w).tanh() * upstream).sum(), [x, w])
    assert np.array_equal(kept[0], plain[0])  # x's gradient comes back whole through the one input
    np.testing.assert_allclose(kept[1], plain[1], rtol=1e-13, atol=0)


def test_dropout_masks_are_replayed_and_the_callers_random_state_given_back():
    x = leaf(50, 40)

    def masked(x):
        return F.dropout(x, 0.5)

    mt.manual_seed(3)
    y = mt.checkpoint(masked, x)
    after_forward = mt.get_generator().random(3)  # the caller's draws go on from forward's state
    y.sum().backward()
    after_backward = mt.get_generator().random(3)
    mt.manual_seed(3)
    expected = masked(x.detach())
    np.testing.assert_array_equal(y.data, expected.data)
    np.testing.assert_array_equal(x.grad, (expected.data != 0) * 2.0)  # the mask of forward, scaled by 1/(1-p)
    np.testing.assert_array_equal(after_forward, mt.get_generator().random(3))
    np.testing.assert_array_equal(after_backward, mt.get_generator().random(3))  # backward's replay drew nothing of the caller's


def test_nested_checkpoints(kernel_set):
    x, weights = leaf(3, 6), [leaf(6, 8, seed=1), leaf(8, seed=2), leaf(8, 6, seed=3)]
    inner = two_layers(weights)

    def outer(x):
        return mt.checkpoint(inner, x.tanh()) * x

    def loss(run):
        mt.manual_seed(1)
        return (run(x) ** 2).sum()

    plain = gradients_of(lambda: loss(lambda x: inner(x.tanh()) * x), [x, *weights])
    nested = gradients_of(lambda: loss(lambda x: mt.checkpoint(outer, x)), [x, *weights])
    assert_bitwise_equal(nested, plain)


def test_several_outputs_come_back_in_their_shapes_with_their_gradients():
    x, w = leaf(3, 4), leaf(4, 5, seed=1)

    def parts(x):
        y = x @ w
        return y.tanh(), y.sum(-1)

    plain = gradients_of(lambda: (parts(x)[0] * 3).sum() + (parts(x)[1] ** 2).sum(), [x, w])
    a, b = mt.checkpoint(parts, x)
    assert a.shape == (3, 5) and b.shape == (3,)
    np.testing.assert_array_equal(a.data, parts(x)[0].data)
    kept = gradients_of(lambda: (mt.checkpoint(parts, x)[0] * 3).sum() + (mt.checkpoint(parts, x)[1] ** 2).sum(), [x, w])
    assert_bitwise_equal(kept, plain)


@pytest.mark.parametrize(
    "returned, error, words",
    [
        (lambda x: x.data, InputTypeError, "returned ndarray of shape (2, 3)"),
        (lambda x: None, InputTypeError, "returned NoneType"),
        (lambda x: [x, x], InputTypeError, "returned list of length 2"),
        (lambda x: (), InputTypeError, "expected a Tensor or a tuple of Tensors"),
        (lambda x: (x, 2.0), InputTypeError, "expected a Tensor or a tuple of Tensors"),
        (lambda x: (x, x.float()), InputError, "dtypes float32, float64"),
    ],
)
def test_a_function_returning_no_tensor_or_mixed_dtypes_is_refused(returned, error, words):
    with pytest.raises(error, match="checkpoint: the function") as raised:
        mt.checkpoint(returned, leaf(2, 3))
    assert words in str(raised.value)


def test_inputs_without_gradients(kernel_set):
    x, mask, w = leaf(3, 4), mt.tensor(np.tril(np.ones((3, 4)))), leaf(4, 4, seed=1)

    def segment(x, mask, scale):
        return (x @ w).tanh() * mask * scale

    plain = gradients_of(lambda: segment(x, mask, 2.0).sum(), [x, w, mask])
    kept = gradients_of(lambda: mt.checkpoint(segment, x, mask, 2.0).sum(), [x, w, mask])
    assert kept[2] is None
    assert_bitwise_equal(kept, plain)
    # no input needs a gradient: fn runs with its graph, so that its weight still gets one
    constant = mt.tensor(x.data)
    plain = gradients_of(lambda: segment(constant, mask, 2.0).sum(), [w])
    kept = gradients_of(lambda: mt.checkpoint(segment, constant, mask, 2.0).sum(), [w])
    assert_bitwise_equal(kept, plain)


def test_backward_twice_with_retain_graph_and_under_no_grad():
    x = leaf(2, 3)
    y = mt.checkpoint(lambda x: x.tanh() * x, x).sum()
    y.backward(retain_graph=True)
    first = x.grad.copy()
    y.backward()
    np.testing.assert_array_equal(x.grad, 2 * first)
    with mt.no_grad():
        z = mt.checkpoint(lambda x: x.tanh(), x)
    assert not z.requires_grad and np.array_equal(z.data, np.tanh(x.data))
    z = mt.checkpoint(lambda x: x.tanh(), x).sum()
    with mt.no_grad(), pytest.raises(GraphError, match="checkpoint: backward ran inside no_grad"):
        z.backward()


def test_an_input_changed_in_place_after_forward_is_refused():
    x = leaf(2, 3)
    y = x * 1.0
    z = mt.checkpoint(lambda y: y.tanh(), y).sum()
    y.data += 1.0  # the setter sees the same memory: the version moves
    with pytest.raises(GraphError, match="modified in place after forward"):
        z.backward()


def test_forward_mode_goes_through_the_function():
    x, w = leaf(3, 4), leaf(4, 4, seed=1)
    v = np.random.default_rng(2).standard_normal((3, 4))
    _, plain = mt.jvp(lambda x, w: (x @ w).tanh() * x, (x, w), (v, None))
    _, kept = mt.jvp(lambda x, w: mt.checkpoint(lambda x, w: (x @ w).tanh() * x, x, w), (x, w), (v, None))
    np.testing.assert_array_equal(kept.data, plain.data)
    with pytest.raises(GraphError, match="give that tensor to checkpoint as an input"):
        mt.jvp(lambda x, w: mt.checkpoint(lambda x: (x @ w).tanh(), x), (x, w), (None, np.ones((4, 4))))


def test_fn_must_be_callable():
    with pytest.raises(InputTypeError, match="checkpoint: fn must be callable"):
        mt.checkpoint(leaf(2), leaf(2))


# ------------------------------------------------------------------------------------------ the GPT


def tiny_gpt(checkpoint_activations, **options):
    mt.manual_seed(0)
    config = GPTConfig(
        vocab_size=11, block_size=8, n_layer=3, n_head=2, n_embd=8, dropout=0.1,
        checkpoint_activations=checkpoint_activations, **options,
    )  # fmt: skip
    return GPT(config, dtype=mt.float64)


@pytest.mark.parametrize("options", [{}, {"attention": "online", "pos": "rope", "mlp": "swiglu", "bias": True}], ids=["default", "variants"])
def test_a_gpt_with_checkpointed_blocks_has_the_same_loss_and_gradients(options, kernel_set):
    plain, kept = tiny_gpt(False, **options), tiny_gpt(True, **options)
    rng = np.random.default_rng(0)
    idx, targets = mt.tensor(rng.integers(0, 11, (2, 8))), mt.tensor(rng.integers(0, 11, (2, 8)))
    losses = []
    for model in (plain, kept):
        mt.manual_seed(7)  # the same dropout masks
        _, loss = model(idx, targets)
        loss.backward()
        losses.append(loss.item())
    assert losses[0] == losses[1]
    assert [name for name, _ in plain.named_parameters()] == [name for name, _ in kept.named_parameters()]  # the same state_dict
    for (name, p), (_, q) in zip(plain.named_parameters(), kept.named_parameters()):
        assert np.array_equal(p.grad, q.grad), name


def test_the_graph_holds_one_node_per_checkpointed_block():
    model = tiny_gpt(True)
    idx = mt.tensor(np.random.default_rng(0).integers(0, 11, (2, 8)))
    _, loss = model(idx, idx)
    ops = [t.grad_fn.name for t in mt.autograd.topological_order(loss) if t.grad_fn is not None]
    assert ops.count("Checkpoint") == 3 and ops.count("LayerNorm") == 1  # ln_f's; the blocks' are inside
    assert debug.to_dot(loss).count('label="Checkpoint') == 3
    rows = debug.trace_backward(loss, console=Console(file=io.StringIO()))
    assert [row["op"] for row in rows].count("Checkpoint") == 3  # each row's time includes the block's second forward


def test_the_graph_keeps_less_and_the_estimate_says_so():
    kept = []
    for checkpointing in (False, True):
        model = tiny_gpt(checkpointing)
        idx = mt.tensor(np.random.default_rng(0).integers(0, 11, (2, 8)))
        _, loss = model(idx, idx)
        kept.append(bytes_the_graph_keeps(loss, model.parameters()))
    assert kept[1] < kept[0] / 2
    config = tiny_gpt(True).config
    estimate = training_step_bytes(config, 2, itemsize=8)["activations"]
    assert estimate < training_step_bytes(GPTConfig(**{**config.to_dict(), "checkpoint_activations": False}), 2, itemsize=8)["activations"]


def test_experts_cannot_be_checkpointed(tmp_path, corpus, capsys):
    with pytest.raises(ConfigError, match="checkpoint_activations cannot run with mlp moe"):
        GPTConfig(vocab_size=5, mlp="moe", checkpoint_activations=True)
    code = train.main(["--data", corpus, "--out-dir", str(tmp_path / "out"), *TINY, "--mlp", "moe", "--checkpoint-activations"])
    assert code == 1 and "error: --checkpoint-activations: given True, expected no --mlp moe" in said(capsys)


@pytest.mark.slow  # two training runs and a resumed one
def test_train_with_checkpointing_gives_the_same_weights_and_resumes_exactly(tmp_path, corpus):
    one, two, three = (tmp_path / name for name in ("one", "two", "three"))
    for folder in (one, two, three):
        folder.mkdir()

    def run(folder, *extra):
        return train.main(["--data", corpus, "--out-dir", str(folder / "out"), *TINY, "--dropout", "0.1", "--eval-interval", "3", *extra])

    assert run(one, "--max-iters", "6") == 0
    assert run(two, "--max-iters", "6", "--checkpoint-activations") == 0
    assert run(three, "--max-iters", "3", "--checkpoint-activations") == 0
    assert run(three, "--max-iters", "6", "--resume") == 0
    (plain, _), (kept, meta), (resumed, _) = parameters(one), parameters(two), parameters(three)
    assert meta["config"]["checkpoint_activations"] is True and sorted(kept) == sorted(plain)
    for name in plain:
        np.testing.assert_array_equal(kept[name], plain[name], err_msg=name)
        np.testing.assert_array_equal(resumed[name], kept[name], err_msg=name)


def test_the_bench_case_renders_its_table():
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "bench"
    sys.path.insert(0, str(bench))
    try:
        from cases.electives import checkpointing as case
    finally:
        sys.path.remove(str(bench))
    machine = {"date": "2031-05-06", "processor": "Made-up CPU", "isa": "avx2", "cores": 3, "numpy": "9.8.7", "numba": "6.5.4"}
    row = {
        "T": 1024, "B": 1, "attention": "online", "plain_graph_bytes": 40 << 20, "checkpointed_graph_bytes": 4 << 20,
        "plain_peak_rss_growth_bytes": 48 << 20, "checkpointed_peak_rss_growth_bytes": None, "plain_s": 0.25,
        "checkpointed_s": 0.3125, "checkpointed_over_plain": 1.25,
    }  # fmt: skip
    text = case.markdown({"machine": machine, "recipe": {**case.RECIPE, "tokens_per_step": 768}, "rows": [row]})
    assert "| 1024 | 1 | online | 40.0 MiB | 4.0 MiB | 48.0 MiB | - | 250.0 | 312.5 | 1.25× |" in text.splitlines()
    assert "GPT of 4 layers, 4 heads, 128 wide, float32, 768 tokens per step; one forward+backward:" in text
