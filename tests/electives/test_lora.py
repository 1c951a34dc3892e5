"""LoRA: the fused op's backward against finite differences, numpy and PyTorch; the adapters on a GPT
(B = 0 starts at the base exactly, training moves only A and B, merging keeps the logits); adapter
checkpoints; train.py --init-from with and without --lora-rank, end to end; and every refusal."""
import json
import re
import shutil
import traceback

import numpy as np
import pytest

import generate
import microtensor as mt
import train
from microtensor import gradcheck
from microtensor.errors import InputError, InputTypeError
from microtensor.gradcheck import GRADCHECK_CASES, RandomDraw
from microtensor.nn import StateDictError
from microtensor.ops.electives.lora import LoRALinear as LoRALinearOp
from microtensor.ops.electives.lora import lora_linear, lora_linear_reference
from helpers import needs_jit, rewrite_checkpoint as rewrite
from gpt.checkpoints import checkpoint
from gpt.model.transformer import GPT, GPTConfig
from gpt.model.electives.lora import (
    LoRALinear, add_lora, count_parameters, has_lora, load_lora_state_dict, lora_layers, lora_parameters,
    lora_state_dict, merge_lora,
)  # fmt: skip

CONFIG = dict(vocab_size=7, block_size=8, n_layer=2, n_head=2, n_embd=8)


def tiny(dtype=mt.float32, seed=0, **options):
    mt.manual_seed(seed)
    return GPT(GPTConfig(**{**CONFIG, **options}), dtype=dtype)


def ids(seed=1, B=2, T=6):
    return mt.tensor(np.random.default_rng(seed).integers(0, CONFIG["vocab_size"], (B, T)))


def tensor(shape, seed, dtype=np.float64, requires_grad=True, low=-1.0, high=1.0):
    values = np.random.default_rng(seed).uniform(low, high, shape).astype(dtype)
    return mt.tensor(values, requires_grad=requires_grad)


# ================================================================================= the op


def test_the_registered_gradcheck_case_passes(kernel_set):
    (case,) = GRADCHECK_CASES[LoRALinearOp]
    for seed in range(12):
        fn, inputs = case(RandomDraw(seed))
        gradcheck(fn, inputs)


@needs_jit
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_both_kernel_sets_agree(dtype):
    """As tests/test_kernel_sets.py does for every registered case (until microtensor.functional
    imports this op, its collection does not see it): the same output and gradients in both sets."""
    tolerance = dict(rtol=1e-9, atol=1e-11) if dtype == np.float64 else dict(rtol=2e-4, atol=2e-5)
    (case,) = GRADCHECK_CASES[LoRALinearOp]
    for seed in range(4):
        fn, inputs = case(RandomDraw(seed))
        inputs = [mt.tensor(x.data.astype(dtype), requires_grad=True) if x is not None else None for x in inputs]
        results = {}
        for kernel_set in ("readable", "fast"):
            with mt.using_kernels(kernel_set):
                for x in inputs:
                    if x is not None:
                        x.grad = None
                out = fn(*inputs)
                out.backward(mt.tensor(np.random.default_rng(seed).standard_normal(out.shape).astype(dtype)))
                results[kernel_set] = [out.data.copy()] + [x.grad.copy() for x in inputs if x is not None]
        for readable, fast in zip(results["readable"], results["fast"]):
            scale = max(1.0, float(np.abs(readable).max(initial=0)))
            np.testing.assert_allclose(fast, readable, rtol=tolerance["rtol"], atol=tolerance["atol"] * scale)


