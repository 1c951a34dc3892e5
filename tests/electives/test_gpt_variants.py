"""The GPT's transformer variants: grouped-query attention, sinusoidal and ALiBi positions, online-softmax
attention and the mixture-of-experts MLP, alone and combined with each other and with the older
options. For each: every parameter's gradient against finite differences, the readable and fast
kernel sets against each other, KV-cache generation against recomputation, and a checkpoint round
trip; and for each technique a check against an independent construction."""
import math

import numba
import numpy as np
import pytest

import microtensor as mt
from microtensor import GradcheckError, gradcheck, optim
from microtensor.errors import InputError
from gpt.checkpoints import checkpoint
from microtensor.nn import sinusoidal_embedding, sinusoidal_positions
from gpt.model.transformer import GPT, GPTConfig

VOCAB = 7
needs_the_jit = pytest.mark.skipif(numba.config.DISABLE_JIT, reason="the fast kernels need Numba's compiler")

# Each technique alone, then combinations of them with each other and with the older options.
VARIANTS = [
    dict(n_kv_head=1),
    dict(n_kv_head=2, pos="rope"),
    dict(pos="sinusoidal"),
    dict(pos="alibi"),
    dict(attention="online"),
    dict(mlp="moe"),
    dict(attention="online", pos="alibi", n_kv_head=2, norm="rmsnorm"),
    dict(attention="online", pos="rope", n_kv_head=1, mlp="moe", tie_weights=False, bias=True),
    dict(pos="sinusoidal", n_kv_head=2, mlp="moe", norm="rmsnorm", bias=True),
    dict(pos="alibi", mlp="swiglu", n_kv_head=1, tie_weights=False),
]
VARIANT_IDS = ["-".join(f"{k}={v}" for k, v in o.items()) for o in VARIANTS]
# The heaviest checks run every variant under -m slow, and the four combinations (which take every
# technique at least once) in the default run.
COMBINATIONS = [
    pytest.param(o, id=i, marks=() if len(o) > 3 else pytest.mark.slow) for o, i in zip(VARIANTS, VARIANT_IDS)
]


def tiny(dtype=mt.float64, seed=0, block_size=8, **options):
    """4 query heads of size 4, so that 1 and 2 key/value heads are multi-query and grouped-query."""
    mt.manual_seed(seed)
    options.setdefault("n_expert", 3)
    options.setdefault("expert_top_k", 2)
    config = GPTConfig(vocab_size=VOCAB, block_size=block_size, n_layer=2, n_head=4, n_embd=16, **options)
    return GPT(config, dtype=dtype)


def perturbed(dtype=mt.float64, **options):
    """Every parameter moved off its initial value (biases start at 0 and norm weights at 1, which
    would hide one left out)."""
    model = tiny(dtype=dtype, **options)
    rng = np.random.default_rng(11)
    for param in model.parameters():
        param.data[...] += rng.normal(0.0, 0.2, param.shape).astype(param.dtype)
    return model


def batch(seed=1, B=2, T=6):
    rng = np.random.default_rng(seed)
    return mt.tensor(rng.integers(0, VOCAB, (B, T))), mt.tensor(rng.integers(0, VOCAB, (B, T)))


def assert_close(name, actual, expected, tolerance):
    scale = max(float(np.abs(expected).max()), np.finfo(np.float64).tiny)
    np.testing.assert_allclose(actual, expected, rtol=tolerance, atol=tolerance * scale, err_msg=name)


# ================================================================================= every variant


@pytest.mark.parametrize("options", COMBINATIONS)
def test_every_parameter_gradient_against_finite_differences(options):
    model = perturbed(**options)
    idx, targets = batch()
    for name, param in model.named_parameters():
        def loss_of(p):
            _, loss = model(idx, targets)
            aux = model.moe_aux_loss()
            return loss if aux is None else loss + 0.1 * aux  # the training objective, aux loss included

        try:
            gradcheck(loss_of, [param], max_elements=4, seed=3)
        except GradcheckError as error:
            raise AssertionError(f"{name}: {error}") from None


