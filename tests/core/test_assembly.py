"""Observation assembly in both cores: payload shapes, frame stacks, and the errors it raises.

The frame-stack reference is Gymnasium's own ``FrameStackObservation(padding_type="reset")``,
run on the same environments and seeds as the assembler.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers import FrameStackObservation
from rlmesh.adapters import Concat, Custom, Image, ModelSpec, State, Text, compile_spec
from rlmesh.errors import ObservationError

DISCRETE_2 = gym.spaces.Discrete(2)


class RandomImageEnv(gym.Env):
    """Seeded random HWC uint8 frames; episodes last 5 to 9 steps."""

    observation_space = gym.spaces.Box(0, 255, (6, 5, 3), np.uint8)
    action_space = DISCRETE_2

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._left = int(self.np_random.integers(5, 10))
        return self._frame(), {}

    def step(self, action):
        self._left -= 1
        return self._frame(), 0.0, self._left == 0, False, {}

    def _frame(self):
        return self.np_random.integers(0, 256, (6, 5, 3), dtype=np.uint8)


def deterministic_action(space, step):
    """The same action for an env and its reference twin: alternating, within the space."""
    if isinstance(space, gym.spaces.Box):
        return np.full(space.shape, step % 3 - 1, dtype=space.dtype)
    return step % 2


def stacked_plan(env, leaf):
    return ModelSpec(input=leaf).compile(env.observation_space, env.action_space).observation


def run_against_reference(
    core, make_env, leaf, *, lanes, episodes_per_lane, transform, push_every=0
):
    """Drive `lanes` envs side by side with their FrameStackObservation twins; compare inputs.

    With `push_every=n`, only every n-th step assembles a payload (as a chunked model would);
    the others only push, and the next payload must still match the reference.
    """
    envs = [make_env() for _ in range(lanes)]
    references = [
        FrameStackObservation(make_env(), leaf.stack, padding_type="reset") for _ in range(lanes)
    ]
    assembler = core.ObservationAssembler(stacked_plan(envs[0], leaf))
    next_id, compared = 0, 0
    for episode in range(episodes_per_lane):
        observations, expected, ids = [], [], []
        for lane, (env, reference) in enumerate(zip(envs, references, strict=True)):
            seed = 1000 * lane + episode
            observations.append(env.reset(seed=seed)[0])
            expected.append(reference.reset(seed=seed)[0])
            ids.append(next_id + lane)
        next_id += lanes
        live = list(range(lanes))
        step = 0
        while live:
            batch = [observations[lane] for lane in live]
            batch_ids = np.array([ids[lane] for lane in live])
            if push_every and step % push_every:
                assembler.push(batch, batch_ids)
            else:
                payload = assembler.assemble(batch, batch_ids)
                for row, lane in enumerate(live):
                    np.testing.assert_array_equal(payload[row], transform(expected[lane]))
                    compared += 1
            step += 1
            for lane in list(live):
                action = deterministic_action(envs[lane].action_space, step)
                observations[lane], _, terminated, truncated, _ = envs[lane].step(action)
                expected[lane], *_ = references[lane].step(action)
                if terminated or truncated:
                    assembler.evict(ids[lane])
                    live.remove(lane)
    assert assembler.window_count == 0
    return compared


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_state_stack_matches_gymnasium_frame_stack(core, env_id):
    def make_env():
        return gym.make(env_id, max_episode_steps=40)

    leaf = State(stack=4)
    compared = run_against_reference(
        core, make_env, leaf, lanes=3, episodes_per_lane=3, transform=lambda x: x.astype(np.float32)
    )
    assert compared > 100


def test_image_stack_matches_gymnasium_frame_stack_in_chw(core):
    leaf = Image(layout="chw", stack=3)
    compared = run_against_reference(
        core,
        RandomImageEnv,
        leaf,
        lanes=2,
        episodes_per_lane=4,
        transform=lambda frames: frames.transpose(0, 3, 1, 2),
    )
    assert compared > 20


# Sizes that are not a multiple of the Rust core's 32-item copy tiles, 1 to 4 channels, and
# Atari's frame.
CHW_SHAPES = [(37, 53, 3), (33, 63, 4), (5, 3, 2), (9, 7, 1), (210, 160, 3)]


@pytest.mark.parametrize("shape", CHW_SHAPES)
@pytest.mark.parametrize(
    "image",
    [
        Image(layout="chw", stack=3),
        Image(layout="chw", dtype="float32", normalize=(-1, 1), stack=2),
        Image(layout="chw", dtype="float32"),
    ],
    ids=["uint8-stack3", "float32-normalized-stack2", "float32"],
)
def test_chw_is_numpys_transpose_with_windows_oldest_first(core, shape, image):
    space = gym.spaces.Box(0, 255, shape, np.uint8)
    assembler = core.ObservationAssembler(stacked_plan_for(space, image))
    rng = np.random.default_rng(sum(shape))
    scale = np.float32((image.normalize[1] - image.normalize[0]) / 255) if image.normalize else 1
    offset = np.float32(image.normalize[0]) if image.normalize else 0

    def model_frame(frame):
        chw = frame.transpose(2, 0, 1).astype(image.dtype)
        return chw * scale + offset if image.normalize else chw

    history = {7: [], 8: []}
    for _ in range(4):
        frames = [rng.integers(0, 256, shape, dtype=np.uint8) for _ in history]
        payload = assembler.assemble(frames, list(history))
        for row, (episode, frame) in enumerate(zip(history, frames, strict=True)):
            history[episode].append(frame)
            window = (history[episode][:1] * image.stack + history[episode])[-image.stack :]
            expected = np.stack([model_frame(f) for f in window])
            if image.stack == 1:
                expected = expected[0]
            assert payload.dtype == np.dtype(image.dtype)
            np.testing.assert_array_equal(payload[row], expected)


@pytest.mark.parametrize("dtype", ["uint8", "int16", "float32", "float64", "complex128"])
@pytest.mark.parametrize("axes", [(2, 0, 1), (1, 0, 2), (1, 2, 0), (0, 2, 1)])
def test_any_transpose_of_any_dtype_is_numpys(core, dtype, axes):
    """Plans from a spec only ask for HWC -> CHW in uint8 or float32; the cores take any
    permutation of any dtype's items."""
    shape = (35, 3, 41)
    space = gym.spaces.Box(0, 100, shape, np.float64)
    (leaf,) = stacked_plan_for(space, Image(stack=2))
    frame_shape = tuple(shape[axis] for axis in axes)
    plan = dataclasses.replace(leaf, dtype=dtype, transpose=axes, frame_shape=frame_shape)
    assembler = core.ObservationAssembler([plan])
    frames = np.random.default_rng(1).uniform(0, 100, (2, *shape)).round(1)
    payload = assembler.assemble(list(frames), [0, 1])
    expected = frames.astype(dtype).transpose(0, *(axis + 1 for axis in axes))
    assert (payload.dtype, payload.shape) == (np.dtype(dtype), (2, 2, *frame_shape))
    np.testing.assert_array_equal(payload[:, 0], expected)
    np.testing.assert_array_equal(payload[:, 1], expected)


