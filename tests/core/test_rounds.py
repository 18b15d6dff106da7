"""RoundRunner in both cores: the episode lifecycle, the phases of a round, the synchronous
loop of rounds, and parity.

Runs are driven the way the driver drives them, through the runner alone: ``start`` just
before the resets, then ``set_observations``; rounds either by hand (``begin_round`` /
``take_actions`` / env steps / ``end_round``) or by ``run_rounds``; and for the lanes whose
episode ended, ``finish`` (summaries, evictions, owed model ends), then new episodes on those
lanes. The references are plain Gymnasium loops on the same seeds, and the other core.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from rlmesh._pycore.rounds import lane_actions
from rlmesh.adapters import ModelSpec, State, compile_spec
from rlmesh.core import load_core
from rlmesh.errors import EnvError, ModelError, ModelOutputError
from rlmesh.lanes import LaneVector
from rlmesh.model import ModelHandler

CORES = {"python": load_core("python"), "rust": load_core("rust")}
FAR_FUTURE = 2**62


# ---------------------------------------------------------------------------------------------
# Environments


class CountEnv(gym.Env):
    """Observation ``[t]``, the steps taken; reward 1; terminates after ``length`` steps.

    With ``length=None`` each episode's length (4..9) comes from its reset seed. Every action
    received is kept in ``received``, one list per episode. The info is ``{"t": t}``, plus
    ``"tag": tag`` when the env has a tag.
    """

    observation_space = gym.spaces.Box(0, 1000, (1,), np.float32)
    action_space = gym.spaces.Discrete(1000)

    def __init__(self, length: int | None = None, tag: Any = None) -> None:
        self._length = length
        self.tag = tag
        self.received: list[list[Any]] = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.length = self._length or int(self.np_random.integers(4, 10))
        self.received.append([])
        return np.array([0], np.float32), {}

    def step(self, action):
        self.received[-1].append(action)
        self.t += 1
        done = self.t >= self.length
        info = {"t": self.t} if self.tag is None else {"t": self.t, "tag": self.tag}
        return np.array([self.t], np.float32), 1.0, done, False, info


class SleepyEnv(CountEnv):
    """A ``CountEnv`` whose step takes at least 2 ms."""

    def step(self, action):
        time.sleep(0.002)
        return super().step(action)


class SlowResetEnv(CountEnv):
    """A ``CountEnv`` whose reset takes at least 30 ms."""

    def reset(self, *, seed=None, options=None):
        time.sleep(0.03)
        return super().reset(seed=seed, options=options)


class FailingEnv(CountEnv):
    """A ``CountEnv`` whose step number ``fail_at`` (1-based) raises ``error``."""

    def __init__(self, fail_at: int | None, error: BaseException) -> None:
        super().__init__(length=100)
        self.fail_at, self.error = fail_at, error

    def step(self, action):
        if self.error is not None and self.t + 1 == self.fail_at:
            raise self.error
        return super().step(action)


class ShortResultEnv(CountEnv):
    """A ``CountEnv`` whose step returns the old 4-tuple API."""

    def step(self, action):
        return super().step(action)[:4]


class OddScalarsEnv(CountEnv):
    """A ``CountEnv`` whose rewards and flags are numpy scalars, ints and None, not floats and
    bools: both cores must read them as numpy does."""

    REWARDS = (np.float32(0.25), 2, np.int64(-3), True, np.float16(1.5))

    def step(self, action):
        observation, _, terminated, _, info = super().step(action)
        reward = self.REWARDS[self.t % len(self.REWARDS)]
        return observation, reward, np.bool_(terminated), None if self.t % 2 else 0, info


class DictActionEnv(CountEnv):
    """A ``CountEnv`` whose actions are dicts of a Discrete and a Box."""

    action_space = gym.spaces.Dict(
        {"move": gym.spaces.Discrete(3), "force": gym.spaces.Box(-1, 1, (2,), np.float32)}
    )


class Recorder(gym.Wrapper):
    """Keeps every action the wrapped env's ``step`` receives."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.received: list[Any] = []

    def step(self, action):
        self.received.append(action)
        return self.env.step(action)


# ---------------------------------------------------------------------------------------------
# Driving a run


def cart_pole_policy(payload: np.ndarray, count: int) -> np.ndarray:
    """Push the cart towards the pole's lean: ``[K, 4]`` -> ``[K]`` int64."""
    assert payload.shape == (count, 4)
    return (payload[:, 2] > 0).astype(np.int64)


def pendulum_policy(payload: np.ndarray, count: int) -> np.ndarray:
    """Torque against the angular velocity: ``[K, 3]`` -> ``[K, 1]`` float32."""
    return np.clip(-payload[:, 2:3], -2.0, 2.0).astype(np.float32)


class Run:
    """One run of ``num_lanes`` envs on ``core``: its runner and the driver's steps."""

    def __init__(
        self,
        core,
        make_env: Callable[[], gym.Env],
        num_lanes: int,
        episodes: int,
        *,
        spec: ModelSpec | None = None,
        horizon: int | None = None,
        max_episode_steps: Any = None,
        max_episode_seconds: Any = None,
        base_seed: int = 0,
        overflow: str = "idle",
        now_ns: int | None = None,
    ) -> None:
        self.envs = [make_env() for _ in range(num_lanes)]
        env = self.envs[0]
        plan = compile_spec(spec, env.observation_space, env.action_space)
        self.runner = core.RoundRunner(
            num_lanes,
            episodes,
            plan.observation,
            plan.action,
            execution_horizon=horizon,
            base_seed=base_seed,
            overflow=overflow,
            max_episode_steps=max_episode_steps,
            max_episode_seconds=max_episode_seconds,
        )
        self.stats = [core.LatencyStats() for _ in range(3)]
        self.final_infos: dict[int, Any] = {}  # episode id -> its last info
        self.surplus_starts = 0
        self.start(np.arange(num_lanes), now_ns=now_ns)

    def start(self, lanes, now_ns: int | None = None) -> Any:
        """Start episodes on ``lanes`` (the clock read just before the resets, unless given)
        and reset the lanes that got one, scored or surplus."""
        now = time.perf_counter_ns() if now_ns is None else now_ns
        starts = self.runner.start(np.asarray(lanes, dtype=np.int64), now_ns=now)
        self.surplus_starts += len(starts.surplus_lanes)
        reset = starts.lanes.tolist() + starts.surplus_lanes.tolist()
        seeds = list(starts.seeds) + [None] * len(starts.surplus_lanes)
        observations = [
            self.envs[lane].reset(seed=seed)[0] for lane, seed in zip(reset, seeds, strict=True)
        ]
        self.runner.set_observations(reset, observations)
        return starts

    def finish(self, ended, infos=None) -> Any:
        """Finish the episodes of ``ended`` and start new ones; what ``finish`` returned."""
        finished = self.runner.finish(ended, [None] * len(ended))
        if infos is not None:
            self.final_infos.update(zip(finished[1].tolist(), infos, strict=True))
        self.start(ended)
        return finished

    def round_by_hand(self, policy) -> np.ndarray | None:
        """One round through the phases; the lanes predicted for, None once nothing runs."""
        running, predict_lanes, payload = self.runner.begin_round()
        if not len(running):
            assert payload is None
            return None
        output = None
        if len(predict_lanes):
            output = policy(payload, len(predict_lanes))
        actions = lane_actions(self.runner.take_actions(output, 1_000), len(running))
        results = [self.envs[lane].step(actions[k]) for k, lane in enumerate(running.tolist())]
        observations, rewards, terminated, truncated, infos = zip(*results, strict=True)
        self.runner.set_observations(running, list(observations))
        ended, _ = self.runner.end_round(
            np.array(rewards, dtype=np.float64),
            np.array(terminated, dtype=np.bool_),
            np.array(truncated, dtype=np.bool_),
            2_000,
            time.perf_counter_ns(),
        )
        if len(ended):
            position = {lane: k for k, lane in enumerate(running.tolist())}
            self.finish(ended, [infos[position[lane]] for lane in ended.tolist()])
        return predict_lanes

    def by_hand(self, policy) -> None:
        while self.round_by_hand(policy) is not None:
            pass

    def by_run_rounds(self, policy, until_ns: int = FAR_FUTURE, whole: bool = False) -> list[tuple]:
        """Call ``run_rounds`` until nothing runs; what each call returned. ``whole``: the
        core steps every running lane in one call (as it steps process and remote lanes)
        rather than each lane's env on its own."""
        steps: Any = [env.step for env in self.envs]
        if whole:
            steps = LaneVector(self.envs).step
        returned = []
        while len(self.runner.running_lanes()):
            ended, infos, rounds, lane_steps = run_rounds_of(
                self.runner, policy, steps, "TestEnv-v0", until_ns=until_ns, stats=self.stats
            )
            assert ended.dtype == np.int64
            assert isinstance(infos, list)
            returned.append((ended.tolist(), infos, rounds, lane_steps))
            if len(ended):
                self.finish(ended, infos)
        return returned

    def summaries(self) -> list[tuple]:
        return sorted(
            (s.index, s.seed, s.steps, s.reward, s.terminated, s.truncated)
            for s in self.runner.summaries()
        )


