"""gpt/checkpoints/convert.py: export to nanoGPT's layout, import back, and a PyTorch model that agrees.

The export is checked against gpt/checkpoints/torch_gpt.py, a PyTorch GPT written apart from
microtensor: for every model option, in float64 and float32, it loads the file and must compute
microtensor's logits, loss and every parameter's gradient. The round trip must give back the same
bits; broken files must give clear errors; an imported checkpoint must sample and resume; the DDP
example (examples/train_torch_ddp.py) must train on two processes and its result import again.
"""
import hashlib
import importlib.util
import itertools
import json
import os
import socket
import subprocess
import sys
import traceback
import zipfile
from pathlib import Path

import numpy as np
import pytest

import generate
import microtensor as mt
import train
from microtensor import optim
from gpt.checkpoints import checkpoint
from gpt.checkpoints import convert
from gpt.model.transformer import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[1]
try:
    import safetensors.numpy  # noqa: F401  (an optional extra: its cases are skipped without it)

    HAS_SAFETENSORS = True
except ImportError:
    HAS_SAFETENSORS = False
FORMATS = [
    ".npz",
    pytest.param(".safetensors", marks=pytest.mark.skipif(not HAS_SAFETENSORS, reason="safetensors is not installed")),
]
# every combination of GPTConfig's options, as tests/test_gpt.py's EVERY_OPTION
EVERY_OPTION = [
    dict(norm=norm, mlp=mlp, pos=pos, bias=bias, tie_weights=tie)
    for norm, mlp, pos, bias, tie in itertools.product(("layernorm", "rmsnorm"), ("gelu", "swiglu"), ("learned", "rope"), (False, True), (True, False))
]  # fmt: skip
VOCAB = "\n !abcdefgh"  # 11 characters
TOLERANCE = {"float64": 1e-8, "float32": 1e-4}
largest_difference = {"float64": 0.0, "float32": 0.0}  # reported at the end of the run (see pytest -s)


def option_id(options):
    return "-".join(str(v) for v in options.values())


def random_model(dtype, seed=0, **options):
    """A tiny GPT whose every parameter is random: biases and norm weights are moved off 0 and 1,
    which would hide a bias or a norm weight that the export drops or misplaces."""
    mt.manual_seed(seed)
    config = GPTConfig(vocab_size=len(VOCAB), block_size=8, n_layer=2, n_head=2, n_embd=8, **options)
    model = GPT(config, dtype=getattr(mt, dtype))
    rng = np.random.default_rng(seed + 1)
    for _, p in model.named_parameters():
        p.data[...] = p.data + rng.normal(0.0, 0.3, p.shape)
    return model


def save_checkpoint(folder, model, iteration=7):
    """The model as train.py saves it: with an optimizer's state and train.py's meta."""
    optimizer = optim.AdamW(optim.weight_decay_groups(model, 0.1), lr=1e-3)
    meta = {"iteration": iteration, "config": model.config.to_dict(), "vocab": VOCAB, "best_val": None}
    checkpoint.save(folder, model, optimizer, meta)
    return Path(folder)


def batch(seed=1, batch_size=3, block_size=8):
    rng = np.random.default_rng(seed)
    return rng.integers(0, len(VOCAB), (batch_size, block_size)), rng.integers(0, len(VOCAB), (batch_size, block_size))


def assert_close(ours, theirs, tolerance, what, dtype):
    """|ours - theirs| <= tolerance (1 + |theirs|), elementwise; the largest difference is recorded."""
    ours, theirs = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    assert ours.shape == theirs.shape, f"{what}: shapes {ours.shape} and {theirs.shape}"
    difference = np.abs(ours - theirs)
    largest_difference[dtype] = max(largest_difference[dtype], float(difference.max()))
    excess = difference - tolerance * (1 + np.abs(theirs))
    assert excess.max() <= 0, f"{what} ({dtype}): differs by up to {difference.max():.3g} (tolerance {tolerance})"


# ================================================================================= against PyTorch


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads cost more than they bring, and the machine is shared
    yield torch
    torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("options", EVERY_OPTION, ids=option_id)
def test_pytorch_computes_the_same_logits_loss_and_gradients(torch, tmp_path, options, dtype):
    from gpt.checkpoints import torch_gpt as torch_reference_gpt

    model = random_model(dtype, **options)
    folder = save_checkpoint(tmp_path / "out", model)
    paths = [convert.export_checkpoint(folder, tmp_path / f"model{suffix}") for suffix in (".npz", ".safetensors")[: 1 + HAS_SAFETENSORS]]
    theirs, metadata = torch_reference_gpt.load_export(paths[0])
    for other in paths[1:]:  # both formats hold the same tensors and metadata
        tensors, other_metadata = torch_reference_gpt.read_file(other)
        assert other_metadata == metadata
        for name, tensor in tensors.items():
            assert torch.equal(tensor, theirs.state_dict()[name]), name
    assert theirs.transformer.wte.weight.dtype == getattr(torch, dtype)
    assert (theirs.lm_head.weight is theirs.transformer.wte.weight) == options["tie_weights"]

    idx, targets = batch()
    logits, loss = model(mt.tensor(idx), mt.tensor(targets))
    loss.backward()
    their_logits, their_loss = theirs(torch.from_numpy(idx), torch.from_numpy(targets))
    their_loss.backward()
    tolerance = TOLERANCE[dtype]
    assert_close(logits.data, their_logits.detach().numpy(), tolerance, "logits", dtype)
    assert_close(loss.item(), their_loss.item(), tolerance, "loss", dtype)

    their_parameters = dict(theirs.named_parameters())  # a tied head is listed once, as transformer.wte.weight
    linear = convert.linear_weight_names(model)
    assert set(their_parameters) == {name for name, _ in model.named_parameters()}
    for name, p in model.named_parameters():
        grad = p.grad.T if name in linear else p.grad  # (in, out) -> PyTorch's (out, in)
        assert_close(grad, their_parameters[name].grad.numpy(), tolerance, f"the gradient of {name}", dtype)


