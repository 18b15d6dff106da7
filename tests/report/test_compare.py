"""Paired comparison on constructed runs: the statistics against scipy and numpy references,
the pairing rules and their refusals, suites, env errors and strict JSON."""

from __future__ import annotations

import doctest
import importlib
import json
import math
import subprocess
import sys

import numpy as np
import pytest
import rlmesh
from helpers import CORES
from rlmesh.cli import main
from rlmesh.errors import ResultsFileError
from rlmesh.report import RunsNotPairedError, compare, format_comparison
from rlmesh.results import HEADER_KEY, RUN_KEY, EpisodeResult, RunResult, dumps, read_suite
from rlmesh.stats import (
    BOOTSTRAP_BLOCK,
    bootstrap_mean_ci,
    mcnemar_exact_p,
    paired_rate_difference_ci,
    stratified_bootstrap_mean_ci,
)
from scipy.stats import binomtest

# ---------------------------------------------------------------------------- building runs


def record(index, reward, success=None, *, seed=None, task=None, error=None):
    """An episode line as a results file holds it, with the optional fields of suites and
    failure isolation where given."""
    line = EpisodeResult(
        index, 1000 + index if seed is None else seed, index, 0, 10, float(reward), True, False,
        success, 0.1, 0.1, 0.1, success is not None,
    ).to_dict()  # fmt: skip
    if task is not None:
        line["task"] = task
    if error is not None:
        line["error"] = error
    return line


def write_run(path, records, *, seed=0, **header):
    """A results file as a run writes it: header, episode lines, a run segment."""
    lines = [{HEADER_KEY: 1, "env": "Constructed-v0", "seed": seed, **header}, *records]
    lines.append({RUN_KEY: 1, "wasted_steps": 0, "elapsed_s": 1.0, "telemetry": []})
    path.write_text("".join(dumps(line) + "\n" for line in lines))
    return path


def run_result(rewards, successes=None, *, seeds=None):
    successes = successes if successes is not None else [None] * len(rewards)
    seeds = seeds if seeds is not None else [1000 + k for k in range(len(rewards))]
    return RunResult(
        [
            EpisodeResult(k, seed, k, 0, 10, float(r), True, False, s, 0.1, 0.1, 0.1)
            for k, (r, s, seed) in enumerate(zip(rewards, successes, seeds, strict=True))
        ],
        base_seed=0,
    )


def success_table(both, only_a, only_b, neither):
    """Two runs' success verdicts, pair by pair, in a shuffled order."""
    pairs = [(True, True)] * both + [(True, False)] * only_a + [(False, True)] * only_b
    pairs += [(False, False)] * neither
    order = np.random.default_rng(both + 7 * only_a + 13 * only_b + neither).permutation(len(pairs))
    pairs = [pairs[k] for k in order]
    return [a for a, _ in pairs], [b for _, b in pairs]


def scipy_mcnemar(only_a, only_b):
    if only_a + only_b == 0:
        return 1.0
    return binomtest(min(only_a, only_b), only_a + only_b, 0.5).pvalue


# ---------------------------------------------------------------------------- McNemar


TABLES = [
    pytest.param(10, 0, 0, 5, id="no-discordant-pairs"),
    pytest.param(0, 0, 12, 0, id="all-discordant-one-way"),
    pytest.param(3, 9, 0, 1, id="all-discordant-the-other-way"),
    pytest.param(20, 4, 11, 15, id="mixed"),
    pytest.param(1, 1, 2, 0, id="small"),
    pytest.param(0, 0, 1, 0, id="one-pair"),
    pytest.param(1500, 1100, 1180, 1220, id="large"),
]


