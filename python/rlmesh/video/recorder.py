"""Which episodes a run records, where their frames come from, and how they reach the encoder.

A run with ``record_video=K`` records the episodes whose index is below K: the same episodes
whatever the number of lanes, the core or the order they finish in. A recorded episode's video
holds ``steps + 1`` frames: the one after its reset, then one after each step.

Frames come from the lane's ``render()`` (``RenderingLanes.render``, the envs built in
``rgb_array`` mode) or, with ``video_key``, from the observation: a Dict's image key, or with
``video_key="observation"`` the whole (Box) observation.

The recorder plugs into the ``Lanes`` seam: ``RecordingLanes`` wraps the run's lanes, and only
a lane that runs a recorded episode takes a frame after its steps. On the core's fast path
that lane's ``env_steps`` entry is swapped for one that steps and then takes the frame, and
put back when the episode ends, so the other lanes' steps are the env's own, untouched. The
driver tells the recorder of episode starts and ends, and of episodes abandoned because their
env failed (``on_error``: their videos are dropped, and an index run again is recorded
afresh); recording never changes what the envs or the model see, so every result is the same
with or without it.

A ``VectorEnv`` with SAME_STEP autoreset restarts a lane inside the step that ended its
episode, so ``render()`` after that step already draws the next episode: the last frame of
such a video is the next episode's first. Its observation has the real last frame
(``StepBatch.final_observations``), which ``video_key`` records.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np

from ..errors import EnvError, LaneFailures
from ..lanes.base import (
    EnvStep,
    Lanes,
    ResetBatch,
    StepBatch,
    lanes_render_fps,
    lanes_rendering,
    lanes_round_step,
)
from ..results import EpisodeResult
from ..settings import VideoSettings
from .encoder import VideoEncoder, VideoError

WHOLE_OBSERVATION = "observation"
"""``video_key`` naming the whole observation, for an observation space that is an image Box."""
DEFAULT_FPS = 30.0
"""Frames per second of a video whose env's ``metadata`` has no ``render_fps``."""
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def video_name(prefix: str, index: int, seed: int | None) -> str:
    """A recorded episode's file name: by its task or env, index and seed.

    Example:
        >>> video_name("CartPole-v1", 3, 3), video_name("ALE/Pong-v5", 12, None)
        ('CartPole-v1_ep00003_seed3.mp4', 'ALE_Pong-v5_ep00012_noseed.mp4')
    """
    seed_part = "noseed" if seed is None else f"seed{seed}"
    return f"{_UNSAFE.sub('_', prefix)}_ep{index:05d}_{seed_part}.mp4"


def image_space_error(key: str, space: Any) -> str | None:
    """Why ``space`` (what ``video_key=key`` names) cannot be recorded, or None if it can:
    a video frame is a Box of shape ``[H, W, 3]`` or ``[H, W]`` and dtype uint8."""
    if (
        isinstance(space, gymnasium.spaces.Box)
        and space.dtype == np.uint8
        and (len(space.shape) == 2 or (len(space.shape) == 3 and space.shape[2] == 3))
    ):
        return None
    return (
        f"video_key={key!r} names {space}, which is not an image: a video's frames must be a "
        f"Box of shape [H, W, 3] or [H, W] and dtype uint8"
    )


def frame_error(frame: Any) -> str | None:
    """Why ``frame`` is not a video frame (``[H, W, 3]`` or ``[H, W]`` uint8), or None."""
    if (
        isinstance(frame, np.ndarray)
        and frame.dtype == np.uint8
        and (frame.ndim == 2 or (frame.ndim == 3 and frame.shape[2] == 3))
    ):
        return None
    shape = getattr(frame, "shape", None)
    described = type(frame).__name__ if shape is None else f"shape {shape} dtype {frame.dtype}"
    return f"got {described}, expected an [H, W, 3] or [H, W] uint8 array"


class NoVideos:
    """The recorder of a run that records nothing: ``VideoRecorder``'s calls, doing nothing,
    so the driver calls one recorder whether or not it records."""

    def __init__(self, lanes: Lanes) -> None:
        self.lanes = lanes

    def started(
        self,
        lanes: np.ndarray,
        indices: Sequence[int],
        seeds: Sequence[Any],
        failed: Collection[int] = (),
    ) -> None:
        pass

    def finished(self, lanes: np.ndarray) -> None:
        pass

    def abandoned(self, lanes: np.ndarray) -> None:
        pass

    def linked(self, episode: EpisodeResult) -> EpisodeResult:
        return episode

    def close(self) -> None:
        pass


