"""The run's lanes, watched: ``ViewLanes`` wraps any ``Lanes``, takes a lane's frame when the
view's sampler says it is due, and (unless the run's core gives them) counts each lane's
steps and return in its episode.

The wrapper plugs into the ``Lanes`` seam as the video recorder's does
(``rlmesh.video.recorder.RecordingLanes``), and changes nothing the envs or the model see;
no step hook is added, so the driver keeps its fast path and the results are the same with
the view on and off. On the fast path the core looks each lane's step up in ``env_steps``
once per ``run_rounds`` call (the Python core once per step); ``env_steps`` is a live view
of the wrapped lanes' own steps (a recorder's or a rebuilt env's swap shows through), but:

- a lane whose frame is due (a flag the sampler sets, a few times a second at most) is
  given a step that takes the frame after it steps, once;
- with ``count_steps`` (the view's own lanes, ``LiveView.lanes``: nothing else tells it),
  each lane's step also counts the step and its reward, about a microsecond a lane-step.
  Without it (a run whose driver hands the view its core's per-lane figures) the envs' own
  steps are called, and the run pays nothing per step.

Lanes the core steps in batches (worker processes, a served env, a vector) take the due
frames and count the batch's lanes after each batch.

Frames come from ``render()`` (``RenderingLanes``, the envs built in ``rgb_array`` mode) or,
with ``video_key``, from the observation (a Dict's image key, or ``"observation"``: the
whole observation), as recording takes them.

Which episode each lane runs: every ``reset`` of scored lanes is followed by the hooks'
``episode_started`` for them, in the same order (the driver's ``_start`` / ``_announce``);
``on_reset`` hands the view the lanes and seeds, which it pairs with those announcements.

Example:
    >>> import numpy as np
    >>> from rlmesh.lanes import make_lanes
    >>> lanes = ViewLanes(make_lanes("CartPole-v1", num_envs=2))
    >>> _ = lanes.reset(np.arange(2), [0, 1], [0, 1])
    >>> outcome = lanes.env_steps[1](0)  # the core's fast path steps lane 1
    >>> lanes.steps, lanes.returns
    ([0, 1], [0.0, 1.0])
    >>> lanes.close()
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np

from ..errors import LaneFailures
from ..lanes import Lanes, ResetBatch, StepBatch, lanes_pipelined, lanes_rendering, lanes_round_step
from .frames import FrameSampler

WHOLE_OBSERVATION = "observation"
"""``video_key`` naming the whole observation (as ``record_video`` takes it)."""

# Optional members of the seam (``OptionalLaneMembers``) read through as they are.
_THROUGH = ("core_calls_step", "accepts_trial_index", "autoreset")

Step = Callable[[Any], tuple[Any, Any, Any, Any, Any]]


class LaneSteps(Sequence[Step]):
    """``ViewLanes.env_steps``: each lane's step as the core should call it now (looked up
    by the core, never copied): the wrapped lanes' own, counted or not, or, while the
    lane's frame is due, one that also takes it."""

    def __init__(self, lanes: ViewLanes, inner: Sequence[Step]) -> None:
        self._inner = inner
        self._due = lanes._due
        self._counted = (
            [lanes._counting(lane) for lane in range(len(inner))] if lanes.counts else None
        )
        self._framed = [lanes._framing(lane) for lane in range(len(inner))]

    def own(self, lane: int) -> Step:
        """Lane ``lane``'s step, counted when the lanes count, without a frame."""
        return self._inner[lane] if self._counted is None else self._counted[lane]

    def __getitem__(self, lane: int) -> Step:  # type: ignore[override]
        if self._due[lane]:
            return self._framed[lane]
        return self._inner[lane] if self._counted is None else self._counted[lane]

    def __len__(self) -> int:
        return len(self._inner)


