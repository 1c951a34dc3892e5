"""The GPT: gradients of every parameter against finite differences, the readable and fast kernel
sets against each other, the KV cache and the fast set's decode kernel against recomputation,
initialization, learning, names and errors."""
import math
import os
import subprocess
import sys

import numba
import numpy as np
import pytest

import microtensor as mt
from microtensor import GradcheckError, gradcheck
from microtensor.errors import InputError, InputTypeError
from gpt.model.transformer import GPT, GPTConfig, parameter_count, training_step_bytes
from gpt.generation.sampling import keep_top_k, keep_top_p, sample, token_distribution
from helpers import needs_jit

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

    import gpt.model.transformer as transformer

    transformer.F.gelu, saved = wrong_gelu, transformer.F.gelu
    try:
        with pytest.raises(GradcheckError):
            gradcheck(lambda p: model(idx)[0], [weight], max_elements=6)
    finally:
        transformer.F.gelu = saved


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


def test_greedy_sampling_takes_the_largest_logit_ties_to_the_lower_id():
    """Temperature 0 in `sample`, which the module path and every sampled step's caller use (the
    fast set's greedy generation picks its tokens in the decode kernel instead)."""
    logits = np.array([[0.1, 2.0, -1.0, 2.0], [-3.0, -2.5, -4.0, -2.6], [5.0, 5.0, 5.0, 5.0]])
    np.testing.assert_array_equal(sample(logits, 0, None, None, np.random.default_rng(0)), [1, 1, 0])


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
    """An independent implementation: gpt/checkpoints/torch_gpt.py, the same model written with PyTorch's own
    layers, loaded with our weights; loss and every gradient agree in float64, in either kernel set."""
    torch = pytest.importorskip("torch")
    from gpt.checkpoints import torch_gpt

    torch.set_default_dtype(torch.float64)
    try:
        mt.manual_seed(3)
        model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8), dtype=mt.float64)
        theirs = torch_gpt.from_microtensor(model)
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
    np.testing.assert_allclose(ours["transformer.wte.weight"].grad, theirs.transformer.wte.weight.grad.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ours["transformer.h.1.attn.c_attn.weight"].grad, theirs.transformer.h[1].attn.c_attn.weight.grad.numpy().T, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ours["transformer.h.0.mlp.c_fc.weight"].grad, theirs.transformer.h[0].mlp.c_fc.weight.grad.numpy().T, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ours["transformer.h.0.ln_2.weight"].grad, theirs.transformer.h[0].ln_2.weight.grad.numpy(), rtol=1e-9, atol=1e-12)


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
# Every combination under -m slow; the four of OPTIONS, which between them take each value of each
# option, in the default run.
EVERY_OPTION_PARAMS = [
    pytest.param(o, id=OPTION_IDS(o), marks=() if o in OPTIONS else pytest.mark.slow) for o in EVERY_OPTION
]
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


