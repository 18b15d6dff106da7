"""What ``env=`` may be, and the lane vector rlmesh builds itself.

``make_lanes`` turns whatever was passed as ``env=`` into ``Lanes``, the one interface the
driver steps:

- a Gymnasium id (``"CartPole-v1"``): ``num_envs`` lanes, each ``gymnasium.make(id,
  **env_kwargs)``, in a ``LaneVector``;
- a ``gymnasium.Env`` instance: a ``LaneVector`` of that one lane;
- a zero-argument callable returning a ``gymnasium.Env``: a ``LaneVector`` of ``num_envs``
  lanes, one call each;
- a ``gymnasium.vector.VectorEnv``: ``VectorLanes`` over its lanes.

A ``LaneVector`` steps any subset of its lanes and never resets a lane by itself: the driver
resets every episode with its seed, and a lane left without an episode simply stops being
stepped, so it costs nothing. A ``VectorEnv`` steps all its lanes in lockstep; ``VectorLanes``
follows its ``metadata["autoreset_mode"]``: with ``DISABLED`` the driver resets ended lanes
itself (masked, seeded resets); with ``NEXT_STEP`` and ``SAME_STEP`` the env restarts ended
lanes on its own, unseeded, and ``env_episode_ids`` counts those restarts for
``RouteLedger.observe_rolls``.

Trial indices: an env that sweeps a fixed list of initial states declares
``metadata["rlmesh.trial_index"] = True`` (exactly ``True``). Its resets then get
``options={"trial_index": t}``, ``t`` the episode's global index ``trial_index_base + slot``.
Envs that do not declare it never receive the option, since many envs refuse unknown options.
Restarts an autoresetting vector does on its own carry no options, so no trial index.

Example:
    >>> import numpy as np
    >>> lanes = make_lanes("CartPole-v1", num_envs=3)
    >>> lanes.num_lanes, lanes.lockstep, lanes.autoreset, lanes.accepts_trial_index
    (3, False, 'driver', False)
    >>> observations, infos = lanes.reset(np.arange(3), seeds=[0, 1, 2], trials=[0, 1, 2])
    >>> len(observations), observations[0].shape
    (3, (4,))
    >>> batch = lanes.step(np.array([2, 0]), np.array([1, 0]))  # lane 1 waits
    >>> batch.rewards, batch.terminated, len(batch.observations)
    (array([1., 1.]), array([False, False]), 2)
    >>> lanes.close()
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector import VectorEnv
from gymnasium.vector.utils import iterate

from ._pycore.args import check_lanes, count_arg, same_length, vector
from ._pycore.rounds import env_failure, lane_actions
from .errors import EnvError

DRIVER = "driver"
NEXT_STEP = "next_step"
SAME_STEP = "same_step"

TRIAL_INDEX_FLAG = "rlmesh.trial_index"
"""The ``metadata`` key by which an env declares it takes the ``trial_index`` reset option."""

TRIAL_INDEX_OPTION = "trial_index"

# ``gymnasium.vector.AutoresetMode`` values (``metadata["autoreset_mode"]`` holds the enum, or
# its value on vectors that avoid importing it) -> who starts a lane's next episode.
_AUTORESET_MODES = {"NextStep": NEXT_STEP, "SameStep": SAME_STEP, "Disabled": DRIVER}

ENV_FORMS = (
    "a Gymnasium id (str), a gymnasium.Env instance, a zero-argument callable returning a "
    "gymnasium.Env, or a gymnasium.vector.VectorEnv"
)


@dataclass
class StepBatch:
    """What one ``Lanes.step`` over ``K`` lanes returned, in the order the lanes were given.

    Attributes:
        observations: ``K`` raw per-lane observations. With ``same_step`` autoreset, a lane
            whose episode ended holds the first observation of its NEW episode (the ended
            episode's last one is in ``final_observations``).
        rewards: ``[K]`` float64.
        terminated, truncated: ``[K]`` bool, as the env returned them.
        infos: ``K`` per-lane info dicts (a ``VectorEnv``'s dict of arrays split per lane,
            its ``_key`` masks dropped). With ``same_step``, a lane that ended holds the ended
            episode's final info.
        final_observations: ``same_step`` only, else None: per lane, the last observation of
            the episode that ended, None where none ended.
        reset_lanes: ``next_step`` only, else None: ``[K]`` bool, True where this step was the
            vector resetting a lane whose episode ended on the previous step. That lane's
            action was ignored; its observation and info are the first of a new episode; its
            reward (0) and flags (False) belong to no episode, so the step is not recorded.
        reset_infos: ``same_step`` only, else None: per lane, the reset info of the new
            episode where a lane ended and restarted, None elsewhere.
    """

    observations: list[Any]
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    infos: list[dict[str, Any]]
    final_observations: list[Any] | None = None
    reset_lanes: np.ndarray | None = None
    reset_infos: list[dict[str, Any] | None] | None = None


class Lanes(abc.ABC):
    """``num_lanes`` environment instances (lanes ``0..N-1``) the driver resets and steps.

    Attributes:
        num_lanes: ``N >= 1``.
        lockstep: False when any subset of lanes can be stepped or reset (``LaneVector``);
            True when every step steps all lanes (``VectorLanes``).
        autoreset: who starts a lane's next episode. ``"driver"``: the driver, through
            ``reset`` with the slot's seed (``LaneVector``, and a ``VectorEnv`` with
            ``AutoresetMode.DISABLED``). ``"next_step"`` / ``"same_step"``: the env, on the
            step after the end or within the ending step (Gymnasium's ``NEXT_STEP`` and
            ``SAME_STEP``), unseeded; see ``env_episode_ids``.
        single_observation_space, single_action_space: the spaces of one lane.
        accepts_trial_index: the env declares ``metadata["rlmesh.trial_index"] is True``, so
            ``reset`` passes it ``options={"trial_index": t}``.
    """

    num_lanes: int
    lockstep: bool
    autoreset: str
    single_observation_space: gymnasium.Space[Any]
    single_action_space: gymnasium.Space[Any]
    accepts_trial_index: bool

    @abc.abstractmethod
    def reset(
        self, lanes: np.ndarray, seeds: Sequence[int | None], trials: Sequence[int | None]
    ) -> tuple[list[Any], list[dict[str, Any]]]:
        """Reset ``lanes`` (``[K]`` int, distinct) with ``seeds[k]`` and trial ``trials[k]``.

        A seed of None lets the env choose. ``options={"trial_index": trials[k]}`` is passed
        only when ``accepts_trial_index`` and ``trials[k]`` is not None; otherwise no options.

        Returns:
            ``(observations, infos)``: ``K`` raw observations and ``K`` info dicts, in the order
            of ``lanes``.

        Raises:
            ValueError: a lane out of range or given twice, or mismatched lengths.
            EnvError: an env's ``reset`` raised.
        """

    @abc.abstractmethod
    def step(self, lanes: np.ndarray, actions: Any) -> StepBatch:
        """Step ``lanes`` (``[K]`` int, distinct): lane ``lanes[k]`` takes ``actions[k]``.

        ``actions`` are env actions batched along a leading lane axis: an array ``[K, ...]``,
        or for ``Dict`` / ``Tuple`` action spaces a dict / tuple of such batches (each leaf is
        indexed ``[k]``).

        Raises:
            ValueError: actions that do not hold ``K`` rows; for a lockstep vector, ``lanes``
                other than ``0..N-1`` in order, or a lane the driver had to reset but did not.
            EnvError: an env's ``step`` raised.
        """

    def env_episode_ids(self) -> np.ndarray | None:
        """Per-lane counts of the episodes the env started on its own (``[N]`` int64).

        Only an autoresetting vector (``autoreset`` ``"next_step"`` / ``"same_step"``) has
        them; feed them to ``RouteLedger.observe_rolls`` after every step. None otherwise.
        """
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Close every env. Closing again does nothing."""

    def _reset_options(self, trial: int | None) -> dict[str, Any] | None:
        if self.accepts_trial_index and trial is not None:
            return {TRIAL_INDEX_OPTION: trial}
        return None


