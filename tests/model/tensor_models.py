"""Models written once per flavour (numpy, torch, JAX) that compute the same function bit for bit,
a small Dict env with a text leaf, and the checks the framework tests share
(test_tensor_models.py for both frameworks; test_torch.py and test_jax.py for each one's own).

Module-level, so worker processes and Ray workers can import the env and the models by name.
Each flavour is an ``Ops`` of the few operations the models use; every model's arithmetic is
the same IEEE operations in the same order in each flavour, so their actions are equal, and so
are the runs' per-episode results and digests.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import rlmesh
from gymnasium import spaces
from rlmesh.adapters import ModelSpec, State

EPISODES = 6
RUN = {"episodes": EPISODES, "seed": 3, "max_episode_steps": 60}
HORIZON = 4  # chunk models return 5 actions; a run replays 4


class ChaseEnv(gym.Env):
    """A point chasing a goal: a Dict observation of a float32 Box, a Discrete, a float64 Box
    and a Text leaf; a float32 Box action. Deterministic per seed."""

    WORDS = ("go", "slow", "quick", "stop", "steady")

    def __init__(self):
        self.observation_space = spaces.Dict(
            {
                "goal": spaces.Box(-1.0, 1.0, (2,), np.float32),
                "mode": spaces.Discrete(3),
                "position": spaces.Box(-5.0, 5.0, (2,), np.float64),
                "note": spaces.Text(8),
            }
        )
        self.action_space = spaces.Box(-0.2, 0.2, (2,), np.float32)

    def _observation(self):
        return {
            "goal": self.goal.copy(),
            "mode": int(self.t % 3),
            "position": self.position.copy(),
            "note": self.WORDS[(self.t + self.word) % len(self.WORDS)],
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.goal = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        self.position = self.np_random.uniform(-2, 2, 2)
        self.word = int(self.np_random.integers(0, len(self.WORDS)))
        self.t = 0
        self.length = 8 + int(self.np_random.integers(0, 12))
        return self._observation(), {}

    def step(self, action):
        self.t += 1
        self.position = np.clip(self.position + np.asarray(action, np.float64), -5, 5)
        distance = float(np.linalg.norm(self.position - self.goal))
        reached = distance < 0.05
        return self._observation(), -distance, reached, self.t >= self.length, {}


def make_chase():
    return ChaseEnv()


CHASE_ID = "TensorChase-v0"  # for suites, whose tasks name envs by id
if CHASE_ID not in gym.registry:
    gym.register(CHASE_ID, entry_point=f"{__name__}:ChaseEnv")


# ---------------------------------------------------------------------------------- flavours


class NumpyOps:
    name = "numpy"
    Model = rlmesh.Model

    @staticmethod
    def ints(x):
        return x.astype(np.int64)

    @staticmethod
    def f64(x):
        return np.asarray(x).astype(np.float64)

    @staticmethod
    def f32(x):
        return x.astype(np.float32)

    @staticmethod
    def clip(x, low, high):
        return np.clip(x, low, high)

    @staticmethod
    def stack(xs, axis):
        return np.stack(xs, axis=axis)

    @staticmethod
    def lengths(notes, like):
        return np.array([len(note) for note in notes], dtype=np.float64)

    @staticmethod
    def is_input(value):
        return isinstance(value, np.ndarray)


def torch_ops(device="cpu"):
    import rlmesh.torch
    import torch

    class TorchOps:
        name = "torch"
        Model = rlmesh.torch.Model
        writable = True  # a model may write into its input tensors

        @staticmethod
        def ints(x):
            return x.long()

        @staticmethod
        def f64(x):
            return x.double()

        @staticmethod
        def f32(x):
            return x.float()

        @staticmethod
        def clip(x, low, high):
            return torch.clamp(x, low, high)

        @staticmethod
        def stack(xs, axis):
            return torch.stack(xs, dim=axis)

        @staticmethod
        def lengths(notes, like):
            return torch.tensor(
                [len(note) for note in notes], dtype=torch.float64, device=like.device
            )

        @staticmethod
        def is_input(value):
            return isinstance(value, torch.Tensor) and value.device == torch.device(device)

        @staticmethod
        def bf16(x):
            return x.to(torch.bfloat16)

    TorchOps.device = device
    return TorchOps


def jax_ops(device="cpu"):
    import jax
    import jax.numpy as jnp
    import rlmesh.jax

    class JaxOps:
        name = "jax"
        Model = rlmesh.jax.Model
        writable = False  # jax.Array is immutable

        @staticmethod
        def ints(x):
            return x.astype(jnp.int32)

        @staticmethod
        def f64(x):
            return x.astype(jnp.float64)

        @staticmethod
        def f32(x):
            return x.astype(jnp.float32)

        @staticmethod
        def clip(x, low, high):
            return jnp.clip(x, low, high)

        @staticmethod
        def stack(xs, axis):
            return jnp.stack(xs, axis=axis)

        @staticmethod
        def lengths(notes, like):
            return jnp.array([len(note) for note in notes], dtype=jnp.float64)

        @staticmethod
        def is_input(value):
            return isinstance(value, jax.Array)

        @staticmethod
        def bf16(x):
            return x.astype(jnp.bfloat16)

    JaxOps.device = device
    return JaxOps


# ------------------------------------------------------------------------------------ models


def _checked(ops, value, shape):
    """``value`` after checking it is the flavour's input type of ``shape``."""
    assert ops.is_input(value), f"{ops.name} model got {type(value).__name__}"
    assert tuple(value.shape) == shape, (tuple(value.shape), shape)
    return value


