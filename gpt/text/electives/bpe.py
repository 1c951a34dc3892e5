r"""A byte-level byte-pair-encoding (BPE) tokenizer, written by hand: `--tokenizer bpe --vocab-size N`.

The character tokenizer (gpt/text/data.py) gives every character its own id, so a model spends one
prediction per character. BPE instead learns, from the training text, which runs of bytes are
common ("the", " and", "ing") and gives each its own id, so the same text is fewer tokens and a
block of `block_size` tokens sees more text.

Ids and what they stand for
---------------------------
A text is first its UTF-8 bytes. Ids 0..255 are the 256 byte values, so every text can be written
with them alone. Training then adds one id per merge: merge number r (its "rank", 0 first) turns
the adjacent pair (left, right) into the new id 256 + r, which stands for the bytes of left
followed by the bytes of right. vocab_size = 256 + the number of merges.

Training: repeated pair merging
-------------------------------
    1. split the text into chunks (below) and count each distinct chunk once, with its frequency;
    2. count every adjacent pair of ids inside the chunks (a chunk that occurs f times adds f);
    3. take the most frequent pair, give it the next id, and replace it in every chunk
       (left to right, so "aaa" becomes [aa, a]);
    4. repeat 3 until vocab_size ids exist.

Counting distinct chunks (step 1) is what makes this fast: a text repeats its words, so it has
far fewer different chunks than chunks. Step 3 does not recount: `where` remembers
which chunks hold each pair, so a merge rewrites only those chunks, and the pair counts change by
what those chunks lost and gained. A heap finds the most frequent pair; an entry whose count has
since changed is stale and is skipped when it reaches the top ("lazy deletion").

Ties between equally frequent pairs go to the smaller pair, compared as (left id, right id): the
heap orders its entries by (-count, left, right), so the same text always gives the same merges.
Training stops early, with fewer ids than asked for, when no pair occurs twice (a merge would then
save nothing); `vocab_size` is then smaller than `requested_vocab_size`, and `stopped_early` is True.

Chunks: where merges may not cross
----------------------------------
Merging across word boundaries would spend ids on pieces such as "e t" that mix the end of one
word with the start of the next. Like GPT-2, the text is first cut into chunks and merges happen
inside a chunk only. CHUNK_PATTERN is GPT-2's pattern written for Python's `re`, which has no
\p{L}: `[^\W\d_]` (a word character that is not a digit or "_") stands in for a letter.

    '(?:[st]|re|ve|m|ll|d)      an English contraction:   's 't 're 've 'm 'll 'd
     ?[^\W\d_]+                 a word, with its leading space if it has one:   " king"
     ?\d+                       a run of digits, likewise:   " 1600"
     ?(?:[^\s\w]|_)+            a run of anything else (punctuation, symbols, "_"):   " --"
    \s+(?!\S)                   whitespace up to the end of the text, or up to the last whitespace
                                character before a non-space, which is left to start the next chunk
    \s+                         that last character when it is not a plain space: a newline before
                                a word is a chunk of its own (a space before a word joins the word)

Every character is whitespace (`\s`), a digit, "_", a letter in the sense above, or neither of the
four (`[^\s\w]`), so some branch matches at every position: the chunks, joined, are the text.
That is what makes chunking lossless.

Encoding: merges by rank
------------------------
Within one chunk, encoding repeats: among the adjacent pairs, find the one with the lowest rank
(learned first); merge all its occurrences; stop when no pair has a rank. That gives the same ids
as applying every merge, in the order learned, to the chunk's bytes: a pair made of ids that exist
before a merge never appears because of it, so skipping a merge that has no occurrence now never
misses one later. Each distinct chunk of one `encode` call is encoded once (a dict local to the
call, so nothing outlives it).

Round trip
----------
decode(encode(s)) == s for every str s that UTF-8 can encode: every code point except the lone
surrogates U+D800..U+DFFF (a str can hold them; UTF-8 cannot, and they are an InputError here).
The ids are a partition of s's UTF-8 bytes into tokens, and each token's bytes are exactly what it
stands for, so joining them gives back the bytes and decoding them gives back s. A character
never seen in training is no problem: its bytes are ids 0..255.

The other way is not exact: an arbitrary id sequence (a model's sample) may end in the middle of a
multi-byte character or hold bytes that are not UTF-8 at all. `decode` replaces each such piece
with U+FFFD (Python's errors="replace"), so it always returns a str; `decode_bytes` returns the
exact bytes; `stream_decoder()` decodes ids that arrive one at a time, holding back the first bytes
of a character until its last byte arrives.

Loss per character
------------------
A model's cross-entropy is in nats per token, and a BPE token is several characters, so the
losses of two tokenizers do not compare. `bits_per_character` converts: the text costs
loss · tokens nats in total; divided by its characters and by ln 2 (nats per bit), that is bits
per character, the same unit for every tokenizer. For the character tokenizer tokens = characters.
"""
import codecs
import heapq
import math
import re
from collections import Counter, defaultdict
from itertools import chain, pairwise, repeat

