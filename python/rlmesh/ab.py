"""A sequential paired comparison of two policies: ``rlmesh.ab`` and its ``ABResult``.

Both policies play the same episode indices with the same base seed (episode k is seeded by
its index, so A's episode k and B's are the same episode), in interleaved blocks: A plays
indices ``n..n+block-1``, then B plays them, and the anytime-valid paired test
(``rlmesh.stats.sequential.paired_test``) is computed afresh on the pairs ``0..n+block-1``. The
comparison stops at the first block after which the test's p-value is at most ``alpha``, or
at the cap. Because the test is an e-process, looking after every block keeps the chance of
deciding between two equal policies at or below ``alpha``.

What is compared: success (0/1) when both runs judge success (a success rule or an env that
reports it), else the return rescaled from the declared ``reward_bounds=(lo, hi)``.

Each policy's episodes go to its own ordinary results file (``a.jsonl``, ``b.jsonl`` in
``out_dir``), grown block by block as one run resumed with ``indices=``; ``rlmesh compare``
reads the two.

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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .api import run
from .results import RunResult
from .stats.sequential import check_alpha, paired_test, rescale

MEASURES = ("success", "reward")
FILE_NAMES = ("a.jsonl", "b.jsonl")
DEFAULT_BLOCK = 10
# run() arguments ab() sets itself for each block: passing them would break the pairing.
OWN_ARGUMENTS = ("indices", "results_path", "resume", "until", "episodes", "seeds")


@dataclass(frozen=True)
class ABResult:
    """What ``rlmesh.ab`` found.

    ``decision``: ``"A"`` or ``"B"`` (the better policy, at level ``alpha``), or None (the
    cap came first). ``episodes``: the pairs played (each policy played indices
    ``0..episodes-1``); ``decided_at``: the first pair count at which the p-value reached
    ``alpha`` (at most ``episodes``; None without a decision). ``measure``: ``"success"`` or
    ``"reward"``. ``difference``: mean A minus mean B over the pairs (a success rate's
    difference, or the return's in its own units); ``lower`` / ``upper``: its anytime-valid
    confidence sequence at ``1 - alpha``, after the last pair. ``p_value``: the anytime-valid
    p-value of "no difference"; ``e_value``: the e-process's value. ``a`` / ``b``: the two
    runs; ``paths``: their results files (None without ``out_dir``).
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
    a: RunResult
    b: RunResult
    paths: tuple[Path, Path] | None = None

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

        lines = [
            verdict,
            f"pairs: {self.episodes} (cap {self.cap})",
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
    env: Any,
    *,
    episodes: int,
    alpha: float = 0.05,
    block: int = DEFAULT_BLOCK,
    measure: str | None = None,
    reward_bounds: tuple[float, float] | None = None,
    out_dir: str | Path | None = None,
    seed: int = 0,
    run_info_a: dict[str, Any] | None = None,
    run_info_b: dict[str, Any] | None = None,
    **run_arguments: Any,
) -> ABResult:
    """Compare ``model_a`` with ``model_b`` on the same episodes until one is better, or the cap.

    Args:
        model_a, model_b: the two policies (anything ``rlmesh.run`` takes as a model).
        env: the env (anything ``rlmesh.run`` takes; a new env per block: an id or factory).
        episodes: the cap: the most pairs played.
        alpha: the test's level: two equal policies are told apart with probability at most
            ``alpha``, however many blocks are looked at.
        block: indices each policy plays between two looks at the test.
        measure: ``"success"`` or ``"reward"``; default success when both runs judge it,
            else the return (which needs ``reward_bounds``).
        reward_bounds: ``(lo, hi)``, what an episode's return can be (CartPole-v1: (0, 500)).
        out_dir: the directory for ``a.jsonl`` and ``b.jsonl`` (new files); default a
            temporary one, removed after.
        seed: the base seed both runs share.
        run_info_a, run_info_b: extra header fields for each file (e.g. the policy's name).
        **run_arguments: the rest of ``rlmesh.run``'s (``num_envs``, ``core``, ``success``,
            ``max_episode_steps``, ...), given to both runs.

    Returns:
        The ``ABResult``.

    Raises:
        ValueError: a bad argument, neither success nor ``reward_bounds`` to compare on, or a
            return outside the bounds (naming the episode).
        FileExistsError: ``out_dir`` already holds an ``a.jsonl`` or ``b.jsonl``.

    Example:
        >>> from rlmesh.policies import CartPoleHeuristic
        >>> same = ab(CartPoleHeuristic(), CartPoleHeuristic(), "CartPole-v1", episodes=20)
        >>> same.decision, same.episodes
        (None, 20)
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
    with contextlib.ExitStack() as stack:
        if out_dir is None:  # the runs still need files to grow block by block
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rlmesh-ab-")))
        else:
            directory = Path(out_dir)
            directory.mkdir(parents=True, exist_ok=True)
            for name in FILE_NAMES:
                if (directory / name).exists():
                    raise FileExistsError(
                        f"{directory / name} already exists: rlmesh.ab writes new files; pass "
                        "an empty (or new) out_dir"
                    )
        plan = _Plan(cap=episodes, alpha=alpha, block=block, measure=measure, bounds=bounds)
        result = _compare(
            (model_a, model_b),
            env,
            plan,
            paths=(directory / FILE_NAMES[0], directory / FILE_NAMES[1]),
            run_infos=(run_info_a, run_info_b),
            arguments={"seed": seed, **run_arguments},
        )
        return result if out_dir is not None else replace(result, paths=None)


_NO_BOUNDS = (
    "comparing returns needs their bounds: pass reward_bounds=(lo, hi) (on the command line "
    "--reward-bounds LO HI), e.g. (0, 500) for CartPole-v1"
)


@dataclass(frozen=True)
class _Plan:
    """What decides the comparison: the cap, the level, the block, what is compared."""

    cap: int
    alpha: float
    block: int
    measure: str | None
    bounds: tuple[float, float] | None


def _compare(
    models: tuple[Any, Any],
    env: Any,
    plan: _Plan,
    *,
    paths: tuple[Path, Path],
    run_infos: tuple[dict[str, Any] | None, dict[str, Any] | None],
    arguments: dict[str, Any],
) -> ABResult:
    """Play blocks, A then B, until the paired test decides or the cap is reached."""
    cap, alpha, bounds, measure = plan.cap, plan.alpha, plan.bounds, plan.measure
    played = 0
    while True:
        indices = range(played, min(played + plan.block, cap))
        runs = [
            run(
                model,
                env,
                episodes=cap,
                indices=indices,
                results_path=path,
                resume=True,  # the first block starts the file; the rest continue it
                **({} if info is None else {"run_info": info}),
                **arguments,
            )
            for model, path, info in zip(models, paths, run_infos, strict=True)
        ]
        played = indices.stop
        if measure is None:
            measure = _measure(runs, bounds)
        x = [
            _values(result, name, measure, bounds, played)
            for result, name in zip(runs, "AB", strict=True)
        ]
        test = paired_test(x[0], x[1], alpha=alpha)
        decided_at, side = test.decision(alpha)
        if decided_at is not None or played >= cap:
            break
    scale = 1.0 if measure == "success" else bounds[1] - bounds[0]  # type: ignore[index]
    return ABResult(
        decision=None if decided_at is None else ("A" if side > 0 else "B"),
        episodes=played,
        decided_at=decided_at,
        measure=measure,
        difference=float(np.mean(x[0] - x[1])) * scale,
        lower=float(test.lower[-1]) * scale,  # type: ignore[index]
        upper=float(test.upper[-1]) * scale,  # type: ignore[index]
        p_value=float(test.p_value[-1]),
        e_value=float(test.e_value[-1]),
        alpha=alpha,
        cap=cap,
        a=runs[0],
        b=runs[1],
        paths=paths,
    )


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
    result: RunResult, name: str, measure: str, bounds: tuple[float, float] | None, played: int
) -> np.ndarray:
    """Policy ``name``'s measure on indices ``0..played-1``, in [0, 1]."""
    by_index = {e.index: e for e in result.episodes}
    values = np.empty(played)
    for k in range(played):
        episode = by_index.get(k)
        if episode is None:
            raise RuntimeError(f"rlmesh.ab: policy {name}'s run has no episode {k}")
        if episode.error is not None:
            raise ValueError(
                f"rlmesh.ab: policy {name}'s episode {k} failed ({episode.error}): a failed "
                "episode has no success or return to compare (leave on_error at 'raise')"
            )
        if measure == "success":
            if episode.success is None:
                raise ValueError(
                    f"rlmesh.ab: policy {name}'s episode {k} has no success judged: pass "
                    "success=R (a return threshold), or measure='reward' with reward_bounds"
                )
            values[k] = float(episode.success)
        else:
            low, high = bounds  # type: ignore[misc]
            if not low <= episode.reward <= high:
                raise ValueError(
                    f"rlmesh.ab: policy {name}'s episode {k} returned {episode.reward}, outside "
                    f"reward_bounds ({low:g}, {high:g}); declare bounds that hold every return"
                )
            values[k] = float(rescale(episode.reward, low, high))
    return values


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


def _mean(result: RunResult, measure: str) -> float | None:
    return result.success_rate if measure == "success" else result.mean_reward


def _path(paths: tuple[Path, Path] | None, which: int) -> str | None:
    return None if paths is None else str(paths[which])
