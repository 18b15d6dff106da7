"""result.summary() / result.format_summary() are what the CLI prints; unfinished runs say so."""

from __future__ import annotations

import json

import pytest
import rlmesh
from helpers import CORES
from rlmesh.cli import CartPoleHeuristic, main
from rlmesh.errors import ModelError
from rlmesh.results import read_run


def _printed(capsys, argv) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


def _eval(out, *extra, episodes=6):
    return ["eval", "cartpole-heuristic", "--env", "CartPole-v1", "--episodes", str(episodes),
            "--num-envs", "2", "--max-episode-steps", "50", "--out", str(out),
            "--no-progress", *extra]  # fmt: skip


@pytest.mark.parametrize("core", CORES)
def test_summary_is_exactly_what_eval_json_and_report_json_print(core, tmp_path, capsys):
    out = tmp_path / "run.jsonl"
    printed = json.loads(_printed(capsys, _eval(out, "--core", core, "--json")))
    _, result, _ = read_run(out)
    assert result.summary() == printed
    assert printed["core"] == core and result.core == core
    report = json.loads(_printed(capsys, ["report", str(out), "--json"]))
    assert report.pop("provenance")[0]["core"] == core  # then the auditable record
    assert report == printed


def test_format_summary_is_exactly_the_table_eval_and_report_print(tmp_path, capsys):
    out = tmp_path / "run.jsonl"
    table = _printed(capsys, _eval(out))
    _, result, _ = read_run(out)
    assert table == result.format_summary() + "\n"
    # The table, then the provenance block (rlmesh.provenance).
    assert _printed(capsys, ["report", str(out)]).startswith(table + "\nprovenance\n")


@pytest.mark.parametrize("core", CORES)
def test_a_run_result_knows_its_core_and_summarizes_itself(core):
    result = rlmesh.run(CartPoleHeuristic(), "CartPole-v1", episodes=3, core=core)
    summary = result.summary()
    assert result.core == summary["core"] == core
    assert summary["episodes"] == summary["episodes_requested"] == 3 and summary["complete"]
    assert summary["elapsed_s"] == result.elapsed_s > 0
    assert result.format_summary().splitlines()[0].split() == ["episodes", "3"]


def test_report_on_an_unfinished_file_says_it_is_incomplete(tmp_path, capsys):
    out = tmp_path / "run.jsonl"
    _printed(capsys, _eval(out, episodes=10))
    lines = out.read_text().splitlines()
    assert len(lines) == 12  # header, 10 episodes, the run segment
    out.write_text("\n".join(lines[:7]) + "\n")  # as a crash after 6 episodes leaves it
    table = _printed(capsys, ["report", str(out)])
    assert table.splitlines()[0].split(None, 1) == ["episodes", "6 of 10, incomplete"]
    summary = json.loads(_printed(capsys, ["report", str(out), "--json"]))
    assert (summary["episodes"], summary["episodes_requested"]) == (6, 10)
    assert summary["complete"] is False


@pytest.mark.parametrize("core", CORES)
def test_a_failed_runs_partial_result_is_incomplete(core):
    calls = 0

    def fails_late(obs):
        nonlocal calls
        calls += 1
        if calls > 30:
            raise RuntimeError("boom")
        return 0

    with pytest.raises(ModelError) as caught:
        rlmesh.run(fails_late, "CartPole-v1", episodes=5, core=core)
    summary = caught.value.partial_result.summary()
    assert summary["episodes_requested"] == 5 and summary["episodes"] < 5
    assert summary["complete"] is False
    assert "incomplete" in caught.value.partial_result.format_summary().splitlines()[0]
