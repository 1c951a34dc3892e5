"""train.py and generate.py with the transformer variants: byte-level BPE through a checkpoint and
back, the experts' utilization and bits per character in the results, and every flag that cannot
work refused with a message that names it."""
import re

import pytest

import generate
import train
from gpt.checkpoints import checkpoint
from gpt.text.electives.bpe import BytePairTokenizer
from test_programs import TINY, corpus, said, write_corpus  # noqa: F401 (corpus is a fixture)


def run(tmp_path, corpus, *extra):
    return train.main(["--data", corpus, "--out-dir", str(tmp_path / "out"), "--max-iters", "4", "--eval-interval", "100", *TINY, *extra])


def test_bpe_trains_saves_its_merges_and_generates(tmp_path, corpus, capsys):
    assert run(tmp_path, corpus, "--tokenizer", "bpe", "--vocab-size", "270") == 0
    out = said(capsys)
    assert re.search(r"byte-level BPE: 2\d\d tokens learned", out)
    bits = float(re.search(r"final val loss, bits per character\W+([\d.]+)", out).group(1))
    per_token = float(re.search(r"final val loss\W+([\d.]+) \(perplexity", out).group(1))
    assert bits < per_token / 0.6931  # a BPE token spells more than one character
    _, _, meta = checkpoint.load(tmp_path / "out")
    tokenizer = BytePairTokenizer.from_dict(meta["tokenizer"])
    assert "vocab" not in meta and tokenizer.vocab_size == meta["config"]["vocab_size"]
    assert generate.main(["--out-dir", str(tmp_path / "out"), "--prompt", "the king é", "--max-new-tokens", "10", "--seed", "1"]) == 0
    assert "the king é" in capsys.readouterr().out  # a prompt with characters never seen: bytes carry them


def test_experts_report_their_share_of_the_tokens(tmp_path, corpus, capsys):
    assert run(tmp_path, corpus, "--mlp", "moe", "--n-expert", "3", "--expert-top-k", "1") == 0
    out = said(capsys)
    shares = [float(s) for s in re.search(r"block 0: ([\d. ]+)", out).group(1).split()]
    assert len(shares) == 3 and abs(sum(shares) - 1) < 0.02


def test_variants_combine_in_one_run_and_resume(tmp_path, corpus, capsys):
    flags = ["--pos", "alibi", "--n-head", "4", "--n-kv-head", "2", "--attention", "online", "--mlp", "moe", "--norm", "rmsnorm"]
    assert run(tmp_path, corpus, *flags) == 0
    assert re.search(r"KV cache per token \(generation\)\W+64 bytes", said(capsys))  # 2 (k, v) · 1 layer · 2 heads · D 4 · 4 bytes
    resumed = ["--data", corpus, "--out-dir", str(tmp_path / "out"), "--resume", "--max-iters", "6", *TINY[8:]]
    assert train.main(resumed) == 0
    assert train.main([*resumed, "--n-kv-head", "1"]) == 1
    assert "--n-kv-head: given 1 with --resume, expected the checkpoint's n_kv_head = 2" in said(capsys)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--n-expert", "3"], "--n-expert: given 3 without --mlp moe, expected --mlp moe as well: alone it changes nothing"),
        (["--n-expert", "1"], "--n-expert: given 1 without --mlp moe"),  # not the top-k (2) it would then fall below
        (["--moe-aux-weight", "0.1"], "--moe-aux-weight: given 0.1 without --mlp moe"),
        (["--vocab-size", "300"], "--vocab-size: given 300 without --tokenizer bpe"),
        (["--tokenizer", "bpe", "--vocab-size", "200"], "--vocab-size: given 200, expected an integer >= 256"),
        (["--n-kv-head", "3"], "--n-kv-head: given 3, expected an integer >= 1 dividing --n-head (2)"),
        (["--mlp", "moe", "--n-expert", "2", "--expert-top-k", "3"], "--expert-top-k: given 3, expected at most --n-expert (2)"),
        (["--pos", "sinusoidal", "--n-embd", "18", "--n-head", "3"], None),
        (["--pos", "sinusoidal", "--n-embd", "9", "--n-head", "1"], "--n-embd: given 9, expected with --pos sinusoidal, an even width"),
    ],
)
def test_flags_that_cannot_work_are_refused(tmp_path, flags, message, capsys):
    corpus_path = write_corpus(tmp_path / "corpus.txt")
    code = run(tmp_path, corpus_path, *flags)
    if message is None:
        assert code == 0  # 18 wide, 3 heads of 6: sinusoidal needs only an even width
    else:
        assert code == 1 and f"error: {message}" in said(capsys)


@pytest.mark.parametrize("bits", ["int8", "int4"])
def test_generate_quantizes_the_weights(tmp_path, corpus, capsys, bits):
    assert run(tmp_path, corpus, "--n-embd", "32") == 0
    capsys.readouterr()
    assert generate.main(["--out-dir", str(tmp_path / "out"), "--prompt", "the", "--max-new-tokens", "8", "--quantize", bits]) == 0
    out = said(capsys)
    quantized, full = (int(n.replace(",", "")) for n in re.search(r"quantized to int\d: ([\d,]+) bytes, from ([\d,]+)", out).groups())
    assert quantized < full / (3 if bits == "int8" else 4)
