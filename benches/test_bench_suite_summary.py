"""The summary of a suite's results file, as ``rlmesh report FILE`` computes it: read per task
(``read_suite_columns``), then ``summarize_suite``.

The file is what ``run_suite`` writes for ``TASKS`` tasks sharing the episodes equally: a
header listing the tasks, then per task its header line, its episode lines (each naming its
task) and a run segment. ``report.py`` times it on 1M episodes in a fresh process beside the
plain 1M-episode file of ``test_bench_summary``; the suite here runs it on a smaller file.

Run: ``pytest benches/test_bench_suite_summary.py --benchmark-enable``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rlmesh.results import (
    FORMAT_VERSION,
    HEADER_KEY,
    RUN_KEY,
    SUITE_KEY,
    TASK_KEY,
    EpisodeResult,
    dumps,
)
from rlmesh.stats import summarize_suite
from rlmesh.suites import Task
from test_bench_summary import episode_lines

TASKS = 10
SUITE_EPISODES = 20_000
RULE = {"kind": "env spec", "reward_threshold": 475.0, "name": None}


def write_suite_file(path: str | os.PathLike[str], episodes: int, tasks: int = TASKS) -> None:
    """A suite's results file of ``episodes`` episodes over ``tasks`` tasks, as a run of the
    suite writes it."""
    per_task = episodes // tasks
    suite = [Task(f"task-{t:02d}", "CartPole-v1", episodes=per_task, seed=t) for t in range(tasks)]
    with open(path, "w", encoding="utf-8") as out:
        header = {HEADER_KEY: FORMAT_VERSION, SUITE_KEY: [task.to_dict() for task in suite]}
        out.write(dumps({**header, "core": "rust"}) + "\n")
        for t, task in enumerate(suite):
            out.write(dumps({TASK_KEY: FORMAT_VERSION, "task": task.name, "env": task.env,
                             "episodes": per_task, "seed": t, "core": "rust",
                             "success_rule": RULE}) + "\n")  # fmt: skip
            tagged = f', "task": "{task.name}"}}\n'
            out.writelines(line[:-2] + tagged for line in episode_lines(per_task, seed=t))
            segment = {RUN_KEY: FORMAT_VERSION, "task": task.name, "wasted_steps": 0,
                       "elapsed_s": 6.0, "telemetry": []}  # fmt: skip
            out.write(dumps(segment) + "\n")


def suite_file(episodes: int) -> Path:
    """The bench suite file of ``episodes`` episodes in the temp directory, written once."""
    name = f"rlmesh-bench-suite-{episodes}-{TASKS}-v{FORMAT_VERSION}.jsonl"
    path = Path(tempfile.gettempdir()) / name
    if not path.exists():
        partial = path.with_suffix(".partial")
        write_suite_file(partial, episodes)
        partial.replace(path)
    return path


def summarize_suite_file(path: str | os.PathLike[str]) -> dict:
    """What ``rlmesh report FILE --json`` computes of a suite's file."""
    from rlmesh.results import read_suite_columns

    return summarize_suite(read_suite_columns(path)[1])


_CHILD = """
import json, resource, sys, time
from rlmesh.results import read_suite_columns
from rlmesh.stats import summarize_suite
start = time.perf_counter()
usage = resource.getrusage(resource.RUSAGE_SELF)
cpu_start = usage.ru_utime + usage.ru_stime
summary = summarize_suite(read_suite_columns(sys.argv[1])[1])
seconds = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_SELF)
cpu_s = usage.ru_utime + usage.ru_stime - cpu_start
try:
    status = open("/proc/self/status").read().split("VmHWM:")[1]
    peak_mb = int(status.split()[0]) / 1024
except (OSError, IndexError):
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"seconds": seconds, "cpu_s": cpu_s, "peak_mb": peak_mb,
                  "episodes": summary["overall"]["episodes"]}))
"""


def suite_summary_in_subprocess(path: str | os.PathLike[str]) -> dict:
    """Wall and CPU seconds and peak resident MB of one summary of the suite file ``path``
    in a fresh Python process."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, os.fspath(path)], check=True, capture_output=True, text=True
    )
    return json.loads(done.stdout)


def test_the_bench_lines_are_what_a_suite_run_writes(tmp_path):
    path = tmp_path / "suite.jsonl"
    write_suite_file(path, 40, tasks=2)
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if "index" in record:
            assert dumps(EpisodeResult(**record).to_dict()) == line


def test_summary_of_a_suite_file(benchmark):
    path = suite_file(SUITE_EPISODES)
    benchmark.group = f"summary of a {SUITE_EPISODES}-episode suite file ({TASKS} tasks)"
    summary = benchmark(summarize_suite_file, path)
    assert summary["overall"]["episodes"] == SUITE_EPISODES and summary["overall"]["complete"]
    assert [row["episodes"] for row in summary["tasks"]] == [SUITE_EPISODES // TASKS] * TASKS