def cartpole_models(ops):
    """The four corners of one CartPole policy (an angle heuristic that loses the pole within
    30 to 60 steps; chunks of 5 actions)."""

    def balance(obs):  # [..., 4] -> [...] ints
        return ops.ints(obs[..., 2] + 0.003 * obs[..., 3] > 0)

    def chunk(first, axis):
        return ops.stack([first, first, 1 - first, first, 1 - first], axis)

    class Base(ops.Model):
        stateless = True
        device = getattr(ops, "device", "cpu")

    class Predict(Base):
        def predict(self, obs):
            return balance(_checked(ops, obs, (4,)))

    class Batch(Base):
        def predict_batch(self, obs):
            return balance(_checked(ops, obs, (obs.shape[0], 4)))

    class Chunk(Base):
        def predict_chunk(self, obs, execution_horizon=None):
            return chunk(balance(_checked(ops, obs, (4,))), 0)

    class ChunkBatch(Base):
        def predict_chunk_batch(self, obs, execution_horizon=None):
            return chunk(balance(_checked(ops, obs, (obs.shape[0], 4))), 1)

    return {
        "predict": Predict,
        "predict_batch": Batch,
        "predict_chunk": Chunk,
        "predict_chunk_batch": ChunkBatch,
    }


STACK = 3


def stacked_models(ops, *, write_input=False):
    """A policy on a frame stack of 3 CartPole observations (the velocity over the window);
    with ``write_input`` it then overwrites its input in place (torch only)."""

    def act(obs):  # [..., 3, 4]
        velocity = obs[..., -1, 2] - obs[..., 0, 2]
        return ops.ints(obs[..., -1, 2] + 2.0 * velocity > 0)

    class Base(ops.Model):
        spec = ModelSpec(input=State(None, stack=STACK))
        stateless = True
        device = getattr(ops, "device", "cpu")

    class Predict(Base):
        def predict(self, obs):
            action = act(_checked(ops, obs, (STACK, 4)))
            if write_input:
                obs[0] = 99.0  # this lane's row of the batch only
                obs.mul_(-1)
            return action

    class Batch(Base):
        def predict_batch(self, obs):
            action = act(_checked(ops, obs, (obs.shape[0], STACK, 4)))
            if write_input:
                obs.mul_(0)
            return action

    return {"predict": Predict, "predict_batch": Batch}


