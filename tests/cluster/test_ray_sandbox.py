"""Sandboxed envs on a real local Ray cluster (``ray.init(num_cpus=2)``, started once for the
module): a ``SandboxEnv`` travels to the workers as its factory, each worker (an actor)
starts one sandbox and keeps it for every window it runs, the episodes are those of the
same env run on one process without a sandbox, and nothing is left once the run ends (no
sandbox process, run directory or mount, no actor).

The sandboxes run in the tests' cached virtual environment (``RLMESH_SANDBOX_VENVS``, set
before Ray starts so its workers inherit it), as the sandbox tests do.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip(
    "ray", reason='Ray is not installed (the ray extra): pip install "rlmesh[ray]"'
)
pytest.importorskip("grpc", reason="the remote extra (grpcio) is not installed")

from rlmesh.sandbox.bwrap import find_bwrap  # noqa: E402

pytestmark = [
    pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed"),
    pytest.mark.usefixtures("sandbox_venvs", "ray_cluster", "bounded_in_time"),  # conftest.py
]

import rlmesh  # noqa: E402
from faulty_envs import HERE as FAULTY  # noqa: E402 - tests/sandbox's
from faulty_envs import make_faulty  # noqa: E402
from helpers import CORES, cartpole_policy, live_processes  # noqa: E402
from rlmesh.cli import main  # noqa: E402
from rlmesh.results import read_results  # noqa: E402
from rlmesh.sandbox import SandboxEnv, SandboxModel, SandboxOptions  # noqa: E402

RUN = {"episodes": 12, "seed": 3, "max_episode_steps": 60}
RUN_DIR_PREFIX = "rlmesh-sandbox-"  # a sandbox server's run directory (server_process.py)
VENVS = Path(
    os.environ.get("RLMESH_SANDBOX_VENVS")
    or Path.home() / ".cache" / "rlmesh-tests" / "sandbox-venvs"
)


@pytest.fixture(scope="module")
def sandbox_venvs():
    """The sandboxes' environments in the tests' cache, for this process and, set before
    the module's Ray instance starts, for its workers."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RLMESH_SANDBOX_VENVS", str(VENVS))
        yield VENVS


def episodes_of(result):
    """What must equal across the runs: each episode's index, seed, steps, reward, ends and
    success."""
    return [
        (e.index, e.seed, e.steps, e.reward, e.terminated, e.truncated, e.success, e.error)
        for e in result.episodes
    ]


def run_dirs() -> set[str]:
    return {name for name in os.listdir(tempfile.gettempdir()) if name.startswith(RUN_DIR_PREFIX)}


def leftovers() -> tuple[set[int], set[str], str, set[int]]:
    """Sandbox processes, run directories, the mount table, and the run's actors."""
    return (
        live_processes(RUN_DIR_PREFIX.encode()),
        run_dirs(),
        Path("/proc/mounts").read_text(),
        live_processes(b"ray::WindowActor"),
    )


@pytest.fixture(autouse=True)
def leaves_nothing_behind():
    """Fail a test after which a sandbox's process, run directory or mount, or an actor of
    the run, is left (they get a few seconds to go)."""
    before = leftovers()
    yield
    deadline = time.monotonic() + 15
    while True:
        after = leftovers()
        left = [
            f"{what}: {sorted(now - was) if isinstance(now, set) else 'changed'}"
            for what, was, now in zip(
                ("sandbox processes", "run directories", "mounts", "actors"),
                before,
                after,
                strict=True,
            )
            if (now - was if isinstance(now, set) else now != was)
        ]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not left, "left behind: " + "; ".join(left)


class SandboxStarts:
    """The sandboxes started while it watches: each server's run directory, new in the
    temporary directory (polled every 5 ms; a sandbox lives at least its start, a second)."""

    def __init__(self) -> None:
        self.before = run_dirs()
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(0.005):
            self.seen |= run_dirs() - self.before

    def __enter__(self) -> SandboxStarts:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


# ---------------------------------------------------------------------------- the Python API


@pytest.mark.parametrize("core", CORES)
def test_a_sandboxed_env_on_ray_plays_the_episodes_of_a_plain_local_run(core):
    local = rlmesh.run(cartpole_policy, "CartPole-v1", num_envs=2, core=core, **RUN)
    env = SandboxEnv("CartPole-v1", num_envs=2, core=core)
    with SandboxStarts() as starts:
        result = rlmesh.run(
            cartpole_policy, env, core=core, cluster="ray", workers=2, window_episodes=2,
            **RUN,
        )  # fmt: skip
    assert episodes_of(result) == episodes_of(local)
    assert result.core == core and not env.running  # the one started here is closed
    report = result.cluster
    workers = {window.worker for window in report.windows}
    assert report.ray_mode == "actors"  # the workers that hold the sandboxes
    assert len(report.windows) == 6 and 1 <= len(workers) <= 2
    # One sandbox a worker, kept across its windows: not one a window.
    assert len(starts.seen) == len(workers), (starts.seen, workers)


