"""Checkpoints as .npz files (no pickle): parameters, optimizer state, and a JSON record of the rest.

    model/<parameter name>   each parameter's values
    optim/<key>              the optimizer's state_dict()
    meta                     JSON: format and format_version, iteration, model config, vocabulary
                             (a character tokenizer's "vocab", or a byte-level BPE's "tokenizer"),
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

Adapter checkpoints
-------------------
A run of `train.py --init-from BASE --lora-rank r` trains LoRA adapters on a frozen base model
(gpt/model/electives/lora.py), and its checkpoint holds the adapters alone (`model/...lora_a`, `model/...lora_b`)
and the optimizer's state for them. Its meta names the base it needs:

    "lora": {"base": the base checkpoint's folder, "base_sha256": the sha256 of its ckpt.npz,
             "rank": r, "alpha": α, "targets": ["c_attn", "c_proj"]}

and keeps the base's config and tokenizer, so that `load` checks the adapters' names and shapes
without the base. `load_model(out_dir)` gives a model to generate from, whatever the checkpoint
holds: a full model, or the base with the adapters added (`merge=True`: folded into the weights).
The base is found by its folder and recognized by its hash: a base that is gone, or that changed
since the adapters were trained on it (trained further, say), is a CheckpointError that says so,
because adapters fit only the weights they were trained on.
"""
import contextlib
import hashlib
import json
import os
import struct
import tempfile
import zipfile
import zlib
from pathlib import Path

import numpy as np

import microtensor as mt
from microtensor import InputError, InputTypeError, MicrotensorError

from gpt.text.electives.bpe import BytePairTokenizer
from gpt.text.data import CharTokenizer
from gpt.model.transformer import GPT, GPTConfig
from gpt.model.electives.lora import add_lora, generator_left_alone, load_lora_state_dict, lora_state_dict, merge_lora

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


def save(out_dir, model, optimizer, meta, parameters=None):
    """Write model, optimizer and meta to out_dir/ckpt.npz atomically (see the module docstring);
    returns its path. Raises CheckpointSaveError if the disk refuses, leaving the file as it was.
    parameters: the arrays to save under model/ (an adapter checkpoint passes lora_state_dict(model));
    by default model.state_dict(), every parameter. meta: JSON values; numpy numbers and arrays in
    it (a loss kept as np.float32, a step as np.int64) are stored as the plain numbers and lists."""
    path = path_in(out_dir)
    parameters = model.state_dict() if parameters is None else parameters
    arrays = {f"model/{name}": value for name, value in parameters.items()}
    arrays.update({f"optim/{key}": np.asarray(value) for key, value in optimizer.state_dict().items()})
    meta = plain_json(meta, "meta")
    arrays["meta"] = np.array(json.dumps({"format": FORMAT, "format_version": FORMAT_VERSION, **meta}))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda tmp: np.savez(tmp, **arrays))
    except OSError as error:
        raise CheckpointSaveError(path, error) from None
    return path


def plain_json(value, where):
    """value with numpy numbers as Python's (np.int64(3) -> 3) and numpy arrays as lists, so that
    json.dumps takes it; any other type that JSON has no value for is an InputTypeError naming
    where it is (e.g. meta['best_val'])."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, np.ndarray):
        return plain_json(value.tolist(), where)
    if isinstance(value, (list, tuple)):
        return [plain_json(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        plain = {}
        for key, item in value.items():
            key = key.item() if isinstance(key, np.generic) else key
            if not (key is None or isinstance(key, (str, bool, int, float))):
                raise InputTypeError(f"checkpoint.save: {where} has the key {key!r} ({type(key).__name__}); expected str keys")
            plain[key] = plain_json(item, f"{where}[{key!r}]")
        return plain
    raise InputTypeError(
        f"checkpoint.save: {where} is {value!r:.80} ({type(value).__name__}); expected a JSON value "
        "(str, int, float, bool, None, or lists and dicts of them; numpy numbers and arrays are converted)"
    )


def write_atomically(path, write, prefix=TEMP_PREFIX):
    """Call write(temporary path) for a file in path's folder, fsync it, rename it over path, fsync
    the folder. On any failure (or Ctrl-C) the temporary file is removed and path is left as it was.
    The file gets the mode any new file gets (0o666 minus the umask), not mkstemp's private 0o600,
    which the rename would otherwise keep."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{prefix}{os.getpid()}-", suffix=path.suffix)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, new_file_mode())
        _fsync(tmp, os.O_RDONLY)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if os.name == "posix":  # makes the rename itself durable; other systems cannot open a folder
        _fsync(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    return path


def new_file_mode():
    """The mode open() gives a new file: 0o666 minus the process's umask (0o644 under the usual 0o022).
    The umask can only be read by setting it, so it is set and put back at once."""
    umask = os.umask(0o077)
    os.umask(umask)
    return 0o666 & ~umask


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
    module docstring). `GPTConfig(**meta["config"])` builds the model the state fits; for an adapter
    checkpoint (meta["lora"]), the state holds the adapters alone, and `load_model` adds its base."""
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
    if "lora" in meta:
        _check_model_state(path, model_state, config, lora=_check_lora_meta(path, meta["lora"]))
    else:
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
            f"{path} holds no meta entry, so it was not written by train.py (an export of gpt.checkpoints.convert? "
            f"import it with: python -m gpt.checkpoints.convert FILE FOLDER)"
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
    missing = [key for key in ("iteration", "config") if key not in meta]
    if "vocab" not in meta and "tokenizer" not in meta:
        missing.append("vocab (or tokenizer)")
    if missing:
        raise CheckpointError(f"{path}: its meta lacks {', '.join(missing)}")
    iteration = meta["iteration"]
    if type(iteration) is not int or iteration < 0:
        raise CheckpointError(f"{path}: its iteration is {iteration!r}, expected an integer >= 0")
    try:
        config = GPTConfig(**meta["config"])
    except (TypeError, ValueError) as error:  # unknown or missing fields, or values GPTConfig refuses
        raise CheckpointError(f"{path}: its config is not a valid GPTConfig: {error}") from None
    tokenizer_of(meta, path, config)  # raises CheckpointError when it does not fit
    return config


def tokenizer_meta(tokenizer):
    """What a checkpoint's meta stores of a tokenizer: a character tokenizer's characters under
    "vocab" (as every checkpoint so far), a byte-level BPE's merges under "tokenizer"."""
    if isinstance(tokenizer, BytePairTokenizer):
        return {"tokenizer": tokenizer.to_dict()}
    return {"vocab": tokenizer.chars}


