"""Paired comparison of two runs: policy b against policy a, episode by episode.

Episode k of a run is reset with a seed fixed by its index (per task, in a suite), so two runs
of the same settings are *paired*: episode (task, index) starts from the same state in both,
and the difference between the policies is measured on each start, not only on average.
Where outcomes depend on the start, that needs far fewer episodes to see a difference than
comparing two unpaired means.

``compare(a, b)`` matches the episodes of two runs by (task, index, seed), where ``task`` is
None outside a suite. It refuses (``RunsNotPairedError``) runs that cannot be paired: an
episode whose seeds differ (the message names the first such (task, index) and both seeds),
an unseeded episode, a suite against a run that is not one, and episodes present in one run
only (it names how many and the first few), unless ``intersection=True``, which compares the
episodes both runs hold and counts the rest. A pair where either episode ended with an env
failure (its ``error``) is left out of every figure and counted. A pair whose reset digests
differ (``EpisodeResult.reset_digest``) did not start from the same state although its seeds
agree (an env that ignores its seed, another env version): it is flagged and counted
(``reset_differences``), since the comparison is then not paired there.

Every difference is b - a: positive means b did better. Per task (in a suite) and overall:

- ``mean_return_difference``: the mean of the pairs' return differences, with a paired
  bootstrap CI (the pairs are resampled, so each resample keeps an episode's two returns
  together: ``stats.bootstrap_mean_ci`` of the differences, seeded, so reproducible);
- ``return_wins``: how many pairs b's return beat a's (``"b"``), a's beat b's (``"a"``), or
  equalled it (``"tie"``);
- ``success`` (None when either run's success is not available: ``success_missing`` says
  which): both rates, their difference with Newcombe's paired interval
  (``stats.paired_rate_difference_ci``), the pairs' table (``both``, ``only_a``, ``only_b``,
  ``neither``: the discordant pairs ``only_b`` and ``only_a`` are the success wins of b and
  a) and McNemar's exact p-value (``stats.mcnemar_exact_p``). Only pairs where both
  episodes have a verdict count.

The overall row of a suite weighs each task the same, as a suite's summary does: its
differences are the means of the per-task differences, with a stratified paired bootstrap CI
(``stats.stratified_bootstrap_mean_ci``: pairs resampled within each task), for success too;
its McNemar test and its wins pool every pair. Outside a suite the overall row is the one
group of pairs. ``compare`` returns a JSON-ready dict (``results.dumps`` writes it as strict
JSON, as ``rlmesh compare --json`` prints it); ``format_comparison`` renders it as the table
``rlmesh compare`` prints.

Example:
    >>> from rlmesh.results import EpisodeResult, RunResult
    >>> def run(rewards):
    ...     return RunResult([EpisodeResult(k, 100 + k, k, 0, 10, r, True, False, r > 1,
    ...                                     0, 0, 0) for k, r in enumerate(rewards)], 0)
    >>> result = compare(run([1, 2, 1, 2]), run([2, 2, 3, 2]))
    >>> overall = result["overall"]
    >>> overall["pairs"], overall["mean_return_difference"], overall["return_wins"]
    (4, 0.75, {'b': 2, 'a': 0, 'tie': 2})
    >>> overall["success"]["only_b"], overall["success"]["mcnemar_p"]
    (2, 0.5)
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from ..errors import ResultsFileError, RlmeshError
from ..results import EpisodeResult, RunResult, mean, read_contents
from ..stats import (
    bootstrap_mean_ci,
    mcnemar_exact_p,
    paired_rate_difference_ci,
    stratified_bootstrap_mean_ci,
)
from .verify import format_reset_differences, reset_differences

# A run to compare: a results file's path, or a RunResult.
Run = Union[str, "os.PathLike[str]", RunResult]

# How many unmatched episodes a refusal names.
LISTED = 5

METHODS = {
    "direction": "every difference is b - a: positive means b did better",
    "pairing": "episodes matched by (task, index, seed)",
    "return": "paired bootstrap percentile CI of the mean return difference (pairs resampled)",
    "success_difference": "Newcombe (1998) hybrid score interval for paired proportions "
    "(method 10)",
    "success_test": "McNemar's exact test (two-sided binomial test of the discordant pairs)",
    "suite_overall": "the mean of the per-task differences, with a stratified paired "
    "bootstrap CI (pairs resampled within each task); McNemar's test and the wins pool "
    "every pair",
}


class RunsNotPairedError(RlmeshError, ValueError):
    """Two runs cannot be compared pair by pair: their seeds differ, an episode has no seed,
    one is a suite and the other not, or one holds episodes the other lacks."""


@dataclass(frozen=True)
class _Episode:
    """What a comparison reads of one episode."""

    task: str | None
    index: int
    seed: int | None
    reward: float
    success: bool | None
    error: str | None
    reset_digest: str | None = None


@dataclass(frozen=True)
class _Run:
    """One side of a comparison: where it came from, its header and its episodes by key."""

    label: str
    header: dict[str, Any]
    episodes: dict[tuple[str | None, int], _Episode]


def compare(
    a: Run,
    b: Run,
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
    intersection: bool = False,
) -> dict[str, Any]:
    """Compare run b against run a, pair by pair (see the module docstring for each figure).

    Args:
        a, b: results files (paths) or ``RunResult`` objects of runs with the same seeds.
        confidence: the level of every interval, in (0, 1).
        resamples: bootstrap resamples (a positive integer).
        seed: the bootstrap's seed (a non-negative integer): the same seed, the same
            intervals.
        intersection: compare only the episodes both runs hold (counted in ``only_in_a`` /
            ``only_in_b``) instead of refusing runs that do not hold the same episodes.

    Returns:
        A JSON-ready dict: ``a`` and ``b`` (their source, episodes and env errors),
        ``confidence``, ``resamples``, ``seed``, ``methods``, ``pairs``, ``only_in_a``,
        ``only_in_b``, ``excluded_for_errors``, ``reset_differences`` (``pairs``: how many
        compared pairs started from different states by their reset digests, of ``compared``,
        the pairs with digests on both sides; ``first``: the first few), ``tasks`` (one row
        per task, in name order; empty outside a suite) and ``overall`` (a row). A figure
        that does not exist is None.

    Raises:
        RunsNotPairedError: the runs cannot be paired (the message says why and where).
        ResultsFileError: a file is not a results file.
        ValueError: an argument is out of its range.

    Example:
        >>> from rlmesh.results import EpisodeResult, RunResult
        >>> a = RunResult([EpisodeResult(0, 5, 0, 0, 9, 9.0, True, False, None, 0, 0, 0)], 0)
        >>> compare(a, a)["overall"]["mean_return_difference_ci"]
        [0.0, 0.0]
    """
    _check_arguments(confidence, resamples, seed)
    run_a, run_b = _load(a, "a"), _load(b, "b")
    keys, only_a, only_b = _match(run_a, run_b, intersection)
    erred = [key for key in keys if run_a.episodes[key].error or run_b.episodes[key].error]
    left_out = set(erred)
    paired = [key for key in keys if key not in left_out]
    # Every task keeps its row, even one whose every pair was left out for errors.
    groups: dict[str | None, list[tuple[_Episode, _Episode]]] = {task: [] for task, _ in keys}
    for key in paired:
        groups[key[0]].append((run_a.episodes[key], run_b.episodes[key]))
    options = {"confidence": confidence, "resamples": resamples, "seed": seed}
    suite = any(task is not None for task in groups)
    tasks = [_row(name, groups[name], options) for name in groups] if suite else []
    if tasks:
        overall = _suite_overall(tasks, groups, options)
    else:
        overall = _row(None, groups.get(None, []), options)
    return {
        "a": _side(run_a),
        "b": _side(run_b),
        "confidence": confidence,
        "resamples": resamples,
        "seed": seed,
        "methods": dict(METHODS),
        "pairs": len(paired),
        "only_in_a": len(only_a),
        "only_in_b": len(only_b),
        "excluded_for_errors": {
            "pairs": len(erred),
            "a": sum(1 for key in erred if run_a.episodes[key].error),
            "b": sum(1 for key in erred if run_b.episodes[key].error),
            "first": [_key_json(key) for key in erred[:LISTED]],
        },
        "reset_differences": reset_differences(
            (key, run_a.episodes[key].reset_digest, run_b.episodes[key].reset_digest)
            for key in paired
        ),
        "tasks": tasks,
        "overall": overall,
    }


def _check_arguments(confidence: float, resamples: int, seed: int) -> None:
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)):
        raise ValueError(f"confidence must be a number in (0, 1), got {confidence!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), such as 0.95, got {confidence!r}")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples must be a positive integer, got {resamples!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")


# ---------------------------------------------------------------------------- the two runs


def _load(run: Run, side: str) -> _Run:
    if isinstance(run, RunResult):
        return _keyed(f"RunResult {side}", {"seed": run.base_seed}, _episodes(run.episodes))
    if not isinstance(run, (str, os.PathLike)):
        raise TypeError(
            f"compare: {side} must be a results file's path or a RunResult, got "
            f"{type(run).__name__}"
        )
    contents = read_contents(run, cut_off="skipped")
    return _keyed(os.fspath(run), contents.config(), _episodes(contents.episodes))


def _episodes(episodes: Sequence[EpisodeResult]) -> list[_Episode]:
    return [
        _Episode(
            task=episode.task,
            index=episode.index,
            seed=episode.seed,
            reward=episode.reward,
            success=episode.success,
            error=episode.error,
            reset_digest=episode.reset_digest,
        )
        for episode in episodes
    ]


def _keyed(label: str, header: dict[str, Any], episodes: list[_Episode]) -> _Run:
    keyed: dict[tuple[str | None, int], _Episode] = {}
    for episode in episodes:
        key = (episode.task, episode.index)
        if key in keyed:
            raise ResultsFileError(f"{label} holds {_key_text(key)} twice")
        keyed[key] = episode
    return _Run(label, header, keyed)


def _side(run: _Run) -> dict[str, Any]:
    return {
        "source": run.label,
        "policy": run.header.get("policy"),
        "env": run.header.get("env"),
        "base_seed": run.header.get("seed"),
        "episodes": len(run.episodes),
        "errors": sum(1 for episode in run.episodes.values() if episode.error),
    }


# ---------------------------------------------------------------------------- matching


def _order(key: tuple[str | None, int]) -> tuple[bool, str, int]:
    return (key[0] is not None, key[0] or "", key[1])


def _key_text(key: tuple[str | None, int]) -> str:
    task, index = key
    return f"episode {index}" if task is None else f"task {task!r} episode {index}"


def _key_json(key: tuple[str | None, int]) -> dict[str, Any]:
    return {"task": key[0], "index": key[1]}


def _match(
    a: _Run, b: _Run, intersection: bool
) -> tuple[list[tuple[str | None, int]], list[tuple[str | None, int]], list]:
    """The keys both runs hold, in order, and the keys only one holds; refuses what cannot be
    paired."""
    suite_a = sorted({task for task, _ in a.episodes if task is not None})
    suite_b = sorted({task for task, _ in b.episodes if task is not None})
    for run, tasks, other, other_tasks in ((a, suite_a, b, suite_b), (b, suite_b, a, suite_a)):
        if tasks and not other_tasks and other.episodes:
            raise RunsNotPairedError(
                f"{run.label} is a suite (tasks {', '.join(tasks[:LISTED])}"
                f"{', ...' if len(tasks) > LISTED else ''}) and {other.label} is not: compare a "
                "suite's results with another run of the same suite"
            )
    common = sorted(a.episodes.keys() & b.episodes.keys(), key=_order)
    only_a = sorted(a.episodes.keys() - b.episodes.keys(), key=_order)
    only_b = sorted(b.episodes.keys() - a.episodes.keys(), key=_order)
    for key in common:
        seed_a, seed_b = a.episodes[key].seed, b.episodes[key].seed
        if seed_a is None or seed_b is None:
            unseeded = a.label if seed_a is None else b.label
            raise RunsNotPairedError(
                f"{_key_text(key)} has no seed in {unseeded} (its env chose the start itself), "
                "so its episodes cannot be paired: compare runs whose episodes are seeded"
            )
        if seed_a != seed_b:
            bases = ""
            base_a, base_b = a.header.get("seed"), b.header.get("seed")
            if base_a != base_b:
                bases = f" (base seeds {base_a} and {base_b})"
            raise RunsNotPairedError(
                f"the runs' seeds differ{bases}: {_key_text(key)} has seed {seed_a} in "
                f"{a.label} and {seed_b} in {b.label}; a paired comparison needs runs of the "
                "same seeds (the same --seed / --seeds)"
            )
    if (only_a or only_b) and not intersection:
        parts = []
        for run, other, keys in ((a, b, only_a), (b, a, only_b)):
            if keys:
                listed = ", ".join(_key_text(key) for key in keys[:LISTED])
                more = ", ..." if len(keys) > LISTED else ""
                parts.append(
                    f"{len(keys)} episode{'s' if len(keys) > 1 else ''} of {run.label} "
                    f"{'are' if len(keys) > 1 else 'is'} not in {other.label} ({listed}{more})"
                )
        raise RunsNotPairedError(
            "the runs do not hold the same episodes: "
            + "; ".join(parts)
            + ". Finish the shorter run (--resume), or compare only the episodes both hold "
            "with --intersection (intersection=True)"
        )
    if not common:
        raise RunsNotPairedError(f"{a.label} and {b.label} have no episode in common")
    return common, only_a, only_b


# ---------------------------------------------------------------------------- the figures


def _number(value: float) -> float | None:
    """A JSON-ready figure: None for nan (a figure that does not exist)."""
    return None if math.isnan(value) else float(value)


def _interval(pair: tuple[float, float]) -> list[float | None]:
    return [_number(pair[0]), _number(pair[1])]


def _row(
    task: str | None, pairs: Sequence[tuple[_Episode, _Episode]], options: dict[str, Any]
) -> dict[str, Any]:
    """The figures of one group of pairs (a task, or every pair outside a suite)."""
    rewards_a = np.array([a.reward for a, _ in pairs], dtype=np.float64)
    rewards_b = np.array([b.reward for _, b in pairs], dtype=np.float64)
    with np.errstate(invalid="ignore"):  # inf - inf: a nan difference, no figure
        differences = rewards_b - rewards_a
    row = {
        "task": task,
        "pairs": len(pairs),
        "mean_return_a": _number(mean(rewards_a)),
        "mean_return_b": _number(mean(rewards_b)),
        "mean_return_difference": _number(mean(differences)),
        "mean_return_difference_ci": _interval(
            bootstrap_mean_ci(
                differences, options["confidence"], options["resamples"], options["seed"]
            )
        ),
        "return_wins": _wins(rewards_a, rewards_b),
    }
    judged = [(a.success, b.success) for a, b in pairs]
    missing = [
        side
        for side, column in (("a", 0), ("b", 1))
        if not any(verdicts[column] is not None for verdicts in judged)
    ]
    verdicts = [(sa, sb) for sa, sb in judged if sa is not None and sb is not None]
    if missing or not verdicts:
        row["success"] = None
        row["success_missing"] = " and ".join(missing) or "a and b"
        return row
    table = {
        "both": sum(1 for sa, sb in verdicts if sa and sb),
        "only_a": sum(1 for sa, sb in verdicts if sa and not sb),
        "only_b": sum(1 for sa, sb in verdicts if sb and not sa),
        "neither": sum(1 for sa, sb in verdicts if not sa and not sb),
    }
    n = len(verdicts)
    rate_a = (table["both"] + table["only_a"]) / n
    rate_b = (table["both"] + table["only_b"]) / n
    row["success"] = {
        "pairs": n,
        "rate_a": rate_a,
        "rate_b": rate_b,
        "difference": rate_b - rate_a,
        "difference_ci": _interval(
            paired_rate_difference_ci(**table, confidence=options["confidence"])
        ),
        **table,
        "mcnemar_p": mcnemar_exact_p(table["only_a"], table["only_b"]),
    }
    row["success_missing"] = None
    return row


def _wins(rewards_a: np.ndarray, rewards_b: np.ndarray) -> dict[str, int]:
    return {
        "b": int(np.count_nonzero(rewards_b > rewards_a)),
        "a": int(np.count_nonzero(rewards_a > rewards_b)),
        "tie": int(np.count_nonzero(rewards_a == rewards_b)),
    }


def _suite_overall(
    tasks: list[dict[str, Any]],
    groups: dict[str | None, list[tuple[_Episode, _Episode]]],
    options: dict[str, Any],
) -> dict[str, Any]:
    """The overall row of a suite: each task weighs the same (see the module docstring)."""
    bootstrap = (options["confidence"], options["resamples"], options["seed"])

    def task_mean(name: str) -> float | None:
        values = [row[name] for row in tasks]
        return None if any(value is None for value in values) else float(np.mean(values))

    with np.errstate(invalid="ignore"):
        differences = [
            np.array([b.reward - a.reward for a, b in groups[row["task"]]], dtype=np.float64)
            for row in tasks
        ]
    every = [pair for row in tasks for pair in groups[row["task"]]]
    overall = {
        "task": None,
        "pairs": len(every),
        "mean_return_a": task_mean("mean_return_a"),
        "mean_return_b": task_mean("mean_return_b"),
        "mean_return_difference": task_mean("mean_return_difference"),
        "mean_return_difference_ci": _interval(
            stratified_bootstrap_mean_ci(differences, *bootstrap)
        ),
        "return_wins": _wins(
            np.array([a.reward for a, _ in every], dtype=np.float64),
            np.array([b.reward for _, b in every], dtype=np.float64),
        ),
    }
    lacking = [row["task"] for row in tasks if row["success"] is None]
    if lacking:
        overall["success"] = None
        overall["success_missing"] = f"task {lacking[0]!r}" + (
            f" and {len(lacking) - 1} more" if len(lacking) > 1 else ""
        )
        return overall
    table = {
        cell: sum(row["success"][cell] for row in tasks)
        for cell in ("both", "only_a", "only_b", "neither")
    }
    success_differences = [
        np.array(
            [
                int(bool(b.success)) - int(bool(a.success))
                for a, b in groups[row["task"]]
                if a.success is not None and b.success is not None
            ],
            dtype=np.float64,
        )
        for row in tasks
    ]
    overall["success"] = {
        "pairs": sum(table.values()),
        "rate_a": float(np.mean([row["success"]["rate_a"] for row in tasks])),
        "rate_b": float(np.mean([row["success"]["rate_b"] for row in tasks])),
        "difference": float(np.mean([row["success"]["difference"] for row in tasks])),
        "difference_ci": _interval(stratified_bootstrap_mean_ci(success_differences, *bootstrap)),
        **table,
        "mcnemar_p": mcnemar_exact_p(table["only_a"], table["only_b"]),
    }
    overall["success_missing"] = None
    return overall


# ---------------------------------------------------------------------------- the table


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ci(pair: Sequence[float | None], spec: str) -> str:
    return "-" if pair[0] is None else f"[{_fmt(pair[0], spec)}, {_fmt(pair[1], spec)}]"


def _p_value(p: float) -> str:
    return f"{p:.3g}" if p >= 1e-3 else f"{p:.1e}"


def _name(row: dict[str, Any]) -> str:
    return "overall" if row["task"] is None else str(row["task"])


def _return_cells(row: dict[str, Any]) -> list[str]:
    wins = row["return_wins"]
    difference = _fmt(row["mean_return_difference"], "+.3f")
    return [
        _name(row),
        str(row["pairs"]),
        _fmt(row["mean_return_a"], ".3f"),
        _fmt(row["mean_return_b"], ".3f"),
        f"{difference} {_ci(row['mean_return_difference_ci'], '+.3f')}",
        f"{wins['b']}/{wins['a']}/{wins['tie']}",
    ]


def _success_cells(row: dict[str, Any]) -> list[str]:
    success = row["success"]
    if success is None:
        return [_name(row), "-", f"n/a: not available in {row['success_missing']}"]
    return [
        _name(row),
        str(success["pairs"]),
        f"{success['rate_a']:.1%}",
        f"{success['rate_b']:.1%}",
        f"{success['difference']:+.1%} {_ci(success['difference_ci'], '+.1%')}",
        f"{success['only_b']}/{success['only_a']}",
        _p_value(success["mcnemar_p"]),
    ]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = [header, *rows]
    widths = [
        max((len(line[k]) for line in lines if k < len(line) - 1), default=0)
        for k in range(len(header))
    ]
    # A row's last cell is not padded, so an n/a note may run past the columns it replaces.
    return [
        "  ".join(
            cell if k == len(line) - 1 else cell.ljust(widths[k]) for k, cell in enumerate(line)
        )
        for line in lines
    ]


def _described(side: dict[str, Any]) -> str:
    return side["source"] if side["policy"] is None else f"{side['source']} ({side['policy']})"


def format_comparison(comparison: dict[str, Any]) -> str:
    """The comparison as the plain-text tables ``rlmesh compare`` prints (return, then
    success: a row per task and the overall row), then the counts and the methods.

    Example:
        >>> from rlmesh.results import EpisodeResult, RunResult
        >>> a = RunResult([EpisodeResult(0, 5, 0, 0, 9, 9.0, True, False, None, 0, 0, 0)], 0)
        >>> print(format_comparison(compare(a, a)).splitlines()[0])
        b - a: b = RunResult b, a = RunResult a; positive means b did better
    """
    level = f"{comparison['confidence']:.0%}"
    rows = [*comparison["tasks"], comparison["overall"]]
    returns = _table(
        ["return", "pairs", "a", "b", f"b-a [{level} CI]", "wins b/a/tie"],
        [_return_cells(row) for row in rows],
    )
    successes = _table(
        ["success", "pairs", "a", "b", f"b-a [{level} CI]", "only b/only a", "McNemar p"],
        [_success_cells(row) for row in rows],
    )
    a, b = comparison["a"], comparison["b"]
    excluded = comparison["excluded_for_errors"]
    counts = (
        f"{comparison['pairs']} pairs matched by (task, index, seed); "
        f"episodes: a {a['episodes']}, b {b['episodes']}"
    )
    if comparison["only_in_a"] or comparison["only_in_b"]:
        counts += (
            f"; compared the intersection: {comparison['only_in_a']} only in a, "
            f"{comparison['only_in_b']} only in b left out"
        )
    if excluded["pairs"]:
        counts += (
            f"; {excluded['pairs']} pairs left out for env errors "
            f"(a {excluded['a']}, b {excluded['b']})"
        )
    if comparison["reset_differences"]["pairs"]:
        counts += "\n" + format_reset_differences(comparison["reset_differences"])
    methods = comparison["methods"]
    notes = [
        f"return: {methods['return']}, {comparison['resamples']} resamples, seed "
        f"{comparison['seed']}",
        f"success b-a: {methods['success_difference']}",
        f"McNemar p: {methods['success_test']}",
        "wins: pairs where b's return beat a's / a's beat b's / equal; only b/only a: "
        "pairs where one run alone succeeded",
    ]
    if comparison["tasks"]:
        notes.append(f"overall: {methods['suite_overall']}")
    if a["env"] != b["env"]:
        notes.append(
            f"note: the runs' envs differ (a {a['env']}, b {b['env']}); their episodes are "
            "paired by seed alone"
        )
    return "\n".join(
        [
            f"b - a: b = {_described(b)}, a = {_described(a)}; positive means b did better",
            *returns,
            "",
            *successes,
            "",
            counts,
            *notes,
        ]
    )
