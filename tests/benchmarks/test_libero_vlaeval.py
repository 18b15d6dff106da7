"""The ready-made vla-eval spec of the LIBERO suites: a policy served over vla-eval's protocol
gets the observation vla-eval's own LIBERO benchmark sends (``images`` of 256 px, the
canonical rotation vector in ``states``, ``task_description``), and its gripper is snapped as
vla-eval snaps it."""

from __future__ import annotations

import numpy as np
import pytest
import rlmesh
from rlmesh.benchmarks import libero
from rlmesh.cli import main
from scipy.spatial.transform import Rotation

pytest.importorskip("websockets", reason="the openpi extra (websockets) is not installed")

GRIPPERS = [-0.3, 0.0, 0.4]


class PayloadRecorder(rlmesh.Model):
    """A vla-eval LIBERO policy's stand-in: keeps every observation it is sent and answers a
    chunk whose gripper column walks through ``GRIPPERS``."""

    stateless = True

    def __init__(self):
        super().__init__()
        self.payloads = []

    def predict_chunk(self, obs, execution_horizon=None):
        self.payloads.append(obs)
        chunk = np.zeros((len(GRIPPERS), 7), np.float32)
        chunk[:, 2] = 0.2
        chunk[:, 6] = GRIPPERS
        return chunk


class ActionRecorder(rlmesh.RunHooks):
    def __init__(self):
        self.actions = []

    def on_step(self, event):
        self.actions.append(np.asarray(event.action))


def test_a_vlaeval_policy_gets_vlaeval_s_libero_observation_and_its_gripper_snap():
    model = PayloadRecorder()
    server = rlmesh.serve_model(model, protocol="vla-eval")
    env = libero.LiberoEnv("libero_spatial", 0)
    hooks = ActionRecorder()
    try:
        remote = rlmesh.remote.VlaEvalModel(server.address, spec=libero.vlaeval_spec())
        try:
            result = rlmesh.run(remote, env, episodes=1, max_episode_steps=3,
                                execution_horizon=3, hooks=hooks)  # fmt: skip
        finally:
            remote.close()
        reference = libero.LiberoEnv("libero_spatial", 0)
        try:
            obs, _ = reference.reset(seed=rlmesh.episode_seed(0, 0), options={"trial_index": 0})
        finally:
            reference.close()
    finally:
        env.close()
        server.close()
    assert result.episodes[0].steps == 3
    assert len(model.payloads) == 1
    first = model.payloads[0]
    assert sorted(first) == ["images", "states", "task_description"]
    assert sorted(first["images"]) == ["agentview", "wrist"]
    assert first["task_description"] == obs["instruction"]
    # The cameras as rendered upright at 256 px: nothing resized, so equal to the byte.
    for camera in ("agentview", "wrist"):
        np.testing.assert_array_equal(first["images"][camera], obs[camera])
    # The state: position, the canonical rotation vector (vla-eval's quat_to_axisangle flips
    # the quaternion to w >= 0 first: angle in [0, pi]), the fingers.
    rotvec = Rotation.from_quat(obs["eef_quat"]).as_rotvec()
    assert np.linalg.norm(rotvec) <= np.pi
    state = np.concatenate([obs["eef_pos"], rotvec, obs["gripper_qpos"]]).astype(np.float32)
    np.testing.assert_allclose(first["states"], state, rtol=1e-5, atol=1e-6)
    # The gripper snapped as vla-eval's benchmark does: below 0 is -1, 0 and above +1.
    grippers = [float(action[6]) for action in hooks.actions]
    assert grippers == [-1.0, 1.0, 1.0]
    for action in hooks.actions:
        np.testing.assert_allclose(action[:6], [0.0, 0.0, 0.2, 0.0, 0.0, 0.0])


def test_the_vlaeval_spec_is_shipped_for_every_libero_suite_only():
    for name in rlmesh.benchmarks.names():
        specs = rlmesh.benchmarks.info(name).served_specs
        assert ("vla-eval" in specs) == name.startswith("libero"), name


def test_rlmesh_describe_prints_the_vlaeval_plan_of_a_libero_suite(capsys):
    status = main(["describe", "--suite", "libero_goal", "--model",
                              "vlaeval://127.0.0.1:9"])  # fmt: skip
    printed = capsys.readouterr()
    assert status == 0, printed.err
    for line in ("images", "agentview", "wrist", "states", "task_description"):
        assert line in printed.out
    assert "observation/state" not in printed.out
