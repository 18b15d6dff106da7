"""A sequential paired comparison of two policies: ``rlmesh.ab`` and its ``ABResult``.

Both policies play the same episode indices with the same base seed (episode k is seeded by
its index, so A's episode k and B's are the same episode), in interleaved blocks: A plays
indices ``n..n+block-1``, then B plays them, and the anytime-valid paired test
(``rlmesh.stats.sequential.paired_test``) is computed afresh on every pair so far. The
comparison stops at the first block after which the test's p-value is at most ``alpha``, or
at the cap. Because the test is an e-process, looking after every block keeps the chance of
deciding between two equal policies at or below ``alpha``.

On a suite (``tasks=``), a block holds the same indices ``n..n+block-1`` of every task (each
task's seeds are its own, as in ``rlmesh.run_suite``), and the test runs on the pairs of all
tasks pooled into one sequence, in an order fixed before any episode is played: block by
block, within a block task by task in suite order, within a task by index. Each pooled
observation is a paired difference bounded in [-1, 1], so the e-process keeps its guarantee:
if, pair by pair, A's and B's outcomes have the same mean, the comparison decides with
probability at most ``alpha``. A decision is about the pooled mean difference, in which every
task weighs the same while each has indices left under its cap (``min(episodes, its own
episodes)``); a task at its cap drops out of the later blocks.

What is compared: success (0/1) when both runs judge success (a success rule or an env that
reports it), else the return rescaled from the declared ``reward_bounds=(lo, hi)`` (on a
suite, bounds that hold every task's return).

Each policy's episodes go to its own ordinary results file (``a.jsonl``, ``b.jsonl`` in
``out_dir``; a suite's results file on a suite), grown block by block as one run resumed with
``indices=``; ``rlmesh compare`` reads the two.

Example:
    >>> import rlmesh
    >>> from rlmesh.policies import CartPoleHeuristic
    >>> result = rlmesh.ab(CartPoleHeuristic(), lambda obs: 0, "CartPole-v1", episodes=40)
    >>> result.decision, result.measure, result.episodes < 40
    ('A', 'success', True)
"""

from __future__ import annotations

import contextlib
import math
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .api import run
from .results import EpisodeResult, RunResult
from .stats.sequential import check_alpha, paired_test, rescale
from .suites import SuiteResult, Task, checked_suite, run_suite

MEASURES = ("success", "reward")
FILE_NAMES = ("a.jsonl", "b.jsonl")
DEFAULT_BLOCK = 10
# run() arguments ab() sets itself for each block: passing them would break the pairing.
OWN_ARGUMENTS = ("indices", "results_path", "resume", "until", "episodes", "seeds")

# One side's run: of one env, or of a suite's tasks.
Run = RunResult | SuiteResult
# Where a pair is: (task name, None outside a suite; episode index).
Key = tuple[str | None, int]


