"""microtensor.debug.profile: calls, time, FLOPs from shapes, bytes moved and saved, peak memory,
MFU and "everything else", as a table and as data; a block that raises keeps its error."""
import io
import json

import numpy as np
import pytest
from rich.console import Console

import microtensor as mt
import microtensor.debug as debug
import microtensor.functional as F
from microtensor import autograd, optim
from microtensor.profiler import FLOP_RULES, OUTSIDE_OPS, _visible_pairs, count_flops

PEAK = 1e11  # FLOP/s given, so that no test waits for the GEMM measurement


def quiet(**options):
    return debug.profile(show=False, gemm_peak=PEAK, **options)


def test_a_matmul_is_counted_from_its_shapes_both_ways():
    a = mt.randn(4, 3, requires_grad=True)
    b = mt.randn(3, 5, requires_grad=True)
    with quiet() as prof:
        (a @ b).sum().backward()
    report = prof.report
    forward, backward = report.row("MatMul"), report.row("MatMul", "backward")
    assert forward.calls == backward.calls == 1
    assert forward.flops == 2 * 4 * 5 * 3 and backward.flops == 2 * forward.flops
    assert forward.bytes_moved == (12 + 15 + 20) * 4  # a, b in, the product out
    assert forward.intensity == forward.flops / forward.bytes_moved
    assert forward.saved_bytes == 0  # it saved a and b: leaves, not activations
    assert report.flops == sum(r.flops for r in report.rows if r.flops is not None)
    assert report.mfu == pytest.approx(report.flops / report.wall_seconds / PEAK)
    assert autograd._observer is None


def test_activations_saved_for_backward_are_counted_once():
    x = mt.randn(8, 16, requires_grad=True)
    with quiet() as prof:
        hidden = F.gelu(x * 2.0, approximate="tanh")  # GELU saves its input, the product: an activation
        (hidden * hidden).sum().backward()  # Mul saves hidden twice: counted once
    report = prof.report
    assert report.row("GELU").saved_bytes == 8 * 16 * 4
    assert report.row("Mul").saved_bytes == 8 * 16 * 4  # x * 2.0 saves nothing new; hidden once
    assert report.saved_bytes == 2 * 8 * 16 * 4
    assert report.peak_bytes >= report.saved_bytes
    assert report.rss_peak_bytes > 0


def test_phases_everything_else_and_the_data():
    w = mt.randn(6, 6, requires_grad=True)
    opt = optim.SGD([w], lr=0.1)
    with quiet() as prof:
        loss = ((mt.randn(2, 6) @ w) ** 2).mean()
        loss.backward()
        with prof.phase("optimizer"):
            opt.step()
    report = prof.report
    phases = report.phase_seconds()
    assert set(phases) == {"forward", "backward", "optimizer"}
    assert report.row(OUTSIDE_OPS, "optimizer").seconds > 0
    in_rows = sum(r.seconds for r in report.rows)
    assert report.everything_else_seconds == pytest.approx(report.wall_seconds - in_rows)
    assert 0 <= report.everything_else_seconds < report.wall_seconds
    data = json.loads(json.dumps(report.to_dict()))
    assert {row["op"] for row in data["rows"]} >= {"MatMul", "Pow", "Mean", OUTSIDE_OPS}
    assert data["rows"][0]["seconds"] >= data["rows"][-1]["seconds"]


def test_the_table_prints_every_row_and_the_totals():
    out = io.StringIO()
    with debug.profile(console=Console(file=out, width=200), gemm_peak=PEAK) as prof:
        (mt.randn(3, 3, requires_grad=True) @ mt.randn(3, 3)).sum().backward()
    text = out.getvalue()
    for expected in ("MatMul", "backward", "everything else", "MFU", "GFLOP/s", "FLOP/byte", "saved for backward"):
        assert expected in text
    assert prof.report.error is None


def test_a_block_that_raises_prints_the_partial_table_and_lets_the_error_through():
    out = io.StringIO()
    error = RuntimeError("the user's own failure")
    with pytest.raises(RuntimeError) as caught:
        with debug.profile(console=Console(file=out, width=200), show=False, gemm_peak=PEAK) as prof:
            (mt.randn(2, 2, requires_grad=True) @ mt.randn(2, 2)).sum()
            raise error
    assert caught.value is error
    assert "partial" in out.getvalue() and "MatMul" in out.getvalue()
    assert prof.report.error == "RuntimeError: the user's own failure"
    assert autograd._observer is None
    with pytest.raises(mt.InputError, match="matmul"):  # an op's own error, too, comes through as itself
        with quiet():
            mt.randn(2, 3) @ mt.randn(2, 3)


