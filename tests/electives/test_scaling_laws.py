"""The scaling-law sweep (bench/cases/electives/scaling_laws.py): the fit recovers the constants of
points drawn from the law, N and C count what the model holds and computes, the IsoFLOP minimum is
the parabola's, the figures are SVG with a marker per run, a tiny sweep runs end to end, bad flags
are clear errors naming the flag, and the docs page's results are the committed numbers'."""
import importlib
import json
import math
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from microtensor import MicrotensorError
from gpt.model.transformer import GPT
from test_programs import corpus  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))  # the case imports the harness from there
harness = importlib.import_module("harness")
cases = importlib.import_module("cases")
scaling = importlib.import_module("cases.electives.scaling_laws")
RESULTS = ROOT / "bench" / "results" / "intel-xeon-sapphire-rapids-or-later" / "scaling_laws.json"  # the sweep the page shows
SVG = "{http://www.w3.org/2000/svg}"
TRUE = {"E": 1.4, "A": 30.0, "alpha": 0.4, "B": 60.0, "beta": 0.35}


def parse(argv):
    case = cases.BY_NAME["scaling_laws"]
    return harness.case_parser(case, scaling).parse_args(argv)


def tiny_flags(data, tmp_path):
    return [
        "--data", str(data), "--sizes", "1x16,1x32", "--isoflop-sizes", "1x16,1x32,2x32", "--tokens", "256",
        "--compute", "2e7", "--batch-size", "4", "--block-size", "16", "--val-tokens", "256", "--bootstrap", "10",
        "--figures", str(tmp_path / "figures"), "--page", str(tmp_path / "page.md"),
    ]  # fmt: skip


def synthetic_points(noise, seed=0):
    """The law with TRUE's constants on a grid of N and D, each loss times exp(noise × a normal draw)."""
    n, d = (a.ravel() for a in np.meshgrid(np.geomspace(2e4, 3e6, 6), np.geomspace(1e5, 3e6, 5)))
    theta = [math.log(TRUE["E"]), math.log(TRUE["A"]), TRUE["alpha"], math.log(TRUE["B"]), TRUE["beta"]]
    loss = scaling.law(theta, n, d) * np.exp(noise * np.random.default_rng(seed).standard_normal(n.shape))
    return n, d, loss


def test_the_fit_recovers_known_constants_within_their_uncertainty():
    n, d, loss = synthetic_points(noise=0.003)
    fitted = scaling.fit_law(n, d, loss, bootstrap=100, seed=1)
    for name, true in TRUE.items():
        spread = fitted["uncertainty"][name]
        assert spread["low"] <= true <= spread["high"], (name, true, spread, fitted["constants"][name])
        assert spread["std"] > 0
    assert fitted["rms_log_error"] < 0.006  # the noise's own size: the fit finds the law, not a worse local minimum


def test_the_fit_is_exact_without_noise():
    n, d, loss = synthetic_points(noise=0.0)
    fitted = scaling.fit_law(n, d, loss, bootstrap=0)
    for name, true in TRUE.items():
        assert fitted["constants"][name] == pytest.approx(true, rel=1e-5), name


@pytest.mark.parametrize("n_layer, n_embd", [(1, 16), (2, 32), (3, 64), (4, 128)])
def test_n_counts_the_models_parameters_but_its_embeddings(n_layer, n_embd):
    config = scaling.model_config(n_layer, n_embd, vocab_size=65, block_size=32)
    model = GPT(config)
    named = dict(model.named_parameters())
    embeddings = {"transformer.wte.weight", "transformer.wpe.weight"}
    assert embeddings <= set(named)
    n = scaling.non_embedding_parameters(config)
    assert n == sum(p.data.size for name, p in named.items() if name not in embeddings)
    # 12 C² per block (attention's 4 C², the MLP's 8 C²) and a weight of C per LayerNorm
    assert n == 12 * n_layer * n_embd**2 + (2 * n_layer + 1) * n_embd


