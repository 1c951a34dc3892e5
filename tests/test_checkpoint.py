"""gpt/checkpoints/checkpoint.py: saves that never lose or corrupt work, loads that never trust the file.

The central test kills a process that saves in a loop at random moments (SIGKILL: no handler, no
cleanup runs) and loads what is left: it must always be the last checkpoint the writer finished or
the one it was writing, complete; the temporary files the kills left must go at the next start.
"""
import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

import microtensor as mt
from microtensor import optim
from microtensor.errors import MicrotensorError
from helpers import rewrite_checkpoint as rewrite
from gpt.checkpoints import checkpoint
from gpt.model.transformer import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[1]
CONFIG = GPTConfig(vocab_size=5, block_size=8, n_layer=1, n_head=2, n_embd=8)
VOCAB = "abcde"


def save_tiny(folder, iteration=3, dtype=mt.float32, **meta):
    mt.manual_seed(iteration)
    model = GPT(CONFIG, dtype=dtype)
    checkpoint.save(folder, model, optim.AdamW(model.parameters()), {"iteration": iteration, "config": CONFIG.to_dict(), "vocab": VOCAB, **meta})
    return model


def change_meta(**fields):
    def change(arrays):
        meta = json.loads(str(arrays["meta"]))
        meta.update(fields)
        arrays["meta"] = np.array(json.dumps({k: v for k, v in meta.items() if v is not DROP}))

    return change


DROP = object()


def test_round_trip_gives_identical_logits_and_leaves_no_temporary_file(tmp_path):
    model = save_tiny(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.npz"]
    model_state, optim_state, meta = checkpoint.load(tmp_path)
    assert meta["format"] == checkpoint.FORMAT and meta["format_version"] == checkpoint.FORMAT_VERSION
    restored = GPT(GPTConfig(**meta["config"]))
    restored.load_state_dict(model_state)
    idx = mt.tensor(np.array([[1, 2, 3, 4]]))
    np.testing.assert_array_equal(model(idx)[0].numpy(), restored(idx)[0].numpy())


@pytest.mark.skipif(os.name != "posix", reason="file modes and the umask are POSIX's")
@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)], ids=["022", "027", "002"])
def test_a_checkpoint_gets_the_mode_of_a_new_file(tmp_path, umask, mode):
    """0o666 minus the umask, as any file a program creates (before: mkstemp's 0o600, kept by the rename)."""
    previous = os.umask(umask)
    try:
        save_tiny(tmp_path)
        save_tiny(tmp_path, iteration=4)  # over an existing checkpoint as well
    finally:
        os.umask(previous)
    assert (checkpoint.path_in(tmp_path).stat().st_mode & 0o777) == mode


def test_loading_leaves_the_global_random_generator_alone(tmp_path):
    save_tiny(tmp_path)
    mt.manual_seed(5)
    before = mt.random.get_state()
    checkpoint.load(tmp_path)  # builds a GPT to know the shapes: its initialization must not count
    assert mt.random.get_state() == before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="names file descriptors through /proc/self/fd")
def test_the_file_is_fsynced_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    calls = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append(("replace", str(b))), real_replace(a, b))[1])
    save_tiny(tmp_path)
    folder = str(tmp_path.resolve())
    assert [kind for kind, _ in calls] == ["fsync", "replace", "fsync"]
    assert Path(calls[0][1]).name.startswith(f"{checkpoint.TEMP_PREFIX}{os.getpid()}-")  # the temporary file
    assert calls[1][1] == str(tmp_path / checkpoint.FILENAME) and calls[2][1] == folder