def test_each_worker_keeps_its_sandbox_across_its_windows_and_records_env_failures():
    """An env failure recorded (``on_error="record"``) rebuilds its lane in the sandbox the
    worker holds, which goes on to its next windows; the episodes stay the local run's (one
    lane: a served env's failure ends its session, failing every episode in flight there)."""
    kwargs = {"on_error": "record", "episodes": 8, "seed": 2, "max_episode_steps": 40}
    faults = {"fails": "step", "at_step": 7, "modulo": 2}
    local = rlmesh.run(cartpole_policy, functools.partial(make_faulty, **faults), **kwargs)
    assert any(e.error for e in local.episodes) and not all(e.error for e in local.episodes)
    env = SandboxEnv(f"{FAULTY}:make_faulty", **faults)
    with SandboxStarts() as starts:
        result = rlmesh.run(
            cartpole_policy, env, cluster="ray", workers=1, window_episodes=2, **kwargs
        )
    assert [e[:-1] for e in episodes_of(result)] == [e[:-1] for e in episodes_of(local)]
    for ours, theirs in zip(result.episodes, local.episodes, strict=True):
        assert (ours.error is None) == (theirs.error is None)
        assert ours.error is None or "the simulator diverged" in ours.error
    assert len(result.cluster.windows) == 4 and len(starts.seen) == 1


def test_a_failed_run_on_sandboxed_workers_leaves_nothing_running():
    def falls_over(obs):  # pushes left until the pole leans past 0.15 rad, then raises
        if abs(obs[2]) > 0.15:
            raise ValueError("the policy saw a pole past 0.15 rad")
        return 0

    env = SandboxEnv("CartPole-v1", num_envs=2)
    with pytest.raises(rlmesh.ModelError, match=r"past 0\.15 rad"):
        rlmesh.run(
            falls_over, env, cluster="ray", workers=2, window_episodes=2, episodes=8,
            seed=3, max_episode_steps=200,
        )  # fmt: skip
    assert not env.running  # and the fixture checks the workers' sandboxes went too


def test_a_sandboxed_suite_on_ray_plays_each_tasks_local_episodes():
    tasks = [
        rlmesh.Task("short", "CartPole-v1", episodes=4, seed=1, max_episode_steps=30),
        rlmesh.Task("heavy", "Pendulum-v1", episodes=3, seed=2, max_episode_steps=20,
                    env_kwargs={"g": 3.0}),
    ]  # fmt: skip

    def policy(obs):
        return cartpole_policy(obs) if obs.shape == (4,) else [0.5]

    local = rlmesh.run_suite(policy, tasks)
    sandboxed = rlmesh.run_suite(
        policy, tasks, env_sandbox=SandboxOptions(), cluster="ray", workers=2
    )
    for task in tasks:
        assert episodes_of(sandboxed[task.name]) == episodes_of(local[task.name]), task.name


@pytest.mark.parametrize("ray_mode", ["actors", "tasks"])
def test_a_sandboxed_model_on_ray_plays_the_episodes_of_a_local_run(ray_mode):
    """A ``SandboxModel`` travels to the workers as its arguments: each worker process starts
    a server like it (held across an actor's windows; a task's window starts it again), and
    the one started here for its spec is stopped while the workers run."""
    model = SandboxModel("cartpole-heuristic", sandbox=False, python=sys.executable)
    try:
        local = rlmesh.run(model, "CartPole-v1", num_envs=2, **RUN)
        with SandboxStarts() as starts:
            result = rlmesh.run(
                model, "CartPole-v1", num_envs=2, cluster="ray", workers=2,
                window_episodes=4, ray_mode=ray_mode, **RUN,
            )  # fmt: skip
        assert not model.running
    finally:
        model.close()
    assert episodes_of(result) == episodes_of(local)
    workers = {window.worker for window in result.cluster.windows}
    servers = len(workers) if ray_mode == "actors" else len(result.cluster.windows)
    assert len(starts.seen) == servers, (starts.seen, workers)


# ---------------------------------------------------------------------------- the CLI


SANDBOXED_SIDES = {
    "env": ["--sandbox"],  # the run's ray_mode becomes actors: they hold the sandboxes
    "policy": ["--policy-python", sys.executable, "--ray-mode", "actors"],
}


@pytest.mark.parametrize("side", list(SANDBOXED_SIDES))
@pytest.mark.parametrize("core", CORES)
def test_the_cli_runs_a_sandboxed_side_on_ray_workers(ray_cluster, core, side, tmp_path, capsys):
    argv = [
        "eval", "cartpole-heuristic", "--env", "CartPole-v1", "--num-envs", "2",
        "--episodes", "8", "--seed", "4", "--max-episode-steps", "50", "--core", core,
        "--json", "--no-progress",
    ]  # fmt: skip
    out, reference = tmp_path / "ray.jsonl", tmp_path / "local.jsonl"
    assert main([*argv, "--out", str(reference)]) == 0
    capsys.readouterr()
    ray_argv = [*SANDBOXED_SIDES[side], "--ray", ray_cluster, "--workers", "2"]
    assert main([*argv, *ray_argv, "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["cluster"]["workers"] == 2 and summary["cluster"]["ray_mode"] == "actors"
    _, on_ray = read_results(out)
    _, local = read_results(reference)
    assert [_fields(e) for e in on_ray] == [_fields(e) for e in local]


def _fields(episode):
    return (episode.index, episode.seed, episode.steps, episode.reward, episode.success)
