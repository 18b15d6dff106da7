"""The HTML report of a 10,000-episode suite file, as ``rlmesh report FILE --html OUT`` writes it.

The file is a real short run's header and run segment (its telemetry, provenance and success
rule) around ``HTML_EPISODES`` episode lines of ``HTML_TASKS`` tasks, with continuous rewards
and lengths (histograms of distinct values, and a bootstrap interval per task of 1,000 values).
``report.py`` times ``write_html`` in a fresh process (``html_in_subprocess``: the imports of
rlmesh, numpy and matplotlib included) against the issue's budget of a few seconds; the suite
here times it in this process.

Run: ``pytest benches/test_bench_report_html.py --benchmark-enable``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import rlmesh
from rlmesh.report import write_html
from rlmesh.results import FORMAT_VERSION, dumps

HTML_EPISODES = 10_000
HTML_TASKS = 10
HTML_BUDGET_S = 3.0  # issue 15: "under a few seconds"


def _cartpole(obs):
    return int(obs[2] + 0.3 * obs[3] > 0)


def write_suite_file(path: str | os.PathLike[str], episodes: int, tasks: int) -> None:
    """A results file of ``episodes`` episodes over ``tasks`` tasks (indices per task), framed
    by a real run's header and run segment."""
    with tempfile.TemporaryDirectory() as folder:
        real = Path(folder) / "real.jsonl"
        rlmesh.run(_cartpole, "CartPole-v1", episodes=4, num_envs=2, results_path=real)
        header, *rest = [json.loads(line) for line in real.read_text().splitlines()]
    segments = [record for record in rest if "rlmesh_run" in record]
    header["episodes"] = episodes
    rng = np.random.default_rng(0)
    steps = rng.integers(10, 500, episodes)
    rewards = steps + rng.normal(0.0, 5.0, episodes)
    with open(path, "w", encoding="utf-8") as out:
        out.write(dumps(header) + "\n")
        for k in range(episodes):
            task, index = k // (episodes // tasks), k  # indices unique across the suite
            reward = float(rewards[k])
            record = {
                "index": index, "seed": k * 7919 % 2**31, "trial": index, "env_index": k % 16,
                "steps": int(steps[k]), "reward": reward, "terminated": reward < 475,
                "truncated": reward >= 475, "success": reward >= 475, "duration_s": 0.001,
                "predict_ms": 0.0123, "step_ms": 0.0456, "success_reported": False,
                "task": f"task-{task:02d}",
            }  # fmt: skip
            out.write(dumps(record) + "\n")
        for segment in segments:
            out.write(dumps(segment) + "\n")


def suite_file(episodes: int = HTML_EPISODES, tasks: int = HTML_TASKS) -> Path:
    """The bench file in the temp directory, written on first use."""
    name = f"rlmesh-bench-report-html-{episodes}x{tasks}-v{FORMAT_VERSION}.jsonl"
    path = Path(tempfile.gettempdir()) / name
    if not path.exists():
        partial = path.with_suffix(".partial")
        write_suite_file(partial, episodes, tasks)
        partial.replace(path)
    return path


_CHILD = """
import json, sys, time
start, cpu_start = time.perf_counter(), time.process_time()
from rlmesh.report import write_html
write_html(sys.argv[1], sys.argv[2])
seconds, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
print(json.dumps({"seconds": seconds, "cpu_s": cpu_s}))
"""


def html_in_subprocess(path: str | os.PathLike[str], out: str | os.PathLike[str]) -> dict:
    """Wall and CPU seconds (``seconds``, ``cpu_s``) of ``write_html(path, out)`` in a fresh
    Python process, its imports (rlmesh, numpy, matplotlib) included: what ``--html`` adds to
    ``rlmesh report``, the interpreter's own start aside."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, os.fspath(path), os.fspath(out)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return json.loads(done.stdout)


def test_html_report_of_a_suite_file(benchmark, tmp_path):
    path = suite_file()
    out = tmp_path / "report.html"
    benchmark.group = f"HTML report of a {HTML_EPISODES}-episode, {HTML_TASKS}-task results file"
    benchmark(write_html, path, out)
    text = out.read_text(encoding="utf-8")
    assert text.count('<g id="returns-') == text.count('<g id="success-') == HTML_TASKS
