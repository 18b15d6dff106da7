"""Process lanes (``workers=W``) play exactly the episodes in-process lanes play.

Every run here starts real worker processes (forkserver), which build their envs from an id or
a module-level factory in ``envs_for_workers``; runs are a few short episodes each.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from envs_for_workers import (
    dict_policy,
    make_cartpole,
    make_dict_env,
    make_pixel_env,
    make_recorded_cartpole,
    make_slow_on_odd_seeds,
    pixel_policy,
)
from helpers import CORES, AwaitEveryStep, cartpole_policy, comparable
from rlmesh import ModelSpec, State
from rlmesh.cli import main
from rlmesh.lanes import InProcessLanes, ProcessLanes, core_steps, make_lanes
from rlmesh.lanes.process import CPUS, SHARED_MEMORY_PREFIX
from rlmesh.lanes.process.worker import POLL_S


def pendulum_policy(obs):
    return np.array([-2.0 * obs[2] - 0.5 * obs[1]], np.float32)


ENVS = {
    # name: (env, policy, episodes, max_episode_steps)
    "cartpole": ("CartPole-v1", cartpole_policy, 5, 80),
    "pendulum": ("Pendulum-v1", pendulum_policy, 4, 40),
    "dict": (make_dict_env, dict_policy, 6, None),
    "pixels": (make_pixel_env, pixel_policy, 5, None),
}


def leftovers(pid=None):
    """This process's (or ``pid``'s) shared-memory segments still in /dev/shm."""
    prefix = f"{SHARED_MEMORY_PREFIX}{os.getpid() if pid is None else pid}-"
    return [name for name in os.listdir("/dev/shm") if name.startswith(prefix)]


def alive(pid):
    """Whether ``pid`` is a live (not zombie) process, from /proc."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def recorded_pids(pid_dir):
    return [int(name) for name in os.listdir(pid_dir)]


def own_semaphores():
    """The POSIX semaphores of ``multiprocessing`` (``/dev/shm/sem.mp-*``) that this process
    holds: those whose file it has mapped (matched by inode, since the map names the file
    the semaphore was created under), so other processes' runs do not count."""
    mapped = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5].startswith("/dev/shm/"):
                mapped.add(int(fields[4]))
    held = set()
    for name in os.listdir("/dev/shm"):
        if name.startswith("sem.mp-"):
            try:
                if os.stat(f"/dev/shm/{name}").st_ino in mapped:
                    held.add(name)
            except FileNotFoundError:  # another process's, gone since the listing
                pass
    return held


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("num_envs", [1, 3, 8])
@pytest.mark.parametrize("env_name", list(ENVS))
def test_every_episode_equals_the_in_process_run_for_any_workers(core, env_name, num_envs):
    env, policy, episodes, max_steps = ENVS[env_name]
    runs = {
        workers: rlmesh.run(
            policy,
            env,
            episodes=episodes,
            num_envs=num_envs,
            workers=workers,
            max_episode_steps=max_steps,
            seed=7,
            core=core,
        )
        for workers in (1, 2, 4)
    }
    # Same lanes, so every field but timings is equal: index, seed, steps, reward, flags, lane.
    expected = comparable(runs[1], drop=())
    assert [episode["index"] for episode in expected] == list(range(episodes))
    for workers in (2, 4):
        assert comparable(runs[workers], drop=()) == expected, f"workers={workers}"
        assert runs[workers].wasted_steps == 0
    assert not leftovers()


class ChunkedStacked(rlmesh.Model):
    """A chunk policy over a stack of 3 CartPole frames; records every input it sees."""

    spec = ModelSpec(input=State(stack=3))

    def __init__(self):
        super().__init__()
        self.inputs = []

    def predict_chunk(self, obs, execution_horizon=None):
        self.inputs.append(np.array(obs))
        newest = obs[-1]
        first = int(newest[2] + 0.3 * newest[3] > 0)
        return np.array([first, first, 1 - first, first])


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("num_envs", [3, 8])
def test_chunks_of_four_over_frame_stacks_equal_the_in_process_run(core, num_envs):
    runs = {}
    for workers in (1, 2, 4):
        model = ChunkedStacked()
        result = rlmesh.run(
            model,
            "CartPole-v1",
            episodes=6,
            num_envs=num_envs,
            workers=workers,
            execution_horizon=4,
            max_episode_steps=60,
            core=core,
        )
        runs[workers] = (comparable(result, drop=()), model.inputs)
    expected_episodes, expected_inputs = runs[1]
    for workers in (2, 4):
        episodes, inputs = runs[workers]
        assert episodes == expected_episodes
        # The model saw the same stacks in the same order: the chunks replayed identically.
        assert len(inputs) == len(expected_inputs)
        assert all(np.array_equal(a, b) for a, b in zip(inputs, expected_inputs, strict=True))


