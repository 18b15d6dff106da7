"""Did two runs play the same episodes? Their digests say, from the results files alone.

Every episode line carries ``reset_digest`` (its first observation's) and
``trajectory_digest`` (every step's action, observation, reward and flags: see
``rlmesh._pycore.digests``). ``verify(a, b)`` matches the episodes the two runs share by
(task, index), where ``task`` is None outside a suite, and compares their digests: equal
digests mean the same episode (up to a 64-bit collision). A shared episode whose digests
differ differs **from its reset** when its ``reset_digest`` does (it did not start from the
same state: another seed, an env that ignores its seed, another version of the env), else
**later**: it started alike and some step went another way (a nondeterministic env or model,
another renderer, another action plan).

A shared episode without digests on either side (one whose reset failed, or a line written
before rlmesh recorded them) cannot be verified: it is counted and left out. Two runs with no
verifiable episode in common cannot be verified at all (``NothingToVerifyError``).

``verify`` returns a JSON-ready dict (``rlmesh verify --json`` prints it as strict JSON);
``format_verification`` is the text ``rlmesh verify`` prints. ``reset_differences`` counts
the pairs of a paired comparison whose reset digests differ (``rlmesh compare`` flags them).

Example:
    >>> from rlmesh.results import EpisodeResult, RunResult
    >>> def run(*trajectories):
    ...     return RunResult([EpisodeResult(k, k, k, 0, 9, 9.0, True, False, None, 0, 0, 0,
    ...                                     reset_digest="0" * 16, trajectory_digest=t)
    ...                       for k, t in enumerate(trajectories)], 0)
    >>> result = verify(run("a" * 16, "b" * 16), run("a" * 16, "c" * 16))
    >>> result["equal"], result["differing"], result["first_difference"]["where"]
    (False, 1, 'later')
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Union

from ..errors import ResultsFileError, RlmeshError
from ..results import EpisodeResult, RunResult, read_contents

# A run to verify: a results file's path, or a RunResult.
Run = Union[str, "os.PathLike[str]", RunResult]

# How many differing episodes the result lists.
LISTED = 10

RESET, LATER = "reset", "later"


class NothingToVerifyError(RlmeshError, ValueError):
    """Two runs hold no episode both can verify: a file without digests (written before
    rlmesh recorded them), or no episode index in common."""


@dataclass(frozen=True)
class _Episode:
    """What a verification reads of one episode."""

    task: str | None
    index: int
    seed: int | None
    steps: int
    reward: float
    reset_digest: str | None
    trajectory_digest: str | None

    @property
    def has_digests(self) -> bool:
        return self.reset_digest is not None and self.trajectory_digest is not None


def verify(a: Run, b: Run) -> dict[str, Any]:
    """Compare the digests of the episodes runs ``a`` and ``b`` share.

    Args:
        a, b: results files (paths) or ``RunResult`` objects.

    Returns:
        A JSON-ready dict: ``a`` and ``b`` (their source, episodes, and how many carry
        digests); ``shared`` (the episodes both hold), ``only_in_a``, ``only_in_b``,
        ``unverified`` (shared episodes without digests on a side), ``verified`` (shared
        episodes compared), ``equal`` (every verified episode's digests are equal),
        ``differing`` (how many are not), ``differ_from_reset`` and ``differ_later`` (of
        those, how many differ from their reset and later), ``first_difference`` (the first
        differing episode in (task, index) order, None when equal) and ``differences`` (the
        first ``LISTED``). An episode is ``{"task", "index", "where", "a", "b"}``, ``where``
        being ``"reset"`` or ``"later"`` and each side its seed, steps, reward and digests.

    Raises:
        NothingToVerifyError: either run holds no digests, or none of the episodes both hold
            has digests on both sides.
        ResultsFileError: a file is not a results file.

    Example:
        >>> from rlmesh.results import EpisodeResult, RunResult
        >>> episode = EpisodeResult(0, 5, 0, 0, 9, 9.0, True, False, None, 0, 0, 0,
        ...                         reset_digest="1" * 16, trajectory_digest="2" * 16)
        >>> verify(RunResult([episode], 0), RunResult([episode], 0))["equal"]
        True
    """
    label_a, episodes_a = _load(a, "a")
    label_b, episodes_b = _load(b, "b")
    for label, episodes in ((label_a, episodes_a), (label_b, episodes_b)):
        if episodes and not any(episode.has_digests for episode in episodes.values()):
            raise NothingToVerifyError(
                f"{label} holds no digests: its episodes were written before rlmesh recorded "
                "reset_digest and trajectory_digest; run it again with this rlmesh to verify it"
            )
    shared = sorted(episodes_a.keys() & episodes_b.keys(), key=_order)
    if not shared:
        raise NothingToVerifyError(f"{label_a} and {label_b} have no episode in common")
    verified = [
        key for key in shared if episodes_a[key].has_digests and episodes_b[key].has_digests
    ]
    if not verified:
        raise NothingToVerifyError(
            f"none of the {len(shared)} episodes {label_a} and {label_b} share has digests on "
            "both sides (their resets failed)"
        )
    differing = [
        _difference(key, episodes_a[key], episodes_b[key])
        for key in verified
        if _digests(episodes_a[key]) != _digests(episodes_b[key])
    ]
    return {
        "a": _side(label_a, episodes_a),
        "b": _side(label_b, episodes_b),
        "shared": len(shared),
        "only_in_a": len(episodes_a.keys() - episodes_b.keys()),
        "only_in_b": len(episodes_b.keys() - episodes_a.keys()),
        "unverified": len(shared) - len(verified),
        "verified": len(verified),
        "equal": not differing,
        "differing": len(differing),
        "differ_from_reset": sum(1 for item in differing if item["where"] == RESET),
        "differ_later": sum(1 for item in differing if item["where"] == LATER),
        "first_difference": differing[0] if differing else None,
        "differences": differing[:LISTED],
    }


def reset_differences(
    pairs: Iterable[tuple[tuple[str | None, int], str | None, str | None]],
) -> dict[str, Any]:
    """Of paired episodes ``(key, a's reset digest, b's)``, those that started from different
    states: ``{"pairs": how many, "compared": the pairs with a digest on both sides,
    "first": the first LISTED as {"task", "index"}}``.

    Example:
        >>> pairs = [((None, 0), "a", "a"), ((None, 1), "a", "b"), ((None, 2), None, "b")]
        >>> reset_differences(pairs)
        {'pairs': 1, 'compared': 2, 'first': [{'task': None, 'index': 1}]}
    """
    compared = [(key, a, b) for key, a, b in pairs if a is not None and b is not None]
    differing = [key for key, a, b in compared if a != b]
    return {
        "pairs": len(differing),
        "compared": len(compared),
        "first": [{"task": task, "index": index} for task, index in differing[:LISTED]],
    }


def format_reset_differences(resets: dict[str, Any]) -> str:
    """The line ``rlmesh compare`` adds when pairs started from different states.

    Example:
        >>> resets = {"pairs": 1, "compared": 9, "first": [{"task": None, "index": 4}]}
        >>> print(format_reset_differences(resets))  # doctest: +NORMALIZE_WHITESPACE
        not paired: 1 of 9 episodes started from different states (their reset digests
        differ: episode 4); rlmesh verify A B lists them
    """
    listed = ", ".join(_key_text((key["task"], key["index"])) for key in resets["first"])
    more = ", ..." if resets["pairs"] > len(resets["first"]) else ""
    return (
        f"not paired: {resets['pairs']} of {resets['compared']} episodes started from "
        f"different states (their reset digests differ: {listed}{more}); rlmesh verify A B "
        "lists them"
    )


# ---------------------------------------------------------------------------- the two runs


def _load(run: Run, side: str) -> tuple[str, dict[tuple[str | None, int], _Episode]]:
    if isinstance(run, RunResult):
        label, episodes = f"RunResult {side}", run.episodes
    elif isinstance(run, (str, os.PathLike)):
        label, episodes = os.fspath(run), read_contents(run, cut_off="skipped").episodes
    else:
        raise TypeError(
            f"verify: {side} must be a results file's path or a RunResult, got {type(run).__name__}"
        )
    keyed: dict[tuple[str | None, int], _Episode] = {}
    for episode in _episodes(episodes):
        key = (episode.task, episode.index)
        if key in keyed:
            raise ResultsFileError(f"{label} holds {_key_text(key)} twice")
        keyed[key] = episode
    return label, keyed


def _episodes(episodes: Sequence[EpisodeResult]) -> list[_Episode]:
    return [
        _Episode(
            task=episode.task,
            index=episode.index,
            seed=episode.seed,
            steps=episode.steps,
            reward=episode.reward,
            reset_digest=episode.reset_digest,
            trajectory_digest=episode.trajectory_digest,
        )
        for episode in episodes
    ]


def _side(label: str, episodes: dict[tuple[str | None, int], _Episode]) -> dict[str, Any]:
    return {
        "source": label,
        "episodes": len(episodes),
        "with_digests": sum(1 for episode in episodes.values() if episode.has_digests),
    }


def _order(key: tuple[str | None, int]) -> tuple[bool, str, int]:
    return (key[0] is not None, key[0] or "", key[1])


def _key_text(key: tuple[str | None, int]) -> str:
    task, index = key
    return f"episode {index}" if task is None else f"task {task!r} episode {index}"


def _digests(episode: _Episode) -> tuple[str | None, str | None]:
    return episode.reset_digest, episode.trajectory_digest


def _difference(key: tuple[str | None, int], a: _Episode, b: _Episode) -> dict[str, Any]:
    def side(episode: _Episode) -> dict[str, Any]:
        return {
            "seed": episode.seed,
            "steps": episode.steps,
            "reward": episode.reward,
            "reset_digest": episode.reset_digest,
            "trajectory_digest": episode.trajectory_digest,
        }

    where = RESET if a.reset_digest != b.reset_digest else LATER
    return {"task": key[0], "index": key[1], "where": where, "a": side(a), "b": side(b)}


# ---------------------------------------------------------------------------- the text


def _described(difference: dict[str, Any]) -> str:
    key = (difference["task"], difference["index"])
    a, b = difference["a"], difference["b"]
    if difference["where"] == RESET:
        seeds = (
            f"; seeds {a['seed']} and {b['seed']}"
            if a["seed"] != b["seed"]
            else f"; both seed {a['seed']}"
        )
        return (
            f"{_key_text(key)} differs from its reset: it started from different states "
            f"(reset digests {a['reset_digest']} and {b['reset_digest']}{seeds})"
        )
    return (
        f"{_key_text(key)} differs later: the same reset ({a['reset_digest']}), then "
        f"trajectories {a['trajectory_digest']} and {b['trajectory_digest']} (steps "
        f"{a['steps']} and {b['steps']}, reward {a['reward']:g} and {b['reward']:g})"
    )


def format_verification(result: dict[str, Any]) -> str:
    """The verification as the text ``rlmesh verify`` prints: the verdict first (naming the
    first differing episode and whether it differs from its reset or later), then the
    counts.

    Example:
        >>> from rlmesh.results import EpisodeResult, RunResult
        >>> episode = EpisodeResult(0, 5, 0, 0, 9, 9.0, True, False, None, 0, 0, 0,
        ...                         reset_digest="1" * 16, trajectory_digest="2" * 16)
        >>> print(format_verification(verify(RunResult([episode], 0), RunResult([episode], 0))))
        equal: all 1 verified episodes have equal digests (RunResult a, RunResult b)
        1 episodes in common
    """
    a, b = result["a"]["source"], result["b"]["source"]
    verified = result["verified"]
    if result["equal"]:
        lines = [f"equal: all {verified} verified episodes have equal digests ({a}, {b})"]
    else:
        lines = [
            f"differ: {result['differing']} of {verified} verified episodes differ ({a}, {b}): "
            f"{result['differ_from_reset']} from their reset, {result['differ_later']} later",
            f"first: {_described(result['first_difference'])}",
        ]
        lines += [f"  {_described(item)}" for item in result["differences"][1:]]
        if result["differing"] > len(result["differences"]):
            lines.append(f"  ... and {result['differing'] - len(result['differences'])} more")
    counts = f"{result['shared']} episodes in common"
    if result["unverified"]:
        counts += f"; {result['unverified']} without digests on a side left out"
    if result["only_in_a"] or result["only_in_b"]:
        counts += (
            f"; {result['only_in_a']} only in {a}, {result['only_in_b']} only in {b} (not compared)"
        )
    return "\n".join([*lines, counts])
