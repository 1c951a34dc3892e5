"""The byte-level BPE tokenizer (gpt/text/electives/bpe.py) against hand computations and slow, independent
implementations written here: a hand-written chunk scanner (str methods, no regex), a trainer
that recounts every pair after every merge, and an encoder that applies every merge, in the order
learned, to each chunk's whole byte list."""
import json
import math
from collections import Counter
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from microtensor.errors import InputError, InputIndexError, InputTypeError
from gpt.text.electives.bpe import BytePairTokenizer, bits_per_character, count_characters, split_chunks

# Enough repeats to matter, and never fewer than the loaded profile asks for (cheap tests: no kernels).
MANY = settings(max_examples=max(100, settings().max_examples))

FIXED_TEXT = """\
First Citizen:
Before we proceed any further, hear me speak.

All:
Speak, speak. We're all resolved rather to die than to famish; they'll say it's 1600 or 1601.
Café, naïve -- the_king's "words" 42 times...   and\tthen\r\nthe end.
"""
# Characters that exercise the chunk rules' edges: contractions, a space before a word, runs of
# whitespace, digits, "_" (neither letter nor digit), a non-ASCII letter.
EDGY = st.text(alphabet=" 'srtvdlmeA1_!.\n\t\ré")
TEXT = st.one_of(st.text(alphabet=st.characters(exclude_categories=("Cs",))), EDGY)


@pytest.fixture(scope="module")
def tokenizer():
    return BytePairTokenizer.train(FIXED_TEXT, 330)


# ----------------------------------------------------------------------------- the independent references

CONTRACTIONS = ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d")


def kind(c):
    if c.isspace():
        return "space"
    if c.isdecimal():
        return "digit"
    if c.isalnum():
        return "letter"
    return "other"  # punctuation, symbols, "_"


def reference_chunks(text):
    """GPT-2's pre-split, one character at a time: a contraction; else an optional single space and
    a run of one kind (letters, digits, other); else a run of whitespace, less its last character
    when a non-space follows and the run is longer than one (that character starts the next chunk)."""
    chunks, i, n = [], 0, len(text)
    while i < n:
        contraction = next((c for c in CONTRACTIONS if text.startswith(c, i)), None)
        if contraction:
            chunks.append(contraction)
            i += len(contraction)
            continue
        start = i
        if text[i] == " " and i + 1 < n and kind(text[i + 1]) != "space":
            i += 1
        run = kind(text[i])
        while i < n and kind(text[i]) == run:
            i += 1
        if run == "space" and i < n and i - start >= 2:
            i -= 1
        chunks.append(text[start:i])
    return chunks


