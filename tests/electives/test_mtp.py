"""Multi-token prediction (gpt/model/electives/mtp.py, GPTConfig.mtp) and self-speculative decoding
(gpt/generation/electives/self_speculative.py): the loss is the (weighted) sum of the heads'
cross-entropies, each over the positions that have a target k places ahead (checked against numpy);
the heads' gradients are checked; self-speculative decoding gives greedy decoding's tokens at
temperature 0 and the model's distribution above it; bad flags are refused by name; a run with
extra heads resumes exactly, generates, and exports them as named tensors."""
import numpy as np
import pytest

import generate
import microtensor as mt
import train
from microtensor import InputError
from gpt.checkpoints import convert
from gpt.generation.electives.self_speculative import self_speculative_generate
from gpt.generation.sampling import log_softmax
from gpt.model.electives import mtp
from gpt.model.transformer import GPT, ConfigError, GPTConfig, parameter_count
from test_programs import TINY, corpus, parameters, said  # noqa: F401 (corpus is a fixture)


def tiny_model(n=3, vocab=7, block=8, seed=0, **options):
    mt.manual_seed(seed)
    config = GPTConfig(vocab_size=vocab, n_layer=1, n_head=2, n_embd=8, block_size=block, mtp=n, **options)
    model = GPT(config, dtype=mt.float64)
    rng = np.random.default_rng(seed)
    for _, p in model.named_parameters():  # larger than GPT-2's init, so that the heads disagree
        p.data[...] = rng.normal(0, 0.4, p.shape)
    return model


def numpy_cross_entropy(logits, targets):
    """Mean of -log softmax(logits)[target] over every row, in numpy."""
    logp = log_softmax(logits.reshape(-1, logits.shape[-1]))
    return float(-logp[np.arange(targets.size), targets.reshape(-1)].mean())


@pytest.mark.parametrize("weights", [None, "1,0.5,0.25"])
def test_the_loss_is_the_weighted_sum_of_each_head_s_cross_entropy_over_positions_with_a_target(weights):
    model = tiny_model(n=3, mtp_weights=weights)
    rng = np.random.default_rng(1)
    x = rng.integers(0, 7, (2, 8))
    y = rng.integers(0, 7, (2, 8))
    _, loss = model(mt.tensor(x), mt.tensor(y))
    hidden = model.trunk(mt.tensor(x)).data  # (B, T, C)
    expected, w = 0.0, [1, 1, 1] if weights is None else [1, 0.5, 0.25]
    for k in (1, 2, 3):
        # head k at positions t = 0 .. T - k predicts y[t + k - 1]; the last k - 1 positions have no target
        logits = mtp.head_logits(model, mt.tensor(hidden[:, : 8 - k + 1]), k).data
        expected += w[k - 1] * numpy_cross_entropy(logits, y[:, k - 1 :])
        assert model.head_losses[k - 1].item() == pytest.approx(numpy_cross_entropy(logits, y[:, k - 1 :]), rel=1e-12)
    assert loss.item() == pytest.approx(expected, rel=1e-12)


def test_positions_without_a_target_are_left_out_not_padded():
    """Head k's loss does not change when the tokens past its last target change, and a sequence
    shorter than k leaves head k out of the sum."""
    model = tiny_model(n=3)
    rng = np.random.default_rng(2)
    x, y = rng.integers(0, 7, (1, 8)), rng.integers(0, 7, (1, 8))
    model(mt.tensor(x), mt.tensor(y))
    head_3 = model.head_losses[2].item()
    # head 3 at the last two positions would predict tokens past y's end: their hidden states, the
    # only ones that read the last two inputs, must not enter its loss
    x_changed = x.copy()
    x_changed[0, -2:] = (x[0, -2:] + 1) % 7  # the inputs at the last two positions: no head-3 target reads them
    model(mt.tensor(x_changed), mt.tensor(y))
    assert model.head_losses[2].item() == pytest.approx(head_3, rel=1e-12)
    _, loss = model(mt.tensor(x[:, :2]), mt.tensor(y[:, :2]))  # T = 2: head 3 has no position with a target
    assert model.head_losses[2] is None
    assert loss.item() == pytest.approx(model.head_losses[0].item() + model.head_losses[1].item(), rel=1e-12)