@pytest.mark.parametrize(("both", "only_a", "only_b", "neither"), TABLES)
def test_mcnemar_p_equals_scipy_binomtest_of_the_discordant_pairs(
    tmp_path, both, only_a, only_b, neither
):
    success_a, success_b = success_table(both, only_a, only_b, neither)
    n = len(success_a)
    a = write_run(tmp_path / "a.jsonl", [record(k, 0, success_a[k]) for k in range(n)])
    b = write_run(tmp_path / "b.jsonl", [record(k, 0, success_b[k]) for k in range(n)])
    success = compare(a, b, resamples=200)["overall"]["success"]
    assert (success["both"], success["only_a"], success["only_b"], success["neither"]) == (
        both, only_a, only_b, neither,
    )  # fmt: skip
    assert success["mcnemar_p"] == pytest.approx(scipy_mcnemar(only_a, only_b), rel=1e-9)
    assert success["rate_a"] == (both + only_a) / n
    assert success["rate_b"] == (both + only_b) / n
    assert success["difference"] == pytest.approx((only_b - only_a) / n, abs=1e-15)


def test_mcnemar_p_equals_scipy_over_a_grid_and_at_millions_of_pairs():
    for discordant in range(1, 41):
        for fewer in range(discordant + 1):
            expected = scipy_mcnemar(fewer, discordant - fewer)
            assert mcnemar_exact_p(fewer, discordant - fewer) == pytest.approx(expected, rel=1e-9)
            assert mcnemar_exact_p(discordant - fewer, fewer) == pytest.approx(expected, rel=1e-9)
    for only_a, only_b in [(4_990, 5_210), (200_000, 201_000), (1_000_000, 1_002_500), (10, 990)]:
        expected = scipy_mcnemar(only_a, only_b)
        assert mcnemar_exact_p(only_a, only_b) == pytest.approx(expected, rel=1e-6)


# ---------------------------------------------------------------------------- Newcombe


def newcombe_reference(both, only_a, only_b, neither, confidence):
    """Newcombe's (1998) method 10, from scipy's Wilson intervals."""
    n = both + only_a + only_b + neither
    k_a, k_b = both + only_a, both + only_b
    p_a, p_b = k_a / n, k_b / n
    ci_a = binomtest(k_a, n).proportion_ci(confidence_level=confidence, method="wilson")
    ci_b = binomtest(k_b, n).proportion_ci(confidence_level=confidence, method="wilson")
    margins = (both + only_a) * (only_b + neither) * (both + only_b) * (only_a + neither)
    phi = 0.0 if margins == 0 else (both * neither - only_a * only_b) / math.sqrt(margins)
    d1, e1 = p_b - ci_b.low, ci_a.high - p_a
    d2, e2 = ci_b.high - p_b, p_a - ci_a.low
    low = (p_b - p_a) - math.sqrt(max(0.0, d1 * d1 - 2 * phi * d1 * e1 + e1 * e1))
    high = (p_b - p_a) + math.sqrt(max(0.0, d2 * d2 - 2 * phi * d2 * e2 + e2 * e2))
    return low, high


@pytest.mark.parametrize(("both", "only_a", "only_b", "neither"), TABLES)
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_success_difference_ci_is_newcombes_paired_interval(
    both, only_a, only_b, neither, confidence
):
    success_a, success_b = success_table(both, only_a, only_b, neither)
    result = compare(
        run_result([0] * len(success_a), success_a),
        run_result([0] * len(success_b), success_b),
        confidence=confidence,
        resamples=100,
    )
    low, high = result["overall"]["success"]["difference_ci"]
    expected = newcombe_reference(both, only_a, only_b, neither, confidence)
    assert (low, high) == pytest.approx(expected, abs=1e-12)
    assert -1.0 <= low <= result["overall"]["success"]["difference"] <= high <= 1.0