def test_largest_differences_are_reported(torch, capsys):
    """Runs after the comparisons above (pytest keeps a file's order) and prints the largest absolute
    difference each dtype saw, the numbers to quote; each comparison has checked its own tolerance."""
    if not any(largest_difference.values()):
        pytest.skip("no comparison with PyTorch ran before this test")
    with capsys.disabled():
        print(f"\nlargest differences against PyTorch: {largest_difference}")


@pytest.mark.parametrize("options", EVERY_OPTION, ids=option_id)
def test_the_ddp_examples_model_computes_microtensors_logits(torch, tmp_path, options):
    """examples/train_torch_ddp.py carries its own copy of the model: it must agree too."""
    example = load_example()
    model = random_model("float64", **options)
    path = convert.export_checkpoint(save_checkpoint(tmp_path / "out", model), tmp_path / "model.npz")
    theirs, _ = example.load_model(path)
    idx, targets = batch()
    logits, loss = model(mt.tensor(idx), mt.tensor(targets))
    their_logits, their_loss = theirs(torch.from_numpy(idx), torch.from_numpy(targets))
    assert_close(logits.data, their_logits.detach().numpy(), TOLERANCE["float64"], "logits", "float64")
    assert_close(loss.item(), their_loss.item(), TOLERANCE["float64"], "loss", "float64")


