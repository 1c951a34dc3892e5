"""Splitting a model across simulated ranks (gpt/model/electives/parallelism.py): every split gives
the unsplit model's outputs and gradients.

- the collectives: forward against their definitions, gradcheck (random upstream gradient) and the
  JVP two ways (finite differences, and <u, J v> = <Jᵀ u, v> against backward); each backward is
  its adjoint's forward (all-gather <-> reduce-scatter, all-reduce <-> all-reduce);
- column- and row-parallel Linear, Megatron's MLP (one all-reduce per forward), attention split by
  heads, and whole GPTs (k = 2 and 4, several options) against the unsplit ones;
- data parallelism (averaged all-reduced gradients = the full batch's); GPipe's schedule, its
  counted bubble against (p-1)/(m+p-1), and a pipelined step's gradients = the unsplit step's;
- ZeRO's bytes per rank; the errors; the docs page's tables equal to the functions' output.

Tolerances (float64): outputs and gradients to 1e-12 absolute and 1e-10 relative. The splits
reorder sums (a row-parallel product adds k partial sums; a copied value's gradient adds k terms),
so they agree to rounding, not bit for bit.
"""
from pathlib import Path

import numpy as np
import pytest

import microtensor as mt
from microtensor import InputError, InputTypeError, MicrotensorError, nn
from gpt.model.electives import parallelism as P
from gpt.model.transformer import GPT, GPTConfig, parameter_count

ROOT = Path(__file__).resolve().parents[2]


def assert_close(got, expected, what=""):
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12, err_msg=what)


def rank_list(shape, ranks, seed):
    rng = np.random.default_rng(seed)
    return [mt.tensor(rng.normal(size=shape), requires_grad=True) for _ in range(ranks)]


def stacked(fn):
    """A collective on a rank list -> one tensor (k, ...), as gradcheck wants one output."""
    return lambda *xs: mt.stack(fn(list(xs)))


# ================================================================================ collectives


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_collectives_compute_their_definitions(ranks):
    shards = rank_list((2, 3), ranks, seed=1)
    full = np.concatenate([s.data for s in shards], axis=-1)
    for y in P.all_gather(shards):
        assert_close(y.data, full)
    partials = rank_list((2, 3 * ranks), ranks, seed=2)
    total = sum(p.data for p in partials)
    for i, y in enumerate(P.reduce_scatter(partials)):
        assert_close(y.data, total[:, 3 * i : 3 * (i + 1)], f"reduce_scatter rank {i}")
    for y in P.all_reduce(partials):
        assert_close(y.data, total)
    x = mt.tensor(np.arange(6.0 * ranks).reshape(1, -1))
    assert [y.data.tolist() for y in P.split(x, ranks)] == [x.data[:, 6 * i : 6 * (i + 1)].tolist() for i in range(ranks)]
    assert all(np.array_equal(y.data, x.data) for y in P.broadcast(x, ranks))


COLLECTIVES = {
    "all_gather": (stacked(P.all_gather), (2, 3)),
    "reduce_scatter": (stacked(P.reduce_scatter), (2, 6)),
    "all_reduce": (stacked(P.all_reduce), (2, 3)),
}


@pytest.mark.parametrize("name", sorted(COLLECTIVES))
def test_collectives_gradcheck_and_jvp(name):
    fn, shape = COLLECTIVES[name]
    inputs = rank_list(shape, 3 if name != "reduce_scatter" else 2, seed=3)
    mt.gradcheck(fn, inputs)
    mt.jvpcheck(fn, inputs)
    mt.dot_product_check(fn, inputs)


@pytest.mark.parametrize("name", ["broadcast", "split"])
def test_entry_collectives_gradcheck_and_jvp(name):
    fn = (lambda x: mt.stack(P.broadcast(x, 3))) if name == "broadcast" else (lambda x: mt.stack(P.split(x, 3)))
    x = mt.tensor(np.random.default_rng(4).normal(size=(2, 6)), requires_grad=True)
    mt.gradcheck(fn, [x])
    mt.jvpcheck(fn, [x])
    mt.dot_product_check(fn, [x])


def test_each_backward_is_its_adjoints_forward():
    """all-gather's backward is reduce-scatter's forward on the k output gradients, and back."""
    rng = np.random.default_rng(5)
    shards = rank_list((2, 3), 2, seed=6)
    grads = [rng.normal(size=(2, 6)) for _ in range(2)]
    mt.stack(P.all_gather(shards)).backward(np.stack(grads))
    for shard, expected in zip(shards, P.reduce_scatter_arrays(grads)):
        assert_close(shard.grad, expected)
    partials = rank_list((2, 6), 2, seed=7)
    grads = [rng.normal(size=(2, 3)) for _ in range(2)]
    mt.stack(P.reduce_scatter(partials)).backward(np.stack(grads))
    for partial, expected in zip(partials, P.all_gather_arrays(grads)):
        assert_close(partial.grad, expected)
    partials = rank_list((2, 3), 2, seed=8)
    mt.stack(P.all_reduce(partials)).backward(np.stack(grads))
    for partial in partials:
        assert_close(partial.grad, grads[0] + grads[1])


