"""The loss curve of a training run, drawn twice: an SVG file for a browser, a text chart for a terminal.

What is drawn
-------------
train.py records two kinds of loss, both cross-entropies in nats (natural logarithms):

- the loss of every training step: the mean cross-entropy of that step's batch, the very number
  whose gradient the step followed. A batch is a few random windows of text, so this number is
  noisy; the plot draws it as a thin pale line and, over it, its running mean (the mean of a window
  of steps centered on each step, see `running_mean`), so that the trend reads through the noise.
- every --eval-interval steps, an estimate of the loss on the train split and on the val split,
  each the mean over many batches (so far less noisy), drawn as markers joined by lines. A val loss
  that rises while the train loss keeps falling is overfitting: the model learns its training text
  by heart instead of the language.

Perplexity is exp(loss): a model with perplexity p is as unsure of the next character as a uniform
choice among p characters would be. An untrained model guesses uniformly over the whole vocabulary,
so it starts near perplexity = vocabulary size (loss = ln vocabulary size).

Why SVG written by hand
-----------------------
An SVG file is text: a <polyline> per curve, a <circle> or <rect> per marker, <text> for labels.
Writing those few elements needs no plotting library (nothing more to install), and the file can be
read, diffed and checked in a test with xml.etree. Each series is a <g> with an id (see SERIES), and
the plot area is the <rect id="plot-area">, so a test can find what it checks.

From data to the page
---------------------
`Frame` maps a (step, loss) pair to a point (x, y) of the page. SVG's y axis points DOWN, so a
higher loss must get a smaller y:

    x = left + (step - step_min) / (step_max - step_min) * width
    y = top  + (loss_max - loss) / (loss_max - loss_min) * height

The text chart
--------------
For the terminal, `loss_text_chart` draws the per-step losses as a few rows of bars in the block
characters ▁▂▃▄▅▆▇█ (eighths of a character cell), one column per step or per mean of a run of
steps, with the largest and smallest column's loss beside the top and bottom rows.
"""
import math
from dataclasses import dataclass, field
from itertools import pairwise
from numbers import Real
from xml.sax.saxutils import escape

from microtensor import InputError

# The <g id=...> of each series, in the order they are drawn (later ones on top).
SERIES = {
    "train-loss-per-step": "loss of each step's batch",
    "train-loss-running-mean": "running mean over {window}",
    "estimated-train-loss": "estimated train loss",
    "estimated-val-loss": "estimated val loss",
}
COLORS = {
    "train-loss-per-step": "#a6c8e0",
    "train-loss-running-mean": "#1f5f99",
    "estimated-train-loss": "#e07b00",
    "estimated-val-loss": "#c0282d",
}
WIDTH, HEIGHT = 980, 460  # the page, in SVG user units (pixels when shown at 100%)
MARGIN = {"left": 76, "right": 264, "top": 62, "bottom": 56}  # room for the title, the ticks, the axis labels and the legend
BLOCKS = " ▁▂▃▄▅▆▇█"  # a text chart cell filled to 0/8 ... 8/8 of its height
FILENAME = "loss.svg"  # what train.py writes in --out-dir, beside the checkpoint


def perplexity(loss):
    """exp(loss): the number of equally likely characters the model is as unsure as (inf if it overflows)."""
    try:
        return math.exp(loss)
    except OverflowError:  # a loss above ~709 nats: a diverged run
        return math.inf


def running_mean(values, window):
    """The mean of the `window` values centered on each position (window is odd: the value and
    window // 2 values on each side), the window shrinking near the ends to stay centered (the first
    and last values are their own mean).

    Centered, because a trailing mean (of the last `window` values) lags: on a falling curve it sits
    above the curve by about half of what the curve falls in half a window. A mean centered on a
    stretch where the curve is straight is the curve itself, whatever its slope. Prefix sums make it
    O(n): the sum of values[a:b] is prefix[b] - prefix[a]."""
    if window < 1 or window % 2 == 0:
        raise InputError(f"running_mean: window must be an odd number >= 1, got {window}")
    prefix = [0.0]
    for value in values:
        prefix.append(prefix[-1] + value)
    n, half = len(values), window // 2
    means = []
    for i in range(n):
        reach = min(half, i, n - 1 - i)  # as far on each side as both sides allow
        means.append((prefix[i + reach + 1] - prefix[i - reach]) / (2 * reach + 1))
    return means


def smoothing_window(steps):
    """The running mean's window: about a twentieth of the run, made odd (at least 1 step), wide
    enough to average the batch noise away, narrow enough to keep the shape of the descent."""
    return (steps // 20) | 1


def nice_ticks(low, high, count=6, smallest_step=0.0):
    """About `count` round values (1, 2 or 5 times a power of ten apart, and at least smallest_step
    apart: 1 for steps, which are whole) in [low, high], for axis ticks."""
    if not high > low:
        return [low]
    raw_step = max((high - low) / count, smallest_step)
    power = 10 ** math.floor(math.log10(raw_step))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw_step)
    first = math.ceil(low / step)
    return [k * step for k in range(first, math.floor(high / step) + 1)]


