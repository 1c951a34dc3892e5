"""The fast set's one-token decode kernel (gpt/generation/decode_kernel.py) on the transformer variants:
grouped-query attention, sinusoidal and ALiBi positions and the mixture-of-experts MLP, alone and
combined with each other and with the older options (rope, learned positions, SwiGLU, RMSNorm,
untied weights, biases, online attention).

The reference is the module path: the same generation under the fast kernel set with
`decode_kernel_fits` patched to say no, so that every token goes through GPT.forward with the KV
cache. Both must give the same greedy tokens exactly, and the same logits and cache arrays at every
step to CROSS_SET_TOLERANCE (they differ only in the order of sums and in e^x and tanh from
polynomials), through several rebuilds of the cache past block_size."""
import os
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest

import microtensor as mt
from microtensor.ops.electives.moe import top_k_experts_reference
from gpt.generation import decode_kernel as kernel_module
from gpt.generation.decode_kernel import decode_kernel_fits
from gpt.model.transformer import GPT, GPTConfig

pytestmark = pytest.mark.skipif(numba.config.DISABLE_JIT, reason="the decode kernel is the fast set's: it needs Numba's compiler")

VOCAB = 7
BLOCK = 16
NEW_TOKENS = 30  # from a 3-token prompt through a block of 16: the window moves at 17 and 26 tokens
CROSS_SET_TOLERANCE = {mt.float64: 1e-10, mt.float32: 1e-4}  # as tests/test_gpt.py's, and for the same reasons

# Each new option alone, then combined with each other and with the older options.
VARIANTS = [
    dict(n_kv_head=1),
    dict(n_kv_head=2),
    dict(pos="sinusoidal"),
    dict(pos="alibi"),
    dict(mlp="moe"),
    dict(n_kv_head=2, pos="rope", norm="rmsnorm"),
    dict(n_kv_head=1, pos="learned", mlp="swiglu", tie_weights=False),
    dict(n_kv_head=2, pos="sinusoidal", mlp="moe", bias=True),
    dict(n_kv_head=1, pos="alibi", mlp="swiglu", norm="rmsnorm", tie_weights=False),
    dict(n_kv_head=2, pos="alibi", mlp="moe", attention="online", tie_weights=False, bias=True),
    dict(n_kv_head=1, pos="rope", mlp="moe", norm="rmsnorm", expert_top_k=1),
    dict(pos="sinusoidal", mlp="gelu", norm="rmsnorm", tie_weights=False, attention="online"),
]
VARIANT_IDS = ["-".join(f"{k}={v}" for k, v in o.items()) for o in VARIANTS]


def perturbed(dtype, **options):
    """A tiny model (2 layers, 4 query heads of size 4) with every parameter moved off its initial
    value: biases start at 0 and norm weights at 1, which would hide one the kernel left out."""
    mt.manual_seed(0)
    config = GPTConfig(vocab_size=VOCAB, block_size=BLOCK, n_layer=2, n_head=4, n_embd=16, **options)
    model = GPT(config, dtype=dtype)
    rng = np.random.default_rng(11)
    for param in model.parameters():
        param.data[...] += rng.normal(0.0, 0.2, param.shape).astype(param.dtype)
    return model


def assert_close(name, actual, expected, tolerance):
    """actual within `tolerance` of expected, relative to expected's largest magnitude."""
    scale = max(float(np.abs(expected).max()), np.finfo(np.float64).tiny)
    np.testing.assert_allclose(actual, expected, rtol=tolerance, atol=tolerance * scale, err_msg=name)


