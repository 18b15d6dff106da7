"""In-process lanes: independent ``gymnasium.Env`` instances, any subset reset or stepped
(``InProcessLanes``, formerly ``LaneVector``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np

from ..errors import EnvError
from ..utils import env_failure, env_label, lane_actions
from .base import StepBatch, checked_reset, declares_trial_index, lane_failures, reset_options
from .build import build_envs


class InProcessLanes:
    """Independent ``gymnasium.Env`` lanes: any subset is reset or stepped, nothing else moves.

    No lane ever resets by itself: a lane whose episode ended stays as it is until the driver
    resets it, and a lane that is not stepped costs nothing. Each lane's ``step`` is handed to
    the core (``env_steps``), which calls it without Python in between on the fast path.

    An env that raises in ``reset`` or ``step`` does not stop the other lanes of the call:
    they go on, and the call raises ``LaneFailures`` with their results.

    Args:
        envs: one env per lane, all with the same observation and action spaces.
        factory: what built them (a zero-argument callable returning one env), for
            ``rebuild``; None (lanes of envs the caller built): ``rebuild`` is None.

    Raises:
        EnvError: no envs, or lanes whose spaces differ.

    Example:
        >>> lanes = InProcessLanes([gymnasium.make("CartPole-v1") for _ in range(2)])
        >>> observations, _ = lanes.reset(np.array([0, 1]), seeds=[0, 1], trials=[0, 1])
        >>> batch = lanes.step(np.array([1]), np.array([0]))  # lane 0 waits
        >>> batch.stepped.tolist(), batch.rewards.tolist()
        ([1], [1.0])
        >>> lanes.spec.id, lanes.spec.reward_threshold
        ('CartPole-v1', 475.0)
        >>> lanes.close()
    """

    lockstep = False
    resets_itself = False

    def __init__(
        self,
        envs: Sequence[gymnasium.Env[Any, Any]],
        *,
        factory: Callable[[], gymnasium.Env[Any, Any]] | None = None,
    ) -> None:
        if not envs:
            raise EnvError("InProcessLanes need at least one env, got none")
        first = envs[0]
        self.name = env_label(first)
        for lane, env in enumerate(envs):
            if (env.observation_space, env.action_space) != (
                first.observation_space,
                first.action_space,
            ):
                raise EnvError(
                    f"lane {lane} ({env_label(env)}) has observation space "
                    f"{env.observation_space} and action space {env.action_space}, but lane 0 "
                    f"has {first.observation_space} and {first.action_space}: every lane must "
                    f"share lane 0's spaces"
                )
        self._envs = list(envs)
        self.env_steps = [env.step for env in self._envs]
        self._closed = False
        self.num_lanes = len(self._envs)
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.accepts_trial_index = declares_trial_index(first)
        self.spec = first.spec
        self.metadata = dict(getattr(first, "metadata", None) or {})  # env tags may live here
        self.render_mode = first.render_mode
        self.render_fps = self.metadata.get("render_fps")
        self._factory = factory
        self.rebuild = None if factory is None else self._rebuild

    def reset(
        self, lanes: np.ndarray, seeds: Sequence[int | None], trials: Sequence[int | None]
    ) -> tuple[list[Any], list[dict[str, Any]]]:
        checked = checked_reset(lanes, seeds, trials, self.num_lanes)
        reset, observations, infos = [], [], []
        failed: dict[int, Exception] = {}
        for lane, seed, trial in zip(checked, seeds, trials, strict=True):
            try:
                observation, info = self._envs[lane].reset(
                    seed=seed, options=reset_options(self.accepts_trial_index, trial)
                )
            except Exception as err:
                failed[lane] = err
                continue
            reset.append(lane)
            observations.append(observation)
            infos.append(info)
        if failed:
            outcome = (np.array(reset, dtype=np.int64), observations, infos)
            raise lane_failures(self.name, "reset", failed, outcome)
        return observations, infos

    def step(self, lanes: np.ndarray, actions: Any) -> StepBatch:
        # The awaited path's step: lanes come from the runner (running, distinct, in range), so
        # they are not re-checked here; per-lane results become arrays once.
        lane_list = np.asarray(lanes).tolist()
        per_lane = lane_actions(actions, len(lane_list))
        envs = self._envs
        observations, rewards, terminated, truncated, infos = [], [], [], [], []
        failed: dict[int, Exception] = {}
        for lane, action in zip(lane_list, per_lane, strict=True):
            try:
                observation, reward, term, trunc, info = envs[lane].step(action)
            except Exception as err:
                failed[lane] = err
                continue
            observations.append(observation)
            rewards.append(reward)
            terminated.append(term)
            truncated.append(trunc)
            infos.append(info)
        stepped = [lane for lane in lane_list if lane not in failed] if failed else lanes
        batch = StepBatch(
            np.asarray(stepped, dtype=np.int64),
            observations,
            np.array(rewards, dtype=np.float64),
            np.array(terminated, dtype=np.bool_),
            np.array(truncated, dtype=np.bool_),
            infos,
        )
        if failed:
            raise lane_failures(self.name, "step", failed, batch)
        return batch

    def _rebuild(self, lanes: np.ndarray) -> None:
        for lane in np.asarray(lanes).tolist():
            # The env failed, so its close may fail too; the lane's new env does not need it.
            with contextlib.suppress(Exception):
                self._envs[lane].close()
            (env,) = build_envs(
                self._factory,
                1,
                f"the factory of {self.name} (rebuilding a failed lane)",
                "it built the lanes before, so it must build them again",
                first_lane=lane,
            )
            if (env.observation_space, env.action_space) != (
                self.single_observation_space,
                self.single_action_space,
            ):
                env.close()
                raise EnvError(
                    f"lane {lane} ({self.name}) was rebuilt with observation space "
                    f"{env.observation_space} and action space {env.action_space}, but the "
                    f"lanes have {self.single_observation_space} and "
                    f"{self.single_action_space}"
                )
            self._envs[lane] = env
            # In place: the core holds this list for its fast path.
            self.env_steps[lane] = env.step

    def env_episode_ids(self) -> np.ndarray | None:
        return None

    def render(self, lane: int) -> Any:
        try:
            return self._envs[lane].render()
        except Exception as err:
            raise env_failure(self.name, "render", err, lane) from err

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Every env is closed even when one fails; the first failure is raised afterwards.
        failure = None
        for lane, env in enumerate(self._envs):
            try:
                env.close()
            except Exception as err:
                failure = failure or env_failure(self.name, "close", err, lane)
        if failure is not None:
            raise failure from failure.__cause__

    def __repr__(self) -> str:
        return f"InProcessLanes({self.name}, num_lanes={self.num_lanes})"


__all__ = ["InProcessLanes"]