class Batched:
    """A model as ``run_rounds`` takes it, over a batched ``predict(payload, count)``: no
    per-lane corner, and an error it raises propagates as it is."""

    lane_corner = None
    wants_episode_ids = False

    def __init__(self, predict):
        self.predict_now = predict

    def combine(self, outputs, count):
        raise AssertionError("a batched model never combines per-lane outputs")

    def failure(self, error, rounds):
        return error


def run_rounds_of(runner, predict, *args, **kwargs):
    """``runner.run_rounds`` with ``predict(payload, count)`` as the model (or a model, such
    as a ``ModelHandler``, as it is)."""
    model = predict if hasattr(predict, "predict_now") else Batched(predict)
    return runner.run_rounds(model, *args, **kwargs)


def plain_episodes(make_env, seeds, act) -> list[tuple]:
    """``(steps, reward, terminated, truncated)`` per seed from a plain reset/step loop."""
    env = make_env()
    episodes = []
    for seed in seeds:
        observation, _ = env.reset(seed=seed)
        steps, total = 0, 0.0
        while True:
            observation, reward, terminated, truncated, _ = env.step(act(observation))
            steps += 1
            total += float(reward)
            if terminated or truncated:
                break
        episodes.append((steps, total, terminated, truncated))
    return episodes


def outcome(call) -> tuple:
    """What a call did: ``("ok", result)`` or ``("raise", error type, message)``."""
    try:
        return ("ok", call())
    except Exception as err:  # every error must match across cores, whatever it is
        return ("raise", type(err), str(err))


# ---------------------------------------------------------------------------------------------
# 1, 2: whole runs against a plain Gymnasium loop, run_rounds against the phases


ENVS = {
    "CartPole-v1": (lambda: gym.make("CartPole-v1"), cart_pole_policy, 7),
    "Pendulum-v1": (lambda: gym.make("Pendulum-v1"), pendulum_policy, 3),
}


def single(policy):
    """The batched ``policy`` applied to one observation, as the plain loop calls it."""

    def act(observation):
        action = policy(np.asarray(observation, dtype=np.float32)[None], 1)[0]
        return int(action) if action.ndim == 0 else action

    return act


@pytest.mark.parametrize("env_id", list(ENVS))
@pytest.mark.parametrize("num_lanes", [1, 3])
def test_a_run_through_the_phases_matches_a_plain_gymnasium_loop(core, env_id, num_lanes):
    make_env, policy, episodes = ENVS[env_id]
    run = Run(core, make_env, num_lanes, episodes)
    run.by_hand(policy)

    seeds = [core.episode_seed(0, slot) for slot in range(episodes)]
    expected = plain_episodes(make_env, seeds, single(policy))
    assert run.summaries() == [
        (slot, seed, *episode)
        for slot, (seed, episode) in enumerate(zip(seeds, expected, strict=True))
    ]
    assert run.runner.done
    assert run.runner.rounds > 0


@pytest.mark.parametrize("env_id", list(ENVS))
@pytest.mark.parametrize("num_lanes", [1, 3])
def test_run_rounds_gives_the_summaries_of_the_phases(core, env_id, num_lanes):
    make_env, policy, episodes = ENVS[env_id]
    by_hand = Run(core, make_env, num_lanes, episodes)
    by_hand.by_hand(policy)
    looped = Run(core, make_env, num_lanes, episodes)
    returned = looped.by_run_rounds(policy)

    assert looped.summaries() == by_hand.summaries()
    assert looped.runner.rounds == by_hand.runner.rounds == sum(r[2] for r in returned)
    # Each call stopped at a round where an episode ended, and said which lanes ended.
    assert all(ended for ended, *_ in returned)
    assert sum(len(ended) for ended, *_ in returned) == len(looped.runner.summaries())
    lane_steps = sum(summary.steps for summary in looped.runner.summaries())
    assert sum(r[3] for r in returned) == lane_steps


@pytest.mark.parametrize("env_id", list(ENVS))
@pytest.mark.parametrize("num_lanes", [1, 3])
def test_run_rounds_stepping_every_lane_in_one_call_gives_the_summaries_of_the_phases(
    core, env_id, num_lanes
):
    make_env, policy, episodes = ENVS[env_id]
    by_hand = Run(core, make_env, num_lanes, episodes)
    by_hand.by_hand(policy)
    looped = Run(core, make_env, num_lanes, episodes)
    returned = looped.by_run_rounds(policy, whole=True)

    assert looped.summaries() == by_hand.summaries()
    assert looped.runner.rounds == by_hand.runner.rounds == sum(r[2] for r in returned)
    assert all(ended for ended, *_ in returned)
    # Each lane-step was timed: the one call's time shared by the lanes it stepped.
    lane_steps = sum(summary.steps for summary in looped.runner.summaries())
    assert sum(r[3] for r in returned) == lane_steps == looped.stats[1].count
    assert all(summary.step_ms > 0 for summary in looped.runner.summaries())


# ---------------------------------------------------------------------------------------------
# 2: parity of the two cores


def parity_record(core_name: str, scenario: str) -> dict[str, Any]:
    """Everything observable of one scenario's run on one core."""
    core = CORES[core_name]
    payloads: list[Any] = []

    def recorded(policy):
        def predict(payload, count):
            payloads.append((np.array(payload), count))
            return policy(payload, count)

        return predict

    if scenario == "cart-pole":
        run = Run(core, lambda: Recorder(gym.make("CartPole-v1")), 3, 8, max_episode_steps=30)
        predict = recorded(cart_pole_policy)
    elif scenario == "pendulum":
        run = Run(core, lambda: Recorder(gym.make("Pendulum-v1")), 2, 3, max_episode_steps=50)
        predict = recorded(pendulum_policy)
    else:  # chunked and stacked, odd step results
        run = Run(
            core,
            lambda: Recorder(OddScalarsEnv()),
            3,
            9,
            spec=ModelSpec(input=State(stack=3)),
            horizon=3,
            max_episode_steps=7,
        )
        predict = recorded(
            lambda payload, count: (payload[:, -1, :] * 10 + np.arange(5)).astype(np.int64)
        )
    returned = run.by_run_rounds(predict)
    lanes = np.arange(len(run.envs))
    return {
        "summaries": [
            {k: v for k, v in s.to_dict().items() if k not in ("duration_s", "predict_ms")}
            | {"step_ms": None}
            for s in run.runner.summaries()
        ],
        "returned": returned,
        "payloads": [(p.dtype.str, p.shape, p.tobytes(), count) for p, count in payloads],
        "received": [
            [(type(a).__name__, np.asarray(a).dtype.str, np.asarray(a).tobytes()) for a in r]
            for r in (env.received for env in run.envs)
        ],
        "rounds": run.runner.rounds,
        "lane_episodes": [
            part if isinstance(part, list) else part.tolist()
            for part in run.runner.lane_episodes(lanes)
        ],
        "snapshot": {k: v for k, v in run.runner.snapshot().items() if k != "summaries"},
        "stats": [stats.count for stats in run.stats],
        "final_infos": run.final_infos,
        "repr": repr(run.runner),
    }


