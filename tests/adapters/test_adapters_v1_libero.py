"""A LIBERO-like env evaluated end to end by a role-based model spec: an upside-down 128x128
camera resized to 224, a quaternion re-encoded as rot6d, a concatenated state, a rot6d
action mapped back to the env's axis-angle; results identical across lanes and cores."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from helpers import CORES, comparable
from rlmesh import adapters, cli

TAGS = adapters.EnvTags(
    observation={
        "agentview_image": adapters.ImageTag(adapters.IMAGE_PRIMARY, upside_down=True),
        "robot0_eef_pos": adapters.StateTag(adapters.EEF_POS),
        "robot0_eef_quat": adapters.StateTag(adapters.EEF_ROT, encoding="quat_xyzw"),
        "robot0_gripper_qpos": adapters.StateTag(adapters.GRIPPER_POS),
        "instruction": adapters.TextTag(adapters.INSTRUCTION),
    },
    action=adapters.Action(
        adapters.Actuator(adapters.ACTION_DELTA_POS, dim=3),
        adapters.Actuator(adapters.ACTION_DELTA_ROT, dim=3, encoding="axis_angle"),
        adapters.Actuator(adapters.ACTION_GRIPPER, dim=1, range=(-1, 1)),
        clip=(-1, 1),
    ),
)

SPEC = adapters.ModelSpec(
    input={
        "image": adapters.Image(
            adapters.IMAGE_PRIMARY,
            size=224,
            resample="bilinear_aa",
            allow_upscale=True,
            layout="chw",
            dtype="float32",
            normalize=True,
            stack=2,
        ),
        "state": adapters.Concat(
            adapters.EEF_POS,
            adapters.State(adapters.EEF_ROT, encoding="rot6d"),
            adapters.State(adapters.GRIPPER_POS, dim=1),
        ),
        "task": adapters.Text(adapters.INSTRUCTION),
    },
    output=adapters.Action(
        adapters.Actuator(adapters.ACTION_DELTA_POS, dim=3),
        adapters.Actuator(adapters.ACTION_DELTA_ROT, dim=6, encoding="rot6d"),
        adapters.Actuator(adapters.ACTION_GRIPPER, dim=1, range=(0, 1), binary=True),
    ),
)


class LiberoLike(gym.Env):
    """A reach task with LIBERO's observation layout; the image draws the end effector."""

    def __init__(self):
        self.metadata = {adapters.ENV_TAGS_METADATA_KEY: TAGS.to_dict()}

    observation_space = gym.spaces.Dict(
        {
            "agentview_image": gym.spaces.Box(0, 255, (128, 128, 3), np.uint8),
            "robot0_eef_pos": gym.spaces.Box(-2, 2, (3,), np.float32),
            "robot0_eef_quat": gym.spaces.Box(-1, 1, (4,), np.float32),
            "robot0_gripper_qpos": gym.spaces.Box(-1, 1, (2,), np.float32),
            "instruction": gym.spaces.Text(64),
        }
    )
    action_space = gym.spaces.Box(-1, 1, (7,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._pos = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        quat = self.np_random.normal(size=4)
        self._quat = (quat / np.linalg.norm(quat)).astype(np.float32)
        self._gripper = np.float32(0.04)
        self._steps = 0
        return self._observation(), {}

    def _observation(self):
        image = np.zeros((128, 128, 3), np.uint8)
        row, column = (np.clip((self._pos[:2] + 2) / 4 * 127, 0, 127)).astype(int)
        image[row : row + 9, column : column + 9] = (255, 128, int(self._steps * 9 % 256))
        return {
            "agentview_image": image[::-1, ::-1].copy(),  # the camera is mounted upside down
            "robot0_eef_pos": self._pos.copy(),
            "robot0_eef_quat": self._quat.copy(),
            "robot0_gripper_qpos": np.array([self._gripper, -self._gripper], np.float32),
            "instruction": "put the bowl on the plate",
        }

    def step(self, action):
        self._steps += 1
        self._pos = np.clip(self._pos + 0.2 * action[:3], -2, 2).astype(np.float32)
        self._gripper = np.float32(0.04 if action[6] > 0 else 0.0)
        distance = float(np.linalg.norm(self._pos))
        return self._observation(), -distance, distance < 0.2, False, {"is_success": distance < 0.2}


class RoleModel(rlmesh.Model):
    """Steers toward the origin from the state, and reads the image and instruction."""

    spec = SPEC

    def predict_batch(self, payload):
        image, state, task = payload["image"], payload["state"], payload["task"]
        assert image.shape[1:] == (2, 3, 224, 224) and image.dtype == np.float32
        assert state.shape[1:] == (10,)
        assert all(text == "put the bowl on the plate" for text in task)
        brightness = image[:, -1].mean(axis=(1, 2, 3))
        rot6d = np.tile(np.array([1, 0, 0, 0, 1, 0], np.float32), (len(state), 1))
        rot6d[:, 1] = brightness  # a small turn that depends on the (resized) image
        gripper = (state[:, 9:10] > 0.02).astype(np.float32)
        return np.concatenate([-state[:, :3], rot6d, gripper], axis=1).astype(np.float32)


def _run(core, num_envs):
    return rlmesh.run(
        RoleModel(),
        LiberoLike,
        episodes=6,
        num_envs=num_envs,
        seed=3,
        max_episode_steps=12,
        core=core,
    )


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("num_envs", [1, 3])
def test_a_libero_like_run_is_the_same_for_every_lane_count_and_core(core, num_envs):
    reference = _run("python", 1)
    assert [episode.index for episode in reference.episodes] == list(range(6))
    assert comparable(_run(core, num_envs)) == comparable(reference)


def test_the_plan_says_what_it_converts():
    plan = adapters.resolve(TAGS, LiberoLike.observation_space, LiberoLike.action_space, SPEC)
    lines = plan.describe().splitlines()
    assert lines[1] == (
        '  "image" <- image "agentview_image" (flip 180, resize 224x224 (bilinear_aa), '
        "normalize /255, float32, hwc->chw)"
    )
    assert lines[2] == (
        '  "state" <- concat(robot0_eef_pos, robot0_eef_quat (quat_xyzw->rot6d), '
        "robot0_gripper_qpos[:1])"
    )
    assert '"action/delta_eef_rot" <- model[3:9] (rot6d->axis_angle)' in plan.describe()


def test_rlmesh_describe_prints_the_plan_and_advisories_without_running(tmp_path, capsys):
    here = __file__
    expected = adapters.resolve(
        TAGS, LiberoLike.observation_space, LiberoLike.action_space, SPEC
    ).describe()
    # The tags from the env's metadata...
    status = cli.main(["describe", "--env", f"{here}:LiberoLike", "--model", f"{here}:RoleModel"])
    assert (status, capsys.readouterr().out) == (0, expected + "\n")
    # ... or from a tags file, which replaces them: this one tags no instruction.
    tags = TAGS.to_dict()
    tags["observation"].pop("instruction")
    tags_file = tmp_path / "tags.json"
    tags_file.write_text(json.dumps(tags))
    argv = ["describe", "--env", f"{here}:LiberoLike", "--tags", str(tags_file)]
    status = cli.main([*argv, "--model", f"{here}:RoleModel"])
    captured = capsys.readouterr()
    assert status == 1
    assert 'needs text role "text/instruction"' in captured.err


def test_rlmesh_describe_names_the_roles_an_untagged_env_lacks(capsys):
    status = cli.main(["describe", "--env", "CartPole-v1", "--model", f"{__file__}:RoleModel"])
    assert status == 1
    assert "the env has no tags" in capsys.readouterr().err


class NeverStepped(LiberoLike):
    """LiberoLike whose episodes cannot start: describing it must not try."""

    def reset(self, *, seed=None, options=None):
        raise AssertionError("rlmesh describe reset the env")

    def step(self, action):
        raise AssertionError("rlmesh describe stepped the env")


class SecondArmModel(RoleModel):
    """Reads a second arm's position too, which the one-armed env lacks: zero-filled."""

    spec = adapters.ModelSpec(
        input={
            **SPEC.input,
            "state_2": adapters.Concat(adapters.State(adapters.EEF_POS_2, dim=3, optional=True)),
        },
        output=SPEC.output,
    )


def test_rlmesh_describe_prints_the_advisories_and_starts_no_episode(capsys):
    plan = adapters.resolve(
        TAGS, LiberoLike.observation_space, LiberoLike.action_space, SecondArmModel.spec
    )
    assert plan.advisories()  # the zero-filled second arm
    argv = [
        "describe",
        "--env",
        f"{__file__}:NeverStepped",
        "--model",
        f"{__file__}:SecondArmModel",
    ]
    status = cli.main(argv)
    lines = [plan.describe(), *(f"advisory: {advisory}" for advisory in plan.advisories())]
    assert (status, capsys.readouterr().out) == (0, "\n".join(lines) + "\n")


class Untagged(LiberoLike):
    """LiberoLike without tags in its metadata."""

    def __init__(self):
        self.metadata = {}


class TaggedWithoutInstruction(LiberoLike):
    """LiberoLike whose own tags miss the instruction the model reads."""

    def __init__(self):
        tags = TAGS.to_dict()
        tags["observation"].pop("instruction")
        self.metadata = {adapters.ENV_TAGS_METADATA_KEY: tags}


@pytest.mark.parametrize("core", CORES)
def test_tags_passed_to_run_pair_as_the_envs_own_tags_do(core):
    run = {"episodes": 3, "num_envs": 2, "seed": 3, "max_episode_steps": 12, "core": core}
    own = rlmesh.run(RoleModel(), LiberoLike, **run)
    passed = rlmesh.run(RoleModel(), Untagged, env_tags=TAGS, **run)
    assert comparable(passed) == comparable(own)
    # As JSON text too; and the run's tags are used over the env's own.
    with pytest.raises(rlmesh.errors.SpecError, match='needs text role "text/instruction"'):
        rlmesh.run(RoleModel(), TaggedWithoutInstruction, **run)
    instead = rlmesh.run(RoleModel(), TaggedWithoutInstruction, env_tags=TAGS.to_json(), **run)
    assert comparable(instead) == comparable(own)
