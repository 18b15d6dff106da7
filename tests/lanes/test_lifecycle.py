"""The run's seams and clock: any ``Lanes`` kind, one clock per episode, deadlines that hold.

A kind of lanes written here, outside the package, runs through the unchanged driver and gives
the episodes rlmesh's own lanes give. An episode's clock starts at its reset call, for
``duration_s`` and ``max_episode_seconds`` alike. A timed-out operation reaches the caller at
its deadline even when the call never returns by itself.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from helpers import CORES, cartpole_policy, comparable
from rlmesh.errors import OperationTimeout
from rlmesh.lanes import Lanes, StepBatch, make_lanes
from rlmesh.utils import lane_actions


class ListLanes:
    """A kind of lanes the package does not have: plain envs in a list, stepped one by one,
    with no fast path for the core. Implements ``rlmesh.lanes.Lanes`` and nothing more; its
    env spec is unknown unless one is given."""

    lockstep = False
    resets_itself = False
    env_steps = None
    rebuild = None

    def __init__(self, env_id: str, num_lanes: int, spec: EnvSpec | None = None) -> None:
        self.spec = spec
        self.metadata = {}
        self.envs = [gym.make(env_id) for _ in range(num_lanes)]
        self.num_lanes = num_lanes
        self.name = env_id
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self.steps_taken = 0

    def reset(self, lanes, seeds, trials):
        results = [
            self.envs[lane].reset(seed=seed) for lane, seed in zip(lanes, seeds, strict=True)
        ]
        return [obs for obs, _ in results], [info for _, info in results]

    def step(self, lanes, actions) -> StepBatch:
        per_lane = lane_actions(actions, len(lanes))
        results = [self.envs[lane].step(per_lane[k]) for k, lane in enumerate(lanes.tolist())]
        self.steps_taken += len(results)
        observations, rewards, terminated, truncated, infos = zip(*results, strict=True)
        return StepBatch(
            np.asarray(lanes, dtype=np.int64),
            list(observations),
            np.array(rewards, dtype=np.float64),
            np.array(terminated, dtype=np.bool_),
            np.array(truncated, dtype=np.bool_),
            list(infos),
        )

    def env_episode_ids(self):
        return None

    def close(self) -> None:
        for env in self.envs:
            env.close()


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("num_lanes", [1, 3])
def test_a_new_kind_of_lanes_runs_through_the_driver_unchanged(core, num_lanes):
    lanes = ListLanes("CartPole-v1", num_lanes)
    assert isinstance(lanes, Lanes)
    # Lanes of an unknown kind carry no env spec: the success threshold is given.
    result = rlmesh.run(cartpole_policy, lanes, episodes=5, core=core, success=475.0)
    reference = rlmesh.run(
        cartpole_policy, "CartPole-v1", episodes=5, num_envs=num_lanes, success=475.0
    )
    assert comparable(result) == comparable(reference)
    assert lanes.steps_taken == sum(episode.steps for episode in result.episodes)
    with pytest.raises(ValueError, match="Lanes of 3 lanes, but num_envs=2"):
        rlmesh.run(cartpole_policy, ListLanes("CartPole-v1", 3), episodes=1, num_envs=2)


class CoreSteppedListLanes(ListLanes):
    """``ListLanes`` whose ``step`` says the core may call it (``core_calls_step``), as
    process and remote lanes do; it notes who called it, and one lane's env may raise."""

    core_calls_step = True

    def __init__(self, *args, broken_lane: int | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.callers: set[str] = set()
        self.broken_lane = broken_lane

    def step(self, lanes, actions) -> StepBatch:
        caller = sys._getframe(1).f_code
        self.callers.add((Path(caller.co_filename).name, caller.co_name))
        if self.broken_lane in lanes.tolist():
            raise RuntimeError(f"lane {self.broken_lane} broke")
        return super().step(lanes, actions)


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("num_lanes", [1, 3])
def test_lanes_whose_step_the_core_may_call_are_stepped_by_the_core(core, num_lanes):
    lanes = CoreSteppedListLanes("CartPole-v1", num_lanes)
    result = rlmesh.run(cartpole_policy, lanes, episodes=5, core=core, success=475.0)
    reference = rlmesh.run(
        cartpole_policy, ListLanes("CartPole-v1", num_lanes), episodes=5, core=core,
        success=475.0,
    )  # fmt: skip
    assert comparable(result) == comparable(reference)
    # Called by the core: the Rust core from the driver's call of run_rounds (no Python frame
    # of its own), the Python core from its own loop; never from the driver's awaited round.
    by_core = {"rust": ("driver.py", "_run_rounds"), "python": ("rounds.py", "_step_all")}
    assert lanes.callers == {by_core[core]}
    # A per-step hook needs the awaited round: the same lanes are then stepped by the driver.
    awaited = CoreSteppedListLanes("CartPole-v1", num_lanes)

    class Steps(rlmesh.RunHooks):
        def on_step(self, event):
            pass

    again = rlmesh.run(
        cartpole_policy, awaited, episodes=5, core=core, success=475.0, hooks=[Steps()]
    )
    assert comparable(again) == comparable(reference)
    assert awaited.callers == {("driver.py", "_guard")}


@pytest.mark.parametrize("core", CORES)
def test_a_foreign_error_from_lanes_the_core_steps_is_an_env_error_on_either_path(core):
    def failure(hooks):
        lanes = CoreSteppedListLanes("CartPole-v1", 2, broken_lane=1)
        with pytest.raises(rlmesh.EnvError) as caught:
            rlmesh.run(cartpole_policy, lanes, episodes=2, core=core, hooks=hooks)
        return str(caught.value), type(caught.value.__cause__)

    class Steps(rlmesh.RunHooks):
        def on_step(self, event):
            pass

    # The core names the env, as for a lane's step; the awaited round names the call and round.
    assert failure([]) == ("CartPole-v1: step() raised RuntimeError: lane 1 broke", RuntimeError)
    assert failure([Steps()]) == (
        "env.step raised RuntimeError('lane 1 broke') at round 0",
        RuntimeError,
    )


def test_lanes_that_lack_a_member_are_refused_naming_it():
    lanes = ListLanes("CartPole-v1", 1)
    del lanes.metadata
    with pytest.raises(TypeError, match=r"ListLanes has num_lanes but .* lacks metadata"):
        rlmesh.run(cartpole_policy, lanes, episodes=1)
    lanes.close()


@pytest.mark.parametrize("core", CORES)
def test_lanes_without_a_spec_have_no_success_rate_unless_a_rule_is_given(core):
    lanes = ListLanes("CartPole-v1", 2)
    assert isinstance(lanes, Lanes)
    result = rlmesh.run(cartpole_policy, lanes, episodes=3, core=core)
    assert result.summary()["success_rule"] == "not available"
    assert [episode.success for episode in result.episodes] == [None] * 3
    assert result.success_rate is None
    given = rlmesh.run(
        cartpole_policy, ListLanes("CartPole-v1", 2), episodes=3, core=core, success=475.0
    )
    assert [episode.success for episode in given.episodes] == [
        episode.reward >= 475.0 for episode in given.episodes
    ]


@pytest.mark.parametrize("core", CORES)
def test_a_new_kind_of_lanes_with_a_spec_gets_the_specs_success_threshold(core):
    spec = gym.spec("CartPole-v1")
    result = rlmesh.run(cartpole_policy, ListLanes("CartPole-v1", 2, spec), episodes=3, core=core)
    assert result.summary()["success_rule"] == (
        f"reward >= {spec.reward_threshold!r} (env spec reward_threshold)"
    )
    assert [episode.success for episode in result.episodes] == [
        episode.reward >= spec.reward_threshold for episode in result.episodes
    ]


class Unregistered(gym.Env):
    """An env built by its class, not by ``gymnasium.make``: it has no spec."""

    observation_space = gym.spaces.Box(0, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)


@pytest.mark.parametrize(
    ("make", "spec_id"),
    [
        pytest.param(lambda: "CartPole-v1", "CartPole-v1", id="id"),
        pytest.param(lambda: lambda: gym.make("Pendulum-v1"), "Pendulum-v1", id="factory"),
        pytest.param(lambda: gym.make("Acrobot-v1"), "Acrobot-v1", id="instance"),
        pytest.param(lambda: Unregistered(), None, id="unregistered"),
        pytest.param(
            lambda: SyncVectorEnv(
                [lambda: gym.make("CartPole-v1")] * 2, autoreset_mode=AutoresetMode.DISABLED
            ),
            "CartPole-v1",
            id="vector of env functions",
        ),
        pytest.param(
            lambda: gym.make_vec(
                "MountainCar-v0",
                num_envs=2,
                vector_kwargs={"autoreset_mode": AutoresetMode.DISABLED},
            ),
            "MountainCar-v0",
            id="make_vec",
        ),
    ],
)
def test_every_kind_of_lanes_says_its_env_spec(make, spec_id):
    lanes = make_lanes(make())
    try:
        if spec_id is None:
            assert lanes.spec is None
        else:
            assert isinstance(lanes.spec, EnvSpec)
            assert lanes.spec.id == spec_id
            assert lanes.spec.reward_threshold == gym.spec(spec_id).reward_threshold
    finally:
        lanes.close()


class SlowResetEnv(gym.Env):
    """Resets in 50 ms, steps in 10 ms, never ends by itself."""

    observation_space = gym.spaces.Box(0, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        time.sleep(0.05)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        time.sleep(0.01)
        return np.zeros(1, np.float32), 0.0, False, False, {}


@pytest.mark.parametrize("core", CORES)
def test_duration_and_the_time_cap_read_one_clock_that_starts_at_the_reset(core):
    result = rlmesh.run(lambda obs: 0, SlowResetEnv, episodes=2, max_episode_seconds=0.1, core=core)
    for episode in result.episodes:
        assert episode.truncated and not episode.terminated
        assert episode.duration_s >= 0.1
        # The 50 ms reset counts against the cap: a clock started after it would allow ~10.
        assert 1 <= episode.steps <= 6


class HangingEnv(gym.Env):
    """Steps normally until step ``hang_at``, where ``step`` blocks until ``release`` is set."""

    observation_space = gym.spaces.Box(0, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)
    release = threading.Event()

    def __init__(self, hang_at: int = 3) -> None:
        self.hang_at = hang_at
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.steps += 1
        if self.steps == self.hang_at:
            self.release.wait(timeout=60)
        return np.zeros(1, np.float32), 1.0, False, False, {}


def test_a_timed_out_step_reaches_the_caller_at_its_deadline():
    HangingEnv.release.clear()
    started = time.perf_counter()
    try:
        with pytest.raises(OperationTimeout, match=r"env.step took longer than its 0.2 s limit"):
            rlmesh.run(lambda obs: 0, HangingEnv, episodes=1, timeouts={"step": 0.2})
        assert time.perf_counter() - started < 10  # the hang lasts up to 60 s
    finally:
        HangingEnv.release.set()  # the abandoned thread returns and ends


def _deadline_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "rlmesh-deadline-call"]


def _settled(predicate, seconds: float = 5.0) -> bool:
    """Whether ``predicate()`` holds within ``seconds`` (threads end on their own clock)."""
    deadline = time.perf_counter() + seconds
    while not predicate():
        if time.perf_counter() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_run_with_timeouts_leaves_no_thread_behind():
    # Threads are compared by identity: an earlier test's released thread may still be ending.
    before = set(_deadline_threads())
    result = rlmesh.run(cartpole_policy, "CartPole-v1", episodes=2, timeouts={"step": 5})
    assert result.num_episodes == 2
    assert _settled(lambda: set(_deadline_threads()) <= before)
    # An abandoned call's thread ends once the call returns.
    HangingEnv.release.clear()
    try:
        with pytest.raises(OperationTimeout):
            rlmesh.run(lambda obs: 0, HangingEnv, episodes=1, timeouts={"step": 0.2})
        stuck = set(_deadline_threads()) - before
        assert len(stuck) == 1  # still stuck in the hung step
    finally:
        HangingEnv.release.set()
    assert _settled(lambda: not any(thread.is_alive() for thread in stuck))


def test_a_process_whose_step_hangs_exits_at_the_deadline():
    # The whole of rlmesh.run, asyncio.run's shutdown included: it must not wait for the hang.
    script = textwrap.dedent(
        """
        import time, gymnasium as gym, numpy as np, rlmesh

        class Hang(gym.Env):
            observation_space = gym.spaces.Box(0, 1, (1,), np.float32)
            action_space = gym.spaces.Discrete(2)
            def reset(self, *, seed=None, options=None):
                return np.zeros(1, np.float32), {}
            def step(self, action):
                time.sleep(120)

        try:
            rlmesh.run(lambda obs: 0, Hang, episodes=1, timeouts={"step": 0.2})
        except rlmesh.OperationTimeout as err:
            print("timed out:", err)
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        stdout, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 0, stderr
    assert "timed out: env.step took longer than its 0.2 s limit" in stdout


def test_an_autoresetting_vector_warns_once_per_run_that_its_restarts_are_unseeded():
    vector = SyncVectorEnv(
        [lambda: gym.make("CartPole-v1")] * 2, autoreset_mode=AutoresetMode.NEXT_STEP
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = rlmesh.run(cartpole_policy, vector, episodes=6)
    unseeded = [w for w in caught if "restarts ended lanes itself" in str(w.message)]
    assert len(unseeded) == 1
    assert "autoreset_mode=gymnasium.vector.AutoresetMode.DISABLED" in str(unseeded[0].message)
    assert [episode.seed is None for episode in result.episodes] == [False] * 2 + [True] * 4
