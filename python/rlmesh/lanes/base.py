"""The ``Lanes`` seam: what the driver needs of anything that holds envs.

Every kind of lanes (in-process envs, a user's ``VectorEnv``, worker processes, a served env)
implements this one protocol, and the driver steps whatever it is given through it, without
asking which kind it is. This module owns the protocol: its required members (``Lanes``), the
members a kind may leave out (``OptionalLaneMembers``, ``RenderingLanes``, ``PipelinedLanes``)
with the accessors that read them with their defaults (``lanes_core_calls_step``, ...), and
the helpers every kind shares (``checked_reset``, ``reset_options``, ``lane_failures``).

Example:
    >>> import gymnasium
    >>> from rlmesh.lanes import InProcessLanes
    >>> lanes = InProcessLanes([gymnasium.make("CartPole-v1")])
    >>> lanes_core_calls_step(lanes), lanes_accepts_trial_index(lanes), lanes_autoreset(lanes)
    (False, False, 'driver')
    >>> lanes_round_step(lanes) == lanes.step, lanes_render_fps(lanes)
    (True, 50)
    >>> lanes.close()
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import gymnasium
import numpy as np
from gymnasium.envs.registration import EnvSpec

from ..errors import LaneFailures
from ..utils import env_failure

TRIAL_INDEX_FLAG = "rlmesh.trial_index"
"""The ``metadata`` key by which an env declares it takes the ``trial_index`` reset option."""

TRIAL_INDEX_OPTION = "trial_index"
"""The reset option that carries an episode's trial index, to envs that declare the flag."""

DRIVER = "driver"
"""``autoreset``: the driver starts every episode through ``reset`` (no autoreset)."""
NEXT_STEP = "next_step"
"""``autoreset``: the env restarts an ended lane on its next step (the action ignored)."""
SAME_STEP = "same_step"
"""``autoreset``: the env restarts an ended lane within the step that ended it."""

EnvStep = Callable[[Any], tuple[Any, Any, Any, Any, Any]]
"""One env's ``step(action) -> (observation, reward, terminated, truncated, info)``."""

Rebuild = Callable[[np.ndarray], None]
"""``rebuild(lanes)``: build the envs of ``lanes`` (``[K]`` int) anew, after they failed."""


@dataclass
class StepBatch:
    """What one ``Lanes.step`` of ``K`` running lanes returned.

    Attributes:
        stepped: ``[S]`` int64, the lanes that moved: the ``K`` lanes asked for, in their
            order, or every lane of a lockstep vector (its other lanes took a placeholder
            action, being between episodes).
        observations: ``S`` raw observations, one per lane of ``stepped``. Where a vector
            restarted a lane by itself, the new episode's first observation.
        rewards: ``[K]`` float64, for the lanes asked for, in their order.
        terminated, truncated: ``[K]`` bool, as the env returned them.
        infos: ``K`` info dicts (a ``VectorEnv``'s dict of arrays split per lane, its
            ``_key`` masks dropped); the ended episode's final info where one ended.
        final_observations: ``same_step`` autoreset only, else None: per lane asked for, the
            last observation of the episode that ended, None where none ended.
        reset_lanes: ``next_step`` autoreset only, else None: ``[K]`` bool, True where this
            step was the vector restarting the lane (its action ignored, no episode's step).
        reset_infos: ``same_step`` autoreset only, else None: per lane asked for, the new
            episode's reset info where a lane ended and restarted, None elsewhere.
    """

    stepped: np.ndarray
    observations: list[Any]
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    infos: list[dict[str, Any]]
    final_observations: list[Any] | None = None
    reset_lanes: np.ndarray | None = None
    reset_infos: list[dict[str, Any] | None] | None = None


@dataclass
class ResetBatch:
    """What a reset sent by ``PipelinedLanes.send_reset`` returned, through ``receive``.

    Attributes:
        lanes: ``[K]`` int64, the lanes reset, in the order sent.
        observations: ``K`` raw first observations, one per lane.
        infos: ``K`` reset info dicts.
    """

    lanes: np.ndarray
    observations: list[Any]
    infos: list[dict[str, Any]]


def core_steps(
    lanes: Lanes, *, every_info: bool = False
) -> Sequence[EnvStep] | Callable[[np.ndarray, Any], StepBatch] | None:
    """What the core's fast path (``RoundRunner.run_rounds``) steps ``lanes`` with: each
    env's own ``step`` (``env_steps``), else, where ``core_calls_step`` says the core may call
    it, the lanes' ``round_step`` (their ``step`` when it has none, or with ``every_info``:
    the run's caps may end an episode on a step the env did not end, whose info is then
    final), else None (the driver awaits each round).

    Example:
        >>> from rlmesh.lanes import InProcessLanes
        >>> lanes = InProcessLanes([gymnasium.make("CartPole-v1")])
        >>> core_steps(lanes) is lanes.env_steps
        True
        >>> lanes.close()
    """
    if lanes.env_steps is not None:
        return lanes.env_steps
    if not lanes_core_calls_step(lanes):
        return None
    return lanes.step if every_info else lanes_round_step(lanes)


