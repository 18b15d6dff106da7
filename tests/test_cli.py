"""The `rlmesh` command, driven as a user would: `main(argv)` and `python -m rlmesh`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import rlmesh
from rlmesh.cli import main
from rlmesh.results import read_results

SUMMARY_FIELDS = {
    "episodes", "total_steps", "mean_reward", "mean_reward_ci95", "iqm_reward", "success_rate",
    "success_ci95", "episode_length_mean", "episode_length_min", "episode_length_max",
    "steps_per_s", "predict_ms", "env_step_ms", "predicts_per_episode", "wasted_steps",
    "base_seed", "core",
}  # fmt: skip

POLICY_FILE = textwrap.dedent(
    """
    import os, time
    import rlmesh

    class Policy(rlmesh.Model):
        def predict(self, obs):
            time.sleep(float(os.environ.get("SLOW_POLICY", "0")))  # for the Ctrl-C test
            return int(obs[2] + 0.3 * obs[3] > 0)

    instance = Policy()
    def function(obs):
        return int(obs[2] > 0)
    not_a_policy = 42
    """
)


@pytest.fixture
def policy_file(tmp_path):
    path = tmp_path / "my_policy.py"
    path.write_text(POLICY_FILE)
    return path


def _eval(*extra):
    return ["eval", "random", "--env", "CartPole-v1", "--no-progress", *extra]


def _json(capsys, argv):
    assert main(argv) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out)  # stdout is one JSON object and nothing else


def test_eval_json_has_every_field(capsys):
    summary = _json(capsys, _eval("--episodes", "6", "--num-envs", "3", "--seed", "4", "--json"))
    assert set(summary) >= SUMMARY_FIELDS
    assert summary["episodes"] == 6 and summary["base_seed"] == 4


def test_eval_prints_the_table(capsys):
    assert main(_eval("--episodes", "3")) == 0
    out = capsys.readouterr().out
    assert "mean reward" in out and "IQM reward" in out and "episode length" in out


@pytest.mark.parametrize("spec", ["Policy", "instance", "function"])
def test_policies_from_a_file(capsys, policy_file, spec):
    argv = ["eval", f"{policy_file}:{spec}", "--env", "CartPole-v1", "--episodes", "2", "--json"]
    assert _json(capsys, argv)["episodes"] == 2


def test_policy_from_a_module(capsys, policy_file, monkeypatch):
    monkeypatch.syspath_prepend(str(policy_file.parent))
    argv = ["eval", "my_policy:Policy", "--env", "CartPole-v1", "--episodes", "2", "--json"]
    assert _json(capsys, argv)["episodes"] == 2


def test_results_do_not_depend_on_num_envs(tmp_path, capsys):
    for lanes in ("1", "4"):
        assert (
            main(_eval("--episodes", "8", "--num-envs", lanes, "--out", str(tmp_path / lanes))) == 0
        )
    _, one = read_results(tmp_path / "1")
    _, four = read_results(tmp_path / "4")
    assert [(e.seed, e.steps, e.reward) for e in one] == [(e.seed, e.steps, e.reward) for e in four]


def test_seeds_file_sets_the_episodes(tmp_path, capsys):
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("5\n7, 9\n")
    out = tmp_path / "r.jsonl"
    assert main(_eval("--seeds", str(seeds), "--out", str(out))) == 0
    header, episodes = read_results(out)
    assert header["seeds"] == [5, 7, 9] and [e.seed for e in episodes] == [5, 7, 9]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["eval", "nowhere.mod:Policy", "--env", "CartPole-v1"], "importing nowhere.mod failed"),
        (["eval", "no_colon", "--env", "CartPole-v1"], "expected package.module:Name"),
        (["eval", "missing.py:Policy", "--env", "CartPole-v1"], "no file missing.py"),
        (["eval", "random", "--env", "NoSuchEnv-v0"], "--env 'NoSuchEnv-v0'"),
        (_eval("--env-kwargs", "{bad"), "--env-kwargs: is not valid JSON"),
        (_eval("--env-kwargs", "[1]"), "--env-kwargs: must be a JSON object"),
        (_eval("--episodes", "0"), "--episodes: must be a positive integer, got '0'"),
        (_eval("--horizon", "0"), "--horizon: must be a positive integer, got '0'"),
        (_eval("--seed", "1", "--seeds", "f"), "not allowed with argument"),
        (_eval("--resume"), "--resume needs --out"),
        (["report", "/no/such/file.jsonl"], "cannot read it"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, expected):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and expected in captured.err
    assert "Traceback" not in captured.err


def test_bad_policy_objects(capsys, policy_file):
    for name, expected in [("not_a_policy", "is a int"), ("nope", "has no attribute 'nope'")]:
        assert main(["eval", f"{policy_file}:{name}", "--env", "CartPole-v1"]) == 2
        assert expected in capsys.readouterr().err


def test_seeds_file_with_a_non_integer(tmp_path, capsys):
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("1\n2\nthree\n")
    assert main(_eval("--seeds", str(seeds))) == 2
    assert "line 3: 'three' is not a non-negative integer" in capsys.readouterr().err


def test_an_existing_results_file_needs_resume_and_a_matching_header(tmp_path, capsys):
    out = str(tmp_path / "r.jsonl")
    assert main(_eval("--episodes", "3", "--out", out)) == 0
    assert main(_eval("--episodes", "3", "--out", out)) == 2
    assert "pass --resume" in capsys.readouterr().err
    assert main(_eval("--episodes", "5", "--seed", "2", "--out", out, "--resume")) == 2
    err = capsys.readouterr().err
    assert "episodes: the file has 3, this run has 5" in err and "seed: the file has 0" in err


def test_report_equals_the_eval_summary(tmp_path, capsys):
    out = str(tmp_path / "r.jsonl")
    evaluated = _json(capsys, _eval("--episodes", "5", "--num-envs", "2", "--out", out, "--json"))
    assert _json(capsys, ["report", out, "--json"]) == evaluated
    assert main(["report", out]) == 0
    assert "mean reward" in capsys.readouterr().out


def test_resume_runs_only_the_missing_episodes(tmp_path, capsys):
    whole, cut = str(tmp_path / "whole.jsonl"), tmp_path / "cut.jsonl"
    assert main(_eval("--episodes", "6", "--num-envs", "2", "--out", whole)) == 0
    capsys.readouterr()
    lines = Path(whole).read_text().splitlines(keepends=True)
    # Episodes 0, 2 and 4 completed, and the crash cut the next line in half.
    kept = [line for line in lines[1:7] if json.loads(line)["index"] in (0, 2, 4)]
    cut.write_text(lines[0] + "".join(kept) + lines[-1][:15])
    assert main(_eval("--episodes", "6", "--out", str(cut), "--resume", "--json")) == 0
    captured = capsys.readouterr()
    assert "rlmesh: warning: " in captured.err and "last line was cut off" in captured.err
    assert json.loads(captured.out)["episodes"] == 6
    assert _stable(cut) == _stable(whole)


def _stable(path):
    """Every per-index field that does not depend on timing or lanes."""
    _, episodes = read_results(path)
    return [(e.index, e.seed, e.trial, e.steps, e.reward, e.terminated) for e in episodes]


def test_a_failure_in_the_run_exits_1_after_writing_completed_episodes(tmp_path, capsys):
    policy = tmp_path / "failing.py"
    policy.write_text(
        "calls = 0\n"
        "def policy(obs):\n"
        "    global calls\n"
        "    calls += 1\n"
        "    if calls > 60:\n"
        "        raise RuntimeError('boom')\n"
        "    return 0\n"
    )
    out = tmp_path / "r.jsonl"
    argv = ["eval", f"{policy}:policy", "--env", "CartPole-v1", "--episodes", "20"]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "rlmesh: error: model.predict raised RuntimeError('boom')" in err
    _, episodes = read_results(out)
    assert 0 < len(episodes) < 20


def test_demo_runs(capsys):
    summary = _json(capsys, ["demo", "--episodes", "8", "--json"])
    assert summary["episodes"] == 8 and summary["mean_reward"] == 500.0


def _command(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "rlmesh", *args], capture_output=True, text=True, env=env
    )


def test_python_dash_m_version_and_help():
    version = _command("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"rlmesh {rlmesh.__version__}"
    for command in ([], ["eval"], ["demo"], ["report"]):
        shown = _command(*command, "--help")
        assert shown.returncode == 0 and "example:" in shown.stdout


def test_no_progress_output_when_not_a_tty():
    shown = _command("demo", "--episodes", "4")
    assert shown.returncode == 0 and shown.stderr == ""
    assert "mean reward" in shown.stdout


def test_ctrl_c_keeps_completed_episodes_and_resume_completes_the_run(tmp_path, policy_file):
    out = tmp_path / "r.jsonl"
    argv = [
        "eval", f"{policy_file}:Policy", "--env", "CartPole-v1", "--episodes", "40",
        "--num-envs", "4", "--max-episode-steps", "60", "--out", str(out),
    ]  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, "-m", "rlmesh", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SLOW_POLICY": "0.002"},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if out.exists() and len(out.read_text().splitlines()) >= 4:  # header + 3 episodes
            break
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "Resume with: rlmesh eval" in err and "--resume" in err
    _, partial = read_results(out)
    assert 3 <= len(partial) < 40

    resumed = _command(*argv, "--resume", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["episodes"] == 40
    reference = tmp_path / "reference.jsonl"
    uninterrupted = _command(*[a if a != str(out) else str(reference) for a in argv], "--json")
    assert uninterrupted.returncode == 0
    assert _stable(out) == _stable(reference)
    # The final summary equals an uninterrupted run's in every figure that is not a timing.
    untimed = [
        "episodes",
        "total_steps",
        "mean_reward",
        "mean_reward_ci95",
        "iqm_reward",
        "success_rate",
        "success_ci95",
        "episode_length_mean",
        "episode_length_min",
        "episode_length_max",
        "base_seed",
    ]
    final, reference_summary = json.loads(resumed.stdout), json.loads(uninterrupted.stdout)
    assert {key: final[key] for key in untimed} == {key: reference_summary[key] for key in untimed}