def test_c_is_six_flops_per_parameter_and_token():
    config = scaling.model_config(2, 32, vocab_size=65, block_size=32)
    n = scaling.non_embedding_parameters(config)
    matrices = [p for name, p in GPT(config).named_parameters() if p.data.ndim == 2 and name not in ("transformer.wte.weight", "transformer.wpe.weight")]
    # forward: a multiply and an add per weight of each matrix and token; the norms' C per layer are the rest of N
    forward_per_token = 2 * sum(p.data.size for p in matrices)
    assert forward_per_token == 2 * n - 2 * (2 * 2 + 1) * 32
    assert scaling.training_flops(n, 1000) == 6 * n * 1000


def test_the_isoflop_minimum_of_a_parabola():
    n = np.geomspace(2e4, 2e6, 7)
    loss = 0.2 * (np.log(n) - math.log(1.5e5)) ** 2 + 1.8
    minimum = scaling.isoflop_minimum(n, loss, bootstrap=20)
    assert minimum["n_opt"] == pytest.approx(1.5e5, rel=1e-9)
    assert minimum["loss_opt"] == pytest.approx(1.8, abs=1e-12)
    assert minimum["n_opt_low"] == pytest.approx(1.5e5, rel=1e-6) and minimum["n_opt_high"] == pytest.approx(1.5e5, rel=1e-6)
    n_max, _, _ = scaling.parabola_minimum(n, -loss)
    assert n_max is None  # a parabola that opens downward has no minimum


def test_the_laws_optimum_is_the_minimum_along_c():
    compute = 1e13
    n = np.geomspace(1e3, 1e9, 200_001)
    theta = [math.log(TRUE["E"]), math.log(TRUE["A"]), TRUE["alpha"], math.log(TRUE["B"]), TRUE["beta"]]
    brute_force = n[np.argmin(scaling.law(theta, n, compute / (6 * n)))]
    assert scaling.law_optimum(TRUE, compute) == pytest.approx(brute_force, rel=1e-3)


def fake_results(runs_per_sweep=(7, 6)):
    """A results dict shaped like the case's, from the law itself."""
    runs = []
    for sweep, count in zip(("tokens", "isoflop"), runs_per_sweep):
        for i in range(count):
            n = int(2e4 * 2.0**i)
            tokens = 200_000 if sweep == "tokens" else int(6e11 / (6 * n))
            loss = float(scaling.law([math.log(1.4), math.log(30), 0.4, math.log(60), 0.35], n, tokens))
            runs.append({
                "sweep": sweep, "n_layer": 2, "n_embd": 32 * (i + 1), "n_head": 2, "parameters": n + 4000, "non_embedding": n,
                "steps": tokens // 1024, "tokens": tokens, "flops": 6 * n * tokens, "val_loss": loss, "train_time_s": 1.0,
                "seconds_per_step": 0.01,
            })  # fmt: skip
    iso = [r for r in runs if r["sweep"] == "isoflop"]
    minimum = scaling.isoflop_minimum([r["non_embedding"] for r in iso], [r["val_loss"] for r in iso], bootstrap=5)
    minimum.update(d_opt=6e11 / (6 * minimum["n_opt"]), law_n_opt=scaling.law_optimum(TRUE, 6e11))
    settings = {"sizes": "", "tokens": 200_000, "isoflop_sizes": "", "compute": 6e11, "block_size": 64, "batch_size": 16,
                "learning_rate": 2e-3, "val_tokens": 32768, "bootstrap": 5, "seed": 0, "data": "made-up.txt"}  # fmt: skip
    fit = {"constants": dict(TRUE), "rms_log_error": 0.0, "resamples": 5,
           "uncertainty": {name: {"std": 0.1, "low": v - 0.1, "high": v + 0.1} for name, v in TRUE.items()}}  # fmt: skip
    return {"machine": {}, "scaling_laws": {
        "settings": settings, "runs": runs, "fit": fit, "isoflop": minimum, "wall_time_s": 60.0,
        "load_average_1min": [1.0, 1.5], "reference_step_s": {"before": 0.035, "after": 0.036},
    }}  # fmt: skip


