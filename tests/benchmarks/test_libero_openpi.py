"""The ready-made openpi spec of the LIBERO suites: ``rlmesh eval openpi://HOST:PORT --suite
libero_*`` sends what openpi's LIBERO example sends, with no user code, and the datasets'
axis-angle convention it relies on."""

from __future__ import annotations

import json

import numpy as np
import pytest
import rlmesh
from PIL import Image
from rlmesh.benchmarks import libero
from rlmesh.cli import main
from scipy.spatial.transform import Rotation

CHUNK = np.array([[0.0, 0.0, 0.2, 0.0, 0.0, 0.1, 1.0]] * 10, np.float32)


class PayloadRecorder(rlmesh.Model):
    """An openpi LIBERO policy's stand-in: keeps every observation it is sent and answers a
    10-step chunk."""

    stateless = True

    def __init__(self):
        super().__init__()
        self.payloads = []

    def predict_chunk(self, obs, execution_horizon=None):
        self.payloads.append(obs)
        return CHUNK


def test_dataset_axis_angle_is_the_rotation_vector_with_the_quaternion_s_own_sign():
    quats = Rotation.random(200, random_state=7).as_quat()  # xyzw, any sign of w
    quats[:100] *= -1
    for quat in quats:
        vector = libero.dataset_axis_angle(quat)
        canonical = Rotation.from_quat(quat).as_rotvec()  # angle in [0, pi]
        if quat[3] >= 0:
            np.testing.assert_allclose(vector, canonical, atol=1e-9)
        else:  # the same rotation, the long way round: angle 2 pi - theta about -axis
            angle = np.linalg.norm(canonical)
            np.testing.assert_allclose(np.linalg.norm(vector), 2 * np.pi - angle, atol=1e-9)
            np.testing.assert_allclose(vector / np.linalg.norm(vector), -canonical / angle,
                                       atol=1e-9)  # fmt: skip
    np.testing.assert_array_equal(libero.dataset_axis_angle([0.0, 0.0, 0.0, 1.0]), np.zeros(3))


def test_rlmesh_eval_openpi_on_a_libero_suite_sends_openpi_s_libero_payload(tmp_path, capsys):
    model = PayloadRecorder()
    server = rlmesh.serve_model(model, protocol="openpi")
    out = tmp_path / "spatial.jsonl"
    try:
        argv = ["eval", f"openpi://{server.address.split('://')[-1]}", "--suite",
                "libero_spatial", "--tasks", "libero_spatial_00", "--episodes", "1",
                "--max-episode-steps", "3", "--horizon", "2", "--out", str(out),
                "--no-progress", "--json"]  # fmt: skip
        assert main(argv) == 0, capsys.readouterr().err
    finally:
        server.close()
    summary = json.loads(capsys.readouterr().out)
    assert summary["tasks"][0]["episodes"] == 1
    # Steps 1 and 3 ask for a chunk (2 actions replayed of each).
    assert len(model.payloads) == 2
    first = model.payloads[0]
    assert sorted(first) == ["observation/image", "observation/state",
                             "observation/wrist_image", "prompt"]  # fmt: skip
    for key in ("observation/image", "observation/wrist_image"):
        assert first[key].shape == (224, 224, 3) and first[key].dtype == np.uint8
    assert first["observation/state"].shape == (8,)
    assert first["observation/state"].dtype == np.float32

    # The same episode's first observation, from the env itself.
    env = libero.LiberoEnv("libero_spatial", 0)
    try:
        obs, _ = env.reset(seed=rlmesh.episode_seed(0, 0), options={"trial_index": 0})
    finally:
        env.close()
    assert first["prompt"] == obs["instruction"] == env.instruction
    state = np.concatenate(
        [obs["eef_pos"], libero.dataset_axis_angle(obs["eef_quat"]), obs["gripper_qpos"]]
    )
    np.testing.assert_allclose(first["observation/state"], state.astype(np.float32), rtol=1e-6)
    # The cameras upright, resized 256 -> 224 as Pillow's bilinear does (openpi's resize).
    for key, camera in (("observation/image", "agentview"), ("observation/wrist_image", "wrist")):
        expected = np.asarray(Image.fromarray(obs[camera]).resize((224, 224), Image.BILINEAR))
        difference = np.abs(first[key].astype(int) - expected.astype(int))
        assert difference.max() <= 1, key
        flipped = np.abs(first[key].astype(int) - expected[::-1, ::-1].astype(int)).mean()
        assert flipped > 10 * difference.mean() + 1, key


@pytest.mark.parametrize("suite", ["libero_goal", "libero_90", "pusht"])
def test_rlmesh_describe_prints_the_ready_made_plan_of_a_served_policy(suite, capsys):
    specs = rlmesh.benchmarks.info(suite).served_specs
    assert ("openpi" in specs) == suite.startswith("libero")
    status = main(["describe", "--suite", suite, "--model", "openpi://127.0.0.1:9"])
    printed = capsys.readouterr()
    if not specs:  # nothing ready-made: the policy's spec is its own (none: the raw payload)
        assert status == 0, printed.err
        assert "observation/state" not in printed.out
        return
    assert status == 0, printed.err
    for line in ("observation/image", "observation/wrist_image", "observation/state", "prompt"):
        assert line in printed.out
    assert "concat(eef_pos, eef_axis_angle, gripper_qpos)" in printed.out
