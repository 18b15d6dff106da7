"""The driver end to end: real Gymnasium envs, both cores, exact and reproducible episodes."""

from __future__ import annotations

import math
import time
from typing import ClassVar

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from gymnasium.wrappers import FrameStackObservation
from helpers import AUTORESET_MODES, CORES, AwaitEveryStep, cartpole_policy, comparable
from rlmesh.adapters import ModelSpec, State
from rlmesh.errors import EnvError, HookError, ModelOutputError, OperationTimeout
from rlmesh.model import QUICK_PROBE_CALLS


def acrobot_policy(obs):
    return int(np.sign(obs[5]) + 1)


def pendulum_policy(obs):
    return np.clip(np.array([-2.0 * obs[2]], dtype=np.float32), -2, 2)


POLICIES = {
    "CartPole-v1": cartpole_policy,
    "Acrobot-v1": acrobot_policy,
    "Pendulum-v1": pendulum_policy,
}


def plain_gymnasium_loop(env_id, policy, seeds, max_episode_steps=None):
    """The reference: reset with each seed, step to done, in a plain loop."""
    env = gym.make(env_id, max_episode_steps=max_episode_steps)
    threshold = gym.spec(env_id).reward_threshold
    episodes = []
    for index, seed in enumerate(seeds):
        obs, _ = env.reset(seed=seed)
        steps, reward, done = 0, 0.0, False
        while not done:
            obs, step_reward, terminated, truncated, _ = env.step(policy(obs))
            steps, reward, done = steps + 1, reward + float(step_reward), terminated or truncated
        episodes.append(
            {
                "index": index,
                "seed": seed,
                "trial": index,
                "steps": steps,
                "reward": reward,
                "terminated": bool(terminated),
                "truncated": bool(truncated),
                # No env here reports success: the spec's reward_threshold judges, if any.
                "success": None if threshold is None else reward >= threshold,
                "success_reported": False,
            }
        )
    env.close()
    return episodes


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("num_envs", [1, 3, 8])
@pytest.mark.parametrize("episodes", [2, 8, 13])
def test_exactly_the_episodes_asked_for_seeded_by_index(core, num_envs, episodes):
    result = rlmesh.run(
        cartpole_policy, "CartPole-v1", episodes=episodes, num_envs=num_envs, seed=7, core=core
    )
    assert [episode.index for episode in result.episodes] == list(range(episodes))
    assert [episode.seed for episode in result.episodes] == [
        rlmesh.episode_seed(7, index) for index in range(episodes)
    ]
    assert result.num_episodes == episodes
    assert result.base_seed == 7
    assert result.wasted_steps == 0
    assert result.total_steps == sum(episode.steps for episode in result.episodes)


@pytest.mark.parametrize("env_id", sorted(POLICIES))
def test_results_equal_a_plain_gymnasium_loop_for_every_lane_count_and_core(env_id):
    policy = POLICIES[env_id]
    seeds = [3, 1, 4, 1, 5, 9]
    reference = plain_gymnasium_loop(env_id, policy, seeds, max_episode_steps=120)
    for core in CORES:
        for num_envs in (1, 3, 8):
            result = rlmesh.run(
                policy, env_id, seeds=seeds, num_envs=num_envs, max_episode_steps=120, core=core
            )
            # The plain loop keeps no digests (tests/core/test_digests.py checks them).
            digests = ("reset_digest", "trajectory_digest")
            assert comparable(result, drop=("env_index", *digests)) == reference, (core, num_envs)


class ActionLog(gym.Env):
    """Records every action it receives; episodes last `length` steps (10 + seed % 7)."""

    observation_space = gym.spaces.Box(-1e6, 1e6, (2,), np.float32)
    action_space = gym.spaces.Discrete(100_000)
    received: ClassVar[list[tuple[int, int]]] = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.seed_value, self.t = seed, 0
        self.length = 10 + seed % 7
        return np.array([seed, 0], np.float32), {}

    def step(self, action):
        ActionLog.received.append((self.seed_value, int(action)))
        self.t += 1
        done = self.t >= self.length
        return np.array([self.seed_value, self.t], np.float32), 1.0, done, False, {}


