"""Test-time compute (gpt/generation/electives/test_time.py): the vote and its tie rule, best-of-n's
choice under each scorer, the M samples of a prompt drawn as one batch, the log-probability scorer
against a per-token computation, and generate.py's --addition-eval flags and their errors."""
import importlib
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

import generate
import microtensor as mt
import train
from microtensor import InputError
from gpt.generation.electives import test_time
from gpt.generation.electives.test_time import best_of_n, majority_vote, sample_answers, self_consistency
from gpt.generation.sampling import log_softmax
from gpt.model.transformer import GPT, GPTConfig
from gpt.text.electives.addition import AdditionTask

TASK = AdditionTask(digits=1)  # "d+d=" then "dd\n": problems of 7 characters


def tiny_model(seed=0):
    mt.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=TASK.tokenizer.vocab_size, block_size=6, n_layer=1, n_head=2, n_embd=16))


def test_the_vote_takes_the_most_common_answer_and_breaks_ties_by_first_sampled():
    assert majority_vote(["31", "20", "20"]) == "20"
    assert majority_vote(["31", "20", "20", "31"]) == "31"  # tied: 31 was sampled first
    assert majority_vote(["20", "31", "31", "20", "5"]) == "20"
    assert majority_vote(["7"]) == "7"


def fixed_candidates(candidates):
    """A stand-in for sample_answers that returns the given candidates, to test the choice alone."""
    return lambda model, task, prompts, M, *rest: (candidates, sum(len(c) for cs in candidates for c in cs))


def test_self_consistency_votes_on_the_answers_up_to_the_newline(monkeypatch):
    prompts = ["3+4=", "9+9="]  # 07 -> "70", 18 -> "81"
    candidates = [["70\n", "71\n", "70\n7", "71\n"], ["81\n", "18\n", "18\n", "81"]]
    monkeypatch.setattr(test_time, "sample_answers", fixed_candidates(candidates))
    voted = self_consistency(None, TASK, prompts, 4, 1.0)
    assert voted.completions == ["70\n", "81\n"]  # "70" twice (one with more after the newline), "81" first among ties
    assert voted.accuracy(TASK, prompts) == 1.0 and voted.candidates == candidates


def test_best_of_n_with_the_verifier_picks_a_correct_candidate_when_there_is_one(monkeypatch):
    prompts = ["3+4=", "9+9=", "0+0="]
    candidates = [["71\n", "17\n", "70\n", "70\n"], ["18\n", "80\n", "00\n", "99\n"], ["00\n", "01\n", "00\n", "02\n"]]
    monkeypatch.setattr(test_time, "sample_answers", fixed_candidates(candidates))
    best = best_of_n(None, TASK, prompts, 4, 1.0, scorer="verifier")
    assert best.completions == ["70\n", "18\n", "00\n"]  # none right for 9+9: the first, as every score ties at 0
    assert best.accuracy(TASK, prompts) == pytest.approx(2 / 3)  # pass@4: the prompts with a right candidate
    by_length = best_of_n(None, TASK, prompts, 4, 1.0, scorer=lambda prompt, completion: -abs(len(completion) - 2))
    assert by_length.completions == [c[0] for c in candidates]


def test_the_samples_of_every_prompt_are_one_batch_and_greedy_at_temperature_zero():
    model = tiny_model()
    prompts = ["3+4=", "9+9=", "0+5="]
    calls = []
    generate_rows = model.generate

    def counted(ids, *args, **kwargs):
        calls.append(np.asarray(ids).shape)
        return generate_rows(ids, *args, **kwargs)

    model.generate = counted
    candidates, tokens = sample_answers(model, TASK, prompts, 5, temperature=0.0)
    assert calls == [(15, TASK.prompt_length)]  # 3 prompts x 5 samples, in one call
    for completions in candidates:
        assert len(completions) == 5 and len(set(completions)) == 1
    assert tokens == sum(len(c) for cs in candidates for c in cs) and tokens <= 15 * TASK.answer_length