def test_a_transpose_that_is_not_a_permutation_is_refused(core):
    space = gym.spaces.Box(0, 255, (4, 3, 2), np.uint8)
    (leaf,) = stacked_plan_for(space, Image(layout="chw"))
    for axes in [(2, 0), (2, 0, 0), (0, 1, 3)]:
        broken = dataclasses.replace(leaf, transpose=axes)
        message = f"Image(key=None): transpose {axes} is not a permutation of the source's 3 axes"
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            core.ObservationAssembler([broken])


def test_push_keeps_stacks_consecutive_between_payloads(core):
    leaf = Image(stack=4)
    compared = run_against_reference(
        core,
        RandomImageEnv,
        leaf,
        lanes=3,
        episodes_per_lane=3,
        transform=lambda x: x,
        push_every=3,
    )
    assert compared > 10


def test_first_frame_fills_the_window_and_each_episode_has_its_own(core):
    space = gym.spaces.Box(-10, 10, (2,), np.float32)
    assembler = core.ObservationAssembler(stacked_plan_for(space, State(stack=3)))
    first = assembler.assemble([np.array([1, 1], np.float32), np.array([5, 5], np.float32)], [7, 8])
    assert first.shape == (2, 3, 2)
    assert first[0].tolist() == [[1, 1]] * 3
    assert first[1].tolist() == [[5, 5]] * 3
    # Only episode 7 advances; episode 8's window is untouched.
    second = assembler.assemble([np.array([2, 2], np.float32)], [7])
    assert second[0].tolist() == [[1, 1], [1, 1], [2, 2]]
    third = assembler.assemble([np.array([6, 6], np.float32)], [8])
    assert third[0].tolist() == [[5, 5], [5, 5], [6, 6]]
    assembler.evict(7)
    assert assembler.window_count == 1
    fresh = assembler.assemble([np.array([3, 3], np.float32)], [7])
    assert fresh[0].tolist() == [[3, 3]] * 3
    assembler.evict(7)
    assembler.evict(8)
    assert assembler.window_count == 0


def stacked_plan_for(space, leaf):
    return ModelSpec(input=leaf).compile(space, DISCRETE_2).observation


DICT_SPACE = gym.spaces.Dict(
    {
        "pixels": gym.spaces.Box(0, 255, (4, 3, 3), np.uint8),
        "joints": gym.spaces.Box(-1, 1, (2, 3), np.float64),
        "grip": gym.spaces.Discrete(3),
        "lang": gym.spaces.Text(12),
        "arm": gym.spaces.Dict({"q": gym.spaces.Box(-5, 5, (4,), np.float32)}),
    }
)


