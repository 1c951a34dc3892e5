"""The GPT: gradients of every parameter against finite differences, the readable and fast kernel
sets against each other, the KV cache and the fast set's decode kernel against recomputation,
initialization, learning, names and errors."""
import math

import numba
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


@pytest.mark.slow  # 150 training steps: minutes as plain Python under NUMBA_DISABLE_JIT=1
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


def test_matches_the_pytorch_gpt_of_the_benchmarks(kernel_set):
    """An independent implementation: bench/torch_gpt.py, the same model written with PyTorch's own
    layers, loaded with our weights; loss and every gradient agree in float64, in either kernel set."""
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


OPTION_IDS = lambda o: "-".join(str(v) for v in o.values())  # noqa: E731
needs_the_jit = pytest.mark.skipif(numba.config.DISABLE_JIT, reason="the fast kernels need Numba's compiler")

# How far the two kernel sets may disagree, relative to the size of what is compared. They compute
# the same math with the sums in another order (BLAS, vectorized reductions) and e^x, tanh from
# polynomials instead of the C library: in float64 that is rounding at ~1e-16 per operation; in
# float32 at ~6e-8 per operation, gathered over a forward and a backward through every layer.
CROSS_SET_TOLERANCE = {mt.float64: 1e-10, mt.float32: 1e-4}


def loss_gradients_and_generation(kernel_set, dtype, options):
    """Under one kernel set: a perturbed tiny model's loss, every parameter's gradient, and a greedy
    KV-cache generation of 12 tokens from a 3-token prompt through a block of 8 (the window moves once)."""
    with mt.using_kernels(kernel_set):
        model = perturbed(dtype, **options)
        idx, targets = batch(np.random.default_rng(1))
        _, loss = model(idx, targets)
        loss.backward()
        gradients = {name: param.grad.copy() for name, param in model.named_parameters()}
        prompt = np.array([[1, 2, 3], [4, 5, 6]])
        generated = list(model.generate_tokens(prompt, 12, temperature=0, use_kv_cache=True))
    return loss.item(), gradients, generated


def assert_close(name, fast, readable, tolerance):
    """fast within `tolerance` of readable, relative to readable's largest magnitude."""
    scale = max(float(np.abs(readable).max()), np.finfo(np.float64).tiny)
    np.testing.assert_allclose(fast, readable, rtol=tolerance, atol=tolerance * scale, err_msg=name)


@needs_the_jit
@pytest.mark.parametrize("dtype", [mt.float64, mt.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("options", EVERY_OPTION, ids=OPTION_IDS)
def test_the_readable_and_fast_kernel_sets_give_the_same_model(options, dtype):
    """For every model option and both float types, the loss, every parameter's gradient and a
    KV-cache generation (the greedy tokens and their logits: the fast set decodes one-token steps
    with microtensor/fast/decode.py, the readable set runs them through the modules) agree between
    the two kernel sets, to CROSS_SET_TOLERANCE."""
    tolerance = CROSS_SET_TOLERANCE[dtype]
    readable_loss, readable_gradients, readable_generated = loss_gradients_and_generation("readable", dtype, options)
    fast_loss, fast_gradients, fast_generated = loss_gradients_and_generation("fast", dtype, options)
    assert abs(fast_loss - readable_loss) <= tolerance * abs(readable_loss)
    assert fast_gradients.keys() == readable_gradients.keys()
    for name, readable in readable_gradients.items():
        assert_close(name, fast_gradients[name], readable, tolerance)
    assert len(fast_generated) == len(readable_generated) == 12
    for step, ((fast_token, fast_logits), (readable_token, readable_logits)) in enumerate(zip(fast_generated, readable_generated)):
        np.testing.assert_array_equal(fast_token, readable_token, err_msg=f"token {step}")
        assert_close(f"logits of token {step}", fast_logits, readable_logits, tolerance)


@needs_the_jit
@pytest.mark.parametrize("options", EVERY_OPTION, ids=OPTION_IDS)
def test_decode_step_equals_the_module_forward(options):
    """microtensor/fast/decode.py against GPT.forward run by the readable kernels, in float64, where
    only the order of the sums differs: the logits of each new token, and the keys and values it
    writes into the cache."""
    from microtensor.fast.decode import decode, decode_weights

    model = perturbed(mt.float64, **options)
    tokens = np.random.default_rng(2).integers(0, 7, (2, 8))  # B = 2, a whole block
    weights = decode_weights(model)
    keys, values = model.new_cache_arrays(2)
    with mt.no_grad(), mt.using_kernels("readable"):
        for t in range(8):
            logits = decode(weights, tokens[:, t], t, keys, values)  # (B, V)
            expected = model(tokens[:, : t + 1])[0].data[:, -1]
            np.testing.assert_allclose(logits, expected, rtol=1e-10, atol=1e-12)
        module_caches = model.new_caches(2)
        model(tokens, caches=module_caches, offset=0)
    for layer, cache in enumerate(module_caches):
        np.testing.assert_allclose(keys[layer], cache.k, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(values[layer], cache.v, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("options", EVERY_OPTION, ids=OPTION_IDS)
def test_cached_generation_equals_the_module_forward_past_block_size(options, kernel_set, monkeypatch):
    """float32, batch 2, 3 + 30 tokens through a block of 8: the window moves several times. The
    prompt and each new window go through the modules; every other token through the decode kernel
    under the fast set, and through the modules with the KV cache under the readable set."""
    calls = []
    if not numba.config.DISABLE_JIT:  # without the JIT the fast set cannot run, so nothing to watch
        from microtensor.fast import decode as fast_decode

        def counted_decode(*args):
            calls.append(args[2])
            return original_decode(*args)

        original_decode = fast_decode.decode
        monkeypatch.setattr(fast_decode, "decode", counted_decode)
    model = perturbed(mt.float32, **options)
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    cached = list(model.generate_tokens(prompt, 30, temperature=0, use_kv_cache=True))
    uncached = list(model.generate_tokens(prompt, 30, temperature=0, use_kv_cache=False))
    if kernel_set == "fast":
        assert len(calls) > 20  # most tokens took the decode path
    else:
        assert calls == []  # the readable set never runs the fast set's decode kernel
    assert len(cached) == len(uncached) == 30
    for (token_a, logits_a), (token_b, logits_b) in zip(cached, uncached):
        np.testing.assert_array_equal(token_a, token_b)
        np.testing.assert_allclose(logits_a, logits_b, rtol=1e-5, atol=1e-5)
