"""Checkpoints as .npz files (no pickle): parameters, optimizer state, and a JSON record of the rest.

    model/<parameter name>   each parameter's values
    optim/<key>              the optimizer's state_dict()
    meta                     JSON: format and format_version, iteration, model config, vocabulary,
                             training arguments, best val loss, and the random generators' states

Saving never loses the checkpoint that is already there
-------------------------------------------------------
`save` writes to a temporary file `.ckpt-<pid>-<random>.npz` in the same folder, flushes it to the
disk (fsync), renames it over ckpt.npz, and fsyncs the folder. A rename within one folder is atomic:
whenever the process dies (a crash, a full disk, SIGKILL, a second Ctrl-C), ckpt.npz is either the
previous complete file or the new complete file, never half of one. The fsync before the rename is
what makes that true after a power cut too: without it the file system may rename first and write
the data later. A temporary file left behind by a killed writer is removed by `prepare_out_dir` at
the next start; the writer's pid in its name keeps a run from removing a save in progress of
another run that is still alive.

Loading never trusts the file
-----------------------------
`load` reads with `allow_pickle=False`, so no code in a file ever runs, and checks everything a
caller relies on before returning: the format version, the meta record (iteration, config,
vocabulary), that the parameters are exactly those of a GPT of that config (names, shapes, one float
dtype) and finite. A truncated or corrupted file (a short zip, a bad CRC, bytes that are not JSON)
is a CheckpointError naming the file. Checkpoints written before `format_version` existed have the
same layout and are read as version 1; a version newer than FORMAT_VERSION is refused rather than
guessed at.
"""
import contextlib
import json
import os
import struct
import tempfile
import zipfile
import zlib
from pathlib import Path

import numpy as np

import microtensor as mt
from microtensor.errors import MicrotensorError

from .gpt import GPT, GPTConfig

FILENAME = "ckpt.npz"
FORMAT = "microtensor-checkpoint"
FORMAT_VERSION = 1
TEMP_PREFIX = ".ckpt-"  # every temporary file a save makes starts so; nothing else of ours does
# What reading a damaged .npz can raise (found by flipping random bytes of a checkpoint, see
# tests/test_checkpoint.py): numpy's own checks (ValueError), a short or damaged zip (BadZipFile,
# EOFError, zlib.error, struct.error; NotImplementedError for a compression method that is not ours;
# RuntimeError for a flipped "encrypted" bit), an unreadable file (OSError), a header that claims an
# absurd shape (MemoryError).
READ_ERRORS = (
    OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, zlib.error, struct.error, NotImplementedError,
    RuntimeError, MemoryError,
)  # fmt: skip


class CheckpointError(MicrotensorError):
    """A checkpoint that is missing, unreadable or does not fit; the message names the file and says what to do."""


class CheckpointSaveError(CheckpointError):
    """A save that failed (a full disk, no permission): `path` was not changed by it."""

    def __init__(self, path, error):
        self.path = Path(path)
        self.error = error
        reason = f"{error.strerror} ({error.filename})" if getattr(error, "strerror", None) else str(error)
        super().__init__(f"could not save the checkpoint {self.path}: {reason}")


def path_in(out_dir):
    return Path(out_dir) / FILENAME


# ================================================================================= saving


def save(out_dir, model, optimizer, meta):
    """Write model, optimizer and meta to out_dir/ckpt.npz atomically (see the module docstring);
    returns its path. Raises CheckpointSaveError if the disk refuses, leaving the file as it was."""
    path = path_in(out_dir)
    arrays = {f"model/{name}": value for name, value in model.state_dict().items()}
    arrays.update({f"optim/{key}": np.asarray(value) for key, value in optimizer.state_dict().items()})
    arrays["meta"] = np.array(json.dumps({"format": FORMAT, "format_version": FORMAT_VERSION, **meta}))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda tmp: np.savez(tmp, **arrays))
    except OSError as error:
        raise CheckpointSaveError(path, error) from None
    return path