def test_the_gradients_of_the_heads_and_the_trunk_check():
    model = tiny_model(n=3, vocab=5, block=4)
    rng = np.random.default_rng(3)
    x, y = mt.tensor(rng.integers(0, 5, (2, 4))), mt.tensor(rng.integers(0, 5, (2, 4)))
    head = model.mtp_heads[1]
    weights = [head.mlp.c_fc.weight, head.ln_1.weight, model.transformer.ln_f.weight, model.transformer.h[0].mlp.c_proj.weight]

    def loss_of(*tensors):
        return model(x, y)[1]

    assert mt.gradcheck(loss_of, weights)


def test_mtp_1_is_the_baseline_and_counts_its_parameters():
    plain = tiny_model(n=1)
    assert not hasattr(plain, "mtp_heads")
    assert [n for n, _ in plain.named_parameters()] == [n for n, _ in tiny_model(n=1).named_parameters()]
    for options in ({"mtp": 4}, {"mtp": 2, "mlp": "swiglu", "bias": True}):
        config = GPTConfig(vocab_size=9, n_layer=1, n_head=2, n_embd=8, block_size=8, **options)
        assert parameter_count(config) == GPT(config).num_parameters()


@pytest.mark.parametrize("kernels", ["default", "readable"])
@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_self_speculative_decoding_at_temperature_0_is_greedy_decoding(pos, kernels):
    # block 8 and 40 tokens: the window moves several times inside the generation; the readable
    # set takes every round through the modules, the fast set through the decode kernel
    model = tiny_model(n=4, vocab=5, block=8, pos=pos, seed=1)  # a seed whose drafts are accepted and rejected
    prompt = np.array([[1, 2, 3]])
    greedy = model.generate(prompt, 40, temperature=0).numpy()[0, 3:]
    with mt.using_kernels(mt.get_kernels() if kernels == "default" else kernels):
        tokens, stats = self_speculative_generate(model, prompt, 40, temperature=0)
    np.testing.assert_array_equal(tokens, greedy)
    assert stats.generated == 40 and 0 < stats.accepted < stats.proposed and stats.rounds < 40


def test_self_speculative_sampling_follows_the_model_s_distribution():
    """The first two tokens' joint frequencies over many seeds against p(a) p(b | a), exactly."""
    model = tiny_model(n=3, vocab=3, block=8, seed=4)
    prompt = np.array([[0, 1]])
    with mt.no_grad():
        first = np.exp(log_softmax(model(mt.tensor(prompt))[0].data[0, -1]))
        exact = np.array([first[a] * np.exp(log_softmax(model(mt.tensor([[0, 1, a]]))[0].data[0, -1])) for a in range(3)])
    counts = np.zeros((3, 3))
    draws = 1500
    for seed in range(draws):
        tokens, _ = self_speculative_generate(model, prompt, 2, temperature=1.0, seed=seed)
        counts[tokens[0], tokens[1]] += 1
    # each cell within 4.5 standard deviations of its binomial count
    sd = np.sqrt(draws * exact * (1 - exact))
    assert np.all(np.abs(counts - draws * exact) <= 4.5 * sd + 1), (counts / draws, exact)


def test_bad_mtp_values_are_refused_by_name():
    for options, field in (({"mtp": 0}, "mtp"), ({"mtp": -2}, "mtp"), ({"mtp": 2, "mtp_weights": "1"}, "mtp_weights"),
                           ({"mtp": 2, "mtp_weights": "1,x"}, "mtp_weights"), ({"mtp": 2, "mtp_weights": "0,0"}, "mtp_weights"),
                           ({"mtp": 2, "mtp_weights": "1,nan"}, "mtp_weights"), ({"mtp": 65, "block_size": 64}, "mtp")):  # fmt: skip
        with pytest.raises(ConfigError) as error:
            GPTConfig(vocab_size=5, **options)
        assert error.value.field == field
    with pytest.raises(InputError, match="no extra heads"):
        self_speculative_generate(tiny_model(n=1), [1, 2], 3, temperature=0)


def test_bad_flags_are_refused_naming_the_flag(tmp_path, corpus, capsys):
    for flags, named in ((["--mtp", "0"], "--mtp: given 0"), (["--mtp", "2", "--mtp-weights", "1,2,3"], "--mtp-weights: given 1,2,3"),
                         (["--mtp-weights", "1,1"], "--mtp-weights: given 1,1")):  # fmt: skip
        assert train.main(["--data", corpus, "--out-dir", str(tmp_path / "out"), *TINY, "--max-iters", "1", *flags]) == 1
        assert named in said(capsys)


