"""The HTML report: one self-contained file (parsed here: nothing it would fetch), a plot per
task, the recorded videos inline, the failed episodes listed, clear errors for bad files.
The real browser's view of it is tests/report/test_report_html_browser.py."""

from __future__ import annotations

import base64
import json
import math
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import rlmesh
from helpers import CORES, cartpole_policy
from rlmesh.cli import main
from rlmesh.errors import ResultsFileError
from rlmesh.provenance import PROVENANCE_KEY
from rlmesh.report import write_html
from rlmesh.results import EpisodeResult, ResultsFile, RunResult, dumps, read_run
from rlmesh.stats import summarize

TASKS = ("balance-short", "balance-long", "random-pushes")


class Page(HTMLParser):
    """Every start tag of a page, with its attributes, and the text of its style blocks."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.styles: list[str] = []
        self._in_style = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {name: value or "" for name, value in attrs}))
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.styles.append(data)

    def having(self, tag: str, css: str | None = None) -> list[dict[str, str]]:
        return [
            attrs
            for name, attrs in self.tags
            if name == tag and (css is None or css in attrs.get("class", "").split())
        ]


def assert_self_contained(page: Page) -> None:
    """Nothing the page would load comes from elsewhere: every src is a data: URI, every
    href points inside the page, no link, script or base tag, no url() or @import in its
    styles. (An inline SVG's xmlns attributes are namespace names, never fetched.)"""
    for tag, attrs in page.tags:
        assert tag not in ("link", "script", "base", "iframe", "object", "embed", "img"), tag
        for name, value in attrs.items():
            if name.startswith("xmlns"):
                assert value.startswith("http://www.w3.org/"), (tag, name, value)
                continue
            assert not re.match(r"\s*(https?:)?//", value), (tag, name, value[:80])
            if name in ("src", "srcset", "poster", "data"):
                assert value.startswith("data:"), (tag, name, value[:80])
            if name in ("href", "xlink:href"):
                assert value.startswith("#"), (tag, name, value[:80])
    assert not any("url(" in style or "@import" in style for style in page.styles)


def plot_ids(page: Page, kind: str) -> list[str]:
    """The ids of a kind's per-task artists (``returns-0``, ``returns-1``, ...), in order."""
    return [attrs["id"] for tag, attrs in page.tags if attrs.get("id", "").startswith(kind + "-")]


def write_mp4(path: Path, frames: int = 16, size: tuple[int, int] = (64, 96)) -> bytes:
    """A real H.264 mp4 (imageio + imageio-ffmpeg): a bar moving across a grey field."""
    imageio = pytest.importorskip("imageio.v2")
    path.parent.mkdir(parents=True, exist_ok=True)
    with imageio.get_writer(path, fps=8, codec="libx264", macro_block_size=16) as writer:
        for k in range(frames):
            frame = np.full((*size, 3), 96, dtype=np.uint8)
            frame[:, (k * 5) % size[1] : (k * 5) % size[1] + 8] = (230, 40, 40)
            writer.append_data(frame)
    return path.read_bytes()


def suite_file(folder: Path, *, core: str = "rust", videos: int = 0, errors: int = 0) -> Path:
    """One results file holding a suite of three CartPole tasks, built from real runs: each
    task's episodes carry their ``task`` (as the suites part writes them). The first
    ``videos`` episodes of each task link a real mp4 beside the file; the last ``errors``
    episodes of the last task carry an ``error``."""
    runs = {
        "balance-short": dict(policy=cartpole_policy, max_episode_steps=40, seed=1),
        "balance-long": dict(policy=cartpole_policy, max_episode_steps=120, seed=2),
        "random-pushes": dict(policy=lambda obs: int(obs[0] > 0), max_episode_steps=None, seed=3),
    }
    lines: list[str] = []
    for task, settings in runs.items():
        path = folder / f"{task}.jsonl"
        policy = settings.pop("policy")
        # Success: a return of 30 or more, so the tasks' success rates differ (1, 1, 0).
        rlmesh.run(
            policy, "CartPole-v1", episodes=5, core=core, results_path=path, success=30, **settings
        )
        header, *records = [json.loads(line) for line in path.read_text().splitlines()]
        if not lines:
            lines.append(dumps(header))
        for record in records:
            if "rlmesh_run" in record:
                lines.append(dumps(record))
                continue
            record["task"] = task
            if record["index"] < videos:
                relative = f"videos/{task}-{record['index']}-{record['seed']}.mp4"
                write_mp4(folder / relative)
                record["video"] = relative
            if task == TASKS[-1] and record["index"] >= 5 - errors:
                record["error"] = f"EnvError: lane 0: step() raised RuntimeError: boom {task}"
            lines.append(dumps(record))
    out = folder / "suite.jsonl"
    out.write_text("\n".join(lines) + "\n")
    return out


@pytest.mark.parametrize("core", CORES)
def test_a_runs_report_is_one_self_contained_file(core, tmp_path):
    path = tmp_path / "r.jsonl"
    rlmesh.run(cartpole_policy, "CartPole-v1", episodes=6, num_envs=2, core=core, results_path=path)
    out = write_html(path, tmp_path / "report.html")
    text = out.read_text(encoding="utf-8")
    page = Page(text)
    assert_self_contained(page)
    # No tasks: one group of all episodes, one row in each per-task plot.
    assert len(page.having("figure", "plot-distributions")) == 1
    assert plot_ids(page, "returns") == ["returns-0"] and plot_ids(page, "lengths") == ["lengths-0"]
    assert plot_ids(page, "success") == ["success-0"]
    assert len(page.having("figure", "plot-latency")) == 1
    assert len(page.having("svg")) == len(page.having("figure", "plot")) == 3
    # The summary table is the run's, and the metadata is the header's and its provenance.
    _, result, _ = read_run(path)
    summary = summarize(result)
    assert f"{summary['mean_reward']:.3f}" in text and f"<td>{core}</td>" in text
    header = json.loads(path.read_text().splitlines()[0])
    assert header[PROVENANCE_KEY]["python"].split()[0] in text
    assert f"<td>{header[PROVENANCE_KEY]['host']}</td>" in text


def test_a_suite_has_one_plot_per_task_and_its_videos_inline(tmp_path):
    path = suite_file(tmp_path, videos=2)
    out = write_html(path, tmp_path / "report.html")
    page = Page(out.read_text(encoding="utf-8"))
    assert_self_contained(page)
    sections = page.having("section", "task")
    assert [section["data-task"] for section in sections] == list(TASKS)
    for kind in ("returns", "lengths", "success"):
        assert plot_ids(page, kind) == [f"{kind}-{k}" for k in range(len(TASKS))]
    videos = page.having("video")
    assert len(videos) == 2 * len(TASKS)
    linked = sorted((tmp_path / "videos").glob("*.mp4"))
    embedded = sorted(base64.b64decode(video["src"].split(",", 1)[1]) for video in videos)
    assert embedded == sorted(file.read_bytes() for file in linked)
    assert all(video["src"].startswith("data:video/mp4;base64,") for video in videos)
    assert all("controls" in video for video in videos)


def test_failed_episodes_are_listed_and_kept_out_of_the_statistics(tmp_path):
    path = suite_file(tmp_path, errors=2)
    text = write_html(path, tmp_path / "report.html").read_text(encoding="utf-8")
    assert "Failed episodes (2)" in text
    assert text.count("boom random-pushes") == 2
    records = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    last = [r for r in records if r.get("task") == TASKS[-1]]
    completed = [r["reward"] for r in last if not r.get("error")]
    # The task's row: 5 episodes, 2 errors, the mean return of the 3 that completed.
    row = re.search(
        r"<tr><td>random-pushes</td><td>5</td><td>2</td><td>[^<]*</td><td>([-\d.]+)", text
    )
    assert row is not None and float(row.group(1)) == pytest.approx(np.mean(completed), abs=5e-4)


def test_a_video_that_is_gone_is_said_to_be_missing(tmp_path):
    path = suite_file(tmp_path, videos=1)
    gone = sorted((tmp_path / "videos").glob("balance-long-*.mp4"))[0]
    gone.unlink()
    text = write_html(path, tmp_path / "report.html").read_text(encoding="utf-8")
    assert text.count("<video") == len(TASKS) - 1
    assert f"videos/{gone.name} cannot be read" in text


def test_a_run_result_reports_without_a_file(tmp_path):
    result = rlmesh.run(cartpole_policy, "CartPole-v1", episodes=3)
    page = Page(write_html(result, tmp_path / "report.html").read_text(encoding="utf-8"))
    assert_self_contained(page)
    assert plot_ids(page, "returns") == ["returns-0"]


def test_rlmesh_report_html_writes_the_report_and_prints_the_summary(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    argv = ["eval", "cartpole-heuristic", "--env", "CartPole-v1", "--episodes", "4"]
    assert main([*argv, "--out", str(path), "--no-progress"]) == 0
    capsys.readouterr()
    out = tmp_path / "nested" / "report.html"
    out.parent.mkdir()
    assert main(["report", str(path), "--html", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("episodes") and f"wrote {out}" in captured.err
    text = out.read_text(encoding="utf-8")
    assert_self_contained(Page(text))
    assert "rlmesh eval cartpole-heuristic --env CartPole-v1 --episodes 4" in text  # provenance


@pytest.mark.parametrize(
    ("contents", "message"),
    [
        (None, "cannot read it"),
        ("", "is empty: it holds no results header"),
        ('{"rlmesh_results": 1}\n{"index": 0, "steps"\n', "line 2 is not JSON"),
        ('{"not": "a header"}\n', "is this an rlmesh results file?"),
        ('{"rlmesh_results": 1}\n{"steps": 3}\n', "line 2 is not an episode line"),
    ],
)
def test_a_missing_empty_or_corrupt_file_is_a_clear_error(contents, message, tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    if contents is not None:
        path.write_text(contents)
    with pytest.raises(ResultsFileError, match=re.escape(message)) as caught:
        write_html(path, tmp_path / "report.html")
    assert str(path) in str(caught.value)
    assert not (tmp_path / "report.html").exists()
    assert main(["report", str(path), "--html", str(tmp_path / "report.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err


def test_without_matplotlib_the_error_names_the_extra(tmp_path):
    path = tmp_path / "r.jsonl"
    rlmesh.run(cartpole_policy, "CartPole-v1", episodes=1, results_path=path)
    # None in sys.modules makes `import matplotlib` raise ImportError, as when not installed.
    script = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from rlmesh.cli import main\n"
        f"sys.exit(main(['report', {str(path)!r}, '--html', {str(tmp_path / 'o.html')!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert "pip install 'rlmesh[report]'" in done.stderr and "Traceback" not in done.stderr
    assert done.stdout.startswith("episodes")  # the text summary needs no matplotlib
    assert not (tmp_path / "o.html").exists()


def test_a_file_without_episodes_and_non_finite_returns_still_report(tmp_path):
    path = tmp_path / "r.jsonl"
    ResultsFile.open(path, {"episodes": 3}, resume=False).close()  # a run that died at once
    empty = write_html(path, tmp_path / "empty.html").read_text(encoding="utf-8")
    assert_self_contained(Page(empty))
    assert plot_ids(Page(empty), "returns") == []
    assert "<td>episodes</td><td>0 of 3, incomplete</td>" in empty
    episodes = [
        EpisodeResult(k, k, k, 0, 5, reward, True, False, None, 0.1, 0.1, 0.1)
        for k, reward in enumerate([1.0, math.inf, math.nan])
    ]
    text = write_html(RunResult(episodes, base_seed=0), tmp_path / "r.html").read_text()
    assert "2 non-finite not shown" in text


def test_a_real_suites_report_gives_its_overall_row_as_rlmesh_report_does(tmp_path):
    from rlmesh.results import read_suite_columns
    from rlmesh.stats import summarize_suite

    tasks = [
        rlmesh.Task("short", "CartPole-v1", episodes=4, seed=1, max_episode_steps=40),
        rlmesh.Task("long", "CartPole-v1", episodes=6, seed=2, max_episode_steps=120),
    ]
    path = tmp_path / "suite.jsonl"
    rlmesh.run_suite(cartpole_policy, tasks, results_path=path, success=30)
    text = write_html(path, tmp_path / "report.html").read_text(encoding="utf-8")
    overall = summarize_suite(read_suite_columns(path)[1])["overall"]
    # The mean of the tasks' success rates; the returns of different tasks are not pooled.
    row = (
        "<tr><td>overall (mean of the tasks; stratified bootstrap CI)</td><td>10</td><td>0</td>"
        f"<td>{overall['success_rate']:.1%} [{overall['success_ci95'][0]:.1%}, "
        f"{overall['success_ci95'][1]:.1%}]</td><td>-</td><td></td><td></td></tr>"
    )
    assert row in text


def test_a_suite_s_summary_names_each_task_s_rule_and_pools_no_returns(tmp_path):
    """CartPole and Acrobot, each judged by its env spec's reward_threshold: the top summary
    says neither "not available" beside a success rate nor a mean of both tasks' returns;
    the per-task table names each task's rule."""
    tasks = [
        rlmesh.Task("cartpole", "CartPole-v1", episodes=4, seed=1, max_episode_steps=30),
        rlmesh.Task("acrobot", "Acrobot-v1", episodes=3, seed=2, max_episode_steps=30),
    ]
    path = tmp_path / "suite.jsonl"
    rlmesh.run_suite(lambda obs: 0, tasks, results_path=path)
    text = write_html(path, tmp_path / "report.html").read_text(encoding="utf-8")
    labels = [row[0] for row in table_rows(text, "summary")]
    assert labels[:2] == ["episodes", "total steps"]
    for pooled in ("mean reward", "IQM reward", "success rate", "success rule"):
        assert pooled not in labels
    assert "the returns of different tasks are not pooled" in text
    rows = {row[0]: row for row in table_rows(text, "tasks")}
    assert rows["cartpole"][-1] == "reward &gt;= 475.0 (env spec reward_threshold)"
    assert rows["acrobot"][3].startswith("100.0%")
    assert rows["acrobot"][-1] == "reward &gt;= -100.0 (env spec reward_threshold)"
    assert "not available" not in text


def table_rows(text: str, css: str) -> list[list[str]]:
    """The cells of each body row of the page's ``<table class="css">``."""
    table = re.search(rf'<table class="{css}">(.*?)</table>', text, re.S)
    assert table is not None, css
    rows = re.findall(r"<tr>((?:<td>.*?</td>)+)</tr>", table.group(1))
    return [re.findall(r"<td>(.*?)</td>", row) for row in rows]


def test_each_task_s_success_interval_is_wilson_s_as_scipy_computes_it(tmp_path):
    from scipy.stats import binomtest

    tasks = [
        rlmesh.Task("short", "CartPole-v1", episodes=9, seed=5, max_episode_steps=60),
        rlmesh.Task("long", "CartPole-v1", episodes=7, seed=6),
    ]
    path = tmp_path / "suite.jsonl"
    # Pushing by the pole's angle alone balances it for 25 to 70 steps: some episodes clear
    # the bar of 40, not all, so the intervals are neither end's.
    rlmesh.run_suite(lambda obs: int(obs[2] > 0), tasks, results_path=path, success=40)
    text = write_html(path, tmp_path / "report.html").read_text(encoding="utf-8")
    rows = {row[0]: row for row in table_rows(text, "tasks")}
    records = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    for task in tasks:
        verdicts = [r["success"] for r in records if r.get("task") == task.name and "index" in r]
        assert len(verdicts) == task.episodes
        k, n = sum(verdicts), len(verdicts)
        interval = binomtest(k, n).proportion_ci(0.95, method="wilson")
        expected = f"{k / n:.1%} [{interval.low:.1%}, {interval.high:.1%}]"
        assert 0 < k < n and rows[task.name][3] == expected, task.name


@pytest.mark.parametrize("core", CORES)
def test_the_latency_table_is_the_run_s_telemetry(core, tmp_path):
    path = tmp_path / "r.jsonl"
    result = rlmesh.run(
        cartpole_policy, "CartPole-v1", episodes=4, num_envs=2, core=core, results_path=path
    )
    text = write_html(path, tmp_path / "report.html").read_text(encoding="utf-8")
    latency = [row for row in result.telemetry if row.metric == "latency"]
    assert {row.op for row in latency} >= {"model.predict", "env.step", "env.reset"}
    assert table_rows(text, "latency") == [
        [row.op, str(row.count)]
        + [f"{getattr(row, q):.3f}" for q in ("avg", "p50", "p95", "p99", "max")]
        for row in latency
    ]
    rates = {row.metric: row for row in result.telemetry if row.metric != "latency"}
    throughput = {row[0]: row for row in table_rows(text, "throughput")}
    for metric, row in rates.items():
        assert throughput[f"driver {metric}"][1:] == [str(row.count), f"{row.avg:,.0f} /s"]
