"""Meta-World through rlmesh: episode k is the benchmark's variation k mod 50 on any lanes,
workers and core; success is Meta-World's flag at any step, sticky, and ends the episode; a
role-based model spec runs on the env's tags alone; frames stand upright; the static task
lists and bounds are the installed package's."""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering, before mujoco is imported

import functools
import gc
import json
import pickle
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from gymnasium.utils.env_checker import check_env
from helpers import CORES, comparable
from rlmesh import adapters
from rlmesh.errors import SpecError
from rlmesh.suites import TASK_NAME

pytest.importorskip("metaworld", reason="the metaworld extra (metaworld) is not installed")

import metaworld
from rlmesh.benchmarks import metaworld as mw

SEED = mw.DEFAULT_BENCHMARK_SEED
WOBBLE = np.random.default_rng(0).normal(0.0, 1.0, (4, 39))


def policy(obs):
    """Deterministic: toward the goal, plus a turn that depends on the whole state, so that
    some episodes succeed within the cap and others do not."""
    toward = np.clip(8.0 * (obs[36:39] - obs[:3]), -1.0, 1.0)
    wobble = np.tanh(WOBBLE @ obs)
    return np.concatenate([toward + 0.35 * wobble[:3], wobble[3:]]).astype(np.float32)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One variation cache for the module (its worker processes read what the first drew)."""
    return str(tmp_path_factory.mktemp("metaworld-cache"))


def factory(cache, task="reach-v3", **kwargs):
    return functools.partial(gym.make, mw.SUITE_ENV, task=task, cache_dir=cache, **kwargs)


@functools.lru_cache(maxsize=4)
def raw_benchmark(name, task="reach-v3"):
    """Meta-World's own benchmark, as its users build it."""
    if name == "MT1":
        return metaworld.MT1(task, seed=SEED)
    return getattr(metaworld, name)(seed=SEED)


def raw_env(benchmark, task, variation, **kwargs):
    """Meta-World's env for ``task``, set to the benchmark's variation ``variation``."""
    built = raw_benchmark(benchmark, task)
    env = built.train_classes[task](**kwargs)
    env.set_task([item for item in built.train_tasks if item.env_name == task][variation])
    return env


@pytest.fixture(scope="module")
def reference(cache):
    result = rlmesh.run(policy, factory(cache), episodes=6, seed=5, max_episode_steps=45)
    assert [episode.index for episode in result.episodes] == list(range(6))
    # The episodes differ, some succeed (ended early) and some run to the cap.
    assert len({episode.reward for episode in result.episodes}) == 6
    outcomes = {(episode.success, episode.steps < 45) for episode in result.episodes}
    assert outcomes == {(True, True), (False, False)}
    assert all(episode.success_reported for episode in result.episodes)
    return comparable(result)


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(
    "lanes", [{"num_envs": 1}, {"num_envs": 3}, {"num_envs": 3, "workers": 2}], ids=str
)
def test_episodes_are_the_same_on_any_lanes_workers_and_core(core, lanes, cache, reference):
    result = rlmesh.run(
        policy,
        factory(cache),
        episodes=6,
        seed=5,
        max_episode_steps=45,
        core=core,
        **lanes,
    )
    assert comparable(result) == reference


class FirstObservations(rlmesh.Model):
    """Records each episode's first observation, by the episode's seed; stands still."""

    def __init__(self):
        self.first = {}

    def predict(self, obs, context):
        if context["predict_index"] == 0:
            self.first[context["episode_seed"]] = np.array(obs)
        return np.zeros(4, np.float32)


def first_observations_are_the_variations(cache, core, benchmark, task, **lanes):
    """Runs trials 48..51 of ``task`` and checks each episode's first observation against
    Meta-World's env set to the benchmark's variation ``trial mod 50``."""
    model = FirstObservations()
    result = rlmesh.run(
        model,
        factory(cache, task=task, benchmark=benchmark),
        episodes=4,
        trial_index_base=48,  # trials 48, 49, 50, 51: variations 48, 49, 0, 1
        max_episode_steps=3,
        core=core,
        **lanes,
    )
    goals = []
    for episode in result.episodes:
        env = raw_env(benchmark, task, (48 + episode.index) % mw.VARIATIONS)
        expected, _ = env.reset()
        env.close()
        first = model.first[episode.seed]
        assert np.array_equal(first, expected), episode.index
        goals.append(tuple(first[36:39]))
    assert len(set(goals)) == 4  # four variations, four goals