def chase_models(ops):
    """A policy on ``ChaseEnv``'s Dict observation, its text leaf included."""

    def act(obs, lengths):
        direction = ops.f64(obs["goal"]) - obs["position"]
        scale = (0.2 - 0.1 * ops.f64(obs["mode"] == 2)) / (1.0 + 0.1 * lengths)
        if direction.ndim == 2:
            scale = scale[:, None]
        return ops.f32(ops.clip(direction, -scale, scale))

    class Base(ops.Model):
        stateless = True
        device = getattr(ops, "device", "cpu")

    class Predict(Base):
        def predict(self, obs):
            assert isinstance(obs["note"], str)
            _checked(ops, obs["goal"], (2,))
            return act(obs, float(len(obs["note"])))

    class Batch(Base):
        def predict_batch(self, obs):
            assert isinstance(obs["note"], list) and all(isinstance(n, str) for n in obs["note"])
            _checked(ops, obs["position"], (len(obs["note"]), 2))
            return act(obs, ops.lengths(obs["note"], obs["position"]))

    return {"predict": Predict, "predict_batch": Batch}


class CountingNumpy(rlmesh.Model):
    """Keeps state across calls: its action depends on how often it was called."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def predict_batch(self, obs):  # Pendulum: [K, 3] -> [K, 1]
        self.calls += 1
        return (0.01 * self.calls - obs[:, :1]).astype(np.float32)


def recording_model(ops):
    """A model whose per-lane corner records each call's input in ``seen`` (and sums it)."""

    class Recorder(ops.Model):
        def __init__(self):
            super().__init__()
            self.seen = []

        def predict(self, obs):
            self.seen.append(obs)
            return obs.sum()

    return Recorder


def counting_model(ops):
    """``CountingNumpy`` in the flavour: it keeps state across calls."""

    class Counting(ops.Model):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def predict_batch(self, obs):  # Pendulum: [K, 3] -> [K, 1]
            self.calls += 1
            return 0.01 * self.calls - obs[:, :1]

    return Counting


# ------------------------------------------------------------------------------------ checks


def runs_equal(numpy_model, model, env, **options):
    """Both models' runs, and their per-episode results (rewards, steps, digests) compared."""
    from helpers import comparable  # tests/: not needed where worker processes import this

    reference = rlmesh.run(numpy_model, env, **RUN, **options)
    result = rlmesh.run(model, env, **RUN, **options)
    assert len(reference.episodes) == EPISODES
    assert comparable(result) == comparable(reference)
    return result


@contextlib.contextmanager
def wide_inputs(ops) -> Iterator[None]:
    """64-bit inputs accepted by the flavour for the block: JAX's ``jax_enable_x64`` on, and
    off again after it (JAX's default); nothing to do for the others."""
    if ops.name != "jax":
        yield
        return
    import jax

    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", False)


def extremes(dtype):
    """Values that lose bits on any narrowing: the dtype's limits and an awkward fraction."""
    if dtype == np.bool_:
        return np.array([[True, False], [False, True]])
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return np.array([[info.min, info.max], [info.max - 1, 1]], dtype=dtype)
    if np.issubdtype(dtype, np.complexfloating):
        return (np.array([[1 / 3, -2.5], [1e30, 0]]) * (1 + 1j / 7)).astype(dtype)
    info = np.finfo(dtype)
    return np.array([[info.min, info.max], [info.tiny, 1 / 3]], dtype=dtype)


def round_trip(to: Callable[[np.ndarray], Any], back: Callable[[Any], np.ndarray],
               array: np.ndarray) -> np.ndarray:  # fmt: skip
    """``array`` through the framework (``to``) and back: the same dtype, shape and values,
    a 0-d array's and an empty one's shapes too; what came back."""
    returned = back(to(array))
    assert returned.dtype == array.dtype and returned.shape == array.shape
    np.testing.assert_array_equal(returned, array)
    assert back(to(array[0, 0])).shape == ()
    assert back(to(array[:0])).shape == (0, 2)
    return returned
