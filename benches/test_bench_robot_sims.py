"""PushT, ALOHA and Meta-World through ``rlmesh.run`` against their raw loops, one lane each.

Each benchmark's env comes from ``rlmesh.benchmarks`` (its suite's first task with the
suite's default options: PushT's 96x96 pixels and the pusher's position, ALOHA's insertion
with the top camera at 640x480 and the 14 joint positions, Meta-World MT10's ``reach-v3``
with its 39-value state) and is built once; both sides step that same env object with the
same seeded random policy (``robot_loops.ProjectionPolicy``: actions that look random, a pure
function of the state), the same seeds and trial indices, so they play the same episodes. The
raw loop is what a user writes around ``gymnasium.make``: reset, then step until the episode
ends or the cap. rlmesh's side is ``rlmesh.run(model, env, seeds=..., max_episode_steps=cap)``
on one lane (the model's per-lane corner). Figures are lane-steps per second over each side's
wall time, resets included; the issue's target is rlmesh at least 0.95x the raw loop.

Run: ``python benches/test_bench_robot_sims.py [--quick] [--json out.json]`` for both sides of
each row interleaved (A B A B ...) and their medians, or ``pytest
benches/test_bench_robot_sims.py --benchmark-enable``. Without ``--benchmark-enable`` (the
default) each side runs one episode of 3 steps on each core, as a smoke test; a benchmark
whose package is not installed is skipped.
"""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")  # before anything imports mujoco: no display here

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import rlmesh
from rlmesh import benchmarks
from rlmesh.benchmarks import aloha
from rlmesh.core import CORE_NAMES
from robot_loops import (
    Controller,
    PolicyModel,
    ProjectionPolicy,
    Sample,
    interleaved_samples,
    median_rate,
    raw_episodes,
    run_rlmesh,
)

TARGET = 0.95  # the issue's: rlmesh at least this fraction of the raw loop's lane-steps/s


def _aloha_controller() -> Controller:
    # Joint targets within a fifth of each joint's range around its middle: wide enough to move
    # every joint each step, narrow enough that the arms do not slam into their limits.
    space = aloha.action_space()
    middle, half = (space.low + space.high) / 2, (space.high - space.low) / 10
    policy = ProjectionPolicy(14, 14, low=middle - half, high=middle + half, seed=0)
    return Controller(("agent_pos",), policy)


@dataclass(frozen=True)
class Sim:
    """One benchmark's workload: its suite's first task, the policy, and how much to run."""

    suite: str
    controller: Callable[[], Controller]
    cap: int  # steps per episode at most (the full run's)
    episodes: int  # episodes per sample (the full run's)

    def make_env(self) -> gym.Env:
        return benchmarks.suite(self.suite)[0].make_env()()

    def installed(self) -> bool:
        return benchmarks.info(self.suite).installed()


SIMS = {
    "PushT": Sim(
        "pusht",
        lambda: Controller(
            ("agent_pos",), ProjectionPolicy(2, 2, low=[0.0] * 2, high=[512.0] * 2, seed=0)
        ),
        cap=100,
        episodes=10,
    ),
    "ALOHA": Sim("aloha", _aloha_controller, cap=20, episodes=3),
    "Meta-World": Sim(
        "metaworld_mt10",
        lambda: Controller(None, ProjectionPolicy(39, 4, low=[-1.0] * 4, high=[1.0] * 4, seed=0)),
        cap=200,
        episodes=10,
    ),
}
SMOKE_CAP, SMOKE_EPISODES = 3, 1


class Bench:
    """One benchmark's env, built and reset once, and its two sides."""

    def __init__(self, name: str, sim: Sim, cap: int, episodes: int) -> None:
        self.name, self.sim, self.cap, self.episodes = name, sim, cap, episodes
        self.controller = sim.controller()
        self.model = PolicyModel(self.controller)
        started = time.perf_counter()
        self.env = sim.make_env()
        try:
            self.env.reset(seed=10_000)  # a lazy simulator builds at its first reset
        except BaseException:
            self.env.close()
            raise
        self.build_s = time.perf_counter() - started
        self.seeds = list(range(episodes))

    def close(self) -> None:
        self.env.close()

    def raw(self) -> Sample:
        started = time.perf_counter()
        lengths = raw_episodes(
            self.env, self.controller.one, self.seeds, list(range(self.episodes)), self.cap
        )
        seconds = time.perf_counter() - started
        return Sample(sum(lengths), sum(lengths) / seconds, sum(lengths), tuple(lengths))

    def rlmesh(self, core: str | None = None) -> Sample:
        sample, result = run_rlmesh(self.model, self.env, self.seeds, self.cap, core=core)
        if result.wasted_steps:
            raise AssertionError(f"{self.name}: rlmesh ran {result.wasted_steps} surplus steps")
        return sample

    def sides(self) -> dict[str, Callable[[], Sample]]:
        return {"raw loop": self.raw, "rlmesh.run": self.rlmesh}


# ---------------------------------------------------------------------------------- pytest


