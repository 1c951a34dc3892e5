"""Exercise 29: self-consistency's vote. The task is in README.md; write the TODOs below.

    answers  ["31", "20", "20", "31", "7"]      M sampled answers to one problem, in sampled order
    vote     "31"                               the most common; a tie goes to the one sampled first
"""


def majority_vote(answers):
    """The most frequent string of answers (a non-empty list); among those tied for the most
    votes, the one that appears first in the list."""
    counts = {}
    for answer in answers:
        counts[answer] = counts.get(answer, 0) + 1
    most = max(counts.values())
    return next(answer for answer in answers if counts[answer] == most)


def self_consistency(completions, answer_end="\n"):
    """The voted answer of M completions: each one's answer is its text before the first
    answer_end (all of it when there is none)."""
    return majority_vote([completion.split(answer_end, 1)[0] for completion in completions])
