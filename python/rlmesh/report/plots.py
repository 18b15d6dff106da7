"""The HTML report's figures: matplotlib (Agg), each rendered to one SVG element to inline.

matplotlib is the ``report`` extra: it is imported on first use (``require_matplotlib``), so
``import rlmesh`` stays light. What a figure costs is its axes (tick layout and text), not its
data: values are binned first, and a figure keeps a fixed number of axes whatever the number
of tasks or episodes (per-task histograms are rows of one axes), so a report draws four axes
for one task or forty.

Each per-task artist carries an SVG id naming its kind and the task's position
(``returns-k``, ``lengths-k``, ``success-k``), so a page can be checked for one per task.

Example:
    >>> svg = distributions_svg(["a", "b"], [[1.0, 2.0], [2.5]], [[10, 20], [25]])
    >>> svg.startswith("<svg"), 'id="returns-1"' in svg, 'id="lengths-0"' in svg
    (True, True, True)
"""

from __future__ import annotations

import io
import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

HISTOGRAM_BINS = 30
_STYLE = {
    "svg.fonttype": "none",  # text stays text: small files, the browser's own fonts
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
_FIGURES = itertools.count()


def require_matplotlib() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or an ImportError naming the extra.

    Example:
        >>> require_matplotlib().get_backend().lower()
        'agg'
    """
    try:
        import matplotlib
    except ImportError:
        raise ImportError(
            "the HTML report needs matplotlib: pip install 'rlmesh[report]'"
        ) from None
    # Agg renders without a display; pyplot would otherwise pick a GUI backend.
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _svg(figure: Any) -> str:
    """The figure as an SVG element (no XML prolog: it is inlined, not a file)."""
    plt = require_matplotlib()
    buffer = io.StringIO()
    # matplotlib derives clip-path and marker ids from this salt: one per figure, so two
    # figures inlined in one page never share an id.
    with plt.rc_context({"svg.hashsalt": figure.get_label()}):
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    plt.close(figure)
    text = buffer.getvalue()
    text = text[text.index("<svg") :]
    # The RDF metadata block (creator, format) names vocabularies by URL; a page needs none.
    start, end = text.find("<metadata>"), text.find("</metadata>")
    if 0 <= start < end:
        text = text[:start] + text[end + len("</metadata>") :]
    return text


def _figure(
    width: float, height: float, columns: int = 1, labels: Sequence[str] = ()
) -> tuple[Any, Any]:
    """A figure of ``columns`` axes in a row, its margins fixed (a constrained layout would
    draw every figure twice); the left margin fits ``labels``, the y tick labels."""
    plt = require_matplotlib()
    figure, axes = plt.subplots(1, columns, figsize=(width, height))
    figure.set_label(f"rlmesh-figure-{next(_FIGURES)}")
    left_inches = 0.5 + 0.065 * max((len(label) for label in labels), default=0)
    figure.subplots_adjust(
        left=min(0.5, left_inches / width),
        right=0.98,
        bottom=min(0.45, 0.45 / height),
        top=1 - min(0.3, 0.15 / height),
        wspace=0.08,
    )
    return figure, axes


def _ridges(axes: Any, groups: Sequence[np.ndarray], label: str, id_prefix: str) -> None:
    """One histogram per group on one axes, stacked as rows (the first on top) over shared
    bins, each scaled to its own tallest bin; group k's artist gets the SVG id
    ``{id_prefix}-{k}``."""
    finite = [values[np.isfinite(values)] for values in groups]
    pooled = np.concatenate(finite) if finite else np.empty(0)
    low, high = (float(pooled.min()), float(pooled.max())) if pooled.size else (0.0, 1.0)
    if low == high:  # one value: a bin around it
        low, high = low - 0.5, high + 0.5
    edges = np.linspace(low, high, HISTOGRAM_BINS + 1)
    rows = len(groups)
    for k, values in enumerate(finite):
        base = rows - 1 - k
        counts, _ = np.histogram(values, bins=edges)
        tallest = counts.max() if counts.size else 0
        height = counts * (0.85 / tallest) if tallest else counts * 0.0
        artist = axes.stairs(base + height, edges, baseline=base, fill=True, alpha=0.85)
        artist.set_gid(f"{id_prefix}-{k}")
        hidden = groups[k].size - values.size
        if hidden:
            axes.text(high, base + 0.45, f"{hidden} non-finite not shown", ha="right", fontsize=7)
    axes.set_ylim(-0.1, rows)
    axes.set_xlabel(label)
    axes.tick_params(axis="y", length=0)
    axes.spines["left"].set_visible(False)


def distributions_svg(
    labels: Sequence[str], rewards: Sequence[Sequence[float]], steps: Sequence[Sequence[int]]
) -> str:
    """Per task, the histogram of its episode returns (left) and lengths (right): one row per
    task, in ``labels`` order from the top; SVG ids ``returns-k`` and ``lengths-k``.

    ``labels``: [T] task names; ``rewards``, ``steps``: [T] sequences, each task's episodes.
    """
    plt = require_matplotlib()
    with plt.rc_context(_STYLE):
        figure, (returns, lengths) = _figure(7.5, 0.32 * len(labels) + 0.75, 2, labels)
        _ridges(returns, [np.asarray(r, np.float64) for r in rewards], "episode return", "returns")
        _ridges(lengths, [np.asarray(s, np.float64) for s in steps], "episode length", "lengths")
        positions = np.arange(len(labels))[::-1] + 0.35
        returns.set_yticks(positions, labels=list(labels))
        lengths.set_yticks(positions, labels=[""] * len(labels))
        return _svg(figure)


def success_svg(
    tasks: Sequence[str], rates: Sequence[float | None], intervals: Sequence[Sequence[float]]
) -> str:
    """Per-task success rates with their Wilson 95% intervals as error bars (a task without
    a verdict is left empty, marked n/a); task k's bar has the SVG id ``success-k``.

    ``tasks``: names [T]; ``rates``: [T] in [0, 1] or None; ``intervals``: [T] (low, high).
    """
    plt = require_matplotlib()
    with plt.rc_context(_STYLE):
        figure, axes = _figure(7.5, 0.3 * len(tasks) + 0.75, labels=tasks)
        rows = np.arange(len(tasks))
        shown = [k for k, rate in enumerate(rates) if rate is not None]
        value = np.array([rates[k] for k in shown], dtype=np.float64)
        low = np.array([intervals[k][0] for k in shown], dtype=np.float64)
        high = np.array([intervals[k][1] for k in shown], dtype=np.float64)
        bars = axes.barh(rows[shown], value, color="#3b6ea8", alpha=0.85, height=0.6)
        for k, bar in zip(shown, bars, strict=True):
            bar.set_gid(f"success-{k}")
        axes.errorbar(
            value,
            rows[shown],
            xerr=np.vstack([value - low, high - value]),
            fmt="none",
            ecolor="black",
            capsize=3,
        )
        for k, rate in enumerate(rates):
            if rate is None:
                axes.text(0.01, k, "n/a", va="center")
        axes.set_yticks(rows, labels=list(tasks))
        axes.invert_yaxis()
        axes.set_xlim(0, 1)
        axes.set_xlabel("success rate (95% Wilson interval)")
        return _svg(figure)


def latency_svg(rows: Sequence[Any]) -> str:
    """Latency percentiles per op: p50, p95 and p99 bars for each latency ``TelemetryRow``,
    on a log scale of milliseconds (ops differ by orders of magnitude)."""
    plt = require_matplotlib()
    from matplotlib.ticker import FixedLocator

    with plt.rc_context(_STYLE):
        ops = [row.op for row in rows]
        figure, axes = _figure(7.5, 0.45 * len(rows) + 0.8, labels=ops)
        positions = np.arange(len(rows))
        # Bars of log10(ms) from the smallest decade on a linear axis, labelled in ms: a log
        # axis would cost more than the rest of the figure.
        figures = np.array([[row.p50, row.p95, row.p99] for row in rows], dtype=np.float64)
        positive = figures[np.isfinite(figures) & (figures > 0)]
        floor = math.floor(np.log10(positive.min())) if positive.size else -3
        top = math.ceil(np.log10(positive.max())) if positive.size else 0
        with np.errstate(divide="ignore", invalid="ignore"):
            lengths = np.where(figures > 0, np.log10(figures) - floor, 0.0)
        lengths = np.nan_to_num(lengths, nan=0.0, posinf=0.0, neginf=0.0)
        for k, (name, color) in enumerate(
            (("p50", "#6a9f58"), ("p95", "#e0a030"), ("p99", "#c0504d"))
        ):
            axes.barh(
                positions + (k - 1) * 0.25, lengths[:, k], height=0.25, color=color, label=name
            )
        decades = list(range(floor, max(top, floor + 1) + 1))
        axes.xaxis.set_major_locator(FixedLocator([d - floor for d in decades]))
        axes.set_xticklabels([f"{10.0**d:g}" for d in decades])
        axes.set_xlim(0, decades[-1] - floor)
        axes.set_yticks(positions, labels=ops)
        axes.invert_yaxis()
        axes.set_xlabel("ms (log scale)")
        axes.legend(loc="lower right", fontsize=8, framealpha=0.9)
        return _svg(figure)
