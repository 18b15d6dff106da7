"""The stopping rule of ``until=`` (``rlmesh.stats.stopping``): ``Precision``'s checks, and
``PrefixStop``'s decision over the contiguous prefix of episode indices."""

from __future__ import annotations

import math

import numpy as np
import pytest
import rlmesh
from rlmesh.errors import RlmeshError
from rlmesh.results import EpisodeResult
from rlmesh.stats.sequential import confidence_sequence
from rlmesh.stats.stopping import (
    CAP_REACHED,
    PRECISION_REACHED,
    UNFINISHED,
    Precision,
    PrefixStop,
    stopper_for,
)


def episode(index, success=None, reward=1.0, error=None):
    return EpisodeResult(
        index, index, index, 0, 10, reward, True, False, success, 0.1, 0.1, 0.1, error=error
    )


def first_precise(values, half_width, **kwargs):
    """The first n at which the CS of ``values[:n]`` is within +/-``half_width``."""
    lower, upper = confidence_sequence(np.asarray(values, dtype=float), **kwargs)
    hits = np.flatnonzero((upper - lower) / 2 <= half_width)
    return int(hits[0]) + 1 if len(hits) else None


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "needs one of success= .* not neither"),
        ({"success": 0.05, "reward": 1.0}, "not both"),
        ({"success": 0.0}, r"half-width must be in \(0, 0.5\)"),
        ({"success": -0.1}, r"half-width must be in \(0, 0.5\)"),
        ({"success": 1.0}, r"half-width must be in \(0, 0.5\)"),
        ({"success": 0.5}, "0.5 is met before any episode"),
        ({"success": "0.05"}, "must be a number"),
        ({"success": float("nan")}, "must be a number"),
        ({"success": 0.05, "reward_bounds": (0, 1)}, "takes no reward_bounds"),
        ({"reward": 0.0}, "must be a positive number"),
        ({"reward": math.inf}, "must be a positive number"),
        ({"reward": 250.0, "reward_bounds": (0, 500)}, "at least half the return's range"),
        ({"reward": 5.0, "reward_bounds": (0, math.inf)}, "finite with lo < hi"),
        ({"reward": 5.0, "reward_bounds": (10, 0)}, "finite with lo < hi"),
        ({"reward": 5.0, "reward_bounds": 500}, r"a pair \(lo, hi\)"),
        ({"success": 0.05, "alpha": 0.0}, r"alpha must be in \(0, 1\)"),
        ({"success": 0.05, "method": "hoeffding"}, "must be one of"),
    ],
)
def test_a_bad_precision_is_refused_saying_what_was_expected(arguments, message):
    with pytest.raises(ValueError, match=message):
        Precision(**arguments)


def test_precision_is_exported_and_records_itself_as_plain_data():
    precision = rlmesh.Precision(reward=10, reward_bounds=(0, 500), alpha=0.01)
    assert precision.half_width == pytest.approx(0.02)
    assert precision.to_json() == {
        "reward": 10.0,
        "reward_bounds": [0.0, 500.0],
        "alpha": 0.01,
        "method": "betting",
    }
    assert precision.describe() == "mean return within +/-10 (99% confidence sequence)"


def test_reward_bounds_come_from_the_env_s_reward_range_and_step_cap_or_an_error_names_the_fix():
    assert Precision(reward=5).bounded((-1, 2), 100).reward_bounds == (-100.0, 200.0)
    assert Precision(reward=5).bounded((0.5, 2), 100).reward_bounds == (0.5, 200.0)
    declared = Precision(reward=5, reward_bounds=(0, 50))
    assert declared.bounded((0, 1), 1000) is declared
    with pytest.raises(ValueError, match=r"declares no reward_range: pass .*reward_bounds"):
        Precision(reward=5).bounded(None, 100)
    with pytest.raises(ValueError, match=r"reward_range \(-inf, inf\) is not finite"):
        Precision(reward=5).bounded((-math.inf, math.inf), 100)
    with pytest.raises(ValueError, match="no step cap"):
        Precision(reward=5).bounded((0, 1), None)
    with pytest.raises(ValueError, match="at least half"):
        Precision(reward=50).bounded((0, 1), 100)
    # An env id has no reward_range before it is made (CartPole-v1's spec caps it at 500).
    with pytest.raises(ValueError, match="reward_bounds=\\(lo, hi\\)"):
        stopper_for(Precision(reward=5), "CartPole-v1", cap=10)


