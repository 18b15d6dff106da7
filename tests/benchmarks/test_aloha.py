"""ALOHA through rlmesh: the wrapper's observations are gym-aloha's own, seed for seed, though
it renders one camera instead of three; episodes are the same on any number of lanes, worker
processes and either core; success comes from the package's ``is_success``; a role-based model
spec runs on the env's tags alone. A step renders 640x480 on the CPU here (about 50 ms), so
the smoke tests run a few steps an episode."""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")  # before anything imports mujoco: no display here

import functools
import hashlib
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from helpers import CORES, comparable
from rlmesh import adapters
from rlmesh.errors import SpecError

pytest.importorskip("gym_aloha", reason="the aloha extra (gym-aloha) is not installed")

from rlmesh.benchmarks import aloha

ENV = f"rlmesh.benchmarks.aloha:{aloha.ENV_ID}"
RAW = {
    "insertion": "gym_aloha/AlohaInsertion-v0",
    "transfer_cube": "gym_aloha/AlohaTransferCube-v0",
}
START = np.array([0, -0.96, 1.16, 0, -0.3, 0, 0.1] * 2, np.float32)  # gym-aloha's start pose
EPISODES, CAP = 3, 3


def digest(observation):
    leaves = [observation["pixels"]["top"], observation["agent_pos"]]
    return hashlib.sha1(
        b"".join(np.ascontiguousarray(leaf).tobytes() for leaf in leaves)
    ).hexdigest()


class Recorder:
    """A deterministic policy (the state nudged by an image-dependent offset) that keeps a
    digest of every observation it is given, by (episode seed, step): what the episodes saw,
    beyond what their results say (a few steps earn no reward)."""

    def __init__(self):
        self.seen = {}

    def __call__(self, observation, context):
        if context["episode_seed"] is not None:  # not the statefulness probe
            key = (context["episode_seed"], context["predict_index"])
            self.seen[key] = digest(observation)
        shade = float(observation["pixels"]["top"].mean()) / 255.0
        offset = 0.05 * np.sin(np.arange(14) + 10.0 * shade)
        return (observation["agent_pos"] + offset).astype(np.float32)


def run(core, *, task="insertion", episodes=EPISODES, cap=CAP, **lanes):
    recorder = Recorder()
    result = rlmesh.run(
        recorder,
        functools.partial(gym.make, ENV, task=task),
        episodes=episodes,
        seed=2,
        max_episode_steps=cap,
        core=core,
        **lanes,
    )
    return comparable(result), recorder.seen


def raw_env(task, **kwargs):
    import gym_aloha  # noqa: F401  (registers the package's ids)

    return gym.make(RAW[task], disable_env_checker=True, obs_type="pixels_agent_pos", **kwargs)


