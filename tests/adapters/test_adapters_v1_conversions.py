"""Role-based conversions the conformance vectors leave out, in both cores: an env storing its
camera channels-first, an optional camera the env lacks (zero or fill frames), and frame
stacking over converted leaves (resize, flip, rotation re-encoding, concatenation)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from helpers import CORES
from rlmesh import adapters
from rlmesh.core import load_core
from rlmesh.errors import SpecError

GRIPPER = adapters.Action(adapters.Actuator(adapters.ACTION_GRIPPER, dim=1))
GRIPPER_SPACE = gym.spaces.Box(-1, 1, (1,), np.float32)


def _assembler(core, tags, observation_space, model_input):
    spec = adapters.ModelSpec(input=model_input, output=GRIPPER)
    plan = adapters.resolve(tags, observation_space, GRIPPER_SPACE, spec)
    return plan, load_core(core).ObservationAssembler(plan.observation)


def _camera_tags(layout: str, upside_down: bool = False) -> adapters.EnvTags:
    return adapters.EnvTags(
        observation={
            "cam": adapters.ImageTag(adapters.IMAGE_PRIMARY, layout=layout, upside_down=upside_down)
        },
        action=GRIPPER,
    )


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("resample", ["bilinear", "bilinear_aa"])
@pytest.mark.parametrize("model_layout", ["hwc", "chw"])
def test_a_channels_first_camera_is_read_as_its_pixels_are(core, resample, model_layout):
    rng = np.random.default_rng(11)
    hwc = rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)
    chw = np.ascontiguousarray(hwc.transpose(2, 0, 1))
    image = adapters.Image(
        adapters.IMAGE_PRIMARY, height=12, width=16, resample=resample, layout=model_layout
    )
    payloads = []
    for layout, frame in (("hwc", hwc), ("chw", chw)):
        space = gym.spaces.Dict({"cam": gym.spaces.Box(0, 255, frame.shape, np.uint8)})
        plan, assembler = _assembler(core, _camera_tags(layout, upside_down=True), space, image)
        payloads.append(assembler.assemble([{"cam": frame}], [0])[0])
    assert "chw->hwc, flip 180" in plan.describe()
    assert payloads[0].shape == ((12, 16, 3) if model_layout == "hwc" else (3, 12, 16))
    assert payloads[1].dtype == np.uint8 and np.array_equal(payloads[0], payloads[1])


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(("fill", "dtype"), [(None, "uint8"), (7, "uint8"), (0.5, "float32")])
def test_an_optional_camera_the_env_lacks_is_a_blank_frame(core, fill, dtype):
    space = gym.spaces.Dict({"cam": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)})
    model_input = {
        "primary": adapters.Image(adapters.IMAGE_PRIMARY, size=4),
        "wrist": adapters.Image(
            adapters.IMAGE_WRIST,
            height=5,
            width=6,
            channels=3,
            optional=True,
            fill=fill,
            dtype=dtype,
            layout="chw",
            stack=2,
        ),
    }
    plan, assembler = _assembler(core, _camera_tags("hwc"), space, model_input)
    assert '"wrist" <- zeros(5x6x3)' in plan.describe()
    assert plan.advisories() == [
        'image "wrist": the env provides no source camera; using a blank (zero) frame'
    ]
    frames = [np.full((8, 8, 3), value, np.uint8) for value in (10, 200)]
    for step, frame in enumerate(frames):
        wrist = assembler.assemble([{"cam": frame}, {"cam": frame}], [0, 1])["wrist"]
        assert wrist.shape == (2, 2, 3, 5, 6) and wrist.dtype == np.dtype(dtype), step
        assert np.array_equal(wrist, np.full(wrist.shape, 0 if fill is None else fill, dtype))


ROT_TAGS = adapters.EnvTags(
    observation={
        "cam": adapters.ImageTag(adapters.IMAGE_PRIMARY, upside_down=True),
        "pos": adapters.StateTag(adapters.EEF_POS),
        "quat": adapters.StateTag(adapters.EEF_ROT, encoding="quat_wxyz"),
    },
    action=GRIPPER,
)
ROT_SPACE = gym.spaces.Dict(
    {
        "cam": gym.spaces.Box(0, 255, (20, 24, 3), np.uint8),
        "pos": gym.spaces.Box(-1, 1, (3,), np.float32),
        "quat": gym.spaces.Box(-1, 1, (4,), np.float32),
    }
)


def _converted_input(stack: int) -> dict:
    return {
        "image": adapters.Image(
            adapters.IMAGE_PRIMARY,
            height=10,
            width=12,
            resample="bilinear_aa",
            dtype="float32",
            normalize=(-1, 1),
            layout="chw",
            stack=stack,
        ),
        "state": adapters.Concat(
            adapters.EEF_POS,
            adapters.State(adapters.EEF_ROT, encoding="rot6d"),
            adapters.State(adapters.EEF_POS_2, dim=3, optional=True),
            pad_to=14,
            stack=stack,
        ),
    }


@pytest.mark.parametrize("core", CORES)
def test_frame_stacking_windows_hold_the_converted_frames_per_episode(core):
    rng = np.random.default_rng(4)

    def observation():
        quat = rng.normal(size=4)
        return {
            "cam": rng.integers(0, 256, (20, 24, 3), dtype=np.uint8),
            "pos": rng.uniform(-1, 1, 3).astype(np.float32),
            "quat": (quat / np.linalg.norm(quat)).astype(np.float32),
        }

    _, stacked = _assembler(core, ROT_TAGS, ROT_SPACE, _converted_input(stack=3))
    _, single = _assembler(core, ROT_TAGS, ROT_SPACE, _converted_input(stack=1))
    # Two lanes; lane 1's episode 7 ends after two steps and episode 8 starts there.
    steps = [[observation(), observation()] for _ in range(4)]
    episodes = [[5, 7], [5, 7], [5, 8], [5, 8]]
    seen: dict[int, list] = {}
    for lanes, ids in zip(steps, episodes, strict=True):
        payload = stacked.assemble(lanes, ids)
        for lane, (raw, episode) in enumerate(zip(lanes, ids, strict=True)):
            frame = single.assemble([raw], [episode])
            history = seen.setdefault(episode, [])
            history.append(frame)
            window = ([history[0]] * 3 + history)[-3:]  # the first frame fills the window
            for key in ("image", "state"):
                wanted = np.stack([past[key][0] for past in window])
                assert payload[key].dtype == np.float32
                assert np.array_equal(payload[key][lane], wanted), (key, lane, ids)
    state = payload["state"][0, -1]
    assert state.shape == (14,) and np.array_equal(state[9:], np.zeros(5, np.float32))


def _affine(values, source, target):
    """``values`` mapped linearly from the range ``source`` onto ``target`` (the reference)."""
    (lo, hi), (to_lo, to_hi) = source, target
    return (np.asarray(values, np.float64) - lo) / (hi - lo) * (to_hi - to_lo) + to_lo


STATE_SPACE = gym.spaces.Dict(
    {
        "joints": gym.spaces.Box(-2, 2, (5,), np.float32),
        "grip": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
        "flat": gym.spaces.Box(
            np.array([0, 0, 0, -1, -5], np.float32), np.array([4, 4, 4, 1, 5], np.float32)
        ),
    }
)
STATE_TAGS = adapters.EnvTags(
    observation={
        "joints": adapters.StateTag(adapters.JOINT_POS),
        "grip": adapters.StateTag(adapters.GRIPPER_POS, range=(0, 0.08)),
        "flat": adapters.Split(
            adapters.Field(adapters.EEF_POS, dim=3),
            adapters.Field(adapters.JOINT_VEL, dim=1),
            adapters.Field(dim=1),
        ),
    },
    action=GRIPPER,
)


@pytest.mark.parametrize("core", CORES)
def test_state_parts_map_ranges_select_and_reshape_as_the_reference_does(core):
    model_input = {
        "state": adapters.Concat(
            adapters.State(adapters.JOINT_POS, dim=4, range=(-1, 1)),  # the space's bounds
            adapters.State(adapters.GRIPPER_POS, index=0, range=(0, 1)),  # the tag's range
            adapters.State(adapters.EEF_POS, range=(-1, 1)),  # a Split slice's bounds
            adapters.State(adapters.JOINT_VEL, range=(0, 10)),
            reshape=(3, 3),
            dtype="float64",
        ),
        "listed": adapters.State(adapters.JOINT_POS, index=4, container="list"),
    }
    plan, assembler = _assembler(core, STATE_TAGS, STATE_SPACE, model_input)
    assert "joints[:4] (range (-2.0, 2.0)->(-1.0, 1.0))" in plan.describe()
    assert "grip[0] (range (0.0, 0.08)->(0.0, 1.0))" in plan.describe()
    rng = np.random.default_rng(9)
    lanes = [
        {
            "joints": rng.uniform(-2, 2, 5).astype(np.float32),
            "grip": rng.uniform(0, 0.08, 2).astype(np.float32),
            "flat": rng.uniform([0, 0, 0, -1, -5], [4, 4, 4, 1, 5]).astype(np.float32),
        }
        for _ in range(3)
    ]
    payload = assembler.assemble(lanes, [0, 1, 2])
    for lane, raw in enumerate(lanes):
        wanted = np.concatenate(
            [
                _affine(raw["joints"][:4], (-2, 2), (-1, 1)),
                _affine(raw["grip"][:1], (0, 0.08), (0, 1)),
                _affine(raw["flat"][:3], (0, 4), (-1, 1)),
                _affine(raw["flat"][3:4], (-1, 1), (0, 10)),
            ]
        ).reshape(3, 3)
        assert payload["state"].dtype == np.float64
        np.testing.assert_allclose(payload["state"][lane], wanted, rtol=0, atol=1e-6)
        assert payload["listed"][lane] == pytest.approx([float(raw["joints"][4])])


@pytest.mark.parametrize(
    ("tag", "message"),
    [
        (
            adapters.StateTag(adapters.JOINT_POS, range=(-1, 1)),
            r'state "joints" \("proprio/joint_pos"\) declares range \(-1\.0, 1\.0\), but its '
            r"space bounds it to \(-2\.0, 2\.0\)",
        ),
        (
            adapters.Split(adapters.Field(adapters.JOINT_POS, dim=5, range=(-2, 2.5))),
            r'state "joints"\[0:5\] .* but its space bounds it to \(-2\.0, 2\.0\)',
        ),
    ],
)
def test_a_tag_range_the_space_bounds_contradict_is_refused(tag, message):
    tags = adapters.EnvTags(observation={"joints": tag}, action=GRIPPER)
    space = gym.spaces.Dict({"joints": STATE_SPACE["joints"]})
    spec = adapters.ModelSpec(input=adapters.State(adapters.JOINT_POS), output=GRIPPER)
    with pytest.raises(SpecError, match=message):
        adapters.resolve(tags, space, GRIPPER_SPACE, spec)
    # The same range where the space is unbounded is what the tag is for.
    unbounded = gym.spaces.Dict({"joints": gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)})
    adapters.resolve(tags, unbounded, GRIPPER_SPACE, spec)


@pytest.mark.parametrize("core", CORES)
def test_an_optional_env_actuator_gets_its_fill_and_a_role_the_env_lacks_is_dropped(core):
    env_action = adapters.Action(
        adapters.Actuator(adapters.ACTION_DELTA_POS, dim=3),
        adapters.Actuator(adapters.ACTION_GRIPPER_2, dim=1, optional=True, fill=-1.0),
        adapters.Actuator(adapters.ACTION_GRIPPER, dim=1, range=(-1, 1)),
    )
    model_action = adapters.Action(
        adapters.Actuator(adapters.ACTION_GRIPPER, dim=1, range=(0, 1)),
        adapters.Actuator(adapters.ACTION_DELTA_ROT, dim=3, encoding="axis_angle"),
        adapters.Actuator(adapters.ACTION_DELTA_POS, dim=3),
    )
    tags = adapters.EnvTags(
        observation={"pos": adapters.StateTag(adapters.EEF_POS)}, action=env_action
    )
    spec = adapters.ModelSpec(input=adapters.State(adapters.EEF_POS), output=model_action)
    space = gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (3,), np.float32)})
    plan = adapters.resolve(tags, space, gym.spaces.Box(-5, 5, (5,), np.float32), spec)
    assert (
        '"action/gripper_2" <- fill -1.0 (1d; model did not output this optional role)'
        in plan.describe()
    )
    model = np.random.default_rng(2).uniform(-1, 1, (4, 7)).astype(np.float32)
    action = load_core(core).ActionApplier(plan.action).apply_actions(model, np.arange(4))
    wanted = np.concatenate(
        [model[:, 4:7], np.full((4, 1), -1.0), _affine(model[:, :1], (0, 1), (-1, 1))], axis=1
    )
    assert action.dtype == np.float32 and action.shape == (4, 5)
    np.testing.assert_allclose(action, wanted, rtol=0, atol=1e-6)
