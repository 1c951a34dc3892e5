"""Checkpoints as .npz files (no pickle): parameters, optimizer state, and a JSON record of the rest.

    model/<parameter name>   each parameter's values
    optim/<key>              the optimizer's state_dict()
    meta                     JSON: iteration, model config, training arguments, vocabulary,
                             best val loss, and the random generators' states

Written atomically: to a temporary file in the same folder, then renamed over the old one, so a
crash mid-write never leaves a broken checkpoint.
"""
import json
import os
import tempfile
from pathlib import Path

import numpy as np

FILENAME = "ckpt.npz"


class CheckpointError(Exception):
    """A checkpoint that is missing or does not fit; the message says what to do."""


def save(out_dir, model, optimizer, meta):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    arrays = {f"model/{name}": value for name, value in model.state_dict().items()}
    arrays.update({f"optim/{key}": np.asarray(value) for key, value in optimizer.state_dict().items()})
    arrays["meta"] = np.array(json.dumps(meta))
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".ckpt-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, out_dir / FILENAME)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out_dir / FILENAME


def load(out_dir):
    """(model state, optimizer state, meta) from out_dir's checkpoint."""
    path = Path(out_dir) / FILENAME
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}: run train.py first, or pass the --out-dir it wrote to")
    try:
        with np.load(path, allow_pickle=False) as archive:
            model_state = {k[len("model/") :]: archive[k] for k in archive.files if k.startswith("model/")}
            optim_state = {k[len("optim/") :]: archive[k] for k in archive.files if k.startswith("optim/")}
            meta = json.loads(str(archive["meta"]))
    except (OSError, ValueError, KeyError) as error:
        raise CheckpointError(f"{path} is not a readable microtensor checkpoint: {error}") from None
    return model_state, optim_state, meta
