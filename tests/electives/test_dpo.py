"""DPO (docs/electives/dpo.md): the loss op against numpy and finite differences, the sequence
log-probability against a per-token computation with the prompt and the padding masked, one step
moving the log-probabilities the right way, the preference data's errors, and dpo.py end to end
(β and vocabulary refusals, LoRA, resume, sampling)."""
import json

import numpy as np
import pytest

import dpo
import generate
import microtensor as mt
import microtensor.functional as F
import train
from microtensor import InputError
from microtensor.gradcheck import GRADCHECK_CASES, RandomDraw, gradcheck
from microtensor.ops.electives.dpo_loss import DPOLoss
from gpt.checkpoints import checkpoint
from gpt.model.electives import dpo as gpt_dpo
from gpt.model.electives.lora import add_lora
from gpt.model.transformer import GPT, GPTConfig
from gpt.text.data import CharTokenizer, DataError
from gpt.text.electives import preferences

TEXT = "\n".join(
    f"the {w} of the {v} came {u} to the hall" for w, v, u in zip(
        ["king", "queen", "fool", "duke", "lord", "page"] * 20, ["night", "day", "sea", "town", "field"] * 24, ["late", "soon", "home", "back"] * 30
    )
) + "\n"  # fmt: skip


def numpy_loss(pc, pr, rc, rr, beta):
    """-log σ(β m) averaged, written apart from the op: log(1 + e^-z) with numpy's logaddexp."""
    z = beta * ((pc - rc) - (pr - rr))
    return np.mean(np.logaddexp(0.0, -z))


def test_loss_and_gradient_match_numpy_and_finite_differences():
    rng = np.random.default_rng(0)
    values = [rng.normal(size=5) * 3 for _ in range(4)]
    tensors = [mt.tensor(v, requires_grad=True) for v in values]
    loss = F.dpo_loss(*tensors, 0.5)
    loss.backward()
    np.testing.assert_allclose(loss.item(), numpy_loss(*values, 0.5), rtol=1e-12)
    for i in range(4):
        numeric = np.empty(5)
        for j in range(5):
            up = [v.copy() for v in values]
            down = [v.copy() for v in values]
            up[i][j] += 1e-6
            down[i][j] -= 1e-6
            numeric[j] = (numpy_loss(*up, 0.5) - numpy_loss(*down, 0.5)) / 2e-6
        np.testing.assert_allclose(tensors[i].grad, numeric, rtol=1e-6, atol=1e-9)
    (case,) = GRADCHECK_CASES[DPOLoss]
    fn, inputs = case(RandomDraw(3))
    assert gradcheck(fn, inputs)


def test_loss_is_finite_for_large_margins():
    big = mt.tensor(np.array([800.0, -800.0]), requires_grad=True)
    zeros = [mt.tensor(np.zeros(2)) for _ in range(3)]
    loss = F.dpo_loss(big, *zeros, 1.0)
    loss.backward()
    np.testing.assert_allclose(loss.item(), (0.0 + 800.0) / 2)
    np.testing.assert_allclose(big.grad, [-0.0, -0.5])  # dL/dm = -β σ(-βm) / B


@pytest.mark.parametrize("beta", [0, -0.1, float("nan")])
def test_beta_must_be_positive(beta):
    t = [mt.tensor(np.zeros(2)) for _ in range(4)]
    with pytest.raises(InputError, match="beta"):
        F.dpo_loss(*t, beta)


def tiny_model(vocab_size=7, seed=0, block_size=16):
    mt.manual_seed(seed)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=block_size, vocab_size=vocab_size, dropout=0.0), dtype=mt.float64)
    model.eval()
    return model


def test_sequence_log_prob_matches_a_per_token_computation_and_masks_prompt_and_padding():
    model = tiny_model()
    prompts = [np.array([1, 2, 3]), np.array([4])]
    continuations = [np.array([5, 6]), np.array([2, 0, 1, 3])]
    tokens, prompt_lengths, lengths = gpt_dpo.pack_rows(prompts, continuations, block_size=16)
    assert tokens.shape == (2, 5) and prompt_lengths.tolist() == [3, 1] and lengths.tolist() == [5, 5]
    got = gpt_dpo.sequence_log_probs(model, tokens, prompt_lengths, lengths).numpy()
    for row, (prompt, continuation) in enumerate(zip(prompts, continuations)):
        sequence = np.concatenate([prompt, continuation])
        expected = 0.0
        for k in range(len(prompt), len(sequence)):  # each continuation token, from the model run on its prefix alone
            logits = model(sequence[None, :k])[0].numpy()[0, -1]
            expected += logits[sequence[k]] - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
        np.testing.assert_allclose(got[row], expected, rtol=1e-10)
    # padding: row 0 padded with other tokens changes nothing; the prompt's tokens count for nothing
    padded = np.concatenate([tokens, np.full((2, 3), 6)], axis=1)
    np.testing.assert_allclose(gpt_dpo.sequence_log_probs(model, padded, prompt_lengths, lengths).numpy(), got, rtol=1e-12)
    whole = gpt_dpo.sequence_log_probs(model, tokens, np.array([1, 1]), lengths).numpy()
    assert whole[0] < got[0]  # with the prompt's tokens counted too, a sum of more negative terms


