"""The auditable record: what the results header says produced a run, checked against the real
versions, host and a git repository made here; not part of a resume's identity."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import shlex
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium
import numpy
import pytest
import rlmesh
from helpers import CORES, cartpole_policy, comparable
from rlmesh.cli import main
from rlmesh.provenance import PROVENANCE_KEY, format_provenance
from rlmesh.results import read_results, read_run

POLICY = textwrap.dedent(
    """
    import rlmesh

    class Policy(rlmesh.Model):
        def predict(self, obs):
            return int(obs[2] + 0.3 * obs[3] > 0)
    """
)
GIT = shutil.which("git")
needs_git = pytest.mark.skipif(GIT is None, reason="git is not installed on this machine")


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        [GIT, "-C", str(repo), *args], capture_output=True, text=True, timeout=30, check=True
    )
    return done.stdout.strip()


@pytest.fixture
def policy_repo(tmp_path):
    """A git repository holding ``policy_mod.py`` (``Policy``), one commit: (repo, commit)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "policy_mod.py").write_text(POLICY)
    _git(repo, "init", "-q")
    _git(repo, "add", "policy_mod.py")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "policy")
    return repo, _git(repo, "rev-parse", "HEAD")


@pytest.fixture
def policy_module(policy_repo, monkeypatch):
    """``policy_mod`` imported from the repository (forgotten afterwards)."""
    repo, commit = policy_repo
    monkeypatch.syspath_prepend(str(repo))
    yield importlib.import_module("policy_mod"), repo, commit
    sys.modules.pop("policy_mod", None)


def _versions_are_the_real_ones(record, core):
    assert record["rlmesh"] == rlmesh.__version__ and record["core"] == core
    assert record["python"] == sys.version
    assert record["numpy"] == numpy.__version__
    assert record["gymnasium"] == gymnasium.__version__
    assert record["host"] == socket.gethostname()
    version = importlib.metadata.version("gymnasium")
    assert record["env_package"] == {"name": "gymnasium", "version": version}


@needs_git
@pytest.mark.parametrize("core", CORES)
def test_the_python_api_records_versions_host_policy_and_its_git_revision(
    core, policy_module, tmp_path
):
    module, repo, commit = policy_module
    path = tmp_path / "r.jsonl"
    result = rlmesh.run(module.Policy(), "CartPole-v1", episodes=3, core=core, results_path=path)
    header, _ = read_results(path)
    record = header[PROVENANCE_KEY]
    _versions_are_the_real_ones(record, core)
    assert record["policy"] == "policy_mod:Policy" and record["command"] is None
    assert record["git"] == {"root": str(repo.resolve()), "commit": commit, "dirty": False}
    # The record changes nothing else: the episodes are a run's without a results file.
    plain = rlmesh.run(module.Policy(), "CartPole-v1", episodes=3, core=core)
    assert comparable(result) == comparable(plain)


@needs_git
def test_an_uncommitted_edit_is_recorded_as_dirty(policy_module, tmp_path):
    module, repo, _ = policy_module
    (repo / "policy_mod.py").write_text(POLICY + "# edited\n")
    path = tmp_path / "r.jsonl"
    rlmesh.run(module.Policy(), "CartPole-v1", episodes=1, results_path=path)
    assert read_results(path)[0][PROVENANCE_KEY]["git"]["dirty"] is True


def test_outside_a_repository_and_a_script_env_there_is_no_git_and_no_package(
    tmp_path, monkeypatch
):
    (tmp_path / "loose_policy.py").write_text(POLICY)  # tmp_path is no git repository
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("loose_policy")
    path = tmp_path / "r.jsonl"

    def make_env():  # defined here: no installed distribution provides it
        return gymnasium.make("CartPole-v1")

    try:
        rlmesh.run(module.Policy(), make_env, episodes=1, results_path=path)
    finally:
        sys.modules.pop("loose_policy", None)
    record = read_results(path)[0][PROVENANCE_KEY]
    assert record["policy"] == "loose_policy:Policy"
    assert record["git"] is None and record["env_package"] is None


