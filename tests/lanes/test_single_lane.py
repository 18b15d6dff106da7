"""One lane on the core's path: a model with both corners runs its per-lane corner on each
lane's own input, and the episodes equal a plain Gymnasium loop and the driver's awaited path,
on both cores, for Discrete, Box and Dict action spaces and for chunks. The per-lane corner
gets the env's observation itself when nobody else holds it, and a copy otherwise, so what a
model or an env receives is what it received before."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from helpers import CORES, AwaitEveryStep, cartpole_policy, comparable

SEEDS = [3, 1, 4, 1, 5]
MAX_STEPS = 60


def pendulum_policy(obs):
    return np.clip(np.array([-2.0 * obs[2]], dtype=np.float32), -2, 2)


class DictActions(gym.Env):
    """A Dict action space: the reward reads both parts of the action; episodes last
    8 + seed % 5 steps."""

    observation_space = gym.spaces.Box(-10, 10, (3,), np.float32)
    action_space = gym.spaces.Dict(
        {"move": gym.spaces.Box(-1, 1, (2,), np.float32), "grip": gym.spaces.Discrete(3)}
    )

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.length = 0, 8 + (seed or 0) % 5
        self.state = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        return self.state.copy(), {}

    def step(self, action):
        self.t += 1
        move = np.asarray(action["move"], dtype=np.float32)
        self.state = (self.state + np.append(move, 0.1 * int(action["grip"]))).astype(np.float32)
        reward = float(self.state.sum())
        return self.state.copy(), reward, self.t >= self.length, False, {}


def dict_policy(obs):
    return {"move": np.clip(-obs[:2], -1, 1).astype(np.float32), "grip": int(obs[2] > 0)}


def stacked(outputs):
    """Per-lane outputs (numbers, arrays or dicts of them) as one batch."""
    if isinstance(outputs[0], dict):
        return {key: stacked([output[key] for output in outputs]) for key in outputs[0]}
    return np.stack([np.asarray(output) for output in outputs])


class BothCorners(rlmesh.Model):
    """``policy`` through a per-lane and a batched corner, recording every per-lane input."""

    def __init__(self, policy):
        super().__init__()
        self.policy = policy
        self.inputs = []

    def predict(self, obs):
        self.inputs.append(obs)
        return self.policy(obs)

    def predict_batch(self, obs):
        return stacked([self.policy(row) for row in obs])


def scaled(action, factor):
    """``action`` with its float leaves times ``factor`` (still in their spaces' bounds for a
    factor <= 1); integer leaves as they are."""
    if isinstance(action, dict):
        return {key: scaled(leaf, factor) for key, leaf in action.items()}
    action = np.asarray(action)
    return action * np.float32(factor) if action.dtype.kind == "f" else action


class BothChunkCorners(rlmesh.Model):
    """Chunks of ``length`` actions from ``policy``, the n-th one's float parts divided by n,
    through a per-lane and a batched chunk corner."""

    def __init__(self, policy, length=4):
        super().__init__()
        self.policy, self.length = policy, length
        self.inputs = []

    def chunk(self, obs):
        first = self.policy(obs)
        return stacked([scaled(first, 1 / (n + 1)) for n in range(self.length)])

    def predict_chunk(self, obs, execution_horizon=None):
        self.inputs.append(obs)
        return self.chunk(obs)

    def predict_chunk_batch(self, obs, execution_horizon=None):
        return stacked([self.chunk(row) for row in obs])


def action_at(chunk, n):
    """The n-th action of a chunk (a dict of chunks: the n-th of each)."""
    if isinstance(chunk, dict):
        return {key: action_at(leaf, n) for key, leaf in chunk.items()}
    return chunk[n]


def plain_loop(make_env, choose, seeds, horizon=1):
    """The reference: reset with each seed, step to done (or MAX_STEPS), replaying the first
    ``horizon`` actions of each of ``choose(obs)``'s chunks (``horizon=1``: one action)."""
    env = gym.wrappers.TimeLimit(make_env(), MAX_STEPS)
    spec = env.spec
    threshold = None if spec is None else spec.reward_threshold
    episodes = []
    for index, seed in enumerate(seeds):
        obs, _ = env.reset(seed=seed)
        steps, reward, done, queue = 0, 0.0, False, []
        while not done:
            if not queue:
                chunk = choose(obs)
                queue = [action_at(chunk, n) for n in range(horizon)] if horizon > 1 else [chunk]
            obs, step_reward, terminated, truncated, _ = env.step(queue.pop(0))
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
                "success": None if threshold is None else reward >= threshold,
                "success_reported": False,
            }
        )
    env.close()
    return episodes


CASES = {
    "discrete": (lambda: gym.make("CartPole-v1"), cartpole_policy),
    "box": (lambda: gym.make("Pendulum-v1"), pendulum_policy),
    "dict": (DictActions, dict_policy),
}