def write_atomically(path, write, prefix=TEMP_PREFIX):
    """Call write(temporary path) for a file in path's folder, fsync it, rename it over path, fsync
    the folder. On any failure (or Ctrl-C) the temporary file is removed and path is left as it was."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{prefix}{os.getpid()}-", suffix=path.suffix)
    os.close(fd)
    try:
        write(tmp)
        _fsync(tmp, os.O_RDONLY)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if os.name == "posix":  # makes the rename itself durable; other systems cannot open a folder
        _fsync(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    return path


def _fsync(name, flags):
    fd = os.open(name, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def prepare_out_dir(out_dir):
    """Make sure a checkpoint can be written in out_dir before any work is done: create the folder,
    write and remove a probe file (this finds a read-only disk or a missing permission, even for
    root), and remove the temporary files of killed runs. Returns the stale files removed."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise CheckpointError(f"{out_dir} is a file; expected a folder to hold {FILENAME}")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out_dir, prefix=f"{TEMP_PREFIX}{os.getpid()}-", suffix=".probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        reason = error.strerror or str(error)
        raise CheckpointError(f"cannot write a checkpoint in {out_dir}: {reason}; expected a folder you can write to") from None
    return remove_stale_temp_files(out_dir)


def remove_stale_temp_files(out_dir):
    """Remove the temporary files (TEMP_PREFIX*) that saves of processes no longer running left in
    out_dir. Only names with our prefix are touched; a file whose writer is alive is kept."""
    removed = []
    for tmp in sorted(Path(out_dir).glob(TEMP_PREFIX + "*")):
        pid = _writer_pid(tmp.name)
        if pid is not None and pid != os.getpid() and _is_running(pid):
            continue  # another run's save in progress
        with contextlib.suppress(OSError):
            tmp.unlink()
            removed.append(tmp)
    return removed


def _writer_pid(name):
    """The pid in `.ckpt-<pid>-<random>.npz`, or None for a name without one (older versions)."""
    head, sep, _ = name[len(TEMP_PREFIX) :].partition("-")
    return int(head) if sep and head.isdigit() else None


def _is_running(pid):
    if os.name != "posix":
        return False  # os.kill(pid, 0) would end the process on Windows; there an open file cannot be removed anyway
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


# ================================================================================= loading


def load(out_dir):
    """(model state, optimizer state, meta) from out_dir's checkpoint, every part checked (see the
    module docstring). `GPTConfig(**meta["config"])` builds the model the state fits."""
    path = path_in(out_dir)
    if not path.exists():
        if Path(out_dir).is_file():
            raise CheckpointError(f"{out_dir} is a file; expected the folder train.py wrote {FILENAME} to")
        raise CheckpointError(f"no checkpoint at {path}: run train.py first, or pass the --out-dir it wrote to")
    arrays = _read_arrays(path)
    meta = _read_meta(path, arrays.pop("meta", None))
    config = _check_meta(path, meta)
    model_state = {k[len("model/") :]: v for k, v in arrays.items() if k.startswith("model/")}
    optim_state = {k[len("optim/") :]: v for k, v in arrays.items() if k.startswith("optim/")}
    stray = [k for k in arrays if not k.startswith(("model/", "optim/"))]
    if stray:
        raise CheckpointError(f"{path} holds entries a checkpoint does not have: {', '.join(stray)}")
    _check_model_state(path, model_state, config)
    return model_state, optim_state, meta


def read_iteration(out_dir):
    """The step of out_dir's checkpoint, or None if it cannot be read (for messages only)."""
    try:
        return load(out_dir)[2]["iteration"]
    except CheckpointError:
        return None


def _read_arrays(path):
    if not path.is_file():
        raise CheckpointError(f"{path} is not a file")
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
    except OSError as error:
        raise CheckpointError(f"{path} cannot be read: {error.strerror or error}") from None
    if magic == b"\x93NUMPY":
        raise CheckpointError(f"{path} is a single .npy array, not a checkpoint (.npz) written by train.py")
    if not magic.startswith(b"PK"):  # every zip archive, so every .npz, starts so
        shown = f"its first bytes are {magic!r}" if magic else "it is empty"
        raise CheckpointError(f"{path} is not a checkpoint (.npz), nor any zip archive: {shown}; train again, or restore the file from a copy")
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except ValueError as error:
        if "pickle" in str(error):  # an object array: unpickling it could run any code, so it is not read
            raise CheckpointError(
                f"{path} holds pickled Python objects, which a checkpoint never has and which are never loaded "
                "(unpickling can run code): the file was not written by train.py"
            ) from None
        raise _unreadable(path, error) from None
    except READ_ERRORS as error:
        raise _unreadable(path, error) from None


