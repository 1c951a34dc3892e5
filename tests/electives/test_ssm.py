"""The selective state-space model: the scan (microtensor/ops/electives/selective_scan.py) by plain
loops and against its numpy reference, readable and fast kernels against each other, its errors;
and the SSM block (gpt/model/electives/ssm.py): its parameters, its initialization, the options and
flags it refuses, generation's recurrence against the full-sequence forward, rollback, checkpoints. Tests taking `kernel_set` run once with each kernel set.
Its gradcheck and JVP cases run with every op's (tests/test_gradcheck_cases.py, test_forward_mode.py)."""
import math

import numpy as np
import pytest

import microtensor as mt
import microtensor.functional as F
import generate
import train
from microtensor import InputError, InputTypeError
from microtensor.ops.electives import selective_scan
from microtensor.ops.electives.selective_scan import selective_scan_reference
from gpt.checkpoints import checkpoint, convert
from gpt.generation import decode_kernel
from gpt.generation.decoder import Decoder
from gpt.generation.electives.speculative import speculative_generate
from gpt.model.electives.ssm import SSMCache, softplus, state_bytes
from gpt.model.transformer import GPT, ConfigError, GPTConfig, parameter_count
from helpers import AGREE, kernel_pair, randn
from test_programs import TINY, corpus, said  # noqa: F401 (corpus is a fixture)


def scan_problem(dtype=np.float64, batch=2, T=6, channels=5, N=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, T, channels))
    delta = rng.uniform(0.05, 1.5, (batch, T, channels))
    A = -rng.uniform(0.2, 2.0, (channels, N))
    B, C = rng.standard_normal((batch, T, N)), rng.standard_normal((batch, T, N))
    D = rng.standard_normal(channels)
    return [a.astype(dtype) for a in (x, delta, A, B, C, D)]


def test_scan_by_plain_loops(kernel_set):
    """One channel's recurrence written out with Python floats: h = e^{ΔA} h + Δ B x; y = C·h + D x."""
    x, delta, A, B, C, D = scan_problem()
    y = F.selective_scan(*map(mt.tensor, (x, delta, A, B, C, D))).numpy()
    for b in range(2):
        for d in range(5):
            h = [0.0] * 3
            for t in range(6):
                h = [math.exp(delta[b, t, d] * A[d, n]) * h[n] + delta[b, t, d] * B[b, t, n] * x[b, t, d] for n in range(3)]
                expected = sum(C[b, t, n] * h[n] for n in range(3)) + D[d] * x[b, t, d]
                assert y[b, t, d] == pytest.approx(expected, rel=1e-12, abs=1e-12)
    np.testing.assert_allclose(selective_scan_reference(x, delta, A, B, C, D)[0], y, rtol=1e-12, atol=1e-12)