import numpy as np

from microtensor import InputError, InputIndexError, InputTypeError

FORMAT = "byte-level-bpe"
FORMAT_VERSION = 1  # names CHUNK_PATTERN too: a new pattern would encode old checkpoints' text differently
N_BYTES = 256  # ids 0..255 are the byte values

CHUNK_PATTERN = re.compile(r"""'(?:[st]|re|ve|m|ll|d)| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")


def split_chunks(text):
    """text cut into the chunks that merges may not cross (see the module docstring); joined, they are text."""
    return CHUNK_PATTERN.findall(text)


def merge_pair(ids, left, right, new_id):
    """ids with every (left, right) replaced by new_id, scanning left to right: [a, a, a] -> [aa, a]."""
    merged, i, n = [], 0, len(ids)
    while i < n:
        if i + 1 < n and ids[i] == left and ids[i + 1] == right:
            merged.append(new_id)
            i += 2
        else:
            merged.append(ids[i])
            i += 1
    return merged


def learn_merges(words, freqs, max_merges):
    """Up to max_merges merges, each (left, right), learned by repeated pair merging.

    words: the distinct chunks as lists of ids (rewritten in place as merges happen);
    freqs: how often each chunk occurs in the text. Stops early when no pair occurs twice.
    """
    counts = Counter()  # pair -> occurrences in the text (each chunk weighted by its frequency)
    where = defaultdict(set)  # pair -> indices of the words that hold it
    for index, (ids, freq) in enumerate(zip(words, freqs)):
        for pair in pairwise(ids):
            counts[pair] += freq
            where[pair].add(index)
    heap = [(-count, left, right) for (left, right), count in counts.items()]
    heapq.heapify(heap)
    merges = []
    while len(merges) < max_merges and heap:
        negative_count, left, right = heapq.heappop(heap)
        if counts.get((left, right)) != -negative_count:
            continue  # stale: the pair's count changed after this entry was pushed
        if -negative_count < 2:
            break  # the most frequent pair occurs once: merging it saves nothing
        new_id = N_BYTES + len(merges)
        merges.append((left, right))
        touched = set()  # pairs whose count changed
        for index in where.pop((left, right)):
            old, freq = words[index], freqs[index]
            new = merge_pair(old, left, right, new_id)
            words[index] = new
            old_pairs, new_pairs = list(pairwise(old)), list(pairwise(new))
            for pair in old_pairs:
                counts[pair] -= freq
            for pair in new_pairs:
                counts[pair] += freq
            touched.update(old_pairs)
            touched.update(new_pairs)
            new_set = set(new_pairs)
            for pair in set(old_pairs) - new_set:
                if pair != (left, right):  # its set was popped above
                    where[pair].discard(index)
            for pair in new_set:
                where[pair].add(index)
        for pair in touched:
            count = counts[pair]
            if count > 0:
                heapq.heappush(heap, (-count, pair[0], pair[1]))
            else:
                del counts[pair]
                where.pop(pair, None)
    return merges


def check_text(text, where):
    """Raise InputTypeError unless text is a str (a lone surrogate is found when it is encoded)."""
    if not isinstance(text, str):
        raise InputTypeError(f"{where}: text must be a str, got {type(text).__name__}")


def surrogate_error(text, where):
    """The InputError for a text holding a lone surrogate, naming the first one and its position."""
    position = next(i for i, c in enumerate(text) if "\ud800" <= c <= "\udfff")
    return InputError(
        f"{where}: text holds the lone surrogate {text[position]!r} at position {position}, which UTF-8 cannot "
        "encode; pass text that UTF-8 can encode (every code point except U+D800..U+DFFF)"
    )


class BytePairTokenizer:
    """Byte-level BPE: ids 0..255 are bytes, id 256 + r is merge r. Same interface as CharTokenizer
    (vocab_size, id_dtype, encode, decode), plus train, decode_bytes, stream_decoder, to_dict and from_dict.

    merges: a list of (left, right) id pairs in the order learned; merge r makes id 256 + r, so its
    ids must be below 256 + r. requested_vocab_size: the vocab_size training was asked for (default:
    the one the merges give); larger than vocab_size when training stopped early.
    """

    def __init__(self, merges, requested_vocab_size=None):
        self.merges = check_merges(merges, "BytePairTokenizer")
        self.ranks = {pair: rank for rank, pair in enumerate(self.merges)}  # (left, right) -> rank
        # token_bytes[i]: the bytes id i stands for
        self.token_bytes = [bytes([b]) for b in range(N_BYTES)]
        for left, right in self.merges:
            self.token_bytes.append(self.token_bytes[left] + self.token_bytes[right])
        if requested_vocab_size is None:
            requested_vocab_size = self.vocab_size
        check_vocab_size(requested_vocab_size)
        if requested_vocab_size < self.vocab_size:
            raise InputError(
                f"BytePairTokenizer: requested_vocab_size {requested_vocab_size} is smaller than the "
                f"{self.vocab_size} ids its {len(self.merges)} merges make"
            )
        self.requested_vocab_size = requested_vocab_size

    @classmethod
    def train(cls, text, vocab_size):
        """A tokenizer with up to vocab_size ids, learned from text (see the module docstring)."""
        check_vocab_size(vocab_size)
        check_text(text, "BytePairTokenizer.train")
        if not text:
            raise InputError("BytePairTokenizer.train: text is empty; pass the training text")
        chunk_counts = Counter(split_chunks(text))
        try:
            words = [list(chunk.encode("utf-8")) for chunk in chunk_counts]
        except UnicodeEncodeError:
            raise surrogate_error(text, "BytePairTokenizer.train") from None
        merges = learn_merges(words, list(chunk_counts.values()), vocab_size - N_BYTES)
        return cls(merges, requested_vocab_size=vocab_size)

    @property
    def vocab_size(self):
        return N_BYTES + len(self.merges)

    @property
    def stopped_early(self):
        """True when training ran out of pairs that occur twice before reaching requested_vocab_size."""
        return self.vocab_size < self.requested_vocab_size

    @property
    def id_dtype(self):
        """The smallest unsigned dtype that holds every id: uint16 for up to 65,536 ids."""
        return np.min_scalar_type(self.vocab_size - 1)

    def encode_chunk(self, chunk_bytes):
        """The ids of one chunk: merge the adjacent pair of lowest rank until no pair has a rank."""
        ids = list(chunk_bytes)
        ranks = self.ranks
        while len(ids) >= 2:
            rank = min(map(ranks.get, pairwise(ids), repeat(math.inf)))  # ranks.get(pair, inf) for each pair
            if rank == math.inf:
                break
            left, right = self.merges[rank]
            ids = merge_pair(ids, left, right, N_BYTES + rank)
        return ids

    def encode(self, text, dtype=np.int64):
        """The ids of text, as a 1-D array of dtype (int64 for the model; `id_dtype` to keep a corpus small).

        Raises InputTypeError for a text that is not a str or a dtype that is not an integer type,
        InputError for a lone surrogate or a dtype too small for the vocabulary's ids.
        """
        check_text(text, "BytePairTokenizer.encode")
        dtype = np.dtype(dtype)
        if dtype.kind not in "iu":
            raise InputTypeError(f"BytePairTokenizer.encode: dtype must be an integer dtype, got {dtype}")
        if np.iinfo(dtype).max < self.vocab_size - 1:
            raise InputError(
                f"BytePairTokenizer.encode: dtype {dtype} cannot hold id {self.vocab_size - 1}; "
                f"use {self.id_dtype} or wider"
            )
        chunks = split_chunks(text)
        # Each distinct chunk is encoded once: a text repeats its words.
        encoded = dict.fromkeys(chunks)  # chunk -> its ids
        try:
            for chunk in encoded:
                encoded[chunk] = self.encode_chunk(chunk.encode("utf-8"))
        except UnicodeEncodeError:
            raise surrogate_error(text, "BytePairTokenizer.encode") from None
        # fromiter fills the array as it goes, without a list of every id first
        return np.fromiter(chain.from_iterable(map(encoded.__getitem__, chunks)), dtype=dtype)

    def decode_bytes(self, ids):
        """The exact bytes that ids stand for. ids: a 1-D sequence or array of integer ids."""
        return b"".join(self.token_bytes[i] for i in self.check_ids(ids, "BytePairTokenizer.decode_bytes"))

    def decode(self, ids):
        """The text ids stand for; a piece that is not whole UTF-8 (a character cut at either end of
        the ids, or bytes that are not UTF-8) becomes U+FFFD, so every id sequence decodes."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def stream_decoder(self):
        """A StreamDecoder: text for ids that arrive a few at a time (as a sampler makes them)."""
        return StreamDecoder(self)

    def check_ids(self, ids, where):
        """ids as a list of Python ints, after checking they are a 1-D sequence of ids of this vocabulary."""
        array = np.asarray(ids)
        if array.ndim != 1:
            raise InputError(f"{where}: ids must be 1-D, got shape {array.shape}")
        if array.size == 0:
            return []
        if array.dtype.kind not in "iu":
            raise InputTypeError(f"{where}: ids must be integers, got dtype {array.dtype}")
        low, high = int(array.min()), int(array.max())
        if low < 0 or high >= self.vocab_size:
            bad = low if low < 0 else high
            raise InputIndexError(f"{where}: id {bad} is outside the vocabulary (ids are 0..{self.vocab_size - 1})")
        return array.tolist()

    def to_dict(self):
        """The tokenizer as plain JSON values (a checkpoint stores it): format, version, merges as [left, right] lists."""
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "requested_vocab_size": self.requested_vocab_size,
            "merges": [[left, right] for left, right in self.merges],
        }

    @classmethod
    def from_dict(cls, d):
        """The tokenizer that to_dict wrote; a dict that is not one is an InputError saying what is wrong."""
        where = "BytePairTokenizer.from_dict"
        if not isinstance(d, dict):
            raise InputTypeError(f"{where}: expected a dict, got {type(d).__name__}")
        expected = {"format", "format_version", "requested_vocab_size", "merges"}
        if set(d) != expected:
            raise InputError(f"{where}: expected the keys {sorted(expected)}, got {sorted(d)}")
        if d["format"] != FORMAT:
            raise InputError(f"{where}: format must be {FORMAT!r}, got {d['format']!r}")
        if d["format_version"] != FORMAT_VERSION or type(d["format_version"]) is not int:
            raise InputError(f"{where}: format_version {d['format_version']!r} is not {FORMAT_VERSION}, the one this code reads")
        try:
            return cls(d["merges"], requested_vocab_size=d["requested_vocab_size"])
        except InputError as error:  # InputTypeError included: both name what is wrong
            raise type(error)(f"{where}: {error}") from None