@dataclass(frozen=True)
class ABResult:
    """What ``rlmesh.ab`` found.

    ``decision``: ``"A"`` or ``"B"`` (the better policy, at level ``alpha``), or None (the
    cap came first). ``episodes``: the pairs played (on one env, each policy played indices
    ``0..episodes-1``; on a suite, the pairs of every task together); ``decided_at``: the
    first pair count at which the p-value reached ``alpha`` (at most ``episodes``; None
    without a decision). ``measure``: ``"success"`` or ``"reward"``. ``difference``: mean A
    minus mean B over the pairs (a success rate's difference, or the return's in its own
    units); ``lower`` / ``upper``: its anytime-valid confidence sequence at ``1 - alpha``,
    after the last pair. ``p_value``: the anytime-valid p-value of "no difference";
    ``e_value``: the e-process's value. ``cap``: the most pairs. ``a`` / ``b``: the two runs
    (a ``SuiteResult`` each on a suite); ``paths``: their results files (None without
    ``out_dir``); ``tasks``: the suite's tasks compared on, in order (None on one env).
    """

    decision: str | None
    episodes: int
    decided_at: int | None
    measure: str
    difference: float
    lower: float
    upper: float
    p_value: float
    e_value: float
    alpha: float
    cap: int
    a: Run
    b: Run
    paths: tuple[Path, Path] | None = None
    tasks: tuple[str, ...] | None = None

    def summary(self) -> dict[str, Any]:
        """The result as a JSON-ready dict (the runs' files, not their episodes).

        Example:
            >>> from rlmesh.policies import CartPoleHeuristic
            >>> ab(CartPoleHeuristic(), lambda obs: 0, "CartPole-v1", episodes=20).summary()[
            ...     "decision"]
            'A'
        """
        return {
            "decision": self.decision,
            "episodes": self.episodes,
            "decided_at": self.decided_at,
            "cap": self.cap,
            "measure": self.measure,
            "difference": self.difference,
            "confidence_sequence": [self.lower, self.upper],
            "p_value": self.p_value,
            "e_value": self.e_value,
            "alpha": self.alpha,
            "tasks": None if self.tasks is None else list(self.tasks),
            "a": {"mean": _mean(self.a, self.measure), "file": _path(self.paths, 0)},
            "b": {"mean": _mean(self.b, self.measure), "file": _path(self.paths, 1)},
        }

    def format(self) -> str:
        """The result as a few lines of text (what ``rlmesh ab`` prints).

        Example:
            >>> from rlmesh.policies import CartPoleHeuristic
            >>> text = ab(CartPoleHeuristic(), lambda obs: 0, "CartPole-v1", episodes=20).format()
            >>> text.splitlines()[0]  # doctest: +ELLIPSIS
            'decision: A is better (success, alpha 0.05), after 10 pairs ...'
        """
        level = f"{self.measure}, alpha {self.alpha:g}"
        if self.decision is None:
            verdict = f"decision: none at the cap of {self.cap} pairs ({level})"
        else:
            verdict = (
                f"decision: {self.decision} is better ({level}), after {self.episodes} pairs "
                f"(p <= alpha first at {self.decided_at})"
            )

        def number(value: float) -> str:
            return f"{value:+.1%}" if self.measure == "success" else f"{value:+.3f}"

        lines = [verdict, f"pairs: {self.episodes} (cap {self.cap})"]
        if self.tasks is not None:
            lines.append(
                f"tasks: {len(self.tasks)} ({', '.join(self.tasks)}), pooled: each block plays "
                "the same indices of every task"
            )
        lines += [
            f"{self.measure} a-b: {number(self.difference)} "
            f"[{number(self.lower)}, {number(self.upper)}] "
            f"({1 - self.alpha:.0%} confidence sequence, valid at every n)",
            f"p-value (anytime-valid): {self.p_value:.4g}",
        ]
        if self.paths is not None:
            lines.append(f"a: {self.paths[0]}")
            lines.append(f"b: {self.paths[1]}")
        return "\n".join(lines)


