"""programs/loss_plot.py (the SVG plot and the text chart of a loss curve) and train.py's use of it:
loss.svg in --out-dir, the curve carried by the checkpoint across --resume, perplexities printed."""
import json
import math
import re
import xml.etree.ElementTree as ET
from itertools import pairwise

import numpy as np
import pytest
from test_programs import TINY, said, write_corpus

import train
from microtensor.errors import InputError
from gpt.checkpoints import checkpoint
from programs import loss_plot
from programs.loss_plot import BLOCKS, LossHistory, loss_curve_svg, loss_text_chart, running_mean, text_chart

SVG = "{http://www.w3.org/2000/svg}"


# ================================================================================= reading an SVG back


def parse(svg):
    return ET.fromstring(svg)  # raises ParseError for a document that is not well-formed XML


def by_id(root, name):
    found = [element for element in root.iter() if element.get("id") == name]
    assert len(found) == 1, f"{len(found)} elements with id {name}"
    return found[0]


def polyline_points(group):
    """The (x, y) points of the one <polyline> in group."""
    (line,) = group.iter(f"{SVG}polyline")
    return [tuple(float(v) for v in pair.split(",")) for pair in line.get("points").split()]


def marker_centers(group):
    centers = [(float(c.get("cx")), float(c.get("cy"))) for c in group.iter(f"{SVG}circle")]
    for square in group.iter(f"{SVG}rect"):
        x, y, w, h = (float(square.get(k)) for k in ("x", "y", "width", "height"))
        centers.append((x + w / 2, y + h / 2))
    return centers


def plot_area(root):
    rect = by_id(root, "plot-area")
    x, y, w, h = (float(rect.get(k)) for k in ("x", "y", "width", "height"))
    return x, y, x + w, y + h


def texts(root):
    return ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]


def curve(n, seed=0):
    """A falling, noisy loss curve of n steps."""
    rng = np.random.default_rng(seed)
    return list(1.5 + 2.5 * np.exp(-np.arange(n) / (n / 4)) + rng.normal(0, 0.1, n))


EVALUATIONS = [(10, 3.1, 3.2), (20, 2.2, 2.35), (30, 1.9, 2.1), (37, 1.8, 2.05)]


# ================================================================================= the SVG


def test_the_svg_parses_and_has_every_series_with_one_point_per_step():
    losses = curve(37)
    root = parse(loss_curve_svg(losses, first_step=0, evaluations=EVALUATIONS, title="a run"))
    assert root.tag == f"{SVG}svg"
    assert len(polyline_points(by_id(root, "train-loss-per-step"))) == 37
    assert len(polyline_points(by_id(root, "train-loss-running-mean"))) == 37
    for series in ("estimated-train-loss", "estimated-val-loss"):
        group = by_id(root, series)
        assert len(polyline_points(group)) == len(marker_centers(group)) == len(EVALUATIONS)
        tooltips = ["".join(t.itertext()) for t in group.iter(f"{SVG}title")]
        assert tooltips[1].startswith("step 20: estimated") and "(perplexity" in tooltips[1]


def test_every_point_is_inside_the_plot_area():
    root = parse(loss_curve_svg(curve(50, seed=1), first_step=3, evaluations=[(3, 4.4, 4.5), (25, 2.0, 2.2), (53, 1.4, 1.9)]))
    left, top, right, bottom = plot_area(root)
    points = polyline_points(by_id(root, "train-loss-per-step")) + polyline_points(by_id(root, "train-loss-running-mean"))
    points += marker_centers(by_id(root, "estimated-train-loss")) + marker_centers(by_id(root, "estimated-val-loss"))
    assert len(points) == 50 + 50 + 3 + 3
    for x, y in points:
        assert left <= x <= right and top <= y <= bottom, (x, y)
    xs = [x for x, _ in points]
    assert min(xs) == pytest.approx(left) and max(xs) == pytest.approx(right)  # the steps fill the width


def test_the_axes_have_labels_ticks_a_legend_and_a_title():
    root = parse(loss_curve_svg(curve(30), evaluations=EVALUATIONS[:2], title="training loss of out/ckpt.npz"))
    assert "".join(by_id(root, "x-label").itertext()) == "step"
    assert "".join(by_id(root, "y-label").itertext()) == "loss (nats)"
    words = texts(root)
    assert "training loss of out/ckpt.npz" in words
    for label in ("loss of each step's batch", "running mean over 1 step", "estimated train loss", "estimated val loss"):
        assert label in words
    x_ticks = [t for t in root.iter(f"{SVG}text") if t.get("class") == "x-tick"]
    y_ticks = [t for t in root.iter(f"{SVG}text") if t.get("class") == "y-tick"]
    assert len(x_ticks) >= 3 and len(y_ticks) >= 3