def generation(model, monkeypatch, use_decode_kernel, new_tokens=NEW_TOKENS):
    """A greedy KV-cache generation under the fast set, from a batch of two 3-token prompts: at
    each step the token ids (B,), the logits (B, V) and a copy of the cache arrays (keys, values),
    and how many steps the decode kernel took."""
    from gpt.generation import decode_kernel as fast_decode

    calls, arrays = [], []
    original_decode, original_arrays = fast_decode.decode, model.new_cache_arrays

    def counted_decode(*args):
        calls.append(args[2])
        return original_decode(*args)

    def recorded_arrays(batch):
        arrays.append(original_arrays(batch))
        return arrays[-1]

    with monkeypatch.context() as patch:
        patch.setattr(fast_decode, "decode", counted_decode)
        patch.setattr(model, "new_cache_arrays", recorded_arrays)
        if not use_decode_kernel:
            patch.setattr(kernel_module, "decode_kernel_fits", lambda config: False)
        steps = []
        with mt.using_kernels("fast"):
            for token, logits in model.generate_tokens(np.array([[1, 2, 3], [4, 5, 6]]), new_tokens, temperature=0):
                keys, values = arrays[0]
                steps.append((token.copy(), logits.copy(), keys.copy(), values.copy()))
    assert len(arrays) == 1  # one pair of cache arrays, reused by every window
    return steps, len(calls)


@pytest.mark.parametrize("dtype", [mt.float64, pytest.param(mt.float32, marks=pytest.mark.slow)], ids=["float64", "float32"])
@pytest.mark.parametrize("options", VARIANTS, ids=VARIANT_IDS)
def test_the_decode_kernel_gives_the_module_path_tokens_logits_and_caches(options, dtype, monkeypatch):
    tolerance = CROSS_SET_TOLERANCE[dtype]
    model = perturbed(dtype, **options)
    assert decode_kernel_fits(model.config)
    kernel_steps, kernel_calls = generation(model, monkeypatch, use_decode_kernel=True)
    module_steps, module_calls = generation(model, monkeypatch, use_decode_kernel=False)
    # every step, the first of each window too (the prompt, then the 8 tokens each rebuild keeps)
    assert kernel_calls == NEW_TOKENS
    assert module_calls == 0
    assert len(kernel_steps) == len(module_steps) == NEW_TOKENS
    for step, (kernel, module) in enumerate(zip(kernel_steps, module_steps)):
        np.testing.assert_array_equal(kernel[0], module[0], err_msg=f"the greedy token of step {step}")
        assert_close(f"the logits of step {step}", kernel[1], module[1], tolerance)
        assert_close(f"the cached keys after step {step}", kernel[2], module[2], tolerance)
        assert_close(f"the cached values after step {step}", kernel[3], module[3], tolerance)