def joint_norm(obs):
    return float(np.abs(obs["joints"]).sum())


def test_payload_follows_the_spec_tree_with_a_leading_lane_axis(core):
    spec = ModelSpec(
        input={
            "image": Image("pixels", layout="chw", dtype="float32", normalize=(-1, 1)),
            "state": Concat("joints", "grip", ("arm", "q")),
            "prompt": Text("lang"),
            "deep": {"joints": State("joints", dtype="float64", stack=2)},
            "norm": Custom(joint_norm),
        }
    )
    assembler = core.ObservationAssembler(spec.compile(DICT_SPACE, DISCRETE_2).observation)
    observations = [DICT_SPACE.sample() for _ in range(3)]
    payload = assembler.assemble(observations, [0, 1, 2])

    assert sorted(payload) == ["deep", "image", "norm", "prompt", "state"]
    image = payload["image"]
    assert (image.dtype, image.shape) == (np.float32, (3, 3, 4, 3))
    expected_image = observations[1]["pixels"].transpose(2, 0, 1).astype(np.float32)
    expected_image = expected_image * np.float32(2 / 255) + np.float32(-1)
    np.testing.assert_array_equal(image[1], expected_image)
    state = payload["state"]
    assert (state.dtype, state.shape) == (np.float32, (3, 6 + 1 + 4))
    expected_state = np.concatenate(
        [observations[2]["joints"].ravel(), [observations[2]["grip"]], observations[2]["arm"]["q"]]
    ).astype(np.float32)
    np.testing.assert_array_equal(state[2], expected_state)
    assert payload["prompt"] == [obs["lang"] for obs in observations]
    assert payload["deep"]["joints"].shape == (3, 2, 6)
    assert payload["deep"]["joints"].dtype == np.float64
    np.testing.assert_array_equal(payload["norm"], [joint_norm(obs) for obs in observations])


def test_a_bare_leaf_is_the_payload_and_zero_lanes_give_empty_arrays(core):
    space = gym.spaces.Box(0, 255, (4, 3, 3), np.uint8)
    assembler = core.ObservationAssembler(stacked_plan_for(space, Image(stack=2)))
    empty = assembler.assemble([], np.array([], dtype=np.int64))
    assert (empty.shape, empty.dtype) == ((0, 2, 4, 3, 3), np.uint8)
    frames = [space.sample() for _ in range(2)]
    payload = assembler.assemble(frames, [4, 5])
    assert isinstance(payload, np.ndarray) and payload.shape == (2, 2, 4, 3, 3)


@pytest.mark.parametrize("lanes", [1, 3, 5])
def test_every_array_of_a_payload_starts_on_a_64_byte_boundary(core, lanes):
    """So that JAX on the CPU takes the payload as it is (XLA shares only 64-byte aligned
    buffers; numpy's own are 16-byte aligned): every leaf, stacked or not, of any dtype and
    row size, writeable and C-contiguous, and each payload in memory of its own."""
    spec = ModelSpec(
        input={
            "image": Image("pixels", layout="chw", dtype="float32", normalize=(-1, 1)),
            "raw": Image("pixels", stack=3),
            "state": Concat("joints", "grip", ("arm", "q")),
            "deep": {"joints": State("joints", dtype="float64", stack=2)},
            "grip": State("grip", dtype="int64"),
        }
    )
    assembler = core.ObservationAssembler(spec.compile(DICT_SPACE, DISCRETE_2).observation)
    arrays = []
    for step in range(4):
        observations = [DICT_SPACE.sample() for _ in range(lanes)]
        payload = assembler.assemble(observations, list(range(lanes)))
        for leaf in (payload["image"], payload["raw"], payload["state"], payload["grip"],
                     payload["deep"]["joints"]):  # fmt: skip
            assert leaf.ctypes.data % 64 == 0, (step, leaf.dtype, leaf.shape)
            assert leaf.flags.c_contiguous and leaf.flags.writeable
            arrays.append(leaf)
        expected = observations[-1]["pixels"].transpose(2, 0, 1).astype(np.float32)
        expected = expected * np.float32(2 / 255) + np.float32(-1)
        np.testing.assert_array_equal(payload["image"][-1], expected)
    for index, array in enumerate(arrays):
        assert not any(np.shares_memory(array, other) for other in arrays[index + 1 :])