def ab(
    model_a: Any,
    model_b: Any,
    env: Any = None,
    *,
    episodes: int,
    tasks: Any = None,
    only: Sequence[str] | None = None,
    alpha: float = 0.05,
    block: int = DEFAULT_BLOCK,
    measure: str | None = None,
    reward_bounds: tuple[float, float] | None = None,
    out_dir: str | Path | None = None,
    resume: bool = False,
    progress: Callable[[str], Any] | None = None,
    seed: int | None = None,
    run_info_a: dict[str, Any] | None = None,
    run_info_b: dict[str, Any] | None = None,
    **run_arguments: Any,
) -> ABResult:
    """Compare ``model_a`` with ``model_b`` on the same episodes until one is better, or the cap.

    Args:
        model_a, model_b: the two policies (anything ``rlmesh.run`` takes as a model).
        env: the env (anything ``rlmesh.run`` takes; a new env per block: an id or factory);
            or None with ``tasks``.
        episodes: the cap: the most pairs played; on a suite, the most indices of each task
            (a task also stops at its own ``episodes``).
        tasks: compare on a suite instead of one env: a list of ``rlmesh.Task`` or the path of
            a suite's TOML file (``rlmesh.load_suite``; ``rlmesh.benchmarks.suite(NAME)``
            gives a built-in one). Its pairs are pooled (the module docstring says how).
        only: with ``tasks``, the names of the tasks to compare on (default all).
        alpha: the test's level: two equal policies are told apart with probability at most
            ``alpha``, however many blocks are looked at.
        block: indices each policy plays (of every task, on a suite) between two looks.
        measure: ``"success"`` or ``"reward"``; default success when both runs judge it,
            else the return (which needs ``reward_bounds``).
        reward_bounds: ``(lo, hi)``, what an episode's return can be (CartPole-v1: (0, 500)).
        out_dir: the directory for ``a.jsonl`` and ``b.jsonl`` (new files); default a
            temporary one, removed after.
        resume: continue the comparison whose files ``out_dir`` holds (one that was
            interrupted, or stopped at a smaller cap): the blocks are replayed in the same
            order, each file's episodes read back instead of played again, and the test
            goes on from where they end. Each file's header must match this comparison's.
        progress: called after each block with one line saying where the comparison stands
            (pairs played of the cap, the difference A-B with its confidence sequence, the
            p-value), e.g. ``print``; ``rlmesh ab`` writes it to stderr.
        seed: the base seed both runs share (default 0); not with ``tasks``, whose tasks
            set their own.
        run_info_a, run_info_b: extra header fields for each file (e.g. the policy's name).
        **run_arguments: the rest of ``rlmesh.run``'s (``num_envs``, ``core``, ``success``,
            ``max_episode_steps``, ...), given to both runs (on a suite, not those its tasks
            set: ``rlmesh.suites.PER_TASK_ARGUMENTS``).

    Returns:
        The ``ABResult``.

    Raises:
        ValueError: a bad argument, neither or both of ``env`` and ``tasks``, neither success
            nor ``reward_bounds`` to compare on, or a return outside the bounds (naming the
            episode).
        FileExistsError: ``out_dir`` already holds an ``a.jsonl`` or ``b.jsonl`` (without
            ``resume``).

    Example:
        >>> from rlmesh.policies import CartPoleHeuristic
        >>> same = ab(CartPoleHeuristic(), CartPoleHeuristic(), "CartPole-v1", episodes=20)
        >>> same.decision, same.episodes
        (None, 20)
        >>> suite = [Task("short", "CartPole-v1", max_episode_steps=60),
        ...          Task("long", "CartPole-v1", seed=1)]
        >>> pooled = ab(CartPoleHeuristic(), lambda obs: 0, tasks=suite, episodes=20, success=50)
        >>> pooled.decision, pooled.tasks, pooled.episodes
        ('A', ('short', 'long'), 20)
    """
    alpha = check_alpha(alpha)
    episodes, block = _count("episodes", episodes), _count("block", block)
    if measure is not None and measure not in MEASURES:
        raise ValueError(f"measure must be one of {list(MEASURES)} or None, got {measure!r}")
    bounds = None if reward_bounds is None else _bounds(reward_bounds)
    if measure == "reward" and bounds is None:
        raise ValueError(_NO_BOUNDS)
    given = sorted(set(OWN_ARGUMENTS) & set(run_arguments))
    if given:
        raise ValueError(
            f"rlmesh.ab sets {', '.join(given)} itself (the same indices for both, block by "
            "block, to a cap of episodes=): leave them out"
        )
    where = _where(env, tasks, only, seed, episodes)
    if resume and out_dir is None:
        raise ValueError("resume=True continues the files in out_dir: pass out_dir= too")
    with contextlib.ExitStack() as stack:
        if out_dir is None:  # the runs still need files to grow block by block
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rlmesh-ab-")))
        else:
            directory = Path(out_dir)
            directory.mkdir(parents=True, exist_ok=True)
            for name in FILE_NAMES:
                if not resume and (directory / name).exists():
                    raise FileExistsError(
                        f"{directory / name} already exists: rlmesh.ab writes new files; pass "
                        "an empty (or new) out_dir, or resume=True (--resume) to continue them"
                    )
        plan = _Plan(alpha=alpha, block=block, measure=measure, bounds=bounds)
        result = _compare(
            (model_a, model_b),
            where,
            plan,
            paths=(directory / FILE_NAMES[0], directory / FILE_NAMES[1]),
            run_infos=(run_info_a, run_info_b),
            arguments=run_arguments,
            progress=progress,
        )
        return result if out_dir is not None else replace(result, paths=None)


def _progress_line(
    pairs: int,
    cap: int,
    measure: str,
    bounds: tuple[float, float] | None,
    difference: float,
    test: Any,
) -> str:
    """Where a comparison stands after a block, in one line (``ab``'s ``progress``): the
    pairs so far, the mean difference A-B and its confidence sequence, the p-value."""
    scale = 1.0 if measure == "success" else bounds[1] - bounds[0]  # type: ignore[index]

    def number(value: float) -> str:
        return f"{value * scale:+.1%}" if measure == "success" else f"{value * scale:+.3f}"

    return (
        f"rlmesh ab: {pairs}/{cap} pairs, {measure} a-b {number(difference)} "
        f"[{number(test.lower[-1])}, {number(test.upper[-1])}], p {test.p_value[-1]:.3g}"
    )


_NO_BOUNDS = (
    "comparing returns needs their bounds: pass reward_bounds=(lo, hi) (on the command line "
    "--reward-bounds LO HI), e.g. (0, 500) for CartPole-v1"
)


@dataclass(frozen=True)
class _Plan:
    """What decides the comparison: the level, the block, what is compared."""

    alpha: float
    block: int
    measure: str | None
    bounds: tuple[float, float] | None