def test_the_cache_of_grouped_heads_holds_n_kv_head_heads(monkeypatch):
    """The kernel writes Hk heads per layer (the shapes of the arrays generate_tokens allocates), and
    each query head reads its group's: a kernel that read head h instead of h // G would index
    past Hk = 1 and, with Hk = 2, mix the groups up (the test above compares the logits)."""
    model = perturbed(mt.float64, n_kv_head=1)
    steps, _ = generation(model, monkeypatch, use_decode_kernel=True, new_tokens=3)
    keys = steps[-1][2]
    assert keys.shape == (2, 2, 1, BLOCK, 4)  # (n_layer, B, Hk, block_size, D)
    assert np.abs(keys[:, :, 0, : 3 + 2]).min() > 0  # the prompt and the decoded tokens: filled


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_experts_with_equal_probabilities_are_chosen_as_the_module_chooses(top_k, monkeypatch):
    """A router of zeros gives every expert the same probability: the module's stable sort takes
    the lowest expert numbers (gpt/model/electives/moe.py), and so must the kernel, or other experts run and the
    logits differ."""
    model = perturbed(mt.float64, mlp="moe", n_expert=4, expert_top_k=top_k)
    for block in model.transformer.h:
        block.mlp.router.weight.data[...] = 0
    kernel_steps, _ = generation(model, monkeypatch, use_decode_kernel=True, new_tokens=8)
    module_steps, _ = generation(model, monkeypatch, use_decode_kernel=False, new_tokens=8)
    for step, (kernel, module) in enumerate(zip(kernel_steps, module_steps)):
        np.testing.assert_array_equal(kernel[0], module[0], err_msg=f"the greedy token of step {step}")
        assert_close(f"the logits of step {step}", kernel[1], module[1], 1e-10)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_route_against_a_sort_in_python(dtype):
    """The kernel's router for one token against numpy and Python's sort: the softmax, the top_k
    experts (equal probabilities: the lower number first; columns repeated in the router give
    exact ties) and the gates (renormalized over the chosen experts; with top_k = 1 the
    probability itself, as gpt/model/electives/moe.py does)."""
    from gpt.generation.decode_kernel import route, rows_times_matrix

    rng = np.random.default_rng(5)
    C, E = 16, 6
    for trial in range(20):
        weight = rng.normal(0.0, 1.0, (C, E)).astype(dtype)
        weight[:, 4] = weight[:, 1]  # experts 1 and 4 always tie, and 2, 3 and 5 too
        weight[:, 3] = weight[:, 5] = weight[:, 2]
        a = rng.normal(0.0, 1.0, C).astype(dtype)
        top_k = int(rng.integers(1, E + 1))
        probs, chosen, gates = np.empty(E, dtype), np.empty(E, np.bool_), np.empty(E, dtype)
        router_logits = np.zeros((1, E), dtype)
        rows_times_matrix(a[None], weight, router_logits)  # the kernel's own product: equal columns, equal logits
        route(router_logits[0], top_k, probs, chosen, gates)
        logits = a.astype(np.float64) @ weight.astype(np.float64)
        expected_probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        np.testing.assert_allclose(probs, expected_probs, rtol=1e-5 if dtype == np.float32 else 1e-12)
        experts = top_k_experts_reference(probs[None, :], top_k)[0]  # ranked on the kernel's own probabilities
        np.testing.assert_array_equal(np.flatnonzero(chosen), np.sort(experts), err_msg=f"trial {trial}, top_k {top_k}")
        expected_gates = np.zeros(E)  # renormalized over the chosen; with one expert, Switch's gate: p itself
        expected_gates[experts] = probs[experts] / (probs[experts].sum() if top_k > 1 else 1)
        np.testing.assert_allclose(gates, expected_gates, rtol=1e-6 if dtype == np.float32 else 1e-15)


def test_every_option_takes_the_decode_kernel():
    """decode_kernel_fits says yes to every combination GPTConfig accepts."""
    for n_kv_head in (1, 2, 4):
        for pos in ("learned", "rope", "sinusoidal", "alibi"):
            for mlp in ("gelu", "swiglu", "moe"):
                for norm in ("layernorm", "rmsnorm"):
                    for attention in ("standard", "online"):
                        config = GPTConfig(
                            vocab_size=VOCAB, n_head=4, n_embd=16, n_kv_head=n_kv_head, pos=pos, mlp=mlp, norm=norm, attention=attention
                        )
                        assert decode_kernel_fits(config), config


def test_alibi_positions_are_limited_by_the_cache_only():
    """ALiBi has no position table: the kernel accepts every position of the cache, and no more."""
    from microtensor.errors import InputError
    from gpt.generation.decode_kernel import decode, decode_weights

    model = perturbed(mt.float64, pos="alibi")
    weights = decode_weights(model)
    keys, values = model.new_cache_arrays(1)
    assert weights.wpe is None and weights.rope_cos is None
    decode(weights, np.array([1]), BLOCK - 1, keys, values)
    with pytest.raises(InputError, match=rf"decode: position {BLOCK} is outside the cache of {BLOCK} positions"):
        decode(weights, np.array([1]), BLOCK, keys, values)