def same(a, b):
    """Two observations (or infos) equal leaf for leaf, dtypes included."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    return np.array_equal(a, b) and np.asarray(a).dtype == np.asarray(b).dtype


@pytest.fixture(scope="module")
def reference():
    episodes, seen = run("python")
    assert [episode["index"] for episode in episodes] == list(range(EPISODES))
    assert [episode["success_reported"] for episode in episodes] == [True] * EPISODES
    # Each episode is its own (the seeds place the objects) and every step was seen.
    assert len(seen) == EPISODES * CAP and len(set(seen.values())) == EPISODES * CAP
    return episodes, seen


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(
    "lanes", [{"num_envs": 1}, {"num_envs": 3}, {"num_envs": 3, "workers": 2}], ids=str
)
def test_episodes_are_the_same_on_any_lanes_workers_and_core(core, lanes, reference):
    assert run(core, **lanes) == reference


@pytest.mark.benchmarks
@pytest.mark.parametrize("task", aloha.TASKS)
def test_longer_episodes_of_both_tasks_are_the_same_on_workers_and_cores(task):
    expected = run("python", task=task, episodes=4, cap=40)
    for core in CORES:
        assert run(core, task=task, episodes=4, cap=40, num_envs=2, workers=2) == expected


@pytest.mark.parametrize("task", aloha.TASKS)
def test_the_wrapper_observes_what_the_package_env_does(task):
    mine, raw = gym.make(ENV, task=task), raw_env(task)
    try:
        assert mine.observation_space == raw.observation_space
        # The action space differs on purpose: the arms' real ranges instead of (-1, 1),
        # which the start pose's elbow (1.16) already leaves.
        assert mine.action_space.shape == raw.action_space.shape
        assert START in mine.action_space and START not in raw.action_space
        # Its arm bounds are the package's actuators' control ranges (6 joints and 2 fingers
        # an arm), and its gripper range holds the fingers' range, normalized as the package
        # does.
        from gym_aloha.constants import normalize_puppet_gripper_position as normalized

        ranges = raw.unwrapped._env.physics.model.actuator_ctrlrange
        joints, finger = np.r_[0:6, 8:14], ranges[6]
        arms = np.r_[0:6, 7:13]
        np.testing.assert_allclose(mine.action_space.low[arms], ranges[joints, 0], rtol=1e-6)
        np.testing.assert_allclose(mine.action_space.high[arms], ranges[joints, 1], rtol=1e-6)
        assert 0 <= normalized(finger[0]) < normalized(finger[1]) <= 1
        grippers = mine.action_space.low[[6, 13]], mine.action_space.high[[6, 13]]
        assert np.array_equal(grippers, [[0, 0], [1, 1]])
        rng = np.random.default_rng(0)
        for seed in (0, 7):
            first, info = mine.reset(seed=seed)
            expected, expected_info = raw.reset(seed=seed)
            assert same(first, expected) and info == expected_info
            assert first in mine.observation_space
            for action in START + rng.normal(0, 0.05, (2, 14)).astype(np.float32):
                got, want = mine.step(action), raw.step(action)
                assert same(got[0], want[0]) and got[1:] == want[1:]
    finally:
        mine.close()
        raw.close()


def test_an_episode_depends_on_its_seed_alone():
    reused = gym.make(ENV, task="transfer_cube")
    try:
        first, _ = reused.reset(seed=11)
        for seed in (3, 4):  # other episodes, stepped, in between
            reused.reset(seed=seed)
            for _ in range(2):
                reused.step(START + 0.1)
        again, _ = reused.reset(seed=11)
        fresh = gym.make(ENV, task="transfer_cube")
        try:
            assert same(fresh.reset(seed=11)[0], first)
        finally:
            fresh.close()
        assert same(again, first)
        assert not same(reused.reset(seed=12)[0], first)
    finally:
        reused.close()


class RoleModel(rlmesh.Model):
    """A model that knows ALOHA only by roles: a 96x128 float image, LeRobot's 14-D state
    assembled from the arms' roles, and grippers in (-1, 1), which the tags map onto (0, 1)."""

    spec = adapters.ModelSpec(
        input={
            "image": adapters.Image(
                adapters.IMAGE_PRIMARY,
                height=96,
                width=128,
                layout="chw",
                dtype="float32",
                normalize=True,
            ),
            "state": adapters.Concat(
                adapters.JOINT_POS,
                adapters.GRIPPER_POS,
                aloha.JOINT_POS_2,
                adapters.GRIPPER_POS_2,
            ),
        },
        output=adapters.Action(
            adapters.Actuator(adapters.ACTION_JOINT_POS, dim=6),
            adapters.Actuator(adapters.ACTION_GRIPPER, dim=1, range=(-1, 1)),
            adapters.Actuator(aloha.ACTION_JOINT_POS_2, dim=6),
            adapters.Actuator(adapters.ACTION_GRIPPER_2, dim=1, range=(-1, 1)),
        ),
    )

    def __init__(self):
        self.states = []

    def predict_batch(self, payload):
        image, state = payload["image"], payload["state"]
        assert image.shape[1:] == (3, 96, 128) and image.dtype == np.float32
        assert state.shape[1:] == (14,)
        self.states.append(state.copy())
        action = state.astype(np.float32)  # hold the arms where they are...
        action[:, [6, 13]] = 1.0  # ... and open both grippers: (-1, 1)'s 1 is (0, 1)'s 1
        return action


@pytest.mark.parametrize("core", CORES)
def test_a_role_based_model_spec_runs_on_the_env_tags_alone(core):
    model = RoleModel()
    result = rlmesh.run(model, ENV, episodes=1, max_episode_steps=CAP, core=core)
    assert [episode.steps for episode in result.episodes] == [CAP]
    grippers = np.array([state[0, [6, 13]] for state in model.states])
    assert np.all(np.diff(grippers, axis=0) > 0.02), grippers  # both open, step by step
    env = aloha.AlohaEnv()
    tags = adapters.env_tags_of(env.metadata)
    plan = adapters.resolve(tags, env.observation_space, env.action_space, RoleModel.spec)
    assert '"action/gripper_2" <- model[13:14] (range (-1.0, 1.0)->(0.0, 1.0))' in (plan.describe())


