"""A user's ``gymnasium.vector.VectorEnv`` as lanes, every step moving every lane
(``VectorEnvLanes``, formerly ``VectorLanes``)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv
from gymnasium.vector.utils import create_empty_array, iterate

from ..errors import EnvError
from ..utils import env_failure, env_label, scatter_rows, vector_spec
from .base import (
    DRIVER,
    NEXT_STEP,
    SAME_STEP,
    StepBatch,
    checked_reset,
    declares_trial_index,
    reset_options,
)

# ``gymnasium.vector.AutoresetMode`` values (``metadata["autoreset_mode"]`` holds the enum, or
# its value on vectors that avoid importing it) -> who starts a lane's next episode.
_AUTORESET_MODES = {"NextStep": NEXT_STEP, "SameStep": SAME_STEP, "Disabled": DRIVER}


class VectorEnvLanes:
    """The lanes of a user's ``gymnasium.vector.VectorEnv``, stepped in lockstep.

    ``autoreset`` follows ``env.metadata["autoreset_mode"]`` (Gymnasium's default, NEXT_STEP,
    when the vector does not say):

    - ``DISABLED`` -> ``"driver"``: a lane that ended must be reset by ``reset`` before the
      next ``step``. ``reset`` of a subset calls ``env.reset(seed=seeds, options={"reset_mask":
      mask, ...})``: Gymnasium 1.x vectors (``SyncVectorEnv``, ``AsyncVectorEnv``) take
      ``seed`` as a list of ``num_envs`` entries and reset only the lanes where the bool
      ``[num_envs]`` mask is True, each with its own seed (the others' entries are ignored,
      None here); every other option is passed to every reset lane. So when lanes get
      different trial indices, each trial is its own masked reset. Resetting all lanes
      without trial options is one plain ``env.reset(seed=seeds)``.
    - ``NEXT_STEP`` -> ``"next_step"``: a lane that ended on one step is reset by the vector on
      the next (its action ignored, reward 0, flags False); ``StepBatch.reset_lanes`` marks
      those steps and ``env_episode_ids`` counts them.
    - ``SAME_STEP`` -> ``"same_step"``: a lane that ended is reset within the same step;
      ``StepBatch.final_observations`` / ``infos`` hold the ended episode's last observation
      and info, ``observations`` / ``reset_infos`` the new episode's first, and
      ``env_episode_ids`` counts the restarts.

    ``step`` takes the running lanes only: the vector's other lanes (between episodes while it
    restarts them) get a placeholder action it ignores, and the batch's rows are the running
    lanes'. When the vector restarts lanes itself (NEXT_STEP, SAME_STEP), those episodes get
    no seed: the constructor warns once, naming the fix.

    A Gymnasium vector cannot reset a subset of its lanes before every lane was reset once (it
    batches every lane's last observation), so the first ``reset`` resets every lane: lanes not
    asked for start unseeded, and when the lanes asked for need different trial indices, all
    are first reset with their seeds and no options, then again per trial. ``reset`` never
    counts as an env-started episode, and it cancels a NEXT_STEP vector's pending autoreset of
    the lanes it resets.

    Observations are split per lane from the batch the vector returned: views into it, so a
    vector built with ``copy=False`` overwrites them on its next call.

    Args:
        env: the vector env; its ``num_envs`` is ``num_lanes``.

    Raises:
        EnvError: an ``autoreset_mode`` Gymnasium does not define.
    """

    lockstep = True
    env_steps = None
    rebuild = None  # one lane of a user's vector cannot be rebuilt alone

    def __init__(self, env: VectorEnv[Any, Any, Any]) -> None:
        self._env = env
        self.name = self._name = env_label(env)
        mode = env.metadata.get("autoreset_mode", "NextStep")
        autoreset = _AUTORESET_MODES.get(getattr(mode, "value", mode))
        if autoreset is None:
            raise EnvError(
                f"{self._name} has metadata['autoreset_mode'] = {mode!r}; expected a "
                f"gymnasium.vector.AutoresetMode: NEXT_STEP, SAME_STEP or DISABLED"
            )
        self.autoreset = autoreset
        self.resets_itself = autoreset != DRIVER
        if self.resets_itself:
            warnings.warn(
                f"{self._name} restarts ended lanes itself ({autoreset} autoreset), so the "
                f"episodes it restarts get seed=None and their results depend on the number of "
                f"lanes: build the vector with autoreset_mode=gymnasium.vector.AutoresetMode."
                f"DISABLED, or pass an env id or factory and let rlmesh build the lanes",
                UserWarning,
                stacklevel=3,
            )
        self.num_lanes = env.num_envs
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        self.accepts_trial_index = declares_trial_index(env)
        self.spec = vector_spec(env)
        self.metadata = dict(getattr(env, "metadata", None) or {})  # env tags may live here
        self.render_mode = getattr(env, "render_mode", None)
        self.render_fps = self.metadata.get("render_fps")
        self._all_lanes = np.arange(self.num_lanes)
        # Lanes whose episode ended on the last step and that no reset has restarted since:
        # a NEXT_STEP vector resets them on the next step; DISABLED needs the driver to.
        self._ended = np.zeros(self.num_lanes, dtype=np.bool_)
        self._env_episodes = np.zeros(self.num_lanes, dtype=np.int64)
        self._reset_once = False
        self._closed = False

    def reset(
        self, lanes: np.ndarray, seeds: Sequence[int | None], trials: Sequence[int | None]
    ) -> tuple[list[Any], list[dict[str, Any]]]:
        checked = checked_reset(lanes, seeds, trials, self.num_lanes)
        # One vector reset per distinct reset option, as the vector passes one options dict to
        # every lane it resets; the group without options first (see below).
        by_trial: dict[int | None, list[int]] = {}
        for position, trial in enumerate(trials):
            key = trial if self.accepts_trial_index else None
            by_trial.setdefault(key, []).append(position)
        groups = sorted(by_trial.items(), key=lambda group: group[0] is not None)

        # A Gymnasium vector batches every lane's last observation, so its first reset must
        # cover every lane. The option-free group can be that reset (the other lanes start
        # unseeded), as can one trial asked for every lane; otherwise every lane is reset once
        # first, seeded as asked, without options.
        options_for_all = len(groups) == 1 and len(checked) == self.num_lanes
        if not self._reset_once and groups[0][0] is not None and not options_for_all:
            first_seeds: list[int | None] = [None] * self.num_lanes
            for lane, seed in zip(checked, seeds, strict=True):
                first_seeds[lane] = seed
            self._vector_reset(first_seeds, None)
            self._reset_once = True

        observations: list[Any] = [None] * len(checked)
        infos: list[Any] = [None] * len(checked)
        for trial, positions in groups:
            mask = np.zeros(self.num_lanes, dtype=np.bool_)
            lane_seeds: list[int | None] = [None] * self.num_lanes
            for position in positions:
                mask[checked[position]] = True
                lane_seeds[checked[position]] = seeds[position]
            options = reset_options(self.accepts_trial_index, trial) or {}
            if self._reset_once and not mask.all():
                options["reset_mask"] = mask
            lane_observations, lane_infos = self._vector_reset(lane_seeds, options or None)
            self._reset_once = True
            for position in positions:
                observations[position] = lane_observations[checked[position]]
                infos[position] = lane_infos[checked[position]]
            self._ended = self._ended & ~mask
        return observations, infos

    def _vector_reset(
        self, seeds: list[int | None], options: dict[str, Any] | None
    ) -> tuple[list[Any], list[dict[str, Any]]]:
        try:
            batch, infos = self._env.reset(seed=seeds, options=options)
        except Exception as err:
            raise env_failure(self._name, "reset", err) from err
        return list(iterate(self._env.observation_space, batch)), _split_infos(
            infos, self.num_lanes
        )

    def step(self, lanes: np.ndarray, actions: Any) -> StepBatch:
        lanes = np.asarray(lanes, dtype=np.int64)
        if self.autoreset == DRIVER and self._ended.any():
            raise ValueError(
                f"lanes {np.flatnonzero(self._ended).tolist()} of {self._name} ended and were "
                f"not reset: with AutoresetMode.DISABLED, reset them before the next step"
            )
        every_lane = len(lanes) == self.num_lanes
        if not every_lane:
            # The lanes between episodes: the vector restarts them and ignores their action.
            full = create_empty_array(self.single_action_space, n=self.num_lanes, fn=np.zeros)
            if len(lanes):
                scatter_rows(full, lanes, actions)
            actions = full
        try:
            batch, rewards, terminated, truncated, vector_infos = self._env.step(actions)
        except Exception as err:
            raise env_failure(self._name, "step", err) from err
        terminated = np.asarray(terminated, dtype=np.bool_)
        truncated = np.asarray(truncated, dtype=np.bool_)
        ended = terminated | truncated
        infos = _split_infos(vector_infos, self.num_lanes)
        final_observations = reset_infos = reset_lanes = None
        if self.autoreset == NEXT_STEP:
            reset_lanes = self._ended
            self._env_episodes += self._ended
        elif self.autoreset == SAME_STEP:
            self._env_episodes += ended
            final_observations = [None] * self.num_lanes
            reset_infos = [None] * self.num_lanes
            for lane in np.flatnonzero(ended).tolist():
                # The vector put the new episode's reset info at the top level and nested
                # the ended episode's last observation and info under final_obs / final_info.
                reset_info = infos[lane]
                final_observations[lane] = reset_info.pop("final_obs", None)
                infos[lane] = reset_info.pop("final_info", {})
                reset_infos[lane] = reset_info
        self._ended = ended
        rows = slice(None) if every_lane else lanes
        picked = (lambda values: values) if every_lane else _rows_of(lanes)
        return StepBatch(
            self._all_lanes,
            list(iterate(self._env.observation_space, batch)),
            np.asarray(rewards, dtype=np.float64)[rows],
            terminated[rows],
            truncated[rows],
            picked(infos),
            None if final_observations is None else picked(final_observations),
            None if reset_lanes is None else reset_lanes[rows],
            None if reset_infos is None else picked(reset_infos),
        )

    def env_episode_ids(self) -> np.ndarray | None:
        if self.autoreset == DRIVER:
            return None
        return self._env_episodes.copy()

    def render(self, lane: int) -> Any:
        # A Gymnasium vector renders every lane at once (a tuple of frames, one per lane).
        try:
            frames = self._env.render()
        except Exception as err:
            raise env_failure(self._name, "render", err, lane) from err
        if frames is None or len(frames) != self.num_lanes:
            raise EnvError(
                f"lane {lane} ({self._name}): render() returned {type(frames).__name__}, "
                f"expected one frame per lane ({self.num_lanes}); build the vector's envs with "
                f"render_mode='rgb_array'"
            )
        return frames[lane]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._env.close()
        except Exception as err:
            raise env_failure(self._name, "close", err) from err

    def __repr__(self) -> str:
        return (
            f"VectorEnvLanes({self._name}, num_lanes={self.num_lanes}, autoreset={self.autoreset})"
        )


def _rows_of(lanes: np.ndarray) -> Callable[[list[Any]], list[Any]]:
    """Picks the rows of ``lanes`` from a per-lane list."""
    positions = lanes.tolist()
    return lambda values: [values[lane] for lane in positions]


def _split_infos(infos: Mapping[str, Any], num_lanes: int) -> list[dict[str, Any]]:
    """A vector's infos (each key an ``[N]`` batch, ``_key`` its bool mask) split per lane.

    A lane gets a key only where its mask is True; a nested dict is split the same way. A key
    without a mask (a vector that does not follow Gymnasium's convention) goes to every lane:
    its row where it is an ``[N]`` array, the whole value otherwise.
    """
    lanes: list[dict[str, Any]] = [{} for _ in range(num_lanes)]
    for key, value in infos.items():
        if isinstance(key, str) and key.startswith("_") and key[1:] in infos:
            continue
        mask = infos.get(f"_{key}")
        if isinstance(value, Mapping):
            rows: Sequence[Any] = _split_infos(value, num_lanes)
        elif isinstance(value, np.ndarray) and value.shape[:1] == (num_lanes,):
            rows = value
        else:
            rows = [value] * num_lanes
        for lane, info in enumerate(lanes):
            if mask is None or mask[lane]:
                info[key] = rows[lane]
    return lanes


__all__ = ["DRIVER", "NEXT_STEP", "SAME_STEP", "VectorEnvLanes"]
