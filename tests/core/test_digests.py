"""Episode digests (``rlmesh._pycore.digests``): the definition, both cores alike, and runs.

A reference written here from the definition alone (``absorb`` is SplitMix64, the bulk an NH
sum, leaves with their dtype and shape, dicts by key text, tuples in order) hashes what a
plain gymnasium loop sees; every run of the same episodes, on either core, at any number of
lanes, on the core's path or the awaited one, must give the same digests.
"""

from __future__ import annotations

import struct

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from envs_for_digests import CAPS, ENVS
from helpers import AwaitEveryStep
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from rlmesh._pycore import digests as spec
from rlmesh.adapters import compile_spec
from rlmesh.core import load_core

M32, M64 = 2**32 - 1, 2**64 - 1


# ---------------------------------------------------------------------------- the reference


def splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def absorb(state: int, *words: int) -> int:
    for word in words:
        state = splitmix64(state ^ word)
    return state


def bulk(data: bytes) -> int:
    data += bytes(-len(data) % 8)
    total = 0
    for j in range(len(data) // 8):
        word = int.from_bytes(data[8 * j : 8 * j + 8], "little")
        key = splitmix64((spec.KEY_BASE + j) & M64)
        low = ((word & M32) + (key & M32)) & M32
        high = ((word >> 32) + (key >> 32)) & M32
        total = (total + low * high + word) & M64
    return total


def text(data: bytes) -> int:
    return absorb(spec.TEXT_SEED, len(data), bulk(data))


def opaque(listed) -> int:
    return absorb(spec.LEAF_SEED, ord("O"), text(repr(listed).encode()))


def leaf(value) -> int:
    try:
        array = np.asarray(value, dtype=np.int64 if type(value) is int else None)
    except (ValueError, OverflowError):  # ragged, or past int64: numpy's own view, or the repr
        try:
            array = np.asarray(value)
        except ValueError:
            return opaque(value)
    if array.dtype.kind not in "biufcSU":
        return opaque(array.tolist())
    little = np.ascontiguousarray(array.astype(array.dtype.newbyteorder("<"))).reshape(array.shape)
    prefix = absorb(spec.LEAF_SEED, ord(array.dtype.kind), array.dtype.itemsize, array.ndim)
    return absorb(prefix, *array.shape, bulk(little.tobytes()))


def digest(value) -> int:
    if isinstance(value, dict):
        items = sorted(((str(key).encode(), item) for key, item in value.items()), key=first)
        state = absorb(spec.DICT_SEED, len(items))
        for key, item in items:
            state = absorb(state, text(key), digest(item))
        return state
    if isinstance(value, tuple):
        return absorb(spec.TUPLE_SEED, len(value), *(digest(item) for item in value))
    return leaf(value)


def first(pair):
    return pair[0]


def reference_episodes(env_key: str, seeds: list[int], cap: int | None = -1) -> list:
    """Each seed's episode played in a plain loop (to the run's cap: ``CAPS``, or ``cap``),
    its (reset, trajectory) digests computed by the reference: the action as the env receives
    it, flags as the env returns them."""
    cap = CAPS[env_key] if cap == -1 else cap
    _, make_env, policy = ENVS[env_key]
    env = make_env()
    space = env.action_space
    digests = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        reset = digest(obs)
        trajectory = absorb(spec.TRAJECTORY_SEED, reset)
        steps = 0
        while cap is None or steps < cap:
            steps += 1
            action = policy(obs)
            # What the action plan hands the env: the space's dtype.
            action = np.int64(action) if isinstance(space, gym.spaces.Discrete) else action
            obs, reward, terminated, truncated, _ = env.step(action)
            reward_bits = struct.unpack("<Q", struct.pack("<d", float(reward)))[0]
            flags = int(bool(terminated)) | int(bool(truncated)) << 1
            trajectory = absorb(trajectory, digest(action), digest(obs), reward_bits, flags)
            if terminated or truncated:
                break
        digests.append((f"{reset:016x}", f"{trajectory:016x}"))
    env.close()
    return digests


def digests_of(result) -> list[tuple[str, str]]:
    return [(e.reset_digest, e.trajectory_digest) for e in result.episodes]


# ---------------------------------------------------------------------------- values


VALUES = [
    np.zeros(3, np.float32),
    np.zeros(3, np.float64),
    np.zeros((3, 1), np.float32),
    np.zeros((1, 3), np.float32),
    np.arange(6, dtype=np.int64),
    np.arange(6, dtype=np.uint64),
    np.arange(37, dtype=np.uint8),
    np.ones((2, 3, 4), np.int16)[:, ::2],  # not contiguous
    np.arange(6, dtype=">i4").reshape(2, 3).T,  # big-endian and transposed
    np.array(["a", "bb"]),
    np.array([b"x", b"yz"]),
    np.float16(3.5),
    np.bool_(True),
    1,
    True,
    1.0,
    -0.0,
    2**70,  # no int64 holds it: numpy's object array, hashed by its repr
    None,
    "text",
    [1, [2, 3]],  # ragged: hashed by its repr
    {"b": np.ones(2, np.float32), "a": 1, "c": {"d": (1, 2.0)}},
    {1: "one", "1": "text one"},
    (np.arange(3), "x", (True, None)),
    np.datetime64("2026-01-01"),
]


@pytest.mark.parametrize("value", VALUES, ids=lambda value: type(value).__name__)
def test_both_cores_give_a_value_the_digest_the_definition_gives(value):
    digests = {load_core(name).value_digest(value) for name in ("rust", "python")}
    assert digests == {f"{digest(value):016x}"}


@settings(max_examples=200, deadline=None)
@given(
    hnp.arrays(
        dtype=st.one_of(hnp.integer_dtypes(), hnp.floating_dtypes(), hnp.boolean_dtypes()),
        shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=40),
    )
)
def test_arrays_of_any_dtype_and_shape_digest_alike_in_both_cores_and_the_definition(array):
    expected = f"{digest(array):016x}"
    assert load_core("rust").value_digest(array) == expected
    assert load_core("python").value_digest(array) == expected