def test_profile_and_anomaly_mode_nest():
    x = mt.tensor(np.array([0.0, 1.0], dtype=np.float32), requires_grad=True)
    with pytest.raises(mt.AnomalyError, match="Log"):
        with mt.detect_anomaly(), quiet() as prof:
            (x * 1.0).log()
    assert prof.report.row("Mul").calls == 1  # the partial report: the ops before the one that failed
    assert prof.report.row("Log") is None
    assert autograd._observer is None


def test_causal_attention_counts_the_pairs_the_mask_leaves():
    for tq, tk in ((1, 1), (3, 3), (2, 5), (4, 7)):
        visible = sum(1 for i in range(tq) for j in range(tk) if j <= tk - tq + i)
        assert _visible_pairs(tq, tk, True) == visible
        assert _visible_pairs(tq, tk, False) == tq * tk
    qkv = mt.randn(2, 8, 3 * 4 * 2)  # B 2, T 8, 4 heads of 2 channels
    from microtensor.ops.attention import MultiHeadAttention

    forward, backward = count_flops(MultiHeadAttention, (qkv, 4, 4, True, None), (2, 8, 8))
    pairs = 2 * 4 * (8 * 9 // 2)
    assert forward == pairs * (4 * 2 + 5) and backward == pairs * (8 * 2 + 4)


def test_every_op_of_the_default_gpt_has_a_flop_rule():
    from gpt.model.transformer import GPT, GPTConfig

    mt.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8))
    idx = np.random.default_rng(0).integers(0, 11, (2, 8))
    with quiet() as prof:
        _, loss = model(mt.tensor(idx), mt.tensor(idx))
        loss.backward()
    report = prof.report
    unknown = sorted({r.op for r in report.rows if r.flops is None})
    assert not unknown, f"ops without a rule in FLOP_RULES: {unknown}"
    assert {"MatMul", "MultiHeadAttention", "LayerNorm", "GELU", "CrossEntropy", "Embedding"} <= set(FLOP_RULES)
    assert report.row("MatMul").flops > 0 and report.row("MatMul", "backward").flops == 2 * report.row("MatMul").flops


def test_bad_arguments_are_named():
    with pytest.raises(mt.InputTypeError, match="gemm_peak"):
        debug.profile(gemm_peak="fast")
    with pytest.raises(mt.InputError, match="positive"):
        debug.profile(gemm_peak=-1.0)
    with quiet() as prof:
        with pytest.raises(mt.InputError, match="phase"):
            with prof.phase("backward"):
                pass


def test_the_measured_peaks_are_positive_and_measured_once():
    assert debug.measure_gemm_peak(n=64, repeats=2) > 0
    assert debug.measure_gemm_peak(n=64, repeats=2) == debug.measure_gemm_peak(n=64, repeats=2)
    assert debug.measure_memory_bandwidth(nbytes=2**20, repeats=2) > 0


def test_train_profiles_the_step_it_is_asked_to(tmp_path, capsys):
    import train

    corpus = tmp_path / "corpus.txt"
    rng = np.random.default_rng(0)
    corpus.write_text(" ".join(["the", "king", "and", "queen"][i] for i in rng.integers(0, 4, 2000)) + "\n")
    argv = ["--data", str(corpus), "--out-dir", str(tmp_path / "out"), "--n-layer", "1", "--n-head", "2", "--n-embd", "16",
            "--block-size", "16", "--batch-size", "4", "--eval-iters", "1", "--sample-chars", "0", "--max-iters", "3"]  # fmt: skip
    assert train.main([*argv, "--profile", "1"]) == 0
    said = capsys.readouterr().out
    assert said.count("everything else") == 1 and "MultiHeadAttention" in said and "optimizer" in said
    assert train.main([*argv, "--profile", "3", "--force"]) == 1
    assert "--profile: given 3, expected a step this run takes, from 0 to 2" in " ".join(capsys.readouterr().out.split())