def test_newcombes_interval_covers_the_true_difference_about_as_often_as_it_says():
    rng = np.random.default_rng(5)
    # Paired outcomes with rates 0.6 (a) and 0.75 (b), positively correlated.
    cells = np.array([0.55, 0.05, 0.20, 0.20])  # both, only a, only b, neither
    truth = (cells[0] + cells[2]) - (cells[0] + cells[1])
    trials = 400
    covered = 0
    for _ in range(trials):
        both, only_a, only_b, neither = rng.multinomial(40, cells)
        low, high = paired_rate_difference_ci(both, only_a, only_b, neither, 0.95)
        covered += low <= truth <= high
    assert 0.91 <= covered / trials <= 0.99


# ---------------------------------------------------------------------------- the bootstrap


def paired_bootstrap_reference(a, b, confidence, resamples, seed):
    """Resample pairs, difference their means: the paired bootstrap, written out."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    picks = np.random.default_rng(seed).integers(0, a.size, size=(resamples, a.size))
    differences = b[picks].mean(axis=1) - a[picks].mean(axis=1)
    tail = (1 - confidence) / 2
    return tuple(np.quantile(differences, [tail, 1 - tail]))


@pytest.mark.parametrize(
    ("n", "confidence", "seed"), [(12, 0.95, 0), (200, 0.9, 3), (57, 0.99, 11)]
)
def test_return_difference_ci_is_the_paired_bootstrap(n, confidence, seed):
    rng = np.random.default_rng(n)
    rewards_a = rng.normal(10, 3, n)
    rewards_b = rewards_a + rng.normal(0.5, 1, n)  # paired: b tracks a
    result = compare(
        run_result(rewards_a),
        run_result(rewards_b),
        confidence=confidence,
        resamples=5_000,
        seed=seed,
    )
    overall = result["overall"]
    expected = paired_bootstrap_reference(rewards_a, rewards_b, confidence, 5_000, seed)
    assert overall["mean_return_difference_ci"] == pytest.approx(expected, abs=1e-9)
    assert overall["mean_return_difference"] == pytest.approx(np.mean(rewards_b - rewards_a))
    assert overall["mean_return_a"] == pytest.approx(np.mean(rewards_a))
    # The same seed, the same interval; another seed, another draw.
    again = compare(
        run_result(rewards_a), run_result(rewards_b), confidence=confidence, resamples=5_000,
        seed=seed,
    )  # fmt: skip
    assert again == result
    other = compare(
        run_result(rewards_a), run_result(rewards_b), confidence=confidence, resamples=5_000,
        seed=seed + 1,
    )  # fmt: skip
    assert other["overall"]["mean_return_difference_ci"] != overall["mean_return_difference_ci"]


def test_return_difference_ci_of_many_pairs_is_the_bootstraps_within_its_noise():
    rng = np.random.default_rng(1)
    rewards_a = rng.exponential(20, 6_000)
    rewards_b = rewards_a + rng.normal(1.0, 5.0, rewards_a.size)
    low, high = compare(run_result(rewards_a), run_result(rewards_b), resamples=2_000)["overall"][
        "mean_return_difference_ci"
    ]
    expected_low, expected_high = paired_bootstrap_reference(rewards_a, rewards_b, 0.95, 2_000, 0)
    width = expected_high - expected_low
    assert low == pytest.approx(expected_low, abs=0.05 * width)
    assert high == pytest.approx(expected_high, abs=0.05 * width)


def test_a_run_compared_to_itself_differs_by_nothing(tmp_path):
    rng = np.random.default_rng(2)
    rewards = rng.normal(0, 1, 30)
    successes = [bool(s) for s in rng.integers(0, 2, 30)]
    path = write_run(tmp_path / "a.jsonl", [record(k, rewards[k], successes[k]) for k in range(30)])
    result = compare(path, path)
    overall = result["overall"]
    assert overall["mean_return_difference"] == 0.0
    assert overall["mean_return_difference_ci"] == [0.0, 0.0]
    assert overall["return_wins"] == {"b": 0, "a": 0, "tie": 30}
    success = overall["success"]
    assert success["difference"] == 0.0 and success["mcnemar_p"] == 1.0
    assert success["only_a"] == success["only_b"] == 0
    low, high = success["difference_ci"]
    assert low < 0 < high  # no discordant pair is not certainty at n = 30


# ---------------------------------------------------------------------------- suites


def suite_records(rng, tasks, successful):
    records = {}
    for task, n in tasks.items():
        rewards = rng.normal(5, 2, n)
        records[task] = [
            record(k, rewards[k], bool(rng.random() < successful), task=task, seed=7 * k + 1)
            for k in range(n)
        ]
    return records


def test_a_suite_gets_a_row_per_task_and_an_overall_weighing_tasks_alike(tmp_path):
    rng = np.random.default_rng(3)
    tasks = {"reach": 12, "pick": 20, "place": 8}
    runs = {"a": suite_records(rng, tasks, 0.4), "b": suite_records(rng, tasks, 0.7)}
    paths = {
        side: write_run(tmp_path / f"{side}.jsonl", [r for rs in by_task.values() for r in rs])
        for side, by_task in runs.items()
    }
    result = compare(paths["a"], paths["b"], resamples=1_000, seed=4)
    assert [row["task"] for row in result["tasks"]] == sorted(tasks)
    for row in result["tasks"]:
        # A task's row is the comparison of that task's episodes alone.
        alone = {
            side: write_run(
                tmp_path / f"{side}-{row['task']}.jsonl",
                [{**r, "task": None} for r in runs[side][row["task"]]],
            )
            for side in runs
        }
        expected = compare(alone["a"], alone["b"], resamples=1_000, seed=4)["overall"]
        assert row == {**expected, "task": row["task"]}
    overall = result["overall"]
    rows = result["tasks"]
    assert overall["pairs"] == sum(tasks.values())
    assert overall["mean_return_difference"] == pytest.approx(
        np.mean([row["mean_return_difference"] for row in rows])
    )
    assert overall["success"]["difference"] == pytest.approx(
        np.mean([row["success"]["difference"] for row in rows])
    )
    pooled = {cell: sum(row["success"][cell] for row in rows) for cell in ("only_a", "only_b")}
    assert overall["success"]["mcnemar_p"] == pytest.approx(
        scipy_mcnemar(pooled["only_a"], pooled["only_b"]), rel=1e-9
    )
    assert overall["return_wins"] == {
        key: sum(row["return_wins"][key] for row in rows) for key in ("a", "b", "tie")
    }

    # The stratified paired bootstrap: pairs resampled within each task, tasks averaged.
    def differences(task, field):
        pairs = zip(runs["a"][task], runs["b"][task], strict=True)
        return np.array([float(y[field]) - float(x[field]) for x, y in pairs])

    for name, field in (("mean_return_difference_ci", "reward"), ("success", "success")):
        values = [differences(task, field) for task in sorted(tasks)]
        rng_reference = np.random.default_rng(4)
        means = np.zeros(1_000)
        for group in values:  # one block: the groups drawn one after another
            means += group[rng_reference.integers(0, group.size, (1_000, group.size))].mean(axis=1)
        expected = np.quantile(means / len(values), [0.025, 0.975])
        got = overall[name] if name != "success" else overall["success"]["difference_ci"]
        assert got == pytest.approx(expected, abs=1e-12)
    assert BOOTSTRAP_BLOCK >= 1_000  # the reference above draws as one block does


def test_stratified_bootstrap_of_one_group_is_the_plain_bootstrap():
    values = np.random.default_rng(0).normal(0, 1, 50)
    assert stratified_bootstrap_mean_ci([values], 0.9, 3_000, 5) == bootstrap_mean_ci(
        values, 0.9, 3_000, 5
    )
    big = [np.random.default_rng(k).normal(k, 1 + k, 3_000) for k in range(3)]
    low, high = stratified_bootstrap_mean_ci(big)  # the normal limit
    center = np.mean([group.mean() for group in big])
    spread = math.sqrt(sum(group.var() / group.size for group in big)) / 3
    assert (low, high) == pytest.approx((center - 1.959964 * spread, center + 1.959964 * spread))


def test_a_task_without_success_verdicts_says_so_and_the_overall_too(tmp_path):
    a = [record(k, k, None if task == "push" else True, task=task) for task in ("pick", "push")
         for k in range(4)]  # fmt: skip
    b = [record(k, k + 1, True, task=task) for task in ("pick", "push") for k in range(4)]
    result = compare(write_run(tmp_path / "a.jsonl", a), write_run(tmp_path / "b.jsonl", b))
    pick, push = result["tasks"]
    assert pick["success"]["pairs"] == 4 and pick["success_missing"] is None
    assert push["success"] is None and push["success_missing"] == "a"
    assert result["overall"]["success"] is None
    assert result["overall"]["success_missing"] == "task 'push'"
    assert "n/a: not available in a" in format_comparison(result)


def test_success_not_available_is_null_never_a_number(tmp_path):
    a = write_run(tmp_path / "a.jsonl", [record(k, k) for k in range(5)])
    b = write_run(tmp_path / "b.jsonl", [record(k, k, k % 2 == 0) for k in range(5)])
    for first, second, missing in ((a, b, "a"), (b, a, "b"), (a, a, "a and b")):
        result = compare(first, second)
        assert result["overall"]["success"] is None
        assert result["overall"]["success_missing"] == missing
        parsed = json.loads(dumps(result))
        assert parsed["overall"]["success"] is None
        assert f"n/a: not available in {missing}" in format_comparison(result)


# ---------------------------------------------------------------------------- env errors


def test_pairs_with_an_env_error_are_left_out_and_counted(tmp_path):
    rng = np.random.default_rng(8)
    rewards_a, rewards_b = rng.normal(0, 1, 20), rng.normal(1, 1, 20)
    erred_a, erred_b = {3, 7}, {7, 12}
    a = [
        record(k, rewards_a[k], True, error="EnvError: boom" if k in erred_a else None)
        for k in range(20)
    ]
    b = [
        record(k, rewards_b[k], k % 3 == 0, error="RuntimeError: gone" if k in erred_b else None)
        for k in range(20)
    ]
    result = compare(write_run(tmp_path / "a.jsonl", a), write_run(tmp_path / "b.jsonl", b))
    kept = [k for k in range(20) if k not in erred_a | erred_b]
    assert result["pairs"] == len(kept)
    assert result["excluded_for_errors"] == {
        "pairs": 3, "a": 2, "b": 2,
        "first": [{"task": None, "index": k} for k in (3, 7, 12)],
    }  # fmt: skip
    assert result["a"]["errors"] == 2 and result["b"]["errors"] == 2
    clean = compare(run_result(rewards_a[kept]), run_result(rewards_b[kept]))
    assert result["overall"]["mean_return_difference"] == pytest.approx(
        clean["overall"]["mean_return_difference"]
    )
    assert result["overall"]["return_wins"] == clean["overall"]["return_wins"]
    assert result["overall"]["success"]["pairs"] == len(kept)
    assert "3 pairs left out for env errors (a 2, b 2)" in format_comparison(result)


# ---------------------------------------------------------------------------- refusals


def test_runs_whose_seeds_differ_are_refused_naming_the_first_pair(tmp_path):
    a = write_run(tmp_path / "a.jsonl", [record(k, k, seed=k + 1) for k in range(6)])
    b = write_run(
        tmp_path / "b.jsonl", [record(k, k, seed=k + 1 if k < 4 else 99 + k) for k in range(6)]
    )
    with pytest.raises(RunsNotPairedError, match=r"episode 4 has seed 5 in .*a.jsonl and 103 in"):
        compare(a, b)
    with pytest.raises(RunsNotPairedError, match="seeds differ"):
        compare(a, b, intersection=True)  # the intersection does not pair other seeds either


def test_runs_of_different_base_seeds_are_refused_saying_so(tmp_path):
    a = write_run(tmp_path / "a.jsonl", [record(k, k, seed=10 + k) for k in range(3)], seed=0)
    b = write_run(tmp_path / "b.jsonl", [record(k, k, seed=20 + k) for k in range(3)], seed=1)
    with pytest.raises(RunsNotPairedError, match=r"base seeds 0 and 1\): episode 0 has seed 10"):
        compare(a, b)


def test_a_suite_task_whose_seeds_differ_is_named(tmp_path):
    a = [record(k, 0, task=task, seed=k) for task in ("x", "y") for k in range(3)]
    b = [record(k, 0, task=task, seed=k + (task == "y")) for task in ("x", "y") for k in range(3)]
    with pytest.raises(RunsNotPairedError, match="task 'y' episode 0 has seed 0 in"):
        compare(write_run(tmp_path / "a.jsonl", a), write_run(tmp_path / "b.jsonl", b))


def test_episodes_in_one_run_only_are_refused_or_left_out_when_asked(tmp_path):
    a = write_run(tmp_path / "a.jsonl", [record(k, k, True) for k in range(20)])
    b = write_run(tmp_path / "b.jsonl", [record(k, 2 * k, True) for k in range(13)])
    with pytest.raises(RunsNotPairedError) as refused:
        compare(a, b)
    message = str(refused.value)
    assert "7 episodes of" in message and "are not in" in message
    assert "(episode 13, episode 14, episode 15, episode 16, episode 17, ...)" in message
    assert "--intersection" in message
    result = compare(a, b, intersection=True)
    assert (result["pairs"], result["only_in_a"], result["only_in_b"]) == (13, 7, 0)
    assert result["overall"]["mean_return_difference"] == pytest.approx(np.mean(range(13)))
    assert "7 only in a, 0 only in b left out" in format_comparison(result)
    with pytest.raises(RunsNotPairedError, match=r"1 episode of .*b2.jsonl is not in"):
        compare(a, write_run(tmp_path / "b2.jsonl", [record(k, k) for k in range(21)]))


def test_a_suite_against_a_run_that_is_not_one_is_refused(tmp_path):
    suite = write_run(
        tmp_path / "suite.jsonl",
        [record(k, k, task=t) for t in ("pick", "place") for k in range(3)],
    )
    single = write_run(tmp_path / "single.jsonl", [record(k, k) for k in range(3)])
    for first, second in ((suite, single), (single, suite)):
        with pytest.raises(
            RunsNotPairedError, match=r"suite.jsonl is a suite \(tasks pick, place\)"
        ):
            compare(first, second, intersection=True)


def test_unseeded_episodes_and_runs_with_nothing_in_common_are_refused(tmp_path):
    unseeded = RunResult([EpisodeResult(0, None, 0, 0, 5, 5.0, True, False, None, 0, 0, 0)], 0)
    with pytest.raises(RunsNotPairedError, match="episode 0 has no seed in RunResult a"):
        compare(unseeded, unseeded)
    a = write_run(tmp_path / "a.jsonl", [record(k, k) for k in range(3)])
    b = write_run(tmp_path / "b.jsonl", [record(k + 3, k) for k in range(3)])
    with pytest.raises(RunsNotPairedError, match="no episode in common"):
        compare(a, b, intersection=True)


def test_bad_arguments_and_files_are_refused_saying_what_was_expected(tmp_path):
    run = run_result([1.0, 2.0])
    for kwargs, match in [
        ({"confidence": 1.5}, r"confidence must be in \(0, 1\)"),
        ({"confidence": "0.9"}, "confidence must be a number"),
        ({"resamples": 0}, "resamples must be a positive integer"),
        ({"seed": -1}, "seed must be a non-negative integer"),
    ]:
        with pytest.raises(ValueError, match=match):
            compare(run, run, **kwargs)
    with pytest.raises(TypeError, match="a results file's path or a RunResult, got list"):
        compare([1, 2], run)
    not_results = tmp_path / "x.jsonl"
    not_results.write_text('{"hello": 1}\n')
    with pytest.raises(ResultsFileError, match="is this an rlmesh results file"):
        compare(not_results, run)
    with pytest.raises(ResultsFileError, match="cannot read it"):
        compare(tmp_path / "missing.jsonl", run)
    twice = write_run(tmp_path / "twice.jsonl", [record(0, 1), record(0, 2)])
    with pytest.raises(ResultsFileError, match="line 3 repeats episode index 0"):
        compare(twice, run)


def test_a_cut_off_last_line_is_skipped_with_a_warning(tmp_path):
    path = write_run(tmp_path / "a.jsonl", [record(k, k) for k in range(4)])
    path.write_text(path.read_text() + dumps(record(4, 4))[:20])
    with pytest.warns(UserWarning, match="cut off mid-write"):
        result = compare(path, run_result([0, 1, 2, 3]))
    assert result["pairs"] == 4


# ---------------------------------------------------------------------------- output


def test_infinite_returns_stay_strict_json():
    result = compare(run_result([1.0, 2.0, 3.0]), run_result([1.0, 2.0, math.inf]))
    text = dumps(result)
    parsed = json.loads(text, parse_constant=lambda token: pytest.fail(f"not strict: {token}"))
    assert parsed["overall"]["mean_return_difference"] == "Infinity"
    assert parsed["overall"]["return_wins"] == {"b": 1, "a": 0, "tie": 2}
    both_infinite = compare(run_result([math.inf]), run_result([math.inf]))
    assert both_infinite["overall"]["mean_return_difference"] is None  # inf - inf: no figure


def test_the_table_notes_runs_of_different_envs(tmp_path):
    a = write_run(tmp_path / "a.jsonl", [record(k, k) for k in range(3)], env="CartPole-v1")
    b = write_run(tmp_path / "b.jsonl", [record(k, k) for k in range(3)], env="Acrobot-v1")
    assert "the runs' envs differ (a CartPole-v1, b Acrobot-v1)" in format_comparison(compare(a, b))
    assert "envs differ" not in format_comparison(compare(a, a))


def test_the_table_names_the_direction_and_the_methods():
    result = compare(run_result([1, 2, 3], [False, True, False]), run_result([2, 2, 5], [True] * 3))
    text = format_comparison(result)
    assert text.splitlines()[0].startswith("b - a:") and "positive means b did better" in text
    for words in ("paired bootstrap", "10000 resamples, seed 0", "Newcombe", "McNemar's exact"):
        assert words in text
    assert "+1.000 [" in text and "2/0/1" in text and "+66.7% [" in text


def test_import_rlmesh_stays_light_and_compare_loads_on_first_use():
    code = (
        "import sys, rlmesh; assert 'rlmesh.report' not in sys.modules; "
        "assert rlmesh.compare is __import__('rlmesh.report', fromlist=['compare']).compare"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert "compare" in rlmesh.__all__


@pytest.mark.parametrize("module_name", ["rlmesh.report.compare", "rlmesh.report"])
def test_docstring_examples_hold(module_name):
    result = doctest.testmod(importlib.import_module(module_name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_a_task_whose_every_pair_erred_keeps_its_row_without_figures(tmp_path):
    a = [record(k, k, True, task=task) for task in ("pick", "push") for k in range(3)]
    b = [
        record(k, k + 1, True, task=task, error="EnvError: crashed" if task == "push" else None)
        for task in ("pick", "push")
        for k in range(3)
    ]
    result = compare(write_run(tmp_path / "a.jsonl", a), write_run(tmp_path / "b.jsonl", b))
    pick, push = result["tasks"]
    assert pick["pairs"] == 3 and pick["mean_return_difference"] == 1.0
    assert push["pairs"] == 0 and push["mean_return_difference"] is None
    assert push["mean_return_difference_ci"] == [None, None] and push["success"] is None
    assert result["overall"]["mean_return_difference"] is None
    assert result["overall"]["pairs"] == 3
    assert result["excluded_for_errors"]["pairs"] == 3
    json.loads(dumps(result), parse_constant=pytest.fail)
    assert "push" in format_comparison(result)


# ---------------------------------------------------------------------------- real suite files

SUITE_TOML = """
name = "pairs"