def test_what_changes_a_digest_and_what_does_not(core):
    of = core.value_digest
    values = np.arange(12, dtype=np.float32)
    assert of(values) != of(values.astype(np.float64))  # the dtype
    assert of(values) != of(values.reshape(3, 4))  # the shape
    assert of(values.reshape(3, 4)) != of(values.reshape(4, 3))
    changed = values.copy()
    changed[7] = np.nextafter(changed[7], np.float32(np.inf))  # one ulp of one element
    assert of(values) != of(changed)
    assert of(np.int64(5)) == of(5) == of(np.array(5))  # a Python int is an int64
    assert of(np.float32(5)) != of(5.0)
    # The layout and byte order of the same values do not count.
    grid = np.arange(12, dtype=np.int32).reshape(3, 4)
    assert of(grid.T) == of(np.ascontiguousarray(grid.T))
    assert of(grid.astype(">i4")) == of(grid)
    # A dict's order does not count; its keys do.
    assert of({"a": 1, "b": 2}) == of({"b": 2, "a": 1})
    assert of({"a": 1, "b": 2}) != of({"a": 2, "b": 1})
    assert of((1, 2)) != of((2, 1)) and of((1, 2)) != of({"0": 1, "1": 2})


def test_a_big_image_digests_alike_in_both_cores():
    image = np.random.default_rng(0).integers(0, 256, (256, 256, 3), dtype=np.uint8)
    rust, python = (load_core(name).value_digest(image) for name in ("rust", "python"))
    assert rust == python
    image[255, 255, 2] ^= 1  # the last byte
    assert load_core("rust").value_digest(image) != rust


# ---------------------------------------------------------------------------- the runner


def test_a_runner_without_digests_gives_none(core):
    plan = compile_spec(None, gym.spaces.Box(-1, 1, (1,), np.float32), gym.spaces.Discrete(2))
    runner = core.RoundRunner(1, 1, plan.observation, plan.action, digests=False)
    starts = runner.start([0], now_ns=0)
    runner.set_observations(starts.lanes, [np.zeros(1, np.float32)])
    runner.begin_round()
    runner.take_actions(np.zeros(1, np.int64), 1)
    ended, _ = runner.end_round([1.0], [True], [False], 1, 1)
    [summary], _, _ = runner.finish(ended, [None])
    assert (summary.reset_digest, summary.trajectory_digest) == (None, None)
    with pytest.raises(TypeError, match="digests must be a bool, got int"):
        core.RoundRunner(1, 1, plan.observation, plan.action, digests=1)