# ================================================================================ tensor parallelism


def linear_and_input(bias, seed=9):
    mt.manual_seed(seed)
    linear = nn.Linear(8, 12, bias=bias, dtype=mt.float64)
    rng = np.random.default_rng(seed)
    return linear, rng.normal(size=(2, 3, 8)), rng.normal(size=(2, 3, 12))


def unsplit(layer, x, grad_out):
    x = mt.tensor(x, requires_grad=True)
    y = layer(x)
    (y * mt.tensor(grad_out)).sum().backward()
    return y.data, x.grad


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("kind", ["column", "row"])
def test_split_linears_equal_the_unsplit_one(kind, bias, ranks):
    linear, x_data, grad_out = linear_and_input(bias)
    y, x_grad = unsplit(linear, x_data, grad_out)
    split = P.ColumnParallelLinear(linear, ranks) if kind == "column" else P.RowParallelLinear(linear, ranks)
    x = mt.tensor(x_data, requires_grad=True)
    outputs = split(x)
    assert len(outputs) == ranks
    for r, output in enumerate(outputs):
        assert_close(output.data, y, f"rank {r}'s copy")
    (outputs[0] * mt.tensor(grad_out)).sum().backward()
    weight, bias_grad = split.gathered("grad")
    assert_close(weight, linear.weight.grad, "weight")
    if bias:
        assert_close(bias_grad, linear.bias.grad, "bias")
    assert_close(x.grad, x_grad, "input")


def test_a_row_parallel_linear_takes_a_sharded_input():
    linear, x_data, grad_out = linear_and_input(True)
    y, x_grad = unsplit(linear, x_data, grad_out)
    shards = [mt.tensor(x_data[..., 4 * r : 4 * (r + 1)], requires_grad=True) for r in range(2)]
    outputs = P.RowParallelLinear(linear, 2)(shards)
    assert_close(outputs[1].data, y)
    (outputs[1] * mt.tensor(grad_out)).sum().backward()
    assert_close(np.concatenate([s.grad for s in shards], axis=-1), x_grad)


def test_a_column_parallel_linear_without_gather_leaves_shards():
    linear, x_data, _ = linear_and_input(False)
    outputs = P.ColumnParallelLinear(linear, 4, gather_output=False)(mt.tensor(x_data))
    assert [o.shape for o in outputs] == [(2, 3, 3)] * 4
    assert_close(np.concatenate([o.data for o in outputs], axis=-1), x_data @ linear.weight.data)


def tiny_config(**options):
    return GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=4, n_embd=16, **options)


@pytest.mark.parametrize("mlp", ["gelu", "swiglu"])
def test_megatrons_mlp_equals_the_unsplit_one_with_one_all_reduce(mlp):
    mt.manual_seed(10)
    model = GPT(tiny_config(mlp=mlp, bias=True), dtype=mt.float64)
    block_mlp = model.transformer.h[0].mlp
    rng = np.random.default_rng(10)
    x_data, grad_out = rng.normal(size=(2, 3, 16)), rng.normal(size=(2, 3, 16))
    y, x_grad = unsplit(block_mlp, x_data, grad_out)
    split = P.TensorParallelMLP(block_mlp, 4)
    x = mt.tensor(x_data, requires_grad=True)
    with P.count_collectives() as calls:
        output = split(x)
    assert calls.get("all_reduce") == 1 and "all_gather" not in calls, calls
    assert_close(output.data, y)
    (output * mt.tensor(grad_out)).sum().backward()
    assert_close(x.grad, x_grad)
    for name in ("c_fc", "c_proj") + (("c_up",) if mlp == "swiglu" else ()):
        weight, bias = getattr(split, name).gathered("grad")
        assert_close(weight, getattr(block_mlp, name).weight.grad, name)
        assert_close(bias, getattr(block_mlp, name).bias.grad, name)


