"""The `rlmesh` command, driven as a user would: `main(argv)` and `python -m rlmesh`."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import gymnasium as gym
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
            while os.path.exists(os.environ.get("HOLD_WHILE", "")):  # for the lock test
                time.sleep(0.01)
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
        (
            _eval("--seed", "99999999999999999999999"),
            "--seed: must be an integer in [0, 2**64), got '99999999999999999999999'",
        ),
        (_eval("--seed", "-1"), "--seed: must be an integer in [0, 2**64)"),
        (_eval("--timeout-step", "0"), "--timeout-step: must be a positive number of seconds"),
        (_eval("--timeout-reset", "nan"), "--timeout-reset: must be a positive number of"),
        (_eval("--timeout-predict", "x"), "--timeout-predict: must be a positive number of"),
        (_eval("--max-episode-seconds", "-1"), "--max-episode-seconds: must be a positive"),
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
    reported = _json(capsys, ["report", out, "--json"])
    assert reported.pop("provenance")[0]["command"][:2] == ["rlmesh", "eval"]
    assert reported == evaluated
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
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if out.exists() and len(out.read_text().splitlines()) >= 4:  # header + 3 episodes
                break
            time.sleep(0.02)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:  # the test failed with the run still going
            process.kill()
            process.wait()
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


def test_the_largest_seed_runs(capsys):
    summary = _json(capsys, _eval("--episodes", "2", "--seed", str(2**64 - 1), "--json"))
    assert summary["episodes"] == 2 and summary["base_seed"] == 2**64 - 1


# ---------------------------------------------------------------------------- stdout closed early


def test_a_closed_stdout_pipe_ends_quietly():
    """`rlmesh eval ... | head`: the reader is gone before the summary is written."""
    process = subprocess.Popen(
        [sys.executable, "-m", "rlmesh", *_eval("--episodes", "2")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        process.stdout.close()  # the reader exits before reading a line
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert err == b""
    assert process.returncode == 128 + signal.SIGPIPE  # as `cat` ends, with no traceback


# ---------------------------------------------------------------------------- the current directory

LOCAL_MODULE = textwrap.dedent(
    """
    import time
    import gymnasium as gym
    import numpy as np
    import rlmesh


    class Policy(rlmesh.Model):
        def predict(self, obs):
            return 0


    class Corridor(gym.Env):
        '''Terminates after `length` steps; each step and reset may sleep.'''

        observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def __init__(self, length=5, step_sleep=0.0, reset_sleep=0.0):
            self.length, self.step_sleep, self.reset_sleep = length, step_sleep, reset_sleep

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            time.sleep(self.reset_sleep)
            self.t = 0
            return np.zeros(1, np.float32), {}

        def step(self, action):
            time.sleep(self.step_sleep)
            self.t += 1
            return np.zeros(1, np.float32), 1.0, self.t >= self.length, False, {}


    gym.register("LocalCorridor-v0", entry_point=__name__ + ":Corridor", max_episode_steps=200)
    """
)


@pytest.fixture
def local_module(tmp_path, monkeypatch):
    """``local_envs.py`` in the current directory, which is not on ``sys.path`` (as for an
    installed ``rlmesh`` script); the module and its env are forgotten afterwards."""
    (tmp_path / "local_envs.py").write_text(LOCAL_MODULE)
    monkeypatch.chdir(tmp_path)
    here = str(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", here)])
    yield "local_envs"
    sys.modules.pop("local_envs", None)
    gym.registry.pop("LocalCorridor-v0", None)


def test_modules_in_the_current_directory_need_no_pythonpath(tmp_path):
    """Run as the installed script runs: ``sys.path[0]`` is the script's directory, not cwd."""
    work, scripts = tmp_path / "work", tmp_path / "bin"
    work.mkdir()
    scripts.mkdir()
    (work / "local_envs.py").write_text(LOCAL_MODULE)
    script = scripts / "rlmesh"
    script.write_text("import sys\nfrom rlmesh.cli import main\nsys.exit(main())\n")
    argv = ["eval", "local_envs:Policy", "--env", "local_envs:LocalCorridor-v0", "--json"]
    shown = subprocess.run(
        [sys.executable, str(script), *argv, "--episodes", "3"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    summary = json.loads(shown.stdout)
    assert summary["episodes"] == 3 and summary["mean_reward"] == 5.0


def test_env_errors_are_one_sentence(capsys, local_module):
    for env, expected in [
        ("no_such_module:X-v0", "importing no_such_module failed: ModuleNotFoundError: "),
        ("NoSuchEnv-v0", "Environment `NoSuchEnv` doesn't exist; expected a registered"),
        (f"{local_module}:NoSuchEnv-v0", "doesn't exist; expected a registered Gymnasium id"),
    ]:
        assert main(_eval("--env", env)) == 2
        err = capsys.readouterr().err
        assert expected in err and err.count("\n") == 1
        assert ". Expected" not in err and "' Expected" not in err


# ---------------------------------------------------------------------------- any observation


@pytest.mark.parametrize("core", ["rust", "python"])
def test_random_runs_a_tuple_observation(tmp_path, capsys, core):
    out = tmp_path / "r.jsonl"
    argv = ["eval", "random", "--env", "Blackjack-v1", "--episodes", "30", "--num-envs", "3"]
    summary = _json(capsys, [*argv, "--core", core, "--out", str(out), "--json"])
    assert summary["episodes"] == 30
    _, episodes = read_results(out)
    # Blackjack pays -1, 0, 1 or 1.5 (a natural), and a random player both wins and loses.
    rewards = {episode.reward for episode in episodes}
    assert rewards <= {-1.0, 0.0, 1.0, 1.5} and {-1.0, 1.0} <= rewards
    again = tmp_path / "again.jsonl"
    assert main([*argv, "--core", core, "--num-envs", "1", "--out", str(again)]) == 0
    assert _stable(again) == _stable(out)  # seeded by the episode, not the lane


# ---------------------------------------------------------------------------- time limits


def test_timeout_step_fails_the_run(capsys, local_module):
    argv = ["eval", "random", "--env", f"{local_module}:LocalCorridor-v0", "--episodes", "1"]
    kwargs = ["--env-kwargs", '{"step_sleep": 0.5}', "--no-progress"]
    assert main([*argv, *kwargs, "--timeout-step", "0.1"]) == 1
    err = capsys.readouterr().err
    assert "rlmesh: error: " in err and "took longer than its 0.1 s limit (timeouts['step'])" in err


def test_timeout_reset_fails_the_run(capsys, local_module):
    argv = ["eval", "random", "--env", f"{local_module}:LocalCorridor-v0", "--episodes", "1"]
    kwargs = ["--env-kwargs", '{"reset_sleep": 0.5}', "--no-progress"]
    assert main([*argv, *kwargs, "--timeout-reset", "0.1"]) == 1
    assert "took longer than its 0.1 s limit (timeouts['reset'])" in capsys.readouterr().err


def test_timeout_predict_fails_the_run(capsys, policy_file, monkeypatch):
    monkeypatch.setenv("SLOW_POLICY", "0.5")
    argv = ["eval", f"{policy_file}:Policy", "--env", "CartPole-v1", "--episodes", "1"]
    assert main([*argv, "--no-progress", "--timeout-predict", "0.1"]) == 1
    assert "took longer than its 0.1 s limit (timeouts['predict'])" in capsys.readouterr().err


def test_max_episode_seconds_truncates_episodes(tmp_path, capsys, local_module):
    out = tmp_path / "r.jsonl"
    argv = ["eval", "random", "--env", f"{local_module}:LocalCorridor-v0", "--episodes", "2"]
    kwargs = ["--env-kwargs", '{"length": 1000, "step_sleep": 0.01}', "--no-progress"]
    assert main([*argv, *kwargs, "--max-episode-seconds", "0.1", "--out", str(out)]) == 0
    header, episodes = read_results(out)
    assert header["max_episode_seconds"] == 0.1
    # 0.1 s of 10 ms steps, far short of the env's own 200-step limit.
    assert all(episode.truncated and episode.steps < 100 for episode in episodes)


# ---------------------------------------------------------------------------- resume identity


def _cut_to(path, kept):
    """The file as a crash after its first ``kept`` episodes would have left it."""
    lines = Path(path).read_text().splitlines(keepends=True)
    Path(path).write_text("".join(lines[: 1 + kept]))


def test_one_policy_file_under_two_spellings_resumes(tmp_path, capsys, monkeypatch):
    (tmp_path / "pols.py").write_text(POLICY_FILE)
    monkeypatch.chdir(tmp_path)
    out = str(tmp_path / "r.jsonl")
    argv = ["--env", "CartPole-v1", "--episodes", "4", "--out", out, "--no-progress"]
    assert main(["eval", "pols.py:Policy", *argv]) == 0
    _cut_to(out, 2)
    assert main(["eval", "./pols.py:Policy", *argv, "--resume"]) == 0, capsys.readouterr().err
    header, episodes = read_results(out)
    assert header["policy"] == f"{(tmp_path / 'pols.py').resolve()}:Policy"
    assert len(episodes) == 4


def test_a_resume_may_change_the_core(tmp_path, capsys):
    whole, out = str(tmp_path / "whole.jsonl"), str(tmp_path / "r.jsonl")
    argv = _eval("--episodes", "6", "--num-envs", "2")
    assert main([*argv, "--core", "rust", "--out", whole]) == 0
    assert main([*argv, "--core", "rust", "--out", out]) == 0
    _cut_to(out, 3)
    assert main([*argv, "--core", "python", "--out", out, "--resume"]) == 0
    assert _stable(out) == _stable(whole)  # the cores' episodes are equal by contract
    records = [json.loads(line) for line in Path(out).read_text().splitlines()]
    resumed = [record for record in records if "rlmesh_resume" in record]
    assert records[0]["core"] == "rust" and [record["core"] for record in resumed] == ["python"]
    assert resumed[0]["provenance"]["core"] == "python"  # the resuming segment's own record


def test_the_header_records_the_policy_source_hash(tmp_path, capsys, local_module):
    out = tmp_path / "r.jsonl"
    argv = ["--env", "CartPole-v1", "--episodes", "1", "--no-progress"]
    assert main(["eval", f"{local_module}:Policy", *argv, "--out", str(out)]) == 0
    header, _ = read_results(out)
    source = (tmp_path / "local_envs.py").read_bytes()
    assert header["policy"] == "local_envs:Policy"  # a module name stays as given
    assert header["policy_sha256"] == hashlib.sha256(source).hexdigest()
    builtin = tmp_path / "builtin.jsonl"
    assert main(["eval", "random", *argv, "--out", str(builtin)]) == 0
    assert read_results(builtin)[0]["policy_sha256"] is None


def test_an_edited_policy_is_refused_unless_allowed(tmp_path, capsys, policy_file):
    out = str(tmp_path / "r.jsonl")
    argv = ["eval", f"{policy_file}:Policy", "--env", "CartPole-v1", "--out", out, "--no-progress"]
    assert main([*argv, "--episodes", "4"]) == 0
    _cut_to(out, 2)
    before = Path(out).read_bytes()
    policy_file.write_text(POLICY_FILE.replace("0.3 * obs[3]", "0.5 * obs[3]"))
    capsys.readouterr()
    assert main([*argv, "--episodes", "5", "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "episodes: the file has 4, this run has 5" in err  # every difference is listed
    assert "policy_sha256: the file has " in err and "--allow-changed-policy" in err
    assert Path(out).read_bytes() == before
    assert main([*argv, "--episodes", "4", "--resume", "--allow-changed-policy"]) == 0
    err = capsys.readouterr().err
    assert "rlmesh: warning: " in err and "the policy's source file changed" in err
    records = [json.loads(line) for line in Path(out).read_text().splitlines()]
    new_hash = hashlib.sha256(policy_file.read_bytes()).hexdigest()
    resumed = [record for record in records if "rlmesh_resume" in record]
    assert [record["policy_sha256"] for record in resumed] == [new_hash]
    assert len(read_results(out)[1]) == 4


# ---------------------------------------------------------------------------- one writer


def test_a_second_writer_exits_2_naming_the_holder_while_readers_still_work(tmp_path, policy_file):
    out, hold = tmp_path / "r.jsonl", tmp_path / "hold"
    hold.touch()  # the first run's policy waits while this file exists
    argv = [
        "eval", f"{policy_file}:Policy", "--env", "CartPole-v1", "--episodes", "4",
        "--max-episode-steps", "20", "--out", str(out), "--no-progress",
    ]  # fmt: skip
    first = subprocess.Popen(
        [sys.executable, "-m", "rlmesh", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HOLD_WHILE": str(hold)},
    )
    try:
        deadline = time.monotonic() + 60
        while not (out.exists() and out.read_text().endswith("\n")):  # the header is written
            if first.poll() is not None:
                pytest.fail(f"the first run ended before writing: {first.communicate()[1]}")
            if time.monotonic() > deadline:
                pytest.fail("the first run wrote no header within 60 s")
            time.sleep(0.02)
        before = out.read_bytes()
        second = subprocess.run(
            [sys.executable, "-m", "rlmesh", *argv, "--resume"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 2, second.stderr
        assert second.stderr.count("\n") == 1 and "Traceback" not in second.stderr
        assert f"pid {first.pid} on " in second.stderr and str(out) in second.stderr
        with pytest.raises(rlmesh.ResultsFileLockedError) as caught:
            rlmesh.run(lambda obs: 0, "CartPole-v1", episodes=4, results_path=out, resume=True)
        assert caught.value.holder["pid"] == first.pid
        assert out.read_bytes() == before  # neither touched the file
        report = subprocess.run(
            [sys.executable, "-m", "rlmesh", "report", str(out), "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert report.returncode == 0, report.stderr
        assert first.poll() is None  # the first run held the file all along
        hold.unlink()
        _, err = first.communicate(timeout=60)
        assert first.returncode == 0, err
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    _, episodes = read_results(out)  # no index repeated
    assert [episode.index for episode in episodes] == [0, 1, 2, 3]
    resumed = _command(*argv, "--resume", "--json")  # released at the end
    assert resumed.returncode == 0 and json.loads(resumed.stdout)["episodes"] == 4


def test_a_file_is_loaded_once_under_its_name_unless_another_module_holds_it(tmp_path, monkeypatch):
    """``file.py:name`` registers the file's module under its stem, so pickle sends its
    functions to worker processes by name; loaded again, it is that module, as ``import``
    would give (what a caller already holds stays the same object); a stem that names
    another module keeps it."""
    from rlmesh.cli import UsageError, load_object

    # the names start free, and what they hold at the end goes with the test, as do the
    # files' directories that loading puts on sys.path
    for free in ("rlmesh_test_factories", "rlmesh_test_broken"):
        monkeypatch.delitem(sys.modules, free, raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    mine = tmp_path / "rlmesh_test_factories.py"
    mine.write_text("def make():\n    return 1\n")
    first = load_object(f"{mine}:make", "env", "expected a factory")
    assert sys.modules["rlmesh_test_factories"].make is first and first() == 1
    assert pickle.loads(pickle.dumps(first)) is first
    mine.write_text("def make():\n    return 2\n")
    assert load_object(f"{mine}:make", "env", "expected a factory") is first
    assert sys.path.count(str(tmp_path.resolve())) == 1  # its directory went on once

    broken = tmp_path / "rlmesh_test_broken.py"
    broken.write_text("raise RuntimeError('no')\n")
    with pytest.raises(UsageError, match="RuntimeError: no"):
        load_object(f"{broken}:make", "env", "expected a factory")
    assert "rlmesh_test_broken" not in sys.modules  # a file that fails leaves no module

    clash = tmp_path / "json.py"
    clash.write_text("def make():\n    return 3\n")
    assert load_object(f"{clash}:make", "env", "expected a factory")() == 3
    assert sys.modules["json"] is json


def test_eval_help_groups_the_options_as_the_settings_parts():
    shown = _command("eval", "--help")
    assert shown.returncode == 0
    headings = [line[:-1] for line in shown.stdout.splitlines() if line and line[-1] == ":"]
    for group in (
        "policy and env", "episodes and seeds", "limits", "parallelism", "placement",
        "failures", "output", "video",
    ):  # fmt: skip
        assert group in headings


def test_the_policy_loader_and_the_cluster_do_not_load_the_cli():
    """Loading a POLICY by name (as a cluster's workers do) needs nothing of the command
    line; the names it had there stay importable from ``rlmesh.cli``."""
    code = (
        "import sys, rlmesh.policies, rlmesh.cluster.job, rlmesh.cluster.worker\n"
        "print(any(name.startswith('rlmesh.cli') for name in sys.modules))"
    )
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert shown.returncode == 0 and shown.stdout.strip() == "False", shown.stderr
    from rlmesh import cli, policies

    for name in ("load_policy", "load_object", "observation_digest", "BUILTIN_POLICIES"):
        assert getattr(cli, name) is getattr(policies, name)
    # A spec saved when the built-in policies lived in the CLI names its function there.
    saved = {"input": {"type": "Custom", "fn": "rlmesh.cli:observation_digest"}}
    saved["output"] = {"type": "Action", "clip": False}
    loaded = rlmesh.ModelSpec.from_dict(saved, allow_custom=True)
    assert loaded.input.fn is policies.observation_digest