def _unreadable(path, error):
    return CheckpointError(
        f"{path} is not a readable checkpoint (truncated or corrupted?): {type(error).__name__}: {error}; "
        "train again, or restore the file from a copy"
    )


def _read_meta(path, entry):
    if entry is None:
        raise CheckpointError(
            f"{path} holds no meta entry, so it was not written by train.py (an export of models.convert? "
            f"import it with: python -m models.convert FILE FOLDER)"
        )
    if entry.dtype.kind != "U" or entry.shape != ():
        raise CheckpointError(f"{path}: its meta entry is {entry.dtype} of shape {entry.shape}, expected a JSON string")
    try:
        meta = json.loads(str(entry))
    except ValueError as error:
        raise CheckpointError(f"{path}: its meta entry is not valid JSON ({error}); the file is corrupted") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: its meta entry is a JSON {type(meta).__name__}, expected an object")
    return meta


def _check_meta(path, meta):
    """The GPTConfig of a checkpoint's meta, after checking the version, iteration and vocabulary."""
    version = meta.get("format_version", 1)  # files written before the field existed: version 1
    if type(version) is not int or version < 1:
        raise CheckpointError(f"{path}: format_version is {version!r}, expected an integer >= 1")
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} is in checkpoint format version {version}; this microtensor ({mt.__version__}) reads "
            f"version {FORMAT_VERSION} and older: upgrade microtensor"
        )
    if meta.get("format", FORMAT) != FORMAT:
        raise CheckpointError(f"{path}: its meta says format {meta['format']!r}, expected {FORMAT!r}")
    missing = [key for key in ("iteration", "config", "vocab") if key not in meta]
    if missing:
        raise CheckpointError(f"{path}: its meta lacks {', '.join(missing)}")
    iteration = meta["iteration"]
    if type(iteration) is not int or iteration < 0:
        raise CheckpointError(f"{path}: its iteration is {iteration!r}, expected an integer >= 0")
    try:
        config = GPTConfig(**meta["config"])
    except (TypeError, ValueError) as error:  # unknown or missing fields, or values GPTConfig refuses
        raise CheckpointError(f"{path}: its config is not a valid GPTConfig: {error}") from None
    vocab = meta["vocab"]
    if not isinstance(vocab, str) or len(vocab) != config.vocab_size or len(set(vocab)) != len(vocab):
        raise CheckpointError(
            f"{path}: its vocab must be a string of vocab_size = {config.vocab_size} different characters, got {vocab!r:.80}"
        )
    return config


def _check_model_state(path, state, config):
    """The parameters must be exactly those of GPT(config) in one float dtype, and finite."""
    dtypes = sorted({str(a.dtype) for a in state.values()})
    if dtypes not in (["float32"], ["float64"]):
        raise CheckpointError(f"{path}: expected every parameter in float32 or every one in float64, got {dtypes}")
    # The shapes come from a model built for the config; building one draws its initial weights, so
    # the global generator is put back as it was.
    rng_state = mt.random.get_state()
    try:
        expected = {name: p.shape for name, p in GPT(config, dtype=getattr(mt, dtypes[0])).named_parameters()}
    finally:
        mt.random.set_state(rng_state)
    problems = []
    missing = [name for name in expected if name not in state]
    unexpected = [name for name in state if name not in expected]
    if missing:
        problems.append(f"missing parameters: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected parameters: {', '.join(unexpected)}")
    for name, shape in expected.items():
        if name in state and state[name].shape != shape:
            problems.append(f"{name} has shape {state[name].shape}, the config implies {shape}")
    if not problems:
        bad = [name for name, array in state.items() if not np.isfinite(array).all()]
        if bad:
            problems.append(f"non-finite values (inf or nan) in {', '.join(bad)}")
    if problems:
        raise CheckpointError(f"{path} does not fit its own config {config}:\n  " + "\n  ".join(problems))
