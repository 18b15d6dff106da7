"""PushT through rlmesh: the wrapper is gym-pusht's env unchanged, seed for seed; episodes are
the same on any number of lanes, worker processes and either core; success comes from the
package's ``is_success``; a role-based model spec runs on the env's tags alone."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from helpers import CORES, comparable
from rlmesh import adapters
from rlmesh.errors import SpecError

pytest.importorskip("gym_pusht", reason="the pusht extra (gym-pusht) is not installed")

from rlmesh.benchmarks import pusht

ENV = f"rlmesh.benchmarks.pusht:{pusht.ENV_ID}"
RAW = "gym_pusht/PushT-v0"
EPISODES, CAP = 5, 25


def policy(observation):
    """A deterministic policy that reads both leaves: steer around the workspace, with a turn
    that depends on the image (or the keypoints), so any change of the observation changes
    the episode."""
    scene = observation["pixels"] if "pixels" in observation else observation["environment_state"]
    turn = float(np.mean(scene)) / 40.0
    target = 256.0 + 200.0 * np.sin(observation["agent_pos"][::-1] / 60.0 + turn)
    return target.astype(np.float32)


def raw_env(**kwargs):
    import gym_pusht  # noqa: F401  (registers the package's ids)

    return gym.make(RAW, disable_env_checker=True, **kwargs)


def same(a, b):
    """Two observations (or infos) equal leaf for leaf, dtypes included."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    return np.array_equal(a, b) and np.asarray(a).dtype == np.asarray(b).dtype


# pymunk's contacts make one seed's rewards differ in their last bits from run to run, in the
# package's own env too: rewards are compared to 9 decimals, everything else exactly.
DIGITS = 9


def run(core, **kwargs):
    arguments = {"episodes": EPISODES, "seed": 5, "max_episode_steps": CAP, **kwargs}
    return rlmesh.run(policy, ENV, core=core, **arguments)


@pytest.fixture(scope="module")
def reference():
    result = run("python")
    assert [episode.index for episode in result.episodes] == list(range(EPISODES))
    # The episodes differ (a mix-up of seeds or lanes would show) and all ran to the cap.
    assert len({episode.reward for episode in result.episodes}) == EPISODES
    assert {episode.steps for episode in result.episodes} == {CAP}
    assert all(episode.success_reported for episode in result.episodes)
    return comparable(result, reward_digits=DIGITS)


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(
    "lanes", [{"num_envs": 1}, {"num_envs": 3}, {"num_envs": 3, "workers": 2}], ids=str
)
def test_episodes_are_the_same_on_any_lanes_workers_and_core(core, lanes, reference):
    assert comparable(run(core, **lanes), reward_digits=DIGITS) == reference


@pytest.mark.benchmarks
@pytest.mark.parametrize("obs_type", ["pixels_agent_pos", "environment_state_agent_pos"])
def test_full_episodes_are_the_same_on_workers_and_cores(obs_type):
    env = functools.partial(gym.make, ENV, obs_type=obs_type)
    arguments = {"episodes": 10, "seed": 1, "max_episode_steps": 300}
    expected = comparable(rlmesh.run(policy, env, core="python", **arguments), reward_digits=DIGITS)
    # The policy pushes the block in most episodes: their rewards tell them apart.
    assert len({episode["reward"] for episode in expected}) > 5
    for core in CORES:
        result = rlmesh.run(policy, env, core=core, num_envs=4, workers=2, **arguments)
        assert comparable(result, reward_digits=DIGITS) == expected


@pytest.mark.parametrize("obs_type", pusht.OBS_TYPES)
def test_the_wrapper_is_the_package_env_seed_for_seed(obs_type):
    mine, raw = gym.make(ENV, obs_type=obs_type), raw_env(obs_type=obs_type)
    try:
        assert mine.observation_space == raw.observation_space
        assert mine.action_space == raw.action_space
        rng = np.random.default_rng(0)
        for seed in (0, 7):
            first, info = mine.reset(seed=seed)
            expected, expected_info = raw.reset(seed=seed)
            assert same(first, expected) and same(info, expected_info)
            assert first in mine.observation_space
            for action in rng.uniform(0, 512, (4, 2)).astype(np.float32):
                got, want = mine.step(action), raw.step(action)
                assert same(got[0], want[0]) and got[1:4] == want[1:4]
                assert same(got[4], want[4])
    finally:
        mine.close()
        raw.close()


def test_an_episode_depends_on_its_seed_alone():
    reused = gym.make(ENV)
    try:
        first, _ = reused.reset(seed=11)
        for seed in (3, 4):  # other episodes, stepped, in between
            reused.reset(seed=seed)
            for _ in range(3):
                reused.step(reused.action_space.sample())
        again, _ = reused.reset(seed=11)
        fresh = gym.make(ENV)
        try:
            assert same(fresh.reset(seed=11)[0], first)
        finally:
            fresh.close()
        assert same(again, first)
        assert not same(reused.reset(seed=12)[0], first)
    finally:
        reused.close()


class AtTheGoal(gym.Wrapper):
    """The real PushT, its block reset onto the goal pose (99.5% covered: the package sets the
    position before the angle, which turns the block about its centre of gravity, hence not
    the goal's (256, 256)), the pusher away from it: the first step succeeds."""

    def reset(self, *, seed=None, options=None):
        return self.env.reset(
            seed=seed, options={"reset_to_state": [100, 100, 224, 243, np.pi / 4]}
        )