@pytest.mark.parametrize("failing", ["write", "fsync", "rename"])
def test_a_failed_save_keeps_the_previous_checkpoint_and_no_temporary_file(tmp_path, monkeypatch, failing):
    save_tiny(tmp_path, iteration=3)
    before = checkpoint.path_in(tmp_path).read_bytes()

    def full_disk(target, **arrays):  # writes part of the file first, as a full disk does
        Path(target).write_bytes(b"PK\x03\x04" + bytes(100))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))

    def broken(*args):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    if failing == "write":
        monkeypatch.setattr(checkpoint.np, "savez", full_disk)
    elif failing == "fsync":
        monkeypatch.setattr(os, "fsync", broken)
    else:
        monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(checkpoint.CheckpointSaveError, match="could not save the checkpoint .*ckpt.npz: (No space|Input/output)") as error:
        save_tiny(tmp_path, iteration=4)
    assert isinstance(error.value, MicrotensorError) and error.value.path == checkpoint.path_in(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.npz"]
    assert checkpoint.path_in(tmp_path).read_bytes() == before


def test_ctrl_c_during_a_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    save_tiny(tmp_path, iteration=3)

    def interrupted(target, **arrays):
        Path(target).write_bytes(b"PK\x03\x04")
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.np, "savez", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_tiny(tmp_path, iteration=4)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.npz"]
    assert checkpoint.load(tmp_path)[2]["iteration"] == 3


# ================================================================================= killed writers

WRITER = r"""
import sys
import numpy as np
import microtensor as mt
from gpt.checkpoints import checkpoint
from gpt.model.transformer import GPT, GPTConfig

out_dir = sys.argv[1]
config = GPTConfig(vocab_size=5, block_size=64, n_layer=2, n_head=2, n_embd=64)
model = GPT(config)


class Moments:  # an optimizer state as large as AdamW's, so that a save takes a while
    def state_dict(self):
        return {f"param.{i}.m": np.full(p.shape, i, np.float32) for i, (_, p) in enumerate(model.named_parameters())}


step = int(sys.argv[2])
print("ready", flush=True)
while True:
    step += 1
    for _, p in model.named_parameters():
        p.data[...] = step  # every value says which save wrote it
    checkpoint.save(out_dir, model, Moments(), {"iteration": step, "config": config.to_dict(), "vocab": "abcde"})
    print(step, flush=True)
"""


@pytest.mark.skipif(os.name != "posix", reason="SIGKILL")
def test_a_writer_killed_at_random_moments_leaves_a_whole_checkpoint(tmp_path):
    """Rounds of: start the writer, let it save for a random while, SIGKILL it, load. The loaded
    step must be the last one the writer reported finished, or the next (killed after its rename,
    before its print); never an error. The next start removes the temporary files the kills left."""
    rng = random.Random(12)
    step, stale_seen, deadline = 0, 0, time.monotonic() + 25
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rounds = 0
    while rounds < 6 and time.monotonic() < deadline:
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), str(step)], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT
        )
        try:
            assert writer.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.05, 0.6))
        finally:
            writer.send_signal(signal.SIGKILL)
            finished = [int(line) for line in writer.stdout.read().split()]
            writer.wait()
        rounds += 1
        last = finished[-1] if finished else step
        if checkpoint.path_in(tmp_path).exists():
            model_state, optim_state, meta = checkpoint.load(tmp_path)
            assert meta["iteration"] in (last, last + 1), (meta["iteration"], last)
            for name, values in model_state.items():
                assert (values == meta["iteration"]).all(), name  # all of one save, none of another
            step = meta["iteration"]
        else:
            assert last == 0  # killed before its first save finished
        leftovers = list(tmp_path.glob(f"{checkpoint.TEMP_PREFIX}*"))
        stale_seen += len(leftovers)
        removed = checkpoint.prepare_out_dir(tmp_path)  # what the next train.py start does
        assert sorted(removed) == sorted(leftovers)
        assert [p.name for p in tmp_path.iterdir()] == (["ckpt.npz"] if step else [])
    assert rounds >= 3
    assert step > 0
    assert stale_seen > 0, "no kill landed inside a save: the test tested nothing"


