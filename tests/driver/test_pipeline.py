"""Group pipelining (``pipeline=True``): each worker's lanes are a group whose round goes on as
soon as that worker has stepped. The episodes and their results are those of plain rounds.

Which lane plays which episode depends on timing under pipelining, so the comparisons leave out
``env_index`` (``comparable``'s default); everything else of every episode is compared. Every
run starts real worker processes; runs are a few short episodes each.
"""

from __future__ import annotations

import functools
import os
from types import SimpleNamespace

import numpy as np
import pytest
import rlmesh
from envs_for_workers import dict_policy, make_dict_env, make_faulty, make_logged_slow_resets
from helpers import CORES, AwaitEveryStep, cartpole_policy, comparable
from rlmesh.cli import main
from rlmesh.lanes.process import SHARED_MEMORY_PREFIX
from test_process_lanes import ChunkedStacked, pendulum_policy


def leftovers():
    prefix = f"{SHARED_MEMORY_PREFIX}{os.getpid()}-"
    return [name for name in os.listdir("/dev/shm") if name.startswith(prefix)]


ENVS = {
    # name: (env, policy, episodes, max_episode_steps)
    "cartpole": ("CartPole-v1", cartpole_policy, 9, 60),
    "pendulum": ("Pendulum-v1", pendulum_policy, 7, 30),
    "dict": (make_dict_env, dict_policy, 8, None),
}


def run(env_name, core, **kwargs):
    env, policy, episodes, max_steps = ENVS[env_name]
    options = dict(episodes=episodes, max_episode_steps=max_steps, seed=3, core=core)
    return rlmesh.run(policy, env, **(options | kwargs))


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(("workers", "num_envs"), [(2, 3), (3, 8)])
@pytest.mark.parametrize("env_name", list(ENVS))
def test_pipelined_rounds_play_the_episodes_plain_rounds_play(core, env_name, workers, num_envs):
    plain = run(env_name, core, num_envs=num_envs)
    piped = run(env_name, core, num_envs=num_envs, workers=workers, pipeline=True)
    assert comparable(piped) == comparable(plain)
    assert piped.wasted_steps == 0
    assert {row.op for row in piped.telemetry} >= {"worker0.step", "driver.wait"}
    assert not leftovers()


@pytest.mark.parametrize("core", CORES)
def test_chunks_over_frame_stacks_are_replayed_per_lane_under_pipelining(core):
    runs = {}
    for pipeline in (False, True):
        model = ChunkedStacked()
        result = rlmesh.run(
            model,
            "CartPole-v1",
            episodes=7,
            num_envs=5,
            workers=2,
            pipeline=pipeline,
            execution_horizon=4,
            max_episode_steps=50,
            core=core,
        )
        runs[pipeline] = (comparable(result), sorted(stack.tobytes() for stack in model.inputs))
    assert runs[True][0] == runs[False][0]
    # The same stacks reached the model (in another order): the same decisions, each once.
    assert runs[True][1] == runs[False][1]


class GroupSizes(rlmesh.Model):
    """A batched CartPole policy that records how many lanes each call is for."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def predict_batch(self, obs):
        self.sizes.append(len(obs))
        return (obs[:, 2] + 0.3 * obs[:, 3] > 0).astype(np.int64)


@pytest.mark.parametrize("core", CORES)
def test_a_batched_model_is_called_for_one_group_at_a_time(core):
    results, models = {}, {}
    for pipeline in (False, True):
        models[pipeline] = GroupSizes()
        results[pipeline] = rlmesh.run(
            models[pipeline],
            "CartPole-v1",
            episodes=10,
            num_envs=6,
            workers=3,
            pipeline=pipeline,
            max_episode_steps=40,
            core=core,
        )
    assert comparable(results[True]) == comparable(results[False])
    assert max(models[False].sizes) == 6
    assert max(models[True].sizes) == 2  # three workers of two lanes each
    # Every lane-step was predicted for exactly once either way.
    assert sum(models[True].sizes) == sum(models[False].sizes)


class Events(rlmesh.RunHooks):
    """Every hook call, by episode index."""

    def __init__(self):
        self.by_episode = {}

    def on_episode_start(self, *, episode, seed):
        self.by_episode.setdefault(episode, []).append(("start", seed))

    def on_step(self, event):
        self.by_episode[event.episode].append(("step", event.step, event.reward))

    def on_episode_end(self, result):
        self.by_episode[result.index].append(("end", result.steps, result.reward))


@pytest.mark.parametrize("core", CORES)
def test_hooks_hear_each_episode_as_with_plain_rounds(core):
    heard = {}
    for pipeline in (False, True):
        events = Events()
        rlmesh.run(
            cartpole_policy,
            "CartPole-v1",
            episodes=6,
            num_envs=4,
            workers=2,
            pipeline=pipeline,
            max_episode_steps=25,
            hooks=[events, AwaitEveryStep()],
            core=core,
        )
        heard[pipeline] = events.by_episode
    assert heard[True] == heard[False]
    assert sorted(heard[True]) == list(range(6))


class StepInfos(rlmesh.RunHooks):
    """Each step event's info, by episode index and step."""

    def __init__(self):
        self.infos = {}

    def on_step(self, event):
        self.infos[event.episode, event.step] = event.info