def test_logprob_scorer_is_the_sum_of_the_answers_token_log_probabilities(monkeypatch):
    model = tiny_model(1)
    prompts = ["3+4=", "2+2="]
    candidates = [["70\n", "17\n"], ["40\n", "4"]]  # the last has no newline: its one token counts alone
    scores, read = test_time.logprob_scores(model, TASK, prompts, candidates)
    model.eval()
    for i, prompt in enumerate(prompts):
        for j, completion in enumerate(candidates[i]):
            ids = TASK.tokenizer.encode(prompt + completion)
            logits = model(mt.tensor(ids[None, :-1]))[0].numpy()[0]  # (L-1, V)
            expected = sum(log_softmax(logits[t])[ids[t + 1]] for t in range(len(prompt) - 1, len(ids) - 1))
            np.testing.assert_allclose(scores[i, j], expected, rtol=1e-5, atol=1e-5)
    assert read == sum(len(p) + len(c) for p, cs in zip(prompts, candidates) for c in cs)
    monkeypatch.setattr(test_time, "sample_answers", fixed_candidates(candidates))
    best = best_of_n(model, TASK, prompts, 2, 1.0, scorer="logprob")
    assert best.completions == [candidates[i][int(np.argmax(scores[i]))] for i in range(2)]
    assert best.scored_tokens == read


def test_bad_arguments_are_named():
    with pytest.raises(InputError, match="M"):
        self_consistency(tiny_model(), TASK, ["3+4="], 0, 1.0)
    with pytest.raises(InputError, match="scorer"):
        best_of_n(tiny_model(), TASK, ["3+4="], 2, 1.0, scorer="length")


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--addition-eval", "0"], "--addition-eval"),
        (["--addition-eval", "5", "--self-consistency", "0"], "--self-consistency"),
        (["--addition-eval", "5", "--best-of", "0", "--scorer", "verifier"], "--best-of"),
        (["--addition-eval", "5", "--best-of", "4"], "--best-of"),
        (["--addition-eval", "5", "--scorer", "logprob"], "--scorer"),
        (["--addition-eval", "5", "--best-of", "4", "--scorer", "logprob", "--self-consistency", "4"], "--best-of"),
        (["--self-consistency", "4"], "--self-consistency"),
        (["--addition-eval", "5", "--beam", "2"], "--beam"),
    ],
)
def test_generate_refuses_test_time_flags_that_cannot_work(argv, flag, tmp_path, capsys):
    assert generate.main(["--out-dir", str(tmp_path), *argv]) == 1
    assert f"error: {flag}:" in capsys.readouterr().out


def test_generate_answers_held_out_sums_from_a_checkpoint(tmp_path, capsys):
    flags = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--eval-iters", "1", "--sample-chars", "0", "--max-iters", "0"]
    assert train.main(["--data", "addition", "--addition-digits", "1", "--out-dir", str(tmp_path / "sums"), *flags]) == 0
    capsys.readouterr()
    for extra, how in ([], "greedy"), (["--self-consistency", "3"], "majority of 3"), (["--best-of", "2", "--scorer", "logprob"], "scored by logprob"):
        assert generate.main(["--out-dir", str(tmp_path / "sums"), "--addition-eval", "10", *extra]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert "exact match on 10 held-out sums" in out and how in out
    assert generate.main(["--out-dir", str(tmp_path / "sums"), "--addition-eval", "11"]) == 1  # 1-digit: 10 held out
    assert "at most 10" in capsys.readouterr().out


ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "intel-xeon-sapphire-rapids-or-later" / "test_time_compute.json"  # what the page shows


def bench_case():
    sys.path.insert(0, str(ROOT / "bench"))  # the case imports the harness from there
    return importlib.import_module("cases.electives.test_time_compute")


def test_the_page_and_figures_are_the_committed_results():
    if not RESULTS.exists():
        pytest.skip("no results yet: python bench/run.py test_time_compute")
    case = bench_case()
    data = json.loads(RESULTS.read_text())
    page = (ROOT / "docs" / "electives" / "test-time-compute.md").read_text()
    assert case.page_with_results(page, data) == page, "run python bench/cases/electives/test_time_compute.py --render"
    for name, svg in case.figures(data).items():
        assert (ROOT / "docs" / "images" / case.FIGURE_NAMES[name]).read_text() == svg, name
        groups = {g.get("id") for g in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}g")}
        assert {"greedy", *case.METHODS} <= groups, groups
    assert sorted({r["M"] for r in data["test_time_compute"]["runs"]}) == [1, 2, 4, 8, 16]
