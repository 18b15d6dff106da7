"""One benchmark report: rlmesh beside the loops and the package a user would otherwise pick.

Usage:
    python benches/report.py [--quick] [--peer] [--json out.json]

Every workload is the one the pytest-benchmark suites in this directory define (imported from
them, so each exists once); this script only times them. The two sides of a row run in one
process, interleaved (A B A B ...), ``--repeats`` times, and each side's figure is its median,
so drift on a shared machine hits both sides alike. A micro-benchmark sample times a batch of
calls long enough to dwarf the timer.

Sections: the core micro-benchmarks (Rust vs Python core), the role-based adapters (the Rust
core's resize against Pillow, a LIBERO-like assembly on both cores), end to end (``rlmesh.run`` vs a
hand-written loop of the same policy and seeds), chunked runs, the summary of a 1M-episode
results file against its time and memory budget (and a 1M-episode suite file's beside it),
the HTML report of a 10,000-episode suite file against its time budget, recording 5 of 50
pixel episodes to video against encoding their frames alone, a CPU-heavy env in worker
processes against the same env in this process and a hand-written ``AsyncVectorEnv`` loop,
group pipelining against plain rounds with a model as slow as the env, the same env on one
process vs a local Ray cluster (``cluster="ray"``, one run a side, Ray's start-up included), a
served env over loopback against the same run in-process (and the cores' bare bidi echo:
grpcio against tonic), and with ``--peer`` the
published ``rlmesh==0.1.0`` (run in its own virtual environment, see ``peer.py``). Each row
gives its workload, both figures, the ratio (how many times better rlmesh's side is) and the
target from the issues, and says MISSED where the ratio falls short. Targets are reported,
never enforced: the exit status is 0 whenever the report ran.

``--quick`` runs fewer repeats and shorter evaluations (under 2 minutes; ``.ci/run`` runs it as
a smoke test, so the benchmarks never rot).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import host
import numpy as np
import rlmesh
from cartpole import SEEDS, VECTOR_EPISODES
from ratios import format_ratio, format_time
from rlmesh.cluster.windows import window_sizes
from rlmesh.core import load_core
from test_bench_actions import actions_workload
from test_bench_adapters import LANES as ADAPTER_LANES
from test_bench_adapters import LiberoAssemblyRound, PillowResizeLoop, ResizeRound
from test_bench_assembly import IMAGE_LANES, CopyFloor, FrameStackRound, ImageRound
from test_bench_chunks import ChunkRound
from test_bench_cluster_ray import (
    CLUSTER_EPISODES,
    CLUSTER_WORKERS,
    LOAD_S,
    LOADING_WINDOW_EPISODES,
    LOADING_WINDOWS,
    per_episode,
    run_cluster,
    run_single,
    run_slow_to_load,
)
from test_bench_driver import (
    NULL_EPISODES_PER_LANE,
    NULL_LANES,
    null_plain_loop,
    plain_loop,
    run_chunked,
    run_lockstep,
    run_null,
    run_one_lane,
    run_one_lane_both_corners,
    run_sixteen_lanes,
    sync_vector_loop,
)
from test_bench_ensembles import EnsembleStep
from test_bench_ledger import EPISODE_STEPS, LANE_COUNTS, LedgerStepLoop
from test_bench_process_lanes import (
    CARTPOLE_LANES,
    CPU_LANES,
    HAS_MUJOCO,
    MODEL_S_PER_LANE,
    SIM_ID,
    SIM_LANES,
    SlowModel,
    async_vector_loop,
    bare_pipes_rate,
    independent_rate,
    make_sim_env,
    rate,
    run_cartpole,
    run_cpu,
    run_sim,
    sim_lanes,
    sim_policy,
    worker_start_s,
)
from test_bench_remote_env import (
    ONE_LANE_SEEDS,
    REMOTE_EPISODES,
    REMOTE_LANES,
    cpu_server,
    grpc_round_trip_us,
    our_server,
    rounds_of,
    run_local_lanes,
    run_local_one_lane,
    run_remote_cpu,
    run_remote_lanes,
    run_remote_one_lane,
    served,
)
from test_bench_remote_model import DRIVERS, EPISODES_PER_DRIVER
from test_bench_remote_model import measure as measure_served_model
from test_bench_report_html import (
    HTML_BUDGET_S,
    HTML_EPISODES,
    HTML_TASKS,
    html_in_subprocess,
)
from test_bench_report_html import suite_file as html_suite_file
from test_bench_suite_summary import TASKS as SUITE_TASKS
from test_bench_suite_summary import suite_file, suite_summary_in_subprocess
from test_bench_summary import REPORT_EPISODES, results_file, summary_in_subprocess
from test_bench_transport import ROUND_TRIPS, round_trip_us
from test_bench_video import (
    RECORDED_EPISODES,
    VIDEO_EPISODES,
    VIDEO_LANES,
    encode_only,
    recorded_frames,
    run_pixel,
    unrecorded_s_per_step,
)

PEER_VERSION = "0.1.0"
LOWER_IS_BETTER = ("s", "MB")
SUMMARY_BUDGET_S, SUMMARY_BUDGET_MB = 3.0, 300.0  # issue 10: a 1M-episode summary
HERE = Path(__file__).resolve().parent
EXTRA_FLOOR_S = 1e-3  # the least a recorded run's extra time is shown as


@dataclass
class Settings:
    """How much work each measurement does: the full run, or ``--quick``."""

    repeats: int  # interleaved samples per side; the figure is their median
    sample_s: float  # a micro-benchmark sample's length: enough calls to fill it
    one_lane_seeds: list[int]
    vector_episodes: int
    null_episodes: int
    summary_samples: int  # fresh processes summarizing the 1M-episode file
    cpu_episodes: int  # episodes of the CPU-heavy env (8 lanes, 40..119 steps each)
    bare_rounds: int  # lockstep rounds of the same work over bare pipes (8 burns each)
    sim_episodes: int  # episodes of MuJoCo's Hopper-v5 (8 lanes)
    process_cartpole_episodes: int  # CartPole episodes over 16 process lanes
    cluster_episodes: int  # CPU-heavy episodes, one process vs a local Ray cluster
    loading_windows: int  # windows of a model slow to load, Ray tasks vs actors
    host_probe_s: float  # how long host.py probes every CPU, before and after the sections


FULL = Settings(
    repeats=7,
    sample_s=0.05,
    one_lane_seeds=SEEDS,
    vector_episodes=VECTOR_EPISODES,
    null_episodes=NULL_EPISODES_PER_LANE * NULL_LANES,
    summary_samples=5,
    cpu_episodes=48,
    bare_rounds=200,
    sim_episodes=48,
    process_cartpole_episodes=64,
    cluster_episodes=CLUSTER_EPISODES,
    loading_windows=LOADING_WINDOWS,
    host_probe_s=3.0,
)
QUICK = Settings(
    repeats=3,
    sample_s=0.01,
    one_lane_seeds=SEEDS[:5],
    vector_episodes=16,
    null_episodes=256,
    summary_samples=1,
    cpu_episodes=8,
    bare_rounds=20,
    sim_episodes=8,
    process_cartpole_episodes=16,
    cluster_episodes=16,
    loading_windows=8,
    host_probe_s=0.5,
)


@dataclass
class Row:
    """One line of the table: a baseline and rlmesh's side (the subject) of one workload.

    ``unit`` is ``"s"`` (time per call) or ``"MB"`` (memory), lower is better, or a rate such
    as ``"steps/s"`` (higher is better); ``ratio`` is always "how many times better the subject
    is". A budget row's baseline is the budget itself, with a target of 1x. A row
    with no figures (``baseline_value`` None) was skipped; ``note`` says why.
    """

    section: str
    workload: str
    baseline: str
    baseline_value: float | None
    subject: str
    subject_value: float | None
    unit: str
    target: float | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if not self.baseline_value or not self.subject_value:
            return None
        if self.unit in LOWER_IS_BETTER:
            return self.baseline_value / self.subject_value
        return self.subject_value / self.baseline_value

    @property
    def status(self) -> str:
        if self.ratio is None:
            return "skipped" if self.baseline_value is None else ""
        if self.target is None:
            return ""
        return "ok" if self.ratio >= self.target else "MISSED"

    def as_dict(self) -> dict:
        return {**asdict(self), "ratio": self.ratio, "status": self.status}


def format_value(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "s":
        return format_time(value)
    if unit == "MB":
        return f"{value:,.0f} MB"
    return f"{value / 1e3:,.1f}k {unit}" if value >= 1e4 else f"{value:,.0f} {unit}"


def format_table(rows: list[Row]) -> str:
    """Plain aligned text, one line per row; a row's note goes on the line below it."""
    header = ("workload", "baseline", "rlmesh", "ratio", "target", "")
    lines = []
    for row in rows:
        cells = (
            row.workload,
            f"{row.baseline} {format_value(row.baseline_value, row.unit)}",
            f"{row.subject} {format_value(row.subject_value, row.unit)}",
            format_ratio(row.ratio, row.target) if row.ratio is not None else "n/a",
            f">= {row.target:g}x" if row.target is not None else "-",
            row.status,
        )
        lines.append((row.section, cells, row.note))
    widths = [max(len(cells[i]) for cells in [header] + [c for _, c, _ in lines]) for i in range(6)]

    def line(cells) -> str:
        return "  ".join(
            cell.ljust(width) if i in (0, 1, 2) else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    out, section = [line(header)], None
    for row_section, cells, note in lines:
        if row_section != section:
            out.append(f"\n[{row_section}]")
            section = row_section
        out.append(line(cells))
        if note:
            out.append(f"    {note}")
    return "\n".join(out)


def interleaved(sides: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds per call of each side, sampled A B A B ... after one warm-up call each."""
    for call in sides.values():
        call()
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, call in sides.items():
            start = time.perf_counter()
            call()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) for name, times in samples.items()}


def repeat(call: Callable[[], object], times: int) -> None:
    """Call ``times`` times, dropping each result at once (as a caller would, freeing it)."""
    for _ in range(times):
        call()


def per_call(sides: dict[str, Callable[[], object]], settings: Settings) -> dict[str, float]:
    """Like ``interleaved``, for calls too short to time alone: each sample is a batch of calls."""
    batches, sizes = {}, {}
    for name, call in sides.items():
        start = time.perf_counter()
        call()
        sizes[name] = max(1, int(settings.sample_s / max(time.perf_counter() - start, 1e-9)))
        batches[name] = lambda call=call, size=sizes[name]: repeat(call, size)
    medians = interleaved(batches, settings.repeats)
    return {name: medians[name] / sizes[name] for name in sides}


def core_rows(settings: Settings) -> list[Row]:
    """Rust vs Python core on each core piece's workload, both in this process."""
    rust, python = load_core("rust"), load_core("python")
    section = "core micro-benchmarks: Python core vs Rust core, time per call"
    rows = []

    def row(workload: str, sides: dict[str, Callable[[], object]], target: float) -> None:
        times = per_call(sides, settings)
        rows.append(
            Row(section, workload, "python", times["python"], "rust", times["rust"], "s", target)
        )

    for num_lanes in LANE_COUNTS:
        loops = {
            name: LedgerStepLoop(core, num_lanes)
            for name, core in (("python", python), ("rust", rust))
        }
        for loop in loops.values():  # the steady state: every lane has restarted once
            for _ in range(EPISODE_STEPS):
                loop.step()
        target = 10.0 if num_lanes >= 256 else 2.0 if num_lanes >= 16 else None
        workload = f"ledger step (runner round), N={num_lanes}"
        row(workload, {k: v.step for k, v in loops.items()}, target)

    stacks = {"python": FrameStackRound(python), "rust": FrameStackRound(rust)}
    floor = CopyFloor()
    times = per_call({**{k: v.round for k, v in stacks.items()}, "copy": floor.round}, settings)
    workload = "frame stack, 64 x 84x84x3 uint8, depth 4"
    rows.append(Row(section, workload, "python", times["python"], "rust", times["rust"], "s", 2.0))
    rows.append(
        Row(
            section,
            workload + " (vs np.copyto of its bytes)",
            "np.copyto",
            times["copy"],
            "rust",
            times["rust"],
            "s",
            0.5,
            note="ratio = the Rust core's throughput as a fraction of the copy floor's",
        )
    )

    layouts = {
        f"{name} {layout}": ImageRound(core, layout).round
        for name, core in (("python", python), ("rust", rust))
        for layout in ("hwc", "chw")
    }
    times = per_call(layouts, settings)
    rate = {name: IMAGE_LANES / seconds for name, seconds in times.items()}
    for layout, target in (("hwc", None), ("chw", 2.0)):
        python_time, rust_time = times[f"python {layout}"], times[f"rust {layout}"]
        note = ""
        if layout == "chw":
            note = (
                f"rust: chw {rate['rust chw']:,.0f} vs hwc {rate['rust hwc']:,.0f} lane-frames/s "
                f"(chw takes {rust_time / times['rust hwc']:.1f}x the hwc time); python: chw "
                f"{rate['python chw']:,.0f}, hwc {rate['python hwc']:,.0f}"
            )
        workload = f"Image {layout}, {IMAGE_LANES} x 210x160x3 uint8"
        rows.append(
            Row(section, workload, "python", python_time, "rust", rust_time, "s", target, note)
        )

    plan, model_output, lanes = actions_workload()
    appliers = {
        "python": python.ActionApplier(plan.action),
        "rust": rust.ActionApplier(plan.action),
    }
    row(
        "apply_actions, N=256 Box(7,)",
        {k: (lambda a=a: a.apply_actions(model_output, lanes)) for k, a in appliers.items()},
        5.0,
    )
    row(
        "chunk split + queue, N=256 H=8",
        {"python": ChunkRound(python).round, "rust": ChunkRound(rust).round},
        5.0,
    )
    row(
        "temporal ensemble step, N=16 H=50 A=14",
        {"python": EnsembleStep(python).step, "rust": EnsembleStep(rust).step},
        5.0,
    )
    return rows


def adapter_rows(settings: Settings) -> list[Row]:
    """Role-based conversions: the Rust core's resize against Pillow, and a LIBERO-like
    assembly on both cores."""
    rust, python = load_core("rust"), load_core("python")
    section = "role-based adapters: time per call"
    resizes = {
        "pillow": PillowResizeLoop().round,
        "rust": ResizeRound(rust).round,
        "python": ResizeRound(python).round,
    }
    times = per_call(resizes, settings)
    workload = f"resize {ADAPTER_LANES} x 256x256x3 -> 224x224 bilinear_aa"
    rows = [
        Row(
            section,
            workload,
            "Pillow loop",
            times["pillow"],
            "rust",
            times["rust"],
            "s",
            1.0,
            note="Pillow BILINEAR, one thread, lane by lane; python core "
            + format_time(times["python"]),
        )
    ]
    assemblies = {
        "python": LiberoAssemblyRound(python).round,
        "rust": LiberoAssemblyRound(rust).round,
    }
    times = per_call(assemblies, settings)
    workload = f"LIBERO-like assembly (resize + rot6d + concat + stack 2), {ADAPTER_LANES} lanes"
    rows.append(Row(section, workload, "python", times["python"], "rust", times["rust"], "s", 5.0))
    return rows


def end_to_end_rows(settings: Settings) -> tuple[list[Row], dict]:
    """``rlmesh.run`` (default core) vs a hand-written loop of the same policy and seeds.

    Also returns our 1-lane per-episode results and figures, for the peer comparison.
    """
    section = "end to end: hand-written loop vs rlmesh.run, lane-steps/s"
    seeds = settings.one_lane_seeds
    ours = run_one_lane(seeds=seeds)
    steps = ours.total_steps
    times = interleaved(
        {"loop": lambda: plain_loop(seeds), "run": lambda: run_one_lane(seeds=seeds)},
        settings.repeats,
    )
    one_lane = Row(
        section,
        f"CartPole, 1 lane, {len(seeds)} seeded episodes",
        "gymnasium loop",
        steps / times["loop"],
        "rlmesh.run",
        steps / times["run"],
        "steps/s",
        0.7,
    )

    assert run_one_lane_both_corners(seeds=seeds).total_steps == steps  # the same episodes
    times = interleaved(
        {
            "loop": lambda: plain_loop(seeds),
            "run": lambda: run_one_lane_both_corners(seeds=seeds),
        },
        settings.repeats,
    )
    both_corners = Row(
        section,
        f"CartPole, 1 lane, {len(seeds)} seeded episodes, model with predict and predict_batch",
        "gymnasium loop",
        steps / times["loop"],
        "rlmesh.run",
        steps / times["run"],
        "steps/s",
        0.8,
    )

    lane_steps = run_sixteen_lanes(episodes=settings.vector_episodes).total_steps
    times = interleaved(
        {
            "loop": lambda: sync_vector_loop(lane_steps),
            "run": lambda: run_sixteen_lanes(episodes=settings.vector_episodes),
        },
        settings.repeats,
    )
    sixteen = Row(
        section,
        f"CartPole, 16 lanes, {settings.vector_episodes} episodes, batched policy",
        "SyncVectorEnv loop",
        lane_steps / times["loop"],
        "rlmesh.run",
        lane_steps / times["run"],
        "steps/s",
        0.8,
    )

    lockstep_result, predicts = run_lockstep()
    lockstep_steps = lockstep_result.total_steps + lockstep_result.wasted_steps
    times = interleaved(
        {
            "loop": lambda: sync_vector_loop(lockstep_steps),
            "run": run_lockstep,
        },
        settings.repeats,
    )
    lockstep = Row(
        section,
        f"a user's SyncVectorEnv, 16 CartPole lanes, {lockstep_result.num_episodes} episodes",
        "SyncVectorEnv loop",
        lockstep_steps / times["loop"],
        "rlmesh.run",
        lockstep_steps / times["run"],
        "steps/s",
        note=(
            f"lockstep: {lockstep_result.wasted_steps} wasted lane-steps of "
            f"{lockstep_steps} ({lockstep_result.wasted_steps / lockstep_steps:.1%}), "
            f"{predicts:.1f} lane predicts per episode "
            f"({lockstep_result.total_steps / lockstep_result.num_episodes:.1f} scored steps "
            f"per episode)"
        ),
    )

    null_steps = run_null(episodes=settings.null_episodes).total_steps
    # The same at 2 episodes per lane, where one run's set-up weighs four times as much.
    short_episodes = 2 * NULL_LANES
    short_steps = run_null(episodes=short_episodes).total_steps
    times = interleaved(
        {
            "python": lambda: run_null("python", settings.null_episodes),
            "rust": lambda: run_null("rust", settings.null_episodes),
            "env": lambda: null_plain_loop(null_steps),
            "python short": lambda: run_null("python", short_episodes),
            "rust short": lambda: run_null("rust", short_episodes),
        },
        settings.repeats,
    )
    overhead = {k: (times[k] - times["env"]) / null_steps * 1e9 for k in ("python", "rust")}
    per_lane = settings.null_episodes // NULL_LANES
    short_ratio = times["python short"] / times["rust short"]
    null = Row(
        "end to end: Python core vs Rust core, lane-steps/s",
        f"null env + null model, N={NULL_LANES}, {per_lane} episodes per lane",
        "python",
        null_steps / times["python"],
        "rust",
        null_steps / times["rust"],
        "steps/s",
        5.0,
        note=(
            f"driver overhead per lane-step: rust {overhead['rust']:.0f} ns, python "
            f"{overhead['python']:.0f} ns (the null envs alone: "
            f"{times['env'] / null_steps * 1e9:.0f} ns); at 2 episodes per lane "
            f"({short_steps} lane-steps a run): rust {short_ratio:.2f}x python"
        ),
    )
    rows = [one_lane, both_corners, sixteen, lockstep, null]
    return rows, {"one_lane": ours, "rows": (one_lane, sixteen)}


def served_model_rows(settings: Settings) -> list[Row]:
    """8 one-lane drivers against one model server: batched across drivers, or not at all."""
    episodes = 3 if settings is QUICK else EPISODES_PER_DRIVER
    samples: dict[str, list[dict]] = {"unbatched": [], "batched": []}
    for _ in range(1 if settings is QUICK else 3):  # interleaved; each a fresh server process
        samples["unbatched"].append(measure_served_model(episodes, max_batch=1))
        samples["batched"].append(measure_served_model(episodes))

    def median(side: str, key: str) -> float:
        return statistics.median(sample[key] for sample in samples[side])

    def figures(side: str) -> str:
        return (
            f"{median(side, 'calls_per_lane_step'):.3f} model calls per lane-step, mean batch "
            f"{median(side, 'mean_batch'):.2f}, predict p50 {median(side, 'p50_ms'):.2f} ms / "
            f"p99 {median(side, 'p99_ms'):.2f} ms"
        )

    return [
        Row(
            "served model: one model server, 8 drivers of 1 CartPole lane, lane-steps/s",
            f"{DRIVERS} drivers x {episodes} episodes, cheap batched model (server in its own "
            f"process, drivers threads)",
            "max_batch=1",
            median("unbatched", "lane_steps_per_s"),
            "batched (max_wait_ms=2)",
            median("batched", "lane_steps_per_s"),
            "steps/s",
            note=f"batched: {figures('batched')}; max_batch=1: {figures('unbatched')}",
        )
    ]


def chunked_rows(settings: Settings) -> list[Row]:
    """A chunk policy on 16 CartPole lanes at H = 1, 4, 16; both cores, interleaved."""
    rows = []
    for horizon in (1, 4, 16):
        predicts = {}

        def side(core, horizon=horizon, predicts=predicts):
            result, predicts[core] = run_chunked(horizon, core, settings.vector_episodes)
            return result

        lane_steps = side("rust").total_steps
        times = interleaved(
            {core: (lambda core=core: side(core)) for core in ("python", "rust")},
            settings.repeats,
        )
        rows.append(
            Row(
                "chunked: Python core vs Rust core, lane-steps/s",
                f"chunk policy, H={horizon}, 16 CartPole lanes",
                "python",
                lane_steps / times["python"],
                "rust",
                lane_steps / times["rust"],
                "steps/s",
                note=f"{predicts['rust']:.1f} lane predicts per episode "
                f"({lane_steps / settings.vector_episodes:.1f} steps per episode)",
            )
        )
    return rows


def scored_fields(result: rlmesh.RunResult, *, lane: bool = True) -> list[tuple]:
    """Each episode's index, seed, steps, reward, terminated, truncated and (with ``lane``)
    the lane it ran on, which pipelined rounds leave to timing."""
    return [
        (e.index, e.seed, e.steps, e.reward, e.terminated, e.truncated)
        + ((e.env_index,) if lane else ())
        for e in result.episodes
    ]


def interleaved_values(sides: dict[str, Callable[[], float]], repeats: int) -> dict[str, float]:
    """The median of what each side returns (a rate it measured itself), sampled A B A B ..."""
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, call in sides.items():
            samples[name].append(call())
    return {name: statistics.median(values) for name, values in samples.items()}


def scale_out_rows(
    section: str,
    env_name: str,
    lanes: int,
    episodes: int,
    run_lanes: Callable[[int], Any],
    vector_loop: Callable[[], Any],
    repeats: int,
    start_s: float | None = None,
) -> list[Row]:
    """Two rows for one env: ``run_lanes(2)`` against ``run_lanes(1)``, and against a
    hand-written ``AsyncVectorEnv`` loop (``vector_loop()``), in scored lane-steps/s."""
    one, two = run_lanes(1), run_lanes(2)
    equal = "equal" if scored_fields(one) == scored_fields(two) else "DIFFER"
    step_ms = next(row.avg for row in one.telemetry if row.op == "env.step")
    workload = f"{env_name} ({step_ms:.2f} ms/step), {lanes} lanes, {episodes} episodes"
    loops: list = []

    def vector_rate() -> float:
        loops.append(vector_loop())
        return loops[-1].scored_steps / loops[-1].seconds

    rates = interleaved_values(
        {
            "workers=1": lambda: rate(run_lanes(1), "lane-steps"),
            "workers=2": lambda: rate(run_lanes(2), "lane-steps"),
            "vector": vector_rate,
        },
        repeats,
    )
    wasted = statistics.median(loop.wasted_steps for loop in loops)
    stepped = statistics.median(loop.lane_steps for loop in loops)
    started = (
        ""
        if start_s is None
        else f"; starting 2 workers with their envs (and closing them) takes {start_s:.2f} s, "
        "outside these rates"
    )
    return [
        Row(section, workload, "workers=1", rates["workers=1"], "workers=2", rates["workers=2"],
            "steps/s", 1.7,
            note=f"per-episode results of workers=1 and workers=2 {equal}{started}"),
        Row(section, workload + ", vs a hand-written AsyncVectorEnv loop",
            f"AsyncVectorEnv({lanes})", rates["vector"], "workers=2", rates["workers=2"],
            "steps/s", 1.0,
            note=f"scored lane-steps/s; the vector stepped {stepped:.0f} lane-steps of which "
            f"{wasted:.0f} ({wasted / stepped:.0%}) were surplus or autoreset steps, rlmesh "
            f"{two.wasted_steps}"),
    ]  # fmt: skip


def process_lanes_rows(settings: Settings) -> list[Row]:
    """Process lanes: a CPU-heavy env and MuJoCo's Hopper at workers=2 vs workers=1 and vs
    ``AsyncVectorEnv(8)`` in scored lane-steps/s, and what a round costs more than in-process
    on CartPole."""
    section = "process lanes (workers=W): scored lane-steps/s, time per round"
    rows = scale_out_rows(
        section,
        "CPU-heavy env",
        CPU_LANES,
        settings.cpu_episodes,
        lambda workers: run_cpu(workers, settings.cpu_episodes),
        lambda: async_vector_loop(settings.cpu_episodes),
        settings.repeats,
        start_s=statistics.median(worker_start_s() for _ in range(settings.repeats)),
    )
    bare = interleaved_values(
        {
            str(processes): lambda processes=processes: bare_pipes_rate(
                processes, settings.bare_rounds
            )
            for processes in (1, 2)
        },
        settings.repeats,
    )
    rows.append(
        Row(
            section,
            f"the same work over bare pipes: burn() alone (no env, no rlmesh), "
            f"{CPU_LANES} steps a round, {settings.bare_rounds} lockstep rounds",
            "this process",
            bare["1"],
            "2 processes",
            bare["2"],
            "steps/s",
            note="the CPU-heavy env's work split 4 and 4 over 2 processes asked and answered "
            "over bare pipes, waiting as workers do: what workers=2 gains in lockstep rounds "
            "on this machine with the driver's work, the env objects, uneven lanes and episode "
            "ends free",
        )
    )
    steps = settings.bare_rounds * CPU_LANES
    alone = interleaved_values(
        {
            str(processes): lambda processes=processes: independent_rate(processes, steps)
            for processes in (1, 2)
        },
        settings.repeats,
    )
    rows.append(
        Row(
            section,
            f"the machine's ceiling: burn() alone in independent processes (no rounds, no "
            f"pipes), {steps} steps",
            "this process",
            alone["1"],
            "2 processes",
            alone["2"],
            "steps/s",
            note="the same steps split 1:1 over 2 processes that never wait on each other, "
            "timed from one go to the last answer: what this machine's two vCPUs give two "
            "processes for the CPU-heavy env's work; workers=2 cannot beat it over workers=1",
        )
    )
    if HAS_MUJOCO:
        rows += scale_out_rows(
            section,
            f"MuJoCo {SIM_ID}",
            SIM_LANES,
            settings.sim_episodes,
            lambda workers: run_sim(workers, settings.sim_episodes),
            lambda: async_vector_loop(settings.sim_episodes, make_sim_env, sim_policy, SIM_LANES),
            settings.repeats,
        )
        sim_steps = 2 * settings.bare_rounds * SIM_LANES
        alone = interleaved_values(
            {
                str(processes): lambda processes=processes: independent_rate(
                    processes, sim_steps, sim_lanes
                )
                for processes in (1, 2)
            },
            settings.repeats,
        )
        rows.append(
            Row(
                section,
                f"the machine's ceiling for {SIM_ID}: its {SIM_LANES} lanes alone in "
                f"independent processes (no rounds, no pipes), {sim_steps} lane-steps",
                "this process",
                alone["1"],
                "2 processes",
                alone["2"],
                "steps/s",
                note="the envs and the policy alone, their lanes split 4 and 4 over 2 processes "
                "that never wait on each other, timed from one go to the last answer: what this "
                f"machine gives two processes for {SIM_ID}'s steps; workers=2 cannot beat it",
            )
        )
    else:
        sim = f"MuJoCo {SIM_ID}, {SIM_LANES} lanes, {settings.sim_episodes} episodes"
        why = "skipped: MuJoCo is not installed (pip install rlmesh[sim])"
        rows += [
            Row(section, sim, "workers=1", None, "workers=2", None, "steps/s", 1.7, why),
            Row(section, sim + ", vs a hand-written AsyncVectorEnv loop",
                f"AsyncVectorEnv({SIM_LANES})", None, "workers=2", None, "steps/s", 1.0, why),
            Row(section, f"the machine's ceiling for {SIM_ID}", "this process", None,
                "2 processes", None, "steps/s", None, why),
        ]  # fmt: skip
    cartpole = settings.process_cartpole_episodes
    rounds = interleaved_values(
        {
            str(workers): lambda workers=workers: rate(run_cartpole(workers, cartpole), "steps")
            for workers in (1, 2)
        },
        settings.repeats,
    )
    in_process_s, process_s = 1 / rounds["1"], 1 / rounds["2"]
    overhead_us = (process_s - in_process_s) * 1e6
    rows.append(
        Row(
            section,
            f"CartPole, {CARTPOLE_LANES} lanes, {cartpole} episodes, time per round",
            "workers=1",
            in_process_s,
            "workers=2",
            process_s,
            "s",
            note=f"process lanes add {overhead_us:.0f} us per round "
            f"({overhead_us / CARTPOLE_LANES:.1f} us per lane-step): with env steps much "
            f"shorter than that, keep workers=1",
        )
    )
    return rows


def pipeline_rows(settings: Settings) -> list[Row]:
    """Group pipelining on the CPU-heavy env with 2 workers: a model as slow as the env
    against plain rounds, and the fast policy against ``workers=1``."""
    section = "group pipelining (workers=2, pipeline=True): scored lane-steps/s"
    episodes = settings.cpu_episodes
    runs = {
        "plain": lambda: run_cpu(2, episodes, model=SlowModel()),
        "pipelined": lambda: run_cpu(2, episodes, pipeline=True, model=SlowModel()),
    }
    equal = (
        "equal"
        if scored_fields(runs["plain"](), lane=False)
        == scored_fields(runs["pipelined"](), lane=False)
        else "DIFFER"
    )
    slow = interleaved_values(
        {side: lambda run=run: rate(run(), "lane-steps") for side, run in runs.items()},
        settings.repeats,
    )
    fast = interleaved_values(
        {
            "workers=1": lambda: rate(run_cpu(1, episodes), "lane-steps"),
            "pipelined": lambda: rate(run_cpu(2, episodes, pipeline=True), "lane-steps"),
        },
        settings.repeats,
    )
    ms = MODEL_S_PER_LANE * 1e3
    workload = f"CPU-heavy env, {CPU_LANES} lanes, {episodes} episodes"
    return [
        Row(section, f"{workload}, a model as slow as the env ({ms:.0f} ms a lane)",
            "plain rounds", slow["plain"], "pipelined", slow["pipelined"], "steps/s",
            note=f"the model waits {ms:.0f} ms per lane of a call (an accelerator's or a "
            f"server's latency); per-episode results of plain and pipelined rounds {equal} "
            "(the lane each ran on aside)"),
        Row(section, f"{workload}, fast policy", "workers=1", fast["workers=1"],
            "workers=2 pipelined", fast["pipelined"], "steps/s", 1.7,
            note="the process-lanes row's comparison, with the driver's work for one worker "
            "overlapping the other's steps"),
    ]  # fmt: skip


def video_rows(settings: Settings) -> list[Row]:
    """Recording the first 5 of 50 pixel episodes (``record_video``): what the run costs more
    than without recording, against encoding the same frames alone; and the unrecorded
    episodes' time per step, with and without recording."""
    section = "videos (record_video): the run's extra time, against the encoding alone"
    results: dict[str, list[rlmesh.RunResult]] = {"plain": [], "recorded": []}
    frames = recorded_frames(run_pixel(None)[0])
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory)

        def timed(side: str) -> float:
            result, seconds = run_pixel(None if side == "plain" else out / "run")
            results[side].append(result)
            return seconds

        seconds = interleaved_values(
            {
                "plain": lambda: timed("plain"),
                "recorded": lambda: timed("recorded"),
                "encode": lambda: encode_only(frames, out),
            },
            settings.repeats,
        )
    plain, recorded = results["plain"][-1], results["recorded"][-1]
    equal = "equal" if scored_fields(plain) == scored_fields(recorded) else "DIFFER"
    extra_s = seconds["recorded"] - seconds["plain"]
    # Two runs' difference on a noisy machine can come out negative: it shows as a floor.
    floored = (
        f"; the recorded run took no longer than the plain one, so the extra shows as its "
        f"{format_time(EXTRA_FLOOR_S)} floor"
        if extra_s < EXTRA_FLOOR_S
        else ""
    )
    per_step = {
        side: statistics.median(unrecorded_s_per_step(result) for result in runs)
        for side, runs in results.items()
    }
    workload = (
        f"pixel env 120x160, {VIDEO_LANES} lanes, first {RECORDED_EPISODES} of "
        f"{VIDEO_EPISODES} episodes recorded"
    )
    frame_count = sum(len(episode) for episode in frames)
    return [
        Row(
            section,
            workload + ": recorded run - plain run",
            "encode only",
            seconds["encode"],
            "extra",
            max(extra_s, EXTRA_FLOOR_S),
            "s",
            1.0,
            note=f"plain run {format_time(seconds['plain'])}, recorded "
            f"{format_time(seconds['recorded'])}; encoding its {frame_count} frames alone "
            f"{format_time(seconds['encode'])}; per-episode results {equal}{floored}",
        ),
        Row(
            section,
            workload + ": the unrecorded episodes' time per step",
            "no recording",
            per_step["plain"],
            "recording",
            per_step["recorded"],
            "s",
            0.9,
            note="each unrecorded episode's wall time (reset to last step) over its steps, "
            "all of them together",
        ),
    ]


def summary_rows(settings: Settings) -> list[Row]:
    """``rlmesh report`` of a 1M-episode results file (read + summary) in a fresh process each
    time, against the issue's budget: seconds (median) and peak resident memory (largest)."""
    section = "the summary of a 1M-episode results file (rlmesh report), against its budget"
    path = results_file(REPORT_EPISODES)
    samples = [summary_in_subprocess(path) for _ in range(settings.summary_samples)]
    seconds = statistics.median(sample["seconds"] for sample in samples)
    cpu = statistics.median(sample["cpu_s"] for sample in samples)
    peak = max(sample["peak_mb"] for sample in samples)
    workload = f"read + summarize {REPORT_EPISODES:,} episodes ({path.stat().st_size / 1e6:.0f} MB)"
    return [
        Row(section, workload + ", wall time", "budget", SUMMARY_BUDGET_S, "rlmesh", seconds,
            "s", 1.0, note=f"CPU time {cpu:.2f} s (the wall time includes waiting for a core)"),
        Row(section, workload + ", peak memory", "budget", SUMMARY_BUDGET_MB, "rlmesh", peak,
            "MB", 1.0, note="peak resident set of the whole process, interpreter included"),
    ]  # fmt: skip


def report_html_rows(settings: Settings) -> list[Row]:
    """``write_html`` of a 10,000-episode, 10-task results file in a fresh process each time
    (imports included), against the issue's budget of a few seconds: the median."""
    section = "the HTML report of a 10,000-episode results file (rlmesh report --html)"
    path = html_suite_file()
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "report.html"
        samples = [html_in_subprocess(path, out) for _ in range(settings.summary_samples)]
        size = out.stat().st_size
    seconds = statistics.median(sample["seconds"] for sample in samples)
    cpu = statistics.median(sample["cpu_s"] for sample in samples)
    workload = f"{HTML_EPISODES:,} episodes of {HTML_TASKS} tasks, to {size / 1e3:.0f} kB of HTML"
    note = (
        f"CPU time {cpu:.2f} s; a fresh process: the imports of rlmesh, numpy and matplotlib "
        "included (the wall time includes waiting for a core)"
    )
    return [Row(section, workload, "budget", HTML_BUDGET_S, "rlmesh", seconds, "s", 1.0,
                note=note)]  # fmt: skip


def suite_summary_rows(settings: Settings) -> list[Row]:
    """``rlmesh report`` of a 1M-episode suite file (per task, then the stratified overall)
    beside the plain 1M-episode file's, in fresh processes, interleaved: CPU seconds
    (median), so the two compare on a busy machine."""
    section = "the summary of a 1M-episode suite file (rlmesh report), beside a plain file's"
    suite, plain = suite_file(REPORT_EPISODES), results_file(REPORT_EPISODES)
    pairs = [
        (suite_summary_in_subprocess(suite), summary_in_subprocess(plain))
        for _ in range(settings.summary_samples)
    ]
    suite_cpu = statistics.median(pair[0]["cpu_s"] for pair in pairs)
    plain_cpu = statistics.median(pair[1]["cpu_s"] for pair in pairs)
    peak = max(pair[0]["peak_mb"] for pair in pairs)
    workload = f"read + summarize {REPORT_EPISODES:,} episodes in {SUITE_TASKS} tasks, CPU time"
    return [
        Row(section, workload, "plain file", plain_cpu, "suite file", suite_cpu, "s", 0.8,
            note=f"the suite file's peak memory {peak:.0f} MB (budget {SUMMARY_BUDGET_MB:.0f})"),
    ]  # fmt: skip


def cluster_rows(settings: Settings) -> list[Row]:
    """The CPU-heavy env's episodes on one process, then on a local Ray cluster of
    ``CLUSTER_WORKERS`` workers started inside the timed run (one run a side: a sample lasts
    minutes), with the start-up, the per-window costs and the extrapolation to more workers."""
    section = f"scale-out: one process vs cluster='ray', workers={CLUSTER_WORKERS}, lane-steps/s"
    episodes = settings.cluster_episodes
    try:
        import ray  # noqa: F401 - only whether it imports
    except ImportError:
        note = 'skipped: Ray is not installed (pip install "rlmesh[ray]")'
        return [Row(section, "CPU-heavy env", "one process", None, "cluster", None, "steps/s",
                    note=note)]  # fmt: skip
    started = time.perf_counter()
    single = run_single(episodes)
    single_s = time.perf_counter() - started
    started = time.perf_counter()
    clustered = run_cluster(episodes)
    cluster_s = time.perf_counter() - started
    report = clustered.cluster
    steps = single.total_steps
    step_ms = math.fsum(e.duration_s for e in single.episodes) / steps * 1e3
    equal = "equal" if per_episode(clustered) == per_episode(single) else "DIFFER"
    workload = f"CPU-heavy env ({step_ms:.2f} ms a step), {episodes} episodes"
    model = extrapolation(single, clustered, cluster_s)
    return [
        Row(section, workload + ", Ray start-up included", "one process", steps / single_s,
            "cluster", steps / cluster_s, "steps/s", 1.6,
            note=f"Ray start-up {report.startup_s:.1f} s of the cluster's {cluster_s:.1f} s "
            f"(one process: {single_s:.1f} s); per-episode results {equal} the one-process "
            f"run's"),
        Row(section, workload + ", Ray start-up excluded", "one process", steps / single_s,
            "cluster", steps / (cluster_s - report.startup_s), "steps/s",
            note=f"{len(report.windows)} windows; per window: coordinator "
            f"{report.coordinator_s_per_window * 1e3:.2f} ms, Ray dispatch "
            f"{report.dispatch_s_per_window * 1e3:.0f} ms, set-up in the task "
            f"{model['setup_s'] * 1e3:.0f} ms; {model['text']}"),
        actor_mode_row(settings),
    ]  # fmt: skip


def actor_mode_row(settings: Settings) -> Row:
    """A model whose ``load`` takes ``LOAD_S``, on short windows: each window's Ray task loads
    it (``ray_mode="tasks"``) against each of the actors loading it once
    (``ray_mode="actors"``), one run a side on one local Ray instance started before both."""
    import ray

    windows = settings.loading_windows
    episodes = windows * LOADING_WINDOW_EPISODES
    ray.init(num_cpus=CLUSTER_WORKERS, include_dashboard=False, logging_level="WARNING")
    try:
        timed = {}
        for mode in ("tasks", "actors"):
            started = time.perf_counter()
            timed[mode] = (run_slow_to_load(mode, windows), time.perf_counter() - started)
    finally:
        ray.shutdown()
    (tasks, tasks_s), (actors, actors_s) = timed["tasks"], timed["actors"]
    equal = "equal" if per_episode(actors) == per_episode(tasks) else "DIFFER"
    return Row(
        f"scale-out: a model slow to load, cluster='ray', workers={CLUSTER_WORKERS}, "
        "ray_mode tasks vs actors",
        f"load() of {LOAD_S} s, {episodes} CPU-heavy episodes in {windows} windows of "
        f"{LOADING_WINDOW_EPISODES}",
        "tasks", tasks.total_steps / tasks_s, "actors", actors.total_steps / actors_s,
        "steps/s",
        note=f"tasks {tasks_s:.1f} s (the model loaded {windows} times), actors "
        f"{actors_s:.1f} s (loaded {len(actors.cluster.per_worker)} times); per-episode "
        f"results {equal}",
    )  # fmt: skip


def extrapolation(single: rlmesh.RunResult, clustered: Any, cluster_s: float) -> dict:
    """The speed-up ``workers`` would give, from the measured per-window costs.

    Model: M episodes of mean work ``w`` (their own wall time), dealt to W workers as the
    ``n`` windows ``window_sizes`` cuts, take ``(M w + n (f + d)) / W`` on the workers, where
    ``f`` is a window's set-up inside its task (its ``task_s`` less its episodes' time) and
    ``d`` Ray's dispatch. The coordinator's own time ``c`` a window is serial, so it bounds the
    rate at ``1 / c`` windows a second however many workers there are. Ray's start-up is left
    out: a cluster that serves many runs starts once.
    """
    report = clustered.cluster
    episodes = single.num_episodes
    work = math.fsum(e.duration_s for e in single.episodes) / episodes
    done = [window for window in report.windows if not window.lost]
    in_tasks = math.fsum(window.task_s for window in done)
    setup = max(in_tasks - math.fsum(e.duration_s for e in clustered.episodes), 0.0) / len(done)
    dispatch, coordinator = report.dispatch_s_per_window, report.coordinator_s_per_window
    one_process = episodes * work
    predicted = []
    for workers in (2, 8, 32, 128):
        windows = len(window_sizes(episodes, workers, None))
        parallel = (episodes * work + windows * (setup + dispatch)) / workers
        predicted.append(f"{workers}: {one_process / max(parallel, windows * coordinator):.1f}x")
    text = (
        f"extrapolated speed-up of {episodes} such episodes on W workers (start-up excluded; "
        f"(M w + n (f + d)) / W): {', '.join(predicted)}; the coordinator caps it at "
        f"{1 / coordinator:,.0f} windows/s"
        if coordinator > 0
        else "no coordinator time"
    )
    return {"setup_s": setup, "text": text}


def peer_python() -> Path:
    """The peer venv's Python: ``<tmp>/rlmesh-peer-0.1.0``, created and installed on first use.

    numpy and gymnasium are pinned to the versions this process runs, so both packages step
    the same env code. A marker file says the install finished; without it, it is redone.
    """
    import gymnasium

    venv = Path(tempfile.gettempdir()) / f"rlmesh-peer-{PEER_VERSION}"
    python = venv / "bin" / "python"
    marker = venv / "installed"
    if not marker.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
        requirements = [
            f"rlmesh=={PEER_VERSION}",
            f"numpy=={np.__version__}",
            f"gymnasium=={gymnasium.__version__}",
        ]
        install = [str(python), "-m", "pip", "install", "--quiet", *requirements]
        subprocess.run(install, check=True, capture_output=True, text=True)
        marker.write_text(" ".join(requirements) + "\n")
    return python


def peer_rows(settings: Settings, ours: dict) -> list[Row]:
    """The published package on the same CartPole workloads, beside our run and the raw loop."""
    section = f"the alternative: rlmesh {PEER_VERSION} (PyPI) vs rlmesh.run, lane-steps/s"
    one_lane, sixteen = ours["rows"]
    workloads = (one_lane.workload, sixteen.workload)
    try:
        command = [
            str(peer_python()),
            str(HERE / "peer.py"),
            f"--repeats={settings.repeats}",
            f"--one-lane-episodes={len(settings.one_lane_seeds)}",
            f"--vector-episodes={settings.vector_episodes}",
        ]
        done = subprocess.run(command, check=True, capture_output=True, text=True, cwd=HERE)
        peer = json.loads(done.stdout)
    except (OSError, subprocess.CalledProcessError, json.JSONDecodeError) as error:
        stderr = getattr(error, "stderr", "") or ""
        why = (stderr.strip().splitlines() or [str(error)])[-1]
        note = f"skipped: rlmesh=={PEER_VERSION} could not be installed or run: {why}"
        return [
            Row(
                section, w, f"rlmesh {PEER_VERSION}", None, "rlmesh.run", None, "steps/s", note=note
            )
            for w in workloads
        ]

    mine = [
        [e.index, e.seed, e.steps, float(e.reward), bool(e.terminated), bool(e.truncated)]
        for e in ours["one_lane"].episodes
    ]
    equal = "equal ours" if peer["one_lane"]["episodes"] == mine else "DIFFER from ours"
    return [
        Row(
            section,
            one_lane.workload,
            f"rlmesh {PEER_VERSION}",
            peer["one_lane"]["steps_per_s"],
            "rlmesh.run",
            one_lane.subject_value,
            "steps/s",
            note=f"gymnasium loop {format_value(one_lane.baseline_value, 'steps/s')}; "
            f"{PEER_VERSION}'s per-episode results (index, seed, steps, reward, terminated, "
            f"truncated) {equal}",
        ),
        Row(
            section,
            sixteen.workload,
            f"rlmesh {PEER_VERSION}",
            peer["sixteen_lanes"]["steps_per_s"],
            "rlmesh.run",
            sixteen.subject_value,
            "steps/s",
            note=f"SyncVectorEnv loop {format_value(sixteen.baseline_value, 'steps/s')}; "
            f"episodes not comparable: {PEER_VERSION} refuses per-episode seeds on a "
            "SyncVectorEnv (it needs NEXT_STEP autoreset, where the env seeds its episodes)",
        ),
    ]


def remote_rows(settings: Settings, with_peer: bool) -> list[Row]:
    """A served CartPole (``rlmesh serve env``, its own process) driven by ``rlmesh.run``,
    beside the same run in-process and, with ``--peer``, beside rlmesh 0.1.0's ``EnvServer``
    driven by 0.1.0's own run (both in its venv)."""
    section = "served env over loopback (rlmesh-wire-v1), lane-steps/s"
    seeds = ONE_LANE_SEEDS[: 2 if settings is QUICK else None]
    episodes = REMOTE_EPISODES // 2 if settings is QUICK else REMOTE_EPISODES
    workloads = {
        1: (
            f"CartPole, 1 lane, {len(seeds)} seeded episodes, served",
            lambda address: run_remote_one_lane(address, seeds),
            lambda: run_local_one_lane(seeds),
        ),
        REMOTE_LANES: (
            f"CartPole, {REMOTE_LANES} lanes, {episodes} episodes, served",
            lambda address: run_remote_lanes(address, episodes),
            lambda: run_local_lanes(episodes),
        ),
    }
    rows = []
    for width, (workload, remote, local) in workloads.items():
        with our_server(width) as address:
            result = remote(address)
            steps, rounds = result.total_steps, rounds_of(result)
            times = interleaved(
                {"remote": lambda remote=remote: remote(address), "local": local},
                settings.repeats,
            )
        overhead_us = (times["remote"] - times["local"]) / rounds * 1e6
        floor_us = grpc_round_trip_us()  # right after, so it sees the same machine load
        rows.append(
            Row(
                section,
                workload,
                "rlmesh.run in-process",
                steps / times["local"],
                "served",
                steps / times["remote"],
                "steps/s",
                0.4 if width > 1 else None,
                note=f"wire overhead per round: {overhead_us:,.0f} us ({rounds} rounds, one "
                f"StepRequest each); a bare grpcio bidi round trip: {floor_us:,.0f} us",
            )
        )
        if with_peer:
            rows.append(_peer_remote_row(section, workload, width, steps / times["remote"],
                                         settings, len(seeds), episodes))  # fmt: skip
    rows.append(served_workers_row(section, settings))
    rows.append(transport_row(section, settings))
    return rows


def served_workers_row(section: str, settings: Settings) -> Row:
    """The CPU-heavy env served on ``CPU_LANES`` lanes by a server that steps them in 2 worker
    processes (``rlmesh serve env ... --workers 2``) against one that steps them in its own
    process."""
    episodes = settings.cpu_episodes
    results: dict[str, rlmesh.RunResult] = {}  # each side's last run

    def side(name: str, address: str) -> Callable[[], None]:
        def run() -> None:
            results[name] = run_remote_cpu(address, episodes)

        return run

    with cpu_server(1) as alone, cpu_server(2) as parallel:
        times = interleaved(
            {"alone": side("alone", alone), "workers": side("workers", parallel)}, settings.repeats
        )
    same = scored_fields(results["alone"]) == scored_fields(results["workers"])
    steps = results["alone"].total_steps
    return Row(
        section,
        f"CPU-heavy env, {CPU_LANES} lanes, {episodes} episodes, served: the server's lanes in "
        f"2 worker processes",
        "server workers=1",
        steps / times["alone"],
        "server --workers 2",
        steps / times["workers"],
        "steps/s",
        note=f"per-episode results of the two servers {'equal' if same else 'DIFFER'}; the "
        f"driver, the server and its workers share the machine's vCPUs",
    )


def transport_row(section: str, settings: Settings) -> Row:
    """The cores' own transport (``WireChannel`` / ``WireServer``): a bidi echo of 64 bytes,
    the server in its own process, grpcio (Python core) vs tonic (Rust core)."""
    count = ROUND_TRIPS // 4 if settings is QUICK else ROUND_TRIPS
    seconds = interleaved_values(
        {name: lambda name=name: round_trip_us(name, count) * 1e-6 for name in ("python", "rust")},
        settings.repeats,
    )
    return Row(
        section,
        "bare bidi echo round trip, 64 bytes, the cores' transport",
        "python",
        seconds["python"],
        "rust",
        seconds["rust"],
        "s",
        note=f"{count} round trips a sample, client and server each on that core's transport",
    )


def _peer_remote_row(
    section: str, workload: str, width: int, ours: float, settings: Settings, seeds: int,
    episodes: int,
) -> Row:  # fmt: skip
    """rlmesh 0.1.0's EnvServer (its own process) driven by 0.1.0's own run."""
    script = str(HERE / "test_bench_remote_env.py")
    clean = {"PYTHONPATH": ""}  # 0.1.0's package, not this checkout's
    try:
        python = str(peer_python())
        with served([python, script, "serve", f"--width={width}"], env=clean) as address:
            command = [python, script, "drive", f"--address={address}", f"--width={width}",
                       f"--repeats={settings.repeats}", f"--seeds={seeds}",
                       f"--episodes={episodes}"]  # fmt: skip
            done = subprocess.run(
                command, check=True, capture_output=True, text=True, cwd=HERE,
                env={**os.environ, **clean},
            )  # fmt: skip
        peer = json.loads(done.stdout.strip().splitlines()[-1])["steps_per_s"]
        note = f"0.1.0's EnvServer{'' if width == 1 else f' of a {width}-lane SyncVectorEnv'}"
    except (OSError, RuntimeError, subprocess.CalledProcessError, json.JSONDecodeError) as error:
        stderr = getattr(error, "stderr", "") or ""
        peer, note = None, f"skipped: {(stderr.strip().splitlines() or [str(error)])[-1]}"
    return Row(section, workload, f"rlmesh {PEER_VERSION}", peer, "served", ours, "steps/s",
               3.0, note)  # fmt: skip


def machine() -> dict:
    """The facts BENCHMARKS.md records next to the table."""
    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor(),
        )
        if Path("/proc/cpuinfo").exists()
        else platform.processor()
    )
    try:
        rustc = subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout
    except OSError:
        rustc = "n/a"
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "rustc": rustc.strip() or "n/a",
        "rlmesh_core": rlmesh.core_name(),
    }