def _same_value(a, b):
    """Equal values of the same types and dtypes, leaf by leaf."""
    if isinstance(a, dict):
        return type(b) is dict and list(a) == list(b) and all(_same_value(a[k], b[k]) for k in a)
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    return a == b


@pytest.mark.parametrize(
    ("factory", "actions"),
    [
        (make_dict_env, lambda k: np.full((k, 2), 0.05, np.float32)),
        (make_pixel_env, lambda k: np.arange(k) % 3),
        # float64 actions for a float32 Box: they travel as the env would get them in-process
        (functools.partial(gym.make, "Pendulum-v1"), lambda k: np.full((k, 1), 0.5)),
    ],
    ids=["dict", "pixels", "pendulum-float64-actions"],
)
def test_lanes_return_what_in_process_lanes_return_type_for_type(factory, actions):
    """Observations (a Discrete leaf as the env's int, float32 and float64 Boxes, uint8
    frames), rewards, flags and infos: the same values of the same types."""
    local = InProcessLanes([factory() for _ in range(3)])
    process = ProcessLanes(factory, num_envs=3, workers=2)
    try:
        lanes = np.arange(3)
        seeds, trials = [4, 5, 6], [0, 1, 2]
        for (obs_a, info_a), (obs_b, info_b) in zip(
            zip(*local.reset(lanes, seeds, trials), strict=True),
            zip(*process.reset(lanes, seeds, trials), strict=True),
            strict=True,
        ):
            assert _same_value(obs_a, obs_b) and info_a == info_b
        for step in range(6):
            stepped = np.array([0, 2]) if step % 2 else lanes  # subsets step too
            a = local.step(stepped, actions(len(stepped)))
            b = process.step(stepped, actions(len(stepped)))
            assert np.array_equal(a.stepped, b.stepped)
            assert all(
                _same_value(x, y) for x, y in zip(a.observations, b.observations, strict=True)
            )
            for field in ("rewards", "terminated", "truncated"):
                assert _same_value(getattr(a, field), getattr(b, field))
            assert a.infos == b.infos
    finally:
        local.close()
        process.close()
    assert not leftovers()


def test_workers_that_stopped_polling_sleep_and_still_wake_for_the_next_step():
    """A worker polls its bell only for ``POLL_S`` after answering; past that it sleeps (it
    costs no CPU while a slow model thinks) and the next ring wakes it."""
    local = InProcessLanes([gym.make("CartPole-v1") for _ in range(2)])
    process = ProcessLanes("CartPole-v1", num_envs=2, workers=2)
    try:
        lanes = np.arange(2)
        for vector in (local, process):
            vector.reset(lanes, [3, 4], [0, 1])
        for step in range(3):
            asleep_by = time.monotonic() + 10
            while not all(_state(pid) == "S" for pid in process.worker_pids):
                assert time.monotonic() < asleep_by, "the workers never stopped polling"
                time.sleep(0.02)
            actions = np.array([step % 2, 1 - step % 2])
            a, b = local.step(lanes, actions), process.step(lanes, actions)
            assert np.array_equal(np.stack(a.observations), np.stack(b.observations))
            assert np.array_equal(a.rewards, b.rewards)
    finally:
        local.close()
        process.close()
    assert not any(alive(pid) for pid in process.worker_pids)
    assert not leftovers()