@pytest.mark.parametrize("core", CORES)
def test_episode_k_is_the_benchmarks_variation_k_mod_50(core, cache):
    first_observations_are_the_variations(cache, core, "MT1", "push-v3", num_envs=2)


@pytest.mark.benchmarks
@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(("multitask", "task"), [("MT10", "push-v3"), ("MT50", "soccer-v3")])
def test_episode_k_is_the_variation_k_mod_50_of_mt10_and_mt50_in_workers(
    core, cache, multitask, task
):
    # (a parameter named "benchmark" would be pytest-benchmark's fixture)
    first_observations_are_the_variations(cache, core, multitask, task, num_envs=2, workers=2)


def test_a_reset_picks_its_variation_by_option_seed_or_order(cache):
    env = factory(cache, benchmark="MT1")()
    try:
        goals = set()
        for variation in range(3):
            obs, info = env.reset(options={"task_variation": variation})
            assert info == {"task_variation": variation, "is_success": False}
            goals.add(tuple(obs[36:39]))
        assert len(goals) == 3
        assert env.reset(seed=101)[1]["task_variation"] == 1  # seed mod 50
        assert env.reset(options={"trial_index": 99})[1]["task_variation"] == 49
        assert env.reset()[1]["task_variation"] == 0  # the one after, wrapping around
        fresh = factory(cache, benchmark="MT1")()
        assert [fresh.reset()[1]["task_variation"] for _ in range(3)] == [0, 1, 2]
        fresh.close()
        with pytest.raises(ValueError, match=r"unknown options \['goal'\]"):
            env.reset(options={"goal": 3})
    finally:
        env.close()


def test_an_episode_depends_on_its_variation_alone(cache):
    reused = factory(cache, task="door-open-v3", benchmark="MT1")()
    try:
        first, _ = reused.reset(seed=3, options={"trial_index": 7})
        for trial in (8, 9):  # other episodes, stepped, in between
            reused.reset(seed=trial, options={"trial_index": trial})
            for _ in range(5):
                reused.step(reused.action_space.sample())
        assert np.array_equal(reused.reset(seed=3, options={"trial_index": 7})[0], first)
        raw = raw_env("MT1", "door-open-v3", 7)
        assert np.array_equal(raw.reset()[0], first)
        raw.close()
    finally:
        reused.close()


def reach(obs):
    return np.concatenate([np.clip(10.0 * (obs[36:39] - obs[:3]), -1, 1), [0.0]])


@pytest.mark.parametrize("terminate", [True, False])
def test_success_is_sticky_and_ends_the_episode_by_default(cache, terminate):
    env = factory(cache, terminate_on_success=terminate)()
    try:
        obs, _ = env.reset(options={"task_variation": 4})
        flags = []
        for _ in range(120):
            # Reach the goal, then head away from it.
            action = reach(obs) if not flags or not flags[-1][1] else -reach(obs)
            obs, _, terminated, truncated, info = env.step(action.astype(np.float32))
            flags.append((bool(info["success"]), info["is_success"], terminated))
            if terminated or truncated:
                break
        first = next(step for step, (success, _, _) in enumerate(flags) if success)
        assert [sticky for _, sticky, _ in flags] == [step >= first for step in range(len(flags))]
        if terminate:
            assert len(flags) == first + 1 and flags[-1][2]
        else:
            assert len(flags) == 120 and not any(ended for _, _, ended in flags)
            assert not flags[-1][0]  # it left the goal, and the episode still succeeded
    finally:
        env.close()


