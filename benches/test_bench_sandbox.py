"""Sandboxed envs (``rlmesh.sandbox.SandboxEnv``) against the same env served without one.

- CartPole at 1 lane (16 seeded episodes, about 8,000 steps) and 16 lanes (32 episodes, about
  16,000 lane-steps). A one-lane run is a ping-pong between the driver and the server, whose
  rate on a shared 2-vCPU machine doubles or halves with where the scheduler puts the two
  (shorter runs fell wholly in one mode or the other), so its runs are long enough to mix
  both. The timed rounds are runs on a ``SandboxEnv`` (its own virtual
  environment; under bubblewrap, ``sandboxed``, or without, ``isolated``); each round's set-up
  starts it (not timed) and first times one run on the same env served without a sandbox
  (a new ``rlmesh serve env`` on this interpreter over a unix socket, the sandbox's
  transport), so both sides pay a new server's first run and alternate on a shared
  machine. A run on a ``SandboxEnv`` also stops its server (it closes its lanes), which kills
  it: about 10 to 25 ms a run. ``extra_info``: the served
  side's median and ``ratio`` = served median / sandboxed median (the sandboxed side's
  throughput as a fraction of the served one's). Target: ratio >= 0.9.
- Stepping alone: the same CartPole at 16 lanes, ``STEPPING_EPISODES`` episodes (several
  seconds a run), each side's server started once before the rounds and kept: a
  ``SandboxEnv`` (sandboxed) and a ``RemoteEnv`` of ``rlmesh serve env`` on this interpreter
  over a unix socket (served), each run on its open session, whose close the run skips. So a
  round times the episodes' resets and steps only, no start or stop; the sides alternate,
  served first, within each round. ``extra_info``: the served median, ``ratio`` as above,
  and ``lane_steps``. This separates the per-step cost (this row) from the per-run cost
  (start, first session, stop: the rows above less this one's share). Target: ratio >= 0.9.
- Start-up: a ``SandboxEnv`` whose environment is cached (its server started, health-checked
  and its session open: the rounds), against the first build of that environment in an empty
  cache (timed once, in ``extra_info["first_build_s"]``; ``uv``'s own download cache is warm
  after the first run on a machine). Target: the cached start-up under 2 s.

Run: ``pytest benches/test_bench_sandbox.py --benchmark-enable`` (environments are cached in
``$RLMESH_SANDBOX_VENVS``, default ``~/.cache/rlmesh-tests/sandbox-venvs``, as the tests').
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pytest
from cartpole import SEEDS
from test_bench_remote_env import REMOTE_EPISODES, REMOTE_LANES, batched_model, served

pytest.importorskip("grpc")
from rlmesh.sandbox import SandboxEnv
from rlmesh.sandbox.bwrap import find_bwrap

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed")

ONE_LANE_SEEDS = SEEDS[:16]
ROUNDS = 9
VENVS = os.environ.get("RLMESH_SANDBOX_VENVS") or str(
    Path.home() / ".cache" / "rlmesh-tests" / "sandbox-venvs"
)


@pytest.fixture(autouse=True)
def venv_cache(monkeypatch):
    monkeypatch.setenv("RLMESH_SANDBOX_VENVS", VENVS)


def run_one_lane(env):
    import rlmesh
    from cartpole import policy

    return rlmesh.run(policy, env, seeds=ONE_LANE_SEEDS)


def run_lanes(env):
    import rlmesh

    return rlmesh.run(batched_model(), env, episodes=REMOTE_EPISODES)


def _bench_against_served(benchmark, num_lanes, sandbox, run):
    """Time ``run`` on a new ``SandboxEnv`` of ``num_lanes`` lanes a round, each round's
    set-up first timing ``run`` on a new server of the env without a sandbox (both sides pay
    a fresh server's first run)."""
    served_s = []

    def setup():
        with tempfile.TemporaryDirectory(prefix="rlmesh-bench-") as directory:
            argv = [sys.executable, "-m", "rlmesh", "serve", "env", "CartPole-v1"]
            argv += ["--num-envs", str(num_lanes), "--address", f"unix://{directory}/env.sock"]
            with served(argv) as address:
                started = time.perf_counter()
                run(address)
                served_s.append(time.perf_counter() - started)
        return (SandboxEnv("CartPole-v1", num_envs=num_lanes, sandbox=sandbox),), {}

    result = benchmark.pedantic(run, setup=setup, rounds=ROUNDS)
    if benchmark.stats is not None:  # measured (--benchmark-enable)
        served_median = statistics.median(served_s)
        benchmark.extra_info["served_median_s"] = round(served_median, 4)
        benchmark.extra_info["ratio"] = round(served_median / benchmark.stats.stats.median, 3)
    return result


@pytest.mark.parametrize("sandbox", [True, False], ids=["sandboxed", "isolated"])
def test_cartpole_one_lane(benchmark, sandbox):
    benchmark.group = "CartPole 1 lane: SandboxEnv (served: extra_info)"
    result = _bench_against_served(benchmark, 1, sandbox, run_one_lane)
    assert result.num_episodes == len(ONE_LANE_SEEDS)


@pytest.mark.parametrize("sandbox", [True, False], ids=["sandboxed", "isolated"])
def test_cartpole_sixteen_lanes(benchmark, sandbox):
    benchmark.group = "CartPole 16 lanes: SandboxEnv (served: extra_info)"
    result = _bench_against_served(benchmark, REMOTE_LANES, sandbox, run_lanes)
    assert result.num_episodes == REMOTE_EPISODES


STEPPING_EPISODES = 320  # 16 lanes: up to 160,000 lane-steps, about 5 s a run
STEPPING_ROUNDS = 5


class KeptOpen:
    """Lanes whose ``close`` leaves them open: a run on them ends without stopping the
    server, so the next round steps the same server and session (read through otherwise)."""

    def __init__(self, lanes):
        self._lanes = lanes

    def __getattr__(self, name):
        return getattr(self.__dict__["_lanes"], name)

    def close(self):
        pass


def run_stepping(lanes):
    import rlmesh

    return rlmesh.run(batched_model(), KeptOpen(lanes), episodes=STEPPING_EPISODES)


def test_cartpole_sixteen_lanes_stepping_alone(benchmark):
    from rlmesh.lanes.remote import RemoteEnv

    benchmark.group = "CartPole 16 lanes, stepping alone: SandboxEnv (served: extra_info)"
    served_s: list[float] = []
    with tempfile.TemporaryDirectory(prefix="rlmesh-bench-") as directory:
        argv = [sys.executable, "-m", "rlmesh", "serve", "env", "CartPole-v1"]
        argv += ["--num-envs", str(REMOTE_LANES), "--address", f"unix://{directory}/env.sock"]
        with served(argv) as address:
            remote = RemoteEnv(address)
            sandboxed = SandboxEnv("CartPole-v1", num_envs=REMOTE_LANES)
            try:
                run_stepping(remote)  # both sides' first run (warm-up), not timed
                run_stepping(sandboxed)

                def setup():
                    started = time.perf_counter()
                    run_stepping(remote)
                    served_s.append(time.perf_counter() - started)
                    return (sandboxed,), {}

                result = benchmark.pedantic(run_stepping, setup=setup, rounds=STEPPING_ROUNDS)
            finally:
                sandboxed.close()
                remote.close()
    assert result.num_episodes == STEPPING_EPISODES
    benchmark.extra_info["lane_steps"] = result.total_steps
    if benchmark.stats is not None:  # measured (--benchmark-enable)
        served_median = statistics.median(served_s)
        benchmark.extra_info["served_median_s"] = round(served_median, 4)
        benchmark.extra_info["ratio"] = round(served_median / benchmark.stats.stats.median, 3)


def start_and_close(**options):
    SandboxEnv("CartPole-v1", **options).close()


def test_start_up_of_a_cached_environment_vs_its_first_build(benchmark, tmp_path, monkeypatch):
    benchmark.group = "SandboxEnv start-up: cached vs first build"
    monkeypatch.setenv("RLMESH_SANDBOX_VENVS", str(tmp_path / "venvs"))
    started = time.perf_counter()
    start_and_close(progress=lambda line: None)  # builds the environment in an empty cache
    benchmark.extra_info["first_build_s"] = round(time.perf_counter() - started, 2)
    benchmark.pedantic(start_and_close, rounds=ROUNDS)