@pytest.mark.parametrize("core", CORES)
def test_step_hooks_hear_every_info_under_pipelining(core):
    """Pipelined rounds read only final infos, so the workers send no other, unless step hooks
    listen: then every step's info reaches them, as in plain rounds."""
    heard = {}
    for pipeline in (False, True):
        hook = StepInfos()
        rlmesh.run(
            dict_policy,
            make_dict_env,
            episodes=5,
            num_envs=4,
            workers=2,
            pipeline=pipeline,
            seed=2,
            hooks=[hook],
            core=core,
        )
        heard[pipeline] = hook.infos
    assert heard[True] == heard[False]
    assert len(heard[True]) > 5 and all(heard[True].values())  # the env has an info every step


SEEDS = list(range(10, 18))
FAULTS = dict(seeds=SEEDS, num_envs=4, workers=2, max_episode_steps=40)


@pytest.mark.parametrize("core", CORES)
def test_a_restarted_worker_under_pipelining_leaves_the_results_unchanged(core, tmp_path):
    marker = tmp_path / "armed"
    marker.touch()
    factory = functools.partial(make_faulty, "kill", 15, 10, str(marker), None)
    clean = rlmesh.run(cartpole_policy, "CartPole-v1", core=core, **FAULTS)
    result = rlmesh.run(
        cartpole_policy, factory, core=core, restart_workers=1, pipeline=True, **FAULTS
    )
    assert not marker.exists()  # the worker was killed, and restarted
    assert comparable(result) == comparable(clean)
    assert not leftovers()


@pytest.mark.parametrize("core", CORES)
def test_an_env_failure_under_pipelining_is_recorded_as_with_plain_rounds(core):
    factory = functools.partial(make_faulty, "raise", 15, 10, None, None)
    runs = {
        pipeline: rlmesh.run(
            cartpole_policy, factory, core=core, on_error="record", pipeline=pipeline, **FAULTS
        )
        for pipeline in (False, True)
    }
    assert comparable(runs[True]) == comparable(runs[False])
    failed = [episode for episode in runs[True].episodes if episode.error]
    assert [episode.seed for episode in failed] == [15]
    assert "a fault at step 10" in failed[0].error


@pytest.mark.parametrize("core", CORES)
def test_other_groups_step_while_a_group_resets(core, tmp_path):
    """A group whose episode ended is sent its reset, and the other group's rounds go on
    while its env resets: the other worker steps between the slow reset's start and end.
    Plain rounds wait for the reset; the episodes are the same either way."""
    slow_seed = SEEDS[5]  # a later episode's: the first resets of every lane go out together
    factory = functools.partial(make_logged_slow_resets, slow_seed, 0.5, str(tmp_path))
    runs = {
        pipeline: rlmesh.run(cartpole_policy, factory, core=core, pipeline=pipeline,
                             seeds=SEEDS[:8], num_envs=2, workers=2, max_episode_steps=40)
        for pipeline in (False, True)
    }  # fmt: skip
    assert comparable(runs[True]) == comparable(runs[False])
    events = [line.split() for log in tmp_path.iterdir() for line in log.read_text().splitlines()]
    pids = {pid for pid, _, _ in events}
    assert len(pids) == 4  # two workers a run

    def overlapped(start, end, resetting_pid):
        return sum(
            1
            for pid, what, at in events
            if what == "step" and pid != resetting_pid and start < float(at) < end
        )

    slow = sorted((float(at), pid, what) for pid, what, at in events if what.startswith("reset"))
    windows = [(slow[i][0], slow[i + 1][0], slow[i][1]) for i in range(0, len(slow), 2)]
    assert len(windows) == 2  # the slow reset, in the plain run and in the pipelined one
    plain, piped = windows  # the runs went in this order
    assert overlapped(*plain) == 0
    assert overlapped(*piped) >= 5


