"""The summary of a run and of a suite: the JSON-ready dict ``rlmesh`` prints, and its table.

``summarize`` turns a ``RunResult`` (or the ``RunColumns`` of a results file) into the
JSON-ready dict the ``rlmesh`` command prints (``--json``, through ``results.dumps``) or renders
as a table (``format_summary``). A value that does not exist (no episodes, success that is not
available, a latency never measured) is None, never nan; an infinite one stays a float, which
``results.dumps`` writes as ``"Infinity"`` / ``"-Infinity"``, so the JSON is strict.

Example:
    >>> from rlmesh.results import RunResult
    >>> print(format_summary(summarize(RunResult((), base_seed=3), core="rust")).split()[:2])
    ['episodes', '0']
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..results.records import RunColumns, RunResult, TelemetryRow, mean
from ..results.success import describe
from .intervals import (
    bootstrap_mean_ci,
    interquartile_mean,
    stratified_bootstrap_mean_ci,
    wilson_interval,
)
from .stopping import SUCCESS, UNFINISHED


def _number(value: float | None) -> float | None:
    """A JSON-ready float: None for nan or a missing value."""
    return None if value is None or math.isnan(value) else float(value)


def _row(telemetry: Sequence[TelemetryRow], op: str, metric: str) -> TelemetryRow | None:
    return next((row for row in telemetry if row.op == op and row.metric == metric), None)


def _latency(telemetry: Sequence[TelemetryRow], op: str) -> dict[str, float | None]:
    row = _row(telemetry, op, "latency")
    return {q: None if row is None else _number(getattr(row, q)) for q in ("p50", "p95", "p99")}


def summarize(
    result: RunResult | RunColumns, *, core: str | None = None, elapsed_s: float | None = None
) -> dict[str, Any]:
    """Every figure of the summary table, as a JSON-ready dict (``RunResult.summary()``).

    ``success_rate`` counts the episodes with a verdict (``rlmesh.success``: the env's info,
    else the run's rule); it is None, and so is its interval, when no episode has one.
    ``success_rule`` names the rule used, ``success_reported`` for how many episodes the env
    reported success itself. ``episodes_requested`` is what the run asked for and
    ``complete`` whether every one of them is there (None when not known). ``steps_per_s`` is
    the driver's lane-steps per second (telemetry). The figures mean the same at any number of
    lanes (``rlmesh.telemetry`` says what one sample is): ``predict_ms`` is per model call and
    ``predicts_per_episode`` counts model calls per scored episode (a per-lane corner is called
    once per lane that needs an action, a batched corner once for all of them; the
    statefulness probe's calls are not counted); ``env_step_ms`` is per lane-step, one env's
    transition. ``core`` and ``elapsed_s`` default to the result's own.

    Failed episodes (their env raised, recorded with ``on_error``: ``EpisodeResult.error``)
    count in ``episodes`` and ``total_steps``, are counted in ``failed`` and listed in
    ``failed_indices``, and are left out of every reward, length and success figure, which
    describe the ``episodes - failed`` episodes that ran to their end.

    A run with ``until=`` (``RunResult.stop``) is complete when it stopped (on precision, or
    at its cap), and its summary has ``"stop"``: the ``RunStop`` as a dict, with the
    anytime-valid confidence sequence (``lower``, ``upper``) the run stopped on.

    Example:
        >>> from rlmesh.results import EpisodeResult
        >>> episodes = [EpisodeResult(k, k, k, 0, 10 + k, float(k), True, False, k % 2 == 0,
        ...                           0.1, 0.1, 0.1, True) for k in range(4)]
        >>> summary = summarize(RunResult(episodes, base_seed=0), core="python")
        >>> summary["episodes"], summary["mean_reward"], summary["success_rate"]
        (4, 1.5, 0.5)
        >>> summary["success_rule"]
        'env info'
    """
    run = result.columns() if isinstance(result, RunResult) else result
    n = int(run.index.size)
    total_steps = int(run.steps.sum())
    failed = run.failed if run.failed is not None else np.zeros(n, dtype=bool)
    ended = ~failed
    rewards, lengths, success = run.reward[ended], run.steps[ended], run.success[ended]
    finished = int(rewards.size)
    judged = success >= 0
    judged_count = int(np.count_nonzero(judged))
    successes = int(np.count_nonzero(success == 1))
    reported = int(np.count_nonzero(run.success_reported[ended] & judged))
    telemetry = run.telemetry
    predict = _row(telemetry, "model.predict", "latency")
    lane_steps = _row(telemetry, "driver", "lane-steps")
    reward_lo, reward_hi = bootstrap_mean_ci(rewards)
    success_lo, success_hi = wilson_interval(successes, judged_count)
    requested = run.episodes_requested
    elapsed = run.elapsed_s if elapsed_s is None else elapsed_s
    stop = getattr(result, "stop", None)  # a RunResult's, or a file's columns'
    complete = None if requested is None else n >= requested
    if stop is not None:
        complete = stop.reason != UNFINISHED
    return {
        "episodes": n,
        "episodes_requested": requested,
        "complete": complete,
        "failed": n - finished,
        "failed_indices": run.index[failed].tolist(),
        "total_steps": total_steps,
        "mean_reward": _number(mean(rewards)),
        "mean_reward_ci95": [_number(reward_lo), _number(reward_hi)],
        "iqm_reward": _number(interquartile_mean(rewards)),
        "success_rate": successes / judged_count if judged_count else None,
        "success_ci95": [_number(success_lo), _number(success_hi)],
        "success_rule": describe(run.success_rule, episodes=finished, reported=reported),
        "success_reported": reported,
        "episode_length_mean": _number(float(lengths.mean())) if finished else None,
        "episode_length_min": int(lengths.min()) if finished else None,
        "episode_length_max": int(lengths.max()) if finished else None,
        "steps_per_s": None if lane_steps is None else _number(lane_steps.avg),
        "predict_ms": _latency(telemetry, "model.predict"),
        "env_step_ms": _latency(telemetry, "env.step"),
        "predicts_per_episode": (predict.count / n if predict is not None and n else None),
        "wasted_steps": run.wasted_steps,
        "base_seed": run.base_seed,
        "core": core or run.core or "unknown",
        "elapsed_s": _number(elapsed),
        **({} if stop is None else {"stop": stop.to_dict()}),
    }


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _interval(pair: Sequence[float | None], spec: str = ".3f") -> str:
    return "-" if pair[0] is None else f"[{_fmt(pair[0], spec)}, {_fmt(pair[1], spec)}]"


def _percentiles(latency: dict[str, float | None]) -> str:
    return " / ".join(_fmt(latency[q]) for q in ("p50", "p95", "p99"))


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary as (label, text) rows, in table order."""
    episodes = str(summary["episodes"])
    if summary.get("complete") is False:
        episodes = f"{summary['episodes']} of {summary['episodes_requested']}, incomplete"
    stop = summary.get("stop")
    if stop is not None:
        episodes = f"{summary['episodes']} of at most {stop['cap']}, stopped: {stop['reason']}"
    success = (
        "n/a"
        if summary["success_rate"] is None
        else f"{summary['success_rate']:.1%}  95% CI " + _interval(summary["success_ci95"], ".1%")
    )
    failed = [("failed episodes (env error)", _listed(summary))] if summary.get("failed") else []
    return [
        ("episodes", episodes),
        *failed,
        ("total steps", str(summary["total_steps"])),
        (
            "mean reward",
            f"{_fmt(summary['mean_reward'])}  95% CI " + _interval(summary["mean_reward_ci95"]),
        ),
        ("IQM reward", _fmt(summary["iqm_reward"])),
        ("success rate", success),
        *_stop_rows(stop),
        ("success rule", summary["success_rule"]),
        (
            "episode length mean / min / max",
            " / ".join(
                [
                    _fmt(summary["episode_length_mean"], ".1f"),
                    _fmt(summary["episode_length_min"], "d"),
                    _fmt(summary["episode_length_max"], "d"),
                ]
            ),
        ),
        ("lane-steps/s", _fmt(summary["steps_per_s"], ",.0f")),
        ("predict ms per call p50 / p95 / p99", _percentiles(summary["predict_ms"])),
        ("env step ms per lane-step p50 / p95 / p99", _percentiles(summary["env_step_ms"])),
        ("model calls per episode", _fmt(summary["predicts_per_episode"], ".1f")),
        ("wasted steps", str(summary["wasted_steps"])),
        ("base seed", str(summary["base_seed"])),
        ("core", str(summary["core"])),
    ]


def _stop_rows(stop: dict[str, Any] | None) -> list[tuple[str, str]]:
    """A stopped run's rows: the confidence sequence it stopped on, and the episodes the stop
    left out."""
    if stop is None:
        return []
    rule = stop["rule"]
    success = SUCCESS in rule
    level = f"{round((1 - rule['alpha']) * 100, 6):g}%"
    spec = ".1%" if success else ".3f"
    target = rule["success"] if success else rule["reward"]
    interval = _interval([stop["lower"], stop["upper"]], spec)
    rows = [
        (
            f"{'success rate' if success else 'mean reward'} {level} confidence sequence",
            f"{interval}  anytime-valid, target +/-{format(target, spec if success else 'g')}, "
            f"over {stop['observations']} episodes",
        )
    ]
    if stop["cancelled"] or stop["discarded"]:
        rows.append(
            (
                "episodes past the stop",
                f"{len(stop['cancelled'])} cancelled while running, "
                f"{len(stop['discarded'])} finished and left out",
            )
        )
    return rows


LISTED_FAILURES = 20
"""The failed episodes' indices the summary table lists before it says how many more."""


def _listed(summary: dict[str, Any]) -> str:
    """``"3: indices 2, 7, 11"``, the first ``LISTED_FAILURES`` indices then ``", ... (N
    more)"``; the JSON summary holds them all."""
    indices = summary["failed_indices"]
    shown = ", ".join(map(str, indices[:LISTED_FAILURES]))
    more = len(indices) - LISTED_FAILURES
    tail = f", ... ({more} more)" if more > 0 else ""
    return f"{summary['failed']}: indices {shown}{tail}"


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as a plain aligned two-column table (what ``rlmesh`` prints).

    Example:
        >>> print(format_summary(summarize(RunResult((), base_seed=3), core="rust")).split()[:2])
        ['episodes', '0']
    """
    rows = summary_rows(summary)
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label.ljust(width)}  {text}" for label, text in rows)


# ---------------------------------------------------------------------------- suites


# How a suite's overall row is computed, in words: its summary's "method", and its table's note.
_EQUAL_WEIGHT = "(each task counts once, whatever its episodes)"
_STRATIFIED_CI = (
    "95% CI: stratified bootstrap, each task's episodes resampled within the task "
    "({resamples} resamples, seed {seed})"
)
OVERALL_METHOD = f"the unweighted mean of the per-task figures {_EQUAL_WEIGHT}; {_STRATIFIED_CI}"
TABLE_OVERALL_NOTE = (
    f"success is the unweighted mean of the per-task success rates {_EQUAL_WEIGHT}; "
    f"{_STRATIFIED_CI}; returns are not pooled across tasks (each task's are on its own scale)"
)


def summarize_suite(
    runs: dict[str, RunResult | RunColumns],
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> dict[str, Any]:
    """A suite's summary, JSON-ready: one row per task and the overall row.

    Args:
        runs: task name -> that task's ``RunResult`` or ``RunColumns`` (``rlmesh.run_suite``'s
            ``SuiteResult.runs``, or ``results.read_suite_columns``), in suite order.

    Each task row holds the task's ``summarize`` figures of its episodes that did not fail
    (``success_rate`` with its Wilson ``success_ci95``, ``mean_reward`` with its bootstrap
    ``mean_reward_ci95``, ...), with ``episodes`` counting every episode, ``errors`` the
    failed ones (``EpisodeResult.error`` set) and ``error_indices`` their indices. The
    overall row holds ``success_rate``, the mean of the per-task success rates (of the
    ``success_tasks`` tasks whose success is available), and ``mean_reward``, the mean of the
    per-task mean rewards, each with a ``stratified_bootstrap_mean_ci`` (``seed``, ``resamples``);
    ``method`` says so in words.

    Example:
        >>> from rlmesh.results import EpisodeResult
        >>> def episode(k, reward, success):
        ...     return EpisodeResult(k, k, k, 0, 10, reward, True, False, success, 0, 0, 0, True)
        >>> a = RunResult([episode(0, 1.0, True), episode(1, 0.0, False)], base_seed=0)
        >>> b = RunResult([episode(0, 4.0, True)], base_seed=0)
        >>> overall = summarize_suite({"a": a, "b": b})["overall"]
        >>> overall["success_rate"], overall["mean_reward"]
        (0.75, 2.25)
    """
    rows, rates, returns = [], [], []
    for name, run in runs.items():
        columns = run.columns() if isinstance(run, RunResult) else run
        failed = columns.failed
        if failed is None:
            failed = np.zeros(columns.num_episodes, dtype=bool)
        kept = columns.select(~failed)
        row = summarize(kept)
        requested = columns.episodes_requested
        row.update(
            task=name,
            episodes=columns.num_episodes,
            complete=None if requested is None else columns.num_episodes >= requested,
            errors=int(failed.sum()),
            error_indices=columns.index[failed].tolist(),
        )
        rows.append({"task": name, **row})
        judged = kept.success >= 0
        if judged.any():
            rates.append(kept.success[judged].astype(np.float64))
        if kept.num_episodes:
            returns.append(kept.reward)
    requested = [row["episodes_requested"] for row in rows]
    overall = {
        "tasks": len(rows),
        "episodes": sum(row["episodes"] for row in rows),
        "episodes_requested": None if None in requested else sum(requested),
        "complete": all(row["complete"] is not False for row in rows),
        "errors": sum(row["errors"] for row in rows),
        **suite_overall(rates, returns, confidence=confidence, resamples=resamples, seed=seed),
    }
    return {"tasks": rows, "overall": overall}


def suite_overall(
    rates: Sequence[np.ndarray],
    returns: Sequence[np.ndarray],
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> dict[str, Any]:
    """A suite's overall figures from its tasks' success verdicts (``rates``: per task with
    any, its 0/1 values) and returns (per task with episodes): the means of the per-task
    means, each with its stratified bootstrap CI, and the method in words.

    Example:
        >>> overall = suite_overall([np.array([1.0, 0.0]), np.array([1.0])], [np.array([2.0])])
        >>> overall["success_rate"], overall["mean_reward"], overall["mean_reward_ci95"]
        (0.75, 2.0, [2.0, 2.0])
    """
    success_lo, success_hi = stratified_bootstrap_mean_ci(rates, confidence, resamples, seed)
    reward_lo, reward_hi = stratified_bootstrap_mean_ci(returns, confidence, resamples, seed)
    return {
        "success_rate": _number(mean([rate.mean() for rate in rates])) if rates else None,
        "success_ci95": [_number(success_lo), _number(success_hi)],
        "success_tasks": len(rates),
        "mean_reward": _number(mean([float(np.mean(r)) for r in returns])) if returns else None,
        "mean_reward_ci95": [_number(reward_lo), _number(reward_hi)],
        "reward_tasks": len(returns),
        "ci": "stratified bootstrap",
        "resamples": resamples,
        "seed": seed,
        "method": OVERALL_METHOD.format(resamples=resamples, seed=seed),
    }


def format_suite_summary(summary: dict[str, Any]) -> str:
    """The suite's summary (``summarize_suite``) as an aligned table: one row per task, with
    the rule that judged its success; the overall row, the mean of the tasks' success rates
    (the returns of different tasks are not pooled: its reward cells are ``-``); and a line
    saying how the overall row is computed.

    Example:
        >>> print(format_suite_summary(summarize_suite({"a": RunResult((), base_seed=0)})))
        ... # doctest: +NORMALIZE_WHITESPACE
        task     episodes  errors  success  95% CI (Wilson)  mean reward  95% CI (bootstrap)
          success rule
        a        0         0       n/a      -                -            -
          not available
        overall  0         0       n/a      -                -            -
        overall: success is the unweighted mean of the per-task success rates ...
    """
    header = [
        "task",
        "episodes",
        "errors",
        "success",
        "95% CI (Wilson)",
        "mean reward",
        "95% CI (bootstrap)",
        "success rule",
    ]

    def cells(name: str, row: dict[str, Any], *, task: bool = True) -> list[str]:
        episodes = str(row["episodes"])
        if row.get("complete") is False:
            episodes = f"{row['episodes']} of {row['episodes_requested']}, incomplete"
        rate = row["success_rate"]
        reward = row["mean_reward"] if task else None  # the overall row pools no returns
        return [
            name,
            episodes,
            str(row["errors"]),
            "n/a" if rate is None else f"{rate:.1%}",
            "-" if rate is None else _interval(row["success_ci95"], ".1%"),
            _fmt(reward),
            "-" if reward is None else _interval(row["mean_reward_ci95"]),
            row["success_rule"] if task else "",
        ]

    lines = [header]
    lines += [cells(row["task"], row) for row in summary["tasks"]]
    overall = summary["overall"]
    lines.append(cells("overall", overall, task=False))
    widths = [max(len(line[k]) for line in lines) for k in range(len(header))]
    table = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    ]
    note = "overall: " + TABLE_OVERALL_NOTE.format(
        resamples=overall["resamples"], seed=overall["seed"]
    )
    if overall["success_tasks"] < overall["tasks"]:
        note += (
            f"; success over the {overall['success_tasks']} of {overall['tasks']} tasks whose "
            "success is available"
        )
    failed = [f"{row['task']} {row['error_indices']}" for row in summary["tasks"] if row["errors"]]
    if failed:
        note += "\nfailed episodes (kept out of the figures): " + "; ".join(failed)
    return "\n".join(table) + "\n" + note