class LaneVector(Lanes):
    """Independent ``gymnasium.Env`` lanes: any subset is reset or stepped, nothing else moves.

    No lane ever resets by itself: a lane whose episode ended stays as it is until the driver
    resets it, and a lane that is not stepped costs nothing.

    Args:
        envs: one env per lane, all with the same observation and action spaces.

    Raises:
        EnvError: no envs, or lanes whose spaces differ.
    """

    lockstep = False
    autoreset = DRIVER

    def __init__(self, envs: Sequence[gymnasium.Env[Any, Any]]) -> None:
        if not envs:
            raise EnvError("a LaneVector needs at least one env, got none")
        first = envs[0]
        self._name = _env_name(first)
        for lane, env in enumerate(envs):
            if (env.observation_space, env.action_space) != (
                first.observation_space,
                first.action_space,
            ):
                raise EnvError(
                    f"lane {lane} ({_env_name(env)}) has observation space "
                    f"{env.observation_space} and action space {env.action_space}, but lane 0 "
                    f"has {first.observation_space} and {first.action_space}: every lane must "
                    f"share lane 0's spaces"
                )
        self._envs = list(envs)
        self.name = self._name
        self.env_steps = [env.step for env in self._envs]
        self._closed = False
        self.num_lanes = len(self._envs)
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.accepts_trial_index = _declares_trial_index(first)

    def reset(
        self, lanes: np.ndarray, seeds: Sequence[int | None], trials: Sequence[int | None]
    ) -> tuple[list[Any], list[dict[str, Any]]]:
        checked = _checked_reset(lanes, seeds, trials, self.num_lanes)
        observations, infos = [], []
        for lane, seed, trial in zip(checked, seeds, trials, strict=True):
            try:
                observation, info = self._envs[lane].reset(
                    seed=seed, options=self._reset_options(trial)
                )
            except Exception as err:
                raise env_failure(self._name, "reset", err, lane) from err
            observations.append(observation)
            infos.append(info)
        return observations, infos

    def step(self, lanes: np.ndarray, actions: Any) -> StepBatch:
        # The hot path: lanes come from the driver's ledger (running lanes, distinct, in range),
        # so they are not re-checked here; the per-lane results are gathered in lists and
        # become arrays once.
        lane_list = np.asarray(lanes).tolist()
        per_lane = lane_actions(actions, len(lane_list))
        envs = self._envs
        observations, rewards, terminated, truncated, infos = [], [], [], [], []
        lane = None
        try:
            for lane, action in zip(lane_list, per_lane, strict=True):
                observation, reward, term, trunc, info = envs[lane].step(action)
                observations.append(observation)
                rewards.append(reward)
                terminated.append(term)
                truncated.append(trunc)
                infos.append(info)
        except Exception as err:
            raise env_failure(self._name, "step", err, lane) from err
        return StepBatch(
            observations,
            np.array(rewards, dtype=np.float64),
            np.array(terminated, dtype=np.bool_),
            np.array(truncated, dtype=np.bool_),
            infos,
        )

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
                failure = failure or env_failure(self._name, "close", err, lane)
        if failure is not None:
            raise failure from failure.__cause__

    def __repr__(self) -> str:
        return f"LaneVector({self._name}, num_lanes={self.num_lanes})"