@pytest.mark.parametrize("scenario", ["cart-pole", "pendulum", "chunked-stacked-odd-scalars"])
def test_both_cores_run_the_same_rounds(scenario):
    python, rust = parity_record("python", scenario), parity_record("rust", scenario)
    assert rust["summaries"] == python["summaries"]
    assert rust["payloads"] == python["payloads"]
    assert rust["received"] == python["received"]
    assert rust["returned"] == python["returned"]
    assert rust == python
    assert python["stats"][0] == len(python["payloads"])
    # env.step is timed per lane-step, driver.round per round.
    assert python["stats"][1] == sum(lane_steps for *_, lane_steps in python["returned"])
    assert python["stats"][2] == python["rounds"]


def test_odd_scalars_are_read_as_numpy_reads_them(core):
    run = Run(core, OddScalarsEnv, 1, 1)
    run.by_run_rounds(lambda payload, count: np.zeros(count, np.int64))
    (summary,) = run.runner.summaries()
    rewards = [float(OddScalarsEnv.REWARDS[t % 5]) for t in range(1, summary.steps + 1)]
    assert (summary.steps, summary.reward, summary.terminated) == (
        run.envs[0].length,
        sum(rewards),
        True,
    )


# ---------------------------------------------------------------------------------------------
# 3: caps


def test_max_episode_steps_truncates_at_exactly_the_cap(core):
    run = Run(core, lambda: gym.make("CartPole-v1"), 2, 4, max_episode_steps=5)
    run.by_run_rounds(cart_pole_policy)
    assert [(s.steps, s.terminated, s.truncated) for s in run.runner.summaries()] == [
        (5, False, True)
    ] * 4


@pytest.mark.parametrize(
    ("length", "cap", "expected"),
    [
        (5, 5, (5, True, False)),  # terminated at the cap: stays terminated, not truncated
        (6, 5, (5, False, True)),
        (4, 5, (4, True, False)),
        (6, np.int64(3), (3, False, True)),  # a numpy integer is a cap like any other
    ],
)
def test_an_episode_that_terminates_at_the_cap_is_not_truncated(core, length, cap, expected):
    run = Run(core, lambda: CountEnv(length), 1, 1, max_episode_steps=cap)
    run.by_run_rounds(lambda payload, count: np.zeros(count, np.int64))
    (summary,) = run.runner.summaries()
    assert (summary.steps, summary.terminated, summary.truncated) == expected


def test_max_episode_seconds_truncates_at_exactly_the_time_given_to_end_round(core):
    run = Run(core, lambda: CountEnv(100), 2, 3, max_episode_seconds=0.01, now_ns=1_000)
    runner = run.runner
    # 1 ns short of the cap: lane 0 runs on; lane 1 terminates, and a cap reached on the same
    # step would not have truncated it.
    runner.begin_round()
    runner.take_actions(np.zeros(2, np.int64), 0)
    ended, flags = runner.end_round([1.0, 1.0], [False, True], [False, False], 5, 10_000_999)
    assert (ended.tolist(), flags.dtype, flags.tolist()) == ([1], np.bool_, [False, False])
    # Finished later, it still lasted from its start to its last step's return.
    (first,), _, _ = runner.finish(ended, [None])
    assert (first.steps, first.terminated, first.duration_s) == (
        1,
        True,
        (10_000_999 - 1_000) / 1e9,
    )
    run.start([1], now_ns=10_000_999)  # lane 1's next episode has a clock of its own
    running, _, _ = runner.begin_round()
    assert running.tolist() == [0, 1]
    runner.take_actions(np.zeros(2, np.int64), 0)
    ended, flags = runner.end_round([1.0, 1.0], [False, False], [False, False], 5, 10_001_000)
    assert (ended.tolist(), flags.tolist()) == ([0], [True, False])
    assert runner.lane_episodes([0, 1])[2].tolist() == [2, 1]
    (capped,), _, _ = runner.finish(ended, [None])
    assert (capped.steps, capped.terminated, capped.truncated) == (2, False, True)
    assert capped.duration_s == 0.01  # exactly the cap: (10_001_000 - 1_000) ns


def test_a_step_and_a_model_call_over_several_lanes_are_charged_to_each_in_shares(core):
    run = Run(core, CountEnv, 3, 3, horizon=2, now_ns=0)
    runner = run.runner

    def step(predict_ns: int, step_ns: int, *, last: bool) -> np.ndarray:
        """One round of the 3 lanes, each predicted for with a chunk of 2 actions or
        replaying one; the episodes terminate on the ``last`` one."""
        running, predict_lanes, payload = runner.begin_round()
        output = None if payload is None else np.zeros((len(predict_lanes), 2), np.int64)
        runner.take_actions(output, predict_ns)
        count = len(running)
        ended, _ = runner.end_round([1.0] * count, [last] * count, [False] * count, step_ns, 1)
        return ended

    # One model call of 8 ns for 3 lanes, one step of 10 ns over them: equal shares, the
    # remainder's nanoseconds to the first lanes, so each adds up to the whole.
    step(8, 10, last=False)
    # The lanes replay their chunk's second action: no model time is charged.
    ended = step(5, 6, last=True)
    summaries, _, _ = runner.finish(ended, [None] * len(ended))
    charged = {
        summary.env_index: (summary.step_ms * 1e6 * 2, summary.predict_ms * 1e6 * 2)
        for summary in summaries
    }
    assert charged == {
        0: pytest.approx((4 + 2, 3 + 0)),
        1: pytest.approx((3 + 2, 3 + 0)),
        2: pytest.approx((3 + 2, 2 + 0)),
    }


def test_max_episode_seconds_truncates_by_the_clock_in_run_rounds(core):
    run = Run(core, lambda: SleepyEnv(1000), 1, 1, max_episode_seconds=0.02)
    run.by_run_rounds(lambda payload, count: np.zeros(count, np.int64))
    (summary,) = run.runner.summaries()
    assert (summary.terminated, summary.truncated) == (False, True)
    # Each step takes at least 2 ms, so 20 ms have passed after 10 steps at the latest (and
    # the clock's anchor may lag by a hair), and not before 20 ms by the episode's clock.
    assert 1 <= summary.steps <= 11
    assert summary.duration_s >= 0.02


def test_duration_and_max_episode_seconds_both_count_the_reset(core):
    """One clock per lane, from ``start`` (just before the reset) to the last step's return:
    a 30 ms reset alone passes a 20 ms cap, so the first step truncates the episode, and its
    duration holds the reset."""
    before = time.perf_counter_ns()
    run = Run(core, lambda: SlowResetEnv(1000), 1, 2, max_episode_seconds=0.02)
    run.by_run_rounds(lambda payload, count: np.zeros(count, np.int64))
    after = time.perf_counter_ns()
    summaries = run.runner.summaries()
    assert [(s.steps, s.terminated, s.truncated) for s in summaries] == [(1, False, True)] * 2
    for summary in summaries:
        assert 0.03 <= summary.duration_s <= (after - before) / 1e9


# ---------------------------------------------------------------------------------------------
# 4, 5: chunks and frame stacks


def chunk_policy(horizon: int):
    """A chunk ``[P, horizon]`` whose action j at step t is ``10 * t + j``: which chunk and
    which of its actions an env received is readable from the action."""

    def predict(payload, count):
        steps = payload.reshape(count, -1)[:, -1:]
        return (steps * 10 + np.arange(horizon)).astype(np.int64)

    return predict


def expected_actions(length: int, kept: int) -> list[int]:
    """What a lane replays over an episode of ``length`` steps, ``kept`` actions per chunk."""
    return [10 * (t - t % kept) + t % kept for t in range(length)]