def check_vocab_size(vocab_size):
    if type(vocab_size) is not int and not isinstance(vocab_size, np.integer):
        raise InputTypeError(f"vocab_size (--vocab-size) must be an int, got {vocab_size!r}")
    if vocab_size < N_BYTES:
        raise InputError(
            f"vocab_size (--vocab-size) is {vocab_size}; byte-level BPE needs at least {N_BYTES} "
            "(the 256 byte values), plus one id per merge"
        )


def check_merges(merges, where):
    """merges as a list of (int, int) tuples, after checking each is a pair of ids that exist before it."""
    if not isinstance(merges, (list, tuple)):
        raise InputTypeError(f"{where}: merges must be a list of [left, right] pairs, got {type(merges).__name__}")
    checked, seen = [], set()
    for rank, merge in enumerate(merges):
        if not isinstance(merge, (list, tuple)) or len(merge) != 2 or any(type(i) is not int for i in merge):
            raise InputError(f"{where}: merge {rank} must be a pair of ints [left, right], got {merge!r:.80}")
        left, right = merge
        if not (0 <= left < N_BYTES + rank and 0 <= right < N_BYTES + rank):
            raise InputError(
                f"{where}: merge {rank} is {[left, right]}, but only ids 0..{N_BYTES + rank - 1} exist before it"
            )
        if (left, right) in seen:
            raise InputError(f"{where}: merge {rank} repeats the pair {[left, right]} of an earlier merge")
        seen.add((left, right))
        checked.append((left, right))
    return checked