class VectorLanes(Lanes):
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

    def __init__(self, env: VectorEnv[Any, Any, Any]) -> None:
        self._env = env
        self._name = _env_name(env)
        mode = env.metadata.get("autoreset_mode", "NextStep")
        autoreset = _AUTORESET_MODES.get(getattr(mode, "value", mode))
        if autoreset is None:
            raise EnvError(
                f"{self._name} has metadata['autoreset_mode'] = {mode!r}; expected a "
                f"gymnasium.vector.AutoresetMode: NEXT_STEP, SAME_STEP or DISABLED"
            )
        self.autoreset = autoreset
        self.num_lanes = env.num_envs
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        self.accepts_trial_index = _declares_trial_index(env)
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
        checked = _checked_reset(lanes, seeds, trials, self.num_lanes)
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
            options = self._reset_options(trial) or {}
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
        if len(lanes) != self.num_lanes or not np.array_equal(lanes, self._all_lanes):
            raise ValueError(
                f"{self._name} steps all its lanes in lockstep: lanes must be "
                f"0..{self.num_lanes - 1} in order, got {np.asarray(lanes).tolist()}"
            )
        if self.autoreset == DRIVER and self._ended.any():
            raise ValueError(
                f"lanes {np.flatnonzero(self._ended).tolist()} of {self._name} ended and were "
                f"not reset: with AutoresetMode.DISABLED, reset them before the next step"
            )
        try:
            batch, rewards, terminated, truncated, vector_infos = self._env.step(actions)
        except Exception as err:
            raise env_failure(self._name, "step", err) from err
        terminated = np.asarray(terminated, dtype=np.bool_)
        truncated = np.asarray(truncated, dtype=np.bool_)
        ended = terminated | truncated
        result = StepBatch(
            list(iterate(self._env.observation_space, batch)),
            np.asarray(rewards, dtype=np.float64),
            terminated,
            truncated,
            _split_infos(vector_infos, self.num_lanes),
        )
        if self.autoreset == NEXT_STEP:
            result.reset_lanes = self._ended
            self._env_episodes += self._ended
        elif self.autoreset == SAME_STEP:
            self._env_episodes += ended
            result.final_observations = [None] * self.num_lanes
            result.reset_infos = [None] * self.num_lanes
            for lane in np.flatnonzero(ended).tolist():
                # The vector put the new episode's reset info at the top level and nested
                # the ended episode's last observation and info under final_obs / final_info.
                reset_info = result.infos[lane]
                result.final_observations[lane] = reset_info.pop("final_obs", None)
                result.infos[lane] = reset_info.pop("final_info", {})
                result.reset_infos[lane] = reset_info
        self._ended = ended
        return result

    def env_episode_ids(self) -> np.ndarray | None:
        if self.autoreset == DRIVER:
            return None
        return self._env_episodes.copy()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._env.close()
        except Exception as err:
            raise env_failure(self._name, "close", err) from err

    def __repr__(self) -> str:
        return f"VectorLanes({self._name}, num_lanes={self.num_lanes}, autoreset={self.autoreset})"