class RoleModel(rlmesh.Model):
    """Knows Meta-World by roles only: the hand's position and the goal in, a displacement
    and a gripper in (0, 1) out (the env's tags map it onto (-1, 1))."""

    spec = adapters.ModelSpec(
        input={"state": adapters.Concat(adapters.EEF_POS, adapters.State("x/metaworld_goal_pos"))},
        output=adapters.Action(
            adapters.Actuator(adapters.ACTION_DELTA_POS, dim=3),
            adapters.Actuator(adapters.ACTION_GRIPPER, dim=1, range=(0, 1)),
        ),
    )

    def predict_batch(self, payload):
        state = payload["state"]
        assert state.shape[1:] == (6,)
        toward = np.clip(10.0 * (state[:, 3:] - state[:, :3]), -1, 1)
        return np.concatenate([toward, np.full((len(state), 1), 0.5)], axis=1)


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(
    "lanes",
    [{"num_envs": 3}, pytest.param({"num_envs": 3, "workers": 2}, marks=pytest.mark.benchmarks)],
    ids=str,
)
def test_a_role_based_model_spec_runs_on_the_env_tags_alone(core, lanes, cache):
    result = rlmesh.run(
        RoleModel(), factory(cache), episodes=3, max_episode_steps=150, core=core, **lanes
    )
    # Read from the right slices (hand, goal), the model reaches every goal, well in time.
    assert [(episode.success, episode.terminated) for episode in result.episodes] == [
        (True, True)
    ] * 3
    assert max(episode.steps for episode in result.episodes) < 150
    env = mw.MetaWorldEnv("reach-v3")
    tags = adapters.env_tags_of(env.metadata)
    plan = adapters.resolve(tags, env.observation_space, env.action_space, RoleModel.spec)
    assert '"state" <- concat(<obs>[0:3], <obs>[36:39])' in plan.describe()
    assert "range (0.0, 1.0)->(-1.0, 1.0)" in plan.describe()


def test_the_tags_fit_every_observation_type():
    spec = adapters.ModelSpec(
        input={"image": adapters.Image(adapters.IMAGE_PRIMARY, size=32)},
        output=RoleModel.spec.output,
    )
    for obs_type in mw.OBS_TYPES:
        env = mw.MetaWorldEnv("reach-v3", obs_type=obs_type, width=48, height=48)
        tags = adapters.env_tags_of(env.metadata)
        if obs_type != "pixels":
            adapters.resolve(tags, env.observation_space, env.action_space, RoleModel.spec)
        else:  # no state: the resolver names the role it lacks
            with pytest.raises(SpecError, match="proprio/eef_pos"):
                adapters.resolve(tags, env.observation_space, env.action_space, RoleModel.spec)
        if obs_type != "state":
            adapters.resolve(tags, env.observation_space, env.action_space, spec)


# Meta-World's object slots are unbounded (its own space), which the checker remarks on.
@pytest.mark.filterwarnings("ignore:.*observation space m..imum value is .*infinity")
@pytest.mark.parametrize("obs_type", ["state", "pixels_state"])
def test_gymnasiums_env_checker_passes(cache, obs_type):
    env = factory(cache, task="pick-place-v3", obs_type=obs_type, width=32, height=32)()
    try:
        check_env(env.unwrapped, skip_render_check=False)
    finally:
        env.close()


@pytest.mark.parametrize(("camera", "turned"), [("corner2", True), ("topview", False)])
def test_frames_stand_upright(cache, camera, turned):
    env = factory(cache, obs_type="pixels_state", camera=camera, width=64, height=48)()
    raw = raw_env(
        "MT1", "reach-v3", 5, render_mode="rgb_array", camera_name=camera, width=64, height=48
    )
    try:
        with pytest.raises(gym.error.ResetNeeded):
            env.unwrapped.render()
        obs, _ = env.reset(options={"task_variation": 5})
        raw.reset()
        frame = env.render()
        assert frame.shape == (48, 64, 3) and frame.dtype == np.uint8 and frame.std() > 0
        # The corner cameras look with the image's up pointing down in the world (Meta-World's
        # frames are upside down): turned half a turn. The top view is already upright.
        up = raw.data.camera(camera).xmat.reshape(3, 3)[:, 1]
        assert (up[2] < 0) == turned
        assert np.array_equal(frame, raw.render()[::-1, ::-1] if turned else raw.render())
        assert np.array_equal(obs["pixels"], frame) and obs["state"].shape == (39,)
        assert env.metadata["render_fps"] == round(1 / raw.dt)
    finally:
        env.close()
        raw.close()


