"""EpisodeResult and RunResult: built from either core's summaries, sorted, summarized, shown."""

from __future__ import annotations

import dataclasses
import doctest
import importlib
import math
import pickle

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from rlmesh.adapters import compile_spec
from rlmesh.results import EpisodeResult, RunResult, TelemetryRow


def episode(index: int, **changes) -> EpisodeResult:
    fields = {
        "index": index,
        "seed": 100 + index,
        "trial": index,
        "env_index": 0,
        "steps": 10,
        "reward": 1.0,
        "terminated": True,
        "truncated": False,
        "success": None,
        "duration_s": 0.5,
        "predict_ms": 0.1,
        "step_ms": 0.2,
    }
    return EpisodeResult(**{**fields, **changes})


def real_summaries(core) -> list:
    """Two summaries from a real RoundRunner: lane 1 ends first (slot 1), then lane 0. The
    first round's 7 ns of model time and 20 ns of env time are shared by both lanes (4 + 3 and
    10 + 10 ns); the second round's 9 and 30 ns are lane 0's alone."""
    space, actions = gym.spaces.Box(-1, 1, (1,), np.float32), gym.spaces.Discrete(2)
    plan = compile_spec(None, space, actions)
    runner = core.RoundRunner(2, 2, plan.observation, plan.action, base_seed=3, trial_index_base=10)
    starts = runner.start([0, 1], now_ns=0)
    runner.set_observations(starts.lanes, [np.zeros(1, np.float32)] * 2)
    runner.begin_round()
    runner.take_actions(np.zeros(2, np.int64), 7)
    ended, _ = runner.end_round([1.0, 2.5], [False, True], [False, False], 20, 2_000_000_000)
    first, _, _ = runner.finish(ended, [True])
    runner.begin_round()
    runner.take_actions(np.zeros(1, np.int64), 9)
    ended, _ = runner.end_round([0.5], [False], [True], 30, 3_000_000_000)
    second, _, _ = runner.finish(ended, [None])
    return first + second


def test_from_summary_copies_every_field_but_the_episode_id(core):
    summaries = real_summaries(core)
    results = [EpisodeResult.from_summary(summary) for summary in summaries]
    assert results[0] == EpisodeResult(
        index=1,
        seed=core.episode_seed(3, 11),
        trial=11,
        env_index=1,
        steps=1,
        reward=2.5,
        terminated=True,
        truncated=False,
        success=True,
        duration_s=2.0,
        predict_ms=3 / 1e6,
        step_ms=10 / 1e6,
        success_reported=True,  # the core's summary held the env's verdict
        reset_digest=core.value_digest(np.zeros(1, np.float32)),  # its first observation's
        trajectory_digest=summaries[0].trajectory_digest,
    )
    assert results[1].index == 0 and results[1].success is None and results[1].truncated
    assert not results[1].success_reported
    for summary, result in zip(summaries, results, strict=True):
        expected = summary.to_dict()
        del expected["episode_id"]
        expected["success_reported"] = summary.success is not None
        digests = {name: expected.pop(name) for name in ("reset_digest", "trajectory_digest")}
        if expected.pop("error") is not None:  # an optional field: on a line only when set
            expected["error"] = summary.error
        expected.update(digests)  # the last optional fields
        assert result.to_dict() == expected
        assert list(result.to_dict()) == list(expected)  # the same field order


def test_both_cores_summaries_give_equal_results():
    from rlmesh.core import load_core

    python, rust = (
        [EpisodeResult.from_summary(s) for s in real_summaries(load_core(name))]
        for name in ("python", "rust")
    )
    assert python == rust


def test_results_are_frozen_and_plain():
    result = episode(0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.reward = 2.0  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(result)) == result


def test_a_run_sorts_its_episodes_by_index_and_holds_tuples():
    run = RunResult([episode(2), episode(0), episode(1)], base_seed=None, telemetry=[])
    assert [e.index for e in run.episodes] == [0, 1, 2]
    assert isinstance(run.episodes, tuple) and run.telemetry == ()
    assert run.base_seed is None and run.wasted_steps == 0