def test_raw_plan_passes_every_key_through_in_its_own_dtype(core):
    plan = compile_spec(None, DICT_SPACE, DISCRETE_2)
    observations = [DICT_SPACE.sample() for _ in range(2)]
    payload = core.ObservationAssembler(plan.observation).assemble(observations, [0, 1])
    assert payload["joints"].dtype == np.float64
    assert payload["grip"].tolist() == [obs["grip"] for obs in observations]
    np.testing.assert_array_equal(payload["arm"]["q"][1], observations[1]["arm"]["q"])
    assert payload["lang"] == [obs["lang"] for obs in observations]


class RecordingObservation(Mapping):
    """A raw observation that remembers which keys were read."""

    def __init__(self, data, reads):
        self._data, self._reads = data, reads

    def __getitem__(self, key):
        self._reads.add(key)
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)


def test_only_the_keys_the_plan_references_are_read(core):
    plan = stacked_plan_for(DICT_SPACE, {"image": Image("pixels"), "q": State(("arm", "q"))})
    reads: set[str] = set()
    observation = RecordingObservation(DICT_SPACE.sample(), reads)
    core.ObservationAssembler(plan).assemble([observation], [0])
    assert reads == {"pixels", "arm"}


def test_windows_keep_copies_not_the_envs_buffers(core):
    space = gym.spaces.Box(-10, 10, (2,), np.float32)
    assembler = core.ObservationAssembler(stacked_plan_for(space, State(stack=2)))
    buffer = np.array([1, 1], np.float32)
    assembler.assemble([buffer], [0])
    buffer[:] = 9  # a vector env reusing its observation buffer in place
    payload = assembler.assemble([buffer], [0])
    assert payload[0].tolist() == [[1, 1], [9, 9]]


def test_lists_and_python_scalars_are_read_as_arrays(core):
    space = gym.spaces.Dict({"q": gym.spaces.Box(-5, 5, (3,), np.float32), "k": DISCRETE_2})
    plan = stacked_plan_for(space, {"state": Concat("q", "k")})
    payload = core.ObservationAssembler(plan).assemble([{"q": [1, 2, 3], "k": 1}], [0])
    assert payload["state"].tolist() == [[1, 2, 3, 1]]


@pytest.mark.parametrize(
    ("observation", "message"),
    [
        (
            {"pixels": np.zeros((4, 3, 4), np.uint8), "lang": "x"},
            r'^lane 1: obs\["pixels"\] has shape \(4, 3, 4\) but the observation space '
            r"declares \(4, 3, 3\)$",
        ),
        (
            {"lang": "x"},
            r'^lane 1: obs has no key "pixels", which the model\'s input reads as obs\["pixels"\]$',
        ),
        (
            {"pixels": np.zeros((4, 3, 3), np.uint8), "lang": 3},
            r'^lane 1: obs\["lang"\] is int, but Text\(key="lang"\) reads a str$',
        ),
    ],
)
def test_an_observation_that_does_not_fit_the_space_names_lane_and_key(core, observation, message):
    plan = stacked_plan_for(DICT_SPACE, {"image": Image("pixels", stack=2), "prompt": Text("lang")})
    good = {"pixels": np.zeros((4, 3, 3), np.uint8), "lang": "ok"}
    with pytest.raises(ObservationError, match=message):
        core.ObservationAssembler(plan).assemble([good, observation], [0, 1])


def test_nested_key_missing_names_the_level(core):
    plan = stacked_plan_for(DICT_SPACE, State(("arm", "q")))
    with pytest.raises(ObservationError, match=r'^lane 0: obs\["arm"\] has no key "q"'):
        core.ObservationAssembler(plan).assemble([{"arm": {}}], [0])


def ragged(obs):
    return np.zeros(int(obs["grip"]) + 1)


def test_custom_values_that_cannot_be_stacked_are_an_observation_error(core):
    plan = stacked_plan_for(DICT_SPACE, {"r": Custom(ragged)})
    observations = [{"grip": 0}, {"grip": 2}]
    with pytest.raises(ObservationError, match=r"^Custom\(fn=ragged\) returned values that"):
        core.ObservationAssembler(plan).assemble(observations, [0, 1])


def test_episode_ids_must_match_the_observations(core):
    plan = stacked_plan_for(DICT_SPACE, Image("pixels"))
    assembler = core.ObservationAssembler(plan)
    with pytest.raises(ValueError, match=r"^episode_ids has 2 entries but lanes has 1$"):
        assembler.assemble([DICT_SPACE.sample()], [0, 1])
    with pytest.raises(ValueError, match=r"^episode_ids must hold integers, got dtype float64$"):
        assembler.push([DICT_SPACE.sample()], [0.5])


def test_scale_on_an_integer_leaf_is_refused(core):
    (leaf,) = stacked_plan_for(DICT_SPACE, State("grip", dtype="int64"))
    broken = dataclasses.replace(leaf, scale=2.0)
    with pytest.raises(ValueError, match=r'^State\(key="grip"\): scale and offset need a float'):
        core.ObservationAssembler([broken])