def test_two_tasks_envs_in_one_process_each_draw_their_own_scene(cache):
    # Gymnasium's renderer draws with whichever GL context was made last: without making its
    # own current, one env would draw its scene with the other's meshes and textures. Closing
    # one leaves the other's objects alone.
    reach, door = (
        factory(cache, task=task, obs_type="pixels", width=32, height=32)()
        for task in ("reach-v3", "door-open-v3")
    )
    action = np.zeros(4, np.float32)
    try:
        alone = {}
        for env in (reach, door):  # each drawn right after its own reset
            env.reset(seed=1)
            alone[env] = [env.step(action)[0]["pixels"] for _ in range(2)]
        assert not np.array_equal(alone[reach][0], alone[door][0])
        reach.reset(seed=1)
        door.reset(seed=1)  # its context made last
        assert np.array_equal(door.step(action)[0]["pixels"], alone[door][0])
        assert np.array_equal(reach.step(action)[0]["pixels"], alone[reach][0])
        door.close()  # with reach's context current, and collected at once
        gc.collect()
        assert np.array_equal(reach.step(action)[0]["pixels"], alone[reach][1])
    finally:
        reach.close()
        door.close()


@pytest.mark.benchmarks
@pytest.mark.parametrize("core", CORES)
def test_pixel_episodes_are_the_same_in_worker_processes(core, cache):
    def pixel_policy(obs):
        return np.array([np.sin(obs["pixels"].mean() / 9.0), 0.5, -0.3, 1.0], np.float32)

    env = factory(cache, obs_type="pixels", width=32, height=32)
    arguments = {"episodes": 3, "seed": 2, "max_episode_steps": 6, "core": core}
    expected = comparable(rlmesh.run(pixel_policy, env, **arguments))
    assert len({episode["reward"] for episode in expected}) == 3
    assert comparable(rlmesh.run(pixel_policy, env, num_envs=2, workers=2, **arguments)) == (
        expected
    )


def test_the_static_tables_are_the_installed_packages():
    env_dict = metaworld.env_dict
    assert tuple(env_dict.MT10_V3) == mw.MT10_TASKS
    assert tuple(env_dict.ALL_V3_ENVIRONMENTS) == mw.MT50_TASKS
    hand = metaworld.SawyerXYZEnv._HAND_SPACE
    assert (tuple(hand.low), tuple(hand.high)) == (mw.HAND_LOW, mw.HAND_HIGH)
    assert metaworld.SawyerXYZEnv.max_path_length == mw.MAX_PATH_LENGTH
    assert metaworld._N_GOALS == mw.VARIATIONS
    # The declared space is Meta-World's, but the goal's per-task bounds (left unbounded).
    declared = mw.MetaWorldEnv("pick-place-v3").observation_space
    built = raw_env("MT1", "pick-place-v3", 0).sawyer_observation_space
    assert declared.shape == built.shape and declared.dtype == built.dtype
    assert np.array_equal(declared.low[:36], built.low[:36])
    assert np.array_equal(declared.high[:36], built.high[:36])
    assert np.all(declared.low[36:] <= built.low[36:])
    assert np.all(declared.high[36:] >= built.high[36:])


def test_the_suites():
    for name, benchmark, tasks in (
        ("metaworld_mt10", "MT10", mw.MT10_TASKS),
        ("metaworld_mt50", "MT50", mw.MT50_TASKS),
    ):
        info = mw.SUITES[name]
        assert (info.name, info.tasks, info.extra, info.module) == (
            name,
            tasks,
            "metaworld",
            "metaworld",
        )
        assert (info.episodes, info.max_episode_steps) == (50, 500)
        assert info.env == mw.SUITE_ENV and info.installed()
        assert all(TASK_NAME.fullmatch(task) for task in info.tasks)
        assert info.task_kwargs == tuple({"task": t, "benchmark": benchmark} for t in tasks)
        for kwargs in info.task_kwargs:  # every task's env can be made with the options
            mw.MetaWorldEnv(**kwargs, **info.options)
    assert len(mw.MT10_TASKS) == 10 and len(mw.MT50_TASKS) == 50
    stack = mw.MetaWorldEnv.simulator_stack()
    assert stack["distribution"] == "metaworld" and stack["version"] and stack["mujoco"]