class CountingChunker(rlmesh.Model):
    """Returns chunks whose actions encode when they were planned: step * 100 + offset."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def predict_chunk_batch(self, obs, execution_horizon=None):
        self.calls += len(obs)
        horizon = execution_horizon or 1
        return (obs[:, 1:2] * 100 + np.arange(horizon)).astype(np.int64)


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("horizon", [1, 3, 4])
def test_chunks_are_replayed_per_lane_and_never_cross_an_episode(core, horizon):
    results = []
    for num_envs in (1, 3, 8):
        ActionLog.received = []
        model = CountingChunker()
        result = rlmesh.run(
            model,
            ActionLog,
            seeds=list(range(9)),
            num_envs=num_envs,
            execution_horizon=horizon,
            core=core,
        )
        # The model is called ceil(steps / H) times per episode (plus the statefulness probe's
        # quick check, this model being deterministic, when lanes share it).
        probe_calls = QUICK_PROBE_CALLS if num_envs > 1 else 0
        planned = sum(math.ceil(e.steps / horizon) for e in result.episodes)
        assert model.calls == planned + probe_calls
        # Step t of every episode plays offset t % H of the chunk planned at step H * (t // H):
        # chunks replay in order, and a new episode starts from a fresh chunk.
        per_seed: dict[int, list[int]] = {}
        for seed, action in ActionLog.received:
            per_seed.setdefault(seed, []).append(action)
        assert sorted(per_seed) == list(range(9))
        for seed, actions in per_seed.items():
            expected = [horizon * (t // horizon) * 100 + t % horizon for t in range(len(actions))]
            assert actions == expected, seed
        results.append(comparable(result))
    assert results[0] == results[1] == results[2]


class StackRecorder(rlmesh.Model):
    """Records what it is given: a stack of the last 3 CartPole observations."""

    spec = ModelSpec(input=State(stack=3, dtype="float64"))

    def __init__(self):
        super().__init__()
        self.seen: list[np.ndarray] = []

    def predict(self, obs):
        self.seen.append(np.array(obs))
        return int(obs[-1][2] > 0)


@pytest.mark.parametrize("core", CORES)
def test_frame_stacks_match_gymnasium_frame_stack_as_the_model_sees_them(core):
    model = StackRecorder()
    result = rlmesh.run(model, "CartPole-v1", seeds=[11, 12], num_envs=1, core=core)
    reference = FrameStackObservation(gym.make("CartPole-v1"), 3, padding_type="reset")
    expected = []
    for seed in (11, 12):
        obs, _ = reference.reset(seed=seed)
        done = False
        while not done:
            expected.append(obs)
            obs, _, terminated, truncated, _ = reference.step(int(obs[-1][2] > 0))
            done = terminated or truncated
    assert len(model.seen) == len(expected) == result.total_steps
    for seen, wanted in zip(model.seen, expected, strict=True):
        np.testing.assert_allclose(seen, wanted, rtol=0, atol=0)


@pytest.mark.parametrize("core", CORES)
def test_max_episode_steps_truncates_exactly_at_the_cap(core):
    result = rlmesh.run(lambda obs: 0, "Pendulum-v1", episodes=3, max_episode_steps=17, core=core)
    outcomes = [(e.steps, e.truncated, e.terminated) for e in result.episodes]
    assert outcomes == [(17, True, False)] * 3


class SlowEnv(gym.Env):
    observation_space = gym.spaces.Box(0, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        time.sleep(0.01)
        return np.zeros(1, np.float32), 0.0, False, False, {}


def test_max_episode_seconds_truncates_by_wall_clock():
    result = rlmesh.run(lambda obs: 0, SlowEnv, episodes=2, max_episode_seconds=0.1)
    for episode in result.episodes:
        assert episode.truncated and not episode.terminated
        assert 5 <= episode.steps <= 15
        assert episode.duration_s >= 0.1


class BatchOnly(rlmesh.Model):
    def __init__(self):
        super().__init__()
        self.batch_sizes: list[int] = []

    def predict_batch(self, obs):
        self.batch_sizes.append(len(obs))
        return (obs[:, 2] + 0.3 * obs[:, 3] > 0).astype(np.int64)


class PredictOnly(rlmesh.Model):
    def predict(self, obs):
        return cartpole_policy(obs)


class ChunkOnly(rlmesh.Model):
    def predict_chunk(self, obs, execution_horizon=None):
        return np.array([cartpole_policy(obs)])


@pytest.mark.parametrize("core", CORES)
def test_every_corner_alone_drives_the_same_run(core):
    runs = {
        "callable": rlmesh.run(cartpole_policy, "CartPole-v1", episodes=5, num_envs=3, core=core),
        "predict": rlmesh.run(PredictOnly(), "CartPole-v1", episodes=5, num_envs=3, core=core),
        "batch": rlmesh.run(BatchOnly(), "CartPole-v1", episodes=5, num_envs=3, core=core),
        "chunk": rlmesh.run(ChunkOnly(), "CartPole-v1", episodes=5, num_envs=3, core=core),
    }
    reference = comparable(runs["callable"], drop=())
    for name, result in runs.items():
        assert comparable(result, drop=()) == reference, name


def test_the_batched_corner_gets_only_the_lanes_that_need_an_action():
    model = BatchOnly()
    result = rlmesh.run(model, "CartPole-v1", episodes=5, num_envs=3)
    # One call per round (after the probe's one-lane calls); never more lanes than are
    # running; fewer once lanes go idle.
    assert model.batch_sizes[:QUICK_PROBE_CALLS] == [1] * QUICK_PROBE_CALLS
    assert sum(model.batch_sizes[QUICK_PROBE_CALLS:]) == result.total_steps
    assert max(model.batch_sizes) == 3 and min(model.batch_sizes) < 3


class LastObservationModel(rlmesh.Model):
    """Keeps the previous observation across calls: its output depends on the call before."""

    def __init__(self):
        super().__init__()
        self.last = np.zeros(4)

    def predict(self, obs):
        action = int(obs[2] - self.last[2] > 0)
        self.last = np.asarray(obs)
        return action


def test_a_stateful_model_is_refused_when_lanes_share_it():
    with pytest.raises(rlmesh.StatefulModelError, match=r"num_envs=1"):
        rlmesh.run(LastObservationModel(), "CartPole-v1", episodes=4, num_envs=2)
    # One lane: nothing is shared, so the same model runs.
    single_lane = rlmesh.run(LastObservationModel(), "CartPole-v1", episodes=2, num_envs=1)
    assert single_lane.num_episodes == 2


class NoisyPure(rlmesh.Model):
    def predict(self, obs):
        return int(obs[2] + np.random.normal(0, 0.01) > 0)


def test_a_noisy_but_pure_model_is_accepted():
    assert rlmesh.run(NoisyPure(), "CartPole-v1", episodes=4, num_envs=3).num_episodes == 4


class Recorder(rlmesh.RunHooks):
    def __init__(self, fail_at=None):
        self.events: list[tuple] = []
        self.fail_at = fail_at

    def on_run_start(self, context):
        self.events.append(("run_start",))

    def on_episode_start(self, *, episode, seed):
        self.events.append(("episode_start", episode, seed))

    def on_step(self, event):
        self.events.append(("step", event.episode, event.step))
        if self.fail_at is not None and len(self.events) >= self.fail_at:
            raise RuntimeError("hook failed on purpose")

    def on_episode_end(self, result):
        self.events.append(("episode_end", result.index))

    def on_run_end(self, result):
        self.events.append(("run_end", result.num_episodes))


@pytest.mark.parametrize("core", CORES)
def test_hooks_fire_once_each_in_order(core):
    hooks = Recorder()
    result = rlmesh.run(
        cartpole_policy, "CartPole-v1", episodes=5, num_envs=2, hooks=hooks, core=core
    )
    kinds = [event[0] for event in hooks.events]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end" and kinds.count("run_end") == 1
    assert sorted(e[1] for e in hooks.events if e[0] == "episode_start") == list(range(5))
    assert sorted(e[1] for e in hooks.events if e[0] == "episode_end") == list(range(5))
    assert kinds.count("step") == result.total_steps
    for index in range(5):
        events = [e for e in hooks.events if len(e) > 1 and e[1] == index and e[0] != "run_end"]
        assert events[0][0] == "episode_start" and events[-1][0] == "episode_end"
        steps = [e[2] for e in events if e[0] == "step"]
        assert steps == list(range(1, result.episodes[index].steps + 1))


class WrongShape(rlmesh.Model):
    def __init__(self, good_steps):
        super().__init__()
        self.calls, self.good_steps, self.closed = 0, good_steps, False

    def predict_batch(self, obs):
        self.calls += 1
        if self.calls > self.good_steps:
            return np.zeros((len(obs), 3))
        return (obs[:, 2] > 0).astype(np.int64)

    def close(self):
        self.closed = True


class BreaksAtStep(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)
    closed = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        if BreakCounter.total >= 25:
            raise RuntimeError("the simulator crashed")
        BreakCounter.total += 1
        return np.zeros(1, np.float32), 1.0, self.t >= 5, False, {}

    def close(self):
        BreaksAtStep.closed += 1


class BreakCounter:
    total = 0


@pytest.mark.parametrize("core", CORES)
def test_a_wrong_action_shape_fails_typed_with_the_partial_result(core):
    model = WrongShape(good_steps=300)
    hooks = Recorder()
    with pytest.raises(ModelOutputError, match=r"lane|rows") as raised:
        rlmesh.run(model, "CartPole-v1", episodes=50, num_envs=1, hooks=hooks, core=core)
    partial = raised.value.partial_result
    assert partial.num_episodes >= 1
    assert [e.index for e in partial.episodes] == list(range(partial.num_episodes))
    assert model.closed
    assert [e[0] for e in hooks.events].count("run_end") == 1


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("with_step_hook", [False, True])
def test_an_env_raising_fails_as_env_error_and_closes_the_envs(core, with_step_hook):
    BreakCounter.total, BreaksAtStep.closed = 0, 0
    # Without a step hook the core runs the rounds; with one, the driver awaits each step.
    hooks = Recorder() if with_step_hook else None
    with pytest.raises(EnvError) as raised:
        rlmesh.run(lambda obs: 0, BreaksAtStep, episodes=20, num_envs=2, core=core, hooks=hooks)
    assert str(raised.value).startswith(
        "lane 1 (BreaksAtStep): step() raised RuntimeError: the simulator crashed"
    )
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert raised.value.partial_result.num_episodes == 4  # 25 steps of 2 lanes, 5 per episode
    assert BreaksAtStep.closed == 2


@pytest.mark.parametrize("core", CORES)
def test_a_hook_raising_stops_the_run_with_hook_error(core):
    hooks = Recorder(fail_at=10)
    with pytest.raises(HookError, match=r"Recorder\.on_step raised"):
        rlmesh.run(cartpole_policy, "CartPole-v1", episodes=3, hooks=hooks, core=core)
    assert hooks.events[-1][0] == "run_end"


def test_a_hung_step_times_out():
    with pytest.raises(OperationTimeout, match=r"env.step took longer than its 0.001 s limit"):
        rlmesh.run(lambda obs: 0, SlowEnv, episodes=1, timeouts={"step": 0.001})


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("mode", AUTORESET_MODES)
def test_a_lockstep_vector_scores_exactly_and_reports_waste(core, mode):
    vector = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1") for _ in range(4)], autoreset_mode=mode
    )
    hooks = Recorder()
    result = rlmesh.run(
        cartpole_policy, vector, episodes=6, seed=5, hooks=hooks, core=core, close_env=True
    )
    assert [e.index for e in result.episodes] == list(range(6))
    assert result.wasted_steps > 0
    assert sorted(e[1] for e in hooks.events if e[0] == "episode_end") == list(range(6))
    if mode == gym.vector.AutoresetMode.DISABLED:
        # The driver resets every lane itself, so every episode is seeded by its index.
        assert [e.seed for e in result.episodes] == [rlmesh.episode_seed(5, k) for k in range(6)]
    else:
        seeded = [rlmesh.episode_seed(5, k) for k in range(4)]
        assert [e.seed for e in result.episodes][:4] == seeded
        assert all(e.seed is None for e in result.episodes[4:])


def test_bad_arguments_are_refused_with_what_was_expected():
    with pytest.raises(ValueError, match="episodes must be a positive integer, got 0"):
        rlmesh.run(cartpole_policy, "CartPole-v1", episodes=0)
    with pytest.raises(ValueError, match="execution_horizon must be a positive integer"):
        rlmesh.run(cartpole_policy, "CartPole-v1", execution_horizon=0)
    with pytest.raises(ValueError, match=r"timeouts has unknown operations \['think'\]"):
        rlmesh.run(cartpole_policy, "CartPole-v1", timeouts={"think": 1})


class Stream(rlmesh.RuntimeHooks):
    """Records the runtime event stream; optionally breaks an observer or a transform."""

    def __init__(self, *, broken_observer=False, broken_transform=False):
        self.events: list[str] = []
        self.broken_observer, self.broken_transform = broken_observer, broken_transform
        self.snapshots = 0

    def session_started(self, context):
        self.events.append("session_started")

    def session_ended(self, result):
        self.events.append("session_ended")

    def session_failed(self, error, partial_result):
        self.events.append("session_failed")

    def episode_started(self, *, episode, seed):
        self.events.append("episode_started")

    def episode_completed(self, result):
        self.events.append("episode_completed")

    def observation_emitted(self, *, lanes, observation):
        self.events.append("observation_emitted")

    def action_received(self, *, lanes, action):
        self.events.append("action_received")
        if self.broken_observer:
            raise RuntimeError("observer broke")

    def step_completed(self, event):
        self.events.append("step_completed")

    def telemetry_snapshot(self, rows):
        self.snapshots += 1

    def transform_action(self, action):
        if self.broken_transform:
            raise RuntimeError("transform broke")
        return action


@pytest.mark.parametrize("core", CORES)
def test_the_runtime_event_stream_is_complete_and_ordered(core):
    stream = Stream()
    result = rlmesh.run(
        SlowStart(),
        "CartPole-v1",
        episodes=3,
        num_envs=2,
        hooks=[stream],
        core=core,
        telemetry_window=0.005,
    )
    events = stream.events
    assert events[0] == "session_started" and events[-1] == "session_ended"
    assert events.count("episode_started") == events.count("episode_completed") == 3
    # One fused observation and one applied action per round; one completion per lane-step.
    assert events.count("observation_emitted") == events.count("action_received")
    assert events.count("step_completed") == result.total_steps
    assert events.index("episode_started") < events.index("observation_emitted")
    assert stream.snapshots >= 1
    assert result.observer_errors == 0
    # Every dispatch to a hook is timed: the "hooks" op counts at least one per event.
    (hooks_row,) = [row for row in result.telemetry if row.op == "hooks"]
    assert hooks_row.count >= len(events)


class SlowStart(rlmesh.Model):
    """A CartPole policy slow enough (1 ms per call) for telemetry windows to pass."""

    def predict(self, obs):
        time.sleep(0.001)
        return cartpole_policy(obs)


def test_an_observer_that_raises_is_logged_and_the_run_goes_on(caplog):
    stream = Stream(broken_observer=True)
    with caplog.at_level("ERROR", logger="rlmesh"):
        result = rlmesh.run(cartpole_policy, "CartPole-v1", episodes=2, hooks=stream)
    assert result.num_episodes == 2
    failures = [r for r in caplog.records if "Stream.action_received raised" in r.getMessage()]
    raises = stream.events.count("action_received")
    # Every raise is counted; the first is logged with its traceback, the count at the end.
    assert result.observer_errors == raises > 1
    assert [r.exc_info is not None for r in failures] == [True, False]
    assert f"raised {raises} times" in failures[1].getMessage()


def test_a_failing_transform_stops_the_run():
    stream = Stream(broken_transform=True)
    with pytest.raises(HookError, match=r"Stream\.transform_action raised"):
        rlmesh.run(cartpole_policy, "CartPole-v1", episodes=2, hooks=stream)
    assert stream.events[-1] == "session_failed"


class FlipObservation(rlmesh.RuntimeHooks):
    def transform_observation(self, observation):
        return -observation


def test_transform_observation_changes_what_the_model_sees():
    seen = []

    def model(obs):
        seen.append(obs.copy())
        return 0

    rlmesh.run(model, "CartPole-v1", seeds=[3], hooks=FlipObservation())
    first, _ = gym.make("CartPole-v1").reset(seed=3)
    np.testing.assert_array_equal(seen[0], -first)


class AsyncHooks(rlmesh.RunHooks):
    def __init__(self):
        self.ends = 0

    async def on_episode_end(self, result):
        self.ends += 1


def test_hook_methods_may_be_coroutines():
    hooks = AsyncHooks()
    rlmesh.run(cartpole_policy, "CartPole-v1", episodes=3, hooks=hooks)
    assert hooks.ends == 3


def test_the_bound_form_and_the_numpy_alias_run_the_same_evaluation():
    from rlmesh.numpy import Model as NumpyModel

    assert NumpyModel is rlmesh.Model
    bound = PredictOnly().run("CartPole-v1", episodes=3, seed=2)
    free = rlmesh.run(PredictOnly(), "CartPole-v1", episodes=3, seed=2)
    assert comparable(bound, drop=()) == comparable(free, drop=())


def test_arun_inside_an_event_loop_and_run_refuses_there():
    import asyncio

    async def main():
        with pytest.raises(RuntimeError, match=r"await rlmesh\.arun"):
            rlmesh.run(cartpole_policy, "CartPole-v1")
        return await rlmesh.arun(cartpole_policy, "CartPole-v1", episodes=2)

    assert asyncio.run(main()).num_episodes == 2


class SlowToLoadAndPredict(rlmesh.Model):
    def load(self):
        time.sleep(0.05)  # loading weights is never time-limited

    def predict(self, obs):
        time.sleep(0.05)
        return 0


def test_a_slow_predict_times_out_but_a_slow_load_does_not():
    with pytest.raises(OperationTimeout, match=r"model\.predict took longer than its 0\.02 s"):
        rlmesh.run(SlowToLoadAndPredict(), "CartPole-v1", timeouts={"predict": 0.02})


def test_a_results_file_holds_every_episode_and_resume_runs_only_the_missing(tmp_path):
    path = tmp_path / "results.jsonl"
    full = rlmesh.run(cartpole_policy, "CartPole-v1", episodes=6, num_envs=2, seed=4)
    # A first run stopped after some episodes: here, slots 0, 2 and 5 of the six.
    first = rlmesh.run(
        cartpole_policy, "CartPole-v1", episodes=6, seed=4, indices=[0, 2, 5], results_path=path
    )
    assert [e.index for e in first.episodes] == [0, 2, 5]
    resumed_lanes = []

    class Watch(rlmesh.RunHooks):
        def on_episode_start(self, *, episode, seed):
            resumed_lanes.append(episode)

    resumed = rlmesh.run(
        cartpole_policy,
        "CartPole-v1",
        episodes=6,
        seed=4,
        num_envs=3,
        results_path=path,
        resume=True,
        hooks=Watch(),
    )
    assert sorted(resumed_lanes) == [1, 3, 4]
    assert comparable(resumed) == comparable(full)
    lines = path.read_text().splitlines()
    assert sum('"index"' in line for line in lines) == 6


def test_resume_refuses_a_file_of_another_configuration(tmp_path):
    path = tmp_path / "results.jsonl"
    rlmesh.run(cartpole_policy, "CartPole-v1", episodes=2, seed=1, results_path=path)
    with pytest.raises(rlmesh.ResultsFileError, match="seed"):
        rlmesh.run(
            cartpole_policy, "CartPole-v1", episodes=2, seed=2, results_path=path, resume=True
        )
    with pytest.raises(rlmesh.ResultsFileError, match="resume"):
        rlmesh.run(cartpole_policy, "CartPole-v1", episodes=2, seed=1, results_path=path)


def test_indices_run_a_shard_with_the_seeds_of_the_full_run():
    shard = rlmesh.run(cartpole_policy, "CartPole-v1", episodes=8, seed=3, indices=[2, 5])
    full = rlmesh.run(cartpole_policy, "CartPole-v1", episodes=8, seed=3)
    assert comparable(shard) == [comparable(full)[2], comparable(full)[5]]


INTERRUPTED_RUN = """
import time, rlmesh