def test_only_stale_temporary_files_of_ours_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    files = {
        f"{checkpoint.TEMP_PREFIX}{dead_pid}-abc.npz": False,  # its writer is gone: stale
        f"{checkpoint.TEMP_PREFIX}x1y2z3.npz": False,  # written by an older version, without a pid
        f"{checkpoint.TEMP_PREFIX}{os.getppid()}-live.npz": True,  # a save in progress of a live process
        "notes.txt": True,  # not ours
        "ckpt-backup.npz": True,
    }
    for name in files:
        (tmp_path / name).write_bytes(b"x")
    checkpoint.prepare_out_dir(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {name for name, kept in files.items() if kept}


def test_an_out_dir_that_cannot_hold_a_checkpoint_is_refused(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    with pytest.raises(checkpoint.CheckpointError, match="is a file; expected a folder"):
        checkpoint.prepare_out_dir(tmp_path / "file")
    with pytest.raises(checkpoint.CheckpointError, match="cannot write a checkpoint in .*: Not a directory"):
        checkpoint.prepare_out_dir(tmp_path / "file" / "out")
    if sys.platform.startswith("linux"):
        with pytest.raises(checkpoint.CheckpointError, match="cannot write a checkpoint in /proc/"):
            checkpoint.prepare_out_dir("/proc/microtensor-test/out")  # refused even to root

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(checkpoint.tempfile, "mkstemp", read_only)
    with pytest.raises(checkpoint.CheckpointError, match="Read-only file system; expected a folder you can write to"):
        checkpoint.prepare_out_dir(tmp_path / "out")


# ================================================================================= damaged files


def test_every_truncation_and_random_damage_is_a_checkpoint_error_or_the_same_checkpoint(tmp_path):
    """Damage found this way (a RuntimeError for a flipped 'encrypted' bit, NotImplementedError for a
    compression method) is what checkpoint.READ_ERRORS lists."""
    save_tiny(tmp_path)
    path = checkpoint.path_in(tmp_path)
    good = path.read_bytes()
    original = checkpoint.load(tmp_path)
    rng = random.Random(0)
    damaged = [good[:n] for n in range(0, len(good), 37)]
    for _ in range(600):
        data = bytearray(good)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        damaged.append(bytes(data))
    outcomes = {"error": 0, "same": 0}
    for data in damaged:
        path.write_bytes(data)
        try:
            model_state, optim_state, meta = checkpoint.load(tmp_path)
        except checkpoint.CheckpointError as error:
            assert str(path) in str(error)
            outcomes["error"] += 1
            continue
        # bytes the zip format does not check (a timestamp, say) may change: the content may not
        assert meta == original[2]
        for loaded, saved in zip((model_state, optim_state), original[:2], strict=True):
            assert loaded.keys() == saved.keys() and all(np.array_equal(loaded[k], saved[k]) for k in saved)
        outcomes["same"] += 1
    assert outcomes["error"] > 0.9 * len(damaged)


class Payload:
    """Unpickling this would create a file: the proof that code in a checkpoint ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda a: a.pop("meta"), "holds no meta entry"),
        (lambda a: a.update(meta=np.array("{not json")), "meta entry is not valid JSON"),
        (lambda a: a.update(meta=np.array("[1, 2]")), "meta entry is a JSON list, expected an object"),
        (lambda a: a.update(meta=np.arange(3)), "meta entry is int64 of shape"),
        (change_meta(format_version=2), "checkpoint format version 2; this microtensor .* reads version 1"),
        (change_meta(format_version="1"), "format_version is '1', expected an integer"),
        (change_meta(format="something-else"), "format 'something-else'"),
        (change_meta(vocab=DROP), "its meta lacks vocab"),
        (change_meta(vocab="abc"), "vocab must be a string of vocab_size = 5 different characters"),
        (change_meta(vocab="aabcd"), "vocab must be a string of vocab_size = 5 different characters"),
        (change_meta(iteration=-1), "iteration is -1, expected an integer >= 0"),
        (change_meta(iteration="3"), "iteration is '3'"),
        (change_meta(iteration=True), "iteration is True"),
        (change_meta(config={**CONFIG.to_dict(), "n_embd": 9}), "config is not a valid GPTConfig.*divisible"),
        (change_meta(config={**CONFIG.to_dict(), "heads": 2}), "config is not a valid GPTConfig.*heads"),
        (change_meta(config=[1, 2]), "config is not a valid GPTConfig"),
        (change_meta(config={**CONFIG.to_dict(), "n_layer": 2}), "missing parameters: transformer.h.1"),
        (lambda a: a.update({"model/transformer.wte.weight": np.zeros((5, 4), np.float32)}), r"wte.weight has shape \(5, 4\), the config implies \(5, 8\)"),
        (lambda a: a.pop("model/transformer.ln_f.weight"), "missing parameters: transformer.ln_f.weight"),
        (lambda a: a.update({"model/extra.weight": np.zeros(3, np.float32)}), "unexpected parameters: extra.weight"),
        (lambda a: a.update(stray=np.zeros(3)), "entries a checkpoint does not have: stray"),
        (lambda a: a["model/transformer.wpe.weight"].__setitem__((0, 0), np.nan), "non-finite values .* transformer.wpe.weight"),
        (lambda a: a.update({"model/transformer.wte.weight": np.zeros((5, 8), np.int64)}), r"float32 or every one in float64, got \['float32', 'int64'\]"),
        (lambda a: a.update({k: v.astype(np.float16) for k, v in a.items() if k.startswith("model/")}), r"got \['float16'\]"),
    ],
)  # fmt: skip
def test_a_checkpoint_that_does_not_fit_is_refused_by_name(tmp_path, damage, message):
    save_tiny(tmp_path)
    rewrite(tmp_path, damage)
    with pytest.raises(checkpoint.CheckpointError, match=message) as error:
        checkpoint.load(tmp_path)
    assert str(checkpoint.path_in(tmp_path)) in str(error.value)


def test_pickled_objects_are_never_loaded(tmp_path):
    save_tiny(tmp_path)
    marker = tmp_path / "code-ran"
    rewrite(tmp_path, lambda a: a.update(evil=np.array([Payload(marker)], dtype=object)))
    with pytest.raises(checkpoint.CheckpointError, match="pickled Python objects, .* never loaded") as error:
        checkpoint.load(tmp_path)
    assert "allow_pickle" not in str(error.value)  # no advice to load it anyway
    assert not marker.exists()


def test_files_that_are_no_checkpoint_are_named(tmp_path):
    path = checkpoint.path_in(tmp_path)
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint at .*run train.py first"):
        checkpoint.load(tmp_path)
    path.write_bytes(b"")
    with pytest.raises(checkpoint.CheckpointError, match=r"ckpt.npz is not a checkpoint \(\.npz\), nor any zip archive: it is empty"):
        checkpoint.load(tmp_path)
    path.write_bytes(b"\x80\x04garbage")  # a pickle's first bytes
    with pytest.raises(checkpoint.CheckpointError, match="nor any zip archive: its first bytes are"):
        checkpoint.load(tmp_path)
    np.save(tmp_path / "array.npy", np.zeros(3))
    os.replace(tmp_path / "array.npy", path)
    with pytest.raises(checkpoint.CheckpointError, match="a single .npy array, not a checkpoint"):
        checkpoint.load(tmp_path)
    path.unlink()
    path.mkdir()
    with pytest.raises(checkpoint.CheckpointError, match="ckpt.npz is not a file"):
        checkpoint.load(tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(checkpoint.CheckpointError, match="file is a file; expected the folder"):
        checkpoint.load(tmp_path / "file")
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as archive:
        archive.writestr("readme.txt", "hello")
    os.replace(tmp_path / "other.zip", tmp_path / "z.npz")
    (tmp_path / "z").mkdir()
    os.replace(tmp_path / "z.npz", checkpoint.path_in(tmp_path / "z"))
    with pytest.raises(checkpoint.CheckpointError, match="holds no meta entry"):
        checkpoint.load(tmp_path / "z")


def test_checkpoints_from_before_the_format_version_are_read_as_version_1(tmp_path):
    save_tiny(tmp_path, iteration=7)
    rewrite(tmp_path, change_meta(format=DROP, format_version=DROP))
    _, _, meta = checkpoint.load(tmp_path)
    assert meta["iteration"] == 7 and "format_version" not in meta


def test_float64_checkpoints_load(tmp_path):
    save_tiny(tmp_path, dtype=mt.float64)
    model_state, _, _ = checkpoint.load(tmp_path)
    assert {a.dtype for a in model_state.values()} == {np.dtype(np.float64)}


def test_numpy_numbers_and_arrays_in_meta_are_saved_as_plain_json(tmp_path):
    save_tiny(tmp_path, iteration=np.int64(3), best_val=np.float32(1.5), losses=np.array([2.0, 1.75]), flags={"kept": np.bool_(True)})
    meta = checkpoint.load(tmp_path)[2]
    assert meta["iteration"] == 3 and type(meta["iteration"]) is int
    assert meta["best_val"] == 1.5 and meta["losses"] == [2.0, 1.75] and meta["flags"] == {"kept": True}


def test_a_meta_value_json_cannot_hold_is_an_error_naming_its_key(tmp_path):
    with pytest.raises(MicrotensorError, match=r"checkpoint.save: meta\['notes'\]\[1\] is .*\(set\); expected a JSON value"):
        save_tiny(tmp_path, notes=["fine", {1, 2}])
    assert not (tmp_path / checkpoint.FILENAME).exists()


def test_the_optimizer_state_is_saved_and_resumes_the_same_step(tmp_path):
    """checkpoint.save writes the optimizer's whole state (AdamW's step, m and v for every
    parameter, and each group's hyperparameters) and load gives it back, so an optimizer restored
    from it takes the very step the saved one takes. Kills the mutant checkpoint.save_drops_the_optimizer."""
    idx = mt.tensor(np.array([[1, 2, 3, 4], [0, 4, 2, 1]]))

    def train_step(model, optimizer):
        _, loss = model(idx, idx)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    mt.manual_seed(0)
    model = GPT(CONFIG)
    optimizer = optim.AdamW(optim.weight_decay_groups(model, 0.1), lr=1e-2)
    for _ in range(2):
        train_step(model, optimizer)
    checkpoint.save(tmp_path, model, optimizer, {"iteration": 2, "config": CONFIG.to_dict(), "vocab": VOCAB})
    model_state, optim_state, _ = checkpoint.load(tmp_path)
    saved = optimizer.state_dict()
    assert optim_state.keys() == saved.keys() and any(key.endswith(".m") for key in saved)
    for key, value in saved.items():
        np.testing.assert_array_equal(optim_state[key], value, err_msg=key)

    restored = GPT(CONFIG)
    restored.load_state_dict(model_state)
    restored_optimizer = optim.AdamW(optim.weight_decay_groups(restored, 0.1), lr=1e-2)
    restored_optimizer.load_state_dict(optim_state)
    train_step(model, optimizer)
    train_step(restored, restored_optimizer)
    for (name, p), q in zip(model.named_parameters(), restored.parameters()):
        np.testing.assert_array_equal(p.data, q.data, err_msg=name)  # bit-identical: the same moments, the same step
