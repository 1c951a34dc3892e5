"""Multi-head latent attention (gpt/model/electives/latent_attention.py): the module against a numpy
reference written here (keys and values expanded from the latent, the shared rotary key), its
gradients against finite differences in float64, the absorbed decode step equal to the expanded
one, cached generation (absorbed) token for token equal to uncached and to expanded generation,
the cache's bytes, the flags refused, and (slow) train.py, resume and generate.

Tolerances: float64 results to 1e-12 (the absorbed form sums the same products in another order).
"""
import re

import numpy as np
import pytest

import microtensor as mt
import train
import generate
from gpt.checkpoints import checkpoint, convert
from gpt.generation.decoder import Decoder
from gpt.model.electives.latent_attention import LatentAttention, LatentCache
from gpt.model.transformer import GPT, ConfigError, GPTConfig, parameter_count
from gpt.model.transformer import training_step_bytes
from helpers import JIT_DISABLED
from test_gpt import bytes_the_graph_keeps
from test_programs import TINY, corpus, said, write_corpus  # noqa: F401 (corpus is a fixture)


def tiny_config(pos="rope", **options):
    return GPTConfig(vocab_size=11, block_size=12, n_layer=2, n_head=2, n_embd=8, attention="latent", kv_latent=3, pos=pos, **options)


def rotate(x, offset):
    """RoPE by hand: pairs (x_2i, x_2i+1) of x (..., T, R) as complex numbers times e^{i t θ_i}."""
    T, R = x.shape[-2:]
    theta = 10000.0 ** (-np.arange(0, R, 2) / R)
    turn = np.exp(1j * np.arange(offset, offset + T)[:, None] * theta)  # (T, R/2)
    z = (x[..., 0::2] + 1j * x[..., 1::2]) * turn
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = z.real, z.imag
    return out


def reference(attn, x, offset=0):
    """The module's output in numpy, head by head, every key and value built from the latent."""
    H, D, L, R = attn.n_head, attn.head_size, attn.kv_latent, attn.rope_head_dim
    B, T, C = x.shape
    bias = lambda layer: 0 if layer.bias is None else layer.bias.data  # noqa: E731
    q = (x @ attn.c_q.weight.data + bias(attn.c_q)).reshape(B, T, H, D + R)
    down = x @ attn.kv_down.weight.data + bias(attn.kv_down)
    latent, rope_key = down[..., :L], rotate(down[..., L:], offset)  # (B, T, L), (B, T, R)
    mask = np.tril(np.ones((T, T), dtype=bool))
    heads = []
    for h in range(H):
        k = latent @ attn.k_up.weight.data[:, h * D : (h + 1) * D]  # (B, T, D)
        v = latent @ attn.v_up.weight.data[:, h * D : (h + 1) * D]
        q_h = np.concatenate([q[:, :, h, :D], rotate(q[:, :, h, D:], offset)], -1)  # (B, T, D + R)
        scores = q_h @ np.concatenate([k, rope_key], -1).swapaxes(1, 2) / np.sqrt(D + R)  # (B, T, T)
        if attn.alibi_slopes is not None:
            scores -= attn.alibi_slopes[h] * np.abs(np.arange(T)[:, None] - np.arange(T))
        scores = np.where(mask, scores, -np.inf)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        heads.append(p / p.sum(-1, keepdims=True) @ v)
    return np.concatenate(heads, -1) @ attn.c_proj.weight.data + bias(attn.c_proj)


@pytest.mark.parametrize("pos, bias", [("rope", False), ("alibi", True), ("learned", False)])
def test_the_module_matches_a_numpy_reference(pos, bias):
    mt.manual_seed(0)
    attn = LatentAttention(tiny_config(pos, bias=bias), mt.float64)
    x = np.random.default_rng(1).standard_normal((2, 5, 8))
    np.testing.assert_allclose(attn(mt.tensor(x)).data, reference(attn, x), rtol=1e-12, atol=1e-12)


def test_gradients_through_the_module_agree_with_finite_differences():
    mt.manual_seed(0)
    attn = LatentAttention(tiny_config("rope", bias=True), mt.float64)
    x = mt.tensor(np.random.default_rng(2).standard_normal((1, 4, 8)), requires_grad=True)
    weights = [attn.c_q.weight, attn.kv_down.weight, attn.k_up.weight, attn.v_up.weight, attn.c_proj.weight]
    assert mt.gradcheck(lambda x, *w: attn(x), [x, *weights])  # gradcheck draws a random upstream gradient


