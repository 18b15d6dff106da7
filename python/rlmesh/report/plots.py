"""The HTML report's figures: matplotlib (Agg), each rendered to one SVG document.

matplotlib is the ``report`` extra: it is imported on first use (``require_matplotlib``), so
``import rlmesh`` stays light. A figure costs a few tens of milliseconds whatever the number of
episodes: histograms bin the values first and draw one artist per figure, never one per
episode.

Example:
    >>> svg = returns_and_lengths_svg(rewards=[1.0, 2.0, 2.5], steps=[10, 20, 25], task="t")
    >>> svg.startswith("<svg"), svg.count("<svg")
    (True, 1)
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

HISTOGRAM_BINS = 30
_STYLE = {
    "svg.fonttype": "none",  # text stays text: small files, the browser's own fonts
    "svg.hashsalt": "rlmesh",  # the same figure gives the same bytes (clip-path ids)
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


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
    plt = require_matplotlib()
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    plt.close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # no XML prolog: it is embedded, not a file


def _figure(
    width: float, height: float, columns: int = 1, labels: Sequence[str] = ()
) -> tuple[Any, Any]:
    """A figure of ``columns`` axes in a row, its margins fixed (a constrained layout would
    draw every figure twice); ``labels`` are the y tick labels, which the left margin fits."""
    plt = require_matplotlib()
    figure, axes = plt.subplots(1, columns, figsize=(width, height))
    left_inches = 0.6 + 0.065 * max((len(label) for label in labels), default=0)
    figure.subplots_adjust(
        left=min(0.6, left_inches / width),
        right=0.98,
        bottom=min(0.45, 0.45 / height),
        top=1 - min(0.3, 0.3 / height),
        wspace=0.25,
    )
    return figure, axes


def _histogram(axes: Any, values: np.ndarray, color: str, label: str) -> None:
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        axes.text(0.5, 0.5, "no finite values", ha="center", va="center", transform=axes.transAxes)
    else:
        low, high = float(finite.min()), float(finite.max())
        if low == high:  # one value: a bin around it
            low, high = low - 0.5, high + 0.5
        counts, edges = np.histogram(finite, bins=HISTOGRAM_BINS, range=(low, high))
        axes.stairs(counts, edges, fill=True, color=color, alpha=0.85)
        hidden = values.size - finite.size
        if hidden:
            axes.set_title(f"{hidden} non-finite not shown", fontsize=8, loc="right")
    axes.set_xlabel(label)
    axes.set_ylabel("episodes")


def returns_and_lengths_svg(
    *, rewards: Sequence[float], steps: Sequence[int], task: str | None
) -> str:
    """One task's episode returns and episode lengths, two histograms side by side.

    ``rewards``: float[n]; ``steps``: int[n] (the task's scored episodes).
    """
    plt = require_matplotlib()
    with plt.rc_context(_STYLE):
        figure, (returns, lengths) = _figure(7.5, 2.4, columns=2)
        figure.subplots_adjust(top=0.86)
        _histogram(returns, np.asarray(rewards, dtype=np.float64), "#3b6ea8", "episode return")
        _histogram(lengths, np.asarray(steps, dtype=np.float64), "#6a9f58", "episode length")
        if task is not None:
            figure.suptitle(task, fontsize=9)
        return _svg(figure)


def success_svg(
    tasks: Sequence[str], rates: Sequence[float | None], intervals: Sequence[Sequence[float]]
) -> str:
    """Per-task success rates with their Wilson 95% intervals as error bars (a task without
    a verdict is left empty, marked n/a).

    ``tasks``: names [T]; ``rates``: [T] in [0, 1] or None; ``intervals``: [T] (low, high).
    """
    plt = require_matplotlib()
    with plt.rc_context(_STYLE):
        figure, axes = _figure(7.5, max(1.4, 0.35 * len(tasks) + 0.8), labels=tasks)
        rows = np.arange(len(tasks))
        shown = [k for k, rate in enumerate(rates) if rate is not None]
        value = np.array([rates[k] for k in shown], dtype=np.float64)
        low = np.array([intervals[k][0] for k in shown], dtype=np.float64)
        high = np.array([intervals[k][1] for k in shown], dtype=np.float64)
        axes.barh(rows[shown], value, color="#3b6ea8", alpha=0.85, height=0.6)
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
    """Latency percentiles per op: p50, p95 and p99 bars (ms, log scale) for each latency
    ``TelemetryRow``."""
    plt = require_matplotlib()
    with plt.rc_context(_STYLE):
        ops = [row.op for row in rows]
        figure, axes = _figure(7.5, max(1.4, 0.45 * len(rows) + 0.9), labels=ops)
        positions = np.arange(len(rows))
        for offset, (name, color) in enumerate(
            (("p50", "#6a9f58"), ("p95", "#e0a030"), ("p99", "#c0504d"))
        ):
            values = [getattr(row, name) for row in rows]
            values = [value if math.isfinite(value) and value > 0 else 0.0 for value in values]
            axes.barh(positions + (offset - 1) * 0.25, values, height=0.25, color=color, label=name)
        axes.set_yticks(positions, labels=ops)
        axes.invert_yaxis()
        if any(getattr(row, "p99", 0) > 0 for row in rows):
            axes.set_xscale("log")  # ops differ by orders of magnitude
            axes.xaxis.set_minor_locator(plt.NullLocator())
        axes.set_xlabel("ms")
        axes.legend(loc="lower right", fontsize=8)
        return _svg(figure)