[defaults]
episodes = 4
max_episode_steps = 40

[[task]]
name = "cartpole"
env = "CartPole-v1"
seed = 5

[[task]]
name = "acrobot"
env = "Acrobot-v1"
episodes = 3
"""

POLICIES = """
import numpy as np


def lean(obs):
    if obs.shape == (4,):
        return int(obs[2] + 0.3 * obs[3] > 0)
    return int(np.sign(obs[4]) + 1)


def left(obs):
    return 0
"""


def _expected_rows(path_a, path_b):
    """Per task, the pairs and mean return difference b - a, from the files read by task."""
    _, runs_a = read_suite(path_a)
    _, runs_b = read_suite(path_b)
    rows = {}
    for name, run_a in runs_a.items():
        a = {episode.index: episode.reward for episode in run_a.episodes}
        b = {episode.index: episode.reward for episode in runs_b[name].episodes}
        assert a.keys() == b.keys()
        rows[name] = (len(a), float(np.mean([b[k] - a[k] for k in a])))
    return rows


def _check_suite_comparison(result, path_a, path_b):
    expected = _expected_rows(path_a, path_b)
    assert {row["task"]: row["pairs"] for row in result["tasks"]} == {
        name: pairs for name, (pairs, _) in expected.items()
    }
    for row in result["tasks"]:
        assert row["mean_return_difference"] == pytest.approx(expected[row["task"]][1])
    assert result["pairs"] == sum(pairs for pairs, _ in expected.values())


def test_cli_compare_reads_suite_files_written_by_eval_suite(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "suite.toml").write_text(SUITE_TOML)
    (tmp_path / "pols.py").write_text(POLICIES)
    for name in ("lean", "left"):
        argv = ["eval", f"pols.py:{name}", "--suite", "suite.toml", "--out", f"{name}.jsonl"]
        assert main([*argv, "--no-progress", "--json"]) == 0
    capsys.readouterr()
    # Every suite file holds a task header line per task: the comparison reads past them.
    assert (tmp_path / "lean.jsonl").read_text().count('"rlmesh_task"') == 2
    assert main(["compare", "lean.jsonl", "left.jsonl", "--json"]) == 0, capsys.readouterr().err
    result = json.loads(capsys.readouterr().out)
    _check_suite_comparison(result, tmp_path / "lean.jsonl", tmp_path / "left.jsonl")
    assert main(["compare", "lean.jsonl", "left.jsonl"]) == 0
    table = capsys.readouterr().out
    assert "cartpole" in table and "acrobot" in table and "overall" in table


@pytest.mark.parametrize("core", CORES)
def test_compare_reads_suite_files_written_by_run_suite(core, tmp_path):
    (tmp_path / "suite.toml").write_text(SUITE_TOML)
    namespace: dict = {}
    exec(POLICIES, namespace)
    paths = {}
    for name in ("lean", "left"):
        paths[name] = tmp_path / f"{name}.jsonl"
        rlmesh.run_suite(
            namespace[name], tmp_path / "suite.toml", num_envs=2, core=core,
            results_path=paths[name],
        )  # fmt: skip
    result = compare(paths["lean"], paths["left"])
    _check_suite_comparison(result, paths["lean"], paths["left"])
    same = compare(paths["lean"], paths["lean"])
    assert same["overall"]["mean_return_difference"] == 0.0
    assert {row["task"]: row["pairs"] for row in same["tasks"]} == {"cartpole": 4, "acrobot": 3}
