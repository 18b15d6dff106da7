"""RouteLedger behaviour: slot claims, seeds, steps, completions, rolls and model ends.

Every test runs against both cores through the `core` fixture (see conftest.py).
"""

from __future__ import annotations

import re
import warnings

import gymnasium as gym
import numpy as np
import pytest
from rlmesh.core import load_core

# episode_seed(0, k) for k = 0..3, pinned in test_seeding.py.
SEEDS_BASE_0 = [1401122455, 73039572, 1810254650, 1678256936]

SUMMARY_FIELDS = [
    "index",
    "episode_id",
    "seed",
    "trial",
    "env_index",
    "steps",
    "reward",
    "terminated",
    "truncated",
    "success",
    "duration_s",
    "predict_ms",
    "step_ms",
]


def step(
    ledger, lanes, *, reward=1.0, terminated=(), truncated=(), step_ns=2_000, predict_ns=1_000
):
    """One record_step for `lanes` the way the driver calls it: numpy arrays, one per column."""
    lanes = np.asarray(lanes, dtype=np.int64)
    count = len(lanes)
    return ledger.record_step(
        lanes,
        np.full(count, reward, dtype=np.float64),
        np.isin(lanes, list(terminated)),
        np.isin(lanes, list(truncated)),
        np.full(count, step_ns, dtype=np.int64),
        np.full(count, predict_ns, dtype=np.int64),
    ).tolist()


def finish(ledger, lanes, *, now_ns=0, success=None):
    """Terminate the episodes on `lanes` with one last step and complete them."""
    assert step(ledger, lanes, terminated=lanes) == list(lanes)
    return ledger.complete_episodes(lanes, ledger.episode_ids(lanes), success, now_ns=now_ns)


def lane_states(ledger):
    return [lane["state"] for lane in ledger.snapshot()["lanes"]]


def starts_as_lists(starts):
    """An EpisodeStarts as plain lists, field by field."""
    return {
        "lanes": starts.lanes.tolist(),
        "episode_ids": starts.episode_ids.tolist(),
        "indices": starts.indices.tolist(),
        "seeds": list(starts.seeds),
        "trials": starts.trials.tolist(),
        "surplus_lanes": starts.surplus_lanes.tolist(),
        "surplus_episode_ids": starts.surplus_episode_ids.tolist(),
        "idle_lanes": starts.idle_lanes.tolist(),
    }


NOTHING_STARTED = {
    "lanes": [],
    "episode_ids": [],
    "indices": [],
    "seeds": [],
    "trials": [],
    "surplus_lanes": [],
    "surplus_episode_ids": [],
    "idle_lanes": [],
}


# ---------------------------------------------------------------------------- construction


def test_new_ledger_holds_no_episode(core):
    ledger = core.RouteLedger(3, 5, base_seed=9, trial_index_base=100)
    assert ledger.num_lanes == 3
    assert ledger.episodes == 5
    assert ledger.base_seed == 9
    assert ledger.trial_index_base == 100
    assert ledger.slots_claimed == 0
    assert ledger.slots_remaining == 5
    assert ledger.completed == 0
    assert ledger.done is False
    assert ledger.wasted_steps == 0
    assert ledger.ignored_completions == 0
    assert ledger.vacant_lanes().tolist() == [0, 1, 2]
    assert ledger.running_lanes().tolist() == []
    assert ledger.idle_lanes().tolist() == []
    assert ledger.episode_ids().tolist() == [-1, -1, -1]
    assert ledger.summaries() == []
    assert repr(ledger) == "RouteLedger(num_lanes=3, episodes=5, completed=0, slots_claimed=0)"


def test_snapshot_of_new_ledger(core):
    snapshot = core.RouteLedger(2, 4, base_seed=1, trial_index_base=3).snapshot()
    fresh_lane = {
        "state": "vacant",
        "episode_id": -1,
        "surplus": False,
        "index": -1,
        "seed": None,
        "trial": 0,
        "steps": 0,
        "reward": 0.0,
        "terminated": False,
        "truncated": False,
        "predicted": False,
        "env_episode_id": None,
    }
    assert snapshot == {
        "num_lanes": 2,
        "episodes": 4,
        "indices": None,
        "base_seed": 1,
        "trial_index_base": 3,
        "slots_claimed": 0,
        "completed": 0,
        "wasted_steps": 0,
        "ignored_completions": 0,
        "next_episode_id": 0,
        "untold_model_ends": [],
        "lanes": [fresh_lane, fresh_lane],
        "summaries": [],
    }


def test_base_seed_and_trial_index_base_of_none_mean_zero(core):
    ledger = core.RouteLedger(1, 1, base_seed=None, trial_index_base=None)
    assert (ledger.base_seed, ledger.trial_index_base) == (0, 0)
    assert ledger.seed_for_slot(0) == SEEDS_BASE_0[0]


def test_counts_accept_numpy_integers(core):
    ledger = core.RouteLedger(np.int64(2), np.uint32(3), base_seed=np.uint64(2**64 - 1))
    assert (ledger.num_lanes, ledger.episodes, ledger.base_seed) == (2, 3, 2**64 - 1)


