"""A served env's per-lane work: ``ServedSteps`` steps in-process lanes, each lane's env with
its row of an action batch, and gives the results in the form a ``StepResponse`` carries them;
``ServedEpisodes`` keeps which lanes run an episode, and each one's steps and return.

Mirrors ``rust/src/wire/served.rs``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...utils import env_failure, lane_actions
from ..args import vector

ObservationLeaves = Callable[[list[Any], np.ndarray], list[bytes]]
"""``encode(observations, lanes)``: the observation leaves of the lanes' observations, raising
where one does not fit the observation space."""


class ServedSteps:
    """The steps an env server takes for its ``StepRequest``s, over lanes whose envs' ``step``
    it holds (``Lanes.env_steps``).

    Args:
        env_steps: per lane, its env's ``step``; read at each call, so a lane rebuilt in
            place steps its new env.
        env_name: the env's name, for errors.
        encode: what gives the observation leaves (``ObservationLeaves``). Its bytes are the
            answer's.
        observation: None, or the observation space's one numeric leaf as ``(dtype, shape,
            check)``, ``check`` None, ``"nan"`` (no NaN element) or ``(low, high)`` (integers
            in ``[low, high)``). Where every observation is an array of exactly that dtype and
            shape passing the check, the Rust core writes their bytes itself, which are what
            ``encode`` gives; this core always calls ``encode``.

    Example:
        >>> import gymnasium as gym
        >>> env = gym.make("CartPole-v1")
        >>> _ = env.reset(seed=0)
        >>> def encode(observations, lanes):
        ...     return [np.stack(observations).tobytes()]
        >>> steps = ServedSteps([env.step], "CartPole-v1", encode)
        >>> leaves, rewards, terminated, truncated, _ = steps.step(np.array([0]), np.array([1]))
        >>> len(leaves[0]), rewards, terminated, truncated
        (16, [1.0], b'\\x00', b'\\x00')
    """

    def __init__(
        self,
        env_steps: Sequence[Callable[[Any], tuple]],
        env_name: str,
        encode: ObservationLeaves,
        observation: tuple[Any, tuple[int, ...], Any] | None = None,
    ) -> None:
        self._env_steps = env_steps
        self._env_name = env_name
        self._encode = encode
        if observation is not None:
            _dtype, _shape, check = observation
            if not (check is None or check == "nan" or _is_range(check)):
                raise ValueError(
                    f'observation check must be None, "nan" or (low, high), got {check}'
                )

    def step(
        self, lanes: np.ndarray, actions: Any
    ) -> tuple[list[bytes], list[float], bytes, bytes, list[dict[str, Any]]]:
        """Step ``lanes`` (``[K]`` int64: distinct, in range) with ``actions``, batched as
        ``Lanes.step`` takes them: lane ``lanes[k]`` gets row ``k`` (``rlmesh.utils.lane_actions``).

        Returns:
            ``(observation leaves, K rewards, terminated, truncated, K infos)``: the masks a
            byte per lane, 1 where set.

        Raises:
            EnvError: an env's ``step`` raised (chained), naming its lane; the lanes after it
                were not stepped.
            ValueError: rewards or flags that are not one number each, or an action leaf
                without a row per lane.
        """
        observations, rewards, terminated, truncated, infos = [], [], [], [], []
        env_steps = self._env_steps
        checked = vector(lanes, "int64", "lanes").tolist()
        per_lane = lane_actions(actions, len(checked))
        for k, lane in enumerate(checked):
            try:
                observation, reward, term, trunc, info = env_steps[lane](per_lane[k])
            except Exception as err:
                raise env_failure(self._env_name, "step", err, lane) from err
            observations.append(observation)
            rewards.append(reward)
            terminated.append(term)
            truncated.append(trunc)
            infos.append(info)
        return (
            self._encode(observations, lanes),
            vector(np.array(rewards, dtype=np.float64), "float64", "rewards").tolist(),
            vector(np.array(terminated, dtype=np.bool_), "bool", "terminated").tobytes(),
            vector(np.array(truncated, dtype=np.bool_), "bool", "truncated").tobytes(),
            infos,
        )

    def __repr__(self) -> str:
        return f"ServedSteps({self._env_name})"


def _is_range(check: Any) -> bool:
    return (
        isinstance(check, tuple)
        and len(check) == 2
        and all(isinstance(bound, int) for bound in check)
    )


class ServedEpisodes:
    """Which of a served env's lanes run an episode, and its steps and return so far.

    Args:
        num_lanes: the server's lanes, ``0..num_lanes-1``.

    Raises:
        ValueError: (every method) a lane outside ``0..num_lanes-1``.

    Example:
        >>> episodes = ServedEpisodes(2)
        >>> episodes.start(np.array([0, 1]))
        >>> episodes.add(np.array([1]), [0.5])
        >>> episodes.finish(1), episodes.not_running(np.array([0, 1])), episodes.running_lanes()
        ((1, 0.5), [1], [0])
    """

    def __init__(self, num_lanes: int) -> None:
        self._running = [False] * num_lanes
        self._steps = [0] * num_lanes
        self._returns = [0.0] * num_lanes

    def _lanes(self, lanes: np.ndarray) -> list[int]:
        checked = vector(lanes, "int64", "lanes").tolist()
        for lane in checked:
            self._lane(lane)
        return checked

    def _lane(self, lane: int) -> int:
        if not 0 <= lane < len(self._running):
            raise ValueError(
                f"lane {lane} is not a lane of this server (0..{len(self._running) - 1})"
            )
        return lane

    def start(self, lanes: np.ndarray) -> None:
        """A new episode on each of ``lanes``: running, no step, a return of 0."""
        for lane in self._lanes(lanes):
            self._running[lane] = True
            self._steps[lane] = 0
            self._returns[lane] = 0.0

    def not_running(self, lanes: np.ndarray) -> list[int]:
        """The lanes of ``lanes`` that run no episode, in their order (empty: all run)."""
        return [lane for lane in self._lanes(lanes) if not self._running[lane]]

    def add(self, lanes: np.ndarray, rewards: Sequence[float]) -> None:
        """One step of each of ``lanes``, ``rewards[k]`` added to lane ``lanes[k]``'s return."""
        checked = self._lanes(lanes)
        if len(rewards) != len(checked):
            raise ValueError(f"{len(rewards)} rewards for {len(checked)} lanes")
        for lane, reward in zip(checked, rewards, strict=True):
            self._steps[lane] += 1
            self._returns[lane] += float(reward)

    def finish(self, lane: int) -> tuple[int, float]:
        """End ``lane``'s episode: its ``(steps, return)``."""
        self._running[self._lane(lane)] = False
        return self._steps[lane], self._returns[lane]

    def running_lanes(self) -> list[int]:
        """The lanes that run an episode, in lane order."""
        return [lane for lane, running in enumerate(self._running) if running]

    def stop(self) -> None:
        """No lane runs an episode any more (the session ended)."""
        self._running = [False] * len(self._running)

    def __repr__(self) -> str:
        return f"ServedEpisodes(num_lanes={len(self._running)})"
