"""The addition task (gpt/text/electives/addition.py): the format of problems and answers, the
held-out split kept out of training, the checker and the reward, the batches' masked targets, and
train.py --data addition (its flags' errors; a tiny run, its accuracy and an exact resume: slow)."""
import numpy as np
import pytest

import generate
import train
from microtensor import InputError
from gpt.checkpoints import checkpoint
from gpt.text.data import CharTokenizer
from gpt.text.electives.addition import IGNORED, AdditionTask


def test_problems_have_the_stated_format():
    task = AdditionTask(digits=2, seed=0)
    assert task.answer_end == "\n"
    assert isinstance(task.tokenizer, CharTokenizer) and task.tokenizer.chars == "\n+0123456789="
    assert task.prompt_of(7, 85) == "07+85=" and task.answer_of(7, 85) == "290\n"  # 92 reversed, padded to 3 digits
    assert task.answer_of(99, 99) == "891\n" and task.answer_of(0, 0) == "000\n"
    for prompt, answer in task.problems("train", 50, np.random.default_rng(1)):
        a, b = int(prompt[:2]), int(prompt[3:5])
        assert prompt == f"{a:02d}+{b:02d}=" and answer == f"{a + b:03d}"[::-1] + "\n"
        assert len(prompt) == task.prompt_length and len(answer) == task.answer_length


def test_the_held_out_split_is_fixed_by_the_seed_and_never_drawn_for_training():
    task = AdditionTask(digits=2, seed=0)
    val = task.problems("val", len(task.val_codes), None)
    assert len(set(val)) == len(val) == 1000  # a tenth of the 10,000 pairs
    assert val == AdditionTask(digits=2, seed=0).problems("val", 1000, None)
    assert val != AdditionTask(digits=2, seed=1).problems("val", 1000, None)
    train_problems = set(task.problems("train", 20000, np.random.default_rng(2)))
    assert not train_problems & set(val)
    assert len(train_problems) > 8000  # drawn from all the others, not from a few
    assert set(task.problems("val", 300, np.random.default_rng(3))) <= set(val)


def test_is_correct_reads_the_digits_up_to_the_first_newline():
    task = AdditionTask(digits=2)
    assert task.is_correct("07+85=", "290\n") and task.is_correct("07+85=", "290\n12+3")
    assert task.is_correct("07+85=", "290")  # no newline: all of it
    for wrong in ("092\n", "29\n", "2900\n", "\n290", "291\n", ""):
        assert not task.is_correct("07+85=", wrong) and task.reward("07+85=", wrong) == 0.0
    assert task.reward("07+85=", "290\n") == 1.0
    for bad in ("7+85=", "07+85", "07-85=", "aa+bb=", 785):
        with pytest.raises(InputError, match="AdditionTask"):
            task.is_correct(bad, "290\n")


def test_bad_arguments_are_named():
    with pytest.raises(InputError, match="digits"):
        AdditionTask(digits=0)
    with pytest.raises(InputError, match="split"):
        AdditionTask().problems("test", 1, np.random.default_rng(0))
    with pytest.raises(InputError, match="block_size"):
        AdditionTask(digits=2).batches(8)  # one problem is 10 tokens: a block of 9 at least


@pytest.mark.parametrize("block_size", [9, 25])
def test_batches_count_only_the_answers_tokens(block_size):
    task = AdditionTask(digits=2)
    x, y = task.batches(block_size).get("train", 3, np.random.default_rng(0))
    assert x.shape == y.shape == (3, block_size) and x.dtype == y.dtype == np.int64
    for row_x, row_y in zip(x, y):
        text = task.tokenizer.decode(row_x)
        counted = row_y != IGNORED
        for t in range(block_size):
            in_answer = (t + 1) % task.problem_length >= task.prompt_length
            assert counted[t] == in_answer
            if counted[t]:
                assert row_y[t] == (row_x[t + 1] if t + 1 < block_size else row_y[t])
        prompt = text[: task.prompt_length]
        answer = task.tokenizer.decode(row_y[task.prompt_length - 1 : task.problem_length - 1])
        assert answer == task.answer_of(*task.operands(prompt))


def test_train_refuses_flags_that_cannot_work(tmp_path, capsys):
    base = ["--data", "addition", "--out-dir", str(tmp_path / "out"), "--max-iters", "1"]
    assert train.main([*base, "--addition-digits", "0"]) == 1
    assert "--addition-digits" in capsys.readouterr().out
    assert train.main([*base, "--block-size", "8", "--addition-digits", "2"]) == 1
    assert "--block-size" in capsys.readouterr().out
    assert train.main([*base, "--tokenizer", "bpe"]) == 1
    assert "--tokenizer" in capsys.readouterr().out
    assert train.main(["--addition-digits", "2", "--out-dir", str(tmp_path / "out")]) == 1
    assert "--addition-digits" in capsys.readouterr().out


TINY = ["--data", "addition", "--addition-digits", "2", "--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--batch-size", "32",
        "--eval-iters", "2", "--eval-interval", "20", "--sample-chars", "8", "--learning-rate", "3e-3", "--warmup-iters", "5"]  # fmt: skip


@pytest.mark.slow
def test_train_on_addition_reports_accuracy_and_resumes_exactly(tmp_path, capsys):
    args = train.build_parser().parse_args([*TINY, "--max-iters", "40", "--lr-decay-iters", "40", "--out-dir", str(tmp_path / "whole")])
    results = train.train(args)
    assert 0.0 <= results["val_exact_match"] <= 1.0 and "val exact match" in capsys.readouterr().out
    assert results["final_val_loss"] < np.log(13)  # learned something of the answers
    assert train.main([*TINY, "--max-iters", "20", "--lr-decay-iters", "40", "--out-dir", str(tmp_path / "split")]) == 0
    resumed = [*TINY[4:], "--max-iters", "40", "--lr-decay-iters", "40", "--resume", "--out-dir", str(tmp_path / "split")]
    assert train.main(resumed) == 0  # without --data: the task the checkpoint records
    whole, _, whole_meta = checkpoint.load(tmp_path / "whole")
    split, _, split_meta = checkpoint.load(tmp_path / "split")
    assert split_meta["addition"] == whole_meta["addition"] == {"digits": 2, "seed": 0}
    for name in whole:
        np.testing.assert_array_equal(whole[name], split[name])
    assert train.main(["--max-iters", "41", "--resume", "--addition-digits", "3", "--data", "addition", "--out-dir", str(tmp_path / "split")]) == 1
    assert "--addition-digits" in capsys.readouterr().out
    assert generate.main(["--out-dir", str(tmp_path / "whole"), "--addition-eval", "500"]) == 0
    assert f"{results['val_exact_match']:.1%}" in capsys.readouterr().out  # the same greedy answers as train.py's
