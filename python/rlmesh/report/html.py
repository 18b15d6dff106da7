"""The HTML report of a run: one self-contained file to look at, not read.

``write_html(results, out)`` writes what ``rlmesh report FILE --html OUT`` writes: the summary
tables (overall, and per task when episodes carry a ``task``), per task a histogram of the
returns and of the episode lengths, the per-task success rates with Wilson 95% error bars, the
episodes that failed (an ``error``), the latency percentiles of the run's telemetry, the
recorded videos inline, and the run's metadata (its header and each segment's provenance).

Nothing is fetched when the file is opened: no script, font, style sheet or image comes from
elsewhere. Figures are inline SVG elements and videos mp4 files inlined as base64 ``data:``
URIs (``<video controls>``), so the file can be mailed or archived as it is. The figures need
matplotlib, the ``report`` extra.

Example:
    >>> import os, tempfile, rlmesh
    >>> folder = tempfile.mkdtemp()
    >>> path = os.path.join(folder, "r.jsonl")
    >>> _ = rlmesh.run(lambda obs: 0, "CartPole-v1", episodes=3, results_path=path)
    >>> out = write_html(path, os.path.join(folder, "report.html"))
    >>> out.read_text().count('<figure class="plot')
    3
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..results import RunColumns, RunResult, SuccessRule, read_contents
from ..results.lines import RESUME_KEY, config, file_fields
from ..results.provenance import PROVENANCE_KEY, provenance_rows, provenance_segments
from ..results.records import run_fields
from ..stats import suite_overall, summarize, summary_rows, wilson_interval
from . import plots

# A header value longer than this (a list of 10,000 seeds) is shown cut, with its length.
LONG_VALUE_CHARS = 160
_VIDEO_TYPES = {".mp4": "video/mp4", ".webm": "video/webm", ".ogv": "video/ogg"}


@dataclass(frozen=True)
class ReportData:
    """What a report shows: the run (``RunColumns`` of the episodes without an ``error``, with
    the run segments' telemetry), the raw episode records in index order (every field, the
    ``task``, ``error`` and ``video`` of suites, failure isolation and videos included), the
    header and resumptions, the directory video paths are relative to, and the success rule
    of each task that has its own (a suite's tasks; the others are judged by ``run``'s)."""

    run: RunColumns
    records: tuple[dict[str, Any], ...]
    header: dict[str, Any]
    resumes: tuple[dict[str, Any], ...]
    base_dir: Path
    source: str
    rules: dict[str | None, SuccessRule] = field(default_factory=dict)

    def rule(self, task: str | None) -> SuccessRule:
        """The rule that judged ``task``'s episodes where the env reported no success."""
        return self.rules.get(task, self.run.success_rule)


def read_report_data(path: str | os.PathLike[str]) -> ReportData:
    """A results file as a report reads it (through the one reader, ``read_contents``).

    Raises:
        ResultsFileError: the file is missing, empty, not a results file, or has a line that
            is not JSON or not an episode line (the message names the file and line).
    """
    contents = read_contents(path)
    assert contents.header is not None
    # Stable: a suite's tasks keep their file order within an index.
    episodes = sorted(contents.episodes, key=lambda episode: episode.index)
    records = tuple(episode.to_dict() for episode in episodes)
    run = scored_columns(records, **file_fields(contents.header, contents.runs))
    # A suite's tasks with a task header: each judged by its own rule.
    rules = {
        record["task"]: contents.task_fields(record["task"])["success_rule"]
        for record in contents.tasks
    }
    resumes = tuple(config(record, RESUME_KEY) for record in contents.resumes)
    name = os.fspath(path)
    return ReportData(run, records, contents.config(), resumes, Path(name).parent, name, rules)


