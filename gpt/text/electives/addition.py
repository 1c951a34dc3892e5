r"""A task whose answers can be checked: adding two numbers, written as text.

Shakespeare cannot tell a model it is wrong; a sum can. Each problem is one short line,

    prompt   "07+85="       the two operands, each zero-padded to `digits` digits
    answer   "290\n"        the sum's digits reversed (92 -> "29"), zero-padded to digits + 1, then "\n"

so with digits=2 every problem is "dd+dd=" followed by "ddd\n": 10 characters.

Why the sum is reversed. A model writes left to right, one token at a time, and each token can use
only what comes before it. Addition carries from the lowest digit up: the hundreds digit of 46 + 58
depends on a carry out of the units. Written highest digit first, the first token would have to
settle every carry before any digit is on the page; written lowest digit first (minGPT's adder does
the same), each digit needs only the two operand digits at its place and the carry out of the
digit the model has just written. Zero-padding puts each operand digit at a fixed distance from the
answer digit that reads it, and makes every problem the same length, so a batch of prompts needs no
padding and answers can be sampled as one batch.

The split. The held-out ("val") problems are a fixed set chosen by `seed` among all
10^digits x 10^digits pairs (a tenth of them, at most 1,000); training problems are drawn from the
rest, so an exact-match accuracy on "val" measures sums the model never saw.

    task = AdditionTask(digits=2, seed=0)
    prompt, answer = task.problems("val", 1, rng)[0]       # ("07+85=", "290\n")
    task.is_correct(prompt, "290\n")                       # True: the text up to task.answer_end
    task.reward(prompt, "209\n")                           # 0.0
"""
import numpy as np

from microtensor import InputError
from microtensor.checks import check_int

from ..data import CharTokenizer

# -100: cross_entropy's default ignore_index; a target of -100 adds nothing to the loss.
IGNORED = -100
HELD_OUT_FRACTION, HELD_OUT_MAX = 0.1, 1000


class AdditionTask:
    """Addition of two `digits`-digit numbers as text (the module docstring gives the format).

    task.answer_end == "\n": a completion's answer is its text up to the first newline."""

    answer_end = "\n"

    def __init__(self, digits=2, seed=0):
        self.digits = check_int("AdditionTask", "digits", digits, low=1)
        self.seed = check_int("AdditionTask", "seed", seed, low=0)
        if self.digits > 9:
            raise InputError(f"AdditionTask: digits must be at most 9 (the operands are int64 pairs), got {digits}")
        self.tokenizer = CharTokenizer.from_text("0123456789+=" + self.answer_end)
        self.numbers = 10**self.digits  # each operand is in [0, numbers)
        pairs = self.numbers * self.numbers
        held_out = min(HELD_OUT_MAX, max(1, int(HELD_OUT_FRACTION * pairs)))
        # A pair (a, b) is coded a * numbers + b; the held-out codes, in the order the seed drew them.
        self.val_codes = np.random.default_rng(seed).choice(pairs, size=held_out, replace=False)
        self.val_set = set(self.val_codes.tolist())

    @property
    def held_out(self):
        return len(self.val_codes)  # the problems of the "val" split

    @property
    def prompt_length(self):
        return 2 * self.digits + 2  # "dd+dd="

    @property
    def answer_length(self):
        return self.digits + 2  # the sum's digits + 1 digits, then answer_end

    @property
    def problem_length(self):
        return self.prompt_length + self.answer_length

    def describe(self):
        return f"addition of {self.digits}-digit numbers (held-out set of seed {self.seed}: {len(self.val_codes)} problems)"

    def prompt_of(self, a, b):
        return f"{a:0{self.digits}d}+{b:0{self.digits}d}="

    def answer_of(self, a, b):
        """The answer as the model must write it: a + b's digits reversed, zero-padded, then "\n"."""
        return f"{a + b:0{self.digits + 1}d}"[::-1] + self.answer_end

    def operands(self, prompt):
        """(a, b) of a prompt "dd+dd="; an InputError for any other text."""
        if not isinstance(prompt, str):
            raise InputError(f"AdditionTask: a prompt must be a string, got {type(prompt).__name__}")
        d = self.digits
        a, plus, b, equals = prompt[:d], prompt[d : d + 1], prompt[d + 1 : 2 * d + 1], prompt[2 * d + 1 :]
        if not (len(prompt) == self.prompt_length and a.isdigit() and b.isdigit() and plus == "+" and equals == "="):
            raise InputError(f"AdditionTask: a prompt must read {'d' * d}+{'d' * d}= ({d}-digit operands), got {prompt!r}")
        return int(a), int(b)

    def codes(self, split, count, rng):
        """count pair codes of split: "train" draws from the pairs outside the held-out set; "val"
        draws from the held-out set, or with rng None takes its first count, always the same."""
        count = check_int("AdditionTask.problems", "count", count, low=0)
        if split == "val":
            if rng is None:
                if count > len(self.val_codes):
                    raise InputError(f"AdditionTask.problems: the held-out set holds {len(self.val_codes)} problems, {count} asked for")
                return self.val_codes[:count]
            return rng.choice(self.val_codes, size=count, replace=True)
        if split != "train":
            raise InputError(f"AdditionTask.problems: split must be 'train' or 'val', got {split!r}")
        codes = rng.integers(0, self.numbers * self.numbers, count)
        # Redraw the few that fall in the held-out set (a tenth at most), until none does.
        while True:
            held = np.fromiter((c in self.val_set for c in codes.tolist()), dtype=bool, count=len(codes))
            if not held.any():
                return codes
            codes[held] = rng.integers(0, self.numbers * self.numbers, int(held.sum()))

    def problems(self, split, count, rng):
        """count (prompt, answer) pairs of split ("train" or "val"); the prompt ends where the model
        starts answering, and the answer ends with task.answer_end ("\n")."""
        pairs = [divmod(int(code), self.numbers) for code in self.codes(split, count, rng)]
        return [(self.prompt_of(a, b), self.answer_of(a, b)) for a, b in pairs]

    def expected(self, prompt):
        """The right answer to prompt, without answer_end: "290" for "07+85="."""
        return self.answer_of(*self.operands(prompt))[: -len(self.answer_end)]

    def read_answer(self, completion):
        """The answer a completion gives: its text up to the first answer_end (all of it if none)."""
        return completion.split(self.answer_end, 1)[0]

    def is_correct(self, prompt, completion):
        """True when completion (the text generated after prompt) gives exactly the right digits
        before its first answer_end."""
        return self.read_answer(completion) == self.expected(prompt)

    def reward(self, prompt, completion):
        """1.0 for a correct answer, 0.0 for any other: a rule checks it, no model judges it."""
        return 1.0 if self.is_correct(prompt, completion) else 0.0

    def encode_prompts(self, prompts):
        """(B, prompt_length) int64 ids of B prompts (all the same length)."""
        for prompt in prompts:
            self.operands(prompt)
        return np.stack([self.tokenizer.encode(p) for p in prompts]) if prompts else np.zeros((0, self.prompt_length), np.int64)

    def batches(self, block_size):
        return AdditionBatches(self, block_size)

    def accuracy(self, model, count):
        """The exact-match accuracy of model's greedy answers to the first count held-out problems."""
        prompts = [p for p, _ in self.problems("val", count, None)]
        completions = greedy_answers(model, self, prompts)
        return float(np.mean([self.is_correct(p, c) for p, c in zip(prompts, completions)])) if count else 0.0