@needs_git
@pytest.mark.parametrize("core", CORES)
def test_rlmesh_eval_records_the_spec_string_and_command_line(core, policy_repo, tmp_path):
    repo, commit = policy_repo
    out = tmp_path / "r.jsonl"
    spec = f"{repo / 'policy_mod.py'}:Policy"
    argv = ["eval", spec, "--env", "CartPole-v1", "--episodes", "2", "--core", core]
    argv += ["--out", str(out), "--no-progress"]
    assert main(argv) == 0
    record = read_results(out)[0][PROVENANCE_KEY]
    _versions_are_the_real_ones(record, core)
    assert record["policy"] == spec  # as typed
    assert record["command"] == ["rlmesh", *argv]
    assert record["git"] == {"root": str(repo.resolve()), "commit": commit, "dirty": False}


def test_a_resume_with_another_command_line_is_accepted_and_records_its_own(tmp_path, capsys):
    whole, out = tmp_path / "whole.jsonl", tmp_path / "r.jsonl"
    argv = ["eval", "cartpole-heuristic", "--env", "CartPole-v1", "--episodes", "6"]
    assert main([*argv, "--out", str(whole), "--no-progress"]) == 0
    assert main([*argv, "--out", str(out), "--no-progress"]) == 0
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:4]))  # as a crash after 3 episodes leaves it
    resumed = [*argv, "--num-envs", "3", "--out", str(out), "--resume", "--no-progress"]
    assert main(resumed) == 0
    capsys.readouterr()
    assert comparable(read_run(out)[1], drop=("env_index",)) == comparable(read_run(whole)[1])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    resumes = [record for record in records if "rlmesh_resume" in record]
    assert [resume[PROVENANCE_KEY]["command"] for resume in resumes] == [["rlmesh", *resumed]]
    assert records[0][PROVENANCE_KEY]["command"][-1] == "--no-progress"

    # rlmesh report prints both segments' records, as text and as JSON.
    assert main(["report", str(out), "--json"]) == 0
    segments = json.loads(capsys.readouterr().out)["provenance"]
    assert segments == [records[0][PROVENANCE_KEY], resumes[0][PROVENANCE_KEY]]
    assert main(["report", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.endswith(format_provenance(segments) + "\n")
    assert "provenance, run segment 2" in text and shlex.join(["rlmesh", *resumed]) in text
    assert f"numpy          {numpy.__version__}\n" in text
    assert " ".join(sys.version.split()) in text and socket.gethostname() in text


def test_a_python_resume_from_another_stated_command_is_accepted(tmp_path):
    path = tmp_path / "r.jsonl"
    first = rlmesh.run(
        cartpole_policy, "CartPole-v1", episodes=2, results_path=path, provenance={"command": ["a"]}
    )
    again = rlmesh.run(
        cartpole_policy,
        "CartPole-v1",
        episodes=2,
        results_path=path,
        resume=True,
        provenance={"command": ["b"], "policy": "mine"},
    )
    assert comparable(again) == comparable(first)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    resume = next(record for record in records if "rlmesh_resume" in record)
    assert resume[PROVENANCE_KEY]["command"] == ["b"]
    assert resume[PROVENANCE_KEY]["policy"] == "mine"


@pytest.mark.parametrize(
    ("given", "error", "message"),
    [
        ({"host": "x"}, ValueError, "unknown keys ['host']"),
        ({"command": "rlmesh eval"}, TypeError, "must be a list of str"),
        ({"policy": 3}, TypeError, "provenance['policy'] must be a str"),
        (["policy"], TypeError, "provenance must be a dict"),
    ],
)
def test_a_malformed_provenance_argument_is_refused_before_anything_runs(
    given, error, message, tmp_path
):
    path = tmp_path / "r.jsonl"
    with pytest.raises(error, match=message.replace("[", r"\[").replace("]", r"\]")):
        rlmesh.run(cartpole_policy, "CartPole-v1", results_path=path, provenance=given)
    assert not path.exists()


def test_a_file_without_provenance_still_reports(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    rlmesh.run(cartpole_policy, "CartPole-v1", episodes=2, results_path=path)
    lines = path.read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    del header[PROVENANCE_KEY]  # as an rlmesh from before the record wrote it
    path.write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    assert main(["report", str(path)]) == 0
    assert "provenance  - (not recorded)" in capsys.readouterr().out