def received(inputs):
    """What the model was given, input by input: its type, dtype, shape, layout and values."""
    return [
        (
            type(obs),
            obs.dtype,
            obs.shape,
            obs.flags.c_contiguous,
            obs.flags.writeable,
            obs.tobytes(),
        )
        for obs in inputs
    ]


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("horizon", [1, 3])
def test_one_lane_of_a_both_corner_model_equals_a_plain_loop_and_the_awaited_path(
    core, case, horizon
):
    make_env, policy = CASES[case]
    model_class = BothCorners if horizon == 1 else BothChunkCorners
    chunker = model_class(policy)
    reference = plain_loop(
        make_env, chunker.chunk if horizon > 1 else policy, SEEDS, horizon=horizon
    )
    runs = {}
    for awaited in (False, True):
        model = model_class(policy)
        result = rlmesh.run(
            model,
            make_env,
            seeds=SEEDS,
            max_episode_steps=MAX_STEPS,
            execution_horizon=horizon,
            hooks=AwaitEveryStep() if awaited else None,
            core=core,
        )
        rows = {(row.op, row.metric): row for row in result.telemetry}
        assert rows["model.predict", "latency"].count == len(model.inputs)
        assert rows["env.step", "latency"].count == result.total_steps
        # The plain loop keeps no digests (tests/core/test_digests.py checks them).
        digests = ("reset_digest", "trajectory_digest")
        runs[awaited] = (comparable(result, drop=("env_index", *digests)), received(model.inputs))
    assert runs[False][0] == reference
    assert runs[True][0] == reference
    # The per-lane corner was given the same inputs on the core's path as on the awaited one.
    assert runs[False][1] == runs[True][1]


class FreshObservations(gym.Env):
    """Returns a new array from every reset and step, keeping only its id (not the array)."""

    observation_space = gym.spaces.Box(-100, 100, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, make=None):
        self.make = make or (lambda t: np.full(3, t, np.float32))
        self.returned = []

    def observe(self):
        obs = self.make(self.t)
        self.returned.append(id(obs))
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observe(), {}

    def step(self, action):
        self.t += 1
        return self.observe(), float(action), False, self.t >= 5, {}


class OneBuffer(gym.Env):
    """Refills one array it keeps and returns it from every reset and step."""

    observation_space = gym.spaces.Box(-100, 100, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.buffer = np.zeros(3, np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.buffer[:] = 0
        return self.buffer, {}

    def step(self, action):
        self.t += 1
        self.buffer[:] = self.t
        return self.buffer, float(action), False, self.t >= 5, {}


class KeepsAndScribbles(rlmesh.Model):
    """Keeps every input it is given, with the ids of the objects, and writes into each."""

    def __init__(self):
        super().__init__()
        self.kept, self.ids, self.values = [], [], []

    def predict(self, obs):
        self.kept.append(obs)
        self.ids.append(id(obs))
        self.values.append(obs.copy())
        obs += 50  # a model may change its own input; nobody else may see it
        return 1

    def predict_batch(self, obs):
        raise AssertionError("one lane runs the per-lane corner")


@pytest.mark.parametrize("core", CORES)
def test_the_per_lane_corner_gets_a_fresh_observation_itself_that_nobody_else_holds(core):
    env, model = FreshObservations(), KeepsAndScribbles()
    rlmesh.run(model, env, episodes=1, core=core)
    # Each input is the array the env returned (its last observation is never predicted on).
    assert model.ids == env.returned[:-1]
    assert [values.tolist() for values in model.values] == [[t] * 3 for t in range(5)]
    assert [obs.tolist() for obs in model.kept] == [[t + 50] * 3 for t in range(5)]


@pytest.mark.parametrize("core", CORES)
def test_an_observation_its_env_keeps_reaches_the_model_as_a_copy(core):
    env, model = OneBuffer(), KeepsAndScribbles()
    result = rlmesh.run(model, env, episodes=1, core=core)
    assert id(env.buffer) not in model.ids
    # Each kept input holds the frame it was given (plus the model's own change), not the
    # buffer's later contents; the env's buffer never saw the model's writes.
    assert [obs.tolist() for obs in model.kept] == [[t + 50] * 3 for t in range(5)]
    assert env.buffer.tolist() == [5] * 3
    assert result.episodes[0].reward == 5.0


def read_only(t):
    obs = np.full(3, t, np.float32)
    obs.flags.writeable = False
    return obs


ODD_ARRAYS = {
    "read-only": read_only,
    "a strided view": lambda t: np.full(6, t, np.float32)[::2],
    "float64": lambda t: np.full(3, t, np.float64),
    "a list": lambda t: [float(t)] * 3,
    "a view of a bigger array": lambda t: np.full((2, 3), t, np.float32)[0],
}


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("kind", sorted(ODD_ARRAYS))
def test_any_other_observation_reaches_the_model_as_a_writeable_array_of_the_space(core, kind):
    env, model = FreshObservations(ODD_ARRAYS[kind]), KeepsAndScribbles()
    rlmesh.run(model, env, episodes=1, core=core)
    # Compared position by position: an id is unique only among objects alive together.
    pairs = zip(model.ids, env.returned[:-1], strict=True)
    assert all(given != returned for given, returned in pairs)
    for obs in model.values:
        assert type(obs) is np.ndarray and obs.dtype == np.float32 and obs.shape == (3,)
    assert [values.tolist() for values in model.values] == [[t] * 3 for t in range(5)]


class RecordsActions(gym.Env):
    """Records each action as it arrived, and the argument tuple of its ``step`` call."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)

    def __init__(self, action_space):
        self.action_space = action_space
        self.received, self.arguments = [], []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, *arguments):
        self.arguments.append(arguments)
        self.received.append(arguments[0])
        self.t += 1
        return np.zeros(2, np.float32), 1.0, self.t >= 6, False, {}


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(
    "space", [gym.spaces.Discrete(3), gym.spaces.Discrete(5, start=-2), gym.spaces.Discrete(5000)]
)
def test_each_step_hands_the_env_an_int64_scalar_of_the_model_s_action(core, space):
    env = RecordsActions(space)
    actions = [int(space.start) + (3 * t) % int(space.n) for t in range(6)]
    plan = iter(actions)
    rlmesh.run(lambda obs: next(plan), env, episodes=1, core=core)
    assert env.received == actions
    assert all(type(action) is np.int64 for action in env.received)
    # Each step's arguments are its own, whatever later steps were given.
    assert [arguments[0] for arguments in env.arguments] == actions
