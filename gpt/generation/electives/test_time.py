r"""Test-time compute: spend more generation on a question to answer it better
(docs/electives/test-time-compute.md).

Both methods sample M answers to each prompt at temperature T, the M rows of a prompt side by side
in one batch through the Decoder, then choose one:

- self-consistency: the answer given most often wins (a majority vote). If the model's wrong
  answers are spread over many values while its right one recurs, the vote finds the right one
  even when no single sample is likely to be right. Ties go to the answer sampled first among
  those tied (the earliest row), a rule that needs no score.
- best-of-n with a scorer S: the answer of highest S(prompt, completion) wins (ties: the earliest
  row). Two scorers: "logprob", the model's own log-probability of the answer, log π(y | x) at
  temperature 1 (gpt/model/electives/dpo.py's sequence_log_probs, one forward over the M rows);
  and "verifier", the task's checker (1 if the digits are right, else 0). With a perfect verifier
  best-of-n is right whenever any of the n samples is: its accuracy is pass@n.

    from gpt.text.electives.addition import AdditionTask
    task = AdditionTask(digits=3)
    prompts = [p for p, _ in task.problems("val", 100, None)]
    voted = self_consistency(model, task, prompts, M=8, temperature=0.8, seed=0)
    print(voted.accuracy(task, prompts), voted.tokens_per_prompt)
    best = best_of_n(model, task, prompts, n=8, temperature=0.8, scorer="verifier", seed=0)

The tokens spent: each sample is generated up to its answer's end (task.answer_end) or
task.answer_length tokens, whichever comes first, and counted so; the "logprob" scorer also reads
every candidate (prompt and answer) once more, and those tokens are counted as scored.
"""
import dataclasses

import numpy as np

import microtensor as mt
from microtensor import InputError
from microtensor.checks import check_int

from gpt.model.electives.dpo import sequence_log_probs

SCORERS = ("logprob", "verifier")


@dataclasses.dataclass
class TestTimeAnswers:
    """The answer chosen for each prompt, the candidates it was chosen from, and the tokens spent."""

    completions: list  # the chosen completion of each prompt (its answer, then answer_end)
    candidates: list  # (prompts, M) the sampled completions, in the order they were sampled
    generated_tokens: int  # sampled, over all prompts
    scored_tokens: int = 0  # read again by the scorer, over all prompts

    def accuracy(self, task, prompts):
        """The share of prompts whose chosen completion is right (exact match of the digits)."""
        return float(np.mean([task.is_correct(p, c) for p, c in zip(prompts, self.completions)])) if prompts else 0.0

    @property
    def tokens_per_prompt(self):
        return (self.generated_tokens + self.scored_tokens) / max(len(self.completions), 1)


def check_samples(name, flag, value):
    """M or n: an integer >= 1 (the samples per prompt), or an InputError naming it."""
    return check_int(name, flag, value, low=1)


def sample_answers(model, task, prompts, M, temperature, seed=None, top_k=None):
    """(candidates (len(prompts), M) completions, generated tokens): M answers to every prompt,
    sampled at temperature as one batch of len(prompts) * M rows (prompt i's samples are rows
    i*M .. i*M + M - 1). Each completion is cut after its first answer_end."""
    M = check_samples("sample_answers", "M", M)
    if not prompts:
        return [], 0
    ids = np.repeat(task.encode_prompts(prompts), M, axis=0)  # (P * M, prompt_length)
    out = model.generate(ids, task.answer_length, temperature=temperature, top_k=top_k, seed=seed).numpy()[:, ids.shape[1] :]
    completions, generated = [], 0
    for row in out:
        text = task.tokenizer.decode(row)
        end = text.find(task.answer_end)
        text = text if end < 0 else text[: end + len(task.answer_end)]
        completions.append(text)
        generated += len(text)  # one character per token
    return [completions[i * M : (i + 1) * M] for i in range(len(prompts))], generated


def majority_vote(answers):
    """The most frequent of answers (a list of strings); among answers tied for the most votes,
    the one that appears first in the list."""
    counts = {}
    for answer in answers:
        counts[answer] = counts.get(answer, 0) + 1
    most = max(counts.values())
    return next(answer for answer in answers if counts[answer] == most)


def self_consistency(model, task, prompts, M, temperature=1.0, seed=None, top_k=None):
    """Sample M answers to each prompt at temperature and keep the majority's (module docstring)."""
    candidates, generated = sample_answers(model, task, prompts, M, temperature, seed, top_k)
    chosen = []
    for completions in candidates:
        winner = majority_vote([task.read_answer(c) for c in completions])
        chosen.append(winner + task.answer_end)
    return TestTimeAnswers(chosen, candidates, generated)


def logprob_scores(model, task, prompts, candidates):
    """(scores (P, M), tokens read): log π(completion | prompt) of every candidate under model, at
    temperature 1, from one forward over all P * M rows."""
    rows = [task.tokenizer.encode(p + c) for p, completions in zip(prompts, candidates) for c in completions]
    lengths = np.array([len(r) for r in rows])
    tokens = np.zeros((len(rows), lengths.max()), dtype=np.int64)  # right-padded with id 0: never counted
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = row
    prompt_lengths = np.full(len(rows), task.prompt_length)
    was_training = model.training
    model.eval()
    try:
        with mt.no_grad():
            scores = sequence_log_probs(model, tokens, prompt_lengths, lengths).numpy()
    finally:
        model.train(was_training)
    return scores.reshape(len(prompts), -1), int(lengths.sum())


def best_of_n(model, task, prompts, n, temperature=1.0, scorer="logprob", seed=None, top_k=None):
    """Sample n answers to each prompt and keep the one scorer rates highest: "logprob" (the
    model's log-probability of the answer), "verifier" (task.is_correct: 1 or 0), or a function
    (prompt, completion) -> float. Ties go to the earliest sample."""
    if not (scorer in SCORERS or callable(scorer)):
        raise InputError(f"best_of_n: scorer must be one of {', '.join(SCORERS)} or a function (prompt, completion) -> float, got {scorer!r}")
    candidates, generated = sample_answers(model, task, prompts, n, temperature, seed, top_k)
    scored = 0
    if scorer == "logprob":
        scores, scored = logprob_scores(model, task, prompts, candidates) if prompts else (np.zeros((0, n)), 0)
    else:
        score = task.reward if scorer == "verifier" else scorer
        scores = np.array([[score(p, c) for c in completions] for p, completions in zip(prompts, candidates)])
    chosen = [completions[int(np.argmax(row))] for completions, row in zip(candidates, scores)]  # argmax: the first of a tie
    return TestTimeAnswers(chosen, candidates, generated, scored)
