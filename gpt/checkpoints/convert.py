"""Move a GPT between microtensor and PyTorch: export a checkpoint in nanoGPT's layout, import one back.

    python -m gpt.checkpoints.convert out/ model.safetensors      # export: train.py's checkpoint -> a file PyTorch loads
    python -m gpt.checkpoints.convert out/ model.npz              # the same as a numpy archive (no extra package)
    python -m gpt.checkpoints.convert model.safetensors out2/     # import: such a file -> out2/ckpt.npz
    python -m gpt.checkpoints.convert lora/ model.npz --merge-lora  # a LoRA fine-tuning: adapters folded into the base

The direction follows the first argument: a folder (holding train.py's ckpt.npz) is exported, a file is
imported. After an import, `generate.py --out-dir out2` samples from the model and `train.py
--out-dir out2 --resume` continues training it. docs/pytorch.md shows the PyTorch side: loading the
file into a model, training on one or several machines, saving a file to import back.

The exported file
-----------------
Tensors, by nanoGPT's names (microtensor's GPT already uses them, so no name changes):

    transformer.wte.weight            (V, C)       token embedding
    transformer.wpe.weight            (T, C)       learned positions (absent with pos="rope")
    transformer.h.{i}.ln_1.weight     (C,)         also ln_2, and .bias with bias=True
    transformer.h.{i}.attn.c_attn.weight  (3C, C)  Linear weights are (out, in): see below
    transformer.h.{i}.attn.c_proj.weight  (C, C)
    transformer.h.{i}.mlp.c_fc.weight     (F, C)
    transformer.h.{i}.mlp.c_up.weight     (F, C)   SwiGLU's second projection (microtensor's name)
    transformer.h.{i}.mlp.c_proj.weight   (C, F)
    transformer.ln_f.weight           (C,)
    lm_head.weight                    (V, C)       only when the head is untied
    mtp_heads.{k}.ln_1.weight         (C,)         multi-token prediction's extra heads (--mtp n: k = 0 .. n - 2,
    mtp_heads.{k}.mlp.c_fc.weight ... (F, C)       the head of the token k + 2 places ahead), microtensor's names;
                                                   torch_gpt.load_export leaves them out of its next-token model

A Linear layer computes y = x W + b in microtensor (row vectors, W is (in, out)) and y = x Wᵀ + b in
PyTorch (W is (out, in)), so every Linear weight is transposed on the way out and back on the way in;
the transpose is exact, so a round trip gives back the same bits. Embeddings are (rows, C) in both.
With RMSNorm the norm weights keep the names ln_1, ln_2, ln_f.

A tied head (logits = x @ wteᵀ) is one tensor in the model, which nanoGPT lists twice in its
state_dict (`lm_head.weight` is `transformer.wte.weight`). A safetensors file cannot hold one tensor
twice, so only `transformer.wte.weight` is stored and the metadata says so, as Hugging Face's files do:
`tied_weights` maps `lm_head.weight` to `transformer.wte.weight`. The loader ties them again.

Metadata (a dict of strings: safetensors allows nothing else; in a .npz it is the JSON object stored
under the key `__metadata__`):

    format                 "microtensor-gpt"
    format_version         "1"   (an importer refuses a newer version rather than guess)
    microtensor_version    the version that wrote the file
    config                 JSON of gpt.model.transformer.GPTConfig: the architecture and every option
    vocab                  JSON string of the characters, in id order (id i is vocab[i])
    tied_weights           JSON {"lm_head.weight": "transformer.wte.weight"}, or {} when untied
    linear_weight_layout   "(out_features, in_features)", so that a reader need not guess
    iteration              the training step the weights come from
    dtype                  "float32" or "float64"
    tensor_sha256          JSON {name: sha256 of the tensor's bytes as stored (little-endian, row-major)}

Import checks everything before it writes anything: the format and its version, the config, the
vocabulary, every name (none missing, none unexpected), every shape the config implies, the dtypes,
and that the values are finite. Each problem is named in one ConvertError, with the file's path.

A file must also be the bytes the export wrote. In a .safetensors file the header gives each tensor
its [begin, end) bytes in the payload: spans that overlap (two names reading the same bytes, one
weight lost) or run backwards are refused before anything is read. Then every tensor's sha256 must
be the one in tensor_sha256, so a flipped byte is an error, not a model with other logits. A file
without tensor_sha256 (written by other code) is imported with the other checks; code that changes
the weights and keeps an export's metadata must drop tensor_sha256, which describes the old ones.

Only what the format can hold is exported: a checkpoint of a byte-level BPE tokenizer (`train.py
--tokenizer bpe`) is refused, since the metadata carries a character vocabulary; an adapter
checkpoint of a LoRA fine-tuning is exported with --merge-lora, which folds the adapters into its
base's weights (the file then holds a plain GPT).
"""
import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