def test_a_higher_loss_is_higher_on_the_page_and_a_later_step_further_right():
    losses = [2.0, 3.5, 1.0, 2.5, 4.0, 1.5, 3.0, 0.5]
    root = parse(loss_curve_svg(losses, first_step=10, evaluations=[(12, 1.0, 4.0)]))
    points = polyline_points(by_id(root, "train-loss-per-step"))
    xs = [x for x, _ in points]
    assert xs == sorted(xs) and len(set(xs)) == len(xs)
    by_loss = sorted(zip(losses, (y for _, y in points)))
    ys = [y for _, y in by_loss]
    assert all(lower > higher for lower, higher in pairwise(ys))  # SVG's y points down
    # Every series shares the mapping: the markers of losses 1.0 and 4.0 at step 12 sit exactly
    # where the per-step point of step 12 (loss 1.0) and of step 14 (loss 4.0) sit.
    (train_marker,) = marker_centers(by_id(root, "estimated-train-loss"))
    (val_marker,) = marker_centers(by_id(root, "estimated-val-loss"))
    assert train_marker == pytest.approx(points[2])
    assert val_marker[0] == pytest.approx(points[2][0]) and val_marker[1] == pytest.approx(points[4][1])


def test_the_tick_labels_stand_where_their_values_are():
    """A tick's label, read as a number, mapped through the line the data points define."""
    losses = curve(60, seed=2)
    root = parse(loss_curve_svg(losses, first_step=0))
    points = polyline_points(by_id(root, "train-loss-per-step"))
    (x0, y0), (x1, y1) = points[0], points[-1]
    for tick in root.iter(f"{SVG}text"):
        if tick.get("class") == "y-tick":
            value = float(tick.text)
            expected = y0 + (value - losses[0]) / (losses[-1] - losses[0]) * (y1 - y0)
            assert float(tick.get("y")) - 4 == pytest.approx(expected, abs=0.05)  # coordinates have 2 decimals
        elif tick.get("class") == "x-tick":
            step = int(tick.text.replace(",", ""))
            assert float(tick.get("x")) == pytest.approx(x0 + step / 59 * (x1 - x0), abs=0.01)


def test_the_running_mean_is_centered_and_shrinks_at_the_ends():
    values = [float(v) for v in np.random.default_rng(3).normal(size=23)]
    for window in (1, 3, 7, 23, 45):
        half = window // 2
        expected = []
        for i in range(len(values)):
            reach = min(half, i, len(values) - 1 - i)
            expected.append(np.mean(values[i - reach : i + reach + 1]))
        np.testing.assert_allclose(running_mean(values, window), expected, rtol=1e-12)
    with pytest.raises(InputError, match="odd number"):
        running_mean(values, 4)
    assert loss_plot.smoothing_window(2000) == 101 and loss_plot.smoothing_window(5) == 1


def test_text_in_the_svg_is_escaped_and_an_empty_curve_still_draws():
    root = parse(loss_curve_svg([], title="<out> & [bold]", note='a "note" <here>'))
    assert "<out> & [bold]" in texts(root) and 'a "note" <here>; no step recorded yet' in texts(root)
    assert len(polyline_points(by_id(root, "train-loss-per-step"))) == 0
    assert "no step recorded yet" in texts(parse(loss_curve_svg([])))


@pytest.mark.parametrize("losses, evaluations", [([1.0, math.nan], []), ([1.0], [(1, 1.0, math.inf)])])
def test_a_non_finite_loss_is_refused(losses, evaluations):
    with pytest.raises(InputError, match="must be finite"):
        loss_curve_svg(losses, evaluations=evaluations)


# ================================================================================= the text chart


def bar_heights(rows):
    """Each column's height in eighths of a row, read back from the block characters."""
    return [sum(BLOCKS.index(row[c]) for row in rows) for c in range(len(rows[0]))]


