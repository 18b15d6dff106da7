"""Every JSON rlmesh writes is strict: non-finite floats are the strings "Infinity",
"-Infinity" and "NaN", read back as floats, and intervals stay right with infinite values."""

from __future__ import annotations

import json
import math

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from gymnasium import spaces
from helpers import CORES
from rlmesh.cli import main
from rlmesh.errors import ResultsFileError
from rlmesh.results import decode_float, dumps, read_columns, read_run
from rlmesh.stats import bootstrap_mean_ci


def strict_loads(text: str):
    """json.loads that refuses the bare NaN / Infinity tokens Python's json accepts."""

    def refuse(token):
        raise ValueError(f"not strict JSON: {token}")

    return json.loads(text, parse_constant=refuse)


class Jackpot(gym.Env):
    """One-step episodes; the reward is +inf for seeds divisible by 3, else 1.0 or 2.0."""

    observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.seed_ = seed
        return np.zeros(1, np.float32), {}

    def step(self, action):
        reward = math.inf if self.seed_ % 3 == 0 else 1.0 + self.seed_ % 2
        return np.zeros(1, np.float32), reward, True, False, {}


@pytest.mark.parametrize("core", CORES)
def test_an_infinite_reward_is_written_strictly_and_read_back(core, tmp_path, capsys):
    path = tmp_path / "jackpot.jsonl"
    result = rlmesh.run(lambda obs: 0, Jackpot, seeds=[3, 4, 5, 7], core=core, results_path=path)
    assert [episode.reward for episode in result.episodes] == [math.inf, 1.0, 2.0, 2.0]
    lines = [strict_loads(line) for line in path.read_text().splitlines()]
    assert lines[1]["reward"] == "Infinity"
    _, on_file, _ = read_run(path)
    assert on_file.episodes == result.episodes
    assert read_columns(path)[1].reward.tolist() == [math.inf, 1.0, 2.0, 2.0]

    assert main(["report", str(path), "--json"]) == 0
    summary = strict_loads(capsys.readouterr().out)
    assert (
        summary["mean_reward"] == "Infinity" and summary["iqm_reward"] == 2.0
    )  # the middle of [1, 2, 2, inf]
    lo, hi = summary["mean_reward_ci95"]
    assert isinstance(lo, float) and math.isfinite(lo) and hi == "Infinity"


def test_the_bootstrap_of_1_2_inf_has_a_finite_lower_and_an_infinite_upper_bound():
    values = np.array([1.0, 2.0, math.inf])
    lo, hi = bootstrap_mean_ci(values)
    # Reference: plain numpy resampling, with inf stood in for by a huge finite value (a
    # resample that drew it has a mean above 1e299, one that did not at most 2).
    rng = np.random.default_rng(0)
    means = np.where(values == math.inf, 1e300, values)[rng.integers(0, 3, (10_000, 3))].mean(1)
    ref_lo, ref_hi = np.quantile(means, [0.025, 0.975])
    assert lo == ref_lo and ref_hi > 1e299 and hi == math.inf
    assert bootstrap_mean_ci([math.inf, 1.0]) == (1.0, math.inf)
    assert bootstrap_mean_ci([math.inf, math.inf]) == (math.inf, math.inf)
    assert bootstrap_mean_ci([-math.inf, 5.0, 5.0]) == (-math.inf, 5.0)
    assert all(math.isnan(bound) for bound in bootstrap_mean_ci([math.inf, -math.inf, 1.0]))
    assert all(math.isnan(bound) for bound in bootstrap_mean_ci([math.nan, 1.0]))


def test_dumps_is_strict_and_decode_float_reverses_it():
    record = {"a": math.inf, "b": [-math.inf, {"c": math.nan}], "d": 1.5, "e": None}
    text = dumps(record)
    assert strict_loads(text) == {"a": "Infinity", "b": ["-Infinity", {"c": "NaN"}], "d": 1.5,
                                  "e": None}  # fmt: skip
    assert decode_float("Infinity", "x") == math.inf
    assert decode_float("-Infinity", "x") == -math.inf
    assert math.isnan(decode_float("NaN", "x"))
    assert decode_float(3, "x") == 3.0
    with pytest.raises(ResultsFileError, match="file, line 2, field 'reward' is 'inf'"):
        decode_float("inf", "file, line 2, field 'reward'")
    with pytest.raises(ResultsFileError, match="is True; expected a number"):
        decode_float(True, "x")


def test_eval_json_output_is_strict(capsys):
    assert main(["demo", "--episodes", "2", "--no-progress", "--json"]) == 0
    strict_loads(capsys.readouterr().out)


def test_telemetry_with_non_finite_figures_round_trips(tmp_path):
    from rlmesh.results import ResultsFile, RunResult, TelemetryRow

    path = tmp_path / "telemetry.jsonl"
    nan = math.nan
    rows = (
        TelemetryRow("env.step", "latency", "ms", 3, math.inf, 1.0, 2.0, 3.0, math.inf),
        TelemetryRow("driver", "lane-steps", "1/s", 9, 100.0, nan, nan, nan, nan),
    )
    with ResultsFile.open(path, {"episodes": 0}, resume=False) as out:
        out.append_run(RunResult((), base_seed=0, telemetry=rows))
    for line in path.read_text().splitlines():
        strict_loads(line)
    _, result, _ = read_run(path)
    assert repr(result.telemetry) == repr(rows)  # nan == nan only as text