@dataclass
class Frame:
    """The plot area on the page (left, top, width, height) and the data ranges it shows."""

    left: float
    top: float
    width: float
    height: float
    step_min: float
    step_max: float
    loss_min: float
    loss_max: float

    def x(self, step):
        return self.left + (step - self.step_min) / (self.step_max - self.step_min) * self.width

    def y(self, loss):
        return self.top + (self.loss_max - loss) / (self.loss_max - self.loss_min) * self.height  # SVG's y points down


def frame_for(steps, losses):
    """The Frame that shows every (step, loss): the steps edge to edge, the losses with a margin of
    a twentieth of their range above and below, so that no marker sits on the frame."""
    step_min, step_max = (min(steps), max(steps)) if steps else (0, 1)
    loss_min, loss_max = (min(losses), max(losses)) if losses else (0.0, 1.0)
    pad = (loss_max - loss_min) / 20 or 0.5  # a flat curve still gets a range
    return Frame(
        left=MARGIN["left"], top=MARGIN["top"], width=WIDTH - MARGIN["left"] - MARGIN["right"],
        height=HEIGHT - MARGIN["top"] - MARGIN["bottom"], step_min=step_min, step_max=max(step_max, step_min + 1),
        loss_min=loss_min - pad, loss_max=loss_max + pad,
    )  # fmt: skip


def plural(count, noun):
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"


def check_finite(name, values):
    bad = [value for value in values if not math.isfinite(value)]
    if bad:
        raise InputError(f"loss_plot: {name} must be finite numbers, got {bad[0]} among {len(values)} values")


# ================================================================================= the record


@dataclass
class LossHistory:
    """Every loss a run has seen: one per training step from `first_step` on, and every evaluation.

    train.py keeps it in the checkpoint's JSON meta (`to_json`, `from_json`), a number per step, so
    that a resumed run draws the whole curve, not only its own part. A checkpoint without it (written
    before train.py kept it, or imported by gpt.checkpoints.convert) gives a history that starts at the
    resumed step, and `note` says so on the plot."""

    first_step: int = 0
    losses: list = field(default_factory=list)  # losses[i]: the loss of step first_step + i
    evaluations: list = field(default_factory=list)  # (step, estimated train loss, estimated val loss)

    def add_evaluation(self, step, train, val):
        """Record an evaluation; one of the same step (a run resumed at the step its checkpoint was
        evaluated at, and evaluated again) replaces the earlier one rather than doubling it."""
        if self.evaluations and self.evaluations[-1][0] == step:
            self.evaluations.pop()
        self.evaluations.append((step, float(train), float(val)))

    def note(self):
        """The plot's line under its title when the curve starts after step 0, else None."""
        if self.first_step == 0:
            return None
        return (
            f"the losses start at step {self.first_step:,}: the checkpoint a run resumed from there carried "
            "no usable loss curve for the steps before"
        )

    def to_json(self):
        return {"first_step": self.first_step, "losses": list(self.losses), "evaluations": [list(e) for e in self.evaluations]}

    @classmethod
    def from_json(cls, record, step):
        """The history of a checkpoint of step `step` from its JSON record, every part checked:
        raises InputError saying what does not fit (the record comes from a file, not from us)."""

        def need(ok, what):
            if not ok:
                raise InputError(f"its loss curve {what}")

        def is_int(value):
            return type(value) is int

        def is_loss(value):
            return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)

        need(isinstance(record, dict) and set(record) == {"first_step", "losses", "evaluations"},
             "must be an object with first_step, losses and evaluations")  # fmt: skip
        first, losses, evaluations = record["first_step"], record["losses"], record["evaluations"]
        need(is_int(first) and 0 <= first <= step, f"starts at step {first!r}, expected an integer in [0, {step}]")
        need(isinstance(losses, list) and len(losses) == step - first,
             f"must hold {step - first} losses (steps {first} to {step - 1})")  # fmt: skip
        need(all(is_loss(value) for value in losses), "holds a loss that is not a finite number")
        need(isinstance(evaluations, list) and all(
            isinstance(e, list) and len(e) == 3 and is_int(e[0]) and 0 <= e[0] <= step and is_loss(e[1]) and is_loss(e[2])
            for e in evaluations
        ), f"evaluations must be [step <= {step}, train loss, val loss] lists of finite numbers")  # fmt: skip
        return cls(first, [float(v) for v in losses], [(s, float(t), float(v)) for s, t, v in evaluations])


# ================================================================================= SVG