class Slow(rlmesh.Model):
    def predict(self, obs):
        time.sleep(0.002)
        return int(obs[2] > 0)

rlmesh.run(Slow(), "CartPole-v1", episodes=1000, results_path={path!r})
"""


def test_ctrl_c_stops_rlmesh_run_promptly_with_the_episodes_on_disk(tmp_path):
    import signal
    import subprocess
    import sys

    path = tmp_path / "results.jsonl"
    process = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED_RUN.format(path=str(path))],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count('"index"') >= 2:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=10)
    assert process.returncode != 0
    assert "KeyboardInterrupt" in stderr
    header, episodes = rlmesh.read_results(path)
    assert len(episodes) >= 2 and header["episodes"] == 1000


def test_resuming_a_complete_file_runs_nothing_and_still_fires_the_run_hooks(tmp_path):
    path = tmp_path / "results.jsonl"
    first = rlmesh.run(cartpole_policy, "CartPole-v1", episodes=3, results_path=path)
    hooks = Recorder()
    again = rlmesh.run(
        cartpole_policy, "CartPole-v1", episodes=3, results_path=path, resume=True, hooks=hooks
    )
    assert comparable(again) == comparable(first)
    assert [event[0] for event in hooks.events] == ["run_start", "run_end"]


def test_a_negative_seed_is_refused_by_its_own_name():
    with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\*\*64\), got -1"):
        rlmesh.run(cartpole_policy, "CartPole-v1", seed=-1)


class ChunkedStacked(rlmesh.Model):
    """A chunk policy over a stack of 3 CartPole frames; records every input it sees."""

    spec = ModelSpec(input=State(stack=3))

    def __init__(self):
        super().__init__()
        self.inputs = []

    def predict_chunk(self, obs, execution_horizon=None):
        self.inputs.append(np.array(obs))
        newest = obs[-1]
        return np.array([int(newest[2] + 0.3 * newest[3] > 0)] * 3)


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("num_envs", [1, 3])
def test_rounds_the_core_runs_equal_rounds_the_driver_awaits(core, num_envs):
    """The core's synchronous loop of rounds and the driver's awaited rounds go through the
    same phases: same episodes, same model inputs (stacks, chunk replays), same predictions."""
    runs = {}
    for awaited in (False, True):
        model = ChunkedStacked()
        result = rlmesh.run(
            model,
            "CartPole-v1",
            episodes=5,
            num_envs=num_envs,
            execution_horizon=3,
            max_episode_steps=40,
            hooks=AwaitEveryStep() if awaited else None,
            core=core,
        )
        runs[awaited] = (comparable(result, drop=()), model.inputs)
    (core_episodes, core_inputs), (awaited_episodes, awaited_inputs) = runs[False], runs[True]
    assert core_episodes == awaited_episodes
    assert len(core_inputs) == len(awaited_inputs)
    assert all(np.array_equal(a, b) for a, b in zip(core_inputs, awaited_inputs, strict=True))
    assert all(episode["truncated"] and episode["steps"] == 40 for episode in core_episodes)


class PlainFunctionReturningACoroutine(rlmesh.Model):
    def predict(self, obs):
        async def later():
            return 0

        return later()


@pytest.mark.parametrize("core", CORES)
def test_a_plain_predict_returning_an_awaitable_is_refused_with_what_to_do(core):
    with pytest.raises(rlmesh.errors.ModelError, match=r"declare it `async def`") as raised:
        rlmesh.run(PlainFunctionReturningACoroutine(), "CartPole-v1", episodes=1, core=core)
    assert raised.value.partial_result.num_episodes == 0


class AsyncPredict(rlmesh.Model):
    async def predict(self, obs):
        return cartpole_policy(obs)


@pytest.mark.parametrize("core", CORES)
def test_an_async_corner_runs_the_same_episodes_as_a_plain_one(core):
    plain = rlmesh.run(cartpole_policy, "CartPole-v1", episodes=3, num_envs=2, core=core)
    awaited = rlmesh.run(AsyncPredict(), "CartPole-v1", episodes=3, num_envs=2, core=core)
    assert comparable(awaited) == comparable(plain)


class RecordsActions(gym.Env):
    """Records every action it is given, as the env received it."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)

    def __init__(self, action_space):
        self.action_space = action_space
        self.received = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.full(2, 0.5, np.float32), {}

    def step(self, action):
        self.received.append(action)
        self.t += 1
        return np.full(2, 0.5, np.float32), 1.0, self.t >= 3, False, {}


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("awaited", [False, True])
def test_actions_reach_the_env_as_gymnasium_vectors_pass_them(core, awaited):
    """A lane's row of the applied batch: a numpy scalar for Discrete, an array for Box."""
    hooks = AwaitEveryStep() if awaited else None
    discrete = RecordsActions(gym.spaces.Discrete(3))
    rlmesh.run(lambda obs: 2, discrete, episodes=1, core=core, hooks=hooks)
    assert discrete.received == [2, 2, 2]
    assert all(type(action) is np.int64 for action in discrete.received)
    box = RecordsActions(gym.spaces.Box(-1, 1, (2,), np.float32))
    rlmesh.run(lambda obs: obs * 2 - 1.5, box, episodes=1, core=core, hooks=hooks)
    assert all(isinstance(action, np.ndarray) for action in box.received)
    assert [action.tolist() for action in box.received] == [[-0.5, -0.5]] * 3