def _end_to_end_and_peer(settings: Settings, peer: bool) -> list[Row]:
    driver, ours = end_to_end_rows(settings)
    return driver + (peer_rows(settings, ours) if peer else [])


# The table's sections in its order; each gives its rows (``peer``: with rlmesh 0.1.0's rows).
SECTIONS: dict[str, Callable[[Settings, bool], list[Row]]] = {
    "core": lambda settings, peer: core_rows(settings),
    "adapters": lambda settings, peer: adapter_rows(settings),
    "driver": _end_to_end_and_peer,
    "chunked": lambda settings, peer: chunked_rows(settings),
    "process": lambda settings, peer: process_lanes_rows(settings),
    "pipeline": lambda settings, peer: pipeline_rows(settings),
    "summary": lambda settings, peer: summary_rows(settings),
    "suite-summary": lambda settings, peer: suite_summary_rows(settings),
    "report-html": lambda settings, peer: report_html_rows(settings),
    "video": lambda settings, peer: video_rows(settings),
    "cluster": lambda settings, peer: cluster_rows(settings),
    "remote": remote_rows,
    "served-model": lambda settings, peer: served_model_rows(settings),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, shorter runs")
    parser.add_argument("--peer", action="store_true", help=f"also run rlmesh=={PEER_VERSION}")
    parser.add_argument("--json", metavar="PATH", help="write every row (and the machine) here")
    parser.add_argument(
        "--only",
        metavar="SECTION[,SECTION]",
        help=f"run these sections alone (of {', '.join(SECTIONS)}); default: all",
    )
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    only = SECTIONS if args.only is None else args.only.split(",")
    unknown = [name for name in only if name not in SECTIONS]
    if unknown:
        parser.error(
            f"--only: unknown section(s) {', '.join(unknown)}; expected {', '.join(SECTIONS)}"
        )

    speeds = {"before": host.probe(settings.host_probe_s)}
    started = time.perf_counter()
    rows: list[Row] = []
    for name in only:
        rows += SECTIONS[name](settings, args.peer)
    elapsed = time.perf_counter() - started
    speeds["after"] = host.probe(settings.host_probe_s)

    facts = machine()
    print(" ".join(f"{k}={v}" for k, v in facts.items()))
    print(
        f"settings: {'--quick' if args.quick else 'full'}, {settings.repeats} interleaved "
        f"repeats per side, medians; ran in {elapsed:.0f} s"
    )
    print(
        f"host speed (benches/host.py: {host.LOOP:,} additions timed in "
        f"{host.WINDOW_S * 1000:.0f} ms windows for {settings.host_probe_s:g} s, every CPU at "
        f"once; slow: over {host.SLOW}x the fastest window):"
    )
    for when, speed in speeds.items():
        print(f"  {when} the sections: {host.describe(speed)}")
    print(format_table(rows))
    missed = [row.workload for row in rows if row.status == "MISSED"]
    print(
        f"\n{len(missed)} row(s) miss their target" + (": " + "; ".join(missed) if missed else "")
    )
    if args.json:
        report = {
            "machine": facts,
            "host_speed": speeds,
            "settings": asdict(settings),
            "elapsed_s": elapsed,
            "rows": [row.as_dict() for row in rows],
        }
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