def test_the_pixels_observation_and_a_smaller_image():
    env = aloha.AlohaEnv(obs_type="pixels", observation_width=160, observation_height=120)
    try:
        observation, _ = env.reset(seed=1)
        assert observation["top"].shape == (120, 160, 3) and observation in env.observation_space
        assert observation["top"].std() > 0
        frame = env.render()  # the video's frame keeps its own size
        assert frame.shape == (480, 640, 3) and frame.dtype == np.uint8
        tags = adapters.env_tags_of(env.metadata)
        spec = adapters.ModelSpec(
            input={"image": adapters.Image(adapters.IMAGE_PRIMARY, size=64, fit="crop")},
            output=RoleModel.spec.output,
        )
        adapters.resolve(tags, env.observation_space, env.action_space, spec)
    finally:
        env.close()
    assert env.metadata["render_fps"] == 50


def test_success_is_reported_by_the_env():
    episodes, _ = run("rust", episodes=1)
    assert (episodes[0]["success"], episodes[0]["success_reported"]) == (False, True)


def test_the_suite_and_its_options():
    info = aloha.SUITES["aloha"]
    assert (info.name, info.tasks, info.extra, info.module) == (
        "aloha",
        ("insertion", "transfer_cube"),
        "aloha",
        "gym_aloha",
    )
    assert info.env.endswith(":" + aloha.ENV_ID) and info.installed()
    assert (info.episodes, info.max_episode_steps) == (50, 400)
    tasks = [
        rlmesh.Task(
            name, info.env, env_kwargs={**kwargs, **info.options}, episodes=1, max_episode_steps=2
        )
        for name, kwargs in zip(info.tasks, info.task_kwargs, strict=True)
    ]
    suite = rlmesh.run_suite(lambda obs: obs["agent_pos"].astype(np.float32), tasks)
    assert [episode.steps for name in info.tasks for episode in suite[name].episodes] == [2, 2]
    stack = aloha.AlohaEnv.simulator_stack()
    assert stack["distribution"] == "gym-aloha" and stack["version"] and stack["mujoco"]
    assert stack["dm_control"] and stack["MUJOCO_GL"] == os.environ["MUJOCO_GL"]


def test_bad_arguments_name_what_was_wrong():
    with pytest.raises(ValueError, match="task is 'sort'; expected one of insertion"):
        aloha.AlohaEnv(task="sort")
    with pytest.raises(ValueError, match="obs_type is 'state'; expected one of"):
        aloha.AlohaEnv(obs_type="state")
    with pytest.raises(ValueError, match="observation_width is 1280; expected an integer from 1"):
        aloha.AlohaEnv(observation_width=1280)
    env = aloha.AlohaEnv(obs_type="pixels")  # no state: the resolver names the missing role
    tags = adapters.env_tags_of(env.metadata)
    spec = adapters.ModelSpec(
        input={"state": adapters.State(adapters.JOINT_POS)}, output=RoleModel.spec.output
    )
    with pytest.raises(SpecError, match="proprio/joint_pos"):
        adapters.resolve(tags, env.observation_space, env.action_space, spec)


def python(code, **environment):
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=environment
    )
    return out.returncode, out.stdout.strip(), out.stderr


def test_importing_the_module_imports_no_simulator():
    code = (
        "import sys, rlmesh.benchmarks.aloha as m; m.AlohaEnv(); "
        "print(sorted({'gym_aloha', 'dm_control', 'mujoco'} & set(sys.modules)))"
    )
    assert python(code, **os.environ)[:2] == (0, "[]")


def test_no_display_and_no_mujoco_gl_is_a_clear_error():
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in ("MUJOCO_GL", "DISPLAY", "WAYLAND_DISPLAY")
    }
    code = "import rlmesh.benchmarks.aloha as m; m.AlohaEnv().reset(seed=0)"
    status, _, err = python(code, **environment)
    assert status == 1 and "set MUJOCO_GL=egl (or osmesa)" in err