@runtime_checkable
class Lanes(Protocol):
    """``num_lanes`` env instances (lanes ``0..N-1``) that the driver resets and steps.

    Attributes:
        num_lanes: ``N >= 1``.
        name: how messages and results name the env (``rlmesh.utils.env_label``).
        single_observation_space, single_action_space: the spaces of one lane.
        lockstep: False when any subset of lanes steps alone, so a lane with no episode left
            to play is simply not stepped again (it goes idle). True when every step moves
            every lane, so a lane that must restart after the last slot was claimed runs an
            unscored surplus episode.
        resets_itself: False when the driver starts every episode through ``reset``, seeded
            by its index. True when the env restarts ended lanes on its own (an autoresetting
            ``VectorEnv``), unseeded: the driver then observes the restarts through
            ``env_episode_ids`` after each step.
        env_steps: the core's synchronous fast path: per lane, its env's ``step``, when each
            lane is a plain in-process env the core may call itself; None when steps must
            go through ``step`` (a vector, a worker process, a remote env).
        spec: one lane's ``EnvSpec`` (what ``gymnasium.make`` registered: its id, its
            ``reward_threshold``, ...), None when it is unknown. ``rlmesh.success`` reads its
            ``reward_threshold`` when no other success rule applies.
        metadata: one lane's env ``metadata`` (``{}`` when it has none), or at least the part
            the driver reads: its role tags (``rlmesh.adapters.env_tags_of``).
        rebuild: ``rebuild(lanes)`` closes the envs of ``lanes`` (their close errors are
            ignored: those envs failed) and builds them anew from what built them (an id, a
            factory, a served env's session); the lanes then hold no episode until the next
            ``reset``. None when the lanes cannot rebuild their envs (a user's env instance or
            ``VectorEnv``): a run with ``on_error="record"`` or ``"retry"`` refuses them.
            Lanes that have it report an env failure on some of their lanes as
            ``rlmesh.errors.LaneFailures``, with the other lanes' results.

    A kind may also have the members of ``OptionalLaneMembers`` (read through their
    accessors, which supply the default of a member left out), and lanes that can draw a lane
    or step groups of lanes on their own implement ``RenderingLanes`` or ``PipelinedLanes``.
    """

    num_lanes: int
    name: str
    single_observation_space: gymnasium.Space[Any]
    single_action_space: gymnasium.Space[Any]
    lockstep: bool
    resets_itself: bool
    env_steps: Sequence[EnvStep] | None
    spec: EnvSpec | None
    metadata: Mapping[str, Any]
    rebuild: Rebuild | None

    def reset(
        self, lanes: np.ndarray, seeds: Sequence[int | None], trials: Sequence[int | None]
    ) -> tuple[list[Any], list[dict[str, Any]]]:
        """Reset ``lanes`` (``[K]`` int, distinct) with ``seeds[k]`` and trial ``trials[k]``.

        A seed of None lets the env choose. ``options={"trial_index": trials[k]}`` is passed
        only to envs that declare ``metadata["rlmesh.trial_index"] = True`` and only when
        ``trials[k]`` is not None; otherwise no options.

        Returns:
            ``(observations, infos)``: ``K`` raw observations and ``K`` info dicts, in the
            order of ``lanes``.

        Raises:
            ValueError: a lane out of range or given twice, or mismatched lengths.
            EnvError: an env's ``reset`` raised (``LaneFailures``, the other lanes reset,
                when the lanes can ``rebuild``).
        """
        ...

    def step(self, lanes: np.ndarray, actions: Any) -> StepBatch:
        """Step the running ``lanes`` (``[K]`` int, distinct, ascending): lane ``lanes[k]``
        takes ``actions[k]``.

        ``actions`` are env actions batched along a leading lane axis: an array ``[K, ...]``,
        or for ``Dict`` / ``Tuple`` action spaces a dict / tuple of such batches.

        Raises:
            ValueError: actions that do not hold ``K`` rows, or (``resets_itself`` False) a
                lockstep vector's lane that ended and was not reset.
            EnvError: an env's ``step`` raised (``LaneFailures``, the other lanes stepped,
                when the lanes can ``rebuild``).
        """
        ...

    def env_episode_ids(self) -> np.ndarray | None:
        """``[N]`` int64 per-lane counts of the episodes the env started on its own, for
        ``RoundRunner.observe_rolls`` after each step; None unless ``resets_itself``."""
        ...

    def close(self) -> None:
        """Close every env. Closing again does nothing."""
        ...