def loss_curve_svg(losses, first_step=0, evaluations=(), title="training loss", note=None):
    """The SVG document (a str) of a run's loss curve.

    losses: the loss of each training step, the first one at step `first_step`, one per step.
    evaluations: (step, train loss, val loss) of each evaluation. note: a line under the title (say,
    why the curve starts late). Raises InputError for a non-finite value."""
    losses = [float(value) for value in losses]
    evaluations = [(step, float(train), float(val)) for step, train, val in evaluations]
    check_finite("losses", losses)
    check_finite("the evaluations' losses", [loss for _, train, val in evaluations for loss in (train, val)])
    steps = list(range(first_step, first_step + len(losses)))
    window = smoothing_window(len(losses))
    frame = frame_for(
        steps + [step for step, _, _ in evaluations],
        losses + [loss for _, train, val in evaluations for loss in (train, val)],
    )
    parts = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
            'font-family="sans-serif" font-size="12">'
        ),
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        *heading(title, "; ".join(filter(None, [note, None if losses or evaluations else "no step recorded yet"]))),
        *axes(frame),
        line_series("train-loss-per-step", frame, steps, losses, stroke_width=0.8),
        line_series("train-loss-running-mean", frame, steps, running_mean(losses, window), stroke_width=2),
        marker_series("estimated-train-loss", frame, [(step, train) for step, train, _ in evaluations], "circle"),
        marker_series("estimated-val-loss", frame, [(step, val) for step, _, val in evaluations], "square"),
        *legend(frame, window),
        "</svg>",
    ]
    return "\n".join(parts) + "\n"


def heading(title, note):
    """The title, centered above the plot, and an optional note in grey under it."""
    lines = [f'<text x="{WIDTH / 2}" y="24" text-anchor="middle" font-size="16" font-weight="bold">{escape(title)}</text>']
    if note:
        lines.append(f'<text x="{WIDTH / 2}" y="44" text-anchor="middle" fill="#555">{escape(note)}</text>')
    return lines


def axes(frame):
    """The plot area's frame, grid lines and labels at round values, and the axis titles."""
    right, bottom = frame.left + frame.width, frame.top + frame.height
    lines = []
    for step in nice_ticks(frame.step_min, frame.step_max, count=8, smallest_step=1):
        x = frame.x(step)
        lines.append(f'<line x1="{x:.2f}" y1="{frame.top}" x2="{x:.2f}" y2="{bottom}" stroke="#e4e4e4"/>')
        lines.append(f'<text class="x-tick" x="{x:.2f}" y="{bottom + 16}" text-anchor="middle">{step:,.0f}</text>')
    loss_ticks = nice_ticks(frame.loss_min, frame.loss_max)
    decimals = max(0, -math.floor(math.log10(loss_ticks[1] - loss_ticks[0]))) if len(loss_ticks) > 1 else 2
    for loss in loss_ticks:
        y = frame.y(loss)
        lines.append(f'<line x1="{frame.left}" y1="{y:.2f}" x2="{right}" y2="{y:.2f}" stroke="#e4e4e4"/>')
        lines.append(f'<text class="y-tick" x="{frame.left - 6}" y="{y + 4:.2f}" text-anchor="end">{loss:.{decimals}f}</text>')
    middle_y = frame.top + frame.height / 2
    lines.append(f'<text id="x-label" x="{frame.left + frame.width / 2}" y="{HEIGHT - 14}" text-anchor="middle">step</text>')
    lines.append(
        f'<text id="y-label" x="22" y="{middle_y}" text-anchor="middle" transform="rotate(-90 22 {middle_y})">loss (nats)</text>'
    )
    lines.append(
        f'<rect id="plot-area" x="{frame.left}" y="{frame.top}" width="{frame.width}" height="{frame.height}" '
        'fill="none" stroke="#333"/>'
    )  # drawn after the grid, so that the grid lines end under its edges
    return lines


def line_series(series, frame, steps, losses, stroke_width):
    """One <polyline> through the point of every (step, loss), in a <g id=series>."""
    points = " ".join(f"{frame.x(step):.2f},{frame.y(loss):.2f}" for step, loss in zip(steps, losses))
    return (
        f'<g id="{series}"><polyline points="{points}" fill="none" stroke="{COLORS[series]}" '
        f'stroke-width="{stroke_width}" stroke-linejoin="round"/></g>'
    )