import microtensor as mt
from microtensor import MicrotensorError, nn

from . import checkpoint
from gpt.model.transformer import GPT, GPTConfig

FORMAT = "microtensor-gpt"
FORMAT_VERSION = 1
METADATA_KEY = "__metadata__"  # the .npz entry holding the metadata (no parameter has such a name)
SUFFIXES = (".safetensors", ".npz")
LINEAR_LAYOUT = "(out_features, in_features)"
TIED_HEAD = {"lm_head.weight": "transformer.wte.weight"}
# safetensors' dtype codes for the dtypes a GPT can hold; anything else (F16, BF16) is refused
SAFETENSORS_DTYPES = {"F32": np.dtype(np.float32), "F64": np.dtype(np.float64)}
DEFAULT_SEED = 1337  # train.py's default --seed: the random states an import starts from


class ConvertError(MicrotensorError):
    """A file or a folder that cannot be converted; the message names it and says what is wrong."""


# ================================================================================= the model's layout


def _model_for(config, dtype):
    """A GPT of this config, whose values are only placeholders: it tells which parameters exist,
    their shapes, and which are Linear weights. Building it draws its initial values from the
    global generator, whose state is put back, so that converting changes no one's random numbers."""
    state = mt.random.get_state()
    try:
        return GPT(config, dtype=dtype)
    finally:
        mt.random.set_state(state)


def linear_weight_names(model):
    """The names of the model's Linear weights: the parameters stored transposed in the file."""
    return {
        f"{module_name}.weight" if module_name else "weight"
        for module_name, module in model.named_modules()
        if isinstance(module, nn.Linear)
    }


def to_pytorch_layout(model_state, model):
    """{name: array} as microtensor holds it -> as PyTorch holds it (Linear weights (in, out) -> (out, in))."""
    linear = linear_weight_names(model)
    return {name: np.ascontiguousarray(a.T) if name in linear else np.ascontiguousarray(a) for name, a in model_state.items()}


def from_pytorch_layout(tensors, model):
    """The inverse of to_pytorch_layout: Linear weights (out, in) -> (in, out)."""
    return to_pytorch_layout(tensors, model)  # a transpose is its own inverse


def expected_shapes(model):
    """{name: shape} of every tensor an export of this model holds, in PyTorch's layout."""
    linear = linear_weight_names(model)
    return {name: p.shape[::-1] if name in linear else p.shape for name, p in model.named_parameters()}


# ================================================================================= export