@pytest.mark.parametrize("core", ["rust", "python"])
def test_an_episode_whose_reset_failed_has_no_digests(core):
    class FailsOnSeed(gym.Wrapper):
        def reset(self, *, seed=None, options=None):
            if seed == rlmesh.episode_seed(0, 1):
                raise RuntimeError("no reset today")
            return self.env.reset(seed=seed, options=options)

    result = rlmesh.run(
        ENVS["CartPole-v1"][2],
        lambda: FailsOnSeed(gym.make("CartPole-v1")),
        episodes=3,
        on_error="record",
        max_episode_steps=30,
        core=core,
    )
    failed = [e for e in result.episodes if e.error is not None]
    assert [e.index for e in failed] == [1]
    assert (failed[0].reset_digest, failed[0].trajectory_digest) == (None, None)
    assert all(e.reset_digest and e.trajectory_digest for e in result.episodes if not e.error)


# ---------------------------------------------------------------------------- runs


SEEDS = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]


@pytest.mark.parametrize("env_key", sorted(ENVS))
def test_every_lane_count_and_core_gives_the_digests_of_a_plain_loop(env_key):
    reference = reference_episodes(env_key, SEEDS)
    assert len(set(reference)) == len(set(SEEDS))  # a seed repeated is the same episode
    env, _, policy = ENVS[env_key]
    for core in ("rust", "python"):
        for num_envs in (1, 4, 8):
            result = rlmesh.run(
                policy,
                env,
                seeds=SEEDS,
                num_envs=num_envs,
                max_episode_steps=CAPS[env_key],
                core=core,
            )
            assert digests_of(result) == reference, (core, num_envs)


@pytest.mark.parametrize("core", ["rust", "python"])
def test_the_awaited_path_and_chunked_replay_give_the_core_paths_digests(core):
    env, _, policy = ENVS["Pendulum-v1"]
    options = {"seeds": SEEDS[:6], "max_episode_steps": 40, "core": core, "num_envs": 3}
    fast = rlmesh.run(policy, env, **options)
    awaited = rlmesh.run(policy, env, hooks=AwaitEveryStep(), **options)
    assert digests_of(awaited) == digests_of(fast)

    class Chunks(rlmesh.Model):
        def predict_chunk(self, obs, execution_horizon):
            return np.repeat(policy(obs)[None], execution_horizon, axis=0)

    chunked = rlmesh.run(Chunks(), env, execution_horizon=3, **options)
    again = rlmesh.run(Chunks(), env, execution_horizon=3, **{**options, "num_envs": 1})
    assert digests_of(chunked) == digests_of(again)
    # The same resets, other actions: the trajectories differ.
    assert [d[0] for d in digests_of(chunked)] == [d[0] for d in digests_of(fast)]
    assert [d[1] for d in digests_of(chunked)] != [d[1] for d in digests_of(fast)]


@pytest.mark.parametrize("core", ["rust", "python"])
def test_a_vector_restarting_its_lanes_gives_its_seeded_episodes_their_digests(core):
    seeds = [rlmesh.episode_seed(0, k) for k in range(3)]
    reference = reference_episodes("CartPole-v1", seeds, cap=None)  # the env's own limit
    vector = gym.make_vec(
        "CartPole-v1",
        num_envs=3,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP},
    )
    result = rlmesh.run(ENVS["CartPole-v1"][2], vector, episodes=9, core=core)
    seeded = [e for e in result.episodes if e.seed is not None]
    assert [e.index for e in seeded] == [0, 1, 2]
    assert digests_of(rlmesh.RunResult(seeded, 0)) == reference
    restarted = [e for e in result.episodes if e.seed is None]
    assert all(e.reset_digest and e.trajectory_digest for e in restarted)