@pytest.mark.parametrize("num_lanes", [1, 3])
def test_chunks_are_predicted_only_for_empty_queues_and_replayed_in_order(core, num_lanes):
    run = Run(core, CountEnv, num_lanes, 10, horizon=3)
    policy = chunk_policy(horizon=4)  # H' = 4 > E = 3: each lane keeps 3 actions per chunk
    predicted = []
    while True:
        queued = run.runner.snapshot()["queued"]
        running = run.runner.running_lanes().tolist()
        predict_lanes = run.round_by_hand(policy)
        if predict_lanes is None:
            break
        assert predict_lanes.tolist() == [lane for lane in running if queued[lane] == 0]
        predicted.append(len(predict_lanes))

    lengths = [len(actions) for env in run.envs for actions in env.received if actions]
    assert sum(predicted) == sum(math.ceil(length / 3) for length in lengths)
    # The model time (1000 ns a call, see round_by_hand) is shared among the lanes predicted
    # for, and charged to predicted steps only: every call's time, and no more, is charged.
    calls = sum(1 for count in predicted if count)
    charged = [summary.predict_ms * 1e6 * summary.steps for summary in run.runner.summaries()]
    assert sum(charged) == pytest.approx(1_000 * calls)
    for summary, predict_ns in zip(run.runner.summaries(), charged, strict=True):
        decisions = math.ceil(summary.steps / 3)
        assert 1_000 // num_lanes * decisions <= round(predict_ns) <= 1_000 * decisions
    for env in run.envs:
        for actions in env.received:
            # Every episode starts with the first action of a fresh chunk: nothing leaks over
            # from the lane's previous episode, whose chunk was cut short.
            assert [int(action) for action in actions] == expected_actions(len(actions), 3)


def test_run_rounds_replays_chunks_and_predicts_only_when_a_queue_runs_dry(core):
    calls = []
    policy = chunk_policy(horizon=2)

    def predict(payload, count):
        calls.append(count)
        return policy(payload, count)

    run = Run(core, CountEnv, 3, 9, horizon=5)  # E = 5 > H' = 2: chunks of 2 are kept whole
    run.by_run_rounds(predict)
    lengths = [len(actions) for env in run.envs for actions in env.received if actions]
    assert sum(calls) == sum(math.ceil(length / 2) for length in lengths)
    assert run.stats[0].count == len(calls) < run.stats[2].count == run.runner.rounds
    assert run.stats[1].count == sum(lengths)  # env.step: one per lane-step
    for env in run.envs:
        for actions in env.received:
            assert [int(action) for action in actions] == expected_actions(len(actions), 2)


def test_actions_past_the_execution_horizon_are_never_applied(core):
    def predict(payload, count):
        chunk = chunk_policy(3)(payload, count)
        chunk[:, 2] = 5_000  # not an action of Discrete(1000): only checked if applied
        return chunk

    run = Run(core, CountEnv, 2, 4, horizon=2)
    run.by_run_rounds(predict)
    for env in run.envs:
        for actions in env.received:
            assert [int(action) for action in actions] == expected_actions(len(actions), 2)
    run = Run(core, CountEnv, 2, 4, horizon=3)
    with pytest.raises(ModelOutputError) as raised:
        run.by_run_rounds(predict)
    # The third action of the chunk planned at step 0 is the one for step 2.
    assert str(raised.value) == (
        "lane 0 (episode index 0, step 2): action is 5000; expected an integer in 0..999 for "
        "Discrete int64[]"
    )


def test_a_lane_restarted_after_finish_predicts_afresh(core):
    """``finish`` drops the ended episode's queue: the lane's next episode does not replay the
    two actions left of the last chunk, it asks the model for its own."""
    run = Run(core, lambda: CountEnv(2), 1, 2, horizon=4)
    steps = [env.step for env in run.envs]
    calls = []

    def predict(payload, count):
        calls.append(payload[:, 0].tolist())
        return chunk_policy(4)(payload, count)

    ended, *_ = run_rounds_of(
        run.runner, predict, steps, "TestEnv-v0", until_ns=FAR_FUTURE, stats=run.stats
    )
    assert ended.tolist() == [0] and run.runner.snapshot()["queued"] == [2]
    run.finish(ended)
    assert run.runner.snapshot()["queued"] == [0]
    ended, *_ = run_rounds_of(
        run.runner, predict, steps, "TestEnv-v0", until_ns=FAR_FUTURE, stats=run.stats
    )
    assert ended.tolist() == [0]
    assert calls == [[0.0], [0.0]]  # once per episode, each from its first observation
    assert [[int(a) for a in actions] for actions in run.envs[0].received] == [[0, 1], [0, 1]]


@pytest.mark.parametrize("use_run_rounds", [False, True], ids=["phases", "run_rounds"])
def test_replaying_lanes_still_push_their_frames(core, use_run_rounds):
    payloads = []

    def predict(payload, count):
        payloads.append(np.array(payload))
        return chunk_policy(3)(payload, count)

    run = Run(core, CountEnv, 3, 6, spec=ModelSpec(input=State(stack=3)), horizon=3)
    if use_run_rounds:
        run.by_run_rounds(predict)
    else:
        run.by_hand(predict)
    rows = [row[:, 0].tolist() for payload in payloads for row in payload]
    assert {row[-1] for row in rows} >= {0.0, 3.0}
    for row in rows:
        # Predicted at steps 0, 3, 6, ...: the two frames between were pushed while the lane
        # replayed, so the stack holds consecutive frames (the first frame fills a new one).
        t = row[-1]
        assert row == [max(t - 2, 0.0), max(t - 1, 0.0), t]


# ---------------------------------------------------------------------------------------------
# 6: when run_rounds stops, and what it returns


def test_run_rounds_runs_one_round_when_the_deadline_has_passed(core):
    run = Run(core, lambda: CountEnv(50), 3, 3)
    steps = [env.step for env in run.envs]
    for expected_rounds in (1, 2, 3):
        ended, infos, rounds, lane_steps = run_rounds_of(
            run.runner,
            lambda payload, count: np.zeros(count, np.int64),
            steps,
            "TestEnv-v0",
            until_ns=0,
            stats=run.stats,
        )
        assert (ended.tolist(), infos, rounds, lane_steps) == ([], [], 1, 3)
        assert run.runner.rounds == expected_rounds
        # model.predict and driver.round once a round, env.step once a lane-step.
        counts = [stats.count for stats in run.stats]
        assert counts == [expected_rounds, 3 * expected_rounds, expected_rounds]
    assert run.runner.lane_episodes([0, 1, 2])[2].tolist() == [3, 3, 3]
    assert [obs.tolist() for obs in run.runner.observations([2, 0])] == [[3.0], [3.0]]


def test_run_rounds_stops_at_its_deadline_by_the_perf_counter(core):
    run = Run(core, lambda: SleepyEnv(1000), 1, 1)
    until_ns = time.perf_counter_ns() + 30_000_000
    ended, infos, rounds, lane_steps = run_rounds_of(
        run.runner,
        lambda payload, count: np.zeros(count, np.int64),
        [env.step for env in run.envs],
        "TestEnv-v0",
        until_ns=until_ns,
        stats=run.stats,
    )
    # No round starts once one ended at or after until_ns, a time.perf_counter_ns() reading.
    assert time.perf_counter_ns() >= until_ns
    assert ended.tolist() == [] and infos == []
    assert 1 <= rounds <= 16 and lane_steps == rounds
    assert run.stats[2].count == rounds
    assert run.stats[1].snapshot()["avg_ns"] >= 2_000_000  # every step slept 2 ms


@pytest.mark.parametrize("until_ns", [2**70, np.int64(FAR_FUTURE)])
def test_run_rounds_takes_any_integer_deadline(core, until_ns):
    run = Run(core, lambda: CountEnv(4), 1, 1)
    returned = run.by_run_rounds(lambda payload, count: np.zeros(count, np.int64), until_ns)
    assert returned == [([0], [{"t": 4}], 4, 4)]