@pytest.mark.all_threads
@needs_the_jit
@pytest.mark.parametrize("dtype", [mt.float64, mt.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("options", COMBINATIONS)
def test_the_readable_and_fast_kernel_sets_give_the_same_model(options, dtype):
    tolerance = {mt.float64: 1e-10, mt.float32: 1e-4}[dtype]
    results = {}
    for kernel_set in ("readable", "fast"):
        with mt.using_kernels(kernel_set):
            model = perturbed(dtype, **options)
            idx, targets = batch()
            _, loss = model(idx, targets)
            loss.backward()
            gradients = {name: p.grad.copy() for name, p in model.named_parameters()}
            generated = list(model.generate_tokens(np.array([[1, 2, 3], [4, 5, 6]]), 10, temperature=0))
        results[kernel_set] = loss.item(), gradients, generated
    (readable_loss, readable_grads, readable_gen), (fast_loss, fast_grads, fast_gen) = results["readable"], results["fast"]
    assert abs(fast_loss - readable_loss) <= tolerance * abs(readable_loss)
    for name, expected in readable_grads.items():
        assert_close(name, fast_grads[name], expected, tolerance)
    for step, ((fast_token, fast_logits), (token, logits)) in enumerate(zip(fast_gen, readable_gen)):
        np.testing.assert_array_equal(fast_token, token, err_msg=f"token {step}")
        assert_close(f"logits of token {step}", fast_logits, logits, tolerance)


@pytest.mark.parametrize("options", VARIANTS, ids=VARIANT_IDS)
def test_cached_generation_equals_recomputation_past_block_size(options, kernel_set):
    """3 + 20 tokens through a block of 8: the window moves and the cache is rebuilt several times."""
    model = perturbed(mt.float64, **options)
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    cached = list(model.generate_tokens(prompt, 20, temperature=0, use_kv_cache=True))
    uncached = list(model.generate_tokens(prompt, 20, temperature=0, use_kv_cache=False))
    for step, ((token_a, logits_a), (token_b, logits_b)) in enumerate(zip(cached, uncached)):
        np.testing.assert_array_equal(token_a, token_b, err_msg=f"token {step}")
        assert_close(f"logits of token {step}", logits_a, logits_b, 1e-10)


@pytest.mark.parametrize("options", VARIANTS, ids=VARIANT_IDS)
def test_a_checkpoint_round_trips_the_variant(options, tmp_path):
    model = perturbed(mt.float32, **options)
    meta = {"iteration": 1, "config": model.config.to_dict(), "vocab": "abcdefg"}
    checkpoint.save(tmp_path, model, optim.AdamW(model.parameters()), meta)
    state, _, loaded_meta = checkpoint.load(tmp_path)
    config = GPTConfig(**loaded_meta["config"])
    assert config == model.config
    again = GPT(config)
    again.load_state_dict(state)
    idx, _ = batch()
    with mt.no_grad():
        np.testing.assert_array_equal(again(idx)[0].data, model(idx)[0].data)


# ================================================================================= grouped-query attention


def test_grouped_query_attention_equals_multi_head_with_copied_key_value_heads():
    """A model with Hk key/value heads computes what a multi-head model computes when its key and
    value weights are those Hk heads, each copied for the n_head / Hk query heads of its group."""
    for n_kv_head in (1, 2):
        grouped = perturbed(n_kv_head=n_kv_head)
        full = tiny(n_kv_head=4)
        H, D, G = 4, 4, 4 // n_kv_head
        state = grouped.state_dict()
        for layer in range(2):
            key = f"transformer.h.{layer}.attn.c_attn.weight"
            w = state[key]  # (C, (H + 2 Hk) D)
            q, k, v = w[:, : H * D], w[:, H * D : (H + n_kv_head) * D], w[:, (H + n_kv_head) * D :]
            copy = lambda part: np.repeat(part.reshape(16, n_kv_head, D), G, axis=1).reshape(16, H * D)  # noqa: E731
            state[key] = np.concatenate([q, copy(k), copy(v)], axis=1)
        full.load_state_dict(state)
        idx, targets = batch()
        with mt.no_grad():
            np.testing.assert_allclose(grouped(idx)[0].data, full(idx)[0].data, rtol=1e-12, atol=1e-12)


def test_the_kv_cache_holds_only_the_shared_heads():
    per_token = {Hk: tiny(n_kv_head=Hk, dtype=mt.float32).kv_cache_bytes_per_token() for Hk in (4, 2, 1)}
    assert per_token == {4: 2 * 2 * 4 * 4 * 4, 2: 2 * 2 * 2 * 4 * 4, 1: 2 * 2 * 1 * 4 * 4}  # 2 (k, v) · layers · Hk · D · 4 bytes
    keys, values = tiny(n_kv_head=1).new_cache_arrays(3)
    assert keys.shape == values.shape == (2, 3, 1, 8, 4)


def test_n_kv_head_equal_to_n_head_is_the_multi_head_model():
    plain, explicit = tiny(), tiny(n_kv_head=4)
    assert plain.config.n_kv_head == 4
    idx, targets = batch()
    np.testing.assert_array_equal(plain(idx, targets)[1].data, explicit(idx, targets)[1].data)


# ================================================================================= positions


def test_sinusoidal_table_follows_the_formula():
    table = sinusoidal_positions(0, 3, 6, mt.float64)
    np.testing.assert_array_equal(table[0], [0, 1, 0, 1, 0, 1])  # sin 0, cos 0 in every pair
    for p in range(3):
        for i in range(3):
            angle = p / 10000 ** (2 * i / 6)
            assert table[p, 2 * i] == pytest.approx(math.sin(angle), abs=1e-15)
            assert table[p, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-15)
    np.testing.assert_array_equal(sinusoidal_positions(5, 2, 6, mt.float64), sinusoidal_positions(0, 7, 6, mt.float64)[5:])
    # the GPT adds it divided by √C, the paper's ratio of positions to tokens at GPT-2's scale
    np.testing.assert_allclose(sinusoidal_embedding(0, 3, 6, mt.float64), table / math.sqrt(6), rtol=1e-15)
    model = tiny(pos="sinusoidal")
    idx = batch()[0]
    with mt.no_grad():
        expected = model.transformer.wte(idx).data + sinusoidal_embedding(0, 6, 16, mt.float64)
        captured = []
        handle = model.transformer.h[0].ln_1
        original = handle.forward
        handle.forward = lambda x: captured.append(x.data.copy()) or original(x)
        model(idx)
    np.testing.assert_allclose(captured[0], expected, rtol=1e-15, atol=1e-15)


@pytest.mark.parametrize("pos", ["rope", "sinusoidal", "alibi"])
def test_positions_computed_on_the_fly_run_past_block_size(pos):
    model = perturbed(pos=pos)
    idx, targets = batch(T=16)  # twice the block of 8
    logits, loss = model(idx, targets)
    assert logits.shape == (2, 16, VOCAB) and np.isfinite(loss.item())
    # causal: the first 8 positions' logits do not depend on what comes later
    with mt.no_grad():
        np.testing.assert_allclose(model(idx[:, :8])[0].data, logits.data[:, :8], rtol=1e-12, atol=1e-12)


def test_a_learned_table_refuses_positions_past_block_size():
    with pytest.raises(InputError, match="longer than block_size 8 .the learned position table has block_size rows"):
        tiny()(batch(T=9)[0])


def test_alibi_needs_no_position_parameters_and_sinusoidal_none_either():
    for pos in ("alibi", "sinusoidal", "rope"):
        names = [n for n, _ in tiny(pos=pos).named_parameters()]
        assert not any("wpe" in n for n in names)


# ================================================================================= online attention, experts


@pytest.mark.parametrize("options", [dict(), dict(pos="alibi", n_kv_head=2), dict(pos="rope", n_kv_head=1)], ids=["plain", "alibi-gqa", "rope-mqa"])
def test_online_attention_gives_the_standard_model(options):
    results = []
    for attention in ("standard", "online"):
        model = perturbed(attention=attention, **options)
        idx, targets = batch()
        _, loss = model(idx, targets)
        loss.backward()
        results.append((loss.item(), {n: p.grad.copy() for n, p in model.named_parameters()}))
    assert results[1][0] == pytest.approx(results[0][0], rel=1e-12)
    for name, grad in results[0][1].items():
        assert_close(name, results[1][1][name], grad, 1e-10)


def test_experts_report_their_load_and_the_balancing_loss():
    model = perturbed(mlp="moe")
    idx, targets = batch()
    model(idx, targets)
    counts = model.tokens_per_expert()
    assert counts.shape == (2, 3) and (counts.sum(axis=1) == 2 * 6 * 2).all()  # tokens · top_k per block
    aux = model.moe_aux_loss()
    assert aux.shape == () and aux.item() >= 1.0 * 2 - 1e-9  # E·Σ f·P >= 1 per block, equality when balanced
    assert tiny().moe_aux_loss() is None
    with pytest.raises(InputError, match="no experts"):
        tiny().tokens_per_expert()


# ================================================================================= bad configurations


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(n_kv_head=3), r"n_kv_head \(3\) must divide n_head \(4\)"),
        (dict(n_kv_head=0), "n_kv_head must be a positive integer"),
        (dict(mlp="moe", n_expert=2, expert_top_k=3), r"expert_top_k \(3\) must be at most n_expert \(2\)"),
        (dict(expert_top_k=0), "expert_top_k must be a positive integer"),
        (dict(pos="alibi-learned"), "pos must be one of"),
        (dict(attention="flash"), "attention must be one of"),
        (dict(pos="sinusoidal", n_embd=9, n_head=1), "sinusoidal positions pair a sine and a cosine, so n_embd must be even"),
    ],
)
def test_bad_variant_configurations_are_clear_errors(fields, message):
    base = dict(vocab_size=VOCAB, block_size=8, n_layer=1, n_head=4, n_embd=16)
    with pytest.raises(InputError, match=message):
        GPTConfig(**{**base, **fields})