def tokenizer_of(meta, path, config):
    """The tokenizer a checkpoint's meta describes, checked against its config's vocab_size."""
    if "tokenizer" in meta:
        try:
            tokenizer = BytePairTokenizer.from_dict(meta["tokenizer"])
        except (InputError, InputTypeError) as error:
            raise CheckpointError(f"{path}: its tokenizer cannot be read: {error}") from None
        if tokenizer.vocab_size != config.vocab_size:
            raise CheckpointError(
                f"{path}: its tokenizer has {tokenizer.vocab_size} tokens, but the config's vocab_size is {config.vocab_size}"
            )
        return tokenizer
    vocab = meta["vocab"]
    if not isinstance(vocab, str) or len(vocab) != config.vocab_size or len(set(vocab)) != len(vocab):
        raise CheckpointError(
            f"{path}: its vocab must be a string of vocab_size = {config.vocab_size} different characters, got {vocab!r:.80}"
        )
    return CharTokenizer(vocab)


def _check_model_state(path, state, config, lora=None):
    """The parameters must be exactly those of GPT(config) in one float dtype, and finite; with
    `lora` (an adapter checkpoint's settings), exactly the adapters that add_lora gives it."""
    dtypes = sorted({str(a.dtype) for a in state.values()})
    if dtypes not in (["float32"], ["float64"]):
        raise CheckpointError(f"{path}: expected every parameter in float32 or every one in float64, got {dtypes}")
    # The shapes come from a model built for the config; building one draws its initial weights, so
    # the global generator is put back as it was.
    with generator_left_alone():
        model = GPT(config, dtype=getattr(mt, dtypes[0]))
        if lora is None:
            expected = {name: p.shape for name, p in model.named_parameters()}
        else:
            try:
                add_lora(model, lora["rank"], lora["alpha"], lora["targets"])
            except (InputError, InputTypeError) as error:
                raise CheckpointError(f"{path}: its LoRA settings do not fit its own config: {error}") from None
            expected = {name: array.shape for name, array in lora_state_dict(model).items()}
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


# ================================================================================= adapters


def file_sha256(path):
    """The sha256 of a file's bytes (hex), read in blocks: how an adapter checkpoint recognizes its base."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def lora_meta(base_dir, rank, alpha, targets):
    """The "lora" record of an adapter checkpoint's meta: its base's folder (made absolute, so that
    the record holds wherever the program runs from) and hash, and the adapters' settings."""
    base = Path(base_dir).resolve()
    return {"base": str(base), "base_sha256": file_sha256(path_in(base)), "rank": rank, "alpha": alpha, "targets": list(targets)}