class VideoRecorder:
    """Records a run's episodes below ``settings.episodes`` to mp4 files, one per episode.

    Args:
        settings: the checked video arguments (``rlmesh.settings.check_video_settings``).
        lanes: the run's lanes; ``self.lanes`` wraps them, and the driver steps that instead.
        observations: ``fn(lanes) -> [K] observations``, each lane's latest raw observation
            (the core runner's ``observations``): an episode's first frame with ``video_key``.

    Raises:
        VideoError: frames cannot come from these lanes: they cannot render (a served env)
            or not in ``rgb_array`` mode, or ``video_key`` names no image of the observation.
    """

    def __init__(
        self,
        settings: VideoSettings,
        lanes: Lanes,
        observations: Callable[[np.ndarray], Sequence[Any]],
    ) -> None:
        self.settings = settings
        self._observations = observations
        self._take = self._taker(lanes)
        self.fps = float(lanes_render_fps(lanes) or DEFAULT_FPS)
        self.prefix = settings.prefix or lanes.name
        self.lanes = RecordingLanes(lanes, self)
        self._recording: dict[int, int] = {}  # lane -> the recorded episode's index
        self._links: dict[int, str] = {}  # episode index -> EpisodeResult.video
        self._paths: dict[int, Path] = {}
        settings.directory.mkdir(parents=True, exist_ok=True)
        self._encoder = VideoEncoder()

    def _taker(self, lanes: Lanes) -> Callable[[int, Any], Any]:
        """``fn(lane, observation) -> frame``, checked against what the lanes offer."""
        key = self.settings.key
        if key is None:
            if lanes_rendering(lanes) is None:
                raise VideoError(
                    f"record_video takes frames from render(), but {lanes.name} "
                    f"({type(lanes).__name__}) cannot render a lane: pass video_key=KEY to "
                    f"record an image observation instead"
                )
            if lanes.render_mode != "rgb_array":
                raise VideoError(
                    f"record_video takes frames from render() in rgb_array mode, but the "
                    f"envs of {lanes.name} have render_mode={lanes.render_mode!r}: build them "
                    f"with render_mode='rgb_array' (rlmesh does for an env id, and for a "
                    f"factory that takes a render_mode keyword), or pass video_key=KEY to "
                    f"record an image observation"
                )
            return lambda lane, observation: lanes.render(lane)
        space = lanes.single_observation_space
        if isinstance(space, gymnasium.spaces.Dict):
            if key not in space.spaces:
                raise VideoError(
                    f"video_key={key!r} is not a key of {lanes.name}'s observation: it has "
                    f"{sorted(space.spaces)}"
                )
            problem = image_space_error(key, space[key])
            if problem is not None:
                raise VideoError(problem)
            return lambda lane, observation: observation[key]
        if key != WHOLE_OBSERVATION:
            raise VideoError(
                f"video_key={key!r} names a key, but {lanes.name}'s observation is {space}, "
                f"not a Dict: pass video_key={WHOLE_OBSERVATION!r} to record the whole "
                f"observation"
            )
        problem = image_space_error(key, space)
        if problem is not None:
            raise VideoError(problem)
        return lambda lane, observation: observation

    # ---------------------------------------------------------------- the driver's calls

    def started(
        self,
        lanes: np.ndarray,
        indices: np.ndarray,
        seeds: Sequence[int | None],
        failed: Collection[int] = (),
    ) -> None:
        """Episodes ``indices`` started on ``lanes`` (their first observations are the
        runner's): those to record open their videos with their first frame, but on the
        ``failed`` lanes, whose reset failed (``on_error``: they are abandoned next)."""
        wanted = indices < self.settings.episodes
        if failed:
            wanted &= ~np.isin(lanes, list(failed))
        recorded = np.flatnonzero(wanted)
        if not len(recorded):
            return
        lane_list = lanes[recorded]
        observations = self._observations(lane_list) if self.settings.key is not None else None
        for k, row in enumerate(recorded.tolist()):
            lane, index, seed = int(lanes[row]), int(indices[row]), seeds[row]
            path = self.settings.directory / video_name(self.prefix, index, seed)
            frame = self._take(lane, None if observations is None else observations[k])
            problem = frame_error(frame)
            if problem is not None:
                source = "render()" if self.settings.key is None else "the observation"
                raise VideoError(
                    f"lane {lane} ({self.lanes.name}), episode {index}: {source} {problem}"
                )
            self._paths[index] = path
            self._links[index] = self._link(path)
            self._encoder.open(index, path, fps=self.fps)
            self._encoder.frame(index, frame)  # copied: the env may draw into it again
            self._recording[lane] = index
            self.lanes.record(lane)

    def stepped(self, lane: int, observation: Any) -> None:
        """Lane ``lane``, which runs a recorded episode, stepped to ``observation``."""
        self._encoder.frame(self._recording[lane], self._take(lane, observation))

    def finished(self, lanes: np.ndarray) -> None:
        """The episodes on ``lanes`` ended: those recorded complete their videos."""
        if not self._recording:
            return
        for lane in lanes.tolist():
            index = self._recording.pop(lane, None)
            if index is not None:
                self.lanes.unrecord(lane)
                self._encoder.finish(index)

    def abandoned(self, lanes: np.ndarray) -> None:
        """The episodes on ``lanes`` were abandoned (their env failed, ``on_error``): their
        videos are dropped and never linked; an index run again is recorded afresh."""
        for lane in lanes.tolist():
            index = self._recording.pop(lane, None)
            if index is not None:
                self.lanes.unrecord(lane)
                self._encoder.discard(index)
                del self._links[index]

    def linked(self, episode: EpisodeResult) -> EpisodeResult:
        """``episode`` with its video's link, if it was recorded."""
        link = self._links.get(episode.index)
        return episode if link is None else replace(episode, video=link)

    def close(self) -> None:
        """Complete the videos of the episodes that ended and drop the ones in flight (their
        episodes did not complete), then stop the encoder.

        Raises:
            VideoError: some video could not be written; the message names each episode.
        """
        for lane in list(self._recording):
            self._encoder.discard(self._recording.pop(lane))
        try:
            self._encoder.close()
        except VideoError:
            failures = self._encoder.failures
            details = "; ".join(
                f"episode {index} ({self._paths[index]}): {why}"
                for index, why in sorted(failures.items())
            )
            raise VideoError(
                f"the videos of episodes {sorted(failures)} could not be written (their "
                f"episode results are kept; the results file links videos that do not "
                f"exist): {details}"
            ) from None

    def _link(self, path: Path) -> str:
        """What ``EpisodeResult.video`` holds: ``path`` relative to the results file's
        directory, or as made without a results file."""
        base = self.settings.links_from
        if base is None:
            return path.as_posix()
        return Path(os.path.relpath(path, base)).as_posix()