class ViewLanes:
    """``lanes`` with frames taken when due and, with ``count_steps``, each lane's steps and
    return counted.

    Args:
        lanes: the run's lanes, of any kind.
        sampler: says when a lane's frame is due and takes it; None: no frames.
        video_key: take frames from this image key of the observation (``"observation"``:
            the whole observation) instead of ``render()``.
        on_reset: called with ``(lanes, seeds)`` after each reset (the view pairs them
            with the episodes the hooks announce next).
        count_steps: count each lane's steps and return (``steps``, ``returns``); False when
            the run's core gives them.

    Attributes:
        steps, returns: per lane, the steps and return so far of its episode (with
            ``count_steps``; else zeros).
    """

    def __init__(
        self,
        lanes: Lanes,
        sampler: FrameSampler | None = None,
        *,
        video_key: str | None = None,
        on_reset: Callable[[list[int], Sequence[int | None]], None] | None = None,
        count_steps: bool = True,
    ) -> None:
        self._lanes = lanes
        self.sampler = sampler
        self.counts = count_steps
        self.num_lanes = lanes.num_lanes
        self.name = lanes.name
        self.single_observation_space = lanes.single_observation_space
        self.single_action_space = lanes.single_action_space
        self.lockstep = lanes.lockstep
        self.resets_itself = lanes.resets_itself
        self.spec = lanes.spec
        self.metadata = lanes.metadata
        self.rebuild = None if lanes.rebuild is None else self._rebuild
        self.steps = [0] * self.num_lanes
        self.returns = [0.0] * self.num_lanes
        self._on_reset = on_reset
        # Members an isinstance check of the seam's protocols looks for: set on the instance,
        # so they are found however the check looks (they are the wrapped lanes' own).
        for name in _THROUGH:
            if hasattr(lanes, name):
                setattr(self, name, getattr(lanes, name))
        rendering = lanes_rendering(lanes)
        if rendering is not None:
            self.render = rendering.render
            self.render_mode = rendering.render_mode
            self.render_fps = rendering.render_fps
        pipelined = lanes_pipelined(lanes)
        if pipelined is not None:
            self.step_groups = pipelined.step_groups
            self.send_step = pipelined.send_step
            self.send_reset = self._send_reset
            self.receive = self._receive
        # With pipelined resets: the seed sent for each lane whose reset is on its way.
        self._reset_seeds: dict[int, int | None] = {}
        self._take = self._taker(lanes, video_key) if sampler is not None else None
        self._due = sampler.due if sampler is not None else [False] * self.num_lanes
        self.env_steps: LaneSteps | None = (
            None if lanes.env_steps is None else LaneSteps(self, lanes.env_steps)
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_lanes"], name)

    # ---------------------------------------------------------------- frames and counts

    def _taker(self, lanes: Lanes, key: str | None) -> Callable[[int, Any], Any] | None:
        """``fn(lane, observation) -> frame``, or None (and the page says why) when these
        lanes give no frames."""
        assert self.sampler is not None
        if key is None:
            rendering = lanes_rendering(lanes)
            if rendering is None:
                self.sampler.stop(
                    f"{lanes.name} ({type(lanes).__name__}) cannot render a lane: pass "
                    f"video_key=KEY to show an image observation"
                )
                return None
            if rendering.render_mode != "rgb_array":
                self.sampler.stop(
                    f"the envs of {lanes.name} render in {rendering.render_mode!r} mode, not "
                    f"'rgb_array': build them with render_mode='rgb_array', or pass "
                    f"video_key=KEY to show an image observation"
                )
                return None
            render = rendering.render
            return lambda lane, observation: render(lane)
        space = lanes.single_observation_space
        if isinstance(space, gymnasium.spaces.Dict):
            if key not in space.spaces:
                self.sampler.stop(
                    f"video_key={key!r} is not a key of {lanes.name}'s observation: it has "
                    f"{sorted(space.spaces)}"
                )
                return None
            return lambda lane, observation: observation[key]
        if key != WHOLE_OBSERVATION:
            self.sampler.stop(
                f"video_key={key!r} names a key, but {lanes.name}'s observation is not a "
                f"Dict: pass video_key={WHOLE_OBSERVATION!r} to show the whole observation"
            )
            return None
        return lambda lane, observation: observation

    def _frame(self, lane: int, observation: Any) -> None:
        """Take ``lane``'s frame for the sampler; a lane that fails to give one stops the
        frames (never the run)."""
        take, sampler = self._take, self.sampler
        if take is None or sampler is None:
            return
        started = time.perf_counter()
        try:
            frame = take(lane, observation)
        except Exception as exc:
            sampler.stop(f"lane {lane}: taking its frame raised {exc!r}")
            return
        sampler.take(lane, frame)
        sampler.spent(time.perf_counter() - started)

    def _counting(self, lane: int) -> Step:
        """Lane ``lane``'s env step, counted (the wrapped step is read at each call)."""
        inner, steps, returns = self._lanes.env_steps, self.steps, self.returns

        def step_and_count(action: Any) -> tuple[Any, Any, Any, Any, Any]:
            outcome = inner[lane](action)  # type: ignore[index]
            steps[lane] += 1
            returns[lane] += outcome[1]
            return outcome

        return step_and_count

    def _framing(self, lane: int) -> Step:
        """Lane ``lane``'s step while its frame is due: the step, then the frame, once (the
        Rust core may call it again until its next look-up: then it only steps)."""
        due = self._due

        def step_and_frame(action: Any) -> tuple[Any, Any, Any, Any, Any]:
            outcome = self.env_steps.own(lane)(action)  # type: ignore[union-attr]
            if due[lane]:
                self._frame(lane, outcome[0])
            return outcome

        return step_and_frame

    # ---------------------------------------------------------------- the seam

    def reset(
        self, lanes: np.ndarray, seeds: Sequence[int | None], trials: Sequence[int | None]
    ) -> tuple[list[Any], list[dict[str, Any]]]:
        lane_list = self._resetting(lanes)
        try:
            outcome = self._lanes.reset(lanes, seeds, trials)
        finally:
            # The driver announces every scored lane of the call, those whose reset failed too.
            if self._on_reset is not None:
                self._on_reset(lane_list, seeds)
        self._first_frames(lane_list, outcome[0])
        return outcome

    def _resetting(self, lanes: np.ndarray) -> list[int]:
        """``lanes`` as a list, their step counts and returns back to zero."""
        lane_list = np.asarray(lanes).tolist()
        for lane in lane_list:
            self.steps[lane], self.returns[lane] = 0, 0.0
        return lane_list

    def _first_frames(self, lanes: list[int], observations: Sequence[Any]) -> None:
        if any(self._due[lane] for lane in lanes):
            for lane, observation in zip(lanes, observations, strict=True):
                if self._due[lane]:
                    self._frame(lane, observation)

    def _send_reset(
        self, lanes: np.ndarray, seeds: Sequence[int | None], trials: Sequence[int | None]
    ) -> None:
        """A pipelined reset (``PipelinedLanes``): counted as ``reset`` counts it when it
        comes back."""
        self._lanes.send_reset(lanes, seeds, trials)  # type: ignore[attr-defined]
        self._reset_seeds.update(zip(np.asarray(lanes).tolist(), seeds, strict=True))

    def _receive(self) -> StepBatch | ResetBatch:
        """A pipelined request's outcome (``PipelinedLanes``), counted and watched."""
        try:
            outcome = self._lanes.receive()  # type: ignore[attr-defined]
        except LaneFailures as failures:
            if isinstance(failures.outcome, StepBatch):
                self._count(failures.outcome.stepped, failures.outcome)
            else:
                self._reset_received([*failures.outcome[0].tolist(), *failures.errors], None)
            raise
        if isinstance(outcome, StepBatch):
            return self._count(outcome.stepped, outcome)
        self._reset_received(outcome.lanes.tolist(), outcome.observations)
        return outcome

    def _reset_received(self, lanes: list[int], observations: Sequence[Any] | None) -> None:
        lanes = sorted(lanes) if observations is None else lanes
        seeds = [self._reset_seeds.pop(lane) for lane in lanes]
        self._resetting(np.asarray(lanes))
        if self._on_reset is not None:
            self._on_reset(lanes, seeds)
        if observations is not None:
            self._first_frames(lanes, observations)

    def step(self, lanes: np.ndarray, actions: Any) -> StepBatch:
        return self._counted(self._lanes.step, lanes, actions)

    def round_step(self, lanes: np.ndarray, actions: Any) -> StepBatch:
        """The wrapped lanes' ``round_step`` (else their ``step``), counted and watched."""
        return self._counted(lanes_round_step(self._lanes), lanes, actions)

    def _counted(
        self, step: Callable[[np.ndarray, Any], StepBatch], lanes: np.ndarray, actions: Any
    ) -> StepBatch:
        try:
            batch = step(lanes, actions)
        except LaneFailures as failures:  # the lanes that stepped still count
            self._count(failures.outcome.stepped, failures.outcome)
            raise
        return self._count(lanes, batch)

    def _count(self, lanes: np.ndarray, batch: StepBatch) -> StepBatch:
        """Count the step of ``lanes`` (the rows of ``batch.rewards``), and take the frames
        that are due (of lanes whose step came back, so their envs are idle)."""
        lane_list = np.asarray(lanes).tolist()
        due = self._due
        if self.counts:
            self._add(lane_list, batch)
        frames = [lane for lane in lane_list if due[lane]]
        if frames:
            rows = {lane: row for row, lane in enumerate(np.asarray(batch.stepped).tolist())}
            for lane in frames:
                if lane in rows:
                    self._frame(lane, batch.observations[rows[lane]])
        return batch

    def _add(self, lane_list: list[int], batch: StepBatch) -> None:
        rewards = batch.rewards.tolist()
        restarted = batch.reset_lanes
        steps, returns = self.steps, self.returns
        for k, lane in enumerate(lane_list):
            if restarted is not None and restarted[k]:  # a vector restarting it: no step
                steps[lane], returns[lane] = 0, 0.0
            elif k < len(rewards):
                steps[lane] += 1
                returns[lane] += rewards[k]
        if self.resets_itself:  # the env restarts an ended lane itself: its counts too
            ended = np.logical_or(batch.terminated, batch.truncated).tolist()
            for k, lane in enumerate(lane_list):
                if k < len(ended) and ended[k]:
                    steps[lane], returns[lane] = 0, 0.0

    def _rebuild(self, lanes: np.ndarray) -> None:
        """The wrapped lanes' ``rebuild`` (the fast path reads their new envs' steps)."""
        self._lanes.rebuild(lanes)  # type: ignore[misc]
        for lane in np.asarray(lanes).tolist():
            self.steps[lane], self.returns[lane] = 0, 0.0

    def env_episode_ids(self) -> np.ndarray | None:
        return self._lanes.env_episode_ids()

    def close(self) -> None:
        self._lanes.close()

    def __repr__(self) -> str:
        return f"ViewLanes({self._lanes!r})"