@pytest.fixture(scope="module")
def built(request) -> Iterator[Callable[[str], Bench]]:
    """Each benchmark's ``Bench``, built on first use and closed at the end of the module."""
    config = request.config
    enabled = config.getoption("benchmark_enable") or not config.getoption("benchmark_disable")
    held: dict[str, Bench] = {}

    def get(name: str) -> Bench:
        sim = SIMS[name]
        if not sim.installed():
            pytest.skip(f"{name} is not installed (pip install 'rlmesh[{sim.suite}]')")
        if name not in held:
            cap, episodes = (sim.cap, sim.episodes) if enabled else (SMOKE_CAP, SMOKE_EPISODES)
            held[name] = Bench(name, sim, cap, episodes)
        return held[name]

    yield get
    for bench in held.values():
        bench.close()


@pytest.mark.parametrize("name", list(SIMS))
def test_raw_loop_one_lane(benchmark, built, name):
    bench = built(name)
    benchmark.group = f"{name}, 1 lane: rlmesh.run vs the raw loop"
    benchmark.extra_info["floor"] = "the raw loop"
    sample = benchmark.pedantic(bench.raw, rounds=1)
    assert sample.rate > 0 and 0 < max(sample.lengths) <= bench.cap


@pytest.mark.parametrize("core", CORE_NAMES)
@pytest.mark.parametrize("name", list(SIMS))
def test_rlmesh_one_lane(benchmark, built, name, core):
    bench = built(name)
    benchmark.group = f"{name}, 1 lane: rlmesh.run vs the raw loop"
    sample = benchmark.pedantic(bench.rlmesh, args=(core,), rounds=1)
    assert sample.lengths == bench.raw().lengths  # the same episodes as the raw loop's


# ---------------------------------------------------------------------------------- side by side


def measure(name: str, bench: Bench, repeats: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Both sides of ``bench`` interleaved ``repeats`` times: medians, ratio, per-step cost."""

    def on_sample(side: str, sample: Sample) -> None:
        log(f"  {name} {side}: {sample.rate:,.1f} lane-steps/s; load {os.getloadavg()[0]:.1f}")

    samples = interleaved_samples(bench.sides(), repeats, on_sample, warm_up=True)
    raw, ours = median_rate(samples["raw loop"]), median_rate(samples["rlmesh.run"])
    lengths = {s.lengths for runs in samples.values() for s in runs}
    return {
        "raw": raw,
        "rlmesh": ours,
        "ratio": ours / raw,
        "step_ms": 1e3 / raw,
        "overhead_us_per_step": (1 / ours - 1 / raw) * 1e6,
        "same_episodes": len(lengths) == 1,
        "steps_per_sample": samples["raw loop"][0].scored_steps,
        "build_s": bench.build_s,
        "samples": {side: [asdict(s) for s in runs] for side, runs in samples.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the smoke sizes, one repeat")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved samples per side")
    parser.add_argument("--json", metavar="PATH", help="write every figure here")
    parser.add_argument("--only", default=",".join(SIMS), help=f"of {', '.join(SIMS)}")
    args = parser.parse_args(argv)
    repeats = 1 if args.quick else args.repeats

    def log(text: str) -> None:
        print(text, flush=True)

    load_before, started = os.getloadavg(), time.perf_counter()
    log(f"core {rlmesh.core_name()}; {repeats} interleaved repeats; load {load_before}")
    figures: dict[str, Any] = {}
    for name in args.only.split(","):
        sim = SIMS[name]
        if not sim.installed():
            log(f"{name}: not installed, skipped")
            continue
        cap, episodes = (SMOKE_CAP, SMOKE_EPISODES) if args.quick else (sim.cap, sim.episodes)
        bench = Bench(name, sim, cap, episodes)
        try:
            figures[name] = measure(name, bench, repeats, log)
        finally:
            bench.close()
        figures[name].update(cap=cap, episodes=episodes)
    elapsed, load_after = time.perf_counter() - started, os.getloadavg()
    log(f"\nran in {elapsed:.0f} s; load average {load_before} before, {load_after} after")
    log(f"\n[1 lane: rlmesh.run vs the raw loop, lane-steps/s, medians of {repeats}]")
    for name, figure in figures.items():
        status = "ok" if figure["ratio"] >= TARGET else "MISSED"
        log(
            f"{name:11} {figure['episodes']} episodes, cap {figure['cap']}: raw loop "
            f"{figure['raw']:,.1f}  rlmesh.run {figure['rlmesh']:,.1f}  {figure['ratio']:.3f}x  "
            f">= {TARGET}x {status}"
        )
        log(
            f"    a step {figure['step_ms']:.2f} ms; rlmesh's extra per step "
            f"{figure['overhead_us_per_step']:.0f} us; same episodes on both sides: "
            f"{figure['same_episodes']}"
        )
    if args.json:
        report = {"repeats": repeats, "load": [load_before, load_after], "sims": figures}
        Path(args.json).write_text(json.dumps(report, indent=2, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
