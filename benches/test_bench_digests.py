"""What the episode digests cost: ``rlmesh.run`` with digests on against digests off.

Every episode's ``reset_digest`` and ``trajectory_digest`` are computed by the core on the hot
path: each lane-step hashes the action, the observation, the reward and the flags. The off
side is the same run with the core's measuring-only switch ``RoundRunner(digests=False)``
(``digests_off`` puts it in place of the core's ``RoundRunner`` for one run; a run always keeps
digests). Two workloads, each on both cores:

- CartPole, 16 lanes, a batched policy (``test_bench_driver.run_sixteen_lanes``): small
  observations, where a digest's fixed cost per lane-step shows most;
- an env returning 256x256x3 uint8 images that takes about 1 ms a step (``ImageEnv``), 4 lanes:
  where hashing the bytes shows most.

Target (issue 33): digests on lose at most 3% of lane-steps/s against off, on each workload.

Run: ``pytest benches/test_bench_digests.py --benchmark-enable``, or for the two sides
interleaved (A B A B, the medians and their ratio): ``python benches/test_bench_digests.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import time
from collections.abc import Callable, Iterator

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from rlmesh.core import CORE_NAMES, load_core
from test_bench_driver import run_sixteen_lanes

ROUNDS = 5
IMAGE_SHAPE = (256, 256, 3)
IMAGE_STEP_S = 1e-3
IMAGE_LANES, IMAGE_EPISODES, IMAGE_EPISODE_STEPS = 4, 16, 40


@contextlib.contextmanager
def digests_off(core: str) -> Iterator[None]:
    """Runs on ``core`` inside the block keep no digests: its ``RoundRunner`` is built with
    ``digests=False`` (for measuring only)."""
    module = load_core(core)
    original = module.RoundRunner
    module.RoundRunner = functools.partial(original, digests=False)
    try:
        yield
    finally:
        module.RoundRunner = original


class ImageEnv(gym.Env):
    """A camera env: each step renders a fresh 256x256x3 uint8 frame and takes about 1 ms (a
    busy wait, so the time is the CPU's, as a simulator's is); episodes last 40 steps."""

    observation_space = gym.spaces.Box(0, 255, IMAGE_SHAPE, np.uint8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self._base = np.random.default_rng(0).integers(0, 256, IMAGE_SHAPE, dtype=np.uint8)

    def _frame(self) -> np.ndarray:
        return np.add(self._base, np.uint8(self.t % 251), dtype=np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = int(self.np_random.integers(0, 251))
        return self._frame(), {}

    def step(self, action):
        until = time.perf_counter() + IMAGE_STEP_S
        self.t += 1 + int(action)
        frame = self._frame()
        while time.perf_counter() < until:
            pass
        return frame, 1.0, False, self.t % IMAGE_EPISODE_STEPS == 0, {}


def image_policy(obs):
    return int(obs[0, 0, 0] > 127)


def run_images(core: str | None = None) -> rlmesh.RunResult:
    """``rlmesh.run`` of a per-lane policy on 4 ``ImageEnv`` lanes."""
    return rlmesh.run(
        image_policy,
        ImageEnv,
        episodes=IMAGE_EPISODES,
        num_envs=IMAGE_LANES,
        max_episode_steps=IMAGE_EPISODE_STEPS,
        core=core,
    )


WORKLOADS: dict[str, Callable[[str], rlmesh.RunResult]] = {
    "CartPole, 16 lanes, batched policy": run_sixteen_lanes,
    f"256x256x3 uint8 images, ~1 ms a step, {IMAGE_LANES} lanes": run_images,
}


def timed(
    workload: Callable[[str], rlmesh.RunResult], core: str, digests: bool
) -> tuple[float, float]:
    """One run of ``workload`` on ``core``: its lane-steps per second of wall time, and per
    second of this process's CPU time (which a busy machine's other processes do not
    inflate: they only take the CPU away)."""
    with contextlib.nullcontext() if digests else digests_off(core):
        started, cpu_started = time.perf_counter(), time.process_time()
        result = workload(core)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    kept = all(e.trajectory_digest is not None for e in result.episodes)
    assert kept is digests, "the digests switch did not reach the run"
    return result.total_steps / elapsed, result.total_steps / cpu


@pytest.mark.parametrize("digests", [True, False], ids=["digests on", "digests off"])
@pytest.mark.parametrize("core", CORE_NAMES)
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_run_with_and_without_digests(benchmark, name, core, digests):
    benchmark.group = f"digests on vs off, {name}"
    workload = WORKLOADS[name]
    with contextlib.nullcontext() if digests else digests_off(core):
        result = benchmark.pedantic(workload, args=(core,), rounds=ROUNDS)
    benchmark.extra_info["lane_steps"] = result.total_steps
    assert all((e.reset_digest is not None) is digests for e in result.episodes)


def interleaved(repeats: int, cores: list[str]) -> None:
    """Each workload on each of ``cores``, digests on and off interleaved ``repeats`` times:
    medians of lane-steps/s and the ratio on / off."""
    print(
        f"{'workload':<50} {'core':<7} {'clock':<5} {'digests off':>14} {'digests on':>14} "
        f"{'on/off':>7}"
    )
    for name, workload in WORKLOADS.items():
        for core in cores:
            timed(workload, core, True)  # warm: imports, the first envs
            sides: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
            for _ in range(repeats):
                for digests in (False, True):
                    sides[digests].append(timed(workload, core, digests))
            for k, clock in enumerate(("wall", "cpu")):
                off, on = (statistics.median(run[k] for run in sides[side]) for side in (0, 1))
                print(
                    f"{name:<50} {core:<7} {clock:<5} {off:>12,.0f}/s {on:>12,.0f}/s "
                    f"{on / off:>7.3f}"
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="runs of each side (7)")
    parser.add_argument(
        "--core", choices=CORE_NAMES, action="append", help="only this core (default: both)"
    )
    arguments = parser.parse_args()
    interleaved(arguments.repeats, arguments.core or list(CORE_NAMES))