def marker_series(series, frame, points, shape):
    """A line through the (step, loss) points and a marker on each, in a <g id=series>. The markers
    differ in shape as well as in colour, so the two series stay apart in grey print too. Each
    marker's <title> is the tooltip a browser shows: its step, loss and perplexity."""
    color, label = COLORS[series], SERIES[series]
    coordinates = " ".join(f"{frame.x(step):.2f},{frame.y(loss):.2f}" for step, loss in points)
    parts = [f'<g id="{series}">', f'<polyline points="{coordinates}" fill="none" stroke="{color}" stroke-width="1.5"/>']
    for step, loss in points:
        x, y = frame.x(step), frame.y(loss)
        tooltip = f"<title>step {step:,}: {label} {loss:.4f} (perplexity {perplexity(loss):.2f})</title>"
        if shape == "circle":
            parts.append(f'<circle cx="{x:.2f}" cy="{y:.2f}" r="3.5" fill="{color}">{tooltip}</circle>')
        else:
            parts.append(f'<rect x="{x - 3.5:.2f}" y="{y - 3.5:.2f}" width="7" height="7" fill="{color}">{tooltip}</rect>')
    parts.append("</g>")
    return "\n".join(parts)


def legend(frame, window):
    """A sample of each series' line and marker with its name, right of the plot area, where it
    can hide no point of any curve."""
    row_height, box_width = 18, 236
    left, top = frame.left + frame.width + 16, frame.top
    lines = [
        (
            f'<g id="legend"><rect x="{left}" y="{top}" width="{box_width}" height="{row_height * len(SERIES) + 8}" '
            'fill="white" fill-opacity="0.9" stroke="#bbb"/>'
        )
    ]
    for row, (series, label) in enumerate(SERIES.items()):
        y = top + 4 + row_height * row + row_height / 2
        width = {"train-loss-per-step": 0.8, "train-loss-running-mean": 2}.get(series, 1.5)
        lines.append(f'<line x1="{left + 8}" y1="{y}" x2="{left + 36}" y2="{y}" stroke="{COLORS[series]}" stroke-width="{width}"/>')
        if series == "estimated-train-loss":
            lines.append(f'<circle cx="{left + 22}" cy="{y}" r="3.5" fill="{COLORS[series]}"/>')
        elif series == "estimated-val-loss":
            lines.append(f'<rect x="{left + 18.5}" y="{y - 3.5}" width="7" height="7" fill="{COLORS[series]}"/>')
        lines.append(f'<text x="{left + 44}" y="{y + 4}">{escape(label.format(window=plural(window, "step")))}</text>')
    lines.append("</g>")
    return lines


# ================================================================================= text chart


def column_means(values, columns):
    """values resampled to at most `columns` numbers: the mean of each of `columns` consecutive,
    nearly equal runs of them (so the chart of a long run averages its noise, like the running mean)."""
    n = len(values)
    columns = min(columns, n)
    bounds = [n * c // columns for c in range(columns + 1)]
    return [sum(values[a:b]) / (b - a) for a, b in pairwise(bounds)]


def text_chart(values, width=40, height=4):
    """A bar chart of `values` in block characters: `height` rows of at most `width` characters
    (one column per value when there are at most `width` of them, else per mean of a run of them).

    Each column is a bar of 1 to height * 8 eighths of a row: the smallest value gets one eighth
    (a bar is never empty, so every column shows), the largest the full height, the rest in
    proportion between. The bars start at the smallest value, not at zero: a loss going from 2.3 to
    1.5 fills the chart instead of being a band at its top. Returns the rows, top first."""
    if not values:
        return []
    check_finite("text_chart values", values)
    means = column_means(values, width)
    low, high = min(means), max(means)
    levels = height * 8
    eighths = [1 + round((value - low) / (high - low) * (levels - 1)) if high > low else 1 for value in means]
    rows = []
    for row in range(height):
        floor = (height - 1 - row) * 8  # eighths below this row
        rows.append("".join(BLOCKS[min(8, max(0, bar - floor))] for bar in eighths))
    return rows


def loss_text_chart(losses, first_step=0, width=40, height=4):
    """The text chart of a run's per-step losses with its scale: the top row labelled with the
    largest column's loss, the bottom row with the smallest, and a last line with the first and last
    step. Rows of equal length, for a table cell."""
    if not losses:
        return ["no step recorded"]
    rows = text_chart(losses, width, height)
    means = column_means(losses, width)
    labels = [f"{max(means):.2f}"] + [""] * (height - 2) + [f"{min(means):.2f}"] if height > 1 else [f"{max(means):.2f}"]
    pad = max(len(label) for label in labels)
    lines = [f"{label:>{pad}} ┤{row}" for label, row in zip(labels, rows)]
    first, last = f"step {first_step:,}", f"{first_step + len(losses) - 1:,}"
    if len(first) + 1 + len(last) <= len(rows[0]):  # the first step under the first column, the last under the last
        lines.append(" " * (pad + 2) + first + last.rjust(len(rows[0]) - len(first)))
    else:
        lines.append(" " * (pad + 2) + (f"steps {first_step:,}-{last}" if len(losses) > 1 else first))
    width = max(len(line) for line in lines)
    return [line.ljust(width) for line in lines]