@pytest.mark.parametrize("until_ns", [math.inf, float(FAR_FUTURE), True, "soon"])
def test_run_rounds_refuses_a_deadline_that_is_not_an_integer(core, until_ns):
    run = Run(core, lambda: CountEnv(4), 1, 1)
    with pytest.raises(TypeError) as raised:
        run.by_run_rounds(lambda payload, count: np.zeros(count, np.int64), until_ns)
    assert str(raised.value) == (
        f"until_ns must be an integer time.perf_counter_ns() reading, got {until_ns!r}"
    )
    assert run.runner.rounds == 0


def test_run_rounds_returns_the_lanes_that_ended_and_their_final_infos_in_order(core):
    lanes = iter(enumerate([3, 5, 3, 4]))
    run = Run(core, lambda: CountEnv(*reversed(next(lanes))), 4, 8)
    calls = []

    def predict(payload, count):
        calls.append(count)
        return np.zeros(count, np.int64)

    ended, infos, rounds, lane_steps = run_rounds_of(
        run.runner,
        predict,
        [env.step for env in run.envs],
        "TestEnv-v0",
        until_ns=FAR_FUTURE,
        stats=run.stats,
    )
    assert ended.dtype == np.int64
    assert (ended.tolist(), rounds, lane_steps) == ([0, 2], 3, 12)
    assert infos == [{"t": 3, "tag": 0}, {"t": 3, "tag": 2}]
    assert calls == [4, 4, 4]
    assert [stats.count for stats in run.stats] == [3, 12, 3]  # env.step once a lane-step
    assert run.stats[0].max_ns > 0 and run.stats[2].max_ns >= run.stats[1].max_ns


def test_run_rounds_with_no_running_lane_does_nothing(core):
    run = Run(core, lambda: CountEnv(3), 2, 2)
    run.by_run_rounds(lambda payload, count: np.zeros(count, np.int64))
    rounds = run.runner.rounds

    def predict(payload, count):
        raise AssertionError("no lane runs")

    ended, infos, ran, lane_steps = run_rounds_of(
        run.runner, predict, [], "TestEnv-v0", until_ns=0, stats=run.stats
    )
    assert (ended.dtype, ended.tolist(), infos, ran, lane_steps) == (np.int64, [], [], 0, 0)
    assert run.runner.rounds == rounds
    assert run.runner.begin_round()[0].tolist() == []
    lane_steps = sum(summary.steps for summary in run.runner.summaries())
    assert [stats.count for stats in run.stats] == [rounds, lane_steps, rounds]


def test_begin_round_returns_int64_lanes_and_the_payload_of_the_predicted_lanes(core):
    run = Run(core, CountEnv, 2, 2, horizon=2)
    running, predict_lanes, payload = run.runner.begin_round()
    assert (running.dtype, predict_lanes.dtype) == (np.int64, np.int64)
    assert (running.tolist(), predict_lanes.tolist()) == ([0, 1], [0, 1])
    assert payload.dtype == np.float32 and payload.tolist() == [[0.0], [0.0]]
    actions = run.runner.take_actions(chunk_policy(2)(payload, 2), 7)
    assert actions.dtype == np.int64 and actions.tolist() == [0, 0]
    run.runner.end_round([0.0, 0.0], [False, False], [False, False], 3, 0)
    running, predict_lanes, payload = run.runner.begin_round()  # both lanes replay
    assert (running.tolist(), predict_lanes.tolist(), payload) == ([0, 1], [], None)
    assert run.runner.take_actions(None, 0).tolist() == [1, 1]
    assert repr(run.runner) == "RoundRunner(num_lanes=2, rounds=1)"


# ---------------------------------------------------------------------------------------------
# 7: errors


def failing_run(core, error: BaseException, fail_at: int = 3) -> Run:
    errors = iter([None, error])
    return Run(core, lambda: FailingEnv(fail_at, next(errors)), 2, 2)


def run_rounds(run: Run, predict=None, **kwargs):
    kwargs = {"until_ns": FAR_FUTURE, "stats": run.stats} | kwargs
    return run_rounds_of(
        run.runner,
        predict or (lambda payload, count: np.zeros(count, np.int64)),
        [env.step for env in run.envs],
        "Failing-v0",
        **kwargs,
    )


def test_an_env_step_that_raises_becomes_an_env_error_with_the_cause_chained(core):
    error = ValueError("boom at step 3")
    run = failing_run(core, error)
    with pytest.raises(EnvError) as raised:
        run_rounds(run)
    assert str(raised.value) == "lane 1 (Failing-v0): step() raised ValueError: boom at step 3"
    assert raised.value.__cause__ is error
    # The round's earlier lanes stepped; the failing round was not recorded.
    assert [len(env.received[-1]) for env in run.envs] == [3, 2]
    assert run.runner.rounds == 2


def test_a_step_result_that_does_not_unpack_is_the_envs_error(core):
    run = Run(core, ShortResultEnv, 1, 1)
    with pytest.raises(EnvError) as raised:
        run_rounds(run)
    assert str(raised.value) == (
        "lane 0 (Failing-v0): step() raised ValueError: not enough values to unpack "
        "(expected 5, got 4)"
    )
    assert isinstance(raised.value.__cause__, ValueError)


def test_too_few_env_steps_is_the_envs_error_of_the_lane_without_one(core):
    run = failing_run(core, ValueError("unused"))
    with pytest.raises(EnvError) as raised:
        run_rounds_of(
            run.runner,
            lambda payload, count: np.zeros(count, np.int64),
            [run.envs[0].step],
            "Failing-v0",
            until_ns=FAR_FUTURE,
            stats=run.stats,
        )
    assert str(raised.value) == (
        "lane 1 (Failing-v0): step() raised IndexError: list index out of range"
    )


@pytest.mark.parametrize(
    "error", [KeyboardInterrupt(), SystemExit(3)], ids=["KeyboardInterrupt", "SystemExit"]
)
def test_a_base_exception_from_an_env_step_propagates_unchanged(core, error):
    run = failing_run(core, error, fail_at=2)
    with pytest.raises(type(error)) as raised:
        run_rounds(run)
    assert raised.value is error
    assert run.runner.rounds == 1


def test_errors_from_the_model_and_its_output_propagate_unchanged(core):
    run = failing_run(core, ValueError("unused"))
    error = RuntimeError("the model broke")

    def broken(payload, count):
        raise error

    with pytest.raises(RuntimeError) as raised:
        run_rounds(run, broken)
    assert raised.value is error
    with pytest.raises(ModelOutputError) as wrong:
        run_rounds(run, lambda payload, count: np.zeros(count + 1, np.int64))
    assert str(wrong.value).startswith("action: expected 2 rows (one per lane)")
    assert run.runner.rounds == 0


def runner_on(core, **caps):
    run = Run(core, lambda: CountEnv(10), 2, 2, **caps)
    return run, run.runner


BAD_ARGUMENTS = {
    "lane out of range": (
        lambda runner: runner.lane_episodes([2]),
        "lane 2 is out of range for 2 lanes",
    ),
    "start on a lane out of range": (
        lambda runner: runner.start([2], now_ns=0),
        "lane 2 is out of range: this route has lanes 0..1",
    ),
    "start on a running lane": (
        lambda runner: runner.start([1], now_ns=0),
        "lane 1 still holds running episode 1: complete it before starting another",
    ),
    "finish a lane out of range": (
        lambda runner: runner.finish([3], [None]),
        "lane 3 is out of range for 2 lanes",
    ),
    "finish a running lane": (
        lambda runner: runner.finish([0], [None]),
        "lane 0 episode 0 is still running: only lanes end_round returned as ended may be finished",
    ),
    "finish a lane twice in one call": (
        lambda runner: runner.finish([1, 1], [None, None]),
        "lane 1 appears twice in lanes",
    ),
    "finish with too few successes": (
        lambda runner: runner.finish([0, 1], [None]),
        "successes has 1 entries for 2 lanes",
    ),
    "episode ids of a lane out of range": (
        lambda runner: runner.episode_ids([2]),
        "lane 2 is out of range: this route has lanes 0..1",
    ),
    "rolls of mismatched lengths": (
        lambda runner: runner.observe_rolls([0, 1], [0], now_ns=0),
        "env_episode_ids has 1 entries but lanes has 2",
    ),
    "negative lane": (
        lambda runner: runner.observations([-1]),
        "lane -1 is out of range for 2 lanes",
    ),
    "lanes not 1-D": (
        lambda runner: runner.lane_episodes([[0]]),
        "lanes must be a 1-D array, got shape (1, 1)",
    ),
    "lanes not integers": (
        lambda runner: runner.set_observations([0.5], [None]),
        "lanes must hold integers, got dtype float64",
    ),
    "now_ns not an int": (
        lambda runner: runner.start([0], now_ns="soon"),
        "now_ns must be an integer in [-2**63, 2**63), got str",
    ),
    "too few observations": (
        lambda runner: runner.set_observations([0, 1], [np.zeros(1, np.float32)]),
        "observations has 1 entries for 2 lanes",
    ),
    "predict_ns not an int": (
        lambda runner: runner.take_actions(np.zeros(2, np.int64), 1.5),
        "predict_ns must be an integer in [-2**63, 2**63), got float",
    ),
    "negative predict_ns": (
        lambda runner: runner.take_actions(np.zeros(2, np.int64), -1),
        "predict_ns must be a duration in nanoseconds (>= 0), got -1",
    ),
}