@pytest.mark.parametrize("values, width, height", [([3, 1, 4, 1, 5, 9, 2, 6], 40, 3), ([3, 1, 4, 1, 5, 9, 2, 6], 8, 1)])
def test_the_text_chart_has_a_column_per_value_and_its_tallest_bar_at_the_largest(values, width, height):
    rows = text_chart(values, width=width, height=height)
    assert len(rows) == height and all(len(row) == len(values) for row in rows)
    heights = bar_heights(rows)
    assert heights.index(max(heights)) == values.index(max(values)) and max(heights) == 8 * height
    assert min(heights) == 1  # the smallest value still shows
    assert [a <= b for a, b in pairwise(heights)] == [a <= b for a, b in pairwise(values)]  # in the values' order


def test_a_long_curve_is_charted_as_column_means():
    values = [2.0] * 400
    values[130:140] = [5.0] * 10  # the mean of column 13 of 40 (values 130 to 139)
    values[300:310] = [1.0] * 10  # and column 30, the smallest
    rows = text_chart(values, width=40, height=4)
    assert len(rows) == 4 and all(len(row) == 40 for row in rows)
    heights = bar_heights(rows)
    assert heights.index(max(heights)) == 13 and heights[13] == 32
    assert heights.index(min(heights)) == 30 and heights[30] == 1


def test_the_labelled_chart_has_rows_of_equal_length_with_its_scale():
    lines = loss_text_chart(curve(500), first_step=100, width=40, height=4)
    assert len(lines) == 5 and len({len(line) for line in lines}) == 1
    assert re.match(r"\d\.\d\d ┤", lines[0]) and re.match(r"\d\.\d\d ┤", lines[3])
    assert lines[-1].split() == ["step", "100", "599"]
    assert loss_text_chart([4.0, 3.0, 3.5, 2.0, 2.5], width=40)[-1].split() == ["steps", "0-4"]  # too narrow for both ends
    assert loss_text_chart([]) == ["no step recorded"]


# ================================================================================= the record


def test_a_loss_history_goes_through_json_and_refuses_what_does_not_fit():
    history = LossHistory(first_step=2, losses=[3.0, 2.5, 2.25], evaluations=[(4, 2.4, 2.6)])
    history.add_evaluation(5, 2.2, 2.4)
    history.add_evaluation(5, 2.2, 2.4)  # the same step again: not doubled
    record = json.loads(json.dumps(history.to_json()))
    assert LossHistory.from_json(record, 5) == history
    assert history.note().startswith("the losses start at step 2") and LossHistory().note() is None
    bad = {
        "too short": ({**record, "losses": [3.0]}, "must hold 3 losses (steps 2 to 4)"),
        "nan": ({**record, "losses": [3.0, float("nan"), 2.0]}, "not a finite number"),
        "bool": ({**record, "losses": [3.0, True, 2.0]}, "not a finite number"),
        "string": ({**record, "losses": [3.0, "2.5", 2.0]}, "not a finite number"),
        "late start": ({**record, "first_step": 9}, "starts at step 9"),
        "missing key": ({"losses": []}, "must be an object"),
        "not an object": ([1, 2], "must be an object"),
        "evaluation": ({**record, "evaluations": [[4, 2.4]]}, "evaluations must be"),
        "evaluation later": ({**record, "evaluations": [[6, 2.4, 2.5]]}, "evaluations must be"),
    }
    for name, (record_, message) in bad.items():
        with pytest.raises(InputError, match=re.escape(message)):
            LossHistory.from_json(record_, 5)
            pytest.fail(name)


# ================================================================================= train.py


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(tmp_path / "corpus.txt")


def arguments(out, corpus, *extra):
    return ["--data", corpus, "--out-dir", str(out), *TINY, "--sample-chars", "0", *extra]


def run(out, corpus, *extra):
    """train.train with these flags: its results."""
    return train.train(train.build_parser().parse_args(arguments(out, corpus, *extra)))


def test_train_writes_the_plot_and_prints_each_loss_with_its_perplexity(tmp_path, corpus, capsys):
    assert train.main(arguments(tmp_path / "out", corpus, "--max-iters", "7", "--eval-interval", "3")) == 0
    out = said(capsys)
    root = parse((tmp_path / "out" / "loss.svg").read_text(encoding="utf-8"))
    assert len(polyline_points(by_id(root, "train-loss-per-step"))) == 7
    assert len(marker_centers(by_id(root, "estimated-val-loss"))) == 3  # steps 3, 6 and the end, 7
    assert f"training loss of {tmp_path / 'out' / 'ckpt.npz'}, step 7" in texts(root)
    printed = re.findall(r"(\w+) loss\W+(\d+\.\d{4}) \(perplexity (\d+\.\d{2})\)", out)
    assert [kind for kind, _, _ in printed] == ["train", "val", "train", "val", "train", "val", "val"]  # steps 3, 6, the table
    for _, loss, ppl in printed:
        # exp of the printed loss, which is rounded to 4 decimals, to the 2 decimals printed
        assert abs(math.exp(float(loss)) - float(ppl)) <= 0.005 + math.exp(float(loss)) * 0.5e-4, (loss, ppl)
    assert "step 3: train loss" in out and "loss plot" in out
    assert str(tmp_path / "out" / "loss.svg") in re.sub(r"[\s│]", "", out)  # the path, even if the table's cell wraps it
    assert re.search(r"┤[▁▂▃▄▅▆▇█]{7} │ │ │ steps 0-6 │", out)  # the text chart's bottom row (a column per step), its steps