@dataclass(frozen=True)
class _Where:
    """Where the pairs are played: one env (``tasks`` None; its one cap under key None) or a
    suite (``suite`` every task, ``caps`` those compared on, in suite order)."""

    env: Any
    seed: int | None
    suite: list[Task] | None
    caps: dict[str | None, int]

    @property
    def tasks(self) -> tuple[str, ...] | None:
        return None if self.suite is None else tuple(name for name in self.caps if name)


def _where(env: Any, tasks: Any, only: Sequence[str] | None, seed: Any, cap: int) -> _Where:
    """The env or suite the comparison plays on, checked, with each task's cap."""
    if (env is None) == (tasks is None):
        raise ValueError(
            "rlmesh.ab compares on one env (env=, e.g. 'CartPole-v1') or on a suite's tasks "
            f"(tasks=, a list of rlmesh.Task or a suite's TOML file): got "
            f"{'neither' if env is None else 'both'}"
        )
    if tasks is None:
        if only is not None:
            raise ValueError("only= names tasks of a suite: pass tasks= too, or leave it out")
        return _Where(env=env, seed=0 if seed is None else seed, suite=None, caps={None: cap})
    if seed is not None:
        raise ValueError(
            f"seed={seed!r}: on a suite each task sets its own seed (rlmesh.Task(seed=...), or "
            "seed in a [[task]] table): leave seed out"
        )
    suite, chosen = checked_suite(tasks, only)
    return _Where(
        env=None, seed=None, suite=suite, caps={t.name: min(cap, t.episodes) for t in chosen}
    )


def _blocks(caps: dict[str | None, int], block: int) -> Iterator[list[tuple[str | None, range]]]:
    """The blocks, in play order: each the indices ``n..n+block-1`` of every task (clipped to
    its cap; a task past its cap sits the block out). Fixed before any episode is played."""
    start = 0
    while start < max(caps.values()):
        yield [
            (name, range(start, min(start + block, cap)))
            for name, cap in caps.items()
            if cap > start
        ]
        start += block


def _play(
    model: Any,
    where: _Where,
    block: list[tuple[str | None, range]],
    path: Path,
    info: dict[str, Any] | None,
    arguments: dict[str, Any],
) -> dict[str | None, RunResult]:
    """One policy's part of a block, appended to its results file: each task's run so far."""
    extra = {} if info is None else {"run_info": info}
    if where.suite is None:
        ((_, indices),) = block
        result = run(
            model,
            where.env,
            episodes=where.caps[None],
            seed=where.seed,
            indices=indices,
            results_path=path,
            resume=True,  # the first block starts the file; the rest continue it
            **extra,
            **arguments,
        )
        return {None: result}
    # Tasks with the same indices in this block (all but those near their caps) run as one.
    groups: dict[range, list[str]] = {}
    for name, indices in block:
        groups.setdefault(indices, []).append(name)  # type: ignore[arg-type]
    runs: dict[str | None, RunResult] = {}
    for indices, names in groups.items():
        suite = run_suite(
            model,
            where.suite,
            only=names,
            indices=indices,
            results_path=path,
            resume=True,
            **extra,
            **arguments,
        )
        runs.update((name, suite[name]) for name in names)
    return runs


def _compare(
    models: tuple[Any, Any],
    where: _Where,
    plan: _Plan,
    *,
    paths: tuple[Path, Path],
    run_infos: tuple[dict[str, Any] | None, dict[str, Any] | None],
    arguments: dict[str, Any],
    progress: Callable[[str], Any] | None = None,
) -> ABResult:
    """Play blocks, A then B, until the paired test decides or the cap is reached."""
    alpha, bounds, measure = plan.alpha, plan.bounds, plan.measure
    runs: tuple[dict[str | None, RunResult], dict[str | None, RunResult]] = ({}, {})
    order: list[Key] = []  # the pooled pairs, in the order the test takes them
    for block in _blocks(where.caps, plan.block):
        for model, path, info, side in zip(models, paths, run_infos, runs, strict=True):
            side.update(_play(model, where, block, path, info, arguments))
        order += [(name, k) for name, indices in block for k in indices]
        if measure is None:
            measure = _measure([r for side in runs for r in side.values()], bounds)
        x = [
            _values(side, name, measure, bounds, order)
            for side, name in zip(runs, "AB", strict=True)
        ]
        test = paired_test(x[0], x[1], alpha=alpha)
        decided_at, side_won = test.decision(alpha)
        if progress is not None:
            difference = float(np.mean(x[0] - x[1]))
            progress(
                _progress_line(
                    len(order), sum(where.caps.values()), measure, bounds, difference, test
                )
            )
        if decided_at is not None:
            break
    scale = 1.0 if measure == "success" else bounds[1] - bounds[0]  # type: ignore[index]
    a, b = (_joined(side, where) for side in runs)
    return ABResult(
        decision=None if decided_at is None else ("A" if side_won > 0 else "B"),
        episodes=len(order),
        decided_at=decided_at,
        measure=measure,  # type: ignore[arg-type]
        difference=float(np.mean(x[0] - x[1])) * scale,
        lower=float(test.lower[-1]) * scale,  # type: ignore[index]
        upper=float(test.upper[-1]) * scale,  # type: ignore[index]
        p_value=float(test.p_value[-1]),
        e_value=float(test.e_value[-1]),
        alpha=alpha,
        cap=sum(where.caps.values()),
        a=a,
        b=b,
        paths=paths,
        tasks=where.tasks,
    )