def test_one_step_raises_the_chosen_and_lowers_the_rejected():
    model = tiny_model()
    tokens, prompt_lengths, lengths = gpt_dpo.pack_rows([np.array([1, 2])] * 2, [np.array([3, 4, 5]), np.array([5, 4, 3])], 16)
    batch = gpt_dpo.EncodedPairs(tokens, prompt_lengths, lengths)
    reference = gpt_dpo.Reference(gpt_dpo.frozen_copy(model))
    before = gpt_dpo.sequence_log_probs(model, tokens, prompt_lengths, lengths).numpy()
    loss, margins, _ = gpt_dpo.dpo_batch_loss(model, reference, batch, 0.5)
    assert margins.tolist() == [0.0] and np.isclose(loss.item(), np.log(2))
    loss.backward()
    optimizer = mt.optim.SGD(model.parameters(), lr=0.05)
    optimizer.step()
    after = gpt_dpo.sequence_log_probs(model, tokens, prompt_lengths, lengths).numpy()
    assert after[0] > before[0] and after[1] < before[1]


def test_lora_reference_is_the_base():
    model = tiny_model()
    base = gpt_dpo.frozen_copy(model)
    add_lora(model, 2)
    for _, param in model.named_parameters():
        if param.requires_grad:
            param.data[...] = np.random.default_rng(0).normal(size=param.shape)  # adapters that change the output
    tokens = np.array([[1, 2, 3, 4]])
    reference = gpt_dpo.Reference(model, adapters_off=True)
    batch = gpt_dpo.EncodedPairs(np.repeat(tokens, 2, axis=0), np.array([1, 1]), np.array([4, 4]))
    expected = gpt_dpo.sequence_log_probs(base, batch.tokens, batch.prompt_lengths, batch.lengths).numpy()
    np.testing.assert_array_equal(reference.log_probs(batch), expected)
    assert not np.allclose(gpt_dpo.sequence_log_probs(model, batch.tokens, batch.prompt_lengths, batch.lengths).numpy(), expected)


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "no preference pairs"),
        ('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a", "chosen": "b"\n', r":2: not a JSON object"),
        ('{"prompt": "a", "chosen": "b"}\n', r":1: the field 'rejected' is missing"),
        ('\n{"prompt": "a", "chosen": 3, "rejected": "c"}\n', r":2: the field 'chosen' is 3"),
        ('["a", "b", "c"]\n', r":1: a JSON list"),
    ],
)
def test_malformed_jsonl_names_the_line_and_field(tmp_path, content, message):
    path = tmp_path / "pairs.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=message):
        preferences.read_pairs(path)


def test_characters_outside_the_vocabulary_name_the_line_and_field(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"prompt": "ab", "chosen": "ba", "rejected": "aa"}\n{"prompt": "ab", "chosen": "b", "rejected": "az"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"pairs.jsonl:2: the field 'rejected' does not fit .*'z'"):
        preferences.check_vocabulary(preferences.read_pairs(path), CharTokenizer.from_text("ab"), str(path))


def test_builtin_task_shuffles_the_next_line_and_holds_out_the_end():
    train_pairs, held_out = preferences.corpus_pairs(TEXT, seed=0)
    split = int(0.9 * len(TEXT))
    for pair in train_pairs + held_out:
        assert sorted(pair.chosen.split()) == sorted(pair.rejected.split()) and pair.chosen != pair.rejected
        assert pair.prompt + pair.chosen in TEXT
    lines = TEXT.split("\n")
    starts = np.cumsum([0] + [len(line) + 1 for line in lines])  # where each line starts

    def span(pair):  # the prompt's line and the next one, in the text
        n = int(pair.where.split()[-1]) - 1  # the next line's index (where names it 1-based)
        return starts[n - 1], starts[n] + len(lines[n])

    assert held_out and train_pairs
    assert all(span(p)[0] >= split for p in held_out) and all(span(p)[1] <= split for p in train_pairs)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dpo")
    text = folder / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    flags = ["--data", str(text), "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "32", "--max-iters", "20",
             "--eval-interval", "20", "--eval-iters", "1", "--sample-chars", "0", "--batch-size", "4"]  # fmt: skip
    assert train.main([*flags, "--out-dir", str(folder / "base")]) == 0
    other = folder / "other.txt"
    other.write_text(TEXT + "XYZ\n", encoding="utf-8")
    assert train.main([*flags, "--data", str(other), "--out-dir", str(folder / "other")]) == 0
    return folder, text