def naive_merge(ids, pair, new_id):
    out = []
    i = 0
    while i < len(ids):
        if tuple(ids[i : i + 2]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def naive_train(text, vocab_size):
    """Recount every pair of every chunk after every merge; the most frequent pair wins, the
    smallest (left, right) among equals; stop when none occurs twice."""
    frequency = Counter(reference_chunks(text))
    sequences = {chunk: list(chunk.encode("utf-8")) for chunk in frequency}
    merges = []
    while 256 + len(merges) < vocab_size:
        counts = Counter()
        for chunk, ids in sequences.items():
            for pair in pairwise(ids):
                counts[pair] += frequency[chunk]
        if not counts or max(counts.values()) < 2:
            break
        best = max(counts.values())
        pair = min(p for p, c in counts.items() if c == best)
        merges.append(pair)
        sequences = {chunk: naive_merge(ids, pair, 255 + len(merges)) for chunk, ids in sequences.items()}
    return merges


def naive_encode(text, merges):
    ids = []
    for chunk in reference_chunks(text):
        sequence = list(chunk.encode("utf-8"))
        for rank, pair in enumerate(merges):
            sequence = naive_merge(sequence, pair, 256 + rank)
        ids += sequence
    return ids


# ----------------------------------------------------------------------------- chunks


@MANY
@given(TEXT)
def test_chunks_are_the_hand_scanners_and_join_to_the_text(text):
    chunks = split_chunks(text)
    assert "".join(chunks) == text
    assert chunks == reference_chunks(text)


def test_chunks_of_a_sentence():
    assert split_chunks("Hello, world!  It's 2024\n\nok_") == [
        "Hello", ",", " world", "!", " ", " It", "'s", " 2024", "\n", "\n", "ok", "_",
    ]  # fmt: skip  (a newline never joins a word, so the run of two before "ok" is two chunks)


# ----------------------------------------------------------------------------- training


def test_the_classic_example_by_hand():
    # "aaabdaaabac", one chunk. Pairs (overlapping): aa 4, ab 2, bd 1, da 1, ba 1, ac 1.
    #   merge 0: aa -> 256 (Z):  Z a b d Z a b a c   pairs: Za 2, ab 2, bd, dZ, ba, ac 1
    #            tie at 2: (97, 98) < (256, 97), so
    #   merge 1: ab -> 257 (Y):  Z Y d Z Y a c        pairs: ZY 2, Yd, dZ, Ya, ac 1
    #   merge 2: ZY -> 258 (X):  X d X a c            every pair once: stop.
    tok = BytePairTokenizer.train("aaabdaaabac", 300)
    assert tok.merges == [(97, 97), (97, 98), (256, 257)]
    assert tok.vocab_size == 259 and tok.requested_vocab_size == 300 and tok.stopped_early
    assert tok.encode("aaabdaaabac").tolist() == [258, ord("d"), 258, ord("a"), ord("c")]
    assert tok.decode_bytes([258]) == b"aaab"


def test_ties_go_to_the_smallest_pair():
    # chunks "ab" 1, " ab" 1, " cd" 2. Pairs: (97, 98) 2, (32, 97) 1, (32, 99) 2, (99, 100) 2.
    #   tie at 2 among (32, 99), (97, 98), (99, 100): " c" -> 256; " cd" is now [256, 100]
    #   tie at 2 between (97, 98) and (256, 100): "ab" -> 257
    #   (256, 100) 2: " cd" -> 258; left: (32, 257) once: stop.
    tok = BytePairTokenizer.train("ab ab cd cd", 1000)
    assert tok.merges == [(32, 99), (97, 98), (256, 100)]
    assert tok.vocab_size == 259 and tok.stopped_early


def test_training_stops_at_the_requested_size():
    tok = BytePairTokenizer.train(FIXED_TEXT * 3, 270)
    assert tok.vocab_size == 270 and not tok.stopped_early
    assert BytePairTokenizer.train("abc", 256).merges == []


def test_training_equals_the_naive_trainer_on_the_fixed_text(tokenizer):
    assert tokenizer.merges == naive_train(FIXED_TEXT, 330)


@given(st.text(alphabet="ab c\n'sé1", max_size=80), st.integers(256, 300))
def test_training_equals_the_naive_trainer(text, vocab_size):
    if not text:
        return
    assert BytePairTokenizer.train(text, vocab_size).merges == naive_train(text, vocab_size)


# ----------------------------------------------------------------------------- encoding and decoding


@MANY
@given(TEXT)
def test_round_trip_on_any_text(tokenizer, text):
    ids = tokenizer.encode(text)
    assert ids.dtype == np.int64 and ids.ndim == 1
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode_bytes(ids) == text.encode("utf-8")


@given(TEXT)
def test_encode_equals_the_naive_encoder(tokenizer, text):
    assert tokenizer.encode(text).tolist() == naive_encode(text, tokenizer.merges)


@given(st.text(alphabet="ab c\n'sé1", max_size=60), st.text(alphabet="ab c\n'sé1x", max_size=60), st.integers(256, 290))
def test_encode_equals_the_naive_encoder_for_any_training(train_text, text, vocab_size):
    if not train_text:
        return
    tok = BytePairTokenizer.train(train_text, vocab_size)
    assert tok.encode(text).tolist() == naive_encode(text, tok.merges)


def test_the_fixed_text_is_compressed_and_frequent_pairs_are_one_token(tokenizer):
    ids = tokenizer.encode(FIXED_TEXT)
    assert tokenizer.vocab_size == 282 and tokenizer.stopped_early  # a short text runs out of repeated pairs
    assert len(ids) < len(FIXED_TEXT.encode("utf-8")) * 0.75
    assert tokenizer.encode(" speak").tolist() == [tokenizer.token_bytes.index(b" speak")]


def test_characters_never_seen_fall_back_to_bytes(tokenizer):
    text = "日本語の文 🎉 Ωμέγα ñú\u0301 \U0010ffff\x00"
    assert not set(text) - {" "} & set(FIXED_TEXT)
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    unseen = tokenizer.encode("日本語")
    assert unseen.tolist() == list("日本語".encode("utf-8"))  # no merge holds these bytes


def test_encode_dtypes(tokenizer):
    assert tokenizer.id_dtype == np.uint16
    ids = tokenizer.encode(FIXED_TEXT, dtype=tokenizer.id_dtype)
    assert ids.dtype == np.uint16 and ids.tolist() == tokenizer.encode(FIXED_TEXT).tolist()
    assert tokenizer.encode("").shape == (0,)
    assert BytePairTokenizer([]).id_dtype == np.uint8


def test_decode_of_a_cut_character():
    tok = BytePairTokenizer([])
    e_acute = list("é".encode("utf-8"))  # [0xC3, 0xA9]
    assert tok.decode(e_acute[:1]) == "\ufffd" and tok.decode(e_acute[1:]) == "\ufffd"
    assert tok.decode_bytes(e_acute[:1]) == b"\xc3"
    assert tok.decode(np.array(e_acute)) == "é"
    stream = tok.stream_decoder()
    assert [stream.decode([i]) for i in list("aé€".encode("utf-8"))] == ["a", "", "é", "", "", "€"]
    assert stream.decode([0xE2]) == "" and stream.flush() == "\ufffd"


def test_decode_takes_lists_and_arrays(tokenizer):
    ids = tokenizer.encode("Speak, speak.")
    assert tokenizer.decode(ids.tolist()) == tokenizer.decode(ids.astype(np.uint16)) == "Speak, speak."
    assert tokenizer.decode([]) == ""


# ----------------------------------------------------------------------------- saving


def test_to_dict_from_dict_round_trip(tokenizer):
    d = json.loads(json.dumps(tokenizer.to_dict()))
    again = BytePairTokenizer.from_dict(d)
    assert again.merges == tokenizer.merges
    assert again.requested_vocab_size == tokenizer.requested_vocab_size
    assert again.encode(FIXED_TEXT).tolist() == tokenizer.encode(FIXED_TEXT).tolist()
    early = BytePairTokenizer.from_dict(json.loads(json.dumps(BytePairTokenizer.train("aaabdaaabac", 300).to_dict())))
    assert early.vocab_size == 259 and early.requested_vocab_size == 300 and early.stopped_early


def good_dict():
    return {"format": "byte-level-bpe", "format_version": 1, "requested_vocab_size": 260, "merges": [[97, 98], [256, 99]]}


@pytest.mark.parametrize(
    "change, kind, words",
    [
        (lambda d: [d], InputTypeError, "expected a dict"),
        (lambda d: {k: v for k, v in d.items() if k != "merges"}, InputError, "keys"),
        (lambda d: {**d, "extra": 1}, InputError, "keys"),
        (lambda d: {**d, "format": "gpt2"}, InputError, "format"),
        (lambda d: {**d, "format_version": 2}, InputError, "format_version"),
        (lambda d: {**d, "format_version": True}, InputError, "format_version"),
        (lambda d: {**d, "merges": "ab"}, InputTypeError, "merges"),
        (lambda d: {**d, "merges": [[97, 98, 99]]}, InputError, "merge 0"),
        (lambda d: {**d, "merges": [[97, 98.0]]}, InputError, "merge 0"),
        (lambda d: {**d, "merges": [[97, True]]}, InputError, "merge 0"),
        (lambda d: {**d, "merges": [[97, 98], [257, 99]]}, InputError, "merge 1"),
        (lambda d: {**d, "merges": [[-1, 98]]}, InputError, "merge 0"),
        (lambda d: {**d, "merges": [[97, 98], [97, 98]]}, InputError, "repeats"),
        (lambda d: {**d, "requested_vocab_size": 257}, InputError, "requested_vocab_size"),
        (lambda d: {**d, "requested_vocab_size": 255}, InputError, "vocab_size"),
        (lambda d: {**d, "requested_vocab_size": "260"}, InputTypeError, "vocab_size"),
    ],
)
def test_from_dict_refuses_a_malformed_dict(change, kind, words):
    assert BytePairTokenizer.from_dict(good_dict()).vocab_size == 258
    with pytest.raises(kind, match=words):
        BytePairTokenizer.from_dict(change(good_dict()))


# ----------------------------------------------------------------------------- errors


def test_vocab_size_below_256_names_the_flag():
    with pytest.raises(InputError, match=r"vocab_size \(--vocab-size\) is 255; .* at least 256"):
        BytePairTokenizer.train("hello", 255)
    with pytest.raises(InputTypeError, match="vocab_size"):
        BytePairTokenizer.train("hello", 300.0)
    with pytest.raises(InputTypeError, match="vocab_size"):
        BytePairTokenizer.train("hello", True)


def test_text_errors(tokenizer):
    with pytest.raises(InputTypeError, match="text must be a str, got bytes"):
        BytePairTokenizer.train(b"hello", 300)
    with pytest.raises(InputError, match="empty"):
        BytePairTokenizer.train("", 300)
    with pytest.raises(InputTypeError, match="text must be a str, got list"):
        tokenizer.encode(["a"])
    for call in (lambda t: BytePairTokenizer.train(t, 300), tokenizer.encode):
        with pytest.raises(InputError, match=r"lone surrogate '\\ud800' at position 2"):
            call("ab\ud800c")


def test_encode_dtype_errors(tokenizer):
    with pytest.raises(InputError, match="uint8 cannot hold id 281"):
        tokenizer.encode("hi", dtype=np.uint8)
    with pytest.raises(InputTypeError, match="integer dtype"):
        tokenizer.encode("hi", dtype=np.float32)


def test_ids_outside_the_vocabulary(tokenizer):
    for bad in ([1, 282], [-1], np.array([400])):
        with pytest.raises(InputIndexError, match="outside the vocabulary"):
            tokenizer.decode(bad)
    assert issubclass(InputIndexError, InputError)
    with pytest.raises(InputTypeError, match="integers"):
        tokenizer.decode([1.0, 2.0])
    with pytest.raises(InputError, match="1-D"):
        tokenizer.decode(np.zeros((2, 2), dtype=np.int64))


# ----------------------------------------------------------------------------- loss per character


def test_bits_per_character():
    assert bits_per_character(math.log(2), 100, 100) == pytest.approx(1.0)
    # 10 tokens at 2 nats each: 20 nats = 20 / ln 2 bits, over 25 characters
    assert bits_per_character(2.0, 10, 25) == pytest.approx(20 / math.log(2) / 25)
    for tokens, chars in ((0, 5), (5, 0), (-1, 5)):
        with pytest.raises(InputError, match="positive"):
            bits_per_character(1.0, tokens, chars)


@given(TEXT)
def test_count_characters(text):
    assert count_characters(text.encode("utf-8")) == len(text)


def test_encode_merges_the_lowest_ranked_pair_not_the_leftmost():
    """Encoding applies merges in the order learned, wherever they stand in the chunk. Kills the
    mutant bpe.encode_merges_the_leftmost_pair (which the property tests miss at the pinned seed)."""
    # chunks "bcbcbc" 1, " abab" 1. Pairs: bc 3, cb 2, ab 2, " a" 1, ba 1.
    #   merge 0: bc -> 256:  "bcbcbc" = [256, 256, 256]   pairs: (256, 256) 2, ab 2
    #   tie at 2: (97, 98) < (256, 256), so merge 1: ab -> 257; then merge 2: (256, 256) -> 258
    tok = BytePairTokenizer.train("bcbcbc abab", 1000)
    assert tok.merges == [(98, 99), (97, 98), (256, 256)]
    # "abc" holds ab (rank 1) left of bc (rank 0): bc is merged first, which leaves ab nothing to merge
    assert tok.encode("abc").tolist() == [ord("a"), 256]  # the leftmost pair first would give [257, ord("c")]
    assert tok.encode("abcbc").tolist() == [ord("a"), 258]
    assert tok.encode("abc").tolist() == naive_encode("abc", tok.merges)