@pytest.mark.parametrize("core", CORES)
def test_a_failed_reset_under_pipelining_is_recorded_or_retried_as_with_plain_rounds(core):
    factory = functools.partial(make_faulty, "raise", SEEDS[6], 0, None, None)
    for on_error in ("record", "retry"):
        runs = {
            pipeline: rlmesh.run(cartpole_policy, factory, core=core, on_error=on_error,
                                 pipeline=pipeline, **FAULTS)
            for pipeline in (False, True)
        }  # fmt: skip
        assert comparable(runs[True]) == comparable(runs[False])
        failed = [episode for episode in runs[True].episodes if episode.error]
        assert [episode.seed for episode in failed] == [SEEDS[6]]
        assert "a fault at step 0" in failed[0].error
    assert not leftovers()


@pytest.mark.parametrize("core", CORES)
def test_a_worker_killed_in_a_pipelined_reset_restarts_with_the_results_unchanged(core, tmp_path):
    marker = tmp_path / "armed"
    marker.touch()
    factory = functools.partial(make_faulty, "kill", SEEDS[6], 0, str(marker), None)
    clean = rlmesh.run(cartpole_policy, "CartPole-v1", core=core, **FAULTS)
    result = rlmesh.run(
        cartpole_policy, factory, core=core, restart_workers=1, pipeline=True, **FAULTS
    )
    assert not marker.exists()  # the fault fired
    assert comparable(result) == comparable(clean)
    assert not leftovers()


def test_a_hung_reset_under_pipelining_hits_the_reset_timeout():
    factory = functools.partial(make_faulty, "hang", SEEDS[6], 0, None, None)
    with pytest.raises(rlmesh.OperationTimeout, match=r"env.reset took longer than its 1 s"):
        rlmesh.run(cartpole_policy, factory, timeouts={"reset": 1.0}, pipeline=True, **FAULTS)
    assert not leftovers()


def test_a_hung_worker_under_pipelining_hits_the_step_timeout(tmp_path):
    factory = functools.partial(make_faulty, "hang", 15, 10, None, None)
    with pytest.raises(rlmesh.OperationTimeout, match=r"env.step took longer than its 1 s"):
        rlmesh.run(cartpole_policy, factory, timeouts={"step": 1.0}, pipeline=True, **FAULTS)
    assert not leftovers()


def test_pipelining_needs_lanes_in_groups_and_a_bool():
    with pytest.raises(ValueError, match=r"pipeline=True .* pass workers=2 or more"):
        rlmesh.run(cartpole_policy, "CartPole-v1", episodes=1, pipeline=True)
    with pytest.raises(ValueError, match=r"pipeline must be True or False, got 'yes'"):
        rlmesh.run(cartpole_policy, "CartPole-v1", episodes=1, workers=2, pipeline="yes")


def test_the_command_line_pipelines_with_workers_and_refuses_it_without(capsys, tmp_path):
    args = ["eval", "cartpole-heuristic", "--env", "CartPole-v1", "--episodes", "6"]
    args += ["--max-episode-steps", "50", "--num-envs", "4", "--no-progress"]
    plain, piped = tmp_path / "plain.jsonl", tmp_path / "piped.jsonl"
    assert main([*args, "--out", str(plain)]) == 0
    assert main([*args, "--workers", "2", "--pipeline", "--out", str(piped)]) == 0
    episodes = {
        path: SimpleNamespace(episodes=rlmesh.read_results(path)[1]) for path in (plain, piped)
    }
    assert comparable(episodes[piped]) == comparable(episodes[plain])
    capsys.readouterr()
    assert main([*args, "--pipeline"]) == 2
    assert "--pipeline needs --workers 2 or more" in capsys.readouterr().err