def scored_columns(records: Sequence[dict[str, Any]], **run_fields: Any) -> RunColumns:
    """The episodes of ``records`` that completed (no ``error``) as ``RunColumns``: what
    statistics count; ``run_fields`` are ``RunColumns``' other fields (default: none known)."""
    done = [record for record in records if not record.get("error")]
    success = [record.get("success") for record in done]
    return RunColumns(
        index=np.array([record["index"] for record in done], dtype=np.int64),
        steps=np.array([record["steps"] for record in done], dtype=np.int64),
        reward=np.array([record["reward"] for record in done], dtype=np.float64),
        success=np.array([-1 if s is None else int(s) for s in success], dtype=np.int8),
        success_reported=np.array(
            [bool(record.get("success_reported")) for record in done], dtype=bool
        ),
        **{"base_seed": None, **run_fields},
    )


def report_data_of(result: RunResult, base_dir: str | os.PathLike[str] = ".") -> ReportData:
    """A ``RunResult`` (no file behind it) as a report reads it; video paths are relative to
    ``base_dir``."""
    records = tuple(episode.to_dict() for episode in result.episodes)
    header = {"core": result.core, "seed": result.base_seed}
    run = scored_columns(records, **run_fields(result))
    return ReportData(run, records, header, (), Path(base_dir), "a RunResult")


def episodes_by_task(records: Iterable[dict[str, Any]]) -> dict[str | None, list[dict[str, Any]]]:
    """Episode records grouped by their ``task`` (None outside a suite), tasks in the order of
    their first episode, each task's episodes in index order.

    Example:
        >>> grouped = episodes_by_task([{"index": 0, "task": "b"}, {"index": 1, "task": "a"},
        ...                             {"index": 2, "task": "b"}])
        >>> {task: [r["index"] for r in group] for task, group in grouped.items()}
        {'b': [0, 2], 'a': [1]}
    """
    groups: dict[str | None, list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault(record.get("task"), []).append(record)
    return groups


def write_html(results: str | os.PathLike[str] | RunResult, out: str | os.PathLike[str]) -> Path:
    """Write the HTML report of ``results`` (a results file's path, or a ``RunResult``) to
    ``out``, and return ``out`` as a ``Path``.

    Raises:
        ResultsFileError: ``results`` is a missing, empty or corrupt results file.
        ImportError: matplotlib is missing (``pip install 'rlmesh[report]'``).
    """
    plots.require_matplotlib()  # before reading: the missing extra is the first thing to say
    from_file = not isinstance(results, RunResult)
    data = read_report_data(results) if from_file else report_data_of(results)
    page = render_html(data)
    target = Path(out)
    target.write_text(page, encoding="utf-8")
    return target


# ---------------------------------------------------------------------------- the page


def render_html(data: ReportData) -> str:
    """The report page of ``data``, as one HTML document (a str)."""
    groups = episodes_by_task(data.records)
    title = f"rlmesh report: {data.header.get('env', data.source)}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_text(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{_text(title)}</h1>",
        f'<p class="source">{_text(data.source)}</p>',
        _summary_section(data.run, suite=any(task is not None for task in groups)),
        _tasks_section(groups, data),
        _videos_section(groups, data.base_dir),
        _failures_section(data.records),
        _latency_section(data.run),
        _metadata_section(data),
        "</body></html>",
    ]
    return "\n".join(part for part in parts if part) + "\n"


