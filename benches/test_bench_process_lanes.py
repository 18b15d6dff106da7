"""Process lanes (``workers=W``) beside in-process lanes and Gymnasium's ``AsyncVectorEnv``.

- A CPU-heavy env (``cpu_heavy.py``, about 1 ms of CPU a step), 8 lanes: ``rlmesh.run`` with
  ``workers=2`` vs ``workers=1``, and vs ``AsyncVectorEnv(8)`` stepped by a hand-written loop
  until as many episodes completed, in *scored* lane-steps/s (the vector's surplus steps,
  which it cannot avoid, count for nothing; rlmesh's runs have none).
- A real simulator, MuJoCo's ``Hopper-v5`` (the ``sim`` extra), the same comparison, with a
  fixed linear policy whose falls end episodes unevenly.
- CartPole, 16 lanes: what one round costs more with process lanes than in-process, the
  overhead that tells a user when not to use workers.
- The same work over bare pipes: the CPU-heavy env's work alone (``burn()``, no env, no
  rlmesh), 8 steps a round in lockstep, in this process against 2 processes asked and answered
  over bare pipes (waiting as the workers do); what ``workers=2`` gains with the driver's
  work, the env objects, uneven lanes and episode ends free.
- The machine's ceiling: the same work split over 2 processes that never wait on each other
  (told to go once, timed to the last answer) against this process: what two processes get
  of this machine's two vCPUs, which no number of workers can beat. The same for Hopper's
  lanes (``SimLanes``: the envs and the policy alone), since a simulator's step may share a
  CPU's caches and memory bandwidth worse than ``burn()`` does.
- Group pipelining (``pipeline=True``) on the CPU-heavy env, 2 workers: with a model as slow
  as the env (it waits 1 ms per lane of a call, as a model on an accelerator or a server
  does, leaving the CPU to the envs) against plain rounds; and with the fast policy against
  ``workers=1``.

Throughputs come from the run's own telemetry (``driver`` ``lane-steps`` / ``steps`` rows),
which span the rounds and not the workers' start; the vector's loop is timed after it is made
likewise. The start of the workers is reported on its own.

Run: ``pytest benches/test_bench_process_lanes.py --benchmark-enable``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from cartpole import ENV_ID, batched_policy
from cpu_heavy import batched_policy as cpu_policy
from cpu_heavy import burn, make_short_episodes
from rlmesh.lanes import ProcessLanes
from rlmesh.lanes.process.worker import POLL_S

CPU_LANES = 8
CPU_EPISODES = 16
CARTPOLE_LANES, CARTPOLE_EPISODES = 16, 32
MODEL_S_PER_LANE = 0.001  # the slow model: as long per lane as a CPU-heavy env step
SIM_ID, SIM_LANES, SIM_EPISODES = "Hopper-v5", 8, 16
BARE_ROUNDS = 50  # lockstep rounds of the same work over bare pipes
HAS_MUJOCO = importlib.util.find_spec("mujoco") is not None
# Hopper's 11 observations to its 3 torques, fixed and small: it stands a while, then falls
# (episodes of about 50 to 150 steps, uneven across seeds).
SIM_WEIGHTS = np.random.default_rng(0).normal(0.0, 0.01, (11, 3)).astype(np.float32)


def sim_policy(obs: np.ndarray) -> np.ndarray:
    """``[N, 11]`` Hopper observations to ``[N, 3]`` torques in [-1, 1]."""
    return np.tanh(obs.astype(np.float32) @ SIM_WEIGHTS)


# One lane of each, as a factory that pickles (worker processes build their lanes with it).
make_cpu_env = make_short_episodes
make_sim_env = functools.partial(gym.make, SIM_ID)


class BatchedPolicy(rlmesh.Model):
    """A batched corner for a plain batched function, so every lane count calls it once."""

    stateless = True

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def predict_batch(self, obs):
        return self.fn(obs)


def rate(result: rlmesh.RunResult, metric: str) -> float:
    """The run's ``driver`` throughput row ``metric`` (``lane-steps`` or ``steps``), per s."""
    return next(row.avg for row in result.telemetry if row.op == "driver" and row.metric == metric)


class SlowModel(rlmesh.Model):
    """``cpu_policy`` behind a model that waits ``MODEL_S_PER_LANE`` per lane of each call:
    the latency of a model on an accelerator or a server, which leaves the CPU to the envs."""

    stateless = True

    def predict_batch(self, obs):
        time.sleep(MODEL_S_PER_LANE * len(obs))
        return cpu_policy(obs)


