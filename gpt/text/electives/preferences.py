"""Preference pairs for DPO (docs/electives/dpo.md): a prompt, the continuation preferred (chosen)
and one that is not (rejected), from a JSONL file or from a built-in task made from the corpus.

    pairs = read_pairs("pairs.jsonl")               # one {"prompt", "chosen", "rejected"} per line
    train, held_out = corpus_pairs(text, seed=0)    # the built-in task, split like the text
    check_vocabulary(pairs, tokenizer, "pairs.jsonl")

A JSONL file holds one JSON object per line with three strings; blank lines are skipped. Every
problem is a DataError that names the file, the line and the field: a line that is not JSON, an
object without one of the fields or with a field that is not a string or is empty, a file without
a single pair, a character the checkpoint's vocabulary does not have.

The built-in task. Prompt: a line of the text (with its newline). Chosen: the line that follows
it. Rejected: that same next line with its words shuffled. Why shuffled words and not a line from
elsewhere: the two continuations then have the same length and the same characters, so a model
cannot prefer one for being shorter or for its letters; only word order tells them apart, which a
model of the language judges and anyone can check by reading. Lines of fewer than three words are
skipped (their shuffles too often give the line back), and so is a shuffle equal to the line.
The held-out pairs come from the last 10% of the text and the training pairs from the first 90%:
the text's own split (gpt/text/data.py), so a held-out line was never a training target.
"""
import dataclasses
import json
from pathlib import Path

import numpy as np

from ..data import DataError

FIELDS = ("prompt", "chosen", "rejected")


@dataclasses.dataclass(frozen=True)
class PreferencePair:
    """A prompt, the continuation preferred, the one not; `where`: "file:line" or "corpus line n"."""

    prompt: str
    chosen: str
    rejected: str
    where: str = ""


def read_pairs(path):
    """The PreferencePairs of a JSONL file, in order; a DataError names the line and field of the first problem."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise DataError(f"{path}: cannot read the preference pairs ({error.strerror or error})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text (byte {error.start}); a JSONL file of preference pairs is") from None
    pairs = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(f"{where}: not a JSON object ({error.msg} at column {error.colno}); each line holds one pair") from None
        if not isinstance(record, dict):
            raise DataError(f"{where}: a JSON {type(record).__name__}, expected an object with {', '.join(FIELDS)}")
        for field in FIELDS:
            if field not in record:
                raise DataError(f"{where}: the field {field!r} is missing; each pair has {', '.join(FIELDS)}")
            value = record[field]
            if not isinstance(value, str) or not value:
                raise DataError(f"{where}: the field {field!r} is {json.dumps(value)[:60]}, expected a non-empty string")
        pairs.append(PreferencePair(record["prompt"], record["chosen"], record["rejected"], where))
    if not pairs:
        raise DataError(f"{path}: no preference pairs in it (expected one JSON object per line with {', '.join(FIELDS)})")
    return pairs


def check_vocabulary(pairs, tokenizer, source):
    """Every field of every pair encodes with the tokenizer; else a DataError naming the pair and field."""
    for pair in pairs:
        for field in FIELDS:
            try:
                tokenizer.encode(getattr(pair, field))
            except DataError as error:
                raise DataError(f"{pair.where or source}: the field {field!r} does not fit the checkpoint's vocabulary: {error}") from None


def shuffled_words(line, rng):
    """The line's words in a random order, joined by single spaces (None if the order did not change)."""
    words = line.split()
    order = rng.permutation(len(words))
    shuffled = " ".join(words[i] for i in order)
    return None if shuffled == " ".join(words) else shuffled


def corpus_pairs(text, seed=0, max_pairs=None):
    """(train pairs, held-out pairs) of the built-in task (the module docstring) from text: pairs
    whose next line lies in the first 90% of the text, and those in the last 10%. max_pairs: at
    most this many of each, the first ones in the text's order (None: all)."""
    rng = np.random.default_rng(seed)
    split = int(0.9 * len(text))
    lines, offsets, offset = [], [], 0
    for line in text.split("\n"):
        lines.append(line)
        offsets.append(offset)
        offset += len(line) + 1
    train, held_out = [], []
    for i in range(len(lines) - 1):
        prompt, following = lines[i], lines[i + 1].strip()
        if not prompt.strip() or len(following.split()) < 3:
            continue
        rejected = shuffled_words(following, rng)
        if rejected is None:
            continue
        end = offsets[i + 1] + len(lines[i + 1])
        starts = offsets[i]
        pair = PreferencePair(prompt + "\n", " ".join(following.split()), rejected, f"corpus line {i + 2}")
        if end <= split:
            train.append(pair)
        elif starts >= split:
            held_out.append(pair)
    if max_pairs is not None:
        train, held_out = train[:max_pairs], held_out[:max_pairs]
    if not train or not held_out:
        raise DataError(
            f"the built-in preference task needs lines of at least three words on both sides of the text's 90% mark; "
            f"this text gives {len(train)} training and {len(held_out)} held-out pairs: use a longer text, or --pairs FILE"
        )
    return train, held_out


def split_pairs(pairs, held_out_share=0.1, seed=0):
    """(train, held out) of a file's pairs: a seeded shuffle, then the last share held out (at least one
    pair each when there are two or more; a single pair is both, and the output says so)."""
    order = np.random.default_rng(seed).permutation(len(pairs))
    shuffled = [pairs[i] for i in order]
    if len(pairs) == 1:
        return shuffled, shuffled
    n_held = min(max(1, round(held_out_share * len(pairs))), len(pairs) - 1)
    return shuffled[:-n_held], shuffled[-n_held:]