GPT_OPTIONS = [
    {},
    {"pos": "rope", "mlp": "swiglu", "bias": True},
    {"pos": "alibi", "n_kv_head": 2, "tie_weights": False, "norm": "rmsnorm"},
    {"attention": "online", "pos": "sinusoidal"},
]


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("options", GPT_OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_a_tensor_parallel_gpt_equals_the_unsplit_one(options, ranks):
    if ranks > tiny_config(**options).n_kv_head:
        pytest.skip("the key/value heads do not split over this many ranks")
    mt.manual_seed(11)
    model = GPT(tiny_config(**options), dtype=mt.float64)
    rng = np.random.default_rng(11)
    idx, targets = rng.integers(0, 11, (2, 8)), rng.integers(0, 11, (2, 8))
    logits, loss = model(idx, targets)
    loss.backward()
    split = P.TensorParallelGPT(model, ranks)
    with P.count_collectives() as calls:
        split_logits, split_loss = split(mt.tensor(idx), mt.tensor(targets))
    assert calls["all_reduce"] == 2 * model.config.n_layer  # one for attention, one for the MLP
    assert_close(split_logits.data, logits.data)
    assert_close(split_loss.data, loss.data)
    split_loss.backward()
    grads, expected = split.gathered_gradients(), dict(model.named_parameters())
    assert sorted(grads) == sorted(expected)
    for name, grad in grads.items():
        assert_close(grad, expected[name].grad, name)
    weights = split.gathered_gradients("data")
    for name, weight in weights.items():
        assert np.array_equal(weight, expected[name].data), name  # the shards are the unsplit weights, cut


@pytest.mark.slow  # the default width's float64 products take tens of seconds as plain Python
def test_the_default_gpt_tensor_parallel_equals_the_unsplit_one():
    """The default model's shape (4 layers, 4 heads, width 128) in float64, k = 2 and 4."""
    mt.manual_seed(12)
    model = GPT(GPTConfig(vocab_size=65, block_size=16), dtype=mt.float64)
    rng = np.random.default_rng(12)
    idx, targets = rng.integers(0, 65, (1, 16)), rng.integers(0, 65, (1, 16))
    _, loss = model(idx, targets)
    loss.backward()
    expected = dict(model.named_parameters())
    for ranks in (2, 4):
        split = P.TensorParallelGPT(model, ranks)
        _, split_loss = split(mt.tensor(idx), mt.tensor(targets))
        assert_close(split_loss.data, loss.data)
        split_loss.backward()
        for name, grad in split.gathered_gradients().items():
            assert_close(grad, expected[name].grad, f"{name}, k = {ranks}")


# ================================================================================ data parallelism


@pytest.mark.parametrize("ranks", [2, 4])
def test_data_parallel_gradients_equal_the_full_batch(ranks):
    mt.manual_seed(13)
    model = GPT(tiny_config(), dtype=mt.float64)
    rng = np.random.default_rng(13)
    idx, targets = rng.integers(0, 11, (4, 8)), rng.integers(0, 11, (4, 8))
    _, loss = model(idx, targets)
    loss.backward()
    grads = P.data_parallel_gradients(model, idx, targets, ranks)
    for name, p in model.named_parameters():
        assert_close(grads[name], p.grad, name)


# ================================================================================ pipeline parallelism


def test_the_gpipe_schedule_runs_each_piece_once_in_order():
    p, m = 3, 4
    schedule = P.gpipe_schedule(p, m)
    assert len(schedule) == 2 * (m + p - 1)
    when = {(s, j, d): tick for tick, work in enumerate(schedule) for s, j, d in work}
    assert len(when) == 2 * p * m == sum(len(work) for work in schedule)
    for tick, work in enumerate(schedule):
        assert len({s for s, _, _ in work}) == len(work)  # a stage runs one piece at a time
    for s in range(p):
        for j in range(m):
            if s > 0:
                assert when[s, j, "forward"] > when[s - 1, j, "forward"]  # it needs the stage before's output
                assert when[s - 1, j, "backward"] > when[s, j, "backward"]  # and sends back its gradient
            assert when[s, j, "backward"] > when[p - 1, m - 1, "forward"]  # backward starts after the last forward
    assert schedule[0] == [(0, 0, "forward")] and schedule[-1] == [(0, 0, "backward")]


@pytest.mark.parametrize("p, m", [(1, 1), (2, 1), (2, 4), (4, 4), (4, 8), (8, 32), (3, 5)])
def test_the_counted_bubble_is_the_formula(p, m):
    schedule = P.gpipe_schedule(p, m)
    idle = p * len(schedule) - sum(len(work) for work in schedule)
    assert idle == 2 * p * (p - 1)  # each stage idles p - 1 ticks in forward and p - 1 in backward
    assert P.bubble_fraction(schedule, p) == pytest.approx((p - 1) / (m + p - 1), abs=1e-15)


@pytest.mark.parametrize("stages, micro_batches", [(2, 2), (4, 4), (3, 1), (1, 2)])
def test_a_pipelined_step_equals_the_unsplit_step(stages, micro_batches):
    config = GPTConfig(vocab_size=11, block_size=8, n_layer=4, n_head=2, n_embd=8, pos="learned")
    mt.manual_seed(14)
    model = GPT(config, dtype=mt.float64)
    rng = np.random.default_rng(14)
    idx, targets = rng.integers(0, 11, (4, 8)), rng.integers(0, 11, (4, 8))
    _, loss = model(idx, targets)
    loss.backward()
    expected = {name: p.grad.copy() for name, p in model.named_parameters()}
    model.zero_grad()
    trace = []
    pipelined_loss = P.pipeline_step(model, idx, targets, stages, micro_batches, trace=trace)
    assert len(trace) == 2 * (micro_batches + stages - 1)
    assert pipelined_loss == pytest.approx(loss.item(), rel=1e-12)
    for name, p in model.named_parameters():
        assert_close(p.grad, expected[name], name)  # tied wte: used by the first and the last stage


def test_the_stages_hold_consecutive_blocks():
    assert P.stage_layers(5, 2) == [[0, 1, 2], [3, 4]]
    assert P.stage_layers(4, 4) == [[0], [1], [2], [3]]


# ================================================================================ ZeRO


def test_zero_memory_shards_one_more_part_per_stage():
    n, k = 1000, 4
    assert P.zero_memory_per_rank(n, k, 0)["total"] == 16 * n
    assert P.zero_memory_per_rank(n, k, 1) == {"weights": 2 * n, "gradients": 2 * n, "optimizer": 12 * n / k, "total": 4 * n + 12 * n / k}
    assert P.zero_memory_per_rank(n, k, 2)["total"] == 2 * n + 14 * n / k
    assert P.zero_memory_per_rank(n, k, 3)["total"] == 16 * n / k
    assert all(P.zero_memory_per_rank(n, 1, stage)["total"] == 16 * n for stage in range(4))  # one rank: nothing to share


def test_the_zero_table_counts_gpt2_small():
    rows = {(name, stage): total for name, _, stage, _, _, _, total in P.zero_table(8)}
    gpt2 = parameter_count(P.gpt2_small_config())
    assert gpt2 == 124_439_808  # GPT-2 small's published count, with tied embeddings
    assert rows["GPT-2 small", 0] == 16 * gpt2 and rows["GPT-2 small", 3] == 2 * gpt2


# ================================================================================ errors


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: P.TensorParallelGPT(GPT(tiny_config()), 3), "ranks (3) must divide n_head (4)"),
        (lambda: P.TensorParallelGPT(GPT(tiny_config(n_kv_head=1)), 2), "ranks (2) must divide n_kv_head (1)"),
        (lambda: P.TensorParallelGPT(GPT(tiny_config()), 0), "ranks must be an int >= 1"),
        (lambda: P.TensorParallelGPT(GPT(tiny_config(mlp="moe")), 2), "mlp 'moe'"),
        (lambda: P.TensorParallelGPT(GPT(tiny_config(dropout=0.1)), 2), "dropout must be 0"),
        (lambda: P.ColumnParallelLinear(nn.Linear(4, 6), 4), "ranks (4) must divide out_features (6)"),
        (lambda: P.RowParallelLinear(nn.Linear(6, 4), 4), "ranks (4) must divide in_features (6)"),
        (lambda: P.pipeline_step(GPT(tiny_config()), np.zeros((2, 8), int), np.zeros((2, 8), int), 3, 1), "stages (3) must be at most n_layer (2)"),
        (lambda: P.pipeline_step(GPT(tiny_config()), np.zeros((2, 8), int), np.zeros((2, 8), int), 2, 0), "micro_batches must be an int >= 1"),
        (lambda: P.pipeline_step(GPT(tiny_config()), np.zeros((2, 8), int), np.zeros((2, 8), int), 2, 3), "micro_batches (3) must divide the batch size (2)"),
        (lambda: P.gpipe_schedule(0, 1), "stages must be an int >= 1"),
        (lambda: P.data_parallel_gradients(GPT(tiny_config()), np.zeros((3, 8), int), np.zeros((3, 8), int), 2), "ranks (2) must divide the batch size (3)"),
        (lambda: P.zero_memory_per_rank(100, 4, 4), "stage must be 0, 1, 2 or 3"),
        (lambda: P.all_reduce([mt.zeros(2), mt.zeros(3)]), "rank 1 holds"),
        (lambda: P.reduce_scatter([mt.zeros(3), mt.zeros(3)]), "must divide the last dim (3)"),
        (lambda: P.split(mt.zeros(4), 3), "ranks (3) must divide the last dim (4)"),
        (lambda: P.broadcast(mt.zeros(4), 2.0), "ranks must be an int"),
        (lambda: P.all_gather(mt.zeros(4)), "expected a rank list"),
    ],
)
def test_bad_input_is_named(call, words):
    with pytest.raises(MicrotensorError) as error:
        call()
    assert words in str(error.value)
    assert isinstance(error.value, (InputError, InputTypeError))
# ================================================================================ the docs page


def test_the_docs_page_shows_the_functions_tables():
    page = (ROOT / "docs" / "electives" / "parallelism.md").read_text(encoding="utf-8")
    assert P.bubble_markdown() in page
    assert P.zero_markdown() in page
