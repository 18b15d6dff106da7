"""Process lanes when workers fail: a dead worker is named (or restarted and its episodes
replayed), a hung one hits ``timeouts=``, and nothing is left behind: no worker process and no
shared-memory segment, after success, failure and Ctrl-C.

The faulty env (``envs_for_workers.FaultyCartPole``) fails once per marker file, at a chosen
step of the episode with a chosen seed. With ``SEEDS`` over 4 lanes in 2 workers and every
episode 40 steps long, slots 0-3 finish together, and slot 5 (seed 15) then runs on lane 1,
worker 0, with slot 4 on lane 0.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from envs_for_workers import make_faulty, make_recorded_cartpole
from helpers import CORES, cartpole_policy, comparable
from rlmesh.lanes import InProcessLanes, ProcessLanes
from rlmesh.lanes.process import SHARED_MEMORY_PREFIX
from servers import read_line

SEEDS = list(range(10, 18))
FAULT_SEED, FAULT_STEP = 15, 10
RUN = dict(seeds=SEEDS, num_envs=4, workers=2, max_episode_steps=40)
HERE = Path(__file__).resolve().parent


def leftovers(pid=None):
    prefix = f"{SHARED_MEMORY_PREFIX}{os.getpid() if pid is None else pid}-"
    return [name for name in os.listdir("/dev/shm") if name.startswith(prefix)]


def alive(pid):
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone, or going as we read
        return False
    return "\nState:\tZ" not in status


def still_alive(pids, within_s=5.0):
    """The pids still alive after waiting up to ``within_s`` for them to go."""
    deadline = time.monotonic() + within_s
    while True:
        living = [pid for pid in pids if alive(pid)]
        if not living or time.monotonic() > deadline:
            return living
        time.sleep(0.05)


def recorded_pids(pid_dir):
    return [int(name) for name in os.listdir(pid_dir)]


def faulty(tmp_path, mode, *, seed=FAULT_SEED, step=FAULT_STEP, once=True):
    marker = tmp_path / "armed"
    if once:
        marker.touch()
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir(exist_ok=True)
    factory = functools.partial(
        make_faulty, mode, seed, step, str(marker) if once else None, str(pid_dir)
    )
    return factory, marker, pid_dir


@pytest.fixture(scope="module")
def clean_runs():
    """The uninterrupted runs, in process, per core."""
    return {
        core: rlmesh.run(cartpole_policy, "CartPole-v1", core=core, **RUN | {"workers": 1})
        for core in CORES
    }


class Ends(rlmesh.RunHooks):
    def __init__(self):
        self.indices = []

    def on_episode_end(self, result):
        self.indices.append(result.index)


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(("mode", "cause"), [("exit", "exited with code 3"), ("kill", "SIGKILL")])
def test_a_dead_worker_is_named_with_its_lanes_and_episodes_and_completed_ones_are_kept(
    core, mode, cause, tmp_path, clean_runs
):
    factory, _, pid_dir = faulty(tmp_path, mode)
    with pytest.raises(rlmesh.EnvError) as caught:
        rlmesh.run(cartpole_policy, factory, core=core, **RUN)
    err = caught.value
    message = str(err)
    assert "worker 0 (pid" in message and "lanes 0..1" in message and cause in message
    assert "episodes in flight: trial 4 on lane 0, trial 5 on lane 1" in message
    assert "restart_workers=K" in message
    assert (err.worker, err.lanes, err.trials) == (0, [0, 1], [4, 5])
    # The four episodes completed before the fault, as the clean run has them.
    assert comparable(err.partial_result, drop=()) == comparable(clean_runs[core], drop=())[:4]
    assert not still_alive(recorded_pids(pid_dir))
    assert not leftovers()


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("mode", ["exit", "kill"])
def test_a_restarted_worker_replays_its_episodes_so_the_run_equals_an_uninterrupted_one(
    core, mode, tmp_path, clean_runs
):
    factory, marker, pid_dir = faulty(tmp_path, mode)
    ends = Ends()
    result = rlmesh.run(cartpole_policy, factory, core=core, restart_workers=1, hooks=ends, **RUN)
    assert not marker.exists()  # the fault happened
    assert len(recorded_pids(pid_dir)) == 3  # two workers, and the one that replaced worker 0
    assert comparable(result, drop=()) == comparable(clean_runs[core], drop=())
    assert sorted(ends.indices) == list(range(len(SEEDS)))  # each episode ended once
    assert not still_alive(recorded_pids(pid_dir))
    assert not leftovers()


@pytest.mark.parametrize("core", CORES)
def test_a_worker_dying_in_a_reset_is_restarted_and_the_reset_sent_again(
    core, tmp_path, clean_runs
):
    factory, marker, pid_dir = faulty(tmp_path, "exit", step=0)
    result = rlmesh.run(cartpole_policy, factory, core=core, restart_workers=1, **RUN)
    assert not marker.exists()
    assert comparable(result, drop=()) == comparable(clean_runs[core], drop=())
    assert not still_alive(recorded_pids(pid_dir))


def test_restarts_run_out_on_a_worker_that_dies_every_time(tmp_path):
    factory, _, pid_dir = faulty(tmp_path, "exit", once=False)
    with pytest.raises(rlmesh.EnvError, match=r"restarted 2 times already \(restart_workers=2\)"):
        rlmesh.run(cartpole_policy, factory, restart_workers=2, **RUN)
    assert len(recorded_pids(pid_dir)) == 4  # two workers, worker 0 twice more
    assert not still_alive(recorded_pids(pid_dir))
    assert not leftovers()


def test_an_env_that_raises_in_a_worker_is_an_env_error_naming_lane_and_worker(tmp_path):
    factory, _, pid_dir = faulty(tmp_path, "raise")
    with pytest.raises(
        rlmesh.EnvError,
        match=r"lane 1 .*step\(\) raised RuntimeError: a fault "
        r"at step 10 \(in worker 0 \(pid \d+, lanes 0..1\)\)",
    ) as caught:
        rlmesh.run(cartpole_policy, factory, **RUN)
    assert "Traceback" in str(caught.value.__cause__)  # the worker's, as the cause
    assert len(caught.value.partial_result.episodes) == 4
    assert not still_alive(recorded_pids(pid_dir))
    assert not leftovers()


def test_a_hung_worker_hits_the_step_timeout_and_is_killed(tmp_path):
    factory, _, pid_dir = faulty(tmp_path, "hang")
    started = time.monotonic()
    with pytest.raises(rlmesh.OperationTimeout, match=r"env.step took longer than its 1 s"):
        rlmesh.run(cartpole_policy, factory, timeouts={"step": 1.0}, **RUN)
    assert time.monotonic() - started < 30
    assert not still_alive(recorded_pids(pid_dir))
    assert not leftovers()


def test_nothing_is_left_after_a_run_that_succeeds(tmp_path):
    factory = functools.partial(make_recorded_cartpole, str(tmp_path))
    rlmesh.run(cartpole_policy, factory, episodes=4, num_envs=4, workers=2, max_episode_steps=5)
    assert len(recorded_pids(tmp_path)) == 2
    assert not still_alive(recorded_pids(tmp_path), within_s=0)  # gone when run returns
    assert not leftovers()


INTERRUPTED_RUN = textwrap.dedent(
    """
    import functools, sys
    import rlmesh
    from envs_for_workers import make_recorded_cartpole
    from helpers import cartpole_policy

    class Announce(rlmesh.RunHooks):
        def on_episode_end(self, result):
            print("episode", result.index, flush=True)

    if __name__ == "__main__":
        rlmesh.run(cartpole_policy, functools.partial(make_recorded_cartpole, sys.argv[1]),
                   episodes=100_000, num_envs=4, workers=2, max_episode_steps=20,
                   hooks=Announce())
    """
)


def session_processes(session_id):
    """The pids of live processes in the session ``session_id``, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[3]) == session_id and fields[0] != "Z":  # session, state
            found.append(int(entry.name))
    return found


