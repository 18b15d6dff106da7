"""Per-episode timings are each lane's own: ``EpisodeResult.step_ms`` / ``predict_ms`` and
``StepEvent.step_ms`` / ``predict_ms`` mean the same at 1 lane and at 4, on the core's path
(``run_rounds``) and on the path the driver awaits, on both cores.

Envs and models here sleep for a known time, so every bound below is a lower bound that holds
on any machine (a sleep never ends early) or a generous ratio between two runs of one machine.
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from helpers import CORES, AwaitEveryStep

STEP_S = 0.002
EPISODE_STEPS = 6
# How far apart the 1-lane and the 4-lane figure may be: generous for a loaded machine, and
# far below the 4x of charging each lane the whole round.
FACTOR = 1.5


class SleepyEnv(gym.Env):
    """Each step sleeps ``STEP_S``; every episode is ``EPISODE_STEPS`` steps, reward 1 each."""

    observation_space = gym.spaces.Box(0, 100, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        time.sleep(STEP_S)
        self.t += 1
        return np.array([self.t], np.float32), 1.0, self.t >= EPISODE_STEPS, False, {}


class StepTimes(rlmesh.RunHooks):
    """Keeps every ``StepEvent``'s timings (its listening also makes the driver await)."""

    def __init__(self) -> None:
        self.step_ms: list[float] = []
        self.predict_ms: list[float] = []

    def on_step(self, event):
        assert type(event.step_ms) is float and type(event.predict_ms) is float
        self.step_ms.append(event.step_ms)
        self.predict_ms.append(event.predict_ms)


def sleepy_vector(num_lanes: int) -> gym.vector.SyncVectorEnv:
    return gym.vector.SyncVectorEnv(
        [SleepyEnv] * num_lanes, autoreset_mode=gym.vector.AutoresetMode.DISABLED
    )


def run_on(path: str, num_lanes: int, core: str, model=lambda obs: 0, **kwargs):
    """A run of 8 episodes on ``num_lanes`` sleepy lanes, by the core's rounds (``"core"``),
    awaited round by round (``"awaited"``), or on a vector of them (``"vector"``)."""
    env = sleepy_vector(num_lanes) if path == "vector" else SleepyEnv
    if path != "core":
        kwargs.setdefault("hooks", AwaitEveryStep())
    return rlmesh.run(
        model,
        env,
        episodes=8,
        num_envs=None if path == "vector" else num_lanes,
        core=core,
        close_env=True,
        **kwargs,
    )


def mean_step_ms(result) -> float:
    return float(np.mean([episode.step_ms for episode in result.episodes]))


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("path", ["core", "awaited", "vector"])
def test_an_episodes_step_ms_is_its_own_env_time_at_any_number_of_lanes(core, path):
    one, four = (mean_step_ms(run_on(path, lanes, core)) for lanes in (1, 4))
    assert one >= STEP_S * 1e3 and four >= STEP_S * 1e3
    assert four <= FACTOR * one and one <= FACTOR * four
    for episode in run_on(path, 4, core).episodes:
        # Charged the whole round, a lane would show about 4 sleeps a step.
        assert STEP_S * 1e3 <= episode.step_ms < 2.5 * STEP_S * 1e3 * FACTOR


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("path", ["awaited", "vector"])
def test_a_step_events_timings_are_the_lanes_own(core, path):
    one, four = StepTimes(), StepTimes()
    run_on(path, 1, core, hooks=one)
    run_on(path, 4, core, hooks=four)
    for hooks in (one, four):
        assert len(hooks.step_ms) == 8 * EPISODE_STEPS
        assert min(hooks.step_ms) >= STEP_S * 1e3
    assert np.mean(four.step_ms) <= FACTOR * np.mean(one.step_ms)
    assert np.mean(one.step_ms) <= FACTOR * np.mean(four.step_ms)


class SpeedEnv(SleepyEnv):
    """A ``SleepyEnv`` whose steps take ``extra_s`` longer."""

    def __init__(self, extra_s: float) -> None:
        self.extra_s = extra_s

    def step(self, action):
        time.sleep(self.extra_s)
        return super().step(action)


@pytest.mark.parametrize("core", CORES)
def test_a_lane_the_core_steps_is_charged_its_own_step_not_its_neighbours(core):
    extras = iter([0.0, 0.008])  # lane 0 steps in about 2 ms, lane 1 in about 10 ms
    result = rlmesh.run(
        lambda obs: 0, lambda: SpeedEnv(next(extras)), episodes=4, num_envs=2, core=core
    )
    by_lane = {
        lane: [episode.step_ms for episode in result.episodes if episode.env_index == lane]
        for lane in (0, 1)
    }
    assert by_lane[0] and by_lane[1]
    # Charged a whole round of both lanes, lane 0 would show over 10 ms a step too.
    assert all(STEP_S * 1e3 <= ms < 7.0 for ms in by_lane[0]), by_lane
    assert all(ms >= 10.0 for ms in by_lane[1]), by_lane


class Counting(rlmesh.Model):
    """Counts its calls, each of which sleeps 1 ms; the subclasses below add one corner."""

    stateless = True  # no statefulness probe: every call is one of the run's

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def _call(self) -> None:
        self.calls += 1
        time.sleep(0.001)


class CountingPredict(Counting):
    def predict(self, obs):
        self._call()
        return 0


class CountingBatch(Counting):
    def predict_batch(self, obs):
        self._call()
        return np.zeros(len(obs), np.int64)


class CountingChunks(Counting):
    def predict_chunk_batch(self, obs, execution_horizon=None):
        self._call()
        return np.zeros((len(obs), 3), np.int64)


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("path", ["core", "awaited"])
@pytest.mark.parametrize("model", [CountingPredict, CountingBatch, CountingChunks])
def test_the_predict_shares_of_the_episodes_add_up_to_the_model_time(core, path, model):
    model = model()
    horizon = 3 if isinstance(model, CountingChunks) else 1
    result = run_on(path, 4, core, model=model, execution_horizon=horizon)
    (row,) = [row for row in result.telemetry if row.op == "model.predict"]
    assert row.count == model.calls
    # Every model call's time is charged to the episodes it predicted for, once.
    charged_ms = sum(episode.predict_ms * episode.steps for episode in result.episodes)
    assert charged_ms == pytest.approx(row.avg * row.count, rel=1e-6)
    assert charged_ms >= 1.0 * model.calls  # each call sleeps 1 ms