def _joined(runs: dict[str | None, RunResult], where: _Where) -> Run:
    """One side's runs as what ``rlmesh.run`` or ``rlmesh.run_suite`` returns."""
    if where.suite is None:
        return runs[None]
    chosen = tuple(task for task in where.suite if task.name in where.caps)
    return SuiteResult(chosen, {name: runs[name] for name in where.caps if name is not None})


def _measure(runs: list[RunResult], bounds: tuple[float, float] | None) -> str:
    """Success when both runs judged every episode's success, else the return if bounded."""
    if all(e.success is not None for result in runs for e in result.episodes if e.error is None):
        return "success"
    if bounds is not None:
        return "reward"
    raise ValueError(
        "rlmesh.ab: the runs do not judge success (the env reports no is_success and has no "
        "reward_threshold) and the returns have no bounds: pass success=R (success iff the "
        "return >= R; --success-reward R) or reward_bounds=(lo, hi) (--reward-bounds LO HI)"
    )


def _values(
    runs: dict[str | None, RunResult],
    name: str,
    measure: str,
    bounds: tuple[float, float] | None,
    order: list[Key],
) -> np.ndarray:
    """Policy ``name``'s measure on the pairs ``order`` lists, in that order, in [0, 1]."""
    by_key = {
        (task, episode.index): episode
        for task, result in runs.items()
        for episode in result.episodes
    }
    values = np.empty(len(order))
    for position, (task, k) in enumerate(order):
        where = f"policy {name}'s episode {k}" + ("" if task is None else f" of task {task!r}")
        episode = by_key.get((task, k))
        if episode is None:
            raise RuntimeError(f"rlmesh.ab: {where} is missing from its run")
        values[position] = _value(episode, where, measure, bounds)
    return values


def _value(
    episode: EpisodeResult, where: str, measure: str, bounds: tuple[float, float] | None
) -> float:
    """One episode's measure in [0, 1]; ``where`` names it in errors."""
    if episode.error is not None:
        raise ValueError(
            f"rlmesh.ab: {where} failed ({episode.error}): a failed episode has no success or "
            "return to compare (leave on_error at 'raise')"
        )
    if measure == "success":
        if episode.success is None:
            raise ValueError(
                f"rlmesh.ab: {where} has no success judged: pass success=R (a return "
                "threshold), or measure='reward' with reward_bounds"
            )
        return float(episode.success)
    low, high = bounds  # type: ignore[misc]
    if not low <= episode.reward <= high:
        raise ValueError(
            f"rlmesh.ab: {where} returned {episode.reward}, outside reward_bounds "
            f"({low:g}, {high:g}); declare bounds that hold every return"
        )
    return float(rescale(episode.reward, low, high))


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _bounds(bounds: Any) -> tuple[float, float]:
    try:
        low, high = (float(v) for v in bounds)
    except (TypeError, ValueError):
        raise ValueError(f"reward_bounds must be (lo, hi), two numbers, got {bounds!r}") from None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"reward_bounds must be finite with lo < hi, got ({low:g}, {high:g})")
    return low, high


def _mean(result: Run, measure: str) -> float | None:
    """The run's mean measure over its episodes (every task's pooled, on a suite)."""
    if isinstance(result, SuiteResult):
        result = RunResult([e for run in result.runs.values() for e in run.episodes], base_seed=0)
    return result.success_rate if measure == "success" else result.mean_reward


def _path(paths: tuple[Path, Path] | None, which: int) -> str | None:
    return None if paths is None else str(paths[which])