def test_scan_in_pieces_equals_the_whole(kernel_set):
    """`state` carries h from one call to the next: a sequence scanned 1, 2 and 3 steps at a time
    gives the whole scan's outputs and leaves its last state."""
    x, delta, A, B, C, D = scan_problem()
    whole = F.selective_scan(*map(mt.tensor, (x, delta, A, B, C, D))).numpy()
    state, pieces = np.zeros((2, 5, 3)), []
    for start, stop in ((0, 1), (1, 3), (3, 6)):
        part = [mt.tensor(a[:, start:stop]) for a in (x, delta, B, C)]
        pieces.append(F.selective_scan(part[0], part[1], mt.tensor(A), part[2], part[3], mt.tensor(D), state=state).numpy())
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), whole, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(state, selective_scan_reference(x, delta, A, B, C, D)[1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_scan_kernels_readable_and_fast_agree(dtype):
    x, delta, A, B, C, D = scan_problem(dtype, batch=3, T=9, channels=7, N=4)
    h0 = randn(3, 7, 4, seed=3, dtype=dtype)
    outputs = []
    for forward in kernel_pair(selective_scan.selective_scan_forward):
        y, states = np.empty_like(x), np.empty((3, 9, 7, 4), dtype)
        forward(x, delta, A, B, C, D, h0, y, states)
        outputs.append((y, states))
    for name, readable, fast in zip(("y", "states"), *outputs):
        np.testing.assert_allclose(fast, readable, **AGREE[dtype], err_msg=name)
    assert outputs[1][0].dtype == dtype
    _, states = outputs[0]
    g = randn(3, 9, 7, seed=4, dtype=dtype)
    grads = []
    for backward in kernel_pair(selective_scan.selective_scan_backward):
        out = [np.full_like(a, np.nan) for a in (x, delta, A, B, C, D)]  # every number must be written
        backward(g, x, delta, A, B, C, D, h0, states, *out, np.empty(4, dtype))
        grads.append(out)
    for name, readable, fast in zip(("x", "delta", "A", "B", "C", "D"), *grads):
        np.testing.assert_allclose(fast, readable, **AGREE[dtype], err_msg=f"grad_{name}")
        assert fast.dtype == dtype


def test_scan_float32_against_float64(kernel_set):
    values = scan_problem(np.float64)
    y64 = F.selective_scan(*map(mt.tensor, values)).numpy()
    y32 = F.selective_scan(*(mt.tensor(v.astype(np.float32)) for v in values))
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32.numpy(), y64, rtol=1e-5, atol=1e-5)


def test_scan_errors_name_the_argument():
    x, delta, A, B, C, D = map(mt.tensor, scan_problem())
    with pytest.raises(InputError, match=r"selective_scan: x must be 3-d"):
        F.selective_scan(x[0], delta, A, B, C)
    with pytest.raises(InputError, match=r"selective_scan: A must be \(Dc, N\) = \(5, N\).*got shape \(4, 3\)"):
        F.selective_scan(x, delta, mt.tensor(np.zeros((4, 3))), B, C)
    with pytest.raises(InputError, match=r"selective_scan: B must have shape \(2, 6, 3\).*got \(2, 6, 2\)"):
        F.selective_scan(x, delta, A, B[:, :, :2], C)
    with pytest.raises(InputError, match=r"selective_scan: D must have shape \(5,\)"):
        F.selective_scan(x, delta, A, B, C, D[:3])
    with pytest.raises(InputError, match=r"selective_scan: state must be a float64 array of shape \(2, 5, 3\)"):
        F.selective_scan(x, delta, A, B, C, D, state=np.zeros((2, 5, 4)))
    with pytest.raises(InputTypeError, match=r"selective_scan: state must be None or a numpy array"):
        F.selective_scan(x, delta, A, B, C, D, state=[0.0])
    with pytest.raises(InputTypeError, match=r"selective_scan: delta must be a Tensor"):
        F.selective_scan(x, delta.numpy(), A, B, C)
    with pytest.raises(InputTypeError, match=r"selective_scan: inputs have different dtypes"):
        F.selective_scan(x, delta.to(mt.float32), A, B, C)


# --------------------------------------------------------------------------------- the block and the model


def ssm_model(dtype=mt.float64, **options):
    mt.manual_seed(0)
    fields = dict(vocab_size=11, block_size=12, n_layer=2, n_head=2, n_embd=8, mixer="ssm", d_state=3, d_conv=3)
    return GPT(GPTConfig(**{**fields, **options}), dtype=dtype)


def test_the_model_counts_its_parameters_and_starts_as_published():
    model = ssm_model()
    assert model.config.pos == "none" and "transformer.wpe.weight" not in dict(model.named_parameters())
    assert model.num_parameters() == parameter_count(model.config)
    mixer = model.transformer.h[0].ssm
    np.testing.assert_allclose(-np.exp(mixer.A_log.data[3]), [-1.0, -2.0, -3.0], rtol=1e-15)  # A = -(1 .. N): the S4D-real decays
    np.testing.assert_array_equal(mixer.D.data, 1.0)
    dt = softplus(mixer.dt_proj.bias).numpy()  # the initial Δ with a zero input: log-uniform in [0.001, 0.1]
    assert 0.001 <= dt.min() and dt.max() <= 0.1


@pytest.mark.parametrize("pieces", [[1] * 9, [4, 1, 3, 1], [9]], ids=["one-at-a-time", "several", "all-at-once"])
def test_the_recurrence_equals_the_full_forward(pieces, kernel_set):
    """Tokens fed through the caches, one at a time or several at once, give the logits of one
    forward over the whole sequence: the state (conv inputs, scan state) is all the past there is."""
    model = ssm_model().eval()
    idx = np.random.default_rng(1).integers(0, 11, (2, 9))
    with mt.no_grad():
        full = model(idx)[0].numpy()
        caches, offset, logits = model.new_caches(2), 0, []
        for n in pieces:
            logits.append(model(idx[:, offset : offset + n], caches=caches, offset=offset)[0].numpy())
            offset += n
    np.testing.assert_allclose(np.concatenate(logits, axis=1), full, rtol=1e-12, atol=1e-12)
    assert all(isinstance(c, SSMCache) and c.length == 9 for c in caches)


def test_generation_runs_through_the_modules_and_its_state_does_not_grow(kernel_set):
    model = ssm_model(dtype=mt.float32)
    assert model.new_cache_arrays(2) is None and not decode_kernel.can_run(model)
    assert not decode_kernel.can_run(ssm_model(dtype=mt.float32, pos="learned"))
    with Decoder(model, 2, 3) as decoder:
        assert decoder.kernel is None
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    cached = model.generate(prompt, 20, temperature=0).numpy()  # 23 tokens: the window moves past block_size 12
    np.testing.assert_array_equal(cached, model.generate(prompt, 20, temperature=0, use_kv_cache=False).numpy())
    # per layer: d_conv - 1 inputs of Di = 16 and a (Di, N) state, float32, at any length
    assert state_bytes(model) == 2 * (2 * 16 + 16 * 3) * 4 and model.kv_cache_bytes_per_token() == 0


def test_a_rollback_returns_to_a_kept_state_or_says_why_it_cannot(kernel_set):
    """Speculative decoding feeds k + 1 tokens and keeps the accepted ones: a state per position of
    the last feed is kept for it. Further back, a state of fixed size cannot go."""
    model = ssm_model().eval()
    idx = np.random.default_rng(2).integers(0, 11, (1, 8))
    with Decoder(model, 1, 3) as decoder:
        decoder.feed(idx[:, :3])
        decoder.feed(idx[:, :7])  # 4 new tokens
        decoder.rollback(5)
        again = decoder.feed(idx[:, :8])  # the tokens 5 .. 7 once more, from the state after 5
        with mt.no_grad():
            expected = model(idx)[0].numpy()[:, 5:]
        np.testing.assert_allclose(again, expected, rtol=1e-12, atol=1e-12)
        with pytest.raises(InputError, match=r"SSMCache: cannot go back from 8 tokens to 2: .*keeps one state"):
            decoder.rollback(2)


def test_speculative_decoding_with_an_ssm_target_gives_its_greedy_tokens(kernel_set):
    """A draft of another kind proposes, the SSM verifies 5 tokens per round and rolls back to the
    accepted ones: the tokens are the SSM's own greedy ones."""
    target = ssm_model()
    mt.manual_seed(1)
    draft = GPT(GPTConfig(vocab_size=11, block_size=12, n_layer=1, n_head=2, n_embd=8), dtype=mt.float64)
    prompt = np.array([[1, 2]])
    greedy = target.generate(prompt, 20, temperature=0).numpy()[0, 2:]
    tokens, stats = speculative_generate(target, draft, prompt, 20, 4, temperature=0)
    np.testing.assert_array_equal(np.asarray(tokens).ravel()[-20:], greedy)
    assert stats.proposed > stats.accepted  # some drafts were rejected: the state went back


def test_beam_search_reorders_the_states(kernel_set):
    cache = SSMCache(3, 4, 2, 3, np.float64)
    cache.conv_state[...] = np.arange(3)[:, None, None]
    cache.ssm_state[...] = np.arange(3)[:, None, None]
    other = cache.reordered(np.array([2, 2, 0, 1]))
    assert other.ssm_state[:, 0, 0].tolist() == [2, 2, 0, 1] and other.conv_state[:, 0, 0].tolist() == [2, 2, 0, 1]


@pytest.mark.parametrize(
    "fields, field, message",
    [
        (dict(n_kv_head=1), "n_kv_head", "n_kv_head \\(1\\) is attention's"),
        (dict(attention="online"), "attention", "attention online is attention's kernel"),
        (dict(pos="rope"), "pos", "pos rope acts inside attention"),
        (dict(pos="alibi"), "pos", "pos alibi acts inside attention"),
        (dict(d_state=0), "d_state", "d_state must be a positive integer"),
    ],
    ids=["n_kv_head", "online", "rope", "alibi", "d_state"],
)
def test_options_only_attention_has_are_refused(fields, field, message):
    with pytest.raises(ConfigError, match="GPTConfig: " + message) as error:
        GPTConfig(vocab_size=5, n_head=2, n_embd=8, mixer="ssm", **fields)
    assert error.value.field == field
    with pytest.raises(ConfigError, match="pos none needs mixer ssm"):
        GPTConfig(vocab_size=5, pos="none")


def test_flags_only_attention_has_are_refused_naming_the_flag(tmp_path, corpus, capsys):
    for flags, named in (
        (["--mixer", "ssm", "--n-kv-head", "1"], "--n-kv-head: given 1, expected no --n-kv-head with --mixer ssm"),
        (["--mixer", "ssm", "--attention", "online"], "--attention: given online, expected no --attention with --mixer ssm"),
        (["--mixer", "ssm", "--pos", "rope"], "--pos: given rope, expected none (the default with --mixer ssm)"),
        (["--d-state", "8"], "--d-state: given 8 without --mixer ssm"),
    ):
        assert train.main(["--data", corpus, "--out-dir", str(tmp_path / "out"), *TINY, "--max-iters", "1", *flags]) == 1
        assert named in said(capsys)


def parameters(folder):
    model_state, _, meta = checkpoint.load(folder / "out")
    return model_state, meta


@pytest.mark.slow
def test_an_ssm_run_resumes_exactly_generates_and_refuses_export(tmp_path, corpus, capsys):
    def run(folder, *extra):
        return train.main(["--data", corpus, "--out-dir", str(tmp_path / folder / "out"), *TINY, "--mixer", "ssm", "--d-state", "4", "--eval-interval", "3", *extra])

    assert run("whole", "--max-iters", "6") == 0
    assert "SSM state (generation)" in said(capsys)
    assert run("halves", "--max-iters", "3") == 0
    assert run("halves", "--max-iters", "6", "--resume") == 0
    (whole, meta), (resumed, _) = parameters(tmp_path / "whole"), parameters(tmp_path / "halves")
    assert meta["config"]["mixer"] == "ssm" and meta["config"]["pos"] == "none"
    for name in whole:
        np.testing.assert_array_equal(resumed[name], whole[name], err_msg=name)
    out = str(tmp_path / "whole" / "out")
    capsys.readouterr()
    assert generate.main(["--out-dir", out, "--prompt", "the", "--max-new-tokens", "30", "--temperature", "0"]) == 0
    assert "through the modules" in said(capsys)
    assert convert.main([out, str(tmp_path / "model.npz")]) == 1
    printed = capsys.readouterr()
    assert "an SSM cannot be exported to PyTorch" in " ".join((printed.out + printed.err).split())