class Snapshots(rlmesh.RuntimeHooks):
    """Keeps every telemetry window the run hands out."""

    def __init__(self):
        self.windows = []

    def telemetry_snapshot(self, rows):
        self.windows.append({(row.op, row.metric): row for row in rows})


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("awaited", [False, True])
def test_telemetry_counts_every_round_call_and_lane_step_in_windows_and_run(core, awaited):
    snapshots = Snapshots()
    result = rlmesh.run(
        SlowStart(),
        "CartPole-v1",
        episodes=2,
        num_envs=2,
        max_episode_steps=40,
        hooks=[snapshots, AwaitEveryStep()] if awaited else [snapshots],
        telemetry_window=0.02,
        core=core,
    )
    rows = {(row.op, row.metric): row for row in result.telemetry}
    rounds = rows["driver.round", "latency"].count
    assert rounds == 40  # both lanes run their 40 steps side by side
    # A per-lane predict is called once per lane a round, and each lane steps once a round.
    lane_steps = 2 * rounds
    assert rows["model.predict", "latency"].count == rows["env.step", "latency"].count == lane_steps
    assert rows["env.reset", "latency"].count == 1  # both lanes reset in one call
    assert (rows["driver", "steps"].count, rows["driver", "lane-steps"].count) == (40, 80)
    assert rows["model.predict", "latency"].p50 >= 1.0  # ms: each call sleeps 1 ms
    assert len(snapshots.windows) >= 2
    # Each window holds only its own calls: together, no more than the run's.
    in_windows = sum(
        w["env.step", "latency"].count for w in snapshots.windows if ("env.step", "latency") in w
    )
    assert 0 < in_windows <= lane_steps
