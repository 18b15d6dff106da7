"""``rlmesh verify A B``: two results files' episodes compared by their digests, and ``rlmesh
compare`` flagging pairs that started from different states; each run a real one, written by
rlmesh to a file, on both cores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import rlmesh
from envs_for_digests import CartPoleFactory, cartpole_policy, make_seed_ignoring_cartpole
from rlmesh.cli import main
from rlmesh.results import read_results

EPISODES, SEED, PERTURBED = 8, 5, 3  # episode 3 of the perturbed run has one nudged step
OPTIONS = {"episodes": EPISODES, "seed": SEED, "max_episode_steps": 80}


def run_into(path, env, **options):
    rlmesh.run(cartpole_policy, env, results_path=path, **{**OPTIONS, **options})
    return str(path)


def verified(capsys, *argv):
    status = main(["verify", *argv])
    return status, capsys.readouterr()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same episodes at 1 lane on the Rust core and 4 on the Python core, the same with
    one step of episode PERTURBED nudged, and an env that ignores its seeds, twice."""
    folder = tmp_path_factory.mktemp("runs")
    perturbed = CartPoleFactory(perturb=(rlmesh.episode_seed(SEED, PERTURBED), 20))
    return {
        "one": run_into(folder / "one.jsonl", CartPoleFactory(), core="rust"),
        "four": run_into(folder / "four.jsonl", CartPoleFactory(), core="python", num_envs=4),
        "perturbed": run_into(folder / "perturbed.jsonl", perturbed, num_envs=2),
        "unseeded": run_into(folder / "unseeded.jsonl", make_seed_ignoring_cartpole),
        "unseeded again": run_into(folder / "unseeded2.jsonl", make_seed_ignoring_cartpole),
    }


def test_the_same_episodes_on_other_lanes_and_cores_verify_equal(runs, capsys):
    status, shown = verified(capsys, runs["one"], runs["four"])
    assert status == 0, shown.err
    assert shown.out.startswith(f"equal: all {EPISODES} verified episodes have equal digests")
    status, shown = verified(capsys, runs["one"], runs["four"], "--json")
    result = json.loads(shown.out)
    assert status == 0 and result["equal"] is True
    assert result["verified"] == result["shared"] == EPISODES
    assert result["first_difference"] is None


def test_one_nudged_step_is_found_at_its_episode_and_after_its_reset(runs, capsys):
    # Everything else about the episodes is the same: only the digests can tell.
    fields = [(e.steps, e.reward, e.seed) for e in read_results(runs["one"])[1]]
    assert fields == [(e.steps, e.reward, e.seed) for e in read_results(runs["perturbed"])[1]]
    status, shown = verified(capsys, runs["one"], runs["perturbed"])
    assert status == 1
    assert shown.out.startswith(f"differ: 1 of {EPISODES} verified episodes differ")
    assert f"first: episode {PERTURBED} differs later: the same reset" in shown.out
    status, shown = verified(capsys, runs["perturbed"], runs["four"], "--json")
    result = json.loads(shown.out)
    assert status == 1 and result["differing"] == 1 and result["differ_later"] == 1
    first = result["first_difference"]
    assert (first["index"], first["where"]) == (PERTURBED, "later")
    assert first["a"]["reset_digest"] == first["b"]["reset_digest"]


def test_an_env_that_ignores_its_seeds_differs_from_its_resets(runs, capsys):
    status, shown = verified(capsys, runs["unseeded"], runs["unseeded again"], "--json")
    result = json.loads(shown.out)
    assert status == 1
    assert result["differ_from_reset"] == result["differing"] == EPISODES
    assert result["first_difference"]["index"] == 0
    status, shown = verified(capsys, runs["unseeded"], runs["unseeded again"])
    assert "first: episode 0 differs from its reset: it started from different states" in shown.out
    assert f"both seed {rlmesh.episode_seed(SEED, 0)}" in shown.out


def test_compare_flags_the_pairs_that_started_from_different_states(runs, capsys):
    assert main(["compare", runs["unseeded"], runs["unseeded again"]]) == 0
    out = capsys.readouterr().out
    assert f"not paired: {EPISODES} of {EPISODES} episodes started from different states" in out
    assert main(["compare", runs["unseeded"], runs["unseeded again"], "--json"]) == 0
    resets = json.loads(capsys.readouterr().out)["reset_differences"]
    assert (resets["pairs"], resets["compared"]) == (EPISODES, EPISODES)
    assert resets["first"][0] == {"task": None, "index": 0}
    assert main(["compare", runs["one"], runs["perturbed"]]) == 0
    assert "not paired" not in capsys.readouterr().out  # the same resets: paired
    assert main(["compare", runs["one"], runs["perturbed"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reset_differences"]["pairs"] == 0


def test_only_the_episodes_both_files_hold_are_compared(runs, tmp_path, capsys):
    part = run_into(tmp_path / "part.jsonl", CartPoleFactory(), indices=[1, 2, 6])
    status, shown = verified(capsys, runs["one"], part)
    assert status == 0
    assert f"3 episodes in common; {EPISODES - 3} only in {runs['one']}, 0 only in" in shown.out


def test_files_that_cannot_be_verified_exit_2_and_say_why(runs, tmp_path, capsys):
    old = tmp_path / "old.jsonl"
    lines = []
    for line in Path(runs["one"]).read_text().splitlines():  # as written before digests existed
        record = json.loads(line)
        record.pop("reset_digest", None)
        record.pop("trajectory_digest", None)
        lines.append(json.dumps(record))
    old.write_text("\n".join(lines) + "\n")
    status, shown = verified(capsys, runs["one"], str(old))
    assert status == 2
    assert f"{old} holds no digests" in shown.err and shown.err.count("\n") == 1
    status, shown = verified(capsys, runs["one"], str(tmp_path / "missing.jsonl"))
    assert status == 2 and "missing.jsonl" in shown.err
    other = run_into(tmp_path / "other.jsonl", CartPoleFactory(), indices=[7])
    first = run_into(tmp_path / "first.jsonl", "CartPole-v1", indices=[0])
    status, shown = verified(capsys, first, other)
    assert status == 2 and "have no episode in common" in shown.err