def bits_per_character(loss_nats_per_token, n_tokens, n_characters):
    """A loss in nats per token as bits per character: loss · n_tokens / n_characters / ln 2.

    n_tokens and n_characters describe the same text (the one the loss was measured on, or a
    corpus whose ratio it shares); for the character tokenizer they are equal.
    """
    if isinstance(n_tokens, bool) or isinstance(n_characters, bool):
        raise InputTypeError("bits_per_character: n_tokens and n_characters must be ints, got a bool")
    if n_tokens <= 0 or n_characters <= 0:
        raise InputError(f"bits_per_character: n_tokens and n_characters must be positive, got {n_tokens} and {n_characters}")
    return float(loss_nats_per_token) * n_tokens / n_characters / math.log(2)


def count_characters(utf8_bytes):
    """How many characters some UTF-8 bytes hold: the bytes that start one (every byte that is not a
    continuation byte 0b10xxxxxx). Exact for whole text; a character cut at an end counts where it starts."""
    array = np.frombuffer(bytes(utf8_bytes), dtype=np.uint8)
    return int(np.count_nonzero((array & 0xC0) != 0x80))


class StreamDecoder:
    """Text for ids that arrive a few at a time: a character whose bytes span two tokens is written
    once its last byte has arrived, instead of as two U+FFFD. `flush()` at the end returns what is held back."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def decode(self, ids):
        return self.utf8.decode(self.tokenizer.decode_bytes(ids))

    def flush(self):
        return self.utf8.decode(b"", final=True)