def test_a_resumed_run_plots_the_whole_curve(tmp_path, corpus):
    whole = run(tmp_path / "one", corpus, "--max-iters", "6", "--eval-interval", "2")
    run(tmp_path / "two", corpus, "--max-iters", "3", "--eval-interval", "2")
    resumed = run(tmp_path / "two", corpus, "--max-iters", "6", "--eval-interval", "2", "--resume")
    assert resumed["steps"] == 3 and resumed["loss_curve"]["first_step"] == 0
    assert resumed["loss_curve"]["losses"] == whole["loss_curve"]["losses"]  # resuming is exact
    assert len(whole["loss_curve"]["losses"]) == 6 and all(math.isfinite(v) for v in whole["loss_curve"]["losses"])
    assert [e[0] for e in resumed["loss_curve"]["evaluations"]] == [2, 3, 4, 6]  # the first run's end included
    root = parse((tmp_path / "two" / "loss.svg").read_text(encoding="utf-8"))
    assert len(polyline_points(by_id(root, "train-loss-per-step"))) == 6
    assert not any(t.startswith("the losses start") for t in texts(root))


def rewrite_meta(out, change):
    path = checkpoint.path_in(out)
    with np.load(path) as archive:
        arrays = {name: archive[name] for name in archive.files}
    meta = json.loads(str(arrays["meta"]))
    change(meta)
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(path, **arrays)


@pytest.mark.parametrize(
    "change, said_",
    [
        (lambda meta: meta.pop("loss_curve"), "note: the checkpoint carries no loss curve: the plot of the losses starts at step 2"),
        (lambda meta: meta["loss_curve"]["losses"].pop(), "its loss curve must hold 2 losses (steps 0 to 1); the plot of the losses starts at step 2"),
    ],
    ids=["no-curve", "damaged-curve"],
)
def test_a_checkpoint_without_a_usable_curve_is_resumed_and_the_plot_says_where_it_starts(tmp_path, corpus, capsys, change, said_):
    out = tmp_path / "out"
    assert train.main(arguments(out, corpus, "--max-iters", "2", "--eval-interval", "100")) == 0
    rewrite_meta(out, change)
    capsys.readouterr()
    assert train.main(arguments(out, corpus, "--max-iters", "4", "--eval-interval", "100", "--resume")) == 0
    assert said_ in said(capsys)
    root = parse((out / "loss.svg").read_text(encoding="utf-8"))
    assert len(polyline_points(by_id(root, "train-loss-per-step"))) == 2  # steps 2 and 3
    assert any(t.startswith("the losses start at step 2:") for t in texts(root))
    assert checkpoint.load(out)[2]["loss_curve"]["first_step"] == 2  # and the next resume keeps that


@pytest.mark.parametrize("why", ["a folder in the way", "an infinite val loss"])
def test_a_plot_that_cannot_be_written_is_said_and_training_goes_on(tmp_path, corpus, capsys, monkeypatch, why):
    out = tmp_path / "out"
    if why == "a folder in the way":
        (out / "loss.svg").mkdir(parents=True)
        reason = "Is a directory"
    else:
        monkeypatch.setattr(train, "estimate_loss", lambda *args: {"train": 2.0, "val": math.inf})
        reason = "the evaluations' losses must be finite numbers, got inf"
    assert train.main(arguments(out, corpus, "--max-iters", "4", "--eval-interval", "2")) == 0
    text = said(capsys)
    assert text.count("note: could not write the loss plot") == 2 and text.count(reason) == 2  # steps 2 and 4
    assert "training goes on" in text and checkpoint.load(out)[2]["iteration"] == 4
    assert sorted(p.name for p in out.iterdir()) == ["ckpt.npz"] + ["loss.svg"] * (why == "a folder in the way")  # no temporary file left
