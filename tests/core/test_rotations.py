"""Rotation encodings in the cores, against scipy.spatial.transform.Rotation on random
rotations: every pair of encodings, round trips, the state and the action paths, both cores
bit for bit."""

from __future__ import annotations

import itertools

import gymnasium as gym
import numpy as np
import pytest
from helpers import CORES
from rlmesh import adapters
from rlmesh.core import load_core
from scipy.spatial.transform import Rotation

ROTATIONS = Rotation.random(40, random_state=np.random.default_rng(5))


def _encode(rotation: Rotation, encoding: str) -> np.ndarray:
    """scipy's writing of ``rotation`` in ``encoding``."""
    matrix = rotation.as_matrix()
    return {
        "quat_xyzw": lambda: rotation.as_quat(),
        "quat_wxyz": lambda: np.roll(rotation.as_quat(), 1),
        "axis_angle": rotation.as_rotvec,
        "euler_xyz": lambda: rotation.as_euler("xyz"),
        "rot6d": lambda: matrix[:, :2].T.ravel(),
        "rot6d_rowmajor": lambda: matrix[:, :2].ravel(),
        "matrix": matrix.ravel,
    }[encoding]()


def _decode(values: np.ndarray, encoding: str) -> np.ndarray:
    """The rotation matrix scipy reads from ``values``."""
    if encoding == "quat_xyzw":
        return Rotation.from_quat(values).as_matrix()
    if encoding == "quat_wxyz":
        return Rotation.from_quat(np.roll(values, -1)).as_matrix()
    if encoding == "axis_angle":
        return Rotation.from_rotvec(values).as_matrix()
    if encoding == "euler_xyz":
        return Rotation.from_euler("xyz", values).as_matrix()
    if encoding == "rot6d":
        return np.stack([values[:3], values[3:], np.cross(values[:3], values[3:])], axis=1)
    if encoding == "rot6d_rowmajor":
        a, b = values[0::2], values[1::2]
        return np.stack([a, b, np.cross(a, b)], axis=1)
    return values.reshape(3, 3)


def _state_converter(core: str, source: str, target: str):
    """A core's assembler for a state leaf re-encoding ``source`` as ``target`` (float64)."""
    width = adapters.roles.encoding_width(source)
    tags = adapters.EnvTags(
        observation={"rot": adapters.StateTag(adapters.EEF_ROT, encoding=source)},
        action=adapters.Action(adapters.Actuator(adapters.ACTION_GRIPPER, dim=1)),
    )
    spec = adapters.ModelSpec(
        input=adapters.State(adapters.EEF_ROT, encoding=target, dtype="float64"),
        output=adapters.Action(adapters.Actuator(adapters.ACTION_GRIPPER, dim=1)),
    )
    space = gym.spaces.Dict({"rot": gym.spaces.Box(-np.inf, np.inf, (width,), np.float64)})
    plan = adapters.resolve(tags, space, gym.spaces.Box(-1, 1, (1,), np.float32), spec)
    assembler = load_core(core).ObservationAssembler(plan.observation)
    return lambda values: assembler.assemble([{"rot": values}], [0])[0]


PAIRS = list(itertools.permutations(adapters.ENCODINGS, 2))


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(("source", "target"), PAIRS, ids=lambda pair: str(pair))
def test_each_conversion_is_the_rotation_scipy_reads(core, source, target):
    convert = _state_converter(core, source, target)
    back = _state_converter(core, target, source)
    for rotation in ROTATIONS:
        values = _encode(rotation, source)
        ours = convert(values)
        np.testing.assert_allclose(_decode(ours, target), rotation.as_matrix(), atol=1e-9)
        if target in ("axis_angle", "rot6d", "rot6d_rowmajor", "matrix"):
            np.testing.assert_allclose(ours, _encode(rotation, target), atol=1e-9)
        elif target.startswith("quat"):  # w >= 0; scipy's sign is its own
            wanted = _encode(rotation, target)
            sign = 1.0 if np.dot(ours, wanted) >= 0 else -1.0
            np.testing.assert_allclose(ours, sign * wanted, atol=1e-9)
        # And back again: the round trip is the rotation it started from.
        np.testing.assert_allclose(_decode(back(ours), source), rotation.as_matrix(), atol=1e-9)


@pytest.mark.parametrize(("source", "target"), PAIRS, ids=lambda pair: str(pair))
def test_both_cores_convert_to_the_same_bits(source, target):
    python, rust = (_state_converter(core, source, target) for core in ("python", "rust"))
    for rotation in ROTATIONS:
        values = _encode(rotation, source)
        assert np.array_equal(python(values), rust(values))


@pytest.mark.parametrize("core", CORES)
def test_the_action_path_converts_a_model_rot6d_into_the_envs_axis_angle(core):
    tags = adapters.EnvTags(
        observation={"rot": adapters.StateTag(adapters.EEF_ROT, encoding="quat_xyzw")},
        action=adapters.Action(
            adapters.Actuator(adapters.ACTION_DELTA_ROT, dim=3, encoding="axis_angle")
        ),
    )
    spec = adapters.ModelSpec(
        input=adapters.State(adapters.EEF_ROT),
        output=adapters.Action(
            adapters.Actuator(adapters.ACTION_DELTA_ROT, dim=6, encoding="rot6d")
        ),
    )
    space = gym.spaces.Dict({"rot": gym.spaces.Box(-1, 1, (4,), np.float32)})
    action_space = gym.spaces.Box(-4, 4, (3,), np.float32)
    plan = adapters.resolve(tags, space, action_space, spec)
    applier = load_core(core).ActionApplier(plan.action)
    model = np.stack([_encode(rotation, "rot6d") for rotation in ROTATIONS]).astype(np.float32)
    action = applier.apply_actions(model, np.arange(len(model)))
    assert action.dtype == np.float32 and action.shape == (len(model), 3)
    wanted = np.stack([rotation.as_rotvec() for rotation in ROTATIONS])
    np.testing.assert_allclose(action, wanted, atol=2e-5)  # float32 throughout
    other = load_core("python" if core == "rust" else "rust").ActionApplier(plan.action)
    assert np.array_equal(action, other.apply_actions(model, np.arange(len(model))))


# Pitch at and a rounding step or a hair away from +-pi/2, where roll and yaw are coupled.
GIMBAL_EULERS = [
    (roll, sign * np.pi / 2 + delta, yaw)
    for sign in (1, -1)
    for delta in (0.0, 1e-12, -1e-12, 1e-8, -1e-8, 1e-5)
    for roll, yaw in ((0.3, 0.7), (-2.5, 1.9))
]


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("source", ["matrix", "quat_xyzw", "rot6d"])
def test_euler_angles_near_gimbal_lock_still_rebuild_the_rotation(core, source):
    to_euler = _state_converter(core, source, "euler_xyz")
    for angles in GIMBAL_EULERS:
        rotation = Rotation.from_euler("xyz", angles)
        ours = to_euler(_encode(rotation, source))
        assert -np.pi / 2 <= ours[1] <= np.pi / 2
        np.testing.assert_allclose(_decode(ours, "euler_xyz"), rotation.as_matrix(), atol=1e-9)
    # At the lock itself yaw is taken as 0, and roll and pitch are then scipy's.
    for pitch in (np.pi / 2, -np.pi / 2):
        locked = Rotation.from_euler("xyz", (0.3, pitch, 0.7))
        ours = to_euler(_encode(locked, source))
        with pytest.warns(UserWarning, match="Gimbal lock"):
            wanted = locked.as_euler("xyz")
        assert ours[2] == 0.0
        np.testing.assert_allclose(ours, wanted, atol=1e-7)