@pytest.mark.parametrize("pos", ["rope", "alibi", "sinusoidal"])
def test_the_absorbed_decode_step_equals_the_expanded_one(pos):
    """A prompt, then one token at a time, through the cache: attending over the latents (W_UK in
    the queries, W_UV after) gives the numbers of building every key and value first."""
    mt.manual_seed(0)
    model = GPT(tiny_config(pos), dtype=mt.float64)
    ids = np.random.default_rng(3).integers(0, 11, (2, 7))
    outputs = {}
    for absorb in (True, False):
        for block in model.transformer.h:
            block.attn.absorb = absorb
        caches = model.new_caches(2)
        steps = [model(ids[:, :4], caches=caches)[0].data] + [model(ids[:, t : t + 1], caches=caches, offset=t)[0].data for t in range(4, 7)]
        outputs[absorb] = np.concatenate(steps, axis=1)  # (B, 7, V)
    np.testing.assert_allclose(outputs[True], outputs[False], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(outputs[True], model(ids)[0].data, rtol=1e-12, atol=1e-12)  # and the uncached forward


def test_absorbed_generation_is_token_for_token_the_expanded_and_the_uncached_one():
    mt.manual_seed(1)
    model = GPT(tiny_config("rope"), dtype=mt.float64)
    prompt = [[1, 2, 3], [4, 5, 6]]
    absorbed = model.generate(prompt, 20, temperature=0).data  # past block_size 12: the window moves, the cache is rebuilt
    for block in model.transformer.h:
        block.attn.absorb = False
    np.testing.assert_array_equal(absorbed, model.generate(prompt, 20, temperature=0).data)
    np.testing.assert_array_equal(absorbed, model.generate(prompt, 20, temperature=0, use_kv_cache=False).data)


def test_beam_search_over_latent_caches_equals_it_without_a_cache():
    """Beam search reorders each layer's LatentCache (reordered(rows)) as its beams change places."""
    from gpt.generation.electives.beam_search import beam_search

    mt.manual_seed(2)
    model = GPT(tiny_config("rope"), dtype=mt.float64)
    cached, uncached = beam_search(model, [1, 2, 3], 3, 12), beam_search(model, [1, 2, 3], 3, 12, use_kv_cache=False)
    for ours, theirs in zip(cached.beams, uncached.beams):
        np.testing.assert_array_equal(ours.tokens, theirs.tokens)
        assert abs(ours.logprob - theirs.logprob) < 1e-12


def test_each_layer_keeps_latents_the_kernel_does_not_run_and_reorder_gathers_rows():
    mt.manual_seed(0)
    model = GPT(tiny_config("rope"))
    assert model.new_cache_arrays(2) is None
    with mt.using_kernels("readable" if JIT_DISABLED else "fast"), Decoder(model, 2, 3) as decoder:
        assert decoder.kernel is None and all(isinstance(cache, LatentCache) for cache in decoder.caches)
        sequences = np.array([[1, 2, 3], [4, 5, 6]])
        decoder.feed(sequences)
        latents = decoder.caches[0].latent[:, :3].copy()
        decoder.reorder([1, 1, 0])
        np.testing.assert_array_equal(decoder.caches[0].latent[:, :3], latents[[1, 1, 0]])
        assert all(cache.length == 3 for cache in decoder.caches)
    from gpt.generation import decode_kernel

    assert not decode_kernel.can_run(model)


def test_cache_bytes_per_token_against_mha_gqa_mqa():
    """At the default size (4 layers, width 128, 4 heads of 32), float32: MHA keeps 2 · 4 · 128
    numbers per token, GQA with 2 heads half, MQA a quarter; the latent 32 + the rotary key 16, per layer."""
    def cache_bytes(**options):
        return GPT(GPTConfig(vocab_size=3, n_layer=4, **options)).kv_cache_bytes_per_token()

    assert cache_bytes() == 4096 and cache_bytes(n_kv_head=2) == 2048 and cache_bytes(n_kv_head=1) == 1024
    assert cache_bytes(attention="latent", kv_latent=32, pos="rope") == 4 * (32 + 16) * 4
    assert cache_bytes(attention="latent", kv_latent=32) == 4 * 32 * 4  # learned positions: no rotary key
    assert GPTConfig(vocab_size=3, attention="latent").kv_latent == 32  # the default: a quarter of the width


@pytest.mark.parametrize("pos", ["rope", "learned"])
def test_the_activations_estimate_is_a_close_lower_bound_of_what_the_graph_keeps(pos):
    """training_step_bytes with attention latent, as tests/test_gpt.py checks the other options."""
    mt.manual_seed(0)
    B, V = 3, 19
    config = GPTConfig(vocab_size=V, block_size=16, n_layer=2, n_head=4, n_embd=16, attention="latent", kv_latent=4, pos=pos)
    model = GPT(config)
    rng = np.random.default_rng(0)
    _, loss = model(mt.tensor(rng.integers(0, V, (B, 16))), mt.tensor(rng.integers(0, V, (B, 16))))
    kept = bytes_the_graph_keeps(loss, model.parameters())
    estimate = training_step_bytes(config, B)["activations"] - B * 16 * (V * 4 + 2 * 8)
    assert 0.7 * kept <= estimate <= kept, (estimate, kept)
    assert model.num_parameters() == parameter_count(config)


@pytest.mark.parametrize(
    "options, field, message",
    [
        ({"kv_latent": 9}, "kv_latent", "kv_latent (9) must be between 1 and n_embd (8)"),
        ({"n_kv_head": 1}, "n_kv_head", "n_kv_head (1) has no meaning with attention latent"),
        ({"pos": "learned", "rope_head_dim": 2}, "rope_head_dim", "exists only with pos rope, not learned"),
        ({"rope_head_dim": 3}, "rope_head_dim", "rope_head_dim must be even and >= 2"),
    ],
)
def test_options_that_cannot_work_are_refused(options, field, message):
    settings = {"vocab_size": 11, "n_head": 2, "n_embd": 8, "attention": "latent", "pos": "rope", **options}
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        GPTConfig(**settings)
    assert error.value.field == field


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--attention", "latent", "--kv-latent", "17"], "--kv-latent: given 17, expected an integer in [1, --n-embd] = [1, 16]"),
        (["--kv-latent", "4"], "--kv-latent: given 4 without --attention latent"),
        (["--attention", "latent", "--n-kv-head", "1"], "--n-kv-head: given 1, expected unset, or --n-head (2)"),
        (["--attention", "latent", "--rope-head-dim", "4"], "--rope-head-dim: given 4, expected unset with --pos learned"),
    ],
)
def test_train_refuses_the_flags_naming_them(tmp_path, flags, message, capsys):
    corpus_path = write_corpus(tmp_path / "corpus.txt")
    argv = ["--data", corpus_path, "--out-dir", str(tmp_path / "out"), "--max-iters", "1", *TINY, *flags]
    assert train.main(argv) == 1
    assert f"error: {message}" in said(capsys)