def run_dpo(base, *flags):
    folder, text = base
    return dpo.main(["--init-from", str(folder / "base"), "--data", str(text), "--eval-pairs", "8", "--batch-size", "4", *flags])


@pytest.mark.parametrize("beta", ["0", "-1", "nan"])
def test_dpo_refuses_beta_at_most_zero_naming_the_flag(base, tmp_path, capsys, beta):
    assert run_dpo(base, "--beta", beta, "--out-dir", str(tmp_path / "out")) == 1
    assert "--beta: given" in capsys.readouterr().out


def test_dpo_refuses_a_reference_of_another_vocabulary(base, tmp_path, capsys):
    assert run_dpo(base, "--reference", str(base[0] / "other"), "--out-dir", str(tmp_path / "out")) == 1
    out = capsys.readouterr().out
    assert "--reference" in out and "vocabulary" in out


def test_dpo_refuses_malformed_pairs_naming_the_line(base, tmp_path, capsys):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"prompt": "the ", "chosen": "king", "rejected": "gnik"}\n{"prompt": "the "}\n', encoding="utf-8")
    assert run_dpo(base, "--pairs", str(pairs), "--out-dir", str(tmp_path / "out")) == 1
    assert "pairs.jsonl:2: the field 'chosen' is missing" in capsys.readouterr().out.replace("\n", "")


def test_dpo_resumes_exactly_and_samples(base, tmp_path):
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    assert run_dpo(base, "--out-dir", str(whole), "--max-iters", "6", "--eval-interval", "3") == 0
    assert run_dpo(base, "--out-dir", str(halves), "--max-iters", "3", "--eval-interval", "3") == 0
    assert dpo.main(["--out-dir", str(halves), "--resume", "--max-iters", "6"]) == 0
    a, b = checkpoint.load(whole)[0], checkpoint.load(halves)[0]
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    start = checkpoint.load(base[0] / "base")[0]
    assert any(not np.array_equal(a[k], start[k]) for k in a)  # it trained
    assert generate.main(["--out-dir", str(whole), "--max-new-tokens", "5"]) == 0


def test_dpo_with_lora_trains_the_adapters_against_the_base(base, tmp_path):
    out = tmp_path / "lora"
    results = dpo.fine_tune(dpo.build_parser().parse_args([
        "--init-from", str(base[0] / "base"), "--data", str(base[1]), "--eval-pairs", "8", "--batch-size", "4",
        "--out-dir", str(out), "--lora-rank", "2", "--max-iters", "4", "--learning-rate", "1e-2",
    ]))  # fmt: skip
    assert results["before"]["kl"] == 0 and results["after"]["kl"] > 0
    assert results["trainable_parameters"] < results["parameters"]
    meta = checkpoint.load(out)[2]
    assert meta["lora"]["rank"] == 2
    assert generate.main(["--out-dir", str(out), "--max-new-tokens", "5"]) == 0


def test_dpo_with_lora_resumes_exactly(base, tmp_path):
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    flags = ["--lora-rank", "2", "--learning-rate", "1e-2", "--eval-interval", "2"]
    assert run_dpo(base, *flags, "--out-dir", str(whole), "--max-iters", "4") == 0
    assert run_dpo(base, *flags, "--out-dir", str(halves), "--max-iters", "2") == 0
    assert dpo.main(["--out-dir", str(halves), "--resume", "--max-iters", "4"]) == 0
    a, b = checkpoint.load(whole)[0], checkpoint.load(halves)[0]
    assert set(a) == set(b) and all(k.endswith(("lora_a", "lora_b")) for k in a)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_float32_log_probabilities_give_a_float32_loss_and_gradient():
    tensors = [mt.tensor(np.linspace(-1, 1, 3).astype(np.float32) * (i + 1), requires_grad=True) for i in range(4)]
    loss = F.dpo_loss(*tensors, 0.1)
    loss.backward()
    assert loss.dtype == np.float32 and all(t.grad.dtype == np.float32 for t in tensors)


def test_resume_refuses_a_setting_it_keeps(base, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_dpo(base, "--out-dir", str(out), "--max-iters", "1") == 0
    assert dpo.main(["--out-dir", str(out), "--resume", "--beta", "0.5", "--max-iters", "2"]) == 1
    assert "--beta: given 0.5 with --resume" in capsys.readouterr().out