def test_a_run_with_extra_heads_resumes_exactly_generates_and_exports_them(tmp_path, corpus, capsys):
    def run(folder, *extra):
        return train.main(["--data", corpus, "--out-dir", str(tmp_path / folder / "out"), *TINY, "--mtp", "3", "--eval-interval", "3", *extra])

    assert run("whole", "--max-iters", "6") == 0
    assert "final val loss of each head" in said(capsys)
    assert run("halves", "--max-iters", "3") == 0
    assert run("halves", "--max-iters", "6", "--resume") == 0
    (whole, meta), (resumed, _) = parameters(tmp_path / "whole"), parameters(tmp_path / "halves")
    assert meta["config"]["mtp"] == 3 and any(name.startswith("mtp_heads.1.") for name in whole)
    for name in whole:
        np.testing.assert_array_equal(resumed[name], whole[name], err_msg=name)
    out = str(tmp_path / "whole" / "out")
    capsys.readouterr()
    assert generate.main(["--out-dir", out, "--prompt", "the", "--max-new-tokens", "30", "--temperature", "0"]) == 0
    greedy = capsys.readouterr().out
    assert generate.main(["--out-dir", out, "--prompt", "the", "--max-new-tokens", "30", "--temperature", "0", "--self-speculative"]) == 0
    drafted = capsys.readouterr().out
    text = [line for line in greedy.splitlines() if line.startswith("the")]
    assert len(text) == 1 and text == [line for line in drafted.splitlines() if line.startswith("the")] and "acceptance rate" in " ".join(drafted.split())
    export = tmp_path / "model.npz"
    convert.main([out, str(export)])
    with np.load(export) as archive:
        assert "mtp_heads.1.mlp.c_fc.weight" in archive.files
    assert convert.main([str(export), str(tmp_path / "back" / "out")]) == 0
    back, _ = parameters(tmp_path / "back")
    for name in whole:
        np.testing.assert_array_equal(back[name], whole[name], err_msg=name)
    torch = pytest.importorskip("torch")
    from gpt.checkpoints import torch_gpt

    theirs, _ = torch_gpt.load_export(export)  # the next-token model: the extra heads stay in the file
    ours = GPT(GPTConfig(**meta["config"]))
    ours.load_state_dict(whole)
    ids = np.array([[1, 2, 3, 4]])
    with torch.no_grad():
        np.testing.assert_allclose(theirs(torch.from_numpy(ids))[0].numpy(), ours(mt.tensor(ids))[0].numpy(), rtol=1e-4, atol=1e-5)


def test_self_speculative_needs_a_model_with_extra_heads(tmp_path, corpus, capsys):
    assert train.main(["--data", corpus, "--out-dir", str(tmp_path / "out"), *TINY, "--max-iters", "1", "--sample-chars", "0"]) == 0
    capsys.readouterr()
    assert generate.main(["--out-dir", str(tmp_path / "out"), "--self-speculative"]) == 1
    assert "--self-speculative: given with the model" in said(capsys)
    assert generate.main(["--out-dir", str(tmp_path / "out"), "--self-speculative", "--no-kv-cache"]) == 1
    assert "expected no --no-kv-cache" in said(capsys)


def test_the_bench_case_renders_its_tables():
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "bench"
    sys.path.insert(0, str(bench))
    try:
        from cases.electives import mtp as case
    finally:
        sys.path.remove(str(bench))
    machine = {"date": "2031-05-06", "processor": "Made-up CPU", "isa": "avx2", "cores": 3, "numpy": "9.8.7", "numba": "6.5.4"}
    training = [
        {"mtp": 1, "steps": 200, "val_loss": 2.5, "val_head_losses": [2.5], "parameters": 1000, "step_median_s": 0.1},
        {"mtp": 2, "steps": 200, "val_loss": 2.625, "val_head_losses": [2.625, 2.875], "parameters": 1200, "step_median_s": 0.125},
    ]  # fmt: skip
    decoding = [{
        "mtp": 2, "tokens": 100, "same_tokens_as_greedy": True, "acceptance_rate": 0.5, "tokens_per_forward": 1.5,
        "plain_tokens_per_s": 400.0, "modules_tokens_per_s": 200.0, "self_tokens_per_s": 300.0,
    }]  # fmt: skip
    data = {"machine": machine, "recipe": {"iters": 200, "data": "t.txt"}, "training": training,
            "equal_time": [{"mtp": 2, "baseline_steps": 250, "baseline_val_loss": 2.375}], "decoding": decoding}  # fmt: skip
    lines = case.markdown(data).splitlines()
    assert "| 2 | 1,200 | 125.0 | 2.6250 | 2.5000 (200) | 2.875 | 2.3750 (250) |" in lines
    assert "| 2 | yes | 50% | 1.50 | 400 | 200 | 300 | 1.50× | 0.75× |" in lines