@runtime_checkable
class RenderingLanes(Protocol):
    """Lanes that can draw one lane as it is now: the optional part of the seam that video
    recording (``rlmesh.video``) reads frames through, when they do not come from an
    observation. In-process lanes, a user's ``VectorEnv`` and worker-process lanes (rendered
    in the worker) implement it; a served env does not (record its image observation with
    ``video_key`` instead).

    Attributes:
        render_mode: the envs' ``render_mode`` (``"rgb_array"`` for frames), None if unset.
        render_fps: the envs' ``metadata["render_fps"]``, None if they do not say.
    """

    render_mode: str | None
    render_fps: float | None

    def render(self, lane: int) -> Any:
        """What lane ``lane``'s env's ``render()`` returns now: in ``rgb_array`` mode an
        ``[H, W, 3]`` uint8 array.

        Raises:
            EnvError: the env's ``render`` raised.
        """
        ...


@runtime_checkable
class PipelinedLanes(Protocol):
    """Lanes in groups that step and reset on their own: the optional part of the seam that
    group pipelining (``rlmesh.run(..., pipeline=True)``) needs. The driver sends one group's
    step and, while that group's envs step, receives another group's, runs the model for it
    and sends it again, so the model and the envs work at once; a group whose episodes ended
    is sent its resets the same way, so the other groups step while its envs reset (so the
    driver resets them: lanes that restart themselves are not pipelined, ``lanes_pipelined``).
    Worker-process lanes implement it, one group per worker.

    Attributes:
        step_groups: ``[G]`` arrays of lanes, each group's lanes ascending, every lane in one
            group.
    """

    step_groups: list[np.ndarray]

    def send_step(self, lanes: np.ndarray, actions: Any, *, every_info: bool = True) -> None:
        """Start a step of ``lanes`` ``[K]`` (ascending, of one group whose last request was
        received) with ``actions`` ``[K, ...]`` (or a dict of them). With ``every_info``
        False the step may come back, as from ``round_step``, with an empty info for a lane
        whose episode goes on: the driver asks for that when it reads only final infos."""
        ...

    def send_reset(
        self, lanes: np.ndarray, seeds: Sequence[int | None], trials: Sequence[int | None]
    ) -> None:
        """Start a reset of ``lanes`` ``[K]`` (of one group whose last request was received),
        with ``seeds`` and ``trials`` as ``Lanes.reset`` takes them."""
        ...

    def receive(self) -> StepBatch | ResetBatch:
        """The outcome of a request sent and not yet received, the first to be ready: a
        ``StepBatch`` for a step, a ``ResetBatch`` for a reset. Raises ``LaneFailures`` for
        its lanes as ``step`` and ``reset`` do (a reset's ``outcome`` is ``(lanes,
        observations, infos)`` of the others)."""
        ...


class OptionalLaneMembers(Protocol):
    """The members a kind of ``Lanes`` may leave out, each with the default its absence means.

    They are not part of ``Lanes`` itself, since ``isinstance(x, Lanes)`` asks for every
    member of the protocol. Read them only through their accessors (``lanes_core_calls_step``,
    ``lanes_round_step``, ``lanes_accepts_trial_index``, ``lanes_autoreset``), never with a
    ``getattr`` of one's own, so that a member left out means the same everywhere.

    Attributes:
        core_calls_step: default False. True when ``step`` is a plain call (not a coroutine)
            that moves exactly the lanes asked for, so that the core may call it itself, whole
            rounds at a time, where ``env_steps`` is None (process and remote lanes). Lanes
            that leave it out are stepped by the driver's awaited round.
        accepts_trial_index: default False. True when the envs declare
            ``metadata["rlmesh.trial_index"] = True``: their resets then get the
            ``trial_index`` option (``reset_options``).
        autoreset: who starts a lane's next episode: ``DRIVER`` (``"driver"``), or for lanes
            that reset themselves ``NEXT_STEP`` or ``SAME_STEP``, as a ``VectorEnv`` says.
            Default: ``NEXT_STEP`` (Gymnasium's) when ``resets_itself``, else ``DRIVER``.
    """

    core_calls_step: bool
    accepts_trial_index: bool
    autoreset: str

    def round_step(self, lanes: np.ndarray, actions: Any) -> StepBatch:
        """Default: ``step``. With ``core_calls_step``, what the core's rounds call in place
        of ``step``. It returns what ``step`` does, except that a lane whose step returned
        neither terminated nor truncated may have an empty info: rounds without caps read
        only final infos (process lanes then send no other info through their pipes)."""
        ...


