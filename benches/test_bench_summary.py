"""The summary of a results file, as ``rlmesh report FILE`` computes it: read, then summarize.

The file is what a run of ``episodes`` episodes writes (a header, one line per episode, a run
segment), with continuous rewards (every value distinct, the bootstrap's hardest case) and a
success rule. ``report.py`` times this workload on 1M episodes in a fresh process and reads its
peak memory (``summary_in_subprocess``); the suite here runs it on a smaller file.

Run: ``pytest benches/test_bench_summary.py --benchmark-enable``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from rlmesh.results import FORMAT_VERSION, HEADER_KEY, RUN_KEY, EpisodeResult, dumps, read_columns
from rlmesh.stats import summarize

SUITE_EPISODES = 20_000
REPORT_EPISODES = 1_000_000


# One episode line exactly as ``dumps(EpisodeResult.to_dict())`` writes it (the suite checks
# that), filled by str.format: 1M lines take seconds rather than a minute.
_LINE = (
    '{{"index": {0}, "seed": {1}, "trial": {0}, "env_index": {2}, "steps": {3}, '
    '"reward": {4!r}, "terminated": {5}, "truncated": {6}, "success": {7}, '
    '"duration_s": {8!r}, "predict_ms": 0.0123, "step_ms": 0.0456, "success_reported": {9}}}\n'
)


def _json_bool(flag: bool) -> str:
    return "true" if flag else "false"


def episode_lines(episodes: int, seed: int = 0) -> list[str]:
    """The episode lines of the bench file: continuous rewards, half the successes reported."""
    rng = np.random.default_rng(seed)
    steps = rng.integers(10, 500, episodes).tolist()
    rewards = (np.asarray(steps) + rng.normal(0.0, 5.0, episodes)).tolist()
    reported = (rng.random(episodes) < 0.5).tolist()
    lines = []
    for k in range(episodes):
        reward = rewards[k]
        success = (k % 3 == 0) if reported[k] else reward >= 475
        lines.append(
            _LINE.format(k, k * 7919 % 2**31, k % 16, steps[k], reward,
                         _json_bool(reward < 475), _json_bool(reward >= 475),
                         _json_bool(success), 0.001 * steps[k], _json_bool(reported[k]))
        )  # fmt: skip
    return lines


def write_results_file(path: str | os.PathLike[str], episodes: int, seed: int = 0) -> None:
    """A results file of ``episodes`` episodes, as a run writes it (header, lines, segment)."""
    header = {
        HEADER_KEY: FORMAT_VERSION,
        "env": "CartPole-v1",
        "episodes": episodes,
        "seed": seed,
        "core": "rust",
        "success_rule": {"kind": "env spec", "reward_threshold": 475.0, "name": None},
    }
    segment = {RUN_KEY: FORMAT_VERSION, "wasted_steps": 0, "elapsed_s": 60.0, "telemetry": []}
    with open(path, "w", encoding="utf-8") as out:
        out.write(dumps(header) + "\n")
        out.writelines(episode_lines(episodes, seed))
        out.write(dumps(segment) + "\n")


def results_file(episodes: int) -> Path:
    """The bench file of ``episodes`` episodes in the temp directory, written on first use."""
    path = Path(tempfile.gettempdir()) / f"rlmesh-bench-results-{episodes}-v{FORMAT_VERSION}.jsonl"
    if not path.exists():
        partial = path.with_suffix(".partial")
        write_results_file(partial, episodes)
        partial.replace(path)
    return path


def summarize_file(path: str | os.PathLike[str]) -> dict:
    """What ``rlmesh report FILE --json`` computes."""
    return summarize(read_columns(path)[1])


_CHILD = """
import json, resource, sys, time
from rlmesh.results import read_columns
from rlmesh.stats import summarize
start = time.perf_counter()
usage = resource.getrusage(resource.RUSAGE_SELF)
cpu_start = usage.ru_utime + usage.ru_stime
summary = summarize(read_columns(sys.argv[1])[1])
seconds = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_SELF)
cpu_s = usage.ru_utime + usage.ru_stime - cpu_start
# ru_maxrss survives execve on Linux (it would hold the parent's peak); VmHWM starts afresh.
try:
    status = open("/proc/self/status").read().split("VmHWM:")[1]
    peak_mb = int(status.split()[0]) / 1024
except (OSError, IndexError):
    peak_mb = usage.ru_maxrss / 1024
print(json.dumps({"seconds": seconds, "cpu_s": cpu_s, "peak_mb": peak_mb,
                  "episodes": summary["episodes"]}))
"""


def summary_in_subprocess(path: str | os.PathLike[str]) -> dict:
    """Wall and CPU seconds and peak resident MB of one summary of ``path`` in a fresh Python
    process (its peak includes the interpreter and numpy, as ``rlmesh report``'s does)."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, os.fspath(path)], check=True, capture_output=True, text=True
    )
    return json.loads(done.stdout)


def test_the_bench_lines_are_what_a_run_writes():
    for line in episode_lines(50):
        record = json.loads(line)
        assert dumps(EpisodeResult(**record).to_dict()) + "\n" == line


def test_summary_of_a_results_file(benchmark):
    path = results_file(SUITE_EPISODES)
    benchmark.group = f"summary of a {SUITE_EPISODES}-episode results file"
    summary = benchmark(summarize_file, path)
    assert summary["episodes"] == SUITE_EPISODES and summary["complete"] is True
    assert summary["mean_reward_ci95"][0] < summary["mean_reward"] < summary["mean_reward_ci95"][1]