def test_episodes_are_released_in_index_order_and_the_stop_reads_the_prefix_alone():
    rng = np.random.default_rng(0)
    successes = (rng.random(400) < 0.4).tolist()
    expected = first_precise(successes, 0.1)
    stop = PrefixStop(Precision(success=0.1), cap=400)
    released = []
    # Finish them out of order: each block of 8 in reverse, as lanes of uneven speed would;
    # the run starts no block once stopped.
    for start in range(0, 400, 8):
        for index in reversed(range(start, start + 8)):
            released += [e.index for e in stop.offer(episode(index, successes[index]))]
        if stop.stopped:
            break
    assert released == list(range(expected))
    record = stop.record(cancelled=[expected + 9])
    assert (record.reason, record.episodes, record.observations) == (
        PRECISION_REACHED,
        expected,
        expected,
    )
    lower, upper = confidence_sequence(np.array(successes[:expected], dtype=float))
    assert (record.lower, record.upper) == (lower[-1], upper[-1])
    # Everything offered past n finished and was left out; the driver names the cancelled.
    block_end = ((expected - 1) // 8 + 1) * 8
    assert list(record.discarded) == list(range(expected, block_end))
    assert record.cancelled == (expected + 9,)


def test_a_run_that_never_gets_precise_stops_at_its_cap():
    stop = PrefixStop(Precision(success=0.01), cap=30)
    for index in range(30):
        stop.offer(episode(index, index % 2 == 0))
    record = stop.record()
    assert (stop.stopped, record.reason, record.episodes) == (True, CAP_REACHED, 30)
    unfinished = PrefixStop(Precision(success=0.01), cap=30)
    unfinished.offer(episode(0, True))
    assert unfinished.record().reason == UNFINISHED


def test_failed_episodes_count_in_the_prefix_but_not_in_the_estimate():
    stop = PrefixStop(Precision(success=0.2), cap=100)
    stop.offer(episode(0, None, error="RuntimeError: boom"))
    stop.offer(episode(1, True))
    record = stop.record()
    assert (record.episodes, record.observations) == (2, 1)


def test_a_reward_precision_rescales_the_returns_by_their_bounds():
    rewards = np.random.default_rng(3).uniform(10, 30, 300)
    expected = first_precise((rewards - 0) / 50, 2 / 50)
    stop = PrefixStop(Precision(reward=2, reward_bounds=(0, 50)), cap=300)
    for index, reward in enumerate(rewards):
        stop.offer(episode(index, None, reward=float(reward)))
    record = stop.record()
    assert record.episodes == expected and record.reason == PRECISION_REACHED
    assert 10 < record.lower < rewards[:expected].mean() < record.upper < 30


def test_an_episode_the_rule_cannot_read_stops_the_run_naming_the_fix():
    with pytest.raises(RlmeshError, match=r"episode 0 ended with no success verdict.*success=R"):
        PrefixStop(Precision(success=0.1), cap=10).offer(episode(0, None))
    bounded = PrefixStop(Precision(reward=1, reward_bounds=(0, 10)), cap=10)
    with pytest.raises(RlmeshError, match=r"episode 0's return 12 is outside .*\[0, 10\]"):
        bounded.offer(episode(0, None, reward=12.0))


def test_resumed_episodes_count_but_are_not_released_again():
    successes = [True, False] * 100
    expected = first_precise(successes, 0.2)
    stop = PrefixStop(Precision(success=0.2), cap=200)
    stop.resume([episode(index, successes[index]) for index in range(10)])
    assert (stop.counted, stop.stopped) == (10, False)
    released = [e.index for k in range(10, 200) for e in stop.offer(episode(k, successes[k]))]
    assert released == list(range(10, expected))
    again = PrefixStop(Precision(success=0.2), cap=200)
    again.resume([episode(index, successes[index]) for index in range(expected)])
    assert again.stopped and again.counted == expected