class AdditionBatches:
    """Training batches of generated problems, the twin of gpt/text/data.py's Batches.

    A row of block_size + 1 tokens holds whole problems one after another (the last one cut where
    the row ends), and starts at a problem's first token, so position 0 is where a prompt starts, as
    it is when the model answers. Targets are the next tokens, but only the answer's count: the
    operands are random, and a loss on guessing them would only add noise (they are IGNORED)."""

    def __init__(self, task, block_size):
        self.task = task
        self.block_size = check_int("AdditionBatches", "block_size", block_size, low=1)
        if block_size < task.problem_length - 1:
            raise InputError(
                f"AdditionBatches: block_size {block_size} is shorter than one problem; "
                f"expected at least {task.problem_length - 1} for {task.digits}-digit addition"
            )
        self.per_row = -(-(block_size + 1) // task.problem_length)  # problems per row, the last one maybe cut
        # Which tokens of a problem are the answer's: their targets count.
        answer = np.arange(task.problem_length) >= task.prompt_length
        self.counted = np.tile(answer, self.per_row)[1 : block_size + 1]  # (block_size,) for targets 1 .. block_size

    def get(self, split, batch_size, rng):
        """x, y (batch_size, block_size) int64; y is x shifted one token ahead, IGNORED where the
        next token is not part of an answer."""
        batch_size = check_int("AdditionBatches.get", "batch_size", batch_size, low=1)
        problems = self.task.problems(split, batch_size * self.per_row, rng)
        text = "".join(p + a for p, a in problems)
        rows = self.task.tokenizer.encode(text).reshape(batch_size, -1)[:, : self.block_size + 1]
        x = rows[:, :-1]
        y = np.where(self.counted, rows[:, 1:], IGNORED)
        return np.ascontiguousarray(x), np.ascontiguousarray(y)


def greedy_answers(model, task, prompts):
    """The greedy completions (answer_length tokens each) of prompts, as one batch."""
    if not prompts:
        return []
    ids = task.encode_prompts(prompts)
    was_training = model.training
    model.eval()
    try:
        out = model.generate(ids, task.answer_length, temperature=0.0).numpy()[:, ids.shape[1] :]
    finally:
        model.train(was_training)
    return [task.tokenizer.decode(row) for row in out]