def _rows_of(batch: StepBatch, rows: np.ndarray) -> StepBatch:
    """The ``StepBatch`` of ``rows`` of ``batch``'s lanes asked for (not a lockstep vector's:
    there ``stepped`` holds lanes beyond those asked for)."""
    picked = rows.tolist()

    def some(values: list[Any] | None) -> list[Any] | None:
        return None if values is None else [values[row] for row in picked]

    return StepBatch(
        batch.stepped[rows],
        [batch.observations[row] for row in picked],
        batch.rewards[rows],
        batch.terminated[rows],
        batch.truncated[rows],
        [batch.infos[row] for row in picked],
        some(batch.final_observations),
        None if batch.reset_lanes is None else batch.reset_lanes[rows],
        some(batch.reset_infos),
    )


class RecordingLanes:
    """The run's lanes, with a frame taken after each step of a lane ``record`` marked.

    Everything else is the wrapped lanes' own (attributes are read through).
    """

    def __init__(self, lanes: Lanes, recorder: VideoRecorder) -> None:
        self._lanes = lanes
        self._recorder = recorder
        self.num_lanes = lanes.num_lanes
        self.name = lanes.name
        self.single_observation_space = lanes.single_observation_space
        self.single_action_space = lanes.single_action_space
        self.lockstep = lanes.lockstep
        self.resets_itself = lanes.resets_itself
        self.spec = lanes.spec
        self.rebuild = None if lanes.rebuild is None else self._rebuild
        self._env_steps = lanes.env_steps
        # The fast path's steps: the env's own, but for lanes running a recorded episode.
        self.env_steps: list[EnvStep] | None = (
            None if lanes.env_steps is None else list(lanes.env_steps)
        )
        self._recorded: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_lanes"], name)

    def record(self, lane: int) -> None:
        """Take a frame after each step of ``lane`` from now on."""
        self._recorded.add(lane)
        if self.env_steps is not None:
            step, stepped = self._env_steps[lane], self._recorder.stepped

            def step_and_record(action: Any) -> tuple[Any, Any, Any, Any, Any]:
                outcome = step(action)
                stepped(lane, outcome[0])
                return outcome

            self.env_steps[lane] = step_and_record

    def unrecord(self, lane: int) -> None:
        """Stop taking frames of ``lane``."""
        self._recorded.discard(lane)
        if self.env_steps is not None:
            self.env_steps[lane] = self._env_steps[lane]

    def _rebuild(self, lanes: np.ndarray) -> None:
        """The wrapped lanes' ``rebuild``; the fast path then steps the rebuilt lanes' new envs
        (the abandoned episodes' lanes are no longer recorded)."""
        self._lanes.rebuild(lanes)
        if self.env_steps is not None:
            for lane in np.asarray(lanes).tolist():
                self.env_steps[lane] = self._env_steps[lane]

    def reset(
        self, lanes: np.ndarray, seeds: Sequence[int | None], trials: Sequence[int | None]
    ) -> tuple[list[Any], list[dict[str, Any]]]:
        return self._lanes.reset(lanes, seeds, trials)

    def step(self, lanes: np.ndarray, actions: Any) -> StepBatch:
        return self._step_taking_frames(self._lanes.step, lanes, actions)

    def round_step(self, lanes: np.ndarray, actions: Any) -> StepBatch:
        """The wrapped lanes' ``round_step`` (else their ``step``), frames taken as ``step``
        takes them: the core's rounds call it."""
        step = lanes_round_step(self._lanes)
        return self._step_taking_frames(step, lanes, actions)

    def _step_taking_frames(
        self, step: Callable[[np.ndarray, Any], StepBatch], lanes: np.ndarray, actions: Any
    ) -> StepBatch:
        try:
            batch = step(lanes, actions)
        except LaneFailures as failures:  # the lanes that stepped still take their frames
            self._take_frames_after(failures)
        return self._take_frames(lanes, batch)

    def receive(self) -> StepBatch | ResetBatch:
        """A pipelined request's outcome (``PipelinedLanes``): a step's recorded lanes' frames
        taken; a reset as it is (as ``reset`` returns it: an episode's first frame is taken
        when it is announced)."""
        try:
            outcome = self._lanes.receive()  # type: ignore[attr-defined]
        except LaneFailures as failures:
            if isinstance(failures.outcome, StepBatch):
                self._take_frames_after(failures)
            raise
        if isinstance(outcome, StepBatch):
            return self._take_frames(outcome.stepped, outcome)
        return outcome

    def _take_frames_after(self, failures: LaneFailures) -> None:
        """Take the frames of the lanes that stepped beside the ones that failed, and raise
        the failures: with any lane whose frame failed too, as one ``LaneFailures``."""
        try:
            self._take_frames(failures.outcome.stepped, failures.outcome)
        except LaneFailures as frames:
            merged = LaneFailures(
                str(failures),
                errors=dict(sorted({**failures.errors, **frames.errors}.items())),
                outcome=frames.outcome,
            )
            raise merged from failures.__cause__ or failures
        raise failures

    def _take_frames(self, lanes: np.ndarray, batch: StepBatch) -> StepBatch:
        """``batch``, the step of ``lanes``, after a frame of each recorded lane is taken.

        Raises:
            LaneFailures: a lane's frame could not be taken (its env's ``render()`` raised
                in a worker or a server), where lanes fail one by one: that lane's episode
                fails as if its step had, and the others' frames and step are kept.
            EnvError: the same, for lanes that cannot fail one by one.
        """
        if not self._recorded:
            return batch
        rows = {lane: row for row, lane in enumerate(batch.stepped.tolist())}
        finals = batch.final_observations
        failed: dict[int, EnvError] = {}
        for k, lane in enumerate(np.asarray(lanes).tolist()):
            if lane in self._recorded:
                final = None if finals is None else finals[k]
                observation = batch.observations[rows[lane]] if final is None else final
                try:
                    self._recorder.stepped(lane, observation)
                except EnvError as err:
                    if self.lockstep or self.rebuild is None:
                        raise
                    failed[lane] = err
        if not failed:
            return batch
        first = next(iter(failed.values()))
        kept = ~np.isin(np.asarray(lanes), list(failed))
        raise LaneFailures(
            str(first),
            errors={lane: f"{type(err).__name__}: {err}" for lane, err in failed.items()},
            outcome=_rows_of(batch, np.flatnonzero(kept)),
        ) from first

    def env_episode_ids(self) -> np.ndarray | None:
        return self._lanes.env_episode_ids()

    def close(self) -> None:
        self._lanes.close()

    def __repr__(self) -> str:
        return f"RecordingLanes({self._lanes!r})"
