"""The GPT: gradients of every parameter against finite differences, the KV cache against
recomputation, initialization, learning, names and errors."""
import math

import numpy as np
import pytest

import microtensor as mt
from microtensor import GradcheckError, gradcheck
from models.gpt import GPT, GPTConfig

OPTIONS = [
    dict(norm="layernorm", mlp="gelu", pos="learned", tie_weights=True, bias=False),
    dict(norm="rmsnorm", mlp="swiglu", pos="rope", tie_weights=False, bias=False),
    dict(norm="layernorm", mlp="swiglu", pos="rope", tie_weights=True, bias=True),
    dict(norm="rmsnorm", mlp="gelu", pos="learned", tie_weights=False, bias=True),
]


def tiny(dtype=mt.float64, seed=0, **options):
    mt.manual_seed(seed)
    config = GPTConfig(vocab_size=7, block_size=8, n_layer=2, n_head=2, n_embd=8, **options)
    return GPT(config, dtype=dtype)


def batch(rng, B=2, T=5, V=7):
    return mt.tensor(rng.integers(0, V, (B, T))), mt.tensor(rng.integers(0, V, (B, T)))


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(str(v) for v in o.values()))
def test_every_parameter_gradient_against_finite_differences(options):
    model = tiny(**options)
    idx, targets = batch(np.random.default_rng(1))
    for name, param in model.named_parameters():
        # logits with a random upstream gradient, and the loss: both through every parameter
        def logits_of(p, param=param):
            return model(idx)[0]

        def loss_of(p, param=param):
            return model(idx, targets)[1]

        for fn in (logits_of, loss_of):
            try:
                gradcheck(fn, [param], max_elements=6, seed=3)
            except GradcheckError as error:
                raise AssertionError(f"{name}: {error}") from None


def test_a_wrong_parameter_gradient_is_caught():
    model = tiny()
    idx, _ = batch(np.random.default_rng(1))
    weight = model.transformer.h[0].mlp.c_fc.weight
    original = mt.functional.gelu

    def wrong_gelu(x, approximate="tanh"):
        return mt.functional.tanh(x) * 0 + original(x, approximate).detach() + x * 0.5  # wrong slope

    import models.gpt as gpt

    gpt.F.gelu, saved = wrong_gelu, gpt.F.gelu
    try:
        with pytest.raises(GradcheckError):
            gradcheck(lambda p: model(idx)[0], [weight], max_elements=6)
    finally:
        gpt.F.gelu = saved


def test_initial_loss_is_close_to_uniform():
    mt.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=32))
    idx, targets = batch(np.random.default_rng(0), B=4, T=32, V=65)
    _, loss = model(idx, targets)
    assert abs(loss.item() - math.log(65)) < 0.1


def test_parameter_names_follow_nanogpt():
    names = [n for n, _ in tiny().named_parameters()]
    assert names[:3] == ["transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight"]
    for expected in ["transformer.h.1.attn.c_attn.weight", "transformer.h.1.attn.c_proj.weight", "transformer.h.1.mlp.c_fc.weight", "transformer.h.1.mlp.c_proj.weight", "transformer.ln_f.weight"]:
        assert expected in names
    assert "lm_head.weight" not in names  # tied to wte
    assert "lm_head.weight" in [n for n, _ in tiny(tie_weights=False).named_parameters()]


@pytest.mark.parametrize("options", OPTIONS[:2], ids=["learned", "rope"])
def test_kv_cache_equals_recomputation_past_block_size(options):
    model = tiny(dtype=mt.float32, **options)
    prompt = np.array([[1, 2, 3]])
    cached = list(model.generate_tokens(prompt, 120, temperature=0, use_kv_cache=True))
    uncached = list(model.generate_tokens(prompt, 120, temperature=0, use_kv_cache=False))
    for (token_a, logits_a), (token_b, logits_b) in zip(cached, uncached):
        np.testing.assert_array_equal(token_a, token_b)
        np.testing.assert_allclose(logits_a, logits_b, atol=1e-5)
    assert len(cached) == 120  # 3 + 120 tokens: the window moves past block_size 8 many times


def test_sampling_options():
    model = tiny(dtype=mt.float32)
    prompt = np.array([[1, 2]])
    greedy = model.generate(prompt, 10, temperature=0).numpy()
    assert greedy.shape == (1, 12)
    np.testing.assert_array_equal(model.generate(prompt, 10, top_k=1, seed=5).numpy(), greedy)
    a = model.generate(prompt, 10, temperature=1.0, top_p=0.9, seed=7).numpy()
    np.testing.assert_array_equal(a, model.generate(prompt, 10, temperature=1.0, top_p=0.9, seed=7).numpy())


def test_a_tiny_model_overfits_a_short_text():
    text = "to be or not to be, that is the question"
    chars = sorted(set(text))
    ids = np.array([[chars.index(c) for c in text]])
    mt.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=len(chars), block_size=len(text) - 1, n_layer=2, n_head=2, n_embd=32))
    optimizer = mt.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    x, y = mt.tensor(ids[:, :-1]), mt.tensor(ids[:, 1:])
    for _ in range(150):
        _, loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.1