@pytest.mark.parametrize("options", [{}] + VARIANTS, ids=["default"] + VARIANT_IDS)
def test_several_new_tokens_in_one_step_equal_the_module_forward(options):
    """decode with n new tokens per sequence (B, n), as speculative decoding verifies its proposals:
    the logits of every new position, and the keys and values each writes, are the module forward's
    over the whole sequence (each new token attends to the cache and to the new tokens before it,
    not after it); and a later step of one token continues that cache."""
    from gpt.generation.decode_kernel import decode, decode_weights

    model = perturbed(mt.float64, **options)
    tokens = np.random.default_rng(3).integers(0, VOCAB, (2, 11))
    weights = decode_weights(model)
    keys, values = model.new_cache_arrays(2)
    logits = np.concatenate([
        decode(weights, tokens[:, :3], 0, keys, values),  # a prompt of 3: (B, 3, V)
        decode(weights, tokens[:, 3:8], 3, keys, values),  # five continuing it
        decode(weights, tokens[:, 8], 8, keys, values)[:, None],  # one more, (B,) -> (B, V)
        decode(weights, tokens[:, 9:11], 9, keys, values),
    ], axis=1)  # fmt: skip
    with mt.no_grad(), mt.using_kernels("readable"):
        expected = model(tokens)[0].data  # (B, 11, V)
        module_caches = model.new_caches(2)
        model(tokens, caches=module_caches, offset=0)
    assert_close("the logits of every new position", logits, expected, CROSS_SET_TOLERANCE[mt.float64])
    for layer, cache in enumerate(module_caches):
        assert_close(f"layer {layer}'s keys", keys[layer, :, :, :11], cache.k[:, :, :11], CROSS_SET_TOLERANCE[mt.float64])
        assert_close(f"layer {layer}'s values", values[layer, :, :, :11], cache.v[:, :, :11], CROSS_SET_TOLERANCE[mt.float64])


@pytest.mark.parametrize("options", [{}, VARIANTS[4], VARIANTS[5]], ids=["default", VARIANT_IDS[4], VARIANT_IDS[5]])
def test_greedy_steps_in_one_call_equal_feeding_the_argmax_in_turn(options):
    """decode_greedy (speculative decoding's greedy draft): the tokens of feeding each argmax back in
    turn with decode, the logits each was chosen from, and the same cache."""
    from gpt.generation.decode_kernel import decode, decode_greedy, decode_weights

    model = perturbed(mt.float64, **options)
    weights = decode_weights(model)
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    keys, values = model.new_cache_arrays(2)
    chosen, logits = decode_greedy(weights, prompt, 0, 6, keys, values)
    expected_keys, expected_values = model.new_cache_arrays(2)
    step_logits = decode(weights, prompt, 0, expected_keys, expected_values)[:, -1]
    for step in range(6):
        token = step_logits.argmax(axis=-1)
        np.testing.assert_array_equal(chosen[:, step], token, err_msg=f"step {step}")
        assert_close(f"the logits of step {step}", logits[:, step], step_logits, 1e-12)
        if step < 5:
            step_logits = decode(weights, token, 3 + step, expected_keys, expected_values)
    assert_close("the keys", keys[:, :, :, :8], expected_keys[:, :, :, :8], 1e-12)
    assert_close("the values", values[:, :, :, :8], expected_values[:, :, :, :8], 1e-12)


@pytest.mark.slow
def test_a_model_compiles_only_the_code_of_its_own_options(tmp_path):
    """What a model has not got is None in DecodeWeights, so Numba leaves its branches out of the
    kernel (the module docstring): with an empty compile cache, a token of the default GPT compiles
    neither the router, rotary positions, SwiGLU, the int4 product nor an int8 one."""
    script = (
        "import numpy as np\n"
        "from gpt.model.transformer import GPT, GPTConfig\n"
        "from gpt.generation import decode_kernel as k\n"
        "model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8))\n"
        "keys, values = model.new_cache_arrays(1)\n"
        "k.decode(k.decode_weights(model), np.array([1]), 0, keys, values)\n"
        "print(sorted(name for name in ('route', 'rotate_heads', 'swiglu_in_place', 'rows_times_int4_matrix') if k.__dict__[name].overloads),\n"
        "      len(k.rows_times_matrix.overloads))\n"
    )  # fmt: skip
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), PYTHONPATH=str(root))
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[] 1"  # one product compiled: floats times floats
