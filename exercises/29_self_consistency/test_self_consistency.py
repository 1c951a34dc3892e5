"""The checks of exercise 29. Run them with `python -m exercises check self_consistency`."""
import numpy as np

from exercises.checking import expect, expect_close


def test_the_vote_keeps_the_most_common_answer(impl):
    """the most common answer wins, whatever its place; one answer alone is the vote"""
    for answers, expected in ((["31", "20", "20"], "20"), (["7", "8", "9", "9"], "9"), (["5"], "5"), (["1", "1", "2", "3", "2", "1"], "1")):
        got = impl.majority_vote(answers)
        expect(got == expected, f"majority_vote({answers}): got {got!r}, expected {expected!r} (the most votes)")


def test_a_tie_goes_to_the_answer_sampled_first(impl):
    """among answers tied for the most votes, the first in the list; the list is not changed"""
    for answers, expected in ((["31", "20", "20", "31"], "31"), (["20", "31", "31", "20", "7"], "20"), (["4", "5", "6"], "4"), (["9", "8", "8", "9"], "9")):
        kept = list(answers)
        got = impl.majority_vote(answers)
        expect(got == expected, f"majority_vote({kept}): got {got!r}, expected {expected!r} (tied: the one sampled first)")
        expect(answers == kept, f"majority_vote changed its list: {kept} became {answers}")


def test_answers_are_read_up_to_the_first_newline(impl):
    """each completion's answer is its text before the first newline (all of it without one)"""
    completions = ["290\n12+3", "290", "209\n", "209\n", "290\n"]
    got = impl.self_consistency(completions)
    expect(got == "290", f"self_consistency({completions}): got {got!r}, expected '290' (three completions say 290)")
    got = impl.self_consistency(["12;3", "12;", "4;"], answer_end=";")
    expect(got == "12", f"self_consistency(['12;3', '12;', '4;'], answer_end=';'): got {got!r}, expected '12'")


def test_the_vote_beats_one_sample_when_errors_are_spread(impl):
    """right 30% of the time, errors over 10 values at 7% each: the vote of 15 is right far more often"""
    rng = np.random.default_rng(0)
    values = ["right"] + [f"wrong {i}" for i in range(10)]
    p = np.array([0.3] + [0.07] * 10)
    trials = 400
    right = sum(impl.majority_vote(list(rng.choice(values, size=15, p=p))) == "right" for _ in range(trials))
    expect(right / trials > 0.6, f"the vote of 15 samples was right {right} times in {trials}; one sample is right 30% of the time")
    expect_close("the vote of 1 sample, right share over 2000 draws", np.mean([impl.majority_vote([v]) == "right" for v in rng.choice(values, size=2000, p=p)]),
                 0.3, "p = 0.3", atol=0.04)  # fmt: skip
