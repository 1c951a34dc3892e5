"""Exercise 29: self-consistency's vote. The task is in README.md; write the TODOs below.

    answers  ["31", "20", "20", "31", "7"]      M sampled answers to one problem, in sampled order
    vote     "31"                               the most common; a tie goes to the one sampled first
"""


def majority_vote(answers):
    """The most frequent string of answers (a non-empty list); among those tied for the most
    votes, the one that appears first in the list."""
    # TODO: count each answer's votes, then return the first answer in the list whose count is
    # the largest (README: The vote).
    raise NotImplementedError("TODO: majority_vote (exercise 29)")


def self_consistency(completions, answer_end="\n"):
    """The voted answer of M completions: each one's answer is its text before the first
    answer_end (all of it when there is none)."""
    # TODO: cut every completion at its first answer_end, then vote (README: Reading the answers).
    raise NotImplementedError("TODO: self_consistency (exercise 29)")