def lanes_core_calls_step(lanes: Lanes) -> bool:
    """``lanes.core_calls_step``, False when the lanes leave it out (``OptionalLaneMembers``)."""
    return bool(getattr(lanes, "core_calls_step", False))


def lanes_round_step(lanes: Lanes) -> Callable[[np.ndarray, Any], StepBatch]:
    """``lanes.round_step``, their ``step`` when they leave it out (``OptionalLaneMembers``)."""
    return getattr(lanes, "round_step", lanes.step)  # type: ignore[no-any-return]


def lanes_accepts_trial_index(lanes: Lanes) -> bool:
    """``lanes.accepts_trial_index``, False when the lanes leave it out
    (``OptionalLaneMembers``)."""
    return bool(getattr(lanes, "accepts_trial_index", False))


def lanes_autoreset(lanes: Lanes) -> str:
    """``lanes.autoreset``; when the lanes leave it out (``OptionalLaneMembers``),
    ``NEXT_STEP`` for lanes that reset themselves, else ``DRIVER``."""
    declared = getattr(lanes, "autoreset", None)
    if declared is not None:
        return str(declared)
    return NEXT_STEP if lanes.resets_itself else DRIVER


def lanes_rendering(lanes: Lanes) -> RenderingLanes | None:
    """``lanes`` when they can draw a lane (``RenderingLanes``), else None."""
    return lanes if isinstance(lanes, RenderingLanes) else None


def lanes_render_fps(lanes: Lanes) -> float | None:
    """The frame rate of the lanes' envs: ``render_fps`` (``RenderingLanes``), else their
    ``metadata["render_fps"]``, else None."""
    fps = getattr(lanes, "render_fps", None)
    return fps or (getattr(lanes, "metadata", None) or {}).get("render_fps")


def lanes_pipelined(lanes: Lanes) -> PipelinedLanes | None:
    """``lanes`` when they step and reset groups of lanes on their own (``PipelinedLanes``),
    else None; None too for lanes that restart their episodes themselves, since a pipelined
    group's resets are the driver's to send."""
    if isinstance(lanes, PipelinedLanes) and not lanes.resets_itself:
        return lanes
    return None


# ------------------------------------------------------------------ shared by the kinds


def checked_reset(
    lanes: np.ndarray, seeds: Sequence[int | None], trials: Sequence[int | None], num_lanes: int
) -> list[int]:
    """``lanes`` as a list, refusing a lane out of range or given twice and lengths that differ
    (the arguments of ``Lanes.reset``).

    Raises:
        ValueError: naming the lane, or the argument whose length differs.
    """
    array = np.asarray(lanes)
    if array.ndim != 1:
        raise ValueError(f"lanes must be a 1-D array, got shape {array.shape}")
    if array.size and array.dtype.kind not in "iu":
        raise ValueError(f"lanes must hold integers, got dtype {array.dtype}")
    checked = array.astype(np.int64).tolist()
    for name, values in (("seeds", seeds), ("trials", trials)):
        if len(values) != len(checked):
            raise ValueError(f"{name} has {len(values)} entries but lanes has {len(checked)}")
    seen: set[int] = set()
    for lane in checked:
        if not 0 <= lane < num_lanes:
            raise ValueError(
                f"lane {lane} is out of range: this route has lanes 0..{num_lanes - 1}"
            )
        if lane in seen:
            raise ValueError(f"lane {lane} appears twice in lanes")
        seen.add(lane)
    return checked


def lane_failures(
    name: str, method: str, failed: dict[int, Exception], outcome: Any
) -> LaneFailures:
    """The ``LaneFailures`` of a ``method`` call (``"reset"``, ``"step"``) on the lanes of
    ``name`` whose envs raised ``failed[lane]``: worded and chained as the first failed lane's
    ``EnvError`` (``rlmesh.utils.env_failure``), with ``outcome`` the other lanes' results."""
    lane, first = next(iter(failed.items()))
    failure = LaneFailures(
        str(env_failure(name, method, first, lane)),
        errors={lane: f"{type(err).__name__}: {err}" for lane, err in failed.items()},
        outcome=outcome,
    )
    failure.__cause__ = first
    return failure


def declares_trial_index(env: Any) -> bool:
    """The env (or vector) declares ``metadata["rlmesh.trial_index"] is True``."""
    return (getattr(env, "metadata", None) or {}).get(TRIAL_INDEX_FLAG) is True


def reset_options(accepts_trial_index: bool, trial: int | None) -> dict[str, Any] | None:
    """The ``options`` of one reset: the trial index, for an env that declares it."""
    if accepts_trial_index and trial is not None:
        return {TRIAL_INDEX_OPTION: trial}
    return None