@pytest.mark.slow
def test_train_resumes_exactly_and_generates(tmp_path, corpus, capsys):
    flags = ["--data", corpus, "--eval-interval", "4", *TINY, "--attention", "latent", "--kv-latent", "4", "--pos", "rope"]
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    assert train.main([*flags, "--out-dir", one, "--max-iters", "8"]) == 0
    assert "KV cache per token (generation)" in said(capsys)
    assert train.main([*flags, "--out-dir", two, "--max-iters", "4"]) == 0
    assert train.main([*flags, "--out-dir", two, "--max-iters", "8", "--resume"]) == 0
    (state_one, _, meta_one), (state_two, _, meta_two) = checkpoint.load(one), checkpoint.load(two)
    assert meta_one["iteration"] == meta_two["iteration"] == 8 and meta_one["config"]["kv_latent"] == 4
    for name in state_one:
        np.testing.assert_array_equal(state_one[name], state_two[name], err_msg=name)
    capsys.readouterr()
    assert generate.main(["--out-dir", two, "--prompt", "the king", "--max-new-tokens", "20", "--seed", "1"]) == 0
    assert "the king" in capsys.readouterr().out
    with pytest.raises(convert.ConvertError, match="latent attention .* has standard attention only"):
        convert.export_checkpoint(two, tmp_path / "model.npz")