def _check_lora_meta(path, lora):
    """An adapter checkpoint's "lora" record, checked field by field; returned as it is."""
    if not isinstance(lora, dict):
        raise CheckpointError(f"{path}: its meta's lora entry is a JSON {type(lora).__name__}, expected an object")
    missing = [key for key in ("base", "base_sha256", "rank", "alpha", "targets") if key not in lora]
    if missing:
        raise CheckpointError(f"{path}: its meta's lora entry lacks {', '.join(missing)}")
    problems = []
    if not isinstance(lora["base"], str) or not lora["base"]:
        problems.append(f"base is {lora['base']!r}, expected the base checkpoint's folder")
    sha = lora["base_sha256"]
    if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        problems.append(f"base_sha256 is {sha!r:.80}, expected 64 hex digits")
    if type(lora["rank"]) is not int or lora["rank"] < 1:
        problems.append(f"rank is {lora['rank']!r}, expected an integer >= 1")
    alpha = lora["alpha"]
    if type(alpha) not in (int, float) or not (np.isfinite(alpha) and alpha > 0):
        problems.append(f"alpha is {alpha!r}, expected a finite number > 0")
    targets = lora["targets"]
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) and t for t in targets):
        problems.append(f"targets is {targets!r:.80}, expected a list of Linear layers' names")
    if problems:
        raise CheckpointError(f"{path}: its meta's lora entry does not fit: " + "; ".join(problems))
    return lora


def load_base(out_dir, meta):
    """(model state, meta) of the base checkpoint that the adapter checkpoint in out_dir (whose meta
    is `meta`) was trained on: found by the folder the meta names, and refused unless its file is
    the one the adapters were trained on (the same sha256), a full model, of the same config and
    tokenizer. Each refusal is a CheckpointError that names both files."""
    path, lora = path_in(out_dir), meta["lora"]
    base_dir = Path(lora["base"])
    base_path = path_in(base_dir)
    if not base_path.is_file():
        raise CheckpointError(
            f"{path} holds LoRA adapters for the base checkpoint {base_path}, which is missing: the adapters "
            "need the weights they were trained on; put the base back there"
        )
    try:
        sha = file_sha256(base_path)
    except OSError as error:
        raise CheckpointError(f"the base checkpoint {base_path} of {path} cannot be read: {error.strerror or error}") from None
    if sha != lora["base_sha256"]:
        raise CheckpointError(
            f"{path} holds LoRA adapters trained on {base_path}, which has changed since (its sha256 is "
            f"{sha[:12]}..., the adapters were trained on {lora['base_sha256'][:12]}...): adapters fit only the "
            "weights they were trained on; restore that base, or fine-tune again from this one"
        )
    try:
        base_state, _, base_meta = load(base_dir)
    except CheckpointError as error:
        raise CheckpointError(f"the base checkpoint of {path}: {error}") from None
    if "lora" in base_meta:
        raise CheckpointError(f"the base checkpoint {base_path} of {path} holds adapters itself, not a full model")
    if base_meta["config"] != meta["config"]:
        raise CheckpointError(f"{path}: its config {meta['config']} is not its base's ({base_path}): {base_meta['config']}")
    if tokenizer_meta(tokenizer_of(base_meta, base_path, GPTConfig(**base_meta["config"]))) != tokenizer_meta(
        tokenizer_of(meta, path, GPTConfig(**meta["config"]))
    ):
        raise CheckpointError(f"{path}: its tokenizer is not its base's ({base_path})")
    return base_state, base_meta


def load_model(out_dir, merge=False):
    """(model, tokenizer, meta) from the checkpoint in out_dir, ready to generate with:

        a full model's checkpoint   -> that GPT
        an adapter checkpoint       -> its base GPT with the adapters added (LoRALinear layers), or,
                                       with merge=True, a plain GPT with them folded into its weights

    meta is out_dir's own (an adapter checkpoint's names its base under meta["lora"]). Every check of
    `load` applies, and for adapters those of `load_base`. The global random generator is left as
    it was (building the model draws initial weights, which the checkpoint's then replace)."""
    model_state, _, meta = load(out_dir)
    path = path_in(out_dir)
    config = GPTConfig(**meta["config"])
    tokenizer = tokenizer_of(meta, path, config)
    dtype = getattr(mt, str(next(iter(model_state.values())).dtype))
    if "lora" not in meta:
        with generator_left_alone():
            model = GPT(config, dtype=dtype)
        model.load_state_dict(model_state)  # load checked every name and shape
        return model, tokenizer, meta
    base_state, _ = load_base(out_dir, meta)
    base_dtype = str(next(iter(base_state.values())).dtype)
    if base_dtype != str(dtype):
        raise CheckpointError(f"{path}: its adapters are {dtype}, its base's weights {base_dtype}; expected one dtype")
    lora = meta["lora"]
    with generator_left_alone():
        model = GPT(config, dtype=dtype)
        model.load_state_dict(base_state)
        add_lora(model, lora["rank"], lora["alpha"], lora["targets"])  # load checked that they fit the config
    load_lora_state_dict(model, model_state)
    return (merge_lora(model) if merge else model), tokenizer, meta