def test_run_properties():
    run = RunResult(
        (episode(1, steps=7, reward=-1.0), episode(0, steps=5, reward=4.0)),
        base_seed=0,
        wasted_steps=3,
    )
    assert (run.num_episodes, run.total_steps, run.mean_reward) == (2, 12, 1.5)
    assert run.wasted_steps == 3


def test_the_success_rate_counts_verdicts_and_never_termination():
    run = RunResult(
        (
            episode(0, success=True, terminated=False),
            episode(1, success=False, terminated=True),
            episode(2, success=None, terminated=True),  # no verdict: not counted either way
            episode(3, success=None, terminated=False, truncated=True),
        ),
        base_seed=0,
    )
    assert run.success_rate == 0.5
    unjudged = RunResult((episode(0, terminated=True), episode(1)), base_seed=0)
    assert unjudged.success_rate is None


def test_an_empty_run_has_no_mean_reward_or_success_rate():
    run = RunResult((), base_seed=0)
    assert run.num_episodes == run.total_steps == 0
    assert math.isnan(run.mean_reward) and run.success_rate is None


def test_format_telemetry_aligns_every_row_and_shows_nan_as_a_dash():
    nan = math.nan
    rows = (
        TelemetryRow("model.predict", "latency", "ms", 1200, 3.25, 3.1, 5.0, 7.5, 12.25),
        TelemetryRow("driver", "lane-steps", "1/s", 96000, 15234.5, nan, nan, nan, nan),
    )
    table = RunResult((), base_seed=0, telemetry=rows).format_telemetry()
    assert table.splitlines() == [
        "op             metric      unit  count        avg    p50    p95    p99     max",
        "model.predict  latency     ms     1200      3.250  3.100  5.000  7.500  12.250",
        "driver         lane-steps  1/s   96000  15234.500      -      -      -       -",
    ]


def test_format_telemetry_without_rows_is_the_header():
    assert RunResult((), base_seed=0).format_telemetry().split() == [
        "op",
        "metric",
        "unit",
        "count",
        "avg",
        "p50",
        "p95",
        "p99",
        "max",
    ]


def test_the_result_types_are_exported():
    assert rlmesh.RunResult is RunResult
    assert rlmesh.EpisodeResult is EpisodeResult
    assert rlmesh.TelemetryRow is TelemetryRow
    assert rlmesh.__all__ == sorted(rlmesh.__all__)


RESULTS_AND_STATS_MODULES = (
    "rlmesh.results",
    "rlmesh.results.records",
    "rlmesh.results.strict",
    "rlmesh.results.lines",
    "rlmesh.results.reader",
    "rlmesh.results.scan",
    "rlmesh.results.file",
    "rlmesh.results.lock",
    "rlmesh.results.success",
    "rlmesh.results.provenance",
    "rlmesh.stats",
    "rlmesh.stats.intervals",
    "rlmesh.stats.summaries",
    "rlmesh.success",
    "rlmesh.provenance",
)


@pytest.mark.parametrize("module_name", RESULTS_AND_STATS_MODULES)
def test_the_results_and_stats_modules_examples_hold(module_name):
    """Every module of the two packages (and the old modules' aliases) has examples, run."""
    module = importlib.import_module(module_name)
    outcome = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert outcome.attempted > 0, f"{module_name} has no docstring example"
    assert outcome.failed == 0


def test_the_old_module_names_still_import_every_name():
    """``rlmesh.success`` and ``rlmesh.provenance`` are aliases of the moved modules."""
    import rlmesh.provenance
    import rlmesh.success
    from rlmesh.results import provenance, success

    for alias, home in ((rlmesh.success, success), (rlmesh.provenance, provenance)):
        for name in alias.__all__:
            assert getattr(alias, name) is getattr(home, name)
        defined = {
            name
            for name, value in vars(home).items()
            if not name.startswith("_") and getattr(value, "__module__", None) == home.__name__
        }
        assert defined <= set(alias.__all__), defined - set(alias.__all__)