@pytest.mark.parametrize("options", [{"mtp": 2}, {"mtp": 4, "mlp": "swiglu"}])
def test_the_memory_estimate_counts_the_extra_heads(options):
    """As tests/test_gpt.py checks for the model's options: training_step_bytes' activations, without
    the logits' gradients (backward makes them) and the ids, against what the graph keeps."""
    from test_gpt import bytes_the_graph_keeps

    from gpt.model.transformer import training_step_bytes

    mt.manual_seed(0)
    B, T, V = 3, 16, 19
    config = GPTConfig(vocab_size=V, block_size=T, n_layer=2, n_head=4, n_embd=16, **options)
    model = GPT(config)
    rng = np.random.default_rng(0)
    _, loss = model(mt.tensor(rng.integers(0, V, (B, T))), mt.tensor(rng.integers(0, V, (B, T))))
    kept = bytes_the_graph_keeps(loss, model.parameters())
    rows = B * sum(T - k + 1 for k in range(1, config.mtp + 1))  # positions with a target, over every head
    estimate = training_step_bytes(config, B)["activations"] - rows * V * 4 - B * T * 2 * 8
    assert 0.7 * kept <= estimate <= kept, (estimate, kept)
    plain = training_step_bytes(GPTConfig(vocab_size=V, block_size=T, n_layer=2, n_head=4, n_embd=16, mlp=config.mlp), B)
    assert training_step_bytes(config, B)["activations"] > plain["activations"]


@pytest.mark.parametrize("options", [{}, {"mlp": "swiglu", "norm": "rmsnorm", "bias": True}], ids=["gelu", "swiglu-rmsnorm"])
def test_the_decode_kernel_gives_the_trunk_s_output_and_the_extra_heads_logits(options):
    """decode(..., hidden=True) returns the last layer's output as GPT.trunk computes it, and
    decode_drafts each extra head's logits as head_logits computes them from it."""
    from gpt.generation.decode_kernel import decode, decode_drafts, decode_weights, draft_heads

    model = tiny_model(n=4, vocab=7, block=8, **options)
    prompt = np.array([[1, 2, 3, 4]])
    keys, values = model.new_cache_arrays(1)
    logits, hidden = decode(decode_weights(model), prompt, 0, keys, values, hidden=True)  # (1, 4, V), (1, 4, C)
    with mt.no_grad():
        trunk = model.trunk(mt.tensor(prompt))  # (1, 4, C)
        np.testing.assert_allclose(hidden, trunk.data, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(logits, model.logits_of(trunk).data, rtol=1e-10, atol=1e-12)
        drafts = decode_drafts(decode_weights(model), draft_heads(model), hidden[0, 2])  # (3, V)
        for k in range(2, 5):
            expected = mtp.head_logits(model, trunk[:, 2:3], k).data[0, 0]
            np.testing.assert_allclose(drafts[k - 2], expected, rtol=1e-10, atol=1e-12, err_msg=f"head {k}")


@pytest.mark.parametrize("given", [[], [3, 0, 4]], ids=["no-drafts", "three-drafts"])
def test_self_speculative_rounds_in_one_call_give_greedy_decoding_s_tokens_and_cache(given):
    """decode_self_speculative (temperature 0, every round in one kernel call) chooses what
    decode_greedy chooses, writes the same cache, and counts its rounds: rounds + accepted drafts
    = tokens, and the proposed drafts fit in the cache."""
    from gpt.generation.decode_kernel import decode_greedy, decode_self_speculative, decode_weights, draft_heads

    model = tiny_model(n=4, vocab=5, block=12, seed=1)
    weights, heads = decode_weights(model), draft_heads(model)
    prompt = np.array([[1, 2, 3]])
    keys, values = model.new_cache_arrays(1)
    expected, _ = decode_greedy(weights, prompt, 0, 10, keys, values)  # fills the cache up to position 11
    spec_keys, spec_values = model.new_cache_arrays(1)
    chosen, drafts, (rounds, proposed, accepted) = decode_self_speculative(weights, heads, prompt, 0, 10, spec_keys, spec_values, given)
    np.testing.assert_array_equal(chosen, expected[0])
    np.testing.assert_allclose(spec_keys[:, :, :, :12], keys[:, :, :, :12], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(spec_values[:, :, :, :12], values[:, :, :, :12], rtol=1e-10, atol=1e-12)
    assert rounds + accepted == 10 and 0 < accepted <= proposed and rounds < 10
    assert drafts.shape == (3,) and 0 <= drafts.min() and drafts.max() < 5