def test_bad_inputs():
    model = tiny()
    with pytest.raises(ValueError, match="longer than block_size 8"):
        model(mt.tensor(np.zeros((1, 9), dtype=np.int64)))
    with pytest.raises(ValueError, match="idx must be an integer tensor"):
        model(mt.tensor(np.zeros((1, 3))))
    with pytest.raises(ValueError, match="n_embd .* divisible by n_head"):
        GPTConfig(vocab_size=5, n_embd=10, n_head=3)
    with pytest.raises(ValueError, match="norm must be one of"):
        GPTConfig(vocab_size=5, norm="batchnorm")


def test_matches_the_pytorch_gpt_of_the_benchmarks():
    """An independent implementation: bench/torch_gpt.py, the same model written with PyTorch's own
    layers, loaded with our weights; loss and every gradient agree in float64."""
    torch = pytest.importorskip("torch")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import torch_gpt

    torch.set_default_dtype(torch.float64)
    try:
        mt.manual_seed(3)
        model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8), dtype=mt.float64)
        theirs = torch_gpt.from_microtensor(torch, model)
    finally:
        torch.set_default_dtype(torch.float32)
    rng = np.random.default_rng(5)
    x, y = rng.integers(0, 11, (3, 8)), rng.integers(0, 11, (3, 8))
    _, loss = model(mt.tensor(x), mt.tensor(y))
    loss.backward()
    _, their_loss = theirs(torch.tensor(x), torch.tensor(y))
    their_loss.backward()
    assert abs(loss.item() - their_loss.item()) < 1e-12
    ours = dict(model.named_parameters())
    np.testing.assert_allclose(ours["transformer.wte.weight"].grad, theirs.wte.weight.grad.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ours["transformer.h.1.attn.c_attn.weight"].grad, theirs.h[1].attn.c_attn.weight.grad.numpy().T, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ours["transformer.h.0.mlp.c_fc.weight"].grad, theirs.h[0].c_fc.weight.grad.numpy().T, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ours["transformer.h.0.ln_2.weight"].grad, theirs.h[0].ln_2.weight.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_generation_on_one_thread_restores_the_thread_count():
    numba = pytest.importorskip("numba")
    before = numba.get_num_threads()
    with mt.num_threads(1):
        assert numba.get_num_threads() == 1
    assert numba.get_num_threads() == before
    model = tiny(dtype=mt.float32)
    model.generate(np.zeros((1, 1), dtype=np.int64), 3, temperature=0)
    assert numba.get_num_threads() == before


EVERY_OPTION = [
    dict(norm=norm, mlp=mlp, pos=pos, bias=bias, tie_weights=tie)
    for norm in ("layernorm", "rmsnorm")
    for mlp in ("gelu", "swiglu")
    for pos in ("learned", "rope")
    for bias in (False, True)
    for tie in (True, False)
]


def perturbed(dtype, **options):
    """A tiny model whose every parameter is moved off its initial value: biases start at 0 and norm
    weights at 1, which would hide a bias or a norm weight left out."""
    model = tiny(dtype=dtype, **options)
    rng = np.random.default_rng(11)
    for param in model.parameters():
        param.data[...] += rng.normal(0.0, 0.2, param.shape).astype(param.dtype)
    return model


@pytest.mark.parametrize("options", EVERY_OPTION, ids=lambda o: "-".join(str(v) for v in o.values()))
def test_decode_step_equals_the_module_forward(options):
    """models/decode.py against GPT.forward in float64, where only the order of the sums differs:
    the logits of each new token, and the keys and values it writes into the cache."""
    from models.decode import decode, decode_weights

    model = perturbed(mt.float64, **options)
    tokens = np.random.default_rng(2).integers(0, 7, (2, 8))  # B = 2, a whole block
    weights = decode_weights(model)
    keys, values = model.new_cache_arrays(2)
    with mt.no_grad():
        for t in range(8):
            logits = decode(weights, tokens[:, t], t, keys, values)  # (B, V)
            expected = model(tokens[:, : t + 1])[0].data[:, -1]
            np.testing.assert_allclose(logits, expected, rtol=1e-10, atol=1e-12)
        module_caches = model.new_caches(2)
        model(tokens, caches=module_caches, offset=0)
    for layer, cache in enumerate(module_caches):
        np.testing.assert_allclose(keys[layer], cache.k, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(values[layer], cache.v, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("options", EVERY_OPTION, ids=lambda o: "-".join(str(v) for v in o.values()))
def test_cached_generation_equals_the_module_forward_past_block_size(options, monkeypatch):
    """float32, batch 2, 3 + 30 tokens through a block of 8: the window moves several times, the
    prompt and each new window go through the modules and every other token through decode."""
    import models.gpt as gpt

    calls = []

    def counted_decode(*args):
        calls.append(args[2])
        return gpt_decode(*args)

    gpt_decode = gpt.decode
    monkeypatch.setattr(gpt, "decode", counted_decode)
    model = perturbed(mt.float32, **options)
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    cached = list(model.generate_tokens(prompt, 30, temperature=0, use_kv_cache=True))
    uncached = list(model.generate_tokens(prompt, 30, temperature=0, use_kv_cache=False))
    assert len(calls) > 20  # most tokens took the decode path
    for (token_a, logits_a), (token_b, logits_b) in zip(cached, uncached):
        np.testing.assert_array_equal(token_a, token_b)
        np.testing.assert_allclose(logits_a, logits_b, rtol=1e-5, atol=1e-5)