def test_the_cache_holds_the_benchmarks_variations_and_a_bad_one_is_redrawn(tmp_path):
    env = mw.MetaWorldEnv("drawer-open-v3", cache_dir=str(tmp_path))
    env.reset(options={"task_variation": 0})
    env.close()
    (path,) = tmp_path.glob("metaworld/*/MT1-drawer-open-v3-seed42.json")
    expected = [
        pickle.loads(item.data)["rand_vec"].tolist()
        for item in raw_benchmark("MT1", "drawer-open-v3").train_tasks
    ]
    assert json.loads(path.read_text())["variations"]["drawer-open-v3"] == expected
    path.write_text('{"variations": {"drawer-open-v3": [[1, 2]]}}')  # one row, not 50
    mw._variations.cache_clear()
    env = mw.MetaWorldEnv("drawer-open-v3", cache_dir=str(tmp_path))
    obs, _ = env.reset(options={"task_variation": 9})
    env.close()
    raw = raw_env("MT1", "drawer-open-v3", 9)
    assert np.array_equal(obs, raw.reset()[0])
    raw.close()
    assert json.loads(path.read_text())["variations"]["drawer-open-v3"] == expected


def test_nothing_is_imported_or_built_before_the_first_reset():
    probe = (
        "import sys, gymnasium\n"
        "from rlmesh.benchmarks import metaworld as mw\n"
        "env = gymnasium.make(mw.SUITE_ENV, task='reach-v3', benchmark='MT50', obs_type='pixels')\n"
        "assert env.observation_space['pixels'].shape == (480, 480, 3)\n"
        "loaded = sorted(m for m in ('metaworld', 'mujoco') if m in sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr


def test_bad_arguments_name_what_was_wrong():
    for kwargs, message in (
        ({"task": "reach-v2"}, "task 'reach-v2' is not in MT1"),
        ({"task": "sweep-v3", "benchmark": "MT10"}, "task 'sweep-v3' is not in MT10"),
        ({"task": "reach-v3", "benchmark": "ML10"}, "benchmark is 'ML10'"),
        ({"task": "reach-v3", "obs_type": "rgb"}, "obs_type is 'rgb'"),
        ({"task": "reach-v3", "camera": "front"}, "camera is 'front'"),
        ({"task": "reach-v3", "width": 0}, "width is 0; expected an int >= 1"),
        ({"task": "reach-v3", "benchmark_seed": -1}, "benchmark_seed is -1"),
        ({"task": "reach-v3", "render_mode": "human"}, "render_mode is 'human'"),
    ):
        with pytest.raises(ValueError, match=message):
            mw.MetaWorldEnv(**kwargs)


@pytest.mark.benchmarks
def test_every_mt50_task_runs_its_suite(cache, monkeypatch):
    monkeypatch.setenv("RLMESH_CACHE_DIR", cache)  # the default cache_dir, read in process
    info = mw.SUITES["metaworld_mt50"]
    tasks = [
        rlmesh.Task(
            name,
            info.env,
            env_kwargs={**kwargs, **info.options},
            episodes=2,
            trial_index_base=49,
            max_episode_steps=5,
        )
        for name, kwargs in zip(info.tasks, info.task_kwargs, strict=True)
    ]
    suite = rlmesh.run_suite(lambda obs: np.zeros(4, np.float32), tasks)
    for name in info.tasks:
        episodes = suite[name].episodes
        assert [episode.steps for episode in episodes] == [5, 5], name
        assert all(episode.success_reported for episode in episodes), name
    assert list(Path(cache).glob("metaworld/*/MT50-seed42.json"))