def run_cpu(
    workers: int, episodes: int = CPU_EPISODES, *, pipeline: bool = False, model: Any = None
) -> rlmesh.RunResult:
    """``rlmesh.run`` on ``CPU_LANES`` CPU-heavy lanes in ``workers`` processes (1: none),
    with group pipelining or not, of ``model`` (default the fast batched policy)."""
    return rlmesh.run(
        BatchedPolicy(cpu_policy) if model is None else model,
        make_cpu_env,
        episodes=episodes,
        num_envs=CPU_LANES,
        workers=workers,
        pipeline=pipeline,
    )


def run_sim(workers: int, episodes: int = SIM_EPISODES) -> rlmesh.RunResult:
    """``rlmesh.run`` on ``SIM_LANES`` Hopper lanes in ``workers`` processes (1: none)."""
    return rlmesh.run(
        BatchedPolicy(sim_policy),
        SIM_ID,
        episodes=episodes,
        num_envs=SIM_LANES,
        workers=workers,
    )


@dataclass
class VectorLoop:
    """What the hand-written ``AsyncVectorEnv`` loop did."""

    seconds: float
    scored_steps: int  # the lane-steps of the episodes it counted
    lane_steps: int  # every lane-step it took, surplus and autoreset steps included

    @property
    def wasted_steps(self) -> int:
        return self.lane_steps - self.scored_steps


def async_vector_loop(
    episodes: int = CPU_EPISODES,
    make_env: Callable[[], gym.Env] = make_cpu_env,
    policy: Callable[[np.ndarray], Any] = cpu_policy,
    lanes: int = CPU_LANES,
) -> VectorLoop:
    """``AsyncVectorEnv`` of ``lanes`` envs (default the CPU-heavy one), stepped until
    ``episodes`` episodes completed (the first to complete: a lockstep loop cannot do better
    without waste); the loop alone is timed, as a user would write it (its default NEXT_STEP
    autoreset)."""
    vector = gym.vector.AsyncVectorEnv([make_env] * lanes)
    try:
        obs, _ = vector.reset(seed=list(range(lanes)))
        started = time.perf_counter()
        lengths = np.zeros(lanes, dtype=np.int64)
        restarting = np.zeros(lanes, dtype=bool)
        completed = scored = lane_steps = 0
        while completed < episodes:
            obs, _, terminated, truncated, _ = vector.step(policy(obs))
            lane_steps += lanes
            lengths[~restarting] += 1  # a restarting lane's step is the autoreset, no step
            ended = (terminated | truncated) & ~restarting
            for lane in np.flatnonzero(ended)[: episodes - completed]:
                scored += int(lengths[lane])
                completed += 1
            lengths[ended] = 0
            restarting = ended
        return VectorLoop(time.perf_counter() - started, scored, lane_steps)
    finally:
        vector.close()


def run_cartpole(workers: int, episodes: int = CARTPOLE_EPISODES) -> rlmesh.RunResult:
    return rlmesh.run(
        BatchedPolicy(batched_policy),
        ENV_ID,
        episodes=episodes,
        num_envs=CARTPOLE_LANES,
        workers=workers,
        max_episode_steps=200,
    )


def burns(count: int) -> None:
    """``burn()`` ``count`` times: ``count`` CPU-heavy steps' work alone."""
    for _ in range(count):
        burn()


def burner(processes: int) -> Callable[[int], None]:
    """The CPU-heavy work of one of ``processes`` processes (the same in each)."""
    return burns


class SimLanes:
    """``lanes`` Hopper envs and ``sim_policy``, with nothing around them: a call with a count
    takes that many lane-steps round-robin over the lanes (one batched policy call a sweep),
    resetting (seeded by the episode's order) each episode that ends; what ``run_sim``'s lanes
    do, without a driver, pipes or other processes."""

    def __init__(self, lanes: int) -> None:
        self.envs = [make_sim_env() for _ in range(lanes)]
        self.episodes = 0
        self.observations = [self._reset(env) for env in self.envs]
        self.actions: np.ndarray | None = None  # each sweep's, set as it starts (lane 0)
        self.next_lane = 0

    def _reset(self, env: gym.Env) -> np.ndarray:
        self.episodes += 1
        return env.reset(seed=self.episodes)[0]

    def __call__(self, count: int) -> None:
        envs, observations = self.envs, self.observations
        for _ in range(count):
            lane = self.next_lane
            if lane == 0:  # a sweep over the lanes is a round: one batched policy call
                self.actions = sim_policy(np.stack(observations))
            observation, _, terminated, truncated, _ = envs[lane].step(self.actions[lane])
            ended = terminated or truncated
            observations[lane] = self._reset(envs[lane]) if ended else observation
            self.next_lane = (lane + 1) % len(envs)