@pytest.mark.parametrize(
    ("num_lanes", "episodes", "message"),
    [
        (0, 1, "num_lanes must be at least 1, got 0"),
        (-2, 1, "num_lanes must be at least 1, got -2"),
        (1, 0, "episodes must be at least 1, got 0"),
        (1, -3, "episodes must be at least 1, got -3"),
        (2.0, 1, "num_lanes must be an integer, got float"),
        (1, "3", "episodes must be an integer, got str"),
        (1, None, "episodes must be an integer, got NoneType"),
        (2**64, 1, "num_lanes must be an integer in [0, 2**64), got 18446744073709551616"),
    ],
)
def test_constructor_rejects_bad_counts(core, num_lanes, episodes, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        core.RouteLedger(num_lanes, episodes)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base_seed": -1}, "base_seed must be an integer in [0, 2**64), got -1"),
        (
            {"base_seed": 2**64},
            "base_seed must be an integer in [0, 2**64), got 18446744073709551616",
        ),
        ({"base_seed": 0.5}, "base_seed must be an integer in [0, 2**64), got float"),
        ({"trial_index_base": -7}, "trial_index_base must be an integer in [0, 2**64), got -7"),
        # Indices and trials travel as int64: the last trial must stay below 2**63.
        (
            {"trial_index_base": 2**63 - 2},
            "trial_index_base + episodes must not exceed 2**63, got 9223372036854775806 + 3",
        ),
        ({"seeds": [1, -1, 3]}, "seeds[1] must be an integer in [0, 2**64), got -1"),
        ({"seeds": [1.5, 2, 3]}, "seeds[0] must be an integer in [0, 2**64), got float"),
        ({"seeds": [1, 2, None]}, "seeds[2] must be an integer in [0, 2**64), got NoneType"),
    ],
)
def test_constructor_rejects_bad_seeding_arguments(core, kwargs, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        core.RouteLedger(2, 3, **kwargs)


def test_last_trial_may_reach_2_pow_63_minus_1(core):
    ledger = core.RouteLedger(3, 3, trial_index_base=2**63 - 3)
    starts = ledger.start_episodes(np.arange(3), now_ns=0)
    assert starts.trials.tolist() == [2**63 - 3, 2**63 - 2, 2**63 - 1]
    assert starts.seeds == [core.episode_seed(0, 2**63 - 3 + k) for k in range(3)]


# ---------------------------------------------------------------------------- seeds


def test_slots_reset_with_derived_seeds_by_default(core):
    ledger = core.RouteLedger(4, 4)
    starts = ledger.start_episodes(np.arange(4), now_ns=0)
    assert starts.seeds == SEEDS_BASE_0
    assert [ledger.seed_for_slot(slot) for slot in range(4)] == SEEDS_BASE_0


def test_derived_seeds_use_base_seed_and_global_trial_index(core):
    # A shard starting at trial 999 seeds its slot 0 like slot 999 of an unsharded run.
    shard = core.RouteLedger(2, 2, base_seed=42, trial_index_base=999)
    starts = shard.start_episodes([0, 1], now_ns=0)
    assert starts.seeds == [124376955, core.episode_seed(42, 1000)]  # (42, 999) is pinned
    assert starts.trials.tolist() == [999, 1000]
    assert starts.indices.tolist() == [0, 1]
    whole = core.RouteLedger(1, 1001, base_seed=42)
    assert whole.seed_for_slot(999) == shard.seed_for_slot(0)


def test_listed_seeds_are_used_by_slot_not_by_trial(core):
    ledger = core.RouteLedger(2, 2, seeds=[7, 8], trial_index_base=10)
    starts = ledger.start_episodes([1, 0], now_ns=0)
    assert starts.seeds == [7, 8]
    assert starts.trials.tolist() == [10, 11]


def test_seeds_shorter_than_budget_warn_and_later_slots_derive(core):
    with pytest.warns(UserWarning) as caught:
        ledger = core.RouteLedger(4, 4, seeds=[11, 22], base_seed=42)
    [warning] = caught
    assert str(warning.message) == (
        "seeds has 2 entries for 4 episodes: slots 2..3 reset with "
        "episode_seed(base_seed=42, trial_index_base + slot)"
    )
    # The warning points at the caller, not at rlmesh internals.
    assert warning.filename == __file__

    starts = ledger.start_episodes(np.arange(4), now_ns=0)
    assert starts.seeds == [11, 22, core.episode_seed(42, 2), core.episode_seed(42, 3)]


def test_empty_seed_list_warns_and_every_slot_derives(core):
    with pytest.warns(UserWarning, match=r"^seeds has 0 entries for 2 episodes: slots 0\.\.1 "):
        ledger = core.RouteLedger(1, 2, seeds=[])
    assert [ledger.seed_for_slot(slot) for slot in range(2)] == SEEDS_BASE_0[:2]


@pytest.mark.parametrize(
    "seeds", [[5, 6, 7], [5, 6, 7, 8, 9], np.array([5, 6, 7], dtype=np.uint64)]
)
def test_seed_list_covering_the_budget_does_not_warn(core, seeds):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ledger = core.RouteLedger(3, 3, seeds=seeds)
    starts = ledger.start_episodes([0, 1, 2], now_ns=0)
    assert starts.seeds == [5, 6, 7]
    assert all(type(seed) is int for seed in starts.seeds)


def test_seed_for_slot_covers_the_budget_only(core):
    with pytest.warns(UserWarning, match=r"^seeds has 2 entries for 4 episodes"):
        ledger = core.RouteLedger(1, 4, seeds=[3, 4])
    assert [ledger.seed_for_slot(slot) for slot in range(4)] == [3, 4, *SEEDS_BASE_0[2:]]
    with pytest.raises(ValueError, match=r"^slot 4 is out of range: this run has slots 0\.\.3$"):
        ledger.seed_for_slot(4)
    with pytest.raises(ValueError, match=r"^slot must be an integer in \[0, 2\*\*64\), got -1$"):
        ledger.seed_for_slot(-1)


# ---------------------------------------------------------------------------- start_episodes


def test_start_claims_slots_in_the_order_lanes_are_given(core):
    ledger = core.RouteLedger(4, 10)
    starts = ledger.start_episodes(np.array([2, 0, 3]), now_ns=5)
    assert starts_as_lists(starts) == {
        **NOTHING_STARTED,
        "lanes": [2, 0, 3],
        "episode_ids": [0, 1, 2],
        "indices": [0, 1, 2],
        "seeds": SEEDS_BASE_0[:3],
        "trials": [0, 1, 2],
    }
    for field in ("lanes", "episode_ids", "indices", "trials", "surplus_lanes", "idle_lanes"):
        array = getattr(starts, field)
        assert isinstance(array, np.ndarray)
        assert array.dtype == np.int64
    assert isinstance(starts.seeds, list)
    assert ledger.running_lanes().tolist() == [0, 2, 3]
    assert ledger.vacant_lanes().tolist() == [1]
    assert ledger.episode_ids().tolist() == [1, -1, 0, 2]
    assert ledger.episode_ids([3, 1, 2]).tolist() == [2, -1, 0]
    assert (ledger.slots_claimed, ledger.slots_remaining) == (3, 7)


def test_start_accepts_plain_lists_like_arrays(core):
    from_list = core.RouteLedger(3, 3)
    from_array = core.RouteLedger(3, 3)
    listed = from_list.start_episodes([1, 2], now_ns=0)
    arrayed = from_array.start_episodes(np.array([1, 2], dtype=np.int32), now_ns=0)
    assert starts_as_lists(listed) == starts_as_lists(arrayed)
    assert from_list.snapshot() == from_array.snapshot()


def test_start_with_no_lanes_starts_nothing(core):
    ledger = core.RouteLedger(2, 2)
    assert starts_as_lists(ledger.start_episodes([], now_ns=0)) == NOTHING_STARTED
    # An empty array of any dtype is an empty list of lanes.
    empty = np.array([], dtype=np.float64)
    assert starts_as_lists(ledger.start_episodes(empty, now_ns=0, exact=True)) == NOTHING_STARTED
    assert ledger.slots_claimed == 0
    assert ledger.snapshot()["next_episode_id"] == 0


def test_budget_smaller_than_lane_count_idles_the_extra_lanes(core):
    ledger = core.RouteLedger(5, 3)
    starts = ledger.start_episodes(np.arange(5), now_ns=0)
    assert starts.lanes.tolist() == [0, 1, 2]
    assert starts.indices.tolist() == [0, 1, 2]
    assert starts.idle_lanes.tolist() == [3, 4]
    assert starts.surplus_lanes.tolist() == []
    assert ledger.idle_lanes().tolist() == [3, 4]
    assert ledger.running_lanes().tolist() == [0, 1, 2]
    assert ledger.episode_ids().tolist() == [0, 1, 2, -1, -1]
    assert ledger.slots_remaining == 0
    assert ledger.snapshot()["next_episode_id"] == 3  # idle lanes get no episode id


def test_budget_smaller_than_lane_count_runs_surplus_on_lockstep_lanes(core):
    ledger = core.RouteLedger(5, 3)
    starts = ledger.start_episodes(np.arange(5), now_ns=0, overflow="surplus")
    assert starts.lanes.tolist() == [0, 1, 2]
    assert starts.surplus_lanes.tolist() == [3, 4]
    assert starts.surplus_episode_ids.tolist() == [3, 4]
    assert starts.idle_lanes.tolist() == []
    assert ledger.running_lanes().tolist() == [0, 1, 2, 3, 4]
    surplus_lane = ledger.snapshot()["lanes"][3]
    assert surplus_lane["surplus"] is True
    assert (surplus_lane["index"], surplus_lane["seed"], surplus_lane["trial"]) == (-1, None, 0)
    assert ledger.slots_claimed == 3


def test_budget_reached_mid_vector(core):
    ledger = core.RouteLedger(4, 6)
    ledger.start_episodes(np.arange(4), now_ns=0)
    finish(ledger, [3, 1, 0])
    # Two slots are left for three restarting lanes: the first two given get them.
    starts = ledger.start_episodes([3, 1, 0], now_ns=0)
    assert starts.lanes.tolist() == [3, 1]
    assert starts.indices.tolist() == [4, 5]
    assert starts.episode_ids.tolist() == [4, 5]
    assert starts.idle_lanes.tolist() == [0]
    assert ledger.idle_lanes().tolist() == [0]
    assert ledger.running_lanes().tolist() == [1, 2, 3]
    finish(ledger, [1, 2, 3])
    assert ledger.done
    assert sorted(summary.index for summary in ledger.summaries()) == list(range(6))


def test_exact_claim_is_all_or_nothing(core):
    ledger = core.RouteLedger(3, 5)
    first = ledger.start_episodes(np.arange(3), now_ns=0, exact=True)
    assert first.indices.tolist() == [0, 1, 2]
    finish(ledger, [0, 1, 2])
    # Two slots remain for three lanes: an exact claim grants none and starts nothing, not
    # even surplus episodes, so the slots stay free for a smaller claim.
    refused = ledger.start_episodes(np.arange(3), now_ns=0, exact=True, overflow="surplus")
    assert refused.lanes.tolist() == []
    assert refused.surplus_lanes.tolist() == []
    assert refused.idle_lanes.tolist() == []
    assert (ledger.slots_claimed, ledger.slots_remaining) == (3, 2)
    assert ledger.vacant_lanes().tolist() == [0, 1, 2]


def test_exact_claim_without_enough_slots_leaves_the_lanes_vacant(core):
    ledger = core.RouteLedger(3, 2)
    starts = ledger.start_episodes([2, 0, 1], now_ns=0, exact=True)
    assert starts.lanes.tolist() == []
    assert starts.idle_lanes.tolist() == []
    assert ledger.vacant_lanes().tolist() == [0, 1, 2]
    assert ledger.slots_remaining == 2
    retried = ledger.start_episodes([1, 2], now_ns=0, exact=True)
    assert retried.indices.tolist() == [0, 1]


def test_idle_lane_starts_no_other_episode(core):
    ledger = core.RouteLedger(2, 1)
    ledger.start_episodes([0, 1], now_ns=0)
    with pytest.raises(ValueError, match=r"^lane 1 is idle: no slot was left for it"):
        ledger.start_episodes([1], now_ns=0, overflow="surplus")


def test_exact_must_be_a_bool(core):
    ledger = core.RouteLedger(2, 2)
    with pytest.raises(ValueError, match=r"^exact must be True or False, got str$"):
        ledger.start_episodes([0], now_ns=0, exact="no")
    assert ledger.start_episodes([0], now_ns=0, exact=np.bool_(True)).indices.tolist() == [0]


def test_exact_claim_of_exactly_the_remaining_slots_succeeds(core):
    ledger = core.RouteLedger(3, 2)
    starts = ledger.start_episodes([2, 0], now_ns=0, exact=True)
    assert starts.indices.tolist() == [0, 1]
    assert ledger.slots_remaining == 0


def test_up_to_claim_takes_what_remains(core):
    ledger = core.RouteLedger(3, 5)
    ledger.start_episodes(np.arange(3), now_ns=0)
    finish(ledger, [0, 1, 2])
    starts = ledger.start_episodes(np.arange(3), now_ns=0, overflow="surplus")
    assert starts.lanes.tolist() == [0, 1]
    assert starts.indices.tolist() == [3, 4]
    assert starts.surplus_lanes.tolist() == [2]
    assert ledger.slots_remaining == 0


def test_start_rejects_unknown_overflow(core):
    ledger = core.RouteLedger(2, 2)
    with pytest.raises(ValueError, match=r"^overflow must be 'idle' or 'surplus', got 'drop'$"):
        ledger.start_episodes([0], now_ns=0, overflow="drop")


@pytest.mark.parametrize(
    ("lanes", "message"),
    [
        ([4], "lane 4 is out of range: this route has lanes 0..3"),
        (np.array([0, -1]), "lane -1 is out of range: this route has lanes 0..3"),
        ([1, 2, 1], "lane 1 appears twice in lanes"),
        ([[0, 1]], "lanes must be a 1-D array, got shape (1, 2)"),
        (3, "lanes must be a 1-D array, got shape ()"),
        ([0.0, 1.0], "lanes must hold integers, got dtype float64"),
        (np.array([True, False]), "lanes must hold integers, got dtype bool"),
    ],
)
def test_start_rejects_bad_lanes(core, lanes, message):
    ledger = core.RouteLedger(4, 4)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ledger.start_episodes(lanes, now_ns=0)


def test_start_rejects_a_lane_still_holding_an_episode(core):
    ledger = core.RouteLedger(3, 5)
    ledger.start_episodes([0, 1], now_ns=0)
    step(ledger, [0, 1], terminated=[1])
    running = r"^lane 0 still holds running episode 0: complete it before starting another$"
    with pytest.raises(ValueError, match=running):
        ledger.start_episodes([2, 0], now_ns=0)
    ended = r"^lane 1 still holds ended episode 1: complete it before starting another$"
    with pytest.raises(ValueError, match=ended):
        ledger.start_episodes([1], now_ns=0)


@pytest.mark.parametrize(
    ("now_ns", "message"),
    [
        (1.5, "now_ns must be an integer in [-2**63, 2**63), got float"),
        ("0", "now_ns must be an integer in [-2**63, 2**63), got str"),
        (2**63, "now_ns must be an integer in [-2**63, 2**63), got 9223372036854775808"),
    ],
)
def test_start_rejects_a_bad_clock_reading(core, now_ns, message):
    ledger = core.RouteLedger(1, 1)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ledger.start_episodes([0], now_ns=now_ns)


def test_idle_lanes_are_never_stepped_or_predicted(core):
    ledger = core.RouteLedger(2, 1)
    ledger.start_episodes([0, 1], now_ns=0)
    with pytest.raises(ValueError, match=r"^lane 1 is idle, not running: only running lanes"):
        step(ledger, [0, 1])
    with pytest.raises(ValueError, match=r"^lane 1 is idle, not running: the model cannot"):
        ledger.mark_predicted([1])
    assert ledger.snapshot()["lanes"][0]["steps"] == 0  # the refused step touched nothing


# ---------------------------------------------------------------------------- record_step


def test_record_step_accumulates_and_returns_ended_lanes_in_given_order(core):
    ledger = core.RouteLedger(3, 3)
    ledger.start_episodes(np.arange(3), now_ns=0)
    ended = ledger.record_step(
        np.array([2, 0, 1]),
        np.array([0.5, 1.0, -2.0]),
        np.array([True, False, False]),
        np.array([False, False, True]),
        np.array([10, 20, 30]),
        np.array([1, 2, 3]),
    )
    assert isinstance(ended, np.ndarray)
    assert ended.dtype == np.int64
    assert ended.tolist() == [2, 1]
    assert lane_states(ledger) == ["running", "ended", "ended"]
    assert ledger.running_lanes().tolist() == [0]
    lanes = ledger.snapshot()["lanes"]
    assert [lane["steps"] for lane in lanes] == [1, 1, 1]
    assert [lane["reward"] for lane in lanes] == [1.0, -2.0, 0.5]
    assert [lane["terminated"] for lane in lanes] == [False, False, True]
    assert [lane["truncated"] for lane in lanes] == [False, True, False]

    assert step(ledger, [0], reward=0.25) == []
    assert step(ledger, [0], reward=0.25, terminated=[0], truncated=[0]) == [0]
    lane = ledger.snapshot()["lanes"][0]
    assert (lane["steps"], lane["reward"], lane["terminated"], lane["truncated"]) == (
        3,
        1.5,
        True,
        True,
    )


def test_record_step_accepts_plain_lists_and_integer_flags(core):
    ledger = core.RouteLedger(2, 2)
    ledger.start_episodes([0, 1], now_ns=0)
    # Integer rewards and 0/1 flags are what a pure-Python env loop may hand over.
    assert ledger.record_step([1, 0], [2, 3], [0, 1], [0, 0], [5, 5], [1, 1]).tolist() == [0]
    assert [lane["reward"] for lane in ledger.snapshot()["lanes"]] == [3.0, 2.0]


def test_record_step_with_no_lanes_changes_nothing(core):
    ledger = core.RouteLedger(1, 1)
    before = ledger.snapshot()
    assert ledger.record_step([], [], [], [], [], []).tolist() == []
    assert ledger.snapshot() == before


@pytest.mark.parametrize("short", ["rewards", "terminated", "truncated", "step_ns", "predict_ns"])
def test_record_step_rejects_a_column_that_does_not_match_lanes(core, short):
    ledger = core.RouteLedger(2, 2)
    ledger.start_episodes([0, 1], now_ns=0)
    columns = {
        "rewards": np.ones(2),
        "terminated": np.zeros(2, dtype=np.bool_),
        "truncated": np.zeros(2, dtype=np.bool_),
        "step_ns": np.ones(2, dtype=np.int64),
        "predict_ns": np.ones(2, dtype=np.int64),
    }
    columns[short] = columns[short][:1]
    with pytest.raises(ValueError, match=f"^{short} has 1 entries but lanes has 2$"):
        ledger.record_step(np.arange(2), *columns.values())


@pytest.mark.parametrize(
    ("column", "values", "message"),
    [
        ("rewards", [True, False], "rewards must hold numbers, got dtype bool"),
        ("rewards", ["a", "b"], "rewards must hold numbers, got dtype <U1"),
        ("terminated", [0.0, 1.0], "terminated must hold booleans, got dtype float64"),
        ("truncated", [None, None], "truncated must hold booleans, got dtype object"),
        ("step_ns", [1.5, 2.0], "step_ns must hold integers, got dtype float64"),
        ("predict_ns", [[1, 2]], "predict_ns must be a 1-D array, got shape (1, 2)"),
    ],
)
def test_record_step_rejects_a_column_of_the_wrong_kind(core, column, values, message):
    ledger = core.RouteLedger(2, 2)
    ledger.start_episodes([0, 1], now_ns=0)
    columns = {
        "rewards": [1.0, 1.0],
        "terminated": [False, False],
        "truncated": [False, False],
        "step_ns": [1, 1],
        "predict_ns": [1, 1],
    }
    columns[column] = values
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ledger.record_step([0, 1], *columns.values())


def test_record_step_rejects_lanes_that_are_not_running(core):
    ledger = core.RouteLedger(3, 3)
    ledger.start_episodes([0, 1], now_ns=0)
    step(ledger, [1], terminated=[1])
    with pytest.raises(ValueError, match=r"^lane 2 is vacant, not running: only running lanes"):
        step(ledger, [0, 2])
    with pytest.raises(ValueError, match=r"^lane 1 is ended, not running: only running lanes"):
        step(ledger, [1])
    with pytest.raises(ValueError, match=r"^lane 3 is out of range: this route has lanes 0\.\.2$"):
        step(ledger, [3])
    with pytest.raises(ValueError, match=r"^lane 0 appears twice in lanes$"):
        step(ledger, [0, 0])


def test_record_step_rejects_negative_timings(core):
    ledger = core.RouteLedger(2, 2)
    ledger.start_episodes([0, 1], now_ns=0)
    before = ledger.snapshot()
    message = r"^lane 1 has step_ns=5, predict_ns=-1: timings must be non-negative$"
    with pytest.raises(ValueError, match=message):
        ledger.record_step([0, 1], [1.0, 1.0], [True, False], [False, False], [5, 5], [0, -1])
    assert ledger.snapshot() == before  # lane 0, given first, was not stepped either


def test_surplus_steps_are_wasted_and_never_scored(core):
    ledger = core.RouteLedger(3, 1)
    ledger.start_episodes(np.arange(3), now_ns=0, overflow="surplus")
    for _ in range(3):
        step(ledger, [0, 1, 2])
    assert ledger.wasted_steps == 6  # lanes 1 and 2, three steps each
    assert step(ledger, [0, 1, 2], terminated=[1]) == [1]
    assert ledger.wasted_steps == 8
    assert ledger.complete_episodes([1], ledger.episode_ids([1]), [True], now_ns=0) == []
    assert (ledger.completed, ledger.ignored_completions) == (0, 0)
    assert ledger.vacant_lanes().tolist() == [1]
    assert ledger.summaries() == []
    finish(ledger, [0])
    assert ledger.done
    assert [summary.index for summary in ledger.summaries()] == [0]
    assert ledger.wasted_steps == 8  # scored steps are not wasted


# ---------------------------------------------------------------------------- complete_episodes


def test_summary_fields(core):
    ledger = core.RouteLedger(2, 2, trial_index_base=5)
    ledger.start_episodes([1], now_ns=1_000_000_000)
    ledger.record_step([1], [1.0], [False], [False], [2_000_000], [1_000_000])
    ledger.record_step([1], [0.5], [False], [False], [4_000_000], [1_000_000])
    ledger.record_step([1], [0.25], [False], [True], [6_000_000], [4_000_000])
    [summary] = ledger.complete_episodes([1], [0], [True], now_ns=3_500_000_000)
    assert summary.to_dict() == {
        "index": 0,
        "episode_id": 0,
        "seed": core.episode_seed(0, 5),
        "trial": 5,
        "env_index": 1,
        "steps": 3,
        "reward": 1.75,
        "terminated": False,
        "truncated": True,
        "success": True,
        "duration_s": 2.5,  # from the start's now_ns to the completion's
        "predict_ms": 2.0,  # 6 ms of model time over 3 steps
        "step_ms": 4.0,  # 12 ms of env time over 3 steps
    }
    assert list(summary.to_dict()) == SUMMARY_FIELDS
    # Plain Python types (dict equality alone would let 1 pass for True or numpy for int).
    expected_types = dict.fromkeys(SUMMARY_FIELDS, int)
    expected_types.update(dict.fromkeys(["terminated", "truncated", "success"], bool))
    expected_types.update(dict.fromkeys(["reward", "duration_s", "predict_ms", "step_ms"], float))
    for field, value in summary.to_dict().items():
        assert getattr(summary, field) == value
        assert type(value) is expected_types[field], field
        assert type(getattr(summary, field)) is expected_types[field], field


def test_summary_means_are_per_step(core):
    ledger = core.RouteLedger(1, 1)
    ledger.start_episodes([0], now_ns=0)
    for step_ns in (1_000_000, 2_000_000, 4_000_000, 1_000_000):
        step(ledger, [0], step_ns=step_ns, predict_ns=step_ns // 2)
    step(ledger, [0], terminated=[0], step_ns=2_000_000, predict_ns=0)
    [summary] = ledger.complete_episodes([0], [0], now_ns=250_000_000)
    assert summary.steps == 5
    assert summary.step_ms == pytest.approx(2.0)
    assert summary.predict_ms == pytest.approx(0.8)
    assert summary.duration_s == pytest.approx(0.25)


def test_success_is_true_false_or_unknown(core):
    ledger = core.RouteLedger(3, 6)
    ledger.start_episodes(np.arange(3), now_ns=0)
    given = finish(ledger, [0, 1, 2], success=[True, False, None])
    assert [summary.success for summary in given] == [True, False, None]

    ledger.start_episodes(np.arange(3), now_ns=0)
    # numpy booleans and 0/1 come back as plain bools; omitting success means unknown.
    from_numpy = finish(ledger, [0, 1], success=np.array([1, 0]))
    assert [summary.success for summary in from_numpy] == [True, False]
    assert all(type(summary.success) is bool for summary in from_numpy)
    [omitted] = finish(ledger, [2])
    assert omitted.success is None


def test_complete_returns_summaries_in_given_order_and_frees_lanes(core):
    ledger = core.RouteLedger(3, 6)
    ledger.start_episodes(np.arange(3), now_ns=0)
    step(ledger, [0, 1, 2], terminated=[0, 2])
    summaries = ledger.complete_episodes(np.array([2, 0]), np.array([2, 0]), now_ns=1)
    assert [(s.env_index, s.index, s.episode_id) for s in summaries] == [(2, 2, 2), (0, 0, 0)]
    assert lane_states(ledger) == ["vacant", "running", "vacant"]
    assert ledger.episode_ids().tolist() == [-1, 1, -1]
    assert ledger.completed == 2
    cleared = ledger.snapshot()["lanes"][0]
    assert (cleared["index"], cleared["seed"], cleared["surplus"]) == (-1, None, False)


def test_summaries_are_listed_in_completion_order(core):
    ledger = core.RouteLedger(2, 2)
    ledger.start_episodes([0, 1], now_ns=0)
    finish(ledger, [1])
    finish(ledger, [0])
    listed = ledger.summaries()
    assert [summary.index for summary in listed] == [1, 0]
    listed.clear()  # the ledger hands out a copy
    assert len(ledger.summaries()) == 2
    assert ledger.snapshot()["summaries"] == [s.to_dict() for s in ledger.summaries()]


def test_complete_rejects_an_episode_still_running(core):
    ledger = core.RouteLedger(2, 2)
    ledger.start_episodes([0, 1], now_ns=0)
    step(ledger, [1], terminated=[1])
    message = (
        r"^lane 0 episode 0 is still running: record_step has not seen it terminate or truncate$"
    )
    with pytest.raises(ValueError, match=message):
        ledger.complete_episodes([1, 0], [1, 0], now_ns=0)
    assert lane_states(ledger) == ["running", "ended"]  # lane 1 was not completed either


@pytest.mark.parametrize(
    ("lanes", "ids", "success", "message"),
    [
        ([0, 1], [0], None, "episode_ids has 1 entries but lanes has 2"),
        ([0, 1], [0, 1], [True], "success has 1 entries but lanes has 2"),
        ([0], [0], [True, None, False], "success has 3 entries but lanes has 1"),
        ([0, 0], [0, 0], None, "lane 0 appears twice in lanes"),
        ([2], [0], None, "lane 2 is out of range: this route has lanes 0..1"),
        ([0], [0.0], None, "episode_ids must hold integers, got dtype float64"),
    ],
)
def test_complete_rejects_bad_arguments(core, lanes, ids, success, message):
    ledger = core.RouteLedger(2, 2)
    ledger.start_episodes([0, 1], now_ns=0)
    step(ledger, [0, 1], terminated=[0, 1])
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ledger.complete_episodes(lanes, ids, success, now_ns=0)


def test_duplicate_completion_is_ignored_and_never_double_scored(core):
    ledger = core.RouteLedger(1, 3)
    ledger.start_episodes([0], now_ns=0)
    [first] = finish(ledger, [0])
    assert ledger.complete_episodes([0], [0], [True], now_ns=9) == []
    assert ledger.ignored_completions == 1
    assert ledger.completed == 1
    assert [summary.to_dict() for summary in ledger.summaries()] == [first.to_dict()]


def test_stale_completion_is_ignored_and_leaves_the_lanes_episode_alone(core):
    ledger = core.RouteLedger(2, 4)
    ledger.start_episodes([0, 1], now_ns=0)
    finish(ledger, [0])
    ledger.start_episodes([0], now_ns=0)  # lane 0 now holds episode 2
    # A late completion of episode 0 while lane 0 runs episode 2: ignored, not an error.
    assert ledger.complete_episodes([0], [0], now_ns=0) == []
    assert ledger.episode_ids([0]).tolist() == [2]
    assert lane_states(ledger)[0] == "running"
    # ... and while episode 2 has ended but waits for its own completion.
    step(ledger, [0], terminated=[0])
    assert ledger.complete_episodes([0], [0], now_ns=0) == []
    assert lane_states(ledger)[0] == "ended"
    # A wrong id mixed with a right one: only the right one completes.
    step(ledger, [1], terminated=[1])
    done_now = ledger.complete_episodes([0, 1], [7, 1], now_ns=0)
    assert [summary.episode_id for summary in done_now] == [1]
    assert ledger.ignored_completions == 3
    assert [summary.episode_id for summary in ledger.complete_episodes([0], [2], now_ns=0)] == [2]
    assert ledger.completed == 3


def test_completion_of_a_vacant_or_idle_lane_is_ignored(core):
    ledger = core.RouteLedger(3, 1)
    ledger.start_episodes([0, 2], now_ns=0)
    assert ledger.idle_lanes().tolist() == [2]
    assert ledger.complete_episodes([1, 2], [-1, -1], now_ns=0) == []
    assert ledger.ignored_completions == 2
    assert lane_states(ledger) == ["running", "vacant", "idle"]


def test_done_completed_and_slots_remaining_over_a_run(core):
    ledger = core.RouteLedger(2, 3)
    ledger.start_episodes([0, 1], now_ns=0)
    assert (ledger.slots_remaining, ledger.completed, ledger.done) == (1, 0, False)
    finish(ledger, [1])
    ledger.start_episodes([1], now_ns=0)
    assert (ledger.slots_remaining, ledger.completed, ledger.done) == (0, 1, False)
    finish(ledger, [1])
    assert ledger.start_episodes([1], now_ns=0).idle_lanes.tolist() == [1]
    assert (ledger.completed, ledger.done) == (2, False)
    finish(ledger, [0])
    assert (ledger.slots_remaining, ledger.completed, ledger.done) == (0, 3, True)
    assert repr(ledger) == "RouteLedger(num_lanes=2, episodes=3, completed=3, slots_claimed=3)"


# ---------------------------------------------------------------------------- model lifecycle


def test_model_end_is_delivered_once(core):
    ledger = core.RouteLedger(2, 4)
    ledger.start_episodes([0, 1], now_ns=0)
    ledger.mark_predicted(np.array([0, 1]))
    assert ledger.take_model_ends([0, 1]).tolist() == []  # still running: nothing owed yet
    finish(ledger, [1, 0])
    assert ledger.snapshot()["untold_model_ends"] == [0, 1]
    owed = ledger.take_model_ends(np.array([1, 0]))
    assert owed.dtype == np.int64
    assert owed.tolist() == [1, 0]  # in the order given
    assert ledger.take_model_ends([0, 1]).tolist() == []
    assert ledger.take_all_model_ends().tolist() == []


def test_model_end_not_owed_for_an_episode_never_predicted(core):
    ledger = core.RouteLedger(2, 2)
    ledger.start_episodes([0, 1], now_ns=0)
    ledger.mark_predicted([1])
    finish(ledger, [0, 1])
    assert ledger.take_model_ends([0, 1]).tolist() == [1]
    assert ledger.take_all_model_ends().tolist() == []


def test_model_end_owed_for_surplus_episodes(core):
    ledger = core.RouteLedger(2, 1)
    starts = ledger.start_episodes([0, 1], now_ns=0, overflow="surplus")
    [surplus_id] = starts.surplus_episode_ids.tolist()
    ledger.mark_predicted([0, 1])
    finish(ledger, [1])
    assert ledger.summaries() == []
    assert ledger.take_model_ends([surplus_id]).tolist() == [surplus_id]


def test_take_model_ends_ignores_unknown_and_repeated_ids(core):
    ledger = core.RouteLedger(1, 2)
    ledger.start_episodes([0], now_ns=0)
    ledger.mark_predicted([0])
    ledger.mark_predicted([0])  # predicting twice still owes one end
    finish(ledger, [0])
    assert ledger.take_model_ends([5, 0, 0, -1]).tolist() == [0]
    assert ledger.take_model_ends([]).tolist() == []


def test_take_all_model_ends_at_teardown(core):
    ledger = core.RouteLedger(4, 10)
    ledger.start_episodes(np.arange(4), now_ns=0)  # episodes 0..3
    ledger.mark_predicted([0, 1, 2])
    finish(ledger, [0])  # completed, predicted, not yet taken
    step(ledger, [1], terminated=[1])  # ended, predicted, not completed
    ledger.start_episodes([0], now_ns=0)  # episode 4, never predicted
    # Owed: completed 0, ended 1, running 2. Not 3 or 4 (never predicted).
    owed = ledger.take_all_model_ends()
    assert owed.dtype == np.int64
    assert owed.tolist() == [0, 1, 2]
    assert ledger.take_all_model_ends().tolist() == []
    # Completing those episodes later owes nothing more: each end is delivered once.
    ledger.complete_episodes([1], [1], now_ns=0)
    finish(ledger, [2])
    assert ledger.take_model_ends([0, 1, 2]).tolist() == []
    assert ledger.snapshot()["untold_model_ends"] == []
    assert not any(lane["predicted"] for lane in ledger.snapshot()["lanes"])


def test_take_all_model_ends_is_ascending(core):
    ledger = core.RouteLedger(3, 6)
    ledger.start_episodes([2, 1, 0], now_ns=0)  # lane 2 holds episode 0, lane 0 episode 2
    ledger.mark_predicted([0, 2])
    finish(ledger, [0])
    ledger.start_episodes([0], now_ns=0)
    ledger.mark_predicted([0])
    assert ledger.take_all_model_ends().tolist() == [0, 2, 3]


def test_mark_predicted_requires_running_lanes(core):
    ledger = core.RouteLedger(3, 3)
    ledger.start_episodes([0, 1], now_ns=0)
    step(ledger, [1], terminated=[1])
    with pytest.raises(ValueError, match=r"^lane 1 is ended, not running: the model cannot have "):
        ledger.mark_predicted([0, 1])
    with pytest.raises(ValueError, match=r"^lane 2 is vacant, not running: the model cannot have "):
        ledger.mark_predicted([2])
    with pytest.raises(ValueError, match=r"^lane 9 is out of range: this route has lanes 0\.\.2$"):
        ledger.mark_predicted([9])
    assert not ledger.snapshot()["lanes"][0]["predicted"]  # refused calls marked nothing


# ---------------------------------------------------------------------------- observe_rolls


def test_first_observed_env_episode_id_is_a_baseline(core):
    ledger = core.RouteLedger(3, 3)
    starts = ledger.observe_rolls(np.arange(3), np.array([5, 0, 5]), now_ns=0)
    assert starts_as_lists(starts) == NOTHING_STARTED
    assert [lane["env_episode_id"] for lane in ledger.snapshot()["lanes"]] == [5, 0, 5]
    assert ledger.slots_claimed == 0
    # The same ids again: nothing rolled.
    assert starts_as_lists(ledger.observe_rolls([0, 1, 2], [5, 0, 5], now_ns=0)) == (
        NOTHING_STARTED
    )


def test_rolled_lane_claims_the_next_slot_with_no_seed(core):
    ledger = core.RouteLedger(3, 5, trial_index_base=100)
    ledger.start_episodes(np.arange(3), now_ns=0)
    ledger.observe_rolls(np.arange(3), np.zeros(3, dtype=np.int64), now_ns=0)
    finish(ledger, [1])
    starts = ledger.observe_rolls(np.arange(3), np.array([0, 1, 0]), now_ns=50)
    assert starts_as_lists(starts) == {
        **NOTHING_STARTED,
        "lanes": [1],
        "episode_ids": [3],
        "indices": [3],
        "seeds": [None],  # the environment chose the start
        "trials": [103],
    }
    lane = ledger.snapshot()["lanes"][1]
    assert (lane["state"], lane["seed"], lane["env_episode_id"]) == ("running", None, 1)
    [summary] = finish(ledger, [1], now_ns=150)
    assert (summary.index, summary.seed, summary.trial) == (3, None, 103)
    assert summary.duration_s == pytest.approx(100e-9)


def test_roll_on_a_single_lane(core):
    ledger = core.RouteLedger(4, 8)
    ledger.start_episodes(np.arange(4), now_ns=0)
    ledger.observe_rolls(np.arange(4), [0, 0, 0, 0], now_ns=0)
    finish(ledger, [2])
    starts = ledger.observe_rolls([2], [1], now_ns=0)
    assert starts.lanes.tolist() == [2]
    assert starts.indices.tolist() == [4]
    assert ledger.running_lanes().tolist() == [0, 1, 2, 3]
    assert [lane["env_episode_id"] for lane in ledger.snapshot()["lanes"]] == [0, 0, 1, 0]


def test_rolls_after_the_budget_run_surplus(core):
    ledger = core.RouteLedger(2, 2)
    ledger.start_episodes([0, 1], now_ns=0)
    ledger.observe_rolls([0, 1], [0, 0], now_ns=0)
    finish(ledger, [0])
    starts = ledger.observe_rolls([0, 1], [1, 0], now_ns=0)
    assert starts.lanes.tolist() == []
    assert starts.surplus_lanes.tolist() == [0]
    assert starts.surplus_episode_ids.tolist() == [2]
    step(ledger, [0, 1])
    assert ledger.wasted_steps == 1


def test_roll_of_a_lane_still_holding_an_episode_is_refused(core):
    ledger = core.RouteLedger(2, 4)
    ledger.start_episodes([0, 1], now_ns=0)
    ledger.observe_rolls([0, 1], [0, 0], now_ns=0)
    running = (
        r"^lane 1 rolled to env episode 6 but still holds running episode 1: "
        r"complete it before starting another$"
    )
    with pytest.raises(ValueError, match=running):
        ledger.observe_rolls([0, 1], [0, 6], now_ns=0)
    step(ledger, [0], terminated=[0])
    ended = r"^lane 0 rolled to env episode 1 but still holds ended episode 0: complete it"
    with pytest.raises(ValueError, match=ended):
        ledger.observe_rolls([0], [1], now_ns=0)
    # A refused roll does not move the baseline either.
    assert [lane["env_episode_id"] for lane in ledger.snapshot()["lanes"]] == [0, 0]


@pytest.mark.parametrize(
    ("lanes", "env_ids", "message"),
    [
        ([0, 1], [3], "env_episode_ids has 1 entries but lanes has 2"),
        ([0], [1.5], "env_episode_ids must hold integers, got dtype float64"),
        ([0, 2], [1, 1], "lane 2 is out of range: this route has lanes 0..1"),
        ([1, 1], [1, 2], "lane 1 appears twice in lanes"),
    ],
)
def test_observe_rolls_rejects_bad_arguments(core, lanes, env_ids, message):
    ledger = core.RouteLedger(2, 2)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ledger.observe_rolls(lanes, env_ids, now_ns=0)


# ---------------------------------------------------------------------------- atomicity


def prepared_ledger(core):
    """Lane 0 running (predicted), 1 ended (predicted), 2 running, 3 vacant; baselines seen."""
    ledger = core.RouteLedger(4, 6, seeds=[10, 11, 12, 13, 14, 15])
    ledger.start_episodes([0, 1, 2], now_ns=100)
    ledger.mark_predicted([0, 1])
    ledger.observe_rolls(np.arange(4), [0, 0, 0, 0], now_ns=100)
    step(ledger, [0, 1, 2], terminated=[1], step_ns=7, predict_ns=3)
    return ledger


INVALID_CALLS = {
    "start-running-lane": (
        lambda ledger: ledger.start_episodes([3, 0], now_ns=0),
        "lane 0 still holds running",
    ),
    "start-ended-lane": (
        lambda ledger: ledger.start_episodes([3, 1], now_ns=0, overflow="surplus"),
        "lane 1 still holds ended",
    ),
    "start-bad-overflow": (
        lambda ledger: ledger.start_episodes([3], now_ns=0, overflow="bogus"),
        "overflow must be",
    ),
    "start-bad-clock": (lambda ledger: ledger.start_episodes([3], now_ns=0.5), "now_ns must be"),
    "start-duplicate": (
        lambda ledger: ledger.start_episodes([3, 3], now_ns=0),
        "lane 3 appears twice",
    ),
    "step-vacant-lane": (lambda ledger: step(ledger, [0, 2, 3]), "lane 3 is vacant"),
    "step-short-column": (
        lambda ledger: ledger.record_step([0, 2], [1.0], [0, 0], [0, 0], [1, 1], [1, 1]),
        "rewards has 1 entries",
    ),
    "step-negative-timing": (
        lambda ledger: ledger.record_step([0, 2], [1.0, 1.0], [1, 1], [0, 0], [1, -1], [1, 1]),
        "lane 2 has step_ns=-1",
    ),
    "complete-running": (
        lambda ledger: ledger.complete_episodes([1, 0], [1, 0], now_ns=0),
        "lane 0 episode 0 is still running",
    ),
    "complete-short-success": (
        lambda ledger: ledger.complete_episodes([1], [1], [True, False], now_ns=0),
        "success has 2 entries",
    ),
    "complete-out-of-range": (
        lambda ledger: ledger.complete_episodes([1, 4], [1, 9], now_ns=0),
        "lane 4 is out of range",
    ),
    "roll-running-lane": (
        lambda ledger: ledger.observe_rolls([3, 0], [9, 9], now_ns=0),
        "lane 0 rolled to env episode 9",
    ),
    "roll-out-of-range": (
        lambda ledger: ledger.observe_rolls([3, 9], [9, 9], now_ns=0),
        "lane 9 is out of range",
    ),
    "predict-ended-lane": (
        lambda ledger: ledger.mark_predicted([2, 1]),
        "lane 1 is ended, not running",
    ),
    "take-ends-2d": (
        lambda ledger: ledger.take_model_ends(np.zeros((1, 2), dtype=np.int64)),
        "episode_ids must be a 1-D array",
    ),
    "query-duplicate": (lambda ledger: ledger.episode_ids([0, 0]), "lane 0 appears twice"),
}


@pytest.mark.parametrize("name", list(INVALID_CALLS))
def test_a_refused_call_changes_nothing(core, name):
    call, message = INVALID_CALLS[name]
    ledger = prepared_ledger(core)
    untouched = prepared_ledger(core)
    before = ledger.snapshot()
    with pytest.raises(ValueError, match=re.escape(message)):
        call(ledger)
    assert ledger.snapshot() == before
    # State the snapshot does not show (start times, timings) must be untouched too: the same
    # continuation on both ledgers gives the same summaries.
    for twin in (ledger, untouched):
        twin.complete_episodes([1], [1], [True], now_ns=1_000)
        step(twin, [0, 2], terminated=[0, 2], step_ns=5, predict_ns=2)
        twin.complete_episodes([0, 2], [0, 2], now_ns=2_000)
    assert [s.to_dict() for s in ledger.summaries()] == [s.to_dict() for s in untouched.summaries()]
    assert (
        ledger.take_all_model_ends().tolist() == untouched.take_all_model_ends().tolist() == [0, 1]
    )


# ---------------------------------------------------------------------------- end to end


def cartpole_policy(observation: np.ndarray) -> int:
    """Push towards the side the pole leans: deterministic, and fails after a few dozen steps."""
    return int(observation[2] > 0)


def make_cartpole():
    # A short time limit so some episodes truncate and others terminate.
    return gym.make("CartPole-v1", max_episode_steps=45)


def reference_episode(seed: int) -> tuple[int, float, bool, bool]:
    """One episode the plain way: reset with the seed, step until it ends."""
    env = make_cartpole()
    observation, _ = env.reset(seed=seed)
    steps, total = 0, 0.0
    while True:
        observation, reward, terminated, truncated, _ = env.step(cartpole_policy(observation))
        steps += 1
        total += float(reward)
        if terminated or truncated:
            env.close()
            return steps, total, bool(terminated), bool(truncated)


def run_with_ledger(core, num_lanes: int, episodes: int, base_seed: int, lockstep: bool):
    """Drive separate CartPole lanes through the ledger the way the driver does.

    Subset mode steps only running lanes and idles lanes once the budget is spent; lockstep
    mode restarts every lane that ends, running surplus episodes past the budget.
    """
    envs = [make_cartpole() for _ in range(num_lanes)]
    ledger = core.RouteLedger(num_lanes, episodes, base_seed=base_seed)
    overflow = "surplus" if lockstep else "idle"
    observations: dict[int, np.ndarray] = {}
    surplus_lanes: set[int] = set()
    surplus_steps = 0
    clock = 0

    def reset(starts):
        started = zip(starts.lanes.tolist(), starts.seeds, strict=True)
        surplus = [(lane, None) for lane in starts.surplus_lanes.tolist()]
        surplus_lanes.difference_update(starts.lanes.tolist())
        surplus_lanes.update(lane for lane, _ in surplus)
        for lane, seed in [*started, *surplus]:
            observations[lane], _ = envs[lane].reset(seed=seed)

    reset(ledger.start_episodes(np.arange(num_lanes), now_ns=clock, overflow=overflow))
    while not ledger.done:
        clock += 1_000
        lanes = ledger.running_lanes()
        ledger.mark_predicted(lanes)
        actions = [cartpole_policy(observations[lane]) for lane in lanes.tolist()]
        surplus_steps += len(surplus_lanes.intersection(lanes.tolist()))
        rewards = np.zeros(len(lanes))
        terminated = np.zeros(len(lanes), dtype=np.bool_)
        truncated = np.zeros(len(lanes), dtype=np.bool_)
        for position, (lane, action) in enumerate(zip(lanes.tolist(), actions, strict=True)):
            step_result = envs[lane].step(action)
            observations[lane] = step_result[0]
            rewards[position], terminated[position], truncated[position] = step_result[1:4]
        timings = np.full(len(lanes), 10, dtype=np.int64)
        ended = ledger.record_step(lanes, rewards, terminated, truncated, timings, timings)
        ids = ledger.episode_ids(ended)
        ledger.complete_episodes(ended, ids, now_ns=clock)
        assert ledger.take_model_ends(ids).tolist() == ids.tolist()
        reset(ledger.start_episodes(ended, now_ns=clock, overflow=overflow))
    for env in envs:
        env.close()
    return ledger, surplus_steps


def comparable(summary) -> tuple:
    """Every summary field the determinism contract covers (not timings, not lane or id)."""
    return (
        summary.index,
        summary.seed,
        summary.trial,
        summary.steps,
        summary.reward,
        summary.terminated,
        summary.truncated,
        summary.success,
    )


@pytest.mark.parametrize("lockstep", [False, True], ids=["subset", "lockstep"])
def test_cartpole_results_match_plain_loop_for_any_lane_count(core, lockstep):
    episodes, base_seed = 10, 3
    expected = []
    for index in range(episodes):
        seed = core.episode_seed(base_seed, index)
        steps, reward, terminated, truncated = reference_episode(seed)
        expected.append((index, seed, index, steps, reward, terminated, truncated, None))
    # The scenario exercises both ways an episode ends.
    assert {row[5] for row in expected} == {True, False}

    for num_lanes in (1, 3, 8):
        ledger, surplus_steps = run_with_ledger(core, num_lanes, episodes, base_seed, lockstep)
        results = sorted(comparable(summary) for summary in ledger.summaries())
        assert results == expected, f"num_lanes={num_lanes}"
        assert ledger.completed == ledger.slots_claimed == episodes
        assert ledger.ignored_completions == 0
        # Exactly the lane-steps spent on surplus episodes are wasted.
        assert ledger.wasted_steps == surplus_steps
        if lockstep:
            assert ledger.idle_lanes().tolist() == []
            assert surplus_steps > 0 or num_lanes == 1
        else:
            assert ledger.wasted_steps == 0
            assert ledger.running_lanes().tolist() == []
            assert ledger.idle_lanes().tolist() == list(range(num_lanes))
        # Surplus episodes still running at teardown that the model predicted on are owed
        # their end (each end before was taken as it completed).
        predicted = [lane["episode_id"] for lane in ledger.snapshot()["lanes"] if lane["predicted"]]
        assert ledger.take_all_model_ends().tolist() == sorted(predicted)
        if not lockstep:
            assert predicted == []
        elif num_lanes == 8:
            assert predicted


def test_a_refused_success_value_completes_nothing(core):
    ledger = core.RouteLedger(2, 2)
    ledger.start_episodes([0, 1], now_ns=0)
    ledger.record_step([0, 1], [1.0, 1.0], [True, True], [False, False], [0, 0], [0, 0])
    before = ledger.snapshot()
    # The truth value of a two-element array is ambiguous: the call must fail before any lane
    # is completed.
    with pytest.raises(ValueError, match="truth value"):
        ledger.complete_episodes([0, 1], [0, 1], [True, np.array([1, 2])], now_ns=1)
    assert ledger.snapshot() == before


def test_unsigned_values_beyond_int64_are_refused_not_wrapped(core):
    ledger = core.RouteLedger(1, 1)
    ledger.start_episodes([0], now_ns=0)
    huge = np.array([2**64 - 1], dtype=np.uint64)
    with pytest.raises(
        ValueError, match=r"^step_ns holds 18446744073709551615, which does not fit in int64$"
    ):
        ledger.record_step([0], [0.0], [False], [False], huge, [0])
    with pytest.raises(ValueError, match=r"^lanes holds 9223372036854775808, which does not fit"):
        ledger.record_step(np.array([2**63], dtype=np.uint64), [0.0], [False], [False], [0], [0])


def test_num_lanes_has_an_upper_bound(core):
    with pytest.raises(
        ValueError, match=r"^num_lanes must be at most 16777216, got 1099511627776$"
    ):
        core.RouteLedger(2**40, 1)


def test_seeds_must_be_iterable(core):
    with pytest.raises(ValueError, match=r"^seeds must be a sequence of integers, got int$"):
        core.RouteLedger(1, 1, seeds=5)


def test_timing_sums_past_int64_stay_exact():
    """Rust sums timings in i128, so it agrees with Python's unbounded ints."""
    summaries = {}
    for name in ("rust", "python"):
        ledger = load_core(name).RouteLedger(1, 1)
        ledger.start_episodes([0], now_ns=-(2**63))
        for done in (False, False, True):
            ledger.record_step([0], [0.0], [done], [False], [2**62], [2**62])
        summaries[name] = ledger.complete_episodes([0], [0], now_ns=2**63 - 1)[0].to_dict()
    assert summaries["rust"] == summaries["python"]
    assert summaries["python"]["step_ms"] == 2**62 / 1e6
    assert summaries["python"]["duration_s"] == float(2**64 - 1) / 1e9


def test_a_ledger_can_run_only_some_slots_with_their_own_seeds(core):
    ledger = core.RouteLedger(2, 6, base_seed=3, indices=[1, 4, 5])
    assert ledger.slots_remaining == 3
    starts = ledger.start_episodes([0, 1], now_ns=0)
    assert starts.indices.tolist() == [1, 4]
    assert starts.seeds == [episode_seed_of(core, 3, 1), episode_seed_of(core, 3, 4)]
    finish(ledger, [0, 1])
    assert not ledger.done
    last = ledger.start_episodes([1, 0], now_ns=0)
    assert (last.indices.tolist(), last.idle_lanes.tolist()) == ([5], [0])
    finish(ledger, [1])
    assert ledger.done
    assert sorted(summary.index for summary in ledger.summaries()) == [1, 4, 5]


def episode_seed_of(core, base, index):
    return core.episode_seed(base, index)


@pytest.mark.parametrize(
    ("indices", "message"),
    [
        ([], r"^indices must name at least one slot$"),
        ([2, 1], r"^indices must be strictly increasing, but indices\[1\] is 1 after 2$"),
        ([0, 6], r"^indices\[1\] is 6, outside the slots 0\.\.5$"),
        ([-1], r"^indices\[0\] must be an integer in \[0, 2\*\*64\), got -1$"),
        (3, r"^indices must be a sequence of integers, got int$"),
    ],
)
def test_bad_indices_are_refused(core, indices, message):
    with pytest.raises(ValueError, match=message):
        core.RouteLedger(1, 6, indices=indices)