@pytest.mark.parametrize("core", CORES)
def test_an_episode_a_cap_ends_keeps_its_final_info_with_workers(core):
    """A ``max_episode_steps`` cap ends an episode on a step the env did not end, so that
    step's info is the episode's final one (the success rule reads it): workers send it, in
    plain and in pipelined rounds."""
    runs = {
        (workers, pipeline): rlmesh.run(
            dict_policy,
            make_dict_env,
            episodes=6,
            num_envs=3,
            workers=workers,
            pipeline=pipeline,
            max_episode_steps=12,
            seed=7,
            core=core,
        )
        for workers, pipeline in ((1, False), (2, False), (2, True))
    }
    capped = [episode for episode in runs[1, False].episodes if episode.steps == 12]
    assert capped and all(e.truncated and e.success_reported for e in capped)
    assert comparable(runs[2, False], drop=()) == comparable(runs[1, False], drop=())
    # Pipelined, which lane plays which episode depends on timing; the rest is the same.
    assert comparable(runs[2, True]) == comparable(runs[1, False])


def _same_step_but_infos(a, b, every_info):
    """Assert that ``b``, a step of process lanes, is ``a``, the same step of in-process
    lanes of an env with an info every step, but for infos: every one with ``every_info``,
    else only final ones (empty for a lane whose episode goes on). The lanes' ended mask."""
    assert all(_same_value(x, y) for x, y in zip(a.observations, b.observations, strict=True))
    for field in ("rewards", "terminated", "truncated"):
        assert _same_value(getattr(a, field), getattr(b, field))
    ended = a.terminated | a.truncated
    for row, done in enumerate(ended.tolist()):
        assert a.infos[row]
        assert b.infos[row] == (a.infos[row] if done or every_info else {})
    return ended


def test_round_steps_carry_only_final_infos_and_are_what_the_core_steps():
    """``round_step`` returns what ``step`` does, but a lane whose episode goes on has an
    empty info: the core's rounds read only final infos, so only those cross the pipes."""
    local = InProcessLanes([make_dict_env() for _ in range(3)])
    process = ProcessLanes(make_dict_env, num_envs=3, workers=2)
    try:
        assert core_steps(process) == process.round_step
        running = np.arange(3)
        for vector in (local, process):
            vector.reset(running, [4, 5, 6], [0, 1, 2])
        finals = 0
        while len(running):
            action = np.full((len(running), 2), 0.05, np.float32)
            a, b = local.step(running, action), process.round_step(running, action)
            ended = _same_step_but_infos(a, b, every_info=False)
            finals += int(ended.sum())
            running = running[~ended]
        assert finals == 3
    finally:
        local.close()
        process.close()
    assert not leftovers()


def test_pipelined_steps_without_every_info_carry_only_final_infos():
    """``send_step(..., every_info=False)``, as the driver's pipelined rounds send it when
    they read only final infos: what ``step`` returns, but a lane whose episode goes on has an
    empty info; with ``every_info`` (the default) every info comes back."""
    local = InProcessLanes([make_dict_env() for _ in range(4)])
    process = ProcessLanes(make_dict_env, num_envs=4, workers=2)
    try:
        lanes = np.arange(4)
        for vector in (local, process):
            vector.reset(lanes, [4, 5, 6, 7], [0, 1, 2, 3])
        running = {group: process.step_groups[group] for group in range(2)}
        finals = every = 0
        while any(len(group_lanes) for group_lanes in running.values()):
            sent = {}
            for group, group_lanes in running.items():
                if len(group_lanes):
                    action = np.full((len(group_lanes), 2), 0.05, np.float32)
                    every_info = group == 0  # one group asks for every info, the other not
                    process.send_step(group_lanes, action, every_info=every_info)
                    sent[group] = local.step(group_lanes, action), every_info
            for _ in sent:
                b = process.receive()
                group = next(g for g in sent if b.stepped[0] in process.step_groups[g])
                a, every_info = sent[group]
                assert np.array_equal(a.stepped, b.stepped)
                ended = _same_step_but_infos(a, b, every_info)
                every += int(every_info) * int((~ended).sum())
                finals += int(ended.sum())
                running[group] = a.stepped[~ended]
        assert finals == 4 and every > 0
    finally:
        local.close()
        process.close()
    assert not leftovers()