def sim_lanes(processes: int) -> SimLanes:
    """One of ``processes`` processes' share of ``SIM_LANES`` Hopper lanes."""
    return SimLanes(SIM_LANES // processes)


def _work_as_asked(conn, work: Callable[[int], None]) -> bool:
    """Read a count, do ``work(count)`` and answer it; False when told to stop."""
    count = conn.recv()
    if count is None:
        return False
    work(count)
    conn.send(count)
    return True


def _bare_worker(conn) -> None:
    """A process of the bare-pipes row: ``burn()`` as many times as asked, then answer, and
    wait for the next ask as a worker of process lanes does (polling for ``POLL_S``, then
    sleeping)."""
    while True:
        polling_until = time.perf_counter() + POLL_S
        while not conn.poll(0) and time.perf_counter() < polling_until:
            os.sched_yield()
        if not _work_as_asked(conn, burns):
            return


@contextlib.contextmanager
def _bench_processes(target: Callable[[Any], None], count: int) -> Iterator[list[Any]]:
    """``count`` processes running ``target(conn)``, each with a pipe to this process (the
    list yielded); at the end each is told to stop (None), then joined, or killed after 10 s."""
    context = multiprocessing.get_context("forkserver")
    pipes, children = [], []
    try:
        for _ in range(count):
            ours, theirs = context.Pipe()
            child = context.Process(target=target, args=(theirs,), daemon=True)
            child.start()
            theirs.close()
            pipes.append(ours)
            children.append(child)
        yield pipes
    finally:
        for pipe in pipes:
            with contextlib.suppress(OSError):  # a process that ended has closed its end
                pipe.send(None)
            pipe.close()
        for child in children:
            child.join(10)
            if child.is_alive():
                child.kill()
                child.join()


def _split(total: int, parts: int) -> list[int]:
    """``total`` as ``parts`` near-equal whole shares."""
    return [total * (k + 1) // parts - total * k // parts for k in range(parts)]


def _answer(pipe, timeout_s: float = 120.0) -> Any:
    """What a bench process sent, or ``TimeoutError`` once ``timeout_s`` passed without it."""
    if not pipe.poll(timeout_s):
        raise TimeoutError(f"a bench process did not answer within {timeout_s:g} s")
    return pipe.recv()


def bare_pipes_rate(processes: int, rounds: int = BARE_ROUNDS, lanes: int = CPU_LANES) -> float:
    """Lane-steps/s of ``rounds`` lockstep rounds of ``lanes`` CPU-heavy steps' work
    (``burn()`` alone: no env, no rlmesh), split evenly over ``processes`` processes that a
    bare pipe asks and answers (1: in this process, no pipe). The processes start, and answer
    once, before the timing."""
    if processes == 1:
        started = time.perf_counter()
        burns(rounds * lanes)
        return rounds * lanes / (time.perf_counter() - started)
    shares = _split(lanes, processes)
    with _bench_processes(_bare_worker, processes) as pipes:
        for pipe in pipes:  # each process is up and answering
            pipe.send(0)
            _answer(pipe)
        started = time.perf_counter()
        for _ in range(rounds):
            for pipe, share in zip(pipes, shares, strict=True):
                pipe.send(share)
            for pipe in pipes:
                _answer(pipe)
        return rounds * lanes / (time.perf_counter() - started)


def _independent_worker(
    conn, make_work: Callable[[int], Callable[[int], None]], processes: int
) -> None:
    """A process of the independent-processes rows: make its share of the work (one of
    ``processes``), say it is ready; once told to go with a count, do it with nothing in
    between, then answer."""
    work = make_work(processes)
    conn.send("ready")
    _work_as_asked(conn, work)


def independent_rate(
    processes: int,
    steps: int = BARE_ROUNDS * CPU_LANES,
    make_work: Callable[[int], Callable[[int], None]] = burner,
) -> float:
    """Lane-steps/s of ``steps`` steps' work split evenly over ``processes`` processes that
    never wait on each other: each makes ``make_work(processes)`` (default: the CPU-heavy env's
    ``burn()``; ``sim_lanes``: Hopper lanes), is told to go once, and the time runs to the last
    one's answer (1: in this process). What this machine gives ``processes`` processes for
    this work, with no round, pipe or driver in between.

    Example: ``independent_rate(2) / independent_rate(1)`` is the most ``workers=2`` can gain.
    """
    if processes == 1:
        work = make_work(1)
        started = time.perf_counter()
        work(steps)
        return steps / (time.perf_counter() - started)
    target = functools.partial(_independent_worker, make_work=make_work, processes=processes)
    with _bench_processes(target, processes) as pipes:
        for pipe in pipes:  # each process is up, its work made, and waiting for its go
            _answer(pipe)
        started = time.perf_counter()
        for pipe, share in zip(pipes, _split(steps, processes), strict=True):
            pipe.send(share)
        for pipe in pipes:
            _answer(pipe)
        return steps / (time.perf_counter() - started)


def worker_start_s(env=make_cpu_env, num_envs: int = CPU_LANES, workers: int = 2) -> float:
    """Seconds to start ``workers`` workers with their envs and close them again."""
    started = time.perf_counter()
    ProcessLanes(env, num_envs=num_envs, workers=workers).close()
    return time.perf_counter() - started


@pytest.mark.parametrize("workers", [1, 2])
def test_run_cpu_heavy_env_eight_lanes(benchmark, workers):
    benchmark.group = "process lanes, CPU-heavy env, 8 lanes"
    result = benchmark.pedantic(run_cpu, args=(workers, 4), rounds=1)
    assert result.wasted_steps == 0 and rate(result, "lane-steps") > 0


def test_async_vector_loop_cpu_heavy_env_eight_lanes(benchmark):
    benchmark.group = "process lanes, CPU-heavy env, 8 lanes"
    benchmark.extra_info["floor"] = "AsyncVectorEnv(8) stepped by hand"
    loop = benchmark.pedantic(async_vector_loop, args=(4,), rounds=1)
    assert loop.scored_steps > 0 and loop.wasted_steps >= 0


@pytest.mark.parametrize("pipeline", [False, True])
def test_run_cpu_heavy_env_slow_model_two_workers(benchmark, pipeline):
    benchmark.group = "process lanes, CPU-heavy env, 8 lanes, a model as slow as the env"
    result = benchmark.pedantic(
        run_cpu, args=(2, 4), kwargs={"pipeline": pipeline, "model": SlowModel()}, rounds=1
    )
    assert result.wasted_steps == 0 and rate(result, "lane-steps") > 0


@pytest.mark.parametrize("processes", [1, 2])
def test_the_same_work_over_bare_pipes_eight_burns_a_round(benchmark, processes):
    benchmark.group = "process lanes, CPU-heavy env, 8 lanes"
    benchmark.extra_info["floor"] = "burn() alone over bare pipes, lockstep"
    assert benchmark.pedantic(bare_pipes_rate, args=(processes, 5), rounds=1) > 0


@pytest.mark.parametrize("processes", [1, 2])
def test_the_same_work_in_independent_processes(benchmark, processes):
    benchmark.group = "process lanes, CPU-heavy env, 8 lanes"
    benchmark.extra_info["floor"] = "burn() alone in processes that never wait: the machine"
    assert benchmark.pedantic(independent_rate, args=(processes, 40), rounds=1) > 0


@pytest.mark.parametrize("workers", [1, 2])
def test_run_cartpole_sixteen_lanes_process_lanes(benchmark, workers):
    benchmark.group = "process lanes, CartPole 16 lanes"
    result = benchmark.pedantic(run_cartpole, args=(workers, 16), rounds=1)
    assert rate(result, "steps") > 0


@pytest.mark.skipif(not HAS_MUJOCO, reason="MuJoCo is not installed (pip install rlmesh[sim])")
@pytest.mark.parametrize("workers", [1, 2])
def test_run_hopper_eight_lanes(benchmark, workers):
    benchmark.group = "process lanes, Hopper-v5, 8 lanes"
    result = benchmark.pedantic(run_sim, args=(workers, 8), rounds=1)
    assert result.wasted_steps == 0 and rate(result, "lane-steps") > 0


@pytest.mark.skipif(not HAS_MUJOCO, reason="MuJoCo is not installed (pip install rlmesh[sim])")
@pytest.mark.parametrize("processes", [1, 2])
def test_hopper_steps_in_independent_processes(benchmark, processes):
    benchmark.group = "process lanes, Hopper-v5, 8 lanes"
    benchmark.extra_info["floor"] = "Hopper lanes alone in processes that never wait: the machine"
    assert benchmark.pedantic(independent_rate, args=(processes, 80, sim_lanes), rounds=1) > 0


@pytest.mark.skipif(not HAS_MUJOCO, reason="MuJoCo is not installed (pip install rlmesh[sim])")
def test_async_vector_loop_hopper_eight_lanes(benchmark):
    benchmark.group = "process lanes, Hopper-v5, 8 lanes"
    benchmark.extra_info["floor"] = "AsyncVectorEnv(8) stepped by hand"
    loop = benchmark.pedantic(
        async_vector_loop, args=(8, make_sim_env, sim_policy, SIM_LANES), rounds=1
    )
    assert loop.scored_steps > 0 and loop.wasted_steps >= 0