def test_the_figures_are_svg_with_a_marker_per_run():
    data = fake_results((7, 6))
    figures = scaling.figures(data)
    for name, count in (("tokens", 7), ("isoflop", 6)):
        root = ET.fromstring(figures[name])  # well-formed XML, or this raises
        assert root.tag == f"{SVG}svg"
        groups = {g.get("id"): g for g in root.iter(f"{SVG}g")}
        assert len(groups["runs"].findall(f"{SVG}circle")) == count
        assert len(groups["law"].find(f"{SVG}polyline").get("points").split()) == 60
    assert "minimum" in {g.get("id") for g in ET.fromstring(figures["isoflop"]).iter(f"{SVG}g")}


def test_a_tiny_sweep_runs_end_to_end(corpus, tmp_path):  # noqa: F811 (corpus is a fixture)
    args = parse(tiny_flags(corpus, tmp_path))
    data = scaling.sweep(args, reference=False)
    result = json.loads(json.dumps(data))["scaling_laws"]  # what the JSON file holds
    assert [(r["sweep"], r["n_layer"], r["n_embd"]) for r in result["runs"]] == [
        ("tokens", 1, 16), ("tokens", 1, 32), ("isoflop", 1, 16), ("isoflop", 1, 32), ("isoflop", 2, 32)
    ]  # fmt: skip
    for run in result["runs"]:
        assert run["tokens"] == run["steps"] * 4 * 16 and run["flops"] == 6 * run["non_embedding"] * run["tokens"]
        assert math.isfinite(run["val_loss"]) and 0 < run["val_loss"] < 10
    assert set(result["fit"]["constants"]) == {"E", "A", "alpha", "B", "beta"}
    written = scaling.write_docs(data, args.figures, args.page)
    assert [p.name for p in written] == ["scaling-tokens.svg", "scaling-isoflop.svg", "page.md"]
    page = Path(args.page).read_text()
    assert page.startswith(scaling.BEGIN) and page.rstrip().endswith(scaling.END)
    assert page.count("| fixed D |") == 2 and page.count("| IsoFLOP |") == 3


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--sizes", ""], "--sizes"),
        (["--sizes", " , "], "--sizes"),
        (["--isoflop-sizes", "2x32,big"], "--isoflop-sizes"),
        (["--isoflop-sizes", "1x16,1x32"], "--isoflop-sizes"),
        (["--tokens", "63"], "--tokens"),  # one batch is 4 × 16 = 64 tokens
        (["--compute", "1e5"], "--compute"),  # below 6 N × one batch for 2x32
        (["--compute", "nan"], "--compute"),
        (["--sizes", "1x97"], "--sizes"),  # 97 channels do not divide among its 97 // 32 = 3 heads
        (["--reference-steps", "-1"], "--reference-steps"),
    ],
)
def test_bad_flags_are_errors_naming_the_flag(corpus, tmp_path, flags, named):  # noqa: F811
    args = parse(tiny_flags(corpus, tmp_path) + flags)
    with pytest.raises(MicrotensorError) as error:
        scaling.sweep(args, reference=False)
    assert str(error.value).startswith(f"{named}: given"), str(error.value)


def test_the_page_and_figures_are_the_committed_results():
    if not RESULTS.exists():
        pytest.skip("no results yet: python bench/run.py scaling_laws")
    data = json.loads(RESULTS.read_text())
    page = (ROOT / "docs" / "electives" / "scaling-laws.md").read_text()
    assert scaling.page_with_results(page, data) == page, "run python bench/cases/electives/scaling_laws.py --render"
    for name, svg in scaling.figures(data).items():
        assert (ROOT / "docs" / "images" / scaling.FIGURE_NAMES[name]).read_text() == svg, name