def test_ctrl_c_leaves_no_worker_and_no_shared_memory(tmp_path):
    script = tmp_path / "interrupted.py"
    script.write_text(INTERRUPTED_RUN)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    run = subprocess.Popen(
        [sys.executable, str(script), str(pid_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        first = read_line(run)  # an episode ended, or the run failed
        assert first.startswith("episode"), run.stderr.read()
        os.killpg(run.pid, signal.SIGINT)  # what Ctrl-C sends: the whole group
        _, stderr = run.communicate(timeout=60)
        assert "KeyboardInterrupt" in stderr
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(10)
    workers = recorded_pids(pid_dir)
    assert len(workers) == 2
    assert not still_alive(workers)
    assert not still_alive(session_processes(run.pid))  # the forkserver went with it too
    assert not leftovers(run.pid)


@pytest.mark.parametrize("restarts", [0, 1])
def test_a_worker_killed_between_steps_is_seen_at_the_next_one(restarts):
    """Killed from outside while idle: the next step finds its pipe closed, and restarts it
    (its episodes replayed, so the lanes go on as in-process ones) or names it."""
    local = InProcessLanes([gym.make("CartPole-v1") for _ in range(4)])
    lanes = ProcessLanes("CartPole-v1", num_envs=4, workers=2, restart_workers=restarts)
    try:
        every = np.arange(4)
        for side in (local, lanes):
            side.reset(every, [1, 2, 3, 4], [0, 1, 2, 3])
            for _ in range(5):
                side.step(every, np.array([0, 1, 1, 0]))
        victim = lanes.worker_pids[1]
        os.kill(victim, signal.SIGKILL)
        assert not still_alive([victim])
        if not restarts:
            with pytest.raises(rlmesh.EnvError, match=r"worker 1 .*lanes 2..3.* killed by SIGKILL"):
                lanes.step(every, np.array([0, 1, 1, 0]))
            return
        expected = local.step(every, np.array([0, 1, 1, 0]))
        batch = lanes.step(every, np.array([0, 1, 1, 0]))
        assert lanes.worker_pids[1] != victim
        assert all(
            np.array_equal(a, b)
            for a, b in zip(expected.observations, batch.observations, strict=True)
        )
        assert np.array_equal(expected.rewards, batch.rewards)
    finally:
        local.close()
        lanes.close()
    assert not leftovers()