@pytest.mark.skipif(CPUS < 2, reason="the driver polls for answers only with a CPU to spare")
def test_the_driver_polls_for_a_slow_worker_only_briefly_and_still_gets_its_answer():
    """Once a worker has answered, the driver polls for the others' answers only for
    ``POLL_S``; a worker slower than that is waited for asleep (the driver spends little CPU
    on the round), and its answer is what in-process lanes give."""
    delay_s = 10 * POLL_S
    factory = functools.partial(make_slow_on_odd_seeds, delay_s)
    local = InProcessLanes([factory() for _ in range(2)])
    process = ProcessLanes(factory, num_envs=2, workers=2)
    try:
        lanes = np.arange(2)
        for vector in (local, process):
            vector.reset(lanes, [2, 3], [0, 1])  # lane 1 (worker 1) steps slowly
        cpu_s = wall_s = 0.0
        for step in range(8):
            actions = np.array([step % 2, 1 - step % 2])
            a = local.step(lanes, actions)
            cpu, wall = time.process_time(), time.perf_counter()
            b = process.step(lanes, actions)
            cpu_s += time.process_time() - cpu
            wall_s += time.perf_counter() - wall
            assert np.array_equal(np.stack(a.observations), np.stack(b.observations))
            assert np.array_equal(a.rewards, b.rewards)
            assert np.array_equal(a.terminated, b.terminated)
        assert wall_s >= 8 * delay_s
        assert cpu_s < wall_s / 2, f"the driver spent {cpu_s:.3f} s of CPU in {wall_s:.3f} s"
    finally:
        local.close()
        process.close()
    assert not any(alive(pid) for pid in process.worker_pids)
    assert not leftovers()