def export_checkpoint(out_dir, path, force=False, merge_lora=False):
    """Write the checkpoint in out_dir (train.py's ckpt.npz) to `path`, a .safetensors or .npz file
    in nanoGPT's layout. Returns the path written. merge_lora: for the adapter checkpoint of a LoRA
    fine-tuning, fold the adapters into its base's weights (which it needs) and export that GPT."""
    path = Path(path)
    suffix = _suffix_of(path, "the export")
    _refuse_to_overwrite(path, force)
    if suffix == ".safetensors":
        safetensors = _safetensors("write", path)  # before any work: a missing package is said at once
    # checkpoint.load checks the file (CheckpointError names it if it is missing or broken), its meta,
    # and that its parameters are exactly a GPT of its config's, in one float dtype.
    model_state, _, meta = checkpoint.load(out_dir)
    source = checkpoint.path_in(out_dir)
    if "tokenizer" in meta:
        raise ConvertError(
            f"{source} was trained with a byte-level BPE tokenizer (train.py --tokenizer bpe); an export's metadata "
            "carries a character vocabulary only, so it cannot hold this model's tokenizer: export a run of --tokenizer char"
        )
    if "lora" in meta and not merge_lora:
        raise ConvertError(
            f"{source} holds the LoRA adapters of a fine-tuning, not a full model; an export holds a plain GPT: "
            "merge the adapters into the base's weights first with --merge-lora (export_checkpoint(..., merge_lora=True))"
        )
    if merge_lora and "lora" not in meta:
        raise ConvertError(f"--merge-lora: given with {source}, expected a LoRA fine-tuning's checkpoint (train.py --lora-rank): this one has no adapters to merge")
    config = GPTConfig(**meta["config"])
    if config.attention == "latent":
        raise ConvertError(
            f"{source} is a model of latent attention (train.py --attention latent); the PyTorch model the export is "
            "made for (gpt/checkpoints/torch_gpt.py) has standard attention only, so it could not read these weights: "
            "export a model of --attention standard or online"
        )
    if config.mixer == "ssm":
        raise ConvertError(
            f"{source} is a state-space model (train.py --mixer ssm); the export is read by nanoGPT's layout and "
            "gpt/checkpoints/torch_gpt.py, which have attention blocks only: an SSM cannot be exported to PyTorch"
        )
    vocab = meta["vocab"]
    if merge_lora:
        model = checkpoint.load_model(out_dir, merge=True)[0]  # its base, found and checked by its sha256
    else:
        model = _model_for(config, next(iter(model_state.values())).dtype)
        model.load_state_dict(model_state)
    tensors = to_pytorch_layout(model.state_dict(), model)
    dtype = next(iter(tensors.values())).dtype
    metadata = {
        "format": FORMAT,
        "format_version": str(FORMAT_VERSION),
        "microtensor_version": mt.__version__,
        "config": json.dumps(config.to_dict()),
        "vocab": json.dumps(vocab),
        "tied_weights": json.dumps(TIED_HEAD if config.tie_weights else {}),
        "linear_weight_layout": LINEAR_LAYOUT,
        "iteration": str(int(meta.get("iteration", 0))),
        "dtype": str(dtype),
        "tensor_sha256": json.dumps({name: tensor_sha256(array) for name, array in tensors.items()}),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if suffix == ".safetensors":
            _write_atomically(path, lambda tmp: safetensors.numpy.save_file(tensors, tmp, metadata=metadata))
        else:
            arrays = {**tensors, METADATA_KEY: np.array(json.dumps(metadata))}
            _write_atomically(path, lambda tmp: np.savez(tmp, **arrays))
    except OSError as error:  # a read-only folder, a full disk: path is left as it was
        reason = f"{error.strerror} ({error.filename})" if error.strerror else str(error)
        raise ConvertError(f"cannot write the export {path}: {reason}; expected a folder you can write to") from None
    return path


def tensor_sha256(array):
    """The sha256 (hex) of an array's bytes as a file stores them: little-endian, row-major."""
    little_endian = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return hashlib.sha256(little_endian.tobytes()).hexdigest()


# ================================================================================= import


def read_export(path):
    """(tensors in PyTorch's layout {name: array}, metadata {key: str}) from an exported file, after
    checking everything (see the module docstring). Raises ConvertError naming what is wrong."""
    path = Path(path)
    if not path.exists():
        raise ConvertError(f"{path}: no such file")
    if path.is_dir():
        raise ConvertError(f"{path} is a folder: to import, pass a .safetensors or .npz file made by an export")
    suffix = _suffix_of(path, "an export to import")
    metadata, specs, load_all = _open_safetensors(path) if suffix == ".safetensors" else _open_npz(path)
    config, _ = _check_metadata(path, metadata)
    problems = []
    tied = json.loads(metadata["tied_weights"])
    if tied not in ({}, TIED_HEAD) or bool(tied) != config.tie_weights:
        problems.append(
            f"tied_weights is {metadata['tied_weights']} but the config has tie_weights={config.tie_weights} "
            f"(expected {json.dumps(TIED_HEAD if config.tie_weights else {})})"
        )
    dtypes = {dtype for _, dtype in specs.values()}
    unusable = sorted({str(d) for d in dtypes if d not in (np.float32, np.float64)})
    if unusable:
        problems.append(
            f"tensors of dtype {', '.join(unusable)}; expected float32 or float64 "
            "(in PyTorch, save model.float().state_dict())"
        )
    elif len(dtypes) > 1:
        problems.append(f"tensors of several dtypes ({', '.join(sorted(map(str, dtypes)))}); expected one")
    dtype = next(iter(dtypes)) if len(dtypes) == 1 and not unusable else np.dtype(np.float32)
    model = _model_for(config, dtype)
    expected = expected_shapes(model)
    optional = set(TIED_HEAD) if config.tie_weights else set()  # nanoGPT's state_dict lists the tied head too
    missing = [name for name in expected if name not in specs]
    unexpected = [name for name in specs if name not in expected and name not in optional]
    if missing:
        problems.append(f"missing tensors: {', '.join(missing)}")
    if unexpected:
        hint = _prefix_hint(unexpected)
        problems.append(f"unexpected tensors (not in a GPT of this config): {', '.join(unexpected)}{hint}")
    for name, (shape, _) in specs.items():
        want = expected.get(name) or (expected["transformer.wte.weight"] if name in optional else None)
        if want is not None and tuple(shape) != tuple(want):
            problems.append(f"{name} has shape {tuple(shape)}, the config implies {tuple(want)}")
    if problems:
        raise ConvertError(f"{path} cannot be imported:\n  " + "\n  ".join(problems))
    tensors = load_all()
    bad = [name for name, array in tensors.items() if not np.isfinite(array).all()]
    if bad:
        raise ConvertError(f"{path} cannot be imported: non-finite values (inf or nan) in {', '.join(bad)}")
    _check_sha256(path, metadata, tensors)
    for name in optional & tensors.keys():
        if not np.array_equal(tensors[name], tensors[TIED_HEAD[name]]):
            raise ConvertError(
                f"{path} cannot be imported: the config ties {name} to {TIED_HEAD[name]}, but the file holds "
                "a different lm_head.weight (export with tie_weights=False in the config if the head is separate)"
            )
        del tensors[name]
    return tensors, metadata


def import_checkpoint(path, out_dir, force=False, dtype="float32", seed=DEFAULT_SEED):
    """Write the exported file `path` as a checkpoint out_dir/ckpt.npz that generate.py samples
    from and `train.py --resume` continues. Returns the checkpoint's path.

    dtype: the parameters' dtype in the checkpoint ("float32", what train.py and generate.py build;
    "float64" or None keeps a float64 file exact; None keeps the file's). The checkpoint holds no
    optimizer state (the file carries none): a resumed run starts AdamW's moments at zero. Its
    random generators start from `seed`, as a new train.py run with --seed does."""
    if dtype not in (None, "float32", "float64"):
        raise ConvertError(f"dtype must be float32, float64 or None (the file's), got {dtype!r}")
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ConvertError(f"seed (--seed) must be an integer >= 0, got {seed!r}")
    tensors, metadata = read_export(path)  # first, so that a wrong file is named before a wrong folder
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConvertError(f"{out_dir} is a file: the import writes a folder holding {checkpoint.FILENAME}")
    _refuse_to_overwrite(out_dir / checkpoint.FILENAME, force)
    config = GPTConfig(**json.loads(metadata["config"]))
    dtype = np.dtype(dtype) if dtype is not None else next(iter(tensors.values())).dtype
    model = _model_for(config, dtype)
    state = {name: array.astype(dtype, copy=False) for name, array in from_pytorch_layout(tensors, model).items()}
    model.load_state_dict(state)  # read_export checked names and shapes: this cannot fail
    fresh = np.random.default_rng(seed).bit_generator.state  # what train.py starts a run from
    meta = {
        "iteration": int(metadata.get("iteration", "0")),
        "config": config.to_dict(),
        "vocab": json.loads(metadata["vocab"]),
        "best_val": None,
        "batch_rng": fresh,
        "global_rng": fresh,
        "imported_from": str(path),
    }
    return checkpoint.save(out_dir, model, _NoOptimizerState(), meta)


class _NoOptimizerState:
    """What checkpoint.save asks of an optimizer, for a checkpoint that has none: an empty state."""

    def state_dict(self):
        return {}


# ================================================================================= reading and checking files


def _check_sha256(path, metadata, tensors):
    """Every tensor that the metadata's tensor_sha256 names must be in the file with those bytes
    (a file written by other code, without tensor_sha256, is not checked)."""
    if "tensor_sha256" not in metadata:
        return
    try:
        recorded = json.loads(metadata["tensor_sha256"])
    except ValueError as error:
        raise ConvertError(f"{path}: its tensor_sha256 is not JSON ({error})") from None
    if not isinstance(recorded, dict) or not all(isinstance(v, str) for v in recorded.values()):
        raise ConvertError(f"{path}: its tensor_sha256 must be a JSON object {{name: sha256 hex digest}}")
    absent = [name for name in recorded if name not in tensors]
    changed = [name for name in recorded if name in tensors and tensor_sha256(tensors[name]) != recorded[name]]
    problems = [f"the bytes of {', '.join(changed)} are not those the export wrote (their sha256 differ)"] if changed else []
    problems += [f"tensor_sha256 names {', '.join(absent)}, which the file does not hold"] if absent else []
    if problems:
        raise ConvertError(
            f"{path} cannot be imported: {'; '.join(problems)}. The file is damaged (export it again, or restore a copy), or code "
            "changed its weights and kept the export's metadata: such code must drop tensor_sha256"
        )


def _check_safetensors_layout(path):
    """Read a .safetensors header (8 bytes: its length, then JSON) and refuse tensors whose bytes
    overlap, run backwards or lie outside the file, and names listed twice: with any of these, a
    reader would give one weight another's values and nothing would say so."""
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            file_size = path.stat().st_size
            if file_size < 8 or size > file_size - 8:
                raise ConvertError(f"{path} is not a readable safetensors file: its header length {size} does not fit in its {file_size} bytes")
            text = f.read(size)
    except OSError as error:
        raise ConvertError(f"{path} cannot be read: {error.strerror or error}") from None
    try:
        header = json.loads(text, object_pairs_hook=_refuse_repeated_names)
    except _RepeatedNames as repeated:
        raise ConvertError(f"{path}: its header lists {', '.join(repeated.names)} more than once; expected each tensor once") from None
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ConvertError(f"{path} is not a readable safetensors file: its header is not JSON ({error})") from None
    if not isinstance(header, dict):
        raise ConvertError(f"{path} is not a readable safetensors file: its header is not a JSON object")
    payload = file_size - 8 - size
    spans, problems = [], []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
            problems.append(f"{name} has data_offsets {offsets!r}, expected [begin, end]")
        elif not 0 <= offsets[0] <= offsets[1] <= payload:
            problems.append(f"{name} has data_offsets {offsets}, expected 0 <= begin <= end <= {payload} (the payload's bytes)")
        else:
            spans.append((offsets[0], offsets[1], name))
    spans.sort()
    for (_, end, before), (begin, _, name) in zip(spans, spans[1:]):
        if begin < end:
            problems.append(f"{name} begins at byte {begin}, inside {before} (which ends at {end})")
    if problems:
        raise ConvertError(f"{path} cannot be imported: its tensors' bytes must lie one after another: " + "; ".join(problems))


class _RepeatedNames(Exception):
    def __init__(self, names):
        self.names = names


def _refuse_repeated_names(pairs):
    """A JSON object as a dict; a name given twice (json.loads would keep the last) raises _RepeatedNames."""
    seen, repeated = set(), []
    for key, _ in pairs:
        if key in seen:
            repeated.append(key)
        seen.add(key)
    if repeated:
        raise _RepeatedNames(repeated)
    return dict(pairs)


def _open_safetensors(path):
    """(metadata, {name: (shape, dtype)}, load_all() -> {name: array}) of a .safetensors file; the
    shapes and dtypes come from the header, so a file is checked before its tensors are read."""
    safetensors = _safetensors("read", path)
    _check_safetensors_layout(path)
    try:
        with safetensors.safe_open(str(path), framework="numpy") as f:
            metadata = f.metadata() or {}
            codes = {name: (tuple(f.get_slice(name).get_shape()), f.get_slice(name).get_dtype()) for name in f.keys()}
    except (OSError, safetensors.SafetensorError) as error:
        raise ConvertError(f"{path} is not a readable safetensors file: {error}") from None
    specs = {name: (shape, SAFETENSORS_DTYPES.get(code, code)) for name, (shape, code) in codes.items()}

    def load_all():
        return safetensors.numpy.load_file(str(path))

    return metadata, specs, load_all


def _open_npz(path):
    """(metadata, {name: (shape, dtype)}, load_all() -> {name: array}) of a .npz file."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except checkpoint.READ_ERRORS as error:  # a damaged zip: BadZipFile, a bad CRC, zlib.error, ...
        raise ConvertError(f"{path} is not a readable .npz file (truncated or damaged?): {type(error).__name__}: {error}") from None
    # numpy gives the bytes of a member that is not a .npy array as they are
    not_arrays = [name for name, value in arrays.items() if not isinstance(value, np.ndarray)]
    if not_arrays:
        raise ConvertError(f"{path} holds members that are not arrays: {', '.join(not_arrays)}; expected only .npy arrays")
    if METADATA_KEY not in arrays:
        if "meta" in arrays and any(name.startswith("model/") for name in arrays):
            raise ConvertError(
                f"{path} is a train.py checkpoint, not an export: export its folder first "
                f"(python -m gpt.checkpoints.convert {path.parent} model.npz)"
            )
        raise ConvertError(f"{path} has no {METADATA_KEY} entry: it was not written by an export (gpt.checkpoints.convert)")
    try:
        metadata = json.loads(str(arrays.pop(METADATA_KEY)))
    except ValueError as error:
        raise ConvertError(f"{path}: its {METADATA_KEY} entry is not JSON ({error})") from None
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ConvertError(f"{path}: its {METADATA_KEY} entry must be a JSON object of strings")
    specs = {name: (a.shape, a.dtype) for name, a in arrays.items()}
    return metadata, specs, lambda: arrays


def _check_metadata(path, metadata):
    """The GPTConfig and the vocabulary of a file's metadata, after checking every key."""
    if metadata.get("format") != FORMAT:
        raise ConvertError(
            f"{path}: its metadata has format {metadata.get('format')!r}, expected {FORMAT!r}; "
            "only files written by an export (gpt.checkpoints.convert, or code that copies its metadata) can be imported"
        )
    try:
        version = int(metadata.get("format_version", ""))
    except ValueError:
        raise ConvertError(f"{path}: format_version {metadata.get('format_version')!r} is not an integer") from None
    if version > FORMAT_VERSION:
        raise ConvertError(
            f"{path} is in format version {version}, written by microtensor {metadata.get('microtensor_version', '?')}; "
            f"this microtensor ({mt.__version__}) reads version {FORMAT_VERSION}: upgrade microtensor"
        )
    if version < 1:
        raise ConvertError(f"{path}: format_version {version} does not exist (the first is 1)")
    missing = [key for key in ("config", "vocab", "tied_weights", "linear_weight_layout") if key not in metadata]
    if missing:
        raise ConvertError(f"{path}: its metadata lacks {', '.join(missing)}")
    if metadata["linear_weight_layout"] != LINEAR_LAYOUT:
        raise ConvertError(
            f"{path}: linear_weight_layout is {metadata['linear_weight_layout']!r}, expected {LINEAR_LAYOUT!r} (PyTorch's)"
        )
    try:
        config = GPTConfig(**json.loads(metadata["config"]))
    except (ValueError, TypeError) as error:  # JSONDecodeError is a ValueError; TypeError: unknown or missing fields
        raise ConvertError(f"{path}: its config is not a valid GPTConfig: {error}") from None
    try:
        vocab = json.loads(metadata["vocab"])
        json.loads(metadata["tied_weights"])
        iteration = int(metadata.get("iteration", "0"))
    except ValueError as error:
        raise ConvertError(f"{path}: its vocab, tied_weights or iteration cannot be read: {error}") from None
    if not isinstance(vocab, str) or len(vocab) != config.vocab_size or len(set(vocab)) != len(vocab):
        raise ConvertError(
            f"{path}: vocab must be a string of {config.vocab_size} different characters (the config's vocab_size), "
            f"got {vocab!r:.80}"
        )
    if iteration < 0:
        raise ConvertError(f"{path}: iteration must be >= 0, got {iteration}")
    return config, vocab


def _prefix_hint(names):
    """A hint when every unexpected name has the prefix a PyTorch wrapper adds."""
    for prefix, fix in (("module.", "save ddp_model.module.state_dict()"), ("_orig_mod.", "save the model before torch.compile")):
        if all(name.startswith(prefix) for name in names):
            return f" (they start with {prefix!r}: {fix})"
    return ""


def _suffix_of(path, what):
    if path.suffix not in SUFFIXES:
        raise ConvertError(f"{path}: {what} must be a .safetensors or .npz file, got {path.suffix or 'no suffix'!r}")
    return path.suffix


def _refuse_to_overwrite(path, force):
    if path.is_dir():
        raise ConvertError(f"{path} is a folder, not a file")
    if path.exists() and not force:
        raise ConvertError(f"{path} exists; pass --force to overwrite it")


def _safetensors(verb, path):
    """The safetensors package (an optional extra), or a ConvertError saying how to do without it."""
    try:
        import safetensors
        import safetensors.numpy
    except ImportError:
        raise ConvertError(
            f"to {verb} {path}, install the safetensors package (pip install 'microtensor[safetensors]'), "
            "or use a .npz file, which needs nothing more"
        ) from None
    return safetensors


def _write_atomically(path, write):
    """write(temporary path) in path's folder, then fsync and rename over path: a crash never leaves
    half a file (the same writer as checkpoints', with its own prefix)."""
    checkpoint.write_atomically(path, write, prefix=".convert-")


# ================================================================================= command line


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows the defaults, and the description and examples as written (line by line)."""


def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m gpt.checkpoints.convert",
        description=(
            "Export a train.py checkpoint to nanoGPT's layout for PyTorch, or import such a file back as a\n"
            "checkpoint. The direction follows SOURCE: a folder is exported, a file is imported."
        ),
        epilog=(
            "examples:\n"
            "  python -m gpt.checkpoints.convert out/ model.safetensors   export (pip install safetensors for this format)\n"
            "  python -m gpt.checkpoints.convert out/ model.npz           export to a numpy archive (nothing more needed)\n"
            "  python -m gpt.checkpoints.convert model.safetensors out2/  import, then: python generate.py --out-dir out2\n"
            "                                                    or: python train.py --out-dir out2 --resume ...\n"
            "  python -m gpt.checkpoints.convert lora/ model.npz --merge-lora   export a LoRA fine-tuning, adapters merged\n"
            "docs/pytorch.md shows how to load the file into PyTorch and train it there, also with DDP."
        ),
        formatter_class=_HelpFormatter,
    )
    p.add_argument("source", help="a folder holding ckpt.npz (export), or a .safetensors/.npz export (import)")
    p.add_argument("dest", help="the .safetensors or .npz file to write (export), or the folder for ckpt.npz (import)")
    p.add_argument("--force", action="store_true", help="overwrite the file or checkpoint if it exists")
    p.add_argument("--merge-lora", action="store_true", help="export: for a LoRA fine-tuning's checkpoint, fold the adapters into its base's weights (an export holds a plain GPT)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="import: the checkpoint's dtype (train.py and generate.py use float32)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="import: the seed of the checkpoint's random states (batches, dropout)")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    source, dest = Path(args.source), Path(args.dest)
    try:
        if source.is_dir():
            written = export_checkpoint(source, dest, force=args.force, merge_lora=args.merge_lora)
            print(f"exported {source / checkpoint.FILENAME} to {written} (nanoGPT's layout: see docs/pytorch.md)")
        elif args.merge_lora and source.exists():
            raise ConvertError(f"--merge-lora: given with the file {source}, expected the folder of a LoRA fine-tuning's checkpoint to export")
        elif source.exists():
            written = import_checkpoint(source, dest, force=args.force, dtype=args.dtype, seed=args.seed)
            print(f"imported {source} to {written}: sample with generate.py --out-dir {dest}, train on with train.py --out-dir {dest} --resume")
        else:
            raise ConvertError(f"{source}: no such file or folder")
    except MicrotensorError as error:  # ConvertError, CheckpointError, or a model's own check
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