def _text(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _table(header: Sequence[str] | None, rows: Iterable[Sequence[Any]], css: str = "") -> str:
    head = "" if header is None else "<tr>" + "".join(f"<th>{_text(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{_text(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    return f'<table class="{css}">{head}{body}</table>'


def _plot(svg: str, css: str, label: str) -> str:
    return f'<figure class="plot {css}" role="img" aria-label="{_text(label)}">{svg}</figure>'


# Rows of a run's summary that describe its episodes' outcomes: a suite's are per task.
_PER_TASK_ROWS = frozenset(
    {
        "mean reward",
        "IQM reward",
        "success rate",
        "success rule",
        "episode length mean / min / max",
    }
)


def _summary_section(run: RunColumns, *, suite: bool) -> str:
    """The run's summary table; for a suite (episodes of tasks), only the figures of the run
    as a whole: returns, success and lengths are per task, never pooled across tasks."""
    rows = summary_rows(summarize(run))
    note = ""
    if suite:
        rows = [row for row in rows if row[0] not in _PER_TASK_ROWS]
        note = (
            '<p class="note">Returns, success and episode lengths are per task (below): '
            "the returns of different tasks are not pooled.</p>"
        )
    return f'<section id="summary"><h2>Summary</h2>{_table(None, rows, "summary")}{note}</section>'


def _task_label(task: str | None) -> str:
    return "(all episodes)" if task is None else task


def _percent(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.1%}"


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _tasks_section(groups: dict[str | None, list[dict[str, Any]]], data: ReportData) -> str:
    """The per-task table and plots: a row per task with its episodes, errors, success rate
    and mean return, each with its 95% interval, and the rule that judged its success; the
    success rates with their Wilson error bars; each task's histograms of returns and
    lengths."""
    rows, names, rates, intervals, rewards, lengths = [], [], [], [], [], []
    verdicts = []
    for task, group in groups.items():
        columns = scored_columns(group, success_rule=data.rule(task))
        summary = summarize(columns)
        judged = columns.success[columns.success >= 0]
        if judged.size:
            verdicts.append(judged.astype(np.float64))
        rate = float(judged.mean()) if judged.size else None
        low, high = wilson_interval(int(judged.sum()), int(judged.size))
        names.append(_task_label(task))
        rates.append(rate)
        intervals.append((low, high))
        rewards.append(columns.reward)
        lengths.append(columns.steps)
        success = "n/a" if rate is None else f"{_percent(rate)} [{_percent(low)}, {_percent(high)}]"
        reward_low, reward_high = summary["mean_reward_ci95"]
        rows.append(
            (
                _task_label(task),
                len(group),
                len(group) - columns.num_episodes,
                success,
                f"{_figure(summary['mean_reward'])} "
                f"[{_figure(reward_low)}, {_figure(reward_high)}]",
                _figure(summary["episode_length_mean"]),
                summary["success_rule"],
            )
        )
    note = ""
    if len(groups) > 1:  # a suite: the mean of the tasks' success rates, as rlmesh report does
        overall = suite_overall(verdicts, [])
        rate, (low, high) = overall["success_rate"], overall["success_ci95"]
        rows.append(
            (
                "overall (mean of the tasks; stratified bootstrap CI)",
                sum(row[1] for row in rows),
                sum(row[2] for row in rows),
                "n/a" if rate is None else f"{_percent(rate)} [{_percent(low)}, {_percent(high)}]",
                "-",
                "",
                "",
            )
        )
        note = (
            '<p class="note">Returns are not pooled across tasks: each task\'s are on its '
            "own scale.</p>"
        )
    header = (
        "task",
        "episodes",
        "errors",
        "success (95% Wilson CI)",
        "mean return (95% bootstrap CI)",
        "mean length",
        "success rule",
    )
    success_plot = (
        _plot(plots.success_svg(names, rates, intervals), "plot-success", "success per task")
        if any(rate is not None for rate in rates)
        else '<p class="note">success is not available for these episodes</p>'
    )
    distributions = _plot(
        plots.distributions_svg(names, rewards, lengths),
        "plot-distributions",
        "episode returns and lengths per task",
    )
    return (
        f'<section id="tasks"><h2>Per task</h2>{_table(header, rows, "tasks")}{note}'
        f"<h3>Success</h3>{success_plot}<h3>Returns and episode lengths</h3>{distributions}"
        "</section>"
    )


def _videos_section(groups: dict[str | None, list[dict[str, Any]]], base_dir: Path) -> str:
    """The recorded videos, inline, by task (episodes whose record links a ``video``)."""
    sections = []
    for task, group in groups.items():
        videos = [_video(record, base_dir) for record in group if record.get("video")]
        if videos:
            sections.append(
                f'<section class="task" data-task="{_text("" if task is None else task)}">'
                f'<h3>{_text(_task_label(task))}</h3><div class="videos">{"".join(videos)}</div>'
                "</section>"
            )
    return f'<section id="videos"><h2>Videos</h2>{"".join(sections)}</section>' if sections else ""


def _video(record: dict[str, Any], base_dir: Path) -> str:
    """One episode's recorded video, inlined; a file that is not there is said to be missing."""
    relative = str(record["video"])
    path = base_dir / relative
    caption = f"episode {record['index']}, seed {record.get('seed')}, return {record['reward']:g}"
    try:
        data = path.read_bytes()
    except OSError as exc:
        return (
            f'<figure class="video missing"><figcaption>{_text(caption)}: {_text(relative)} '
            f"cannot be read ({_text(exc.strerror)})</figcaption></figure>"
        )
    kind = _VIDEO_TYPES.get(path.suffix.lower(), "video/mp4")
    encoded = base64.b64encode(data).decode("ascii")
    return (
        f'<figure class="video"><video controls preload="auto" muted '
        f'src="data:{kind};base64,{encoded}"></video>'
        f"<figcaption>{_text(caption)} ({_text(relative)})</figcaption></figure>"
    )


def _failures_section(records: Sequence[dict[str, Any]]) -> str:
    failed = [record for record in records if record.get("error")]
    if not failed:
        return ""
    rows = [
        (record.get("task") or "-", record["index"], record.get("seed"), record["error"])
        for record in failed
    ]
    table = _table(("task", "index", "seed", "error"), rows, "failures")
    return (
        f'<section id="failures"><h2>Failed episodes ({len(failed)})</h2>'
        "<p>Kept out of the reward and success statistics.</p>"
        f"{table}</section>"
    )


def _latency_section(run: RunColumns) -> str:
    latency = [row for row in run.telemetry if row.metric == "latency"]
    rates = [row for row in run.telemetry if row.metric != "latency"]
    if not latency and not rates:
        return '<section id="latency"><h2>Latency</h2><p>No telemetry recorded.</p></section>'
    header = ("op", "calls", "mean ms", "p50", "p95", "p99", "max")
    rows = [
        (row.op, row.count, *(_ms(getattr(row, q)) for q in ("avg", "p50", "p95", "p99", "max")))
        for row in latency
    ]
    throughput = [(f"{row.op} {row.metric}", row.count, f"{row.avg:,.0f} /s") for row in rates]
    figure = (
        _plot(plots.latency_svg(latency), "plot-latency", "latency percentiles") if latency else ""
    )
    return (
        '<section id="latency"><h2>Latency</h2>'
        f"{_table(header, rows, 'latency')}{figure}"
        f"{_table(('throughput', 'count', 'rate'), throughput, 'throughput')}</section>"
    )


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


def _metadata_section(data: ReportData) -> str:
    config = [(key, _short(value)) for key, value in data.header.items() if key != PROVENANCE_KEY]
    blocks = [f"<h3>Run</h3>{_table(('field', 'value'), config, 'header')}"]
    segments = provenance_segments(data.header, data.resumes)
    for number, record in enumerate(segments, start=1):
        title = "Provenance" if len(segments) == 1 else f"Provenance, run segment {number}"
        blocks.append(f"<h3>{title}</h3>{_table(None, provenance_rows(record), 'provenance')}")
    if not segments:
        blocks.append("<p>No provenance recorded (a file from an older rlmesh).</p>")
    return f'<section id="metadata"><h2>Metadata</h2>{"".join(blocks)}</section>'


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    if len(text) <= LONG_VALUE_CHARS:
        return text
    count = f" ({len(value)} items)" if isinstance(value, (list, dict)) else ""
    return text[:LONG_VALUE_CHARS] + f"...{count}"


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 62em; color: #222; }
h1 { font-size: 1.4em; } h2 { border-bottom: 1px solid #ccc; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.6em 0; }
td, th { padding: 0.2em 0.7em; border-bottom: 1px solid #eee; text-align: left;
  vertical-align: top; }
table.summary td:first-child, table.header td:first-child,
table.provenance td:first-child { color: #555; }
figure.plot { margin: 0.6em 0; } figure.plot svg { display: block; max-width: 100%; height: auto; }
.videos { display: flex; flex-wrap: wrap; gap: 1em; }
figure.video { margin: 0; } figure.video video { width: 320px; background: #000; }
figcaption { font-size: 0.85em; color: #555; }
.source, .note { color: #555; }
"""

__all__ = [
    "ReportData",
    "episodes_by_task",
    "read_report_data",
    "render_html",
    "report_data_of",
    "scored_columns",
    "write_html",
]