@pytest.mark.parametrize("case", list(BAD_ARGUMENTS))
def test_bad_arguments_are_refused_with_the_same_message(core, case):
    call, message = BAD_ARGUMENTS[case]
    _, runner = runner_on(core)
    runner.begin_round()
    before = runner.snapshot()
    with pytest.raises(ValueError) as raised:
        call(runner)
    assert str(raised.value) == message
    assert runner.snapshot() == before


END_ROUND_ARGUMENTS = {
    "short rewards": (([1.0], [0, 0], [0, 0], 0, 0), "rewards has 1 entries for 2 running lanes"),
    "long terminated": (
        ([1.0, 1.0], [0, 0, 0], [0, 0], 0, 0),
        "terminated has 3 entries for 2 running lanes",
    ),
    "rewards not 1-D": (
        ([[1.0], [1.0]], [0, 0], [0, 0], 0, 0),
        "rewards must be a 1-D array, got shape (2, 1)",
    ),
    "rewards not numbers": (
        (["a", "b"], [0, 0], [0, 0], 0, 0),
        "rewards must hold numbers, got dtype <U1",
    ),
    "step_ns not an int": (
        ([1.0, 1.0], [0, 0], [0, 0], 2.5, 0),
        "step_ns must be an integer in [-2**63, 2**63), got float",
    ),
    "now_ns past int64": (
        ([1.0, 1.0], [0, 0], [0, 0], 0, 2**63),
        "now_ns must be an integer in [-2**63, 2**63), got 9223372036854775808",
    ),
    "negative step_ns": (
        ([1.0, 1.0], [0, 0], [0, 0], -1, 0),
        "step_ns must be a duration in nanoseconds (>= 0), got -1",
    ),
}


@pytest.mark.parametrize("case", list(END_ROUND_ARGUMENTS))
def test_end_round_refuses_bad_step_results_with_the_same_message(core, case):
    args, message = END_ROUND_ARGUMENTS[case]
    _, runner = runner_on(core)
    running, _, _ = runner.begin_round()
    runner.take_actions(np.zeros(len(running), np.int64), 0)
    with pytest.raises(ValueError) as raised:
        runner.end_round(*args)
    assert str(raised.value) == message
    assert runner.rounds == 0


@pytest.mark.parametrize(
    ("caps", "message"),
    [
        ({"max_episode_steps": 0}, "max_episode_steps must be None or a positive integer, got 0"),
        (
            {"max_episode_steps": 2.5},
            "max_episode_steps must be None or a positive integer, got 2.5",
        ),
        ({"max_episode_steps": -3}, "max_episode_steps must be None or a positive integer, got -3"),
        (
            {"max_episode_steps": True},
            "max_episode_steps must be None or a positive integer, got True",
        ),
        (
            {"max_episode_steps": "5"},
            "max_episode_steps must be None or a positive integer, got '5'",
        ),
        (
            {"max_episode_seconds": 0.0},
            "max_episode_seconds must be None or a positive number, got 0.0",
        ),
        (
            {"max_episode_seconds": math.nan},
            "max_episode_seconds must be None or a positive number, got nan",
        ),
    ],
)
def test_a_cap_that_is_not_positive_is_refused(core, caps, message):
    with pytest.raises(ValueError) as raised:
        runner_on(core, **caps)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("stats", "error", "message"),
    [
        (2, ValueError, "not enough values to unpack (expected 3, got 2)"),
        (None, TypeError, "cannot unpack non-iterable NoneType object"),
    ],
)
def test_stats_must_be_three(core, stats, error, message):
    run, _ = runner_on(core)
    value = None if stats is None else run.stats[:stats]
    with pytest.raises(error) as raised:
        run_rounds(run, stats=value)
    assert str(raised.value) == message


COUNT_PLAN = compile_spec(None, CountEnv.observation_space, CountEnv.action_space)
CONSTRUCTOR_ARGUMENTS = {
    "no lanes": ((0, 2, COUNT_PLAN.observation, COUNT_PLAN.action), {}),
    "episodes not an integer": ((2, "2", COUNT_PLAN.observation, COUNT_PLAN.action), {}),
    "an observation plan that is not a list of leaves": ((2, 2, 5, COUNT_PLAN.action), {}),
    "an action plan of observation leaves": (
        (2, 2, COUNT_PLAN.observation, COUNT_PLAN.observation),
        {},
    ),
    "a zero execution horizon": (
        (2, 2, COUNT_PLAN.observation, COUNT_PLAN.action),
        {"execution_horizon": 0},
    ),
    "a negative seed": (
        (2, 2, COUNT_PLAN.observation, COUNT_PLAN.action),
        {"seeds": [1, -1]},
    ),
    "indices out of order": (
        (2, 4, COUNT_PLAN.observation, COUNT_PLAN.action),
        {"indices": [2, 1]},
    ),
    "an unknown overflow": (
        (2, 2, COUNT_PLAN.observation, COUNT_PLAN.action),
        {"overflow": "bursting"},
    ),
    "overflow None": ((2, 2, COUNT_PLAN.observation, COUNT_PLAN.action), {"overflow": None}),
    "overflow not a str": ((2, 2, COUNT_PLAN.observation, COUNT_PLAN.action), {"overflow": 1}),
    # The overflow is checked first, whatever else is wrong.
    "an unknown overflow and no lanes": (
        (0, 2, COUNT_PLAN.observation, COUNT_PLAN.action),
        {"overflow": "lockstep"},
    ),
    "a bad plan and a bad cap": (
        (2, 2, COUNT_PLAN.observation, None),
        {"max_episode_steps": 0},
    ),
}


@pytest.mark.parametrize("case", list(CONSTRUCTOR_ARGUMENTS))
def test_the_constructor_refuses_bad_arguments_alike_in_both_cores(case):
    args, kwargs = CONSTRUCTOR_ARGUMENTS[case]
    python = outcome(lambda: CORES["python"].RoundRunner(*args, **kwargs))
    rust = outcome(lambda: CORES["rust"].RoundRunner(*args, **kwargs))
    assert python[0] == "raise"
    assert rust == python


@pytest.mark.parametrize("overflow", ["bursting", None, 1, "Idle"])
def test_an_unknown_overflow_is_refused(core, overflow):
    with pytest.raises(ValueError) as raised:
        core.RoundRunner(2, 2, COUNT_PLAN.observation, COUNT_PLAN.action, overflow=overflow)
    assert str(raised.value) == f"overflow must be 'idle' or 'surplus', got {overflow!r}"


def test_the_rust_runner_takes_only_the_rust_cores_latency_stats(core):
    """The Rust runner records into the Rust core's stats only; the Python one takes either."""
    other = CORES["python" if core is CORES["rust"] else "rust"]
    run = Run(core, CountEnv, 1, 1)
    stats = [run.stats[0], other.LatencyStats(), run.stats[2]]
    if core is CORES["python"]:
        run_rounds(run, stats=stats)
        assert stats[1].count == run.runner.rounds
        return
    with pytest.raises(TypeError) as raised:
        run_rounds(run, stats=stats)
    assert str(raised.value) == (
        "stats[1] must be a LatencyStats from the same core (rlmesh._core), got "
        "rlmesh._pycore.telemetry.LatencyStats"
    )