@pytest.mark.all_threads
@needs_the_jit
@pytest.mark.parametrize("dtype", [mt.float64, mt.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("options", EVERY_OPTION_PARAMS)
def test_the_readable_and_fast_kernel_sets_give_the_same_model(options, dtype):
    """For every model option and both float types, the loss, every parameter's gradient and a
    KV-cache generation (the greedy tokens and their logits: the fast set decodes one-token steps
    with gpt/generation/decode_kernel.py, the readable set runs them through the modules) agree between
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
@pytest.mark.parametrize("options", EVERY_OPTION_PARAMS)
def test_decode_step_equals_the_module_forward(options):
    """gpt/generation/decode_kernel.py against GPT.forward run by the readable kernels, in float64, where
    only the order of the sums differs: the logits of each new token, and the keys and values it
    writes into the cache."""
    from gpt.generation.decode_kernel import decode, decode_weights

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


@pytest.mark.parametrize("options", EVERY_OPTION_PARAMS)
def test_cached_generation_equals_the_module_forward_past_block_size(options, kernel_set, monkeypatch):
    """float32, batch 2, 3 + 30 tokens through a block of 8: the window moves several times. The
    prompt and each new window go through the modules; every other token through the decode kernel
    under the fast set, and through the modules with the KV cache under the readable set."""
    calls = []
    if not numba.config.DISABLE_JIT:  # without the JIT the fast set cannot run, so nothing to watch
        from gpt.generation import decode_kernel as fast_decode

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


@needs_the_jit
@pytest.mark.parametrize("prompt_length", [3, 11])
def test_greedy_generate_takes_the_steps_of_a_window_in_one_kernel_call(prompt_length, monkeypatch):
    """GPT.generate at temperature 0 under the fast set: the steps the window holds run in one
    decode_greedy call each (a window of 8 moves every 4 tokens; a prompt of 11 starts with its
    last 8), with the tokens that one step per call gives."""
    from gpt.generation import decode_kernel as fast_decode

    calls = []
    original_greedy = fast_decode.decode_greedy

    def counted_greedy(weights, tokens, position, steps, keys, values):
        calls.append(steps)
        return original_greedy(weights, tokens, position, steps, keys, values)

    monkeypatch.setattr(fast_decode, "decode_greedy", counted_greedy)
    model = perturbed(mt.float32)
    prompt = np.random.default_rng(0).integers(0, model.config.vocab_size, (2, prompt_length))
    with mt.using_kernels("fast"):
        steps = [token for token, _ in model.generate_tokens(prompt, 30, temperature=0)]  # one step per call
        generated = model.generate(prompt, 30, temperature=0).numpy()[:, prompt_length:]
    np.testing.assert_array_equal(generated, np.stack(steps, axis=1))
    assert sum(calls) == 30 and len(calls) <= 8  # every step, in a few calls


# ================================================================================= memory of a training step

MEMORY_OPTIONS = [
    {}, dict(mlp="swiglu", pos="rope"), dict(attention="online"), dict(mlp="moe", expert_top_k=1), dict(mlp="moe"),
    dict(pos="alibi", n_kv_head=1), dict(pos="sinusoidal", norm="rmsnorm", bias=True, tie_weights=False), dict(dropout=0.1),
]  # fmt: skip


@pytest.mark.parametrize("options", MEMORY_OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_parameter_count_from_the_config_equals_the_model_s(options):
    for bias in (False, True):
        config = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=4, n_embd=16, **{"bias": bias, **options})
        assert parameter_count(config) == GPT(config).num_parameters()


def bytes_the_graph_keeps(loss, parameters):
    """Bytes of the distinct arrays the graph of `loss` holds (every tensor reachable from it and every
    array its ops saved), the parameters' excepted: what a step's activations cost, measured."""
    def base(array):
        while isinstance(array.base, np.ndarray):
            array = array.base
        return array

    kept, seen, stack = {}, set(), [loss]
    while stack:
        tensor = stack.pop()
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        kept[id(base(tensor.data))] = base(tensor.data)
        context = tensor._ctx
        if context is not None:
            kept.update((id(base(a)), base(a)) for a in context.saved_tensors if isinstance(a, np.ndarray))
            stack.extend(x for x in context.inputs if isinstance(x, mt.Tensor))
    weights = {id(base(p.data)) for p in parameters}
    return sum(array.nbytes for key, array in kept.items() if key not in weights)


@pytest.mark.parametrize("options", MEMORY_OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_the_activations_estimate_is_a_close_lower_bound_of_what_the_graph_keeps(options):
    """training_step_bytes' activations (without the logits' gradient, which backward makes, and the
    ids) against the arrays a forward's graph really holds: never more (train.py refuses on it), and
    not far below (a refusal must come before the machine swaps)."""
    mt.manual_seed(0)
    B, V = 3, 19
    config = GPTConfig(vocab_size=V, block_size=16, n_layer=2, n_head=4, n_embd=16, **options)
    model = GPT(config)
    rng = np.random.default_rng(0)
    _, loss = model(mt.tensor(rng.integers(0, V, (B, 16))), mt.tensor(rng.integers(0, V, (B, 16))))
    kept = bytes_the_graph_keeps(loss, model.parameters())
    estimate = training_step_bytes(config, B)["activations"] - B * 16 * (V * 4 + 2 * 8)
    assert 0.7 * kept <= estimate <= kept, (estimate, kept)
    assert training_step_bytes(config, B)["weights"] == 16 * parameter_count(config)  # float32: parameter, gradient, two moments
    assert training_step_bytes(config, B, itemsize=8, trains_every_weight=False)["weights"] == 8 * parameter_count(config)
    twice = training_step_bytes(config, 2 * B)
    assert twice["activations"] == 2 * training_step_bytes(config, B)["activations"] and twice["total"] == twice["weights"] + twice["activations"]


# ================================================================================= sampling filters

# Probabilities that are sums of powers of two, so that every partial sum is exact in float64 and the
# boundary cases (the tokens above add up to exactly top_p) are decided by the rule, not by rounding.
DYADIC = np.array([[0.125, 0.5, 0.0625, 0.25, 0.0625], [0.25, 0.25, 0.25, 0.125, 0.125]])


@pytest.mark.parametrize(
    "top_p, kept_first, kept_second",
    [
        (1e-9, {1}, {0}),  # the most probable token is always kept (ties: the lower id ranks first)
        (0.5, {1}, {0, 1}),  # row 1: 0.5 alone reaches 0.5; row 2: 0.25 + 0.25 does
        (0.5000001, {1, 3}, {0, 1, 2}),
        (0.75, {1, 3}, {0, 1, 2}),  # 0.5 + 0.25 reaches 0.75 exactly: nothing more
        (0.875, {1, 3, 0}, {0, 1, 2, 3}),
        (1.0, {0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}),
    ],
)
def test_top_p_keeps_the_smallest_set_of_most_probable_tokens_reaching_top_p(top_p, kept_first, kept_second):
    keep = keep_top_p(DYADIC, top_p)
    assert keep.dtype == bool and keep.shape == DYADIC.shape
    assert set(np.flatnonzero(keep[0])) == kept_first
    assert set(np.flatnonzero(keep[1])) == kept_second


def test_top_k_keeps_the_k_largest_and_every_token_tied_with_the_kth():
    logits = np.array([[1.0, 3.0, 3.0, 2.0, 3.0], [0.0, -1.0, 5.0, 4.0, 4.5]])
    kept = lambda k: [set(np.flatnonzero(np.isfinite(row))) for row in keep_top_k(logits, k)]  # noqa: E731
    assert kept(1) == [{1, 2, 4}, {2}]  # three tokens tied at the top: all kept (as nanoGPT does)
    assert kept(2) == [{1, 2, 4}, {2, 4}]
    assert kept(4) == [{1, 2, 3, 4}, {0, 2, 3, 4}]
    assert kept(99) == [{0, 1, 2, 3, 4}] * 2  # more than the vocabulary: every token
    np.testing.assert_array_equal(keep_top_k(logits, 2)[1, [2, 4]], [5.0, 4.5])  # kept logits unchanged


def test_sample_draws_only_the_kept_tokens_and_each_of_them():
    rng = np.random.default_rng(0)
    logits = np.log(np.array([[0.5, 0.25, 0.125, 0.0625, 0.0625]]))
    draws = lambda **kw: {int(sample(logits, 1.0, rng=rng, **kw)[0]) for _ in range(400)}  # noqa: E731
    assert draws(top_k=None, top_p=0.7) == {0, 1}  # 0.5 + 0.25 >= 0.7
    assert draws(top_k=None, top_p=0.8) == {0, 1, 2}
    assert draws(top_k=2, top_p=None) == {0, 1}
    assert draws(top_k=None, top_p=None) == {0, 1, 2, 3, 4}
    tied = np.array([[1.0, 3.0, 3.0, 2.0, 3.0]])
    assert {int(sample(tied, 1.0, 1, None, rng)[0]) for _ in range(200)} == {1, 2, 4}
    np.testing.assert_array_equal(sample(np.array([[0.0, 2.0, 1.0], [5.0, 0.0, 1.0]]), 0, None, None, rng), [1, 0])


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_sample_draws_from_softmax_of_the_logits_divided_by_the_temperature(temperature):
    """The same generator state draws the same token from the same probabilities: the probabilities
    softmax(logits / temperature) are written out here, and each draw compared."""
    logits = np.array([[0.3, -1.2, 2.0, 0.0, 1.1]])
    scaled = np.exp(logits[0] / temperature - np.max(logits[0] / temperature))
    probs = scaled / scaled.sum()
    for seed in range(40):
        expected = np.random.default_rng(seed).choice(5, p=probs)
        assert sample(logits, temperature, None, None, np.random.default_rng(seed))[0] == expected, seed


def test_a_temperature_too_small_to_divide_by_gives_the_limit_greedy():
    """logits / 1e-320 overflows: the differences to the largest logit go to -inf instead of inf - inf
    = nan, so the distribution is the limit as temperature -> 0, one-hot at the argmax (before:
    numpy's "Probabilities contain NaN"), shared evenly by tokens tied at the max."""
    logits = np.array([[0.3, -1.2, 2.0, 0.0, 1.1], [1.0, 3.0, 3.0, 2.0, -1.0]])
    with np.errstate(all="raise"):  # no overflow warning reaches the user either
        probs = token_distribution(logits, 1e-320)
        np.testing.assert_array_equal(probs, [[0, 0, 1, 0, 0], [0, 0.5, 0.5, 0, 0]])
        np.testing.assert_array_equal(token_distribution(logits, 1e-320, top_k=1, top_p=0.5), [[0, 0, 1, 0, 0], [0, 1, 0, 0, 0]])
        assert sample(logits[:1], 5e-324, None, None, np.random.default_rng(0))[0] == 2
    model = tiny(dtype=mt.float32)
    greedy = model.generate([[1, 2]], 6, temperature=0).numpy()
    np.testing.assert_array_equal(model.generate([[1, 2]], 6, temperature=1e-320, seed=3).numpy(), greedy)


# ================================================================================= the context window


def expected_windows(block_size, prompt_length, steps):
    """The window rule written out by hand, step by step, for the tests below (not the model's code)."""
    table = {
        (8, 3, 12): [0, 0, 0, 0, 0, 0, 5, 5, 5, 5, 5, 10],  # full at exactly 8 tokens; at 9, the last 4
        (8, 10, 6): [2, 7, 7, 7, 7, 7],  # a prompt longer than the block: its last 8 tokens, then the last 4
        (3, 2, 7): [0, 0, 3, 3, 3, 6, 6],  # block 3 keeps the last 1 (3 // 2)
        (1, 1, 5): [0, 1, 2, 3, 4],  # block 1: the window is the last token alone
        (2, 1, 6): [0, 0, 2, 2, 4, 4],
    }
    starts = table[(block_size, prompt_length, steps)]
    return [(start, prompt_length + step) for step, start in enumerate(starts)]


@pytest.mark.parametrize("block_size, prompt_length, steps", [(8, 3, 12), (8, 10, 6), (3, 2, 7), (1, 1, 5), (2, 1, 6)])
@pytest.mark.parametrize("options", OPTIONS[:2], ids=["learned", "rope"])
def test_generation_sees_exactly_the_window_of_the_rule(block_size, prompt_length, steps, options, kernel_set):
    """Each generated token's logits, cached and uncached, against the module forward of the window
    the rule gives, computed here by hand: the window is full at exactly block_size tokens and moves
    one token later. (block_size 1 failed before: its window was left empty.)"""
    mt.manual_seed(0)
    config = GPTConfig(vocab_size=7, block_size=block_size, n_layer=2, n_head=2, n_embd=8, **options)
    model = GPT(config, dtype=mt.float64)
    prompt = np.random.default_rng(4).integers(0, 7, (2, prompt_length))
    runs = {cached: list(model.generate_tokens(prompt, steps, temperature=0, use_kv_cache=cached)) for cached in (True, False)}
    sequence = np.concatenate([prompt] + [token[:, None] for token, _ in runs[True]], axis=1)
    with mt.no_grad():
        for step, (start, end) in enumerate(expected_windows(block_size, prompt_length, steps)):
            expected = model(sequence[:, start:end])[0].data[:, -1]  # (B, V)
            np.testing.assert_array_equal(runs[True][step][0], expected.argmax(-1))
            for cached, generated in runs.items():
                np.testing.assert_allclose(generated[step][1], expected, rtol=1e-9, atol=1e-11, err_msg=f"step {step}, cached={cached}")


@pytest.mark.parametrize("options", OPTIONS[:2], ids=["learned", "rope"])
def test_forward_with_a_cache_and_an_offset_equals_the_full_forward(options, kernel_set):
    """Chunks of a sequence through the caches (offsets 0, 3, 4) give the logits of the full forward
    at the same positions: the offset moves the position embedding or rotation, and a chunk's
    queries attend to the cached keys before them."""
    model = perturbed(mt.float64, **options)
    tokens = np.random.default_rng(3).integers(0, 7, (2, 8))
    with mt.no_grad():
        full = model(tokens)[0].data  # (B, 8, V)
        caches = model.new_caches(2)
        for begin, end in ((0, 3), (3, 4), (4, 8)):
            chunk = model(tokens[:, begin:end], caches=caches, offset=begin)[0].data
            np.testing.assert_allclose(chunk, full[:, begin:end], rtol=1e-10, atol=1e-12, err_msg=f"tokens {begin}..{end}")
        assert all(cache.length == 8 for cache in caches)
        if options["pos"] == "learned":  # (rotations depend only on distances: a shift changes nothing)
            # Without a cache, an offset still moves the learned positions.
            shifted = model(tokens[:, 4:8], offset=4)[0].data
            assert not np.allclose(shifted, model(tokens[:, 4:8])[0].data)


@needs_the_jit
@pytest.mark.parametrize("tie_weights", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_decode_with_a_square_head_equals_the_module_forward(tie_weights, pos):
    """vocab_size == n_embd, so that the head (C, V) and its transpose have the same shape: a decode
    path that used wte without the transpose (or lm_head when tied) would run and be wrong."""
    from gpt.generation.decode_kernel import decode, decode_weights

    mt.manual_seed(1)
    model = GPT(GPTConfig(vocab_size=8, block_size=6, n_layer=1, n_head=2, n_embd=8, pos=pos, tie_weights=tie_weights), dtype=mt.float64)
    rng = np.random.default_rng(12)
    for param in model.parameters():
        param.data[...] += rng.normal(0.0, 0.3, param.shape)
    assert ("lm_head.weight" in dict(model.named_parameters())) != tie_weights
    tokens = rng.integers(0, 8, (2, 6))
    weights = decode_weights(model)
    head = model.transformer.wte.weight.data.T if tie_weights else model.lm_head.weight.data
    np.testing.assert_array_equal(weights.lm_head.floats[0], head)
    keys, values = model.new_cache_arrays(2)
    with mt.no_grad(), mt.using_kernels("readable"):
        full = model(tokens)[0].data
        for t in range(6):
            np.testing.assert_allclose(decode(weights, tokens[:, t], t, keys, values), full[:, t], rtol=1e-10, atol=1e-12)


# ================================================================================= checks (issue 12)


@pytest.mark.parametrize("bad_id", [7, -1, 10**6])
@pytest.mark.parametrize("prompt_length", [1, 3])
def test_generate_refuses_ids_outside_the_vocabulary(bad_id, prompt_length, kernel_set):
    """Before: a one-token prompt went straight to the fast decode kernel, which read outside the
    embedding table (garbage for id 7 = V, the last row for -1, a segfault for 10**6)."""
    model = tiny(dtype=mt.float32)
    prompt = np.full((1, prompt_length), 2)
    prompt[0, -1] = bad_id
    for use_kv_cache in (True, False):
        with pytest.raises(InputError, match=rf"generate: token id {bad_id} is outside the vocabulary; ids must be in \[0, 7\)"):
            model.generate(prompt, 2, temperature=0, use_kv_cache=use_kv_cache)
    with pytest.raises(InputError, match=rf"generate_tokens: token id {bad_id} is outside"):
        model.generate_tokens(prompt, 2)  # when called, not at the first step
    with pytest.raises(InputError, match=rf"GPT: token id {bad_id} is outside the vocabulary"):
        model(prompt)


BAD_GENERATE_ARGUMENTS = [
    (np.array([[1.7, 2.0]]), {}, InputTypeError, "idx must hold integer token ids, got float64"),
    (np.array([[True, False]]), {}, InputTypeError, "idx must hold integer token ids, got bool"),
    (np.array([1, 2]), {}, InputError, r"idx must be \(B, T\) with B >= 1 and T >= 1, got shape \(2,\)"),
    (np.zeros((1, 2, 3), dtype=np.int64), {}, InputError, r"got shape \(1, 2, 3\)"),
    (np.zeros((0, 3), dtype=np.int64), {}, InputError, r"got shape \(0, 3\)"),
    (np.zeros((2, 0), dtype=np.int64), {}, InputError, r"got shape \(2, 0\)"),
    ([[1, 2], [3]], {}, InputError, "ragged"),
    ([[1, 2]], {"max_new_tokens": -1}, InputError, "max_new_tokens must be an int >= 0, got -1"),
    ([[1, 2]], {"max_new_tokens": 2.5}, InputError, "max_new_tokens must be an int >= 0, got 2.5"),
    ([[1, 2]], {"temperature": -1.0}, InputError, "temperature must be a finite number >= 0"),
    ([[1, 2]], {"temperature": float("nan")}, InputError, "temperature must be a finite number >= 0"),
    ([[1, 2]], {"temperature": float("inf")}, InputError, "temperature must be a finite number >= 0"),
    ([[1, 2]], {"top_k": 0}, InputError, "top_k must be None or an int >= 1, got 0"),
    ([[1, 2]], {"top_k": 1.5}, InputError, "top_k must be None or an int >= 1, got 1.5"),
    ([[1, 2]], {"top_p": 0.0}, InputError, r"top_p must be None or a number in \(0, 1\]"),
    ([[1, 2]], {"top_p": 1.5}, InputError, r"top_p must be None or a number in \(0, 1\]"),
    ([[1, 2]], {"top_p": float("nan")}, InputError, r"top_p must be None or a number in \(0, 1\]"),
    ([[1, 2]], {"use_kv_cache": "yes"}, InputTypeError, "use_kv_cache must be True or False"),
    ([[1, 2]], {"seed": -3}, InputError, "seed must be None or an int >= 0"),
]


@pytest.mark.parametrize("prompt, kwargs, error, message", BAD_GENERATE_ARGUMENTS, ids=[case[3][:28] for case in BAD_GENERATE_ARGUMENTS])
def test_generate_checks_every_argument_before_generating(prompt, kwargs, error, message):
    model = tiny(dtype=mt.float32)
    kwargs = {"max_new_tokens": 3, "temperature": 0, **kwargs}
    with pytest.raises(error, match="generate: .*" + message):
        model.generate(prompt, **kwargs)
    with pytest.raises(error, match="generate_tokens: .*" + message):
        model.generate_tokens(prompt, **kwargs)


def test_generate_takes_lists_tensors_and_zero_new_tokens():
    model = tiny(dtype=mt.float32)
    a = model.generate([[1, 2]], 3, temperature=0).numpy()
    b = model.generate(mt.tensor(np.array([[1, 2]])), np.int64(3), temperature=0).numpy()
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(model.generate([[1, 2]], 0).numpy(), [[1, 2]])


@pytest.mark.parametrize(
    "fields, error, message",
    [
        ({"vocab_size": 3.5}, InputTypeError, "vocab_size must be an int, got float 3.5"),
        ({"vocab_size": "65"}, InputTypeError, "vocab_size must be an int, got str"),
        ({"n_layer": True}, InputTypeError, "n_layer must be an int, got bool"),
        ({"block_size": 0}, InputError, "block_size must be a positive integer, got 0"),
        ({"n_head": -2}, InputError, "n_head must be a positive integer"),
        ({"dropout": "0.1"}, InputTypeError, "dropout must be a number"),
        ({"dropout": float("nan")}, InputError, r"dropout must be in \[0, 1\)"),
        ({"dropout": 1.0}, InputError, r"dropout must be in \[0, 1\)"),
        ({"bias": "no"}, InputTypeError, "bias must be True or False, got str 'no'"),
        ({"tie_weights": 1}, InputTypeError, "tie_weights must be True or False, got int 1"),
        ({"norm": 3}, InputTypeError, "norm must be one of"),
        ({"mlp": "relu"}, InputError, "mlp must be one of"),
        ({"pos": None}, InputTypeError, "pos must be one of"),
        ({"pos": "rope", "n_embd": 6, "n_head": 2}, InputError, "rope needs an even head size, got 3"),
    ],
    ids=lambda x: str(x)[:28] if isinstance(x, dict) else "",
)
def test_gpt_config_checks_every_field_and_its_type(fields, error, message):
    with pytest.raises(error, match="GPTConfig: " + message):
        GPTConfig(**{"vocab_size": 5, "n_embd": 8, "n_head": 2, **fields})


def test_gpt_config_takes_numpy_integers_as_ints():
    config = GPTConfig(vocab_size=np.int64(5), n_embd=np.int32(8), n_head=2)
    assert type(config.vocab_size) is int and type(config.n_embd) is int
    import json

    json.dumps(config.to_dict())  # plain JSON, as a checkpoint stores it


def test_gpt_config_names_an_unknown_field_and_the_closest_known_one():
    with pytest.raises(InputTypeError, match=r"GPTConfig: unknown field 'n_layers' \(did you mean n_layer\?\); expected one of vocab_size, block_size, n_layer,"):
        GPTConfig(vocab_size=5, n_layers=2)  # before: Python's TypeError from the dataclass's __init__
    with pytest.raises(InputTypeError, match=r"GPTConfig: unknown field 'colour' \(no field is close\); expected one of vocab_size,"):
        GPTConfig(vocab_size=5, colour="red")


def test_forward_checks_the_offset_and_the_caches():
    model = tiny()
    tokens = np.array([[1, 2, 3]])
    with pytest.raises(InputError, match="GPT: offset must be an int >= 0, got -1"):
        model(tokens, offset=-1)  # before: position -1 read wpe's last row
    with pytest.raises(InputError, match="GPT: offset must be an int >= 0, got 1.5"):
        model(tokens, offset=1.5)
    with pytest.raises(InputError, match="idx must be an integer tensor"):
        model([[1.5, 2.0]])
    caches = model.new_caches(1)
    model(tokens, caches=caches, offset=0)
    with pytest.raises(InputError, match="offset is 2, but the cache of layer 0 holds 3 positions"):
        model(tokens[:, :1], caches=caches, offset=2)  # before: keys at 3, positions at 2
    with pytest.raises(InputError, match=r"the cache of layer 0 holds keys \(1, 2, 8, 4\)"):
        model(np.zeros((2, 1), dtype=np.int64), caches=caches, offset=3)  # a batch of 2 on caches for 1
    with pytest.raises(InputTypeError, match="caches must be a list of 2 KVCaches"):
        model(tokens, caches=caches[:1], offset=3)
    with pytest.raises(InputError, match="new_cache_arrays: batch must be an int >= 1, got 0"):
        model.new_cache_arrays(0)
    with pytest.raises(InputTypeError, match="GPT: expected a GPTConfig, got dict"):
        GPT({"vocab_size": 5})


def test_decode_checks_what_its_kernel_would_index():
    """Before: a batch larger than the cache arrays was written out of bounds, and tokens were not
    checked against the vocabulary. Every check runs before the kernel, so no JIT is needed."""
    from gpt.generation.decode_kernel import decode, decode_weights

    model = tiny(dtype=mt.float32)
    weights = decode_weights(model)
    keys, values = model.new_cache_arrays(2)
    tokens = np.array([1, 2])
    with pytest.raises(InputError, match=r"decode: keys has shape \(2, 2, 2, 8, 4\), expected .* with B = 3 tokens"):
        decode(weights, np.array([1, 2, 3]), 0, keys, values)
    with pytest.raises(InputError, match=r"decode: position 8 is outside the cache of 8 positions"):
        decode(weights, tokens, 8, keys, values)
    with pytest.raises(InputError, match=r"decode: position -1 is outside"):
        decode(weights, tokens, -1, keys, values)
    with pytest.raises(InputError, match=r"decode: token id 7 is outside the vocabulary"):
        decode(weights, np.array([1, 7]), 0, keys, values)
    with pytest.raises(InputError, match=r"decode: tokens must be \(B,\) integer ids"):
        decode(weights, np.array([1.0, 2.0]), 0, keys, values)
    with pytest.raises(InputTypeError, match=r"decode: values must be a writeable float32 array"):
        decode(weights, tokens, 0, keys, values.astype(np.float64))
    with pytest.raises(InputError, match=r"decode: values has shape"):
        decode(weights, tokens, 0, keys, values[:, :, :, :4])
    with pytest.raises(InputTypeError, match="decode: weights must be a DecodeWeights"):
        decode(model, tokens, 0, keys, values)


# ================================================================================= the sampling distribution


@pytest.mark.parametrize("top_k", [None, 3])
def test_token_distribution_renormalizes_the_tokens_top_p_keeps(top_k):
    """After top-p, the kept tokens' probabilities are divided by their sum: each row sums to 1 and
    keeps the kept tokens' proportions. Kills the mutant sample.top_p_not_renormalized (which
    otherwise only numpy's own check in rng.choice, or an exercise, notices)."""
    from gpt.generation.sampling import token_distribution

    logits = np.log(DYADIC)  # rows [0.125, 0.5, 0.0625, 0.25, 0.0625] and [0.25, 0.25, 0.25, 0.125, 0.125]
    probs = token_distribution(logits, 1.0, top_k=top_k, top_p=0.7)
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0, rtol=0, atol=1e-15)
    # row 1 keeps 0.5 and 0.25 (0.75 >= 0.7); row 2 keeps the three 0.25s (0.75)
    np.testing.assert_allclose(probs, [[0, 2 / 3, 0, 1 / 3, 0], [1 / 3, 1 / 3, 1 / 3, 0, 0]], rtol=0, atol=1e-15)


@needs_jit
def test_nothing_is_compiled_ahead_where_nothing_would_be_compiled():
    """compile_in_background starts no process under the readable set, for a model the kernel does
    not run, or once the kernel's version for the model is compiled (here by a first generation)."""
    from gpt.generation import decode_kernel, decoder

    model = tiny(dtype=mt.float32)
    with mt.using_kernels("readable"):
        assert decoder.compile_in_background(model) is None
    model.generate(np.array([[1]]), 2, temperature=0)  # compiles (or loads) the kernel's version
    assert decode_kernel.is_compiled(model)
    assert decoder.compile_in_background(model) is None
    assert decoder.compile_in_background(tiny(dtype=mt.float32, mixer="ssm", pos="none")) is None  # its layers keep their own state
    decoder.finish_compiling(None)  # nothing to wait for


@pytest.mark.slow
@needs_jit
def test_a_second_process_compiles_the_kernel_into_an_empty_cache(tmp_path):
    """With an empty compile cache, compile_in_background's process compiles the kernel's version
    for the model into that cache and ends; a later process finds it compiled, and generates the
    same tokens as the modules do."""
    script = """
import sys, numpy as np
import microtensor as mt
from gpt.generation import decode_kernel, decoder
from gpt.model.transformer import GPT, GPTConfig

mt.manual_seed(0)
model = GPT(GPTConfig(vocab_size=7, block_size=8, n_layer=2, n_head=2, n_embd=8))
if sys.argv[1] == "start":
    assert not decode_kernel.is_compiled(model)
    process = decoder.compile_in_background(model)
    decoder.finish_compiling(process)
    print(process.returncode)
else:
    assert decode_kernel.is_compiled(model)
    kernel = model.generate(np.array([[1, 2]]), 6, temperature=0).numpy()
    with mt.using_kernels("readable"):
        modules = model.generate(np.array([[1, 2]]), 6, temperature=0).numpy()
    print(int((kernel == modules).all()))
"""
    environment = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    for stage, expected in (("start", "0"), ("after", "1")):
        result = subprocess.run([sys.executable, "-c", script, stage], env=environment, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == [expected]
    assert any((tmp_path / "cache").rglob("decode_kernel.decode_step*.nbi"))


@needs_jit
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_decode_kernels_rows_sharing_weights_give_each_rows_own_sums(dtype):
    """rows_times_matrix takes up to four rows of x against each loaded weight (a speculative round's
    check); every row's output is the row's own product, as the row alone gives it, float weights and
    int8 codes. Each sum is added in the same order either way; only where the compiler fuses a
    multiply with its add may differ between the two loops (it does under NUMBA_BOUNDSCHECK=1), so
    they agree to a few roundings of each term: 4 eps times the sum of the terms' sizes."""
    from gpt.generation.decode_kernel import rows_times_matrix

    rng = np.random.default_rng(3)
    eps = np.finfo(dtype).eps
    for weight in (rng.standard_normal((131, 37)).astype(dtype), rng.integers(-127, 128, (131, 37)).astype(np.int8)):
        for n in (2, 3, 4, 5, 7, 8, 9):
            x = rng.standard_normal((n, 131)).astype(dtype)
            together = np.zeros((n, 37), dtype)
            rows_times_matrix(x, weight, together)
            for r in range(n):
                alone = np.zeros((1, 37), dtype)
                rows_times_matrix(x[r : r + 1].copy(), weight, alone)
                bound = 4 * eps * (np.abs(x[r]).astype(np.float64) @ np.abs(weight).astype(np.float64))  # (37,)
                assert np.all(np.abs(together[r].astype(np.float64) - alone[0]) <= bound), (n, r)