def _state(pid):
    """The scheduler state letter of ``pid`` (``R`` running or runnable, ``S`` asleep)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return status.split("\nState:\t", 1)[1][0]


@pytest.mark.parametrize("core", CORES)
def test_hooks_telemetry_and_the_awaited_path_behave_as_in_process(core):
    class Events(rlmesh.RunHooks):
        def __init__(self):
            self.events = []

        def on_episode_start(self, *, episode, seed):
            self.events.append(("start", episode, seed))

        def on_step(self, event):
            self.events.append(("step", event.episode, event.step, event.reward))

        def on_episode_end(self, result):
            self.events.append(("end", result.index, result.reward))

    recorded = {}
    for workers in (1, 2):
        hooks = Events()
        result = rlmesh.run(
            cartpole_policy,
            "CartPole-v1",
            episodes=4,
            num_envs=3,
            workers=workers,
            max_episode_steps=30,
            hooks=[hooks, AwaitEveryStep()],
            core=core,
        )
        recorded[workers] = (comparable(result, drop=()), hooks.events, result.telemetry)
    assert recorded[2][0] == recorded[1][0]
    assert recorded[2][1] == recorded[1][1]
    rows = {row.op: row for row in recorded[2][2]}
    # Per-worker step time, one sample per request, and the time the driver waited.
    assert rows["worker0.step"].count > 0 and rows["worker1.step"].count > 0
    assert rows["driver.wait"].count == rows["driver.round"].count
    assert rows["env.step"].count == 4 * 30  # lane-steps, as in-process
    assert not any(op.startswith("worker") for op in {row.op for row in recorded[1][2]})


@pytest.mark.parametrize("core", CORES)
def test_a_results_file_resumed_with_workers_equals_one_clean_run(core, tmp_path):
    path = tmp_path / "results.jsonl"
    common = dict(episodes=6, num_envs=3, max_episode_steps=40, core=core)
    clean = rlmesh.run(cartpole_policy, "CartPole-v1", **common)
    rlmesh.run(
        cartpole_policy, "CartPole-v1", results_path=path, indices=[0, 1, 2], workers=2, **common
    )
    resumed = rlmesh.run(
        cartpole_policy, "CartPole-v1", results_path=path, resume=True, workers=3, **common
    )
    assert comparable(resumed) == comparable(clean)
    _, on_file = rlmesh.read_results(path)
    assert sorted(episode.index for episode in on_file) == list(range(6))


@pytest.mark.parametrize("core", CORES)
def test_a_run_with_workers_releases_its_semaphores_when_it_closes(core):
    """Each worker's bell is a named semaphore in /dev/shm: a run leaves none behind, even
    while the garbage collector does not run (the lanes were once freed only by it)."""
    gc.disable()
    try:
        before = own_semaphores()
        for _ in range(3):
            rlmesh.run(
                cartpole_policy,
                "CartPole-v1",
                episodes=2,
                num_envs=2,
                workers=2,
                max_episode_steps=10,
                core=core,
            )
        left = own_semaphores() - before
    finally:
        gc.enable()
    assert not left, f"{len(left)} semaphores left in /dev/shm by 3 runs with workers=2"


def test_a_lambda_policy_needs_no_pickling_the_model_stays_in_the_driver():
    result = rlmesh.run(
        lambda obs: int(obs[2] > 0), make_cartpole, episodes=2, num_envs=2, workers=2
    )
    assert [episode.index for episode in result.episodes] == [0, 1]


def test_a_factory_that_does_not_pickle_says_what_to_pass_instead():
    with pytest.raises(TypeError, match=r"module-level function .* or a Gymnasium id"):
        rlmesh.run(cartpole_policy, lambda: gym.make("CartPole-v1"), num_envs=2, workers=2)
    assert not leftovers()


def test_an_env_instance_cannot_go_to_workers():
    env = gym.make("CartPole-v1")
    with pytest.raises(ValueError, match="cannot be rebuilt there: pass a Gymnasium id"):
        make_lanes(env, workers=2)
    env.close()


def test_an_id_only_the_driver_registered_says_how_workers_find_it():
    # Workers start from a fresh interpreter, so they never see this registration.
    gym.register("RlmeshDriverOnly-v0", entry_point="envs_for_workers:PixelEnv")
    try:
        with pytest.raises(rlmesh.EnvError, match=r"use 'module:EnvId' .*\(in worker 0"):
            make_lanes("RlmeshDriverOnly-v0", num_envs=2, workers=2)
    finally:
        gym.registry.pop("RlmeshDriverOnly-v0", None)
    assert not leftovers()


def test_a_script_without_a_main_guard_is_told_to_add_one(tmp_path):
    # The workers import the script that started them: a run at its top level starts again
    # there, and multiprocessing stops it in the worker.
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import rlmesh\n"
        "rlmesh.run(lambda obs: 0, 'CartPole-v1', episodes=1, num_envs=2, workers=2)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode != 0
    assert "before it could build its envs" in done.stderr
    assert 'under `if __name__ == "__main__":`' in done.stderr


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"workers": 0}, "workers must be a positive integer, got 0"),
        ({"workers": 2, "restart_workers": -1}, "restart_workers must be a non-negative"),
        ({"restart_workers": 1}, "restart_workers=1 restarts worker processes, but workers=1"),
    ],
)
def test_worker_settings_are_checked_before_anything_starts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        rlmesh.run(cartpole_policy, "CartPole-v1", **kwargs)


def test_more_workers_than_lanes_start_one_worker_per_lane(tmp_path):
    factory = functools.partial(make_recorded_cartpole, str(tmp_path))
    lanes = make_lanes(factory, num_envs=2, workers=4)
    try:
        assert repr(lanes).endswith("workers=2)") and len(set(lanes.worker_pids)) == 2
    finally:
        lanes.close()
    assert sorted(recorded_pids(tmp_path)) == sorted(lanes.worker_pids)
    assert not any(alive(pid) for pid in recorded_pids(tmp_path))
    assert not leftovers()


def test_the_command_line_runs_workers_with_env_kwargs_as_in_process(capsys):
    summaries = []
    for workers in ("1", "2"):
        argv = ["eval", "random", "--env", "CartPole-v1", "--env-kwargs"]
        argv += ['{"max_episode_steps": 20}', "--num-envs", "3", "--episodes", "5"]
        assert main([*argv, "--workers", workers, "--no-progress", "--json"]) == 0
        summaries.append(json.loads(capsys.readouterr().out))
    for key in ("episodes", "total_steps", "mean_reward", "episode_length_max"):
        assert summaries[0][key] == summaries[1][key]
    assert main(["demo", "--restart-workers", "1", "--episodes", "1"]) == 2
    assert "--restart-workers needs --workers 2 or more" in capsys.readouterr().err