def test_the_runner_arguments_are_keyword_only_where_python_has_them_so(core):
    run, runner = runner_on(core)
    with pytest.raises(TypeError):
        runner.start([0], 0)
    with pytest.raises(TypeError):
        runner.observe_rolls([0], [0], 0)
    with pytest.raises(TypeError):
        run_rounds_of(run.runner, lambda p, k: None, [], "x", FAR_FUTURE, run.stats)
    with pytest.raises(TypeError):
        core.RoundRunner(2, 2, COUNT_PLAN.observation, COUNT_PLAN.action, 5)


# ---------------------------------------------------------------------------------------------
# 8: action spaces


def test_a_dict_action_reaches_each_env_as_its_own_dict(core):
    run = Run(core, lambda: DictActionEnv(3), 2, 2)

    def predict(payload, count):
        steps = payload[:, 0]
        return {
            "move": (steps % 3).astype(np.int64),
            "force": np.stack([steps / 10, -steps / 10], axis=1),
        }

    run.by_run_rounds(predict)
    for env in run.envs:
        (actions,) = env.received
        assert [sorted(action) for action in actions] == [["force", "move"]] * 3
        assert [int(action["move"]) for action in actions] == [0, 1, 2]
        for t, action in enumerate(actions):
            assert isinstance(action["force"], np.ndarray)
            assert action["force"].dtype == np.float32 and action["force"].shape == (2,)
            assert action["force"].tolist() == [np.float32(t / 10), np.float32(-t / 10)]


def test_a_box_action_reaches_the_env_as_its_row(core):
    run = Run(core, lambda: Recorder(gym.make("Pendulum-v1")), 2, 2, max_episode_steps=4)
    payloads = []

    def predict(payload, count):
        payloads.append(np.array(payload))
        return pendulum_policy(payload, count)

    run.by_run_rounds(predict)
    expected = [pendulum_policy(payload, len(payload)) for payload in payloads]
    for lane, env in enumerate(run.envs):
        assert len(env.received) == 4
        for action, batch in zip(env.received, expected, strict=True):
            assert isinstance(action, np.ndarray)
            assert action.dtype == np.float32 and action.shape == (1,)
            assert action.tolist() == batch[lane].tolist()


def test_a_discrete_action_reaches_the_env_as_a_numpy_integer(core):
    run = Run(core, lambda: CountEnv(2), 1, 1)
    run.by_run_rounds(lambda payload, count: np.full(count, 7, np.int64))
    (actions,) = run.envs[0].received
    assert [(type(action), int(action)) for action in actions] == [(np.int64, 7)] * 2


# ---------------------------------------------------------------------------------------------
# The model as run_rounds calls it: ModelHandler's predict_now, lane_corner, combine, failure


def loaded(model) -> ModelHandler:
    handler = ModelHandler(model)
    asyncio.run(handler.load())
    return handler


PER_LANE_OUTPUTS = {
    "python int": lambda t: int(t) % 3,
    "python float": lambda t: float(t % 3),
    "python bool": lambda t: t % 2 == 0,
    "numpy int64": lambda t: np.int64(t % 3),
    "numpy float32": lambda t: np.float32(t % 3),
    "0-d array": lambda t: np.array(t % 3),
    "1-element list": lambda t: [int(t) % 3],
}


@pytest.mark.parametrize("kind", PER_LANE_OUTPUTS)
def test_a_per_lane_corner_is_called_per_row_and_stacked_as_predict_now_stacks(core, kind):
    """Per-lane outputs of every plain form reach the envs as ``predict_now`` would make them,
    and the core's stacking is the Python core's ``np.asarray``."""
    make = PER_LANE_OUTPUTS[kind]
    seen = []

    def policy(observation):
        seen.append(np.array(observation))
        return make(int(observation[0]))

    run = Run(core, lambda: CountEnv(5), 3, 5)
    run.by_run_rounds(loaded(policy))
    by_hand = Run(core, lambda: CountEnv(5), 3, 5)
    reference = loaded(lambda observation: make(int(observation[0])))
    by_hand.by_hand(lambda payload, count: reference.predict_now(payload, count))
    assert [env.received for env in run.envs] == [env.received for env in by_hand.envs]
    assert all(observation.shape == (1,) for observation in seen)
    assert len(seen) == sum(len(actions) for env in run.envs for actions in env.received)


def test_a_per_lane_corner_returning_too_big_an_int_fails_as_the_action_it_is(core):
    run = Run(core, lambda: CountEnv(5), 2, 2)
    with pytest.raises(ModelOutputError) as raised:
        run.by_run_rounds(loaded(lambda observation: 2**70))
    reference = Run(core, lambda: CountEnv(5), 2, 2)
    with pytest.raises(ModelOutputError) as expected:
        reference.by_hand(loaded(lambda observation: 2**70).predict_now)
    assert str(raised.value) == str(expected.value)


@pytest.mark.parametrize("spec", [None, ModelSpec(input=State(stack=3))], ids=["plain", "stacked"])
def test_a_per_lane_corner_gets_each_lanes_input_as_an_array_of_its_own(core, spec):
    """``run_rounds`` hands a per-lane corner each lane's input as an array that owns its
    data, not a view into one batch of every lane's input, so what a model keeps holds only
    its own lane's input, and later rounds never write into it. The values are the rows of
    the payload the phases give, frame windows included."""
    seen = []

    def policy(observation):
        seen.append(observation)
        return int(observation.ravel()[-1]) % 3

    Run(core, lambda: CountEnv(5), 3, 5, spec=spec).by_run_rounds(loaded(policy))
    rows = []

    def batched(payload, count):
        rows.extend(np.array(row) for row in payload)
        return np.array([int(row.ravel()[-1]) % 3 for row in payload])

    Run(core, lambda: CountEnv(5), 3, 5, spec=spec).by_hand(batched)
    assert all(observation.base is None and observation.flags.owndata for observation in seen)
    assert all(obs.flags.c_contiguous and obs.flags.writeable for obs in seen)
    assert [(o.dtype, o.shape, o.tolist()) for o in seen] == [
        (row.dtype, row.shape, row.tolist()) for row in rows
    ]


class SpaceEnv(CountEnv):
    """A ``CountEnv`` with the action space it is given."""

    def __init__(self, action_space: gym.Space) -> None:
        super().__init__(length=5)
        self.action_space = action_space


DISCRETE_SPACES = {
    "Discrete(3)": gym.spaces.Discrete(3),
    "start=-1": gym.spaces.Discrete(3, start=-1),
    # Past the integers float64 holds exactly: the applier's float64 comparison decides.
    "start=2**60": gym.spaces.Discrete(3, start=2**60),
    "int32": gym.spaces.Discrete(3, dtype=np.int32),
}


@pytest.mark.parametrize("space", DISCRETE_SPACES)
@pytest.mark.parametrize("offset", [0, 2, 3, -1], ids=["first", "last", "past", "before"])
def test_per_lane_ints_reach_a_discrete_env_as_take_actions_makes_them(core, space, offset):
    """A per-lane corner's plain ints become env actions without a batch in between where the
    space allows it: the envs receive exactly the values and types ``take_actions`` makes of
    the stacked ints, and a value out of range fails with its message (lane, episode, step)."""
    action_space = DISCRETE_SPACES[space]

    def act(observation):
        # In range for the first steps, then `offset` from the space's start.
        return action_space.start + (offset if observation[0] >= 2 else 1)

    def received(run):
        return [
            [(type(action), int(action)) for actions in env.received for action in actions]
            for env in run.envs
        ]

    run = Run(core, lambda: SpaceEnv(action_space), 2, 4)
    fast = outcome(lambda: run.by_run_rounds(loaded(act)) and received(run))
    by_hand = Run(core, lambda: SpaceEnv(action_space), 2, 4)
    reference = loaded(act)
    expected = outcome(
        lambda: (
            by_hand.by_hand(lambda payload, count: reference.predict_now(payload, count))
            or received(by_hand)
        )
    )
    assert fast == expected
    if space == "start=2**60":
        return  # whatever the float64 comparison makes of it, as above
    if offset in (0, 2):
        assert fast[0] == "ok"
        assert {kind for lane in fast[1] for kind, _ in lane} == {action_space.dtype.type}
    else:
        assert fast[0] == "raise" and fast[1] is ModelOutputError
        assert "lane 0 (episode index 0, step 2)" in fast[2]