def make_lanes(
    env: Any, *, num_envs: int | None = None, env_kwargs: Mapping[str, Any] | None = None
) -> Lanes:
    """The lanes for ``env=``: see the module docstring for what each form becomes.

    Args:
        env: a Gymnasium id, a ``gymnasium.Env``, a zero-argument callable returning a
            ``gymnasium.Env``, or a ``gymnasium.vector.VectorEnv``.
        num_envs: how many lanes to build from an id or a factory (default 1). With an env
            instance it may only be 1, with a vector only its ``num_envs``.
        env_kwargs: keyword arguments for ``gymnasium.make``; only with an id.

    Raises:
        EnvError: ``gymnasium.make`` or the factory raised (an unknown id, a bad keyword).
        TypeError: ``env`` is none of the forms above, or the factory returned something
            other than a ``gymnasium.Env``.
        ValueError: ``num_envs < 1``, a ``num_envs`` the env cannot have, ``env_kwargs``
            without an id, or a factory that returned the same env twice.

    Example:
        >>> lanes = make_lanes("Pendulum-v1", num_envs=2, env_kwargs={"g": 9.81})
        >>> lanes
        LaneVector(Pendulum-v1, num_lanes=2)
        >>> lanes.close()
    """
    if num_envs is not None:
        num_envs = count_arg(num_envs, "num_envs")
    if env_kwargs is not None and not isinstance(env, str):
        raise ValueError(
            f"env_kwargs is passed to gymnasium.make, so it needs env= to be a Gymnasium id, "
            f"got {type(env).__name__}: build the env with its arguments yourself"
        )
    if isinstance(env, str):
        kwargs = dict(env_kwargs or {})
        return LaneVector(
            _build(
                lambda: gymnasium.make(env, **kwargs),
                num_envs or 1,
                f"gymnasium.make({env!r})",
                "env= as a str must be an id registered with Gymnasium, e.g. 'CartPole-v1' "
                "(import the package that registers it first)",
            )
        )
    if isinstance(env, VectorEnv):
        if num_envs not in (None, env.num_envs):
            raise ValueError(
                f"env= is a VectorEnv with num_envs={env.num_envs}, but num_envs={num_envs}: "
                f"omit num_envs or build the vector with the lanes you want"
            )
        return VectorLanes(env)
    if isinstance(env, gymnasium.Env):
        if num_envs not in (None, 1):
            raise ValueError(
                f"env= is one gymnasium.Env instance, which is one lane, but num_envs="
                f"{num_envs}: pass a Gymnasium id or a zero-argument factory to build "
                f"{num_envs} lanes"
            )
        return LaneVector([env])
    if callable(env):
        name = getattr(env, "__qualname__", type(env).__name__)
        return LaneVector(
            _build(
                env,
                num_envs or 1,
                f"the env factory {name}()",
                "env= as a callable must build a gymnasium.Env when called with no arguments",
            )
        )
    raise TypeError(f"env= must be {ENV_FORMS}; got {type(env).__name__}")


def _build(
    factory: Callable[[], Any], count: int, what: str, expected: str
) -> list[gymnasium.Env[Any, Any]]:
    """``count`` envs from ``factory``; the ones already built are closed if one fails."""
    envs: list[gymnasium.Env[Any, Any]] = []
    lane_of: dict[int, int] = {}  # id(env) -> its lane, to refuse an env returned twice
    try:
        for lane in range(count):
            try:
                env = factory()
            except Exception as err:
                raise EnvError(
                    f"{what} raised {type(err).__name__} building lane {lane}: {err}; {expected}"
                ) from err
            if not isinstance(env, gymnasium.Env):
                raise TypeError(f"{what} returned {type(env).__name__} for lane {lane}; {expected}")
            other = lane_of.setdefault(id(env), lane)
            if other != lane:
                raise ValueError(
                    f"{what} returned the same env object for lanes {other} and {lane}: "
                    f"a factory must build a new env on every call"
                )
            envs.append(env)
    except BaseException:
        for env in envs:
            env.close()
        raise
    return envs


def _checked_reset(
    lanes: np.ndarray, seeds: Sequence[int | None], trials: Sequence[int | None], num_lanes: int
) -> list[int]:
    lanes_array = vector(lanes, "int64", "lanes")
    same_length("seeds", seeds, lanes_array)
    same_length("trials", trials, lanes_array)
    return check_lanes(lanes_array, num_lanes)


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


def _declares_trial_index(env: gymnasium.Env[Any, Any] | VectorEnv[Any, Any, Any]) -> bool:
    return (getattr(env, "metadata", None) or {}).get(TRIAL_INDEX_FLAG) is True


def _env_name(env: Any) -> str:
    spec = getattr(env, "spec", None)
    return spec.id if spec is not None else type(env).__name__