@pytest.mark.parametrize("weight_trains", [True, False], ids=["weight-trains", "weight-frozen"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
def test_gradcheck_against_finite_differences(kernel_set, weight_trains, with_bias):
    x = tensor((2, 3, 5), 0)  # (B, T, in): the leading dims fold into rows
    weight = tensor((5, 4), 1, requires_grad=weight_trains)
    bias = tensor((4,), 2) if with_bias else None
    lora_a, lora_b = tensor((5, 2), 3), tensor((2, 4), 4)

    def fn(x, weight, bias, lora_a, lora_b):
        return lora_linear(x, weight, bias, lora_a, lora_b, 1.5)

    gradcheck(fn, [x, weight, bias, lora_a, lora_b])
    assert (weight.grad is None) == (not weight_trains)  # a frozen weight gets no gradient at all


def test_forward_and_backward_against_numpy(kernel_set):
    """The backward of y = x W + b + s (x A) B, written out in numpy here (independent of the op):
    dx = g Wᵀ + s g Bᵀ Aᵀ, dA = s xᵀ (g Bᵀ), dB = s (x A)ᵀ g, dW = xᵀ g, db = sum of g's rows."""
    s = 0.75
    x, weight, bias = tensor((3, 4, 6), 5, np.float32), tensor((6, 5), 6, np.float32), tensor((5,), 7, np.float32)
    lora_a, lora_b = tensor((6, 3), 8, np.float32), tensor((3, 5), 9, np.float32)
    y = lora_linear(x, weight, bias, lora_a, lora_b, s)
    g = np.random.default_rng(10).standard_normal(y.shape).astype(np.float32)
    y.backward(mt.tensor(g))
    X, W, b, A, B = (t.data.astype(np.float64) for t in (x, weight, bias, lora_a, lora_b))
    rows, G = X.reshape(-1, 6), g.astype(np.float64).reshape(-1, 5)
    expected = {
        "y": (rows @ W + b + s * (rows @ A) @ B).reshape(3, 4, 5),
        "x": (G @ W.T + s * G @ B.T @ A.T).reshape(3, 4, 6),
        "lora_a": s * rows.T @ (G @ B.T),
        "lora_b": s * (rows @ A).T @ G,
        "weight": rows.T @ G,
        "bias": G.sum(axis=0),
    }
    got = {"y": y.data, "x": x.grad, "lora_a": lora_a.grad, "lora_b": lora_b.grad, "weight": weight.grad, "bias": bias.grad}
    for name, value in got.items():
        assert value.dtype == np.float32, name
        np.testing.assert_allclose(value, expected[name], rtol=1e-4, atol=1e-4, err_msg=name)
    np.testing.assert_allclose(y.data, lora_linear_reference(X, W, b, A, B, s), rtol=1e-5, atol=1e-5)


def test_gradients_against_pytorch(kernel_set):
    torch = pytest.importorskip("torch")
    s = 2.0
    arrays = [np.random.default_rng(seed).standard_normal(shape) for seed, shape in enumerate([(4, 7), (7, 3), (3,), (7, 2), (2, 3)])]
    ours = [mt.tensor(a, requires_grad=i != 1) for i, a in enumerate(arrays)]  # W (index 1) frozen
    theirs = [torch.tensor(a, requires_grad=i != 1) for i, a in enumerate(arrays)]
    upstream = np.random.default_rng(9).standard_normal((4, 3))
    lora_linear(*ours, s).backward(mt.tensor(upstream))
    x, w, b, a, bb = theirs
    (x @ w + b + s * (x @ a) @ bb).backward(torch.tensor(upstream))
    for index, (mine, reference) in enumerate(zip(ours, theirs)):
        if index == 1:
            assert mine.grad is None and reference.grad is None
        else:
            np.testing.assert_allclose(mine.grad, reference.grad.numpy(), rtol=1e-12, atol=1e-12, err_msg=f"input {index}")


def test_the_op_refuses_what_does_not_fit():
    x, w, a, b = tensor((2, 4), 0), tensor((4, 3), 1), tensor((4, 2), 2), tensor((2, 3), 3)
    cases = [
        ((x, w, None, a, b, float("nan")), InputError, "lora_linear: scale must be a finite number, got nan"),
        ((x, w, None, a, b, "1"), InputTypeError, "scale must be a number"),
        ((tensor((2, 5), 0), w, None, a, b, 1.0), InputError, "x must be (..., in) with in = weight.shape[0] = 4, got shape (2, 5)"),
        ((x, tensor((4,), 1), None, a, b, 1.0), InputError, "weight must be 2-D (in, out)"),
        ((x, w, tensor((2,), 0), a, b, 1.0), InputError, "bias must have shape (out,) = (3,), got (2,)"),
        ((x, w, None, tensor((3, 2), 2), b, 1.0), InputError, "lora_a must be (in, r) = (4, r) with r >= 1, got shape (3, 2)"),
        ((x, w, None, a, tensor((3, 3), 3), 1.0), InputError, "lora_b must be (r, out) = (2, 3)"),
        ((x, w, None, tensor((4, 2), 2, np.float32), b, 1.0), InputTypeError, "different dtypes"),
        ((x, w.data, None, a, b, 1.0), InputTypeError, "weight must be a Tensor"),
    ]
    for arguments, error, message in cases:
        with pytest.raises(error) as raised:
            lora_linear(*arguments)
        assert message in str(raised.value)


# ================================================================================= adapters on a GPT


ADAPTED_OPTIONS = [
    (dict(), "c_attn,c_proj"),
    (dict(bias=True, tie_weights=False, mlp="swiglu"), "c_attn,c_fc,c_up,c_proj,lm_head"),
    (dict(mlp="moe", pos="rope"), ["c_attn", "router", "experts.0.c_fc"]),
]


@pytest.mark.parametrize("options, targets", ADAPTED_OPTIONS, ids=["default", "all-untied-bias", "moe"])
def test_b_zero_starts_exactly_at_the_base(kernel_set, options, targets):
    model = tiny(**options)
    base_logits, base_loss = model(ids(), ids(2))
    add_lora(model, rank=2, alpha=4, targets=targets)
    logits, loss = model(ids(), ids(2))
    np.testing.assert_array_equal(logits.data, base_logits.data)  # bit-identical, not merely close
    assert loss.item() == base_loss.item()
    assert all(isinstance(layer, LoRALinear) for _, layer in lora_layers(model))


def test_add_lora_freezes_the_base_and_names_the_adapters():
    model = tiny()
    total_before = model.num_parameters()
    add_lora(model, rank=2)
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    assert names == [
        f"transformer.h.{i}.{layer}.{part}" for i in range(2) for layer in ("attn.c_attn", "attn.c_proj", "mlp.c_proj") for part in ("lora_a", "lora_b")
    ]  # "c_proj" names attention's and the MLP's output projections
    trainable, total = count_parameters(model)
    C = CONFIG["n_embd"]
    assert trainable == 2 * (2 * (C + 3 * C) + 2 * (C + C) + 2 * (4 * C + C))  # r (in + out) per layer
    assert total == total_before + trainable
    assert [p for p in lora_parameters(model)] == [p for p in model.parameters() if p.requires_grad]
    layer = model.transformer.h[0].attn.c_attn
    assert layer.scale == 1.0 and layer.alpha == 2.0  # alpha defaults to the rank
    assert np.all(layer.lora_b.data == 0) and np.all(np.abs(layer.lora_a.data) <= 1 / np.sqrt(C)) and np.any(layer.lora_a.data != 0)
    only_attention = add_lora(tiny(), rank=1, targets="attn.c_proj")
    assert [name for name, _ in lora_layers(only_attention)] == ["transformer.h.0.attn.c_proj", "transformer.h.1.attn.c_proj"]


def test_training_moves_only_the_adapters(kernel_set):
    model = add_lora(tiny(), rank=2, alpha=2)
    before = {name: p.data.copy() for name, p in model.named_parameters()}
    optimizer = mt.optim.AdamW(mt.optim.weight_decay_groups(lora_parameters(model), 0.1), lr=1e-2)
    for step in range(3):
        _, loss = model(ids(step), ids(step + 10))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for name, param in model.named_parameters():
        if name.endswith((".lora_a", ".lora_b")):
            assert not np.array_equal(param.data, before[name]), f"{name} did not train"
        else:
            np.testing.assert_array_equal(param.data, before[name], err_msg=name)  # bit-identical
            assert param.grad is None, name


def test_merging_gives_the_same_function():
    """Float64 whole model: merging changes only the order of the sums in each adapted layer, an error
    of a few units of roundoff (u = 2^-53 ≈ 1.1e-16) times the sums' length (at most in + r + 3 = 35
    terms here) relative to the terms' magnitudes, so ~1e-14; the blocks after it carry that on
    through LayerNorm, attention and the MLP, which at these sizes and weights multiply it by far
    less than 1e4. 1e-10 relative to the logits' scale is a bound with room, yet a merge that
    forgot the scale alpha/r, or B, is off by the whole update, orders of magnitude above it."""
    model = add_lora(tiny(mt.float64), rank=2, alpha=3, targets="c_attn,c_proj,c_fc")
    rng = np.random.default_rng(0)
    for p in lora_parameters(model):
        p.data[...] = rng.normal(0, 0.3, p.shape)  # as if trained: B no longer 0
    logits = model(ids())[0].data
    merged = merge_lora(model)
    assert not has_lora(merged) and has_lora(model)  # a copy: the adapted model is left as it was
    assert all(p.requires_grad for p in merged.parameters())
    assert set(merged.state_dict()) == set(tiny().state_dict())  # a plain GPT's names, nothing more
    merged_logits = merged(ids())[0].data
    np.testing.assert_allclose(merged_logits, logits, rtol=0, atol=1e-10 * np.abs(logits).max())
    assert np.abs(merged_logits - tiny(mt.float64)(ids())[0].data).max() > 1e-3  # the update is there


def test_a_merged_layer_agrees_within_the_float32_rounding_bound():
    """One layer in float32, against the classical bound on a computed sum of n products,
    |fl(sum a_k b_k) - sum a_k b_k| <= γ_n sum |a_k| |b_k|, γ_n = n u / (1 - n u), u = 2^-24. The
    adapted layer and the merged one each compute y = x W + b + s x A B with at most n = in + r + 3
    roundings along any path (the products' sums, the rounding of W' = W + s A B to float32, the
    additions of the bias and of the two products), each relative to M = |x| |W| + s |x| |A| |B| + |b|;
    so they differ by at most 2 γ_n M, elementwise."""
    n_in, n_out, rank, s = 48, 40, 4, 0.5
    linear = mt.nn.Linear(n_in, n_out, bias=True)
    layer = LoRALinear(linear, rank, alpha=s * rank)
    layer.lora_b.data[...] = np.random.default_rng(1).uniform(-1, 1, (rank, n_out))
    x = tensor((16, n_in), 2, np.float32, requires_grad=False)
    y = layer(x).data.astype(np.float64)
    merged = (x @ mt.tensor(layer.merged_weight()) + layer.bias).data.astype(np.float64)  # a plain Linear's sums
    X, W, b = (np.abs(t.data.astype(np.float64)) for t in (x, layer.weight, layer.bias))
    A, B = np.abs(layer.lora_a.data.astype(np.float64)), np.abs(layer.lora_b.data.astype(np.float64))
    u, n = 2.0**-24, n_in + rank + 3
    bound = 2 * (n * u / (1 - n * u)) * (X @ W + s * X @ A @ B + b)
    assert np.all(np.abs(y - merged) <= bound)
    # and the bound is tight enough to see a wrong merge: without the scale s, far outside it
    wrong = (x.data.astype(np.float64) @ (layer.weight.data + layer.lora_a.data @ layer.lora_b.data) + layer.bias.data)
    assert np.any(np.abs(y - wrong) > bound)


def test_lora_state_dict_round_trip():
    model = add_lora(tiny(), rank=2)
    for p in lora_parameters(model):
        p.data[...] = np.random.default_rng(p.data.size).normal(0, 1, p.shape)
    state = lora_state_dict(model)
    assert all(name.endswith((".lora_a", ".lora_b")) for name in state) and len(state) == 12
    assert "transformer.h.0.attn.c_attn.lora_a" in state
    other = add_lora(tiny(), rank=2)
    load_lora_state_dict(other, state)
    np.testing.assert_array_equal(other(ids())[0].data, model(ids())[0].data)
    with pytest.raises(StateDictError, match="missing adapters: transformer.h.1.mlp.c_proj.lora_b"):
        load_lora_state_dict(other, {k: v for k, v in state.items() if k != "transformer.h.1.mlp.c_proj.lora_b"})
    with pytest.raises(StateDictError, match="unexpected keys .*transformer.wte.weight"):
        load_lora_state_dict(other, {**state, "transformer.wte.weight": np.zeros((7, 8), np.float32)})
    with pytest.raises(StateDictError, match=r"lora_a: the checkpoint has shape \(8, 3\)"):
        load_lora_state_dict(other, {**state, "transformer.h.0.attn.c_attn.lora_a": np.zeros((8, 3), np.float32)})


def test_add_lora_refuses_by_name_and_changes_nothing():
    cases = [
        (dict(rank=0), InputError, "rank must be >= 1, got 0"),
        (dict(rank=2.0), InputTypeError, "rank must be an int"),
        (dict(rank=True), InputTypeError, "rank must be an int"),
        (dict(rank=9), InputError, "rank 9 is larger than the width of transformer.h.0.attn.c_attn, min(in, out) = min(8, 24) = 8"),
        (dict(rank=2, alpha=0), InputError, "alpha must be > 0 and finite, got 0"),
        (dict(rank=2, alpha=float("inf")), InputError, "alpha must be > 0 and finite, got inf"),
        (dict(rank=2, alpha=float("nan")), InputError, "alpha must be > 0 and finite"),
        (dict(rank=2, targets="c_attn,q_proj"), InputError, "no Linear layer of the GPT is named 'q_proj'; its Linear layers are named c_attn, c_fc, c_proj"),
        (dict(rank=2, targets="lm_head"), InputError, "lm_head exists only when the output layer is not tied"),
        (dict(rank=2, targets="c_attn,c_attn"), InputError, "targets name c_attn more than once"),
        (dict(rank=2, targets=""), InputError, "targets must be non-empty names"),
        (dict(rank=2, targets=[1]), InputTypeError, "targets must be names of Linear layers"),
    ]
    for arguments, error, message in cases:
        model = tiny()
        with pytest.raises(error) as raised:
            add_lora(model, **arguments)
        assert message in str(raised.value), str(raised.value)
        assert not has_lora(model) and all(p.requires_grad for p in model.parameters())
    model = add_lora(tiny(), rank=1)
    with pytest.raises(InputError, match="already holds LoRA adapters"):
        add_lora(model, rank=1)
    with pytest.raises(InputTypeError, match="expected an nn.Linear"):
        LoRALinear(mt.nn.LayerNorm(4), 1, 1.0)
    # the MLP's c_proj is (4C, C) = (32, 8): a rank above 8 is refused for it too, naming it
    with pytest.raises(InputError, match=r"transformer.h.0.mlp.c_proj, min\(in, out\) = min\(32, 8\) = 8"):
        add_lora(tiny(), rank=9, targets="mlp.c_proj")


# ================================================================================= checkpoints


def save_base(folder, dtype=mt.float32):
    model = tiny(dtype)
    meta = {"iteration": 5, "config": model.config.to_dict(), "vocab": "abcdefg"}
    checkpoint.save(folder, model, mt.optim.AdamW(model.parameters()), meta)
    return model


def save_adapters(folder, base_folder, rank=2, alpha=4.0, targets=("c_attn", "c_proj")):
    model = tiny()
    model.load_state_dict(checkpoint.load(base_folder)[0])
    add_lora(model, rank, alpha, targets)
    for p in lora_parameters(model):
        p.data[...] = np.random.default_rng(p.data.size).normal(0, 0.2, p.shape)
    meta = {"iteration": 3, "config": model.config.to_dict(), "vocab": "abcdefg", "lora": checkpoint.lora_meta(base_folder, rank, alpha, targets)}
    optimizer = mt.optim.AdamW(lora_parameters(model))
    checkpoint.save(folder, model, optimizer, meta, parameters=lora_state_dict(model))
    return model


def test_an_adapter_checkpoint_holds_the_adapters_and_loads_with_its_base(tmp_path):
    base = save_base(tmp_path / "base")
    adapted = save_adapters(tmp_path / "lora", tmp_path / "base")
    model_state, _, meta = checkpoint.load(tmp_path / "lora")
    assert set(model_state) == set(lora_state_dict(adapted)) and len(model_state) == 12
    assert meta["lora"]["base"] == str((tmp_path / "base").resolve()) and meta["lora"]["rank"] == 2
    assert meta["lora"]["base_sha256"] == checkpoint.file_sha256(checkpoint.path_in(tmp_path / "base"))
    mt.manual_seed(11)
    rng_before = mt.random.get_state()
    model, tokenizer, _ = checkpoint.load_model(tmp_path / "lora")
    assert mt.random.get_state() == rng_before
    assert has_lora(model) and tokenizer.chars == "abcdefg"
    np.testing.assert_array_equal(model(ids())[0].data, adapted(ids())[0].data)
    merged, _, _ = checkpoint.load_model(tmp_path / "lora", merge=True)
    assert not has_lora(merged)
    np.testing.assert_allclose(merged(ids())[0].data, adapted(ids())[0].data, rtol=0, atol=1e-5)
    plain, _, _ = checkpoint.load_model(tmp_path / "base")
    np.testing.assert_array_equal(plain(ids())[0].data, base(ids())[0].data)


def change_lora_meta(**fields):
    def change(arrays):
        meta = json.loads(str(arrays["meta"]))
        meta["lora"].update(fields)
        arrays["meta"] = np.array(json.dumps(meta))

    return change


BAD_ADAPTERS = {
    "missing-adapter": (lambda a: a.pop("model/transformer.h.1.attn.c_proj.lora_b"), "missing parameters: transformer.h.1.attn.c_proj.lora_b"),
    "wrong-shape": (lambda a: a.update({"model/transformer.h.0.attn.c_attn.lora_a": np.zeros((8, 3), np.float32)}), "lora_a has shape (8, 3), the config implies (8, 2)"),
    "a-base-weight-too": (lambda a: a.update({"model/transformer.wte.weight": np.zeros((7, 8), np.float32)}), "unexpected parameters: transformer.wte.weight"),
    "nan": (lambda a: a["model/transformer.h.0.attn.c_attn.lora_b"].__setitem__(0, np.nan), "non-finite values"),
    "rank-zero": (change_lora_meta(rank=0), "rank is 0, expected an integer >= 1"),
    "rank-beyond-width": (change_lora_meta(rank=9), "its LoRA settings do not fit its own config: LoRA: rank 9 is larger than the width"),
    "alpha-negative": (change_lora_meta(alpha=-1), "alpha is -1, expected a finite number > 0"),
    "unknown-target": (change_lora_meta(targets=["c_attn", "q_proj"]), "no Linear layer of the GPT is named 'q_proj'"),
    "bad-hash": (change_lora_meta(base_sha256="xyz"), "base_sha256 is 'xyz', expected 64 hex digits"),
    "no-base": (lambda a: a.update(meta=np.array(json.dumps({k: v if k != "lora" else {"rank": 2} for k, v in json.loads(str(a["meta"])).items()}))), "lora entry lacks base, base_sha256, alpha, targets"),
}


@pytest.mark.parametrize("damage, message", BAD_ADAPTERS.values(), ids=BAD_ADAPTERS.keys())
def test_an_adapter_checkpoint_that_does_not_fit_is_refused_by_name(tmp_path, damage, message):
    save_base(tmp_path / "base")
    save_adapters(tmp_path / "lora", tmp_path / "base")
    rewrite(tmp_path / "lora", damage)
    with pytest.raises(checkpoint.CheckpointError) as raised:
        checkpoint.load(tmp_path / "lora")
    assert message in str(raised.value) and "ckpt.npz" in str(raised.value)


def test_a_missing_or_changed_base_is_a_clear_error(tmp_path):
    save_base(tmp_path / "base")
    save_adapters(tmp_path / "lora", tmp_path / "base")
    checkpoint.load(tmp_path / "lora")  # the adapters alone load: they carry what checks them
    save_base(tmp_path / "base", dtype=mt.float64)  # the base trained further, say: another file
    with pytest.raises(checkpoint.CheckpointError, match="which has changed since .*adapters fit only the weights they were trained on"):
        checkpoint.load_model(tmp_path / "lora")
    shutil.rmtree(tmp_path / "base")
    with pytest.raises(checkpoint.CheckpointError, match=r"holds LoRA adapters for the base checkpoint .*base/ckpt.npz, which is missing"):
        checkpoint.load_model(tmp_path / "lora")


# ================================================================================= train.py


TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16", "--batch-size", "4",
        "--eval-iters", "8", "--sample-chars", "0", "--warmup-iters", "2", "--lr-decay-iters", "40",
        "--learning-rate", "1e-2", "--min-lr", "1e-3", "--eval-interval", "100"]  # fmt: skip


def write_text(path, words, seed):
    rng = np.random.default_rng(seed)
    path.write_text(" ".join(words[i] for i in rng.integers(0, len(words), 3000)) + "\n", encoding="utf-8")
    return str(path)


def texts_and_base(folder, steps):
    """Text 1, text 2 (other words, every character of them in text 1's), and a base trained on text 1."""
    one = write_text(folder / "one.txt", ["the", "king", "and", "queen", "of", "hearts", "said", "to", "all"], 0)
    two = write_text(folder / "two.txt", ["a", "red", "fish", "sat", "on", "the", "gate", "and", "ate", "sled"], 1)
    assert train.main(["--data", one, "--out-dir", str(folder / "base"), *TINY, "--max-iters", str(steps)]) == 0
    return folder, one, two


@pytest.fixture(scope="module")
def trained_base(tmp_path_factory):
    """A base trained for 40 steps: enough to have learned text 1, so that text 2 is news to it."""
    return texts_and_base(tmp_path_factory.mktemp("trained"), 40)


@pytest.fixture(scope="module")
def quick_base(tmp_path_factory):
    """A base of 2 steps, for the refusals: they need a checkpoint, not a good one."""
    return texts_and_base(tmp_path_factory.mktemp("quick"), 2)


def run(capsys, *argv):
    """train.main's exit code and what it printed; never a traceback."""
    try:
        code = train.main([str(a) for a in argv])
    except BaseException:
        pytest.fail(f"train.py {' '.join(map(str, argv))} ended in a traceback:\n{traceback.format_exc()}")
    printed = capsys.readouterr()
    text = " ".join((printed.out + printed.err).split())
    assert "Traceback" not in text
    return code, text


@pytest.mark.slow
def test_lora_fine_tuning_end_to_end(trained_base, tmp_path, capsys):
    folder, _, two = trained_base
    base = folder / "base"
    base_bytes = checkpoint.path_in(base).read_bytes()
    base_state = checkpoint.load(base)[0]
    out = tmp_path / "lora"
    code, text = run(capsys, "--data", two, "--out-dir", out, *TINY, "--max-iters", "40", "--init-from", base, "--lora-rank", "4")
    assert code == 0, text
    assert "before fine-tuning: train loss" in text and "trainable parameters" in text
    base_total = sum(a.size for a in base_state.values())
    assert f"704 of {base_total + 704:,} ({100 * 704 / (base_total + 704):.2f}%)" in text  # adapters of all
    model_state, optim_state, meta = checkpoint.load(out)
    # the checkpoint: the adapters alone, and a record of the base they need
    assert sorted(model_state) == sorted(f"transformer.h.0.{layer}.{part}" for layer in ("attn.c_attn", "attn.c_proj", "mlp.c_proj") for part in ("lora_a", "lora_b"))
    assert sum(a.size for a in model_state.values()) == 4 * ((16 + 48) + (16 + 16) + (64 + 16)) == 704
    assert meta["lora"] == {"base": str(base.resolve()), "base_sha256": checkpoint.file_sha256(checkpoint.path_in(base)), "rank": 4, "alpha": 4.0, "targets": ["c_attn", "c_proj"]}
    assert all(key.startswith(("group.", "param.")) for key in optim_state) and "param.5.m" in optim_state and "param.6.m" not in optim_state
    # the base is untouched, on disk and in the fine-tuned model (its frozen weights bit-identical)
    assert checkpoint.path_in(base).read_bytes() == base_bytes
    model, _, _ = checkpoint.load_model(out)
    for name, param in model.named_parameters():
        if name in base_state:
            np.testing.assert_array_equal(param.data, base_state[name], err_msg=name)
    # the loss on text 2 dropped
    curve = meta["loss_curve"]["evaluations"]
    (first_step, _, val_before), (last_step, _, val_after) = curve[0], curve[-1]
    assert (first_step, last_step) == (0, 40) and val_after < val_before - 0.3, curve


@pytest.mark.slow
def test_lora_resume_equals_an_uninterrupted_run(quick_base, tmp_path, capsys):
    folder, _, two = quick_base
    flags = ["--data", two, *TINY, "--init-from", folder / "base", "--lora-rank", "2", "--lora-alpha", "4", "--lora-targets", "c_attn"]
    assert run(capsys, *flags, "--out-dir", tmp_path / "whole", "--max-iters", "8")[0] == 0
    assert run(capsys, *flags, "--out-dir", tmp_path / "parts", "--max-iters", "4")[0] == 0
    code, text = run(capsys, "--resume", "--out-dir", tmp_path / "parts", "--data", two, *TINY, "--max-iters", "8")  # no LoRA flag: from the checkpoint
    assert code == 0, text
    assert "resuming from" in text and "val loss before fine-tuning" in text
    whole, _, whole_meta = checkpoint.load(tmp_path / "whole")
    parts, _, parts_meta = checkpoint.load(tmp_path / "parts")
    assert parts_meta["iteration"] == 8 and parts_meta["lora"] == whole_meta["lora"]
    for name in whole:
        np.testing.assert_array_equal(parts[name], whole[name], err_msg=name)
    code, text = run(capsys, "--resume", *flags, "--out-dir", tmp_path / "parts", "--max-iters", "9")  # the same flags again
    assert code == 0, text


@pytest.mark.slow
def test_init_from_alone_fine_tunes_every_weight(quick_base, tmp_path, capsys):
    folder, _, two = quick_base
    code, text = run(capsys, "--data", two, "--out-dir", tmp_path / "full", *TINY, "--max-iters", "6", "--init-from", folder / "base")
    assert code == 0, text
    model_state, _, meta = checkpoint.load(tmp_path / "full")
    base_state = checkpoint.load(folder / "base")[0]
    total = sum(a.size for a in base_state.values())
    assert "every weight" in text and f"{total:,} of {total:,} (100.00%)" in text
    assert sorted(model_state) == sorted(base_state) and "lora" not in meta
    assert meta["init_from"]["base"] == str((folder / "base").resolve())
    assert all(not np.array_equal(model_state[name], base_state[name]) for name in ("transformer.wte.weight", "transformer.h.0.attn.c_attn.weight"))


@pytest.fixture(scope="module")
def trained_adapters(trained_base, tmp_path_factory):
    """Adapters of rank 4 trained for 20 steps on text 2, from the trained base; their folder."""
    folder, _, two = trained_base
    out = tmp_path_factory.mktemp("adapters") / "lora"
    assert train.main([str(a) for a in ["--data", two, "--out-dir", out, *TINY, "--max-iters", "20", "--init-from", folder / "base", "--lora-rank", "4"]]) == 0
    return out


@pytest.mark.slow
def test_generation_from_adapters_and_from_the_merged_model_agree(trained_base, trained_adapters):
    folder, _, _ = trained_base
    adapted, tokenizer, _ = checkpoint.load_model(trained_adapters)
    merged, _, _ = checkpoint.load_model(trained_adapters, merge=True)
    base, _, _ = checkpoint.load_model(folder / "base")
    prompt = np.array([tokenizer.encode("the red fish ")])
    with mt.using_kernels("readable"):
        tokens = adapted.generate(prompt, 20, temperature=0).numpy()
        np.testing.assert_array_equal(merged.generate(prompt, 20, temperature=0).numpy(), tokens)
        assert not np.array_equal(base.generate(prompt, 20, temperature=0).numpy(), tokens)  # the adapters matter


@needs_jit
@pytest.mark.slow
def test_the_fast_decode_path_sees_unmerged_adapters(trained_adapters):
    adapted, tokenizer, _ = checkpoint.load_model(trained_adapters)
    prompt = np.array([tokenizer.encode("the red fish ")])
    with mt.using_kernels("readable"):
        expected = adapted.generate(prompt, 20, temperature=0).numpy()
    with mt.using_kernels("fast"):
        np.testing.assert_array_equal(adapted.generate(prompt, 20, temperature=0).numpy(), expected)


@pytest.mark.slow
def test_quantizing_an_adapter_checkpoint_merges_its_adapters_first(trained_adapters, capsys):
    capsys.readouterr()
    assert generate.main(["--out-dir", str(trained_adapters), "--quantize", "int8", "--max-new-tokens", "5", "--prompt", "the "]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "LoRA adapters merged into the base's weights before quantizing to int8" in text
    quantized_bytes, float_bytes = (int(n.replace(",", "")) for n in re.search(r"int8: ([\d,]+) bytes, from ([\d,]+)", text).groups())
    assert quantized_bytes < 0.35 * float_bytes  # every matrix in 8 bits, the adapted ones too


class Scene:
    """What a refused run needs: the base and the texts, and a fresh --out-dir in tmp_path."""

    def __init__(self, folder, two, tmp_path):
        self.folder, self.two, self.tmp = folder, two, tmp_path
        self.base, self.out = folder / "base", tmp_path / "out"

    def lora(self, *extra, data=None):
        """A fine-tuning run's argv: 2 steps on text 2 from the base, with the extra flags."""
        return ["--data", data or self.two, "--out-dir", self.out, *TINY, "--max-iters", "2", "--init-from", self.base, *extra]

    def with_adapters(self, base=None):
        """Train adapters of rank 2 into --out-dir (2 steps), on the base or on `base`."""
        base = base or self.base
        argv = ["--data", self.two, "--out-dir", self.out, *TINY, "--max-iters", "2", "--init-from", base, "--lora-rank", "2"]
        assert train.main([str(a) for a in argv]) == 0
        return self

    def resume(self, *extra):
        return ["--resume", "--data", self.two, "--out-dir", self.out, *TINY, "--max-iters", "4", *extra]

    def file(self, name, payload):
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(payload if isinstance(payload, bytes) else payload.encode("utf-8"))
        return path

    def copy_of_base(self, name):
        shutil.copytree(self.base, self.tmp / name)
        return self.tmp / name


def changed_base(s):
    """Adapters trained on a copy of the base, then the copy changed (trained further, say)."""
    copy = s.copy_of_base("base-copy")
    s.with_adapters(base=copy)
    path = checkpoint.path_in(copy)
    with np.load(path) as archive:
        arrays = {name: archive[name] for name in archive.files}
    arrays["model/transformer.wte.weight"] = arrays["model/transformer.wte.weight"] + 1
    np.savez(path, **arrays)
    return s.resume()


REFUSALS = {
    "rank-without-init-from": (lambda s: ["--data", s.two, "--out-dir", s.out, *TINY, "--lora-rank", "4"], "--lora-rank: given 4 without --init-from, expected --init-from DIR as well"),
    "alpha-without-rank": (lambda s: s.lora("--lora-alpha", "8"), "--lora-alpha: given 8.0 without --lora-rank, expected --lora-rank R as well"),
    "targets-without-rank": (lambda s: s.lora("--lora-targets", "c_fc"), "--lora-targets: given c_fc without --lora-rank"),
    "rank-zero": (lambda s: s.lora("--lora-rank", "0"), "--lora-rank: given 0, expected an integer >= 1"),
    "alpha-nan": (lambda s: s.lora("--lora-rank", "2", "--lora-alpha", "nan"), "--lora-alpha: given nan, expected a finite number > 0"),
    "targets-empty": (lambda s: s.lora("--lora-rank", "2", "--lora-targets", "c_attn,"), "--lora-targets: given 'c_attn,', expected names of Linear layers"),
    "rank-beyond-width": (
        lambda s: s.lora("--lora-rank", "17"), "--lora-rank: given 17, expected at most every targeted layer's width",
        "rank 17 is larger than the width of transformer.h.0.attn.c_attn, min(in, out) = min(16, 48) = 16",
    ),
    "unknown-target": (
        lambda s: s.lora("--lora-rank", "2", "--lora-targets", "c_attn,wq"), "--lora-targets: given 'c_attn,wq'",
        "no Linear layer of the GPT is named 'wq'; its Linear layers are named c_attn, c_fc, c_proj",
    ),
    "init-from-missing": (
        lambda s: ["--data", s.two, "--out-dir", s.out, *TINY, "--init-from", s.tmp / "nowhere"],
        "--init-from: given", "nowhere/ckpt.npz: run train.py first", "expected a folder holding a checkpoint written by train.py",
    ),
    "init-from-damaged": (
        lambda s: (s.file("junk/ckpt.npz", b"PK\x03\x04" + bytes(60)), ["--data", s.two, "--out-dir", s.out, *TINY, "--init-from", s.tmp / "junk"])[1],
        "--init-from: given", "is not a readable checkpoint",
    ),
    "init-from-adapters": (
        lambda s: (s.with_adapters(), ["--data", s.two, "--out-dir", s.tmp / "again", *TINY, "--init-from", s.out])[1],
        "expected a full model's checkpoint", "holds LoRA adapters alone; fine-tune from their base",
    ),
    "init-from-is-out-dir": (
        lambda s: ["--data", s.two, "--out-dir", s.base, *TINY, "--init-from", s.base, "--force"],
        "--out-dir: given", "expected a folder other than --init-from's",
    ),
    "init-from-other-model": (lambda s: s.lora("--n-embd", "32"), "--n-embd: given 32 with --init-from, expected the base checkpoint's n_embd = 16"),
    "init-from-other-tokenizer": (lambda s: s.lora("--tokenizer", "bpe"), "--tokenizer: given bpe with --init-from, expected the base checkpoint's tokenizer, char"),
    "characters-not-in-vocabulary": (
        lambda s: s.lora("--lora-rank", "2", data=s.file("new.txt", "the xyz! " * 300)),
        "does not fit the base checkpoint's", "these characters are not in the vocabulary: '!xyz'",
    ),
    "resume-other-rank": (
        lambda s: (s.with_adapters(), s.resume("--init-from", s.base, "--lora-rank", "4"))[1],
        "--lora-rank: given 4 with --resume, expected the checkpoint's LoRA rank = 2",
    ),
    "resume-other-base": (
        lambda s: (s.with_adapters(), s.resume("--init-from", s.copy_of_base("other"), "--lora-rank", "2"))[1],
        "--init-from: given", "with --resume, expected the checkpoint's base",
    ),
    "resume-lora-flag-on-a-full-model": (
        lambda s: (train.main([str(a) for a in s.lora()]), s.resume("--init-from", s.base, "--lora-rank", "2"))[1],
        "--lora-rank: given 2 with --resume, expected no LoRA flag: the checkpoint", "holds a full model, not adapters",
    ),
    "resume-changed-base": (changed_base, "which has changed since", "adapters fit only the weights they were trained on"),
}


TRAINING_FIRST = {"init-from-adapters", "resume-other-rank", "resume-other-base", "resume-lora-flag-on-a-full-model", "resume-changed-base"}


@pytest.mark.parametrize(
    "setup, expected",
    [pytest.param(v[0], v[1:], id=k, marks=[pytest.mark.slow] if k in TRAINING_FIRST else []) for k, v in REFUSALS.items()],
)  # the refusals that need adapters trained first are slow: they train for two steps
def test_refusals_name_what_is_wrong(quick_base, tmp_path, capsys, setup, expected):
    folder, _, two = quick_base
    argv = setup(Scene(folder, two, tmp_path))
    capsys.readouterr()
    code, text = run(capsys, *argv)
    assert code == 1, text
    assert "error:" in text
    for fragment in expected:
        assert fragment in text, text
    assert not list(tmp_path.rglob(".ckpt-*"))  # no temporary file left


@pytest.mark.parametrize("rank, alpha", [(2, 6.0), (4, 2.0)], ids=["alpha-above-rank", "alpha-below-rank"])
def test_the_update_is_scaled_by_alpha_over_rank(rank, alpha):
    """y = x W + b + (alpha / rank) (x A) B, written out in numpy, for alpha != rank (alpha = rank
    gives scale 1 whichever way round it is written), and the merge uses the same scale. Kills the
    mutant lora.scale_rank_over_alpha."""
    mt.manual_seed(3)
    layer = LoRALinear(mt.nn.Linear(8, 6, bias=True, dtype=mt.float64), rank, alpha)
    layer.lora_b.data[...] = np.random.default_rng(4).uniform(-1, 1, (rank, 6))  # as if trained: B no longer 0
    assert layer.scale == alpha / rank
    x = tensor((3, 8), 5, requires_grad=False)
    W, b, A, B = (p.data for p in (layer.weight, layer.bias, layer.lora_a, layer.lora_b))
    expected = x.data @ W + b + (alpha / rank) * (x.data @ A) @ B
    np.testing.assert_allclose(layer(x).data, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(layer.merged_weight(), W + (alpha / rank) * A @ B, rtol=1e-12, atol=1e-12)
    model = add_lora(tiny(), rank=rank, alpha=alpha)  # add_lora passes alpha on unchanged
    assert all(adapted.scale == alpha / rank and adapted.alpha == alpha for _, adapted in lora_layers(model))