def load_example():
    spec = importlib.util.spec_from_file_location("train_torch_ddp", ROOT / "examples" / "train_torch_ddp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ================================================================================= the file and the round trip


@pytest.mark.parametrize("suffix", FORMATS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("options", EVERY_OPTION, ids=option_id)
def test_export_then_import_gives_back_the_same_bits(tmp_path, options, dtype, suffix):
    model = random_model(dtype, **options)
    before, _, _ = checkpoint.load(save_checkpoint(tmp_path / "out", model, iteration=42))
    path = convert.export_checkpoint(tmp_path / "out", tmp_path / f"model{suffix}")
    convert.import_checkpoint(path, tmp_path / "back", dtype=None)
    after, optimizer_state, meta = checkpoint.load(tmp_path / "back")
    assert after.keys() == before.keys()
    for name in before:
        assert after[name].dtype == before[name].dtype and after[name].tobytes() == before[name].tobytes(), name
    assert optimizer_state == {}
    assert meta["config"] == model.config.to_dict() and meta["vocab"] == VOCAB and meta["iteration"] == 42


@pytest.mark.parametrize("suffix", FORMATS)
def test_the_file_holds_nanogpts_names_layout_and_metadata(tmp_path, suffix):
    model = random_model("float32", tie_weights=True)
    path = convert.export_checkpoint(save_checkpoint(tmp_path / "out", model), tmp_path / f"model{suffix}")
    tensors, metadata = convert.read_export(path)
    C, V = 8, len(VOCAB)
    assert tensors["transformer.h.1.attn.c_attn.weight"].shape == (3 * C, C)  # (out, in)
    assert tensors["transformer.h.0.mlp.c_proj.weight"].shape == (C, 4 * C)
    np.testing.assert_array_equal(tensors["transformer.h.0.mlp.c_fc.weight"], model.transformer.h[0].mlp.c_fc.weight.data.T)
    assert tensors["transformer.wte.weight"].shape == (V, C) and "lm_head.weight" not in tensors  # tied: stored once
    assert json.loads(metadata["tied_weights"]) == {"lm_head.weight": "transformer.wte.weight"}
    assert json.loads(metadata["config"]) == model.config.to_dict() and json.loads(metadata["vocab"]) == VOCAB
    assert metadata["format"] == "microtensor-gpt" and metadata["format_version"] == "1"
    assert metadata["microtensor_version"] == mt.__version__ and metadata["iteration"] == "7"
    assert metadata["dtype"] == "float32" and metadata["linear_weight_layout"] == "(out_features, in_features)"


def test_import_casts_to_float32_by_default(tmp_path):
    """train.py and generate.py build float32 models, so a float64 file becomes float32 unless asked."""
    model = random_model("float64")
    path = convert.export_checkpoint(save_checkpoint(tmp_path / "out", model), tmp_path / "model.npz")
    convert.import_checkpoint(path, tmp_path / "back")
    state, _, _ = checkpoint.load(tmp_path / "back")
    assert {a.dtype for a in state.values()} == {np.dtype(np.float32)}
    np.testing.assert_array_equal(state["transformer.wte.weight"], model.transformer.wte.weight.data.astype(np.float32))


def test_converting_leaves_the_global_random_state_alone(tmp_path):
    model = random_model("float32")
    save_checkpoint(tmp_path / "out", model)
    state = mt.random.get_state()
    path = convert.export_checkpoint(tmp_path / "out", tmp_path / "model.npz")
    convert.import_checkpoint(path, tmp_path / "back")
    assert mt.random.get_state() == state


def test_npz_works_without_safetensors(tmp_path, monkeypatch):
    model = random_model("float32")
    save_checkpoint(tmp_path / "out", model)
    for name in [m for m in sys.modules if m == "safetensors" or m.startswith("safetensors.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "safetensors", None)  # `import safetensors` now raises ImportError
    with pytest.raises(convert.ConvertError, match=r"install the safetensors package .*or use a \.npz file"):
        convert.export_checkpoint(tmp_path / "out", tmp_path / "model.safetensors")
    assert not (tmp_path / "model.safetensors").exists()
    path = convert.export_checkpoint(tmp_path / "out", tmp_path / "model.npz")
    convert.import_checkpoint(path, tmp_path / "back")
    assert checkpoint.load(tmp_path / "back")[2]["vocab"] == VOCAB


# ================================================================================= bad files


@pytest.fixture
def good_npz(tmp_path):
    """(tensors, metadata) of a valid untied export, to be broken one way at a time."""
    model = random_model("float32", tie_weights=False, bias=True)
    path = convert.export_checkpoint(save_checkpoint(tmp_path / "out", model), tmp_path / "good.npz")
    with np.load(path) as archive:
        tensors = {name: archive[name] for name in archive.files if name != "__metadata__"}
        metadata = json.loads(str(archive["__metadata__"]))
    return tensors, metadata


def write_npz(path, tensors, metadata):
    np.savez(path, **tensors, __metadata__=np.array(json.dumps(metadata)))
    return path


def _set(mapping, key, value):
    mapping[key] = value


# each case: (change(tensors, metadata) that breaks a copy of a good file, the error it must give)
BAD_FILES = {
    "wrong format": (lambda t, m: _set(m, "format", "something-else"), "has format 'something-else', expected 'microtensor-gpt'"),
    "newer version": (lambda t, m: _set(m, "format_version", "2"), "format version 2, written by microtensor .*reads version 1: upgrade"),
    "version not a number": (lambda t, m: _set(m, "format_version", "one"), "format_version 'one' is not an integer"),
    "no config": (lambda t, m: m.pop("config"), "its metadata lacks config"),
    "config not JSON": (lambda t, m: _set(m, "config", "{n_layer: 2"), "its config is not a valid GPTConfig"),
    "unknown config field": (lambda t, m: _set(m, "config", json.dumps({**json.loads(m["config"]), "n_experts": 4})), "not a valid GPTConfig.*n_experts"),
    "invalid config value": (lambda t, m: _set(m, "config", json.dumps({**json.loads(m["config"]), "norm": "batchnorm"})), "norm must be one of"),
    "vocab of the wrong size": (lambda t, m: _set(m, "vocab", json.dumps("abc")), "vocab must be a string of 11 different characters"),
    "layout not PyTorch's": (lambda t, m: _set(m, "linear_weight_layout", "(in_features, out_features)"), "linear_weight_layout is"),
    "tied in the metadata only": (lambda t, m: _set(m, "tied_weights", json.dumps({"lm_head.weight": "transformer.wte.weight"})), "tied_weights is .* tie_weights=False"),
    "missing tensor": (lambda t, m: t.pop("transformer.h.1.mlp.c_fc.bias"), r"missing tensors: transformer\.h\.1\.mlp\.c_fc\.bias"),
    "unexpected tensor": (lambda t, m: _set(t, "transformer.h.0.attn.bias", np.ones((8, 8), np.float32)), r"unexpected tensors .*transformer\.h\.0\.attn\.bias"),
    "ddp's prefix": (lambda t, m: [_set(t, "module." + k, t.pop(k)) for k in list(t)], r"they start with 'module\.': save ddp_model\.module\.state_dict\(\)"),
    "not transposed": (lambda t, m: _set(t, "transformer.h.0.mlp.c_fc.weight", t["transformer.h.0.mlp.c_fc.weight"].T.copy()),
                       r"transformer\.h\.0\.mlp\.c_fc\.weight has shape \(8, 32\), the config implies \(32, 8\)"),
    "half precision": (lambda t, m: _set(t, "transformer.wte.weight", t["transformer.wte.weight"].astype(np.float16)), "float16.*expected float32 or float64"),
    "two dtypes": (lambda t, m: _set(t, "transformer.wte.weight", t["transformer.wte.weight"].astype(np.float64)), "several dtypes"),
    "integer tensor": (lambda t, m: _set(t, "transformer.ln_f.bias", np.zeros(8, np.int64)), "int64.*expected float32 or float64"),
    "nan": (lambda t, m: t["transformer.h.1.ln_2.weight"].__setitem__(3, np.nan), r"non-finite values .*transformer\.h\.1\.ln_2\.weight"),
}


@pytest.mark.parametrize("case", BAD_FILES, ids=list(BAD_FILES))
def test_a_bad_file_is_a_clear_error_naming_it(tmp_path, good_npz, case):
    change, message = BAD_FILES[case]
    tensors, metadata = good_npz
    change(tensors, metadata)
    path = write_npz(tmp_path / "bad.npz", tensors, metadata)
    with pytest.raises(convert.ConvertError, match=message) as error:
        convert.import_checkpoint(path, tmp_path / "back")
    assert str(path) in str(error.value)
    assert not (tmp_path / "back").exists()  # nothing is written when anything is wrong


def test_several_problems_are_named_in_one_error(tmp_path, good_npz):
    tensors, metadata = good_npz
    tensors.pop("transformer.wpe.weight")
    tensors["transformer.h.0.ln_1.weight"] = np.ones(9, np.float32)
    with pytest.raises(convert.ConvertError) as error:
        convert.read_export(write_npz(tmp_path / "bad.npz", tensors, metadata))
    assert "missing tensors: transformer.wpe.weight" in str(error.value)
    assert "transformer.h.0.ln_1.weight has shape (9,), the config implies (8,)" in str(error.value)


def test_a_tied_head_stored_twice_is_accepted_only_when_equal(tmp_path):
    """nanoGPT's state_dict lists the tied lm_head.weight beside wte: an .npz made from it imports."""
    model = random_model("float32", tie_weights=True)
    path = convert.export_checkpoint(save_checkpoint(tmp_path / "out", model), tmp_path / "model.npz")
    tensors, metadata = convert.read_export(path)
    tensors["lm_head.weight"] = tensors["transformer.wte.weight"].copy()
    assert "lm_head.weight" not in convert.read_export(write_npz(tmp_path / "twice.npz", tensors, metadata))[0]
    tensors["lm_head.weight"][0, 0] += 1
    with pytest.raises(convert.ConvertError, match="ties lm_head.weight to transformer.wte.weight, but the file holds a different"):
        convert.read_export(write_npz(tmp_path / "different.npz", tensors, metadata))


def test_files_that_are_not_exports(tmp_path):
    model = random_model("float32")
    folder = save_checkpoint(tmp_path / "out", model)
    cases = {
        tmp_path / "nothing.npz": "no such file",
        tmp_path / "model.pt": "must be a .safetensors or .npz file, got '.pt'",
        folder / checkpoint.FILENAME: "is a train.py checkpoint, not an export: export its folder first",
        tmp_path / "garbage.npz": "is not a readable .npz file",
        tmp_path / "plain.npz": "has no __metadata__ entry: it was not written by an export",
    }
    (tmp_path / "model.pt").write_bytes(b"\x80\x02")
    (tmp_path / "garbage.npz").write_bytes(b"not a zip file")
    np.savez(tmp_path / "plain.npz", weight=np.ones(3))
    if HAS_SAFETENSORS:
        (tmp_path / "garbage.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
        cases[tmp_path / "garbage.safetensors"] = "is not a readable safetensors file"
        safetensors.numpy.save_file({"w": np.ones(2, np.float32)}, tmp_path / "foreign.safetensors")
        cases[tmp_path / "foreign.safetensors"] = "has format None, expected 'microtensor-gpt'"
    for path, message in cases.items():
        with pytest.raises(convert.ConvertError, match=message) as error:
            convert.import_checkpoint(path, tmp_path / "back")
        assert str(path) in str(error.value)


# ================================================================================= the command line


def run_convert(capsys, *argv):
    code = convert.main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, " ".join(out.out.split()), " ".join(out.err.split())


def test_the_command_line_exports_imports_and_refuses_to_overwrite(tmp_path, capsys):
    model = random_model("float32")
    save_checkpoint(tmp_path / "out", model)
    code, out, _ = run_convert(capsys, tmp_path / "out", tmp_path / "model.npz")
    assert code == 0 and "exported" in out
    code, out, _ = run_convert(capsys, tmp_path / "model.npz", tmp_path / "out2")
    assert code == 0 and "generate.py --out-dir" in out and "--resume" in out
    for argv in ((tmp_path / "out", tmp_path / "model.npz"), (tmp_path / "model.npz", tmp_path / "out2")):
        code, out, err = run_convert(capsys, *argv)
        assert code == 1 and "exists; pass --force to overwrite it" in err and "Traceback" not in err + out
        assert run_convert(capsys, *argv, "--force")[0] == 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["{tmp}/missing", "{tmp}/model.npz"], "missing: no such file or folder"),
        (["{tmp}/out", "{tmp}/model.pt"], "the export must be a .safetensors or .npz file, got '.pt'"),
        (["{tmp}/empty", "{tmp}/model.npz"], "no checkpoint at"),
        (["{tmp}/out/ckpt.npz", "{tmp}/back"], "is a train.py checkpoint, not an export"),
    ],
)
def test_user_mistakes_exit_1_with_a_message_and_no_traceback(tmp_path, capsys, argv, message):
    save_checkpoint(tmp_path / "out", random_model("float32"))
    (tmp_path / "empty").mkdir()
    code, out, err = run_convert(capsys, *[a.format(tmp=tmp_path) for a in argv])
    assert code == 1 and err.startswith("error: ") and message in err and "Traceback" not in out + err


def test_help_explains_both_directions(capsys):
    with pytest.raises(SystemExit) as exit_:
        convert.main(["--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "a folder is exported, a file is imported" in text and "--force" in text and "docs/pytorch.md" in text


def test_the_module_runs_as_a_program(tmp_path):
    save_checkpoint(tmp_path / "out", random_model("float32"))
    run = subprocess.run(
        [sys.executable, "-m", "gpt.checkpoints.convert", str(tmp_path / "out"), str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 1 and "error:" in run.stderr and "Traceback" not in run.stderr


# ================================================================================= the imported checkpoint in use


@pytest.fixture
def corpus(tmp_path):
    rng = np.random.default_rng(0)
    words = ["a!", "bad", "cafe", "deed", "beef", "hag"]  # only VOCAB's characters
    path = tmp_path / "corpus.txt"
    path.write_text(" ".join(words[i] for i in rng.integers(0, len(words), 400)) + "\n", encoding="utf-8")
    return path


def test_an_imported_checkpoint_samples_and_resumes(tmp_path, corpus, capsys):
    path = convert.export_checkpoint(save_checkpoint(tmp_path / "out", random_model("float32")), tmp_path / "model.npz")
    convert.import_checkpoint(path, tmp_path / "back")
    assert generate.main(["--out-dir", str(tmp_path / "back"), "--prompt", "bad", "--max-new-tokens", "10"]) == 0
    small = ["--batch-size", "2", "--eval-iters", "1", "--eval-interval", "100", "--sample-chars", "0"]
    argv = ["--data", str(corpus), "--out-dir", str(tmp_path / "back"), "--resume", "--max-iters", "10", *small]
    assert train.main(argv) == 0, capsys.readouterr().out
    state, optimizer_state, meta = checkpoint.load(tmp_path / "back")
    assert meta["iteration"] == 10 and optimizer_state  # trained from step 7 on, with an optimizer state now


# ================================================================================= DDP


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("wrapper", ["ddp", "fsdp"])
def test_the_ddp_example_trains_on_two_processes_and_imports_back(torch, tmp_path, corpus, wrapper):
    """DDP (every process holds the whole model) and, with --fsdp, FSDP (each holds a slice: ZeRO-3)."""
    model = random_model("float32", pos="rope", mlp="swiglu")
    export = convert.export_checkpoint(save_checkpoint(tmp_path / "out", model), tmp_path / "model.npz")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    if sys.platform.startswith("linux"):
        env["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
        "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{free_port()}",
        str(ROOT / "examples" / "train_torch_ddp.py"), str(export), "--data", str(corpus), "--out", str(tmp_path / "trained.npz"),
        "--steps", "8", "--batch-size", "4", "--learning-rate", "1e-2", "--log-interval", "4",
        *(["--fsdp"] if wrapper == "fsdp" else []),
    ]  # fmt: skip
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    assert ("2 process(es), FSDP" if wrapper == "fsdp" else "2 process(es), ") in run.stdout, run.stdout
    losses = [float(line.split("loss ")[1].split()[0]) for line in run.stdout.splitlines() if line.startswith("step ")]
    assert len(losses) == 3 and losses[-1] < losses[0], run.stdout  # steps 1, 4 and 8, averaged over both processes
    convert.import_checkpoint(tmp_path / "trained.npz", tmp_path / "back")
    state, _, meta = checkpoint.load(tmp_path / "back")
    assert meta["iteration"] == 7 + 8
    assert not np.array_equal(state["transformer.wte.weight"], model.transformer.wte.weight.data)  # it trained


# ================================================================================= checkpoints an export cannot hold as they are


def bpe_checkpoint(folder):
    """A checkpoint of `train.py --tokenizer bpe`: its meta holds BPE merges, no character vocabulary."""
    from gpt.text.electives.bpe import BytePairTokenizer

    tokenizer = BytePairTokenizer.train("the king and the queen said the king " * 20, 260)
    mt.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=8, n_layer=1, n_head=2, n_embd=8))
    meta = {"iteration": 3, "config": model.config.to_dict(), **checkpoint.tokenizer_meta(tokenizer), "best_val": None}
    checkpoint.save(folder, model, optim.AdamW(optim.weight_decay_groups(model, 0.1)), meta)
    return Path(folder)


def lora_checkpoint(folder, base):
    """A checkpoint of `train.py --init-from BASE --lora-rank 2`: adapters alone, and its base's name and hash."""
    from gpt.model.electives.lora import add_lora, lora_parameters, lora_state_dict

    _, _, base_meta = checkpoint.load(base)
    model = random_model("float32")
    add_lora(model, 2, 4.0, ["c_attn", "c_proj"])
    rng = np.random.default_rng(5)
    for p in lora_parameters(model):
        p.data[...] = rng.normal(0.0, 0.3, p.shape)  # lora_b starts at zero: give the adapters an effect
    meta = {**base_meta, "lora": checkpoint.lora_meta(base, 2, 4.0, ["c_attn", "c_proj"])}
    optimizer = optim.AdamW([{"params": lora_parameters(model), "weight_decay": 0.0}])
    checkpoint.save(folder, model, optimizer, meta, parameters=lora_state_dict(model))
    return Path(folder)


def test_a_bpe_checkpoint_is_refused_naming_its_tokenizer(tmp_path):
    with pytest.raises(convert.ConvertError, match=r"trained with a byte-level BPE tokenizer \(train.py --tokenizer bpe\)"):
        convert.export_checkpoint(bpe_checkpoint(tmp_path / "bpe"), tmp_path / "model.npz")
    assert not (tmp_path / "model.npz").exists()


def test_a_lora_checkpoint_exports_merged_and_only_when_asked(tmp_path):
    base = save_checkpoint(tmp_path / "base", random_model("float32"))
    adapters = lora_checkpoint(tmp_path / "lora", base)
    with pytest.raises(convert.ConvertError, match="merge the adapters into the base's weights first with --merge-lora"):
        convert.export_checkpoint(adapters, tmp_path / "model.npz")
    with pytest.raises(convert.ConvertError, match="--merge-lora: given with .*no adapters to merge"):
        convert.export_checkpoint(base, tmp_path / "model.npz", merge_lora=True)
    path = convert.export_checkpoint(adapters, tmp_path / "model.npz", merge_lora=True)
    convert.import_checkpoint(path, tmp_path / "back")
    merged = checkpoint.load_model(adapters, merge=True)[0]
    state, _, meta = checkpoint.load(tmp_path / "back")
    assert "lora" not in meta and meta["vocab"] == VOCAB
    for name, array in merged.state_dict().items():
        np.testing.assert_array_equal(state[name], array, err_msg=name)
    unmerged = checkpoint.load(base)[0]
    assert not np.array_equal(state["transformer.h.0.attn.c_attn.weight"], unmerged["transformer.h.0.attn.c_attn.weight"])


def test_convert_error_is_a_microtensor_error():
    from microtensor.errors import MicrotensorError

    assert issubclass(convert.ConvertError, MicrotensorError)


# ================================================================================= bytes that are not the export's


def safetensors_parts(path):
    """(header {name: entry}, payload bytes) of a .safetensors file."""
    raw = Path(path).read_bytes()
    size = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + size]), raw[8 + size :]


def write_safetensors(path, header, payload, header_text=None):
    text = (header_text or json.dumps(header)).encode("utf-8")
    text += b" " * (-len(text) % 8)
    Path(path).write_bytes(len(text).to_bytes(8, "little") + text + payload)
    return Path(path)


@pytest.fixture
def exported(tmp_path):
    """A .safetensors export of an untied model with biases, to be damaged one way at a time."""
    pytest.importorskip("safetensors")
    model = random_model("float32", tie_weights=False, bias=True)
    return convert.export_checkpoint(save_checkpoint(tmp_path / "out", model), tmp_path / "model.safetensors")


def test_tensors_whose_bytes_overlap_are_refused(tmp_path, exported):
    header, payload = safetensors_parts(exported)
    header["transformer.ln_f.weight"]["data_offsets"] = header["transformer.h.0.ln_1.weight"]["data_offsets"]  # same size
    path = write_safetensors(tmp_path / "overlap.safetensors", header, payload)
    with pytest.raises(convert.ConvertError, match=r"bytes must lie one after another: transformer\.(ln_f|h\.0\.ln_1)\.weight begins at byte \d+, inside"):
        convert.read_export(path)


def test_tensors_whose_bytes_run_backwards_or_past_the_end_are_refused(tmp_path, exported):
    header, payload = safetensors_parts(exported)
    begin, end = header["transformer.ln_f.bias"]["data_offsets"]
    header["transformer.ln_f.bias"]["data_offsets"] = [end, begin]
    with pytest.raises(convert.ConvertError, match=rf"ln_f\.bias has data_offsets \[{end}, {begin}\], expected 0 <= begin <= end"):
        convert.read_export(write_safetensors(tmp_path / "backwards.safetensors", header, payload))
    header["transformer.ln_f.bias"]["data_offsets"] = [begin, len(payload) + 4]
    with pytest.raises(convert.ConvertError, match=rf"end <= {len(payload)} \(the payload's bytes\)"):
        convert.read_export(write_safetensors(tmp_path / "beyond.safetensors", header, payload))


def test_a_tensor_listed_twice_in_the_header_is_refused(tmp_path, exported):
    header, payload = safetensors_parts(exported)
    name = "transformer.h.0.ln_1.weight"
    text = json.dumps(header)
    twice = "{" + json.dumps(name) + ": " + json.dumps(header["transformer.h.0.ln_2.weight"]) + ", " + text[1:]
    with pytest.raises(convert.ConvertError, match=rf"its header lists {name} more than once"):
        convert.read_export(write_safetensors(tmp_path / "twice.safetensors", header, payload, header_text=twice))


def test_swapped_or_flipped_bytes_fail_the_checksum(tmp_path, exported):
    header, payload = safetensors_parts(exported)
    flipped = bytearray(payload)
    begin, _ = header["transformer.h.1.mlp.c_fc.weight"]["data_offsets"]
    flipped[begin + 5] ^= 0x10  # a mantissa bit: the value stays finite
    with pytest.raises(convert.ConvertError, match=r"the bytes of transformer\.h\.1\.mlp\.c_fc\.weight are not those the export wrote"):
        convert.import_checkpoint(write_safetensors(tmp_path / "flipped.safetensors", header, bytes(flipped)), tmp_path / "back")
    assert not (tmp_path / "back").exists()
    a, b = "transformer.h.0.ln_1.weight", "transformer.h.0.ln_2.weight"  # the same size: only the checksums see it
    header[a]["data_offsets"], header[b]["data_offsets"] = header[b]["data_offsets"], header[a]["data_offsets"]
    with pytest.raises(convert.ConvertError, match=r"sha256 differ.*drop tensor_sha256"):
        convert.read_export(write_safetensors(tmp_path / "swapped.safetensors", header, payload))


@pytest.mark.parametrize("suffix", FORMATS)
def test_every_tensor_has_its_sha256_in_the_metadata(tmp_path, suffix):
    model = random_model("float64")
    path = convert.export_checkpoint(save_checkpoint(tmp_path / "out", model), tmp_path / f"model{suffix}")
    tensors, metadata = convert.read_export(path)
    recorded = json.loads(metadata["tensor_sha256"])
    assert recorded.keys() == tensors.keys()
    for name, array in tensors.items():
        assert recorded[name] == hashlib.sha256(array.astype("<f8").tobytes()).hexdigest(), name


def test_a_file_without_checksums_still_imports(tmp_path, good_npz):
    tensors, metadata = good_npz
    del metadata["tensor_sha256"]  # as code other than an export writes it
    convert.import_checkpoint(write_npz(tmp_path / "theirs.npz", tensors, metadata), tmp_path / "back")
    metadata["tensor_sha256"] = json.dumps({"transformer.wte.weight": "0" * 64})
    with pytest.raises(convert.ConvertError, match=r"the bytes of transformer\.wte\.weight are not those"):
        convert.read_export(write_npz(tmp_path / "stale.npz", tensors, metadata))


def test_damaged_npz_files_are_clear_errors(tmp_path, good_npz):
    tensors, metadata = good_npz
    path = write_npz(tmp_path / "good.npz", tensors, metadata)
    payload = bytearray(path.read_bytes())
    payload[len(payload) // 2] ^= 0xFF
    (tmp_path / "flipped.npz").write_bytes(bytes(payload))
    (tmp_path / "truncated.npz").write_bytes(bytes(payload[: len(payload) - 300]))
    for name in ("flipped.npz", "truncated.npz"):
        with pytest.raises(convert.ConvertError, match=r"is not a readable \.npz file \(truncated or damaged\?\): BadZipFile"):
            convert.read_export(tmp_path / name)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("notes.txt", "not an array")
    with pytest.raises(convert.ConvertError, match=r"holds members that are not arrays: notes\.txt"):
        convert.read_export(path)


# ================================================================================= runs that end in one line


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A checkpoint of each kind, and an export, which each run gets a copy of."""
    folder = tmp_path_factory.mktemp("kinds")
    base = save_checkpoint(folder / "char", random_model("float32"))
    bpe_checkpoint(folder / "bpe")
    lora_checkpoint(folder / "lora", base)
    convert.export_checkpoint(base, folder / "model.npz")
    if HAS_SAFETENSORS:
        convert.export_checkpoint(base, folder / "model.safetensors")
    return folder


def case(setup, code, *expected, **marks):
    return pytest.param(setup, code, expected, **marks)


def damaged_copy(s, name, change):
    """s.tmp/name: a copy of the module's export `name`, its bytes replaced by change(bytes)."""
    path = s.tmp / name
    path.write_bytes(change((s.kinds / name).read_bytes()))
    return path


def overlapping(payload):
    size = int.from_bytes(payload[:8], "little")
    header = json.loads(payload[8 : 8 + size])
    header["transformer.ln_f.weight"]["data_offsets"] = header["transformer.h.0.ln_1.weight"]["data_offsets"]
    text = json.dumps(header).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + payload[8 + size :]


def flip_last(payload):
    damaged = bytearray(payload)
    damaged[-3] ^= 0x01  # the last tensor's last value, a low mantissa bit
    return bytes(damaged)


class Scene:
    def __init__(self, tmp_path, monkeypatch, kinds):
        self.tmp, self.patch, self.kinds = tmp_path, monkeypatch, kinds

    def raising(self, target, name, error):
        self.patch.setattr(target, name, lambda *a, **k: (_ for _ in ()).throw(error))
        return self


needs_safetensors = pytest.mark.skipif(not HAS_SAFETENSORS, reason="safetensors is not installed")
CONVERT_RUNS = {
    "bpe-checkpoint": case(lambda s: [s.kinds / "bpe", s.tmp / "m.npz"], 1, "trained with a byte-level BPE tokenizer", "export a run of --tokenizer char"),
    "lora-checkpoint": case(lambda s: [s.kinds / "lora", s.tmp / "m.npz"], 1, "holds the LoRA adapters of a fine-tuning", "first with --merge-lora"),
    "lora-merged": case(lambda s: [s.kinds / "lora", s.tmp / "m.npz", "--merge-lora"], 0, "exported"),
    "merge-lora-without-adapters": case(lambda s: [s.kinds / "char", s.tmp / "m.npz", "--merge-lora"], 1, "--merge-lora: given with", "no adapters to merge"),
    "merge-lora-on-import": case(lambda s: [s.kinds / "model.npz", s.tmp / "back", "--merge-lora"], 1, "--merge-lora: given with the file"),
    "seed-negative": case(lambda s: [s.kinds / "model.npz", s.tmp / "back", "--seed", "-1"], 1, "seed (--seed) must be an integer >= 0, got -1"),
    "export-read-only-folder": case(
        lambda s: [s.kinds / "char", s.raising(checkpoint.tempfile, "mkstemp", OSError(30, "Read-only file system", str(s.tmp))).tmp / "m.npz"],
        1, "cannot write the export", "Read-only file system", "expected a folder you can write to",
    ),  # fmt: skip
    "export-missing-folder": case(lambda s: [s.kinds / "char", "/proc/microtensor-test/m.npz"], 1, "cannot write the export /proc/microtensor-test/m.npz",
                                  marks=pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")),
    "import-read-only-folder": case(
        lambda s: [s.kinds / "model.npz", s.raising(checkpoint.tempfile, "mkstemp", OSError(30, "Read-only file system", str(s.tmp))).tmp / "back"],
        1, "could not save the checkpoint", "Read-only file system",
    ),  # fmt: skip
    "npz-damaged": case(lambda s: [damaged_copy(s, "model.npz", flip_last), s.tmp / "back"], 1, "is not a readable .npz file (truncated or damaged?)"),
    "npz-truncated": case(lambda s: [damaged_copy(s, "model.npz", lambda b: b[:-100]), s.tmp / "back"], 1, "is not a readable .npz file"),
    "safetensors-overlap": case(lambda s: [damaged_copy(s, "model.safetensors", overlapping), s.tmp / "back"], 1, "bytes must lie one after another", marks=needs_safetensors),
    "safetensors-flipped": case(lambda s: [damaged_copy(s, "model.safetensors", flip_last), s.tmp / "back"], 1, "are not those the export wrote", marks=needs_safetensors),
}


@pytest.mark.parametrize("setup, code, expected", CONVERT_RUNS.values(), ids=CONVERT_RUNS.keys())
def test_no_convert_run_ends_in_a_traceback(tmp_path, monkeypatch, capsys, folders, setup, code, expected):
    argv = [str(a) for a in setup(Scene(tmp_path, monkeypatch, folders))]
    try:
        returned = convert.main(argv)
    except BaseException:
        pytest.fail(f"python -m gpt.checkpoints.convert {' '.join(argv)} ended in a traceback:\n{traceback.format_exc()}")
    finally:
        monkeypatch.undo()
    output = capsys.readouterr()
    text = " ".join((output.out + output.err).split())
    assert "Traceback" not in text and returned == code, text
    for fragment in expected:
        assert fragment in text
    if code:
        assert output.err.startswith("error: ") and output.err.count("\n") == 1, output.err  # one line
        assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".convert-")]  # no temporary file left


# ================================================================================= the layout, without PyTorch


@pytest.mark.parametrize("options", [dict(bias=True, tie_weights=False), dict(mlp="swiglu", tie_weights=True)], ids=["gelu-untied-bias", "swiglu-tied"])
def test_every_linear_weight_computes_the_layer_by_pytorchs_convention(tmp_path, options):
    """Every exported Linear weight W (out, in) gives the layer's output as PyTorch computes it,
    y = x Wᵀ + b; that includes the square ones (attn.c_proj is (C, C)), whose shape cannot tell
    W from Wᵀ and whose round trip is bit-exact even when both directions forget the transpose.
    Numpy only (the PyTorch cross-check above is skipped without torch). Kills the mutant
    convert.square_weights_untransposed."""
    model = random_model("float64", **options)
    tensors, _ = convert.read_export(convert.export_checkpoint(save_checkpoint(tmp_path / "out", model), tmp_path / "model.npz"))
    x = np.random.default_rng(2).standard_normal((3, 2, 8 * 4))  # (B, T, widest in_features)
    linears = [(name, layer) for name, layer in model.named_modules() if isinstance(layer, mt.nn.Linear)]
    assert any(layer.in_features == layer.out_features for _, layer in linears)  # a square one is among them
    for name, layer in linears:
        W = tensors[f"{name}.weight"]
        assert W.shape == (layer.out_features, layer.in_features), name
        x_in = x[..., : layer.in_features]  # (B, T, in)
        theirs = x_in @ W.T + (tensors[f"{name}.bias"] if layer.bias is not None else 0)
        ours = layer(mt.tensor(x_in)).data
        np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12, err_msg=name)
