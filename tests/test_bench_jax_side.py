"""bench/jax_side.py, the JAX GPT the benchmarks time against microtensor, where JAX is installed:
it must compute what microtensor computes from the same weights, or its timings would compare
different work. microtensor is the independent implementation it is checked against here (the
benchmarks check the first loss and the generated tokens again at every run)."""
import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import microtensor as mt  # noqa: E402
from microtensor import optim  # noqa: E402
from gpt.model.transformer import GPT, GPTConfig  # noqa: E402

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
jax_side = importlib.import_module("jax_side")
harness = importlib.import_module("harness")

RECIPE = dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16)
LR, WEIGHT_DECAY, BETAS, CLIP = 1e-2, 0.1, (0.9, 0.99), 0.5


def weights_of(model, tmp_path):
    path = tmp_path / "weights.npz"
    np.savez(path, **model.state_dict())
    return str(path)


def microtensor_steps(model, seed, steps=2):
    """Losses of `steps` training steps of `model` as the benchmark runs them (clipping, AdamW)."""
    opt = optim.AdamW(optim.weight_decay_groups(model, WEIGHT_DECAY), lr=LR, betas=BETAS)
    rng, losses = np.random.default_rng(seed), []
    for _ in range(steps):
        x, y = harness.random_batch(rng, 3, RECIPE["block_size"], RECIPE["vocab_size"])
        _, loss = model(mt.tensor(x), mt.tensor(y))
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        optim.clip_grad_norm(model.parameters(), CLIP)
        opt.step()
    return losses


def test_two_training_steps_give_microtensors_losses_and_weights(tmp_path):
    """The losses of two steps (the second after clipping and AdamW) and every weight after them."""
    mt.manual_seed(0)
    model = GPT(GPTConfig(**RECIPE))
    config = GPTConfig(**RECIPE).to_dict()
    params = jax_side.load_params(config, weights_of(model, tmp_path))
    ours = microtensor_steps(model, seed=5)
    zeros = jax.tree_util.tree_map(jax.numpy.zeros_like, params)
    opt_state = {"t": jax.numpy.zeros((), jax.numpy.int32), "m": zeros, "v": jax.tree_util.tree_map(jax.numpy.zeros_like, params)}
    rng, theirs = np.random.default_rng(5), []
    for _ in range(2):
        x, y = harness.random_batch(rng, 3, RECIPE["block_size"], RECIPE["vocab_size"])
        loss, params, opt_state = jax_side.train_step(
            params, opt_state, x, y, n_head=RECIPE["n_head"], lr=LR, weight_decay=WEIGHT_DECAY, betas=BETAS, clip=CLIP
        )
        theirs.append(float(loss))
    np.testing.assert_allclose(theirs, ours, rtol=1e-5)
    state = model.state_dict()
    np.testing.assert_allclose(np.asarray(params["wte"]), state["transformer.wte.weight"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(params["wpe"]), state["transformer.wpe.weight"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(params["ln_f"]), state["transformer.ln_f.weight"], rtol=1e-4, atol=1e-6)
    for i, block in enumerate(params["blocks"]):
        for name, value in block.items():
            np.testing.assert_allclose(np.asarray(value), state[f"transformer.h.{i}.{name}.weight"], rtol=1e-4, atol=1e-6, err_msg=name)


def test_the_benchmarks_first_loss_is_microtensors(tmp_path):
    mt.manual_seed(0)
    model = GPT(GPTConfig(**RECIPE))
    reply = jax_side.setup_train(GPTConfig(**RECIPE).to_dict(), weights_of(model, tmp_path), 3, 7, LR, WEIGHT_DECAY, BETAS, CLIP)
    assert reply["first_loss"] == pytest.approx(microtensor_steps(model, seed=7, steps=1)[0], rel=1e-5)


def test_greedy_generation_gives_microtensors_tokens(tmp_path):
    mt.manual_seed(1)
    model = GPT(GPTConfig(**RECIPE))
    new_tokens = RECIPE["block_size"] - 1
    expected = model.generate(mt.tensor(np.zeros((1, 1), dtype=np.int64)), new_tokens, temperature=0).data[0]
    jax_side.setup_generate(GPTConfig(**RECIPE).to_dict(), weights_of(model, tmp_path), new_tokens)
    assert jax_side.TIMED["generate_kv_cache"]() == expected.tolist()


def test_another_configuration_is_refused():
    with pytest.raises(ValueError, match="norm='layernorm'"):
        jax_side.check_config(GPTConfig(**RECIPE, norm="rmsnorm").to_dict())