@pytest.mark.parametrize("core", CORES)
def test_success_is_the_package_is_success_and_ends_the_episode(core):
    at_goal = rlmesh.run(
        lambda obs: np.array([100, 100], np.float32),
        lambda: AtTheGoal(pusht.PushTEnv()),
        episodes=2,
        max_episode_steps=CAP,
        core=core,
    )
    assert [(e.success, e.success_reported, e.steps) for e in at_goal.episodes] == [
        (True, True, 1)
    ] * 2
    anywhere = run(core, episodes=2)
    assert [(e.success, e.success_reported) for e in anywhere.episodes] == [(False, True)] * 2


class RoleModel(rlmesh.Model):
    """A model that knows PushT only by roles: a 64x64 float image, the pusher's position and
    a target in (-1, 1), which the env's tags map onto its (0, 512) workspace."""

    spec = adapters.ModelSpec(
        input={
            "image": adapters.Image(
                adapters.IMAGE_PRIMARY, size=64, layout="chw", dtype="float32", normalize=True
            ),
            "state": adapters.State(adapters.JOINT_POS),
        },
        output=adapters.Action(adapters.Actuator(adapters.ACTION_JOINT_POS, dim=2, range=(-1, 1))),
    )

    def __init__(self):
        self.seen = []

    def predict_batch(self, payload):
        image, state = payload["image"], payload["state"]
        assert image.shape[1:] == (3, 64, 64) and image.dtype == np.float32
        assert state.shape[1:] == (2,)
        self.seen.append(state.copy())
        return np.ones((len(state), 2), np.float32)  # the far corner: (512, 512)


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("lanes", [{}, {"num_envs": 2, "workers": 2}], ids=str)
def test_a_role_based_model_spec_runs_on_the_env_tags_alone(core, lanes):
    model = RoleModel()  # with workers, the tags come from the workers' envs
    result = rlmesh.run(model, ENV, episodes=2, max_episode_steps=15, core=core, **lanes)
    assert [episode.steps for episode in result.episodes] == [15, 15]
    # Mapped onto the workspace, +1 is the corner (512, 512): the pusher heads there.
    start, end = model.seen[0][0], model.seen[14][0]
    assert np.all(end > start + 20), (start, end)
    tags = adapters.env_tags_of(pusht.PushTEnv().metadata)
    env = pusht.PushTEnv()
    plan = adapters.resolve(tags, env.observation_space, env.action_space, RoleModel.spec)
    assert "range (-1.0, 1.0)->(0.0, 512.0)" in plan.describe()


@pytest.mark.parametrize("obs_type", pusht.OBS_TYPES)
def test_the_tags_fit_every_observation_type(obs_type):
    env = pusht.PushTEnv(obs_type=obs_type)
    tags = adapters.env_tags_of(env.metadata)
    spec = adapters.ModelSpec(
        input={"state": adapters.State(adapters.JOINT_POS)},
        output=adapters.Action(adapters.Actuator(adapters.ACTION_JOINT_POS, dim=2)),
    )
    if obs_type == "pixels":  # no state: the resolver says which role is missing
        with pytest.raises(SpecError, match="proprio/joint_pos"):
            adapters.resolve(tags, env.observation_space, env.action_space, spec)
    else:
        adapters.resolve(tags, env.observation_space, env.action_space, spec)


def test_render_gives_frames_and_videos_record(tmp_path):
    env = pusht.PushTEnv(visualization_width=200, visualization_height=160)
    with pytest.raises(gym.error.ResetNeeded):
        env.render()
    env.reset(seed=1)
    frame = env.render()
    assert frame.shape == (160, 200, 3) and frame.dtype == np.uint8 and frame.std() > 0
    env.close()
    assert env.metadata["render_fps"] == 10
    rlmesh.run(policy, ENV, episodes=1, max_episode_steps=5, record_video=1, video_dir=tmp_path)
    assert [path.suffix for path in tmp_path.iterdir()] == [".mp4"]


def test_the_suite_and_its_options():
    info = pusht.SUITES["pusht"]
    assert (info.name, info.tasks, info.extra, info.module) == (
        "pusht",
        ("pusht",),
        "pusht",
        "gym_pusht",
    )
    assert info.env.endswith(":" + pusht.ENV_ID) and info.installed()
    assert len(info.task_kwargs) == len(info.tasks)
    assert (info.episodes, info.max_episode_steps) == (50, 300)
    tasks = [
        rlmesh.Task(
            name,
            info.env,  # the public id: importing rlmesh.benchmarks registers it
            env_kwargs={**kwargs, **info.options},
            episodes=2,
            max_episode_steps=4,
        )
        for name, kwargs in zip(info.tasks, info.task_kwargs, strict=True)
    ]
    suite = rlmesh.run_suite(policy, tasks)
    assert [episode.steps for episode in suite["pusht"].episodes] == [4, 4]
    stack = pusht.PushTEnv.simulator_stack()
    assert stack["distribution"] == "gym-pusht" and stack["version"] and stack["pymunk"]


def test_bad_arguments_name_what_was_wrong():
    with pytest.raises(ValueError, match="obs_type is 'depth'; expected one of pixels_agent_pos"):
        pusht.PushTEnv(obs_type="depth")
    with pytest.raises(ValueError, match="observation_width is 0"):
        pusht.PushTEnv(observation_width=0)
    with pytest.raises(ValueError, match="render_mode is 'human'"):
        pusht.PushTEnv(render_mode="human")


def test_importing_the_module_imports_no_simulator():
    code = (
        "import sys, rlmesh.benchmarks.pusht as m; m.PushTEnv(); "
        "print(sorted({'gym_pusht', 'pygame', 'pymunk'} & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=os.environ
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