class Fails(rlmesh.Model):
    """Raises ``error`` on its third call, through the corner ``corner``."""

    def __init__(self, error: BaseException, corner: str) -> None:
        super().__init__()
        self.error, self.calls = error, 0
        setattr(self, corner, self._call)

    def _call(self, observation):
        self.calls += 1
        if self.calls == 3:
            raise self.error
        return np.zeros(len(observation), np.int64) if observation.ndim == 2 else 0


@pytest.mark.parametrize("corner", ["predict", "predict_batch"])
def test_a_model_error_is_raised_as_the_model_failure_naming_the_corner_and_round(core, corner):
    error = RuntimeError("the model broke")
    run = Run(core, lambda: CountEnv(10), 1, 1)
    with pytest.raises(ModelError) as raised:
        run.by_run_rounds(loaded(Fails(error, corner)))
    assert str(raised.value) == f"model.{corner} raised RuntimeError('the model broke') at round 2"
    assert raised.value.__cause__ is error


@pytest.mark.parametrize(
    "error",
    [ModelOutputError("lane 0: wrong"), KeyboardInterrupt()],
    ids=["an RlmeshError", "a BaseException"],
)
def test_a_typed_or_base_model_error_propagates_as_it_is(core, error):
    run = Run(core, lambda: CountEnv(10), 1, 1)
    with pytest.raises(type(error)) as raised:
        run.by_run_rounds(loaded(Fails(error, "predict")))
    assert raised.value is error


def test_a_plain_corner_returning_an_awaitable_is_refused(core):
    async def later():
        return 0

    run = Run(core, lambda: CountEnv(10), 2, 2)
    with pytest.raises(ModelError, match=r"declare it `async def`") as raised:
        run.by_run_rounds(loaded(lambda observation: later()))
    assert isinstance(raised.value.__cause__, TypeError)


def test_finish_evicts_windows_and_queues_and_owes_each_model_end_once(core):
    lengths = iter([1, 3])
    run = Run(
        core, lambda: CountEnv(next(lengths)), 2, 4, spec=ModelSpec(State(stack=2)), horizon=4
    )
    runner = run.runner
    runner.begin_round()
    runner.take_actions(chunk_policy(4)(np.zeros((2, 2, 1)), 2), 0)
    ended, _ = runner.end_round([1.0, 1.0], [True, False], [False, False], 5, 0)
    assert ended.tolist() == [0]
    before = runner.snapshot()
    assert (before["frame_windows"], before["queued"]) == (2, [3, 3])
    # A refused call finishes nothing: lane 1 is still running.
    with pytest.raises(ValueError, match="lane 1 episode 1 is still running"):
        runner.finish([0, 1], [True, None])
    assert runner.snapshot() == before

    summaries, episode_ids, model_ends = runner.finish(ended, [True])
    assert [(s.index, s.episode_id, s.success) for s in summaries] == [(0, 0, True)]
    assert (episode_ids.dtype, episode_ids.tolist(), model_ends.tolist()) == (np.int64, [0], [0])
    after = runner.snapshot()
    assert (after["frame_windows"], after["queued"]) == (1, [0, 3])
    assert after["lanes"][0]["state"] == "vacant"
    # Finished already: nothing is owed twice, and only the running episode is owed at the end.
    summaries, episode_ids, model_ends = runner.finish(ended, [True])
    assert (summaries, episode_ids.tolist(), model_ends.tolist()) == ([], [-1], [])
    assert runner.take_all_model_ends().tolist() == [1]
    assert runner.take_all_model_ends().tolist() == []
    with pytest.raises(ValueError, match="lanes must be a 1-D array"):
        runner.finish([[1]], [None])


def test_finish_gives_the_summaries_of_scored_episodes_only(core):
    """On a lockstep-like use (every lane stepped every round, ``overflow="surplus"``), the
    lanes restarted once the slots are spent run surplus episodes: stepped, counted as waste,
    finished silently, never scored; the run is done when every scored episode finished."""
    run = Run(core, lambda: CountEnv(3), 3, 4, overflow="surplus")
    runner = run.runner
    finished = []
    while not runner.done:
        ended, *_ = run_rounds(run)
        assert runner.running_lanes().tolist() == []  # every lane ends on the same round
        summaries, episode_ids, _ = run.finish(ended)
        finished.append((len(summaries), len(episode_ids)))
    assert finished == [(3, 3), (1, 3)]
    assert run.surplus_starts == 2 + 3  # two in the second wave, and the restart after it
    assert sorted(s.index for s in runner.summaries()) == [0, 1, 2, 3]
    assert runner.wasted_steps == 2 * 3
    indices, seeds, steps = runner.lane_episodes([0, 1, 2])
    assert (indices.tolist(), seeds, steps.tolist()) == ([-1] * 3, [None] * 3, [0] * 3)


def test_lane_episodes_says_what_each_lane_holds(core):
    run = Run(core, lambda: CountEnv(3), 3, 2, base_seed=7)
    runner = run.runner
    indices, seeds, steps = runner.lane_episodes([2, 0, 1, 0])
    expected_seeds = [core.episode_seed(7, 0), core.episode_seed(7, 1)]
    assert (indices.dtype, steps.dtype) == (np.int64, np.int64)
    # Lane 2 found no slot left: it is idle and holds nothing.
    assert (indices.tolist(), seeds, steps.tolist()) == (
        [-1, 0, 1, 0],
        [None, expected_seeds[0], expected_seeds[1], expected_seeds[0]],
        [0, 0, 0, 0],
    )
    run_rounds(run, until_ns=0)
    assert runner.lane_episodes([0, 1])[2].tolist() == [1, 1]
    assert runner.lane_episodes(np.zeros(0, np.int64))[1] == []


def test_a_chunk_given_as_nested_lists_is_replayed_as_its_array(core):
    as_array = Run(core, lambda: CountEnv(6), 2, 4, horizon=3)
    as_array.by_run_rounds(chunk_policy(3))
    as_lists = Run(core, lambda: CountEnv(6), 2, 4, horizon=3)
    as_lists.by_run_rounds(lambda payload, count: chunk_policy(3)(payload, count).tolist())
    assert [env.received for env in as_lists.envs] == [env.received for env in as_array.envs]


class WantsIds(Batched):
    """A batched model that wants each predicted lane's episode id: records them."""

    wants_episode_ids = True

    def __init__(self):
        self.seen: list[list[int]] = []

    def predict_now(self, payload, count, episode_ids):
        assert episode_ids.dtype == np.int64 and len(episode_ids) == count
        self.seen.append(episode_ids.tolist())
        return np.zeros(count, np.int64)


def test_a_model_that_wants_episode_ids_gets_those_of_the_lanes_it_predicts_for(core):
    run = Run(core, lambda: CountEnv(3), 2, 4)
    model = WantsIds()
    run.by_run_rounds(model)
    # Two waves of two episodes (ids 0, 1 then 2, 3), three steps each.
    assert model.seen == [[0, 1]] * 3 + [[2, 3]] * 3


def test_a_runner_may_be_freed_on_another_thread(core):
    """The last reference to a run's core objects may go on any thread: the cyclic garbage
    collector frees a finished run wherever it happens to run."""
    run = Run(core, lambda: CountEnv(3), 2, 2, spec=ModelSpec(input=State(stack=2)))
    held = [run]
    del run
    freeing = threading.Thread(target=held.clear)
    freeing.start()
    freeing.join()
    assert held == []
