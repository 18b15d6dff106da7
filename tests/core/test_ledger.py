"""The episode ledger a RoundRunner owns: slot claims, seeds, steps, finishes, rolls, model ends.

The ledger is internal to the runner in both cores, so it is driven here through the runner
alone, the way the driver drives it: ``start`` (then the resets' observations), rounds of
``begin_round`` / ``take_actions`` / ``end_round`` over every running lane, and ``finish`` for
the lanes whose episode ended; its state is read off ``snapshot()``. The model and env are
stand-ins of the smallest spaces (a ``Box(1,)`` observation, a ``Discrete(2)`` action): what is
under test is the bookkeeping, not the envs. Every test runs against both cores through the
``core`` fixture (see conftest.py).
"""

from __future__ import annotations

import re
import warnings

import gymnasium as gym
import numpy as np
import pytest
from rlmesh.adapters import compile_spec
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
    "error",
    "reset_digest",
    "trajectory_digest",
]
STARTS_FIELDS = (
    "lanes",
    "episode_ids",
    "indices",
    "trials",
    "surplus_lanes",
    "surplus_episode_ids",
)
PLAN = compile_spec(None, gym.spaces.Box(-1, 1, (1,), np.float32), gym.spaces.Discrete(2))
OBSERVATION = np.zeros(1, np.float32)


def runner_of(core, num_lanes, episodes, **kwargs):
    """A runner of the smallest plan: what the ledger does is all there is to see."""
    return core.RoundRunner(num_lanes, episodes, PLAN.observation, PLAN.action, **kwargs)


def start(runner, lanes, *, now_ns=0):
    """``runner.start``, then every started lane's first observation, as the driver resets."""
    starts = runner.start(lanes, now_ns=now_ns)
    reset = np.concatenate([starts.lanes, starts.surplus_lanes])
    runner.set_observations(reset, [OBSERVATION] * len(reset))
    return starts


def step(
    runner,
    *,
    reward=1.0,
    terminated=(),
    truncated=(),
    step_ns=2_000,
    predict_ns=1_000,
    now_ns=0,
    predict=True,
):
    """One round over every running lane; returns the lanes whose episode ended.

    ``reward`` is one for every lane, or ``{lane: reward}``. ``predict=False`` closes the round
    without calling the model (as when every lane replays a queued action): its episodes are
    not predicted on."""
    running, predict_lanes, _ = runner.begin_round()
    if predict:
        runner.take_actions(np.zeros(len(predict_lanes), np.int64), predict_ns)
    lanes = running.tolist()
    rewards = [reward[lane] if isinstance(reward, dict) else reward for lane in lanes]
    ended, _ = runner.end_round(
        np.array(rewards, dtype=np.float64),
        np.isin(running, list(terminated)),
        np.isin(running, list(truncated)),
        step_ns,
        now_ns,
    )
    return ended.tolist()


def finish(runner, lanes, *, now_ns=0, success=None):
    """End the episodes on ``lanes`` with one last round and finish them; their summaries."""
    assert step(runner, terminated=lanes, now_ns=now_ns) == sorted(lanes)
    successes = [None] * len(lanes) if success is None else success
    summaries, _, _ = runner.finish(lanes, successes)
    return summaries


def lanes_of(runner):
    return runner.snapshot()["lanes"]


def lane_states(runner):
    return [lane["state"] for lane in lanes_of(runner)]


def starts_as_lists(starts):
    """An EpisodeStarts as plain lists, field by field."""
    lists = {field: getattr(starts, field).tolist() for field in STARTS_FIELDS}
    return {**lists, "seeds": list(starts.seeds)}


NOTHING_STARTED = {field: [] for field in [*STARTS_FIELDS, "seeds"]}


# ---------------------------------------------------------------------------- construction


def test_a_new_run_holds_no_episode(core):
    runner = runner_of(core, 3, 5, base_seed=9, trial_index_base=100)
    assert (runner.done, runner.wasted_steps) == (False, 0)
    assert runner.running_lanes().tolist() == []
    assert runner.episode_ids([0, 1, 2]).tolist() == [-1, -1, -1]
    assert runner.summaries() == []
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
    assert runner.snapshot() == {
        "num_lanes": 3,
        "episodes": 5,
        "indices": None,
        "base_seed": 9,
        "trial_index_base": 100,
        "slots_claimed": 0,
        "returned_slots": [],
        "completed": 0,
        "wasted_steps": 0,
        "ignored_completions": 0,
        "next_episode_id": 0,
        "untold_model_ends": [],
        "lanes": [fresh_lane] * 3,
        "summaries": [],
        "frame_windows": 0,
        "queued": None,
        "ensembled": None,
    }


def test_base_seed_and_trial_index_base_of_none_mean_zero(core):
    runner = runner_of(core, 1, 1, base_seed=None, trial_index_base=None)
    snapshot = runner.snapshot()
    assert (snapshot["base_seed"], snapshot["trial_index_base"]) == (0, 0)
    assert runner.start([0], now_ns=0).seeds == SEEDS_BASE_0[:1]


def test_counts_accept_numpy_integers(core):
    runner = runner_of(core, np.int64(2), np.uint32(3), base_seed=np.uint64(2**64 - 1))
    snapshot = runner.snapshot()
    assert (snapshot["num_lanes"], snapshot["episodes"], snapshot["base_seed"]) == (2, 3, 2**64 - 1)


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
        (2**40, 1, "num_lanes must be at most 16777216, got 1099511627776"),
    ],
)
def test_the_runner_refuses_bad_counts(core, num_lanes, episodes, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        runner_of(core, num_lanes, episodes)


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
        ({"seeds": 5}, "seeds must be a sequence of integers, got int"),
    ],
)
def test_the_runner_refuses_bad_seeding_arguments(core, kwargs, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        runner_of(core, 2, 3, **kwargs)


def test_last_trial_may_reach_2_pow_63_minus_1(core):
    runner = runner_of(core, 3, 3, trial_index_base=2**63 - 3)
    starts = runner.start(np.arange(3), now_ns=0)
    assert starts.trials.tolist() == [2**63 - 3, 2**63 - 2, 2**63 - 1]
    assert starts.seeds == [core.episode_seed(0, 2**63 - 3 + k) for k in range(3)]


# ---------------------------------------------------------------------------- seeds


def test_slots_reset_with_derived_seeds_by_default(core):
    starts = runner_of(core, 4, 4).start(np.arange(4), now_ns=0)
    assert starts.seeds == SEEDS_BASE_0


def test_derived_seeds_use_base_seed_and_global_trial_index(core):
    # A shard starting at trial 999 seeds its slot 0 like slot 999 of an unsharded run.
    shard = runner_of(core, 2, 2, base_seed=42, trial_index_base=999)
    starts = shard.start([0, 1], now_ns=0)
    assert starts.seeds == [124376955, core.episode_seed(42, 1000)]  # (42, 999) is pinned
    assert starts.trials.tolist() == [999, 1000]
    assert starts.indices.tolist() == [0, 1]
    whole = runner_of(core, 1, 1001, base_seed=42, indices=[999])
    assert whole.start([0], now_ns=0).seeds == starts.seeds[:1]


def test_listed_seeds_are_used_by_slot_not_by_trial(core):
    starts = runner_of(core, 2, 2, seeds=[7, 8], trial_index_base=10).start([1, 0], now_ns=0)
    assert starts.seeds == [7, 8]
    assert starts.trials.tolist() == [10, 11]


def test_seeds_shorter_than_budget_warn_and_later_slots_derive(core):
    with pytest.warns(UserWarning) as caught:
        runner = runner_of(core, 4, 4, seeds=[11, 22], base_seed=42)
    [warning] = caught
    assert str(warning.message) == (
        "seeds has 2 entries for 4 episodes: slots 2..3 reset with "
        "episode_seed(base_seed=42, trial_index_base + slot)"
    )
    # The warning points at the code that built the runner, not at rlmesh internals.
    assert warning.filename == __file__

    starts = runner.start(np.arange(4), now_ns=0)
    assert starts.seeds == [11, 22, core.episode_seed(42, 2), core.episode_seed(42, 3)]


def test_empty_seed_list_warns_and_every_slot_derives(core):
    with pytest.warns(UserWarning, match=r"^seeds has 0 entries for 2 episodes: slots 0\.\.1 "):
        runner = runner_of(core, 2, 2, seeds=[])
    assert runner.start([0, 1], now_ns=0).seeds == SEEDS_BASE_0[:2]


@pytest.mark.parametrize(
    "seeds", [[5, 6, 7], [5, 6, 7, 8, 9], np.array([5, 6, 7], dtype=np.uint64)]
)
def test_seed_list_covering_the_budget_does_not_warn(core, seeds):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runner = runner_of(core, 3, 3, seeds=seeds)
    starts = runner.start([0, 1, 2], now_ns=0)
    assert starts.seeds == [5, 6, 7]
    assert all(type(seed) is int for seed in starts.seeds)


# ---------------------------------------------------------------------------- start


def test_start_claims_slots_in_the_order_lanes_are_given(core):
    runner = runner_of(core, 4, 10)
    starts = runner.start(np.array([2, 0, 3]), now_ns=5)
    assert starts_as_lists(starts) == {
        **NOTHING_STARTED,
        "lanes": [2, 0, 3],
        "episode_ids": [0, 1, 2],
        "indices": [0, 1, 2],
        "seeds": SEEDS_BASE_0[:3],
        "trials": [0, 1, 2],
    }
    for field in STARTS_FIELDS:
        array = getattr(starts, field)
        assert isinstance(array, np.ndarray)
        assert array.dtype == np.int64
    assert isinstance(starts.seeds, list)
    assert runner.running_lanes().tolist() == [0, 2, 3]
    assert lane_states(runner) == ["running", "vacant", "running", "running"]
    assert runner.episode_ids([0, 1, 2, 3]).tolist() == [1, -1, 0, 2]
    assert runner.episode_ids([3, 1, 2]).tolist() == [2, -1, 0]
    assert runner.snapshot()["slots_claimed"] == 3


def test_start_accepts_plain_lists_like_arrays(core):
    from_list, from_array = runner_of(core, 3, 3), runner_of(core, 3, 3)
    listed = from_list.start([1, 2], now_ns=0)
    arrayed = from_array.start(np.array([1, 2], dtype=np.int32), now_ns=0)
    assert starts_as_lists(listed) == starts_as_lists(arrayed)
    assert from_list.snapshot() == from_array.snapshot()


def test_start_with_no_lanes_starts_nothing(core):
    runner = runner_of(core, 2, 2)
    assert starts_as_lists(runner.start([], now_ns=0)) == NOTHING_STARTED
    # An empty array of any dtype is an empty list of lanes.
    empty = np.array([], dtype=np.float64)
    assert starts_as_lists(runner.start(empty, now_ns=0)) == NOTHING_STARTED
    snapshot = runner.snapshot()
    assert (snapshot["slots_claimed"], snapshot["next_episode_id"]) == (0, 0)


def test_budget_smaller_than_lane_count_idles_the_extra_lanes(core):
    runner = runner_of(core, 5, 3)
    starts = runner.start(np.arange(5), now_ns=0)
    assert starts.lanes.tolist() == [0, 1, 2]
    assert starts.indices.tolist() == [0, 1, 2]
    assert starts.surplus_lanes.tolist() == []
    assert lane_states(runner) == ["running"] * 3 + ["idle"] * 2
    assert runner.running_lanes().tolist() == [0, 1, 2]
    assert runner.episode_ids(np.arange(5)).tolist() == [0, 1, 2, -1, -1]
    snapshot = runner.snapshot()
    assert snapshot["slots_claimed"] == 3
    assert snapshot["next_episode_id"] == 3  # idle lanes get no episode id


def test_budget_smaller_than_lane_count_runs_surplus_on_lockstep_lanes(core):
    runner = runner_of(core, 5, 3, overflow="surplus")
    starts = runner.start(np.arange(5), now_ns=0)
    assert starts.lanes.tolist() == [0, 1, 2]
    assert starts.surplus_lanes.tolist() == [3, 4]
    assert starts.surplus_episode_ids.tolist() == [3, 4]
    assert runner.running_lanes().tolist() == [0, 1, 2, 3, 4]
    surplus_lane = lanes_of(runner)[3]
    assert surplus_lane["surplus"] is True
    assert (surplus_lane["index"], surplus_lane["seed"], surplus_lane["trial"]) == (-1, None, 0)
    assert runner.snapshot()["slots_claimed"] == 3


def test_budget_reached_mid_vector(core):
    runner = runner_of(core, 4, 6)
    start(runner, np.arange(4))
    finish(runner, [0, 1, 3])
    # Two slots are left for three restarting lanes: the first two given get them.
    starts = start(runner, [3, 1, 0])
    assert starts.lanes.tolist() == [3, 1]
    assert starts.indices.tolist() == [4, 5]
    assert starts.episode_ids.tolist() == [4, 5]
    assert lane_states(runner) == ["idle", "running", "running", "running"]
    finish(runner, [1, 2, 3])
    assert runner.done
    assert sorted(summary.index for summary in runner.summaries()) == list(range(6))


def test_idle_lane_starts_no_other_episode(core):
    runner = runner_of(core, 2, 1)
    runner.start([0, 1], now_ns=0)
    with pytest.raises(ValueError, match=r"^lane 1 is idle: no slot was left for it"):
        runner.start([1], now_ns=0)


def test_idle_lanes_are_never_stepped_or_predicted(core):
    runner = runner_of(core, 2, 1)
    start(runner, [0, 1])
    running, predict_lanes, _ = runner.begin_round()
    assert (running.tolist(), predict_lanes.tolist()) == ([0], [0])
    assert step(runner) == []
    assert [lane["steps"] for lane in lanes_of(runner)] == [1, 0]
    assert [lane["predicted"] for lane in lanes_of(runner)] == [True, False]


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
        (np.array([2**63], dtype=np.uint64), "lanes holds 9223372036854775808, which does not fit"),
    ],
)
def test_start_refuses_bad_lanes(core, lanes, message):
    runner = runner_of(core, 4, 4)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        runner.start(lanes, now_ns=0)
    assert runner.snapshot()["slots_claimed"] == 0


def test_start_refuses_a_lane_still_holding_an_episode(core):
    runner = runner_of(core, 3, 5)
    start(runner, [0, 1])
    step(runner, terminated=[1])
    running = r"^lane 0 still holds running episode 0: complete it before starting another$"
    with pytest.raises(ValueError, match=running):
        runner.start([2, 0], now_ns=0)
    ended = r"^lane 1 still holds ended episode 1: complete it before starting another$"
    with pytest.raises(ValueError, match=ended):
        runner.start([1], now_ns=0)
    assert lane_states(runner) == ["running", "ended", "vacant"]  # lane 2 did not start either


@pytest.mark.parametrize(
    ("now_ns", "message"),
    [
        (1.5, "now_ns must be an integer in [-2**63, 2**63), got float"),
        ("0", "now_ns must be an integer in [-2**63, 2**63), got str"),
        (2**63, "now_ns must be an integer in [-2**63, 2**63), got 9223372036854775808"),
    ],
)
def test_start_refuses_a_bad_clock_reading(core, now_ns, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        runner_of(core, 1, 1).start([0], now_ns=now_ns)


# ---------------------------------------------------------------------------- steps


def test_a_round_accumulates_and_returns_the_ended_lanes(core):
    runner = runner_of(core, 3, 3)
    start(runner, [2, 0, 1])
    ended = step(runner, reward={0: 1.0, 1: -2.0, 2: 0.5}, terminated=[2], truncated=[1])
    assert ended == [1, 2]  # in the order of the running lanes
    assert lane_states(runner) == ["running", "ended", "ended"]
    assert runner.running_lanes().tolist() == [0]
    lanes = lanes_of(runner)
    assert [lane["steps"] for lane in lanes] == [1, 1, 1]
    assert [lane["reward"] for lane in lanes] == [1.0, -2.0, 0.5]
    assert [lane["terminated"] for lane in lanes] == [False, False, True]
    assert [lane["truncated"] for lane in lanes] == [False, True, False]

    assert step(runner, reward=0.25) == []
    assert step(runner, reward=0.25, terminated=[0], truncated=[0]) == [0]
    lane = lanes_of(runner)[0]
    assert (lane["steps"], lane["reward"], lane["terminated"], lane["truncated"]) == (
        3,
        1.5,
        True,
        True,
    )


def test_end_round_accepts_plain_lists_and_integer_flags(core):
    runner = runner_of(core, 2, 2)
    start(runner, [0, 1])
    runner.begin_round()
    # Integer rewards and 0/1 flags are what a pure-Python env loop may hand over.
    ended, _ = runner.end_round([2, 3], [0, 1], [0, 0], 5, 0)
    assert ended.tolist() == [1]
    assert [lane["reward"] for lane in lanes_of(runner)] == [2.0, 3.0]


def test_a_round_with_no_running_lane_changes_no_lane(core):
    runner = runner_of(core, 1, 1)
    before = runner.snapshot()
    assert runner.begin_round()[0].tolist() == []
    assert runner.end_round([], [], [], 0, 0)[0].tolist() == []
    assert runner.snapshot() == before


def test_a_refused_end_round_changes_nothing(core):
    runner = runner_of(core, 2, 2)
    start(runner, [0, 1])
    runner.begin_round()
    runner.take_actions(np.zeros(2, np.int64), 0)
    before = runner.snapshot()
    message = r"^step_ns must be a duration in nanoseconds \(>= 0\), got -5$"
    with pytest.raises(ValueError, match=message):
        runner.end_round([1.0, 1.0], [True, False], [False, False], -5, 0)
    assert runner.snapshot() == before
    assert runner.rounds == 0


def test_surplus_steps_are_wasted_and_never_scored(core):
    runner = runner_of(core, 3, 1, overflow="surplus")
    start(runner, np.arange(3))
    for _ in range(3):
        step(runner)
    assert runner.wasted_steps == 6  # lanes 1 and 2, three steps each
    assert step(runner, terminated=[1]) == [1]
    assert runner.wasted_steps == 8
    assert runner.finish([1], [True])[0] == []
    snapshot = runner.snapshot()
    assert (snapshot["completed"], snapshot["ignored_completions"]) == (0, 0)
    assert lane_states(runner) == ["running", "vacant", "running"]
    assert runner.summaries() == []
    start(runner, [1])  # the spent budget restarts lane 1 on a surplus episode
    finish(runner, [0])
    assert runner.done
    assert [summary.index for summary in runner.summaries()] == [0]
    assert runner.wasted_steps == 10  # scored steps are not wasted


# ---------------------------------------------------------------------------- finish


def test_summary_fields(core):
    runner = runner_of(core, 2, 2, trial_index_base=5)
    start(runner, [1], now_ns=1_000_000_000)
    step(runner, reward=1.0, step_ns=2_000_000, predict_ns=1_000_000)
    step(runner, reward=0.5, step_ns=4_000_000, predict_ns=1_000_000)
    step(
        runner,
        reward=0.25,
        truncated=[1],
        step_ns=6_000_000,
        predict_ns=4_000_000,
        now_ns=3_500_000_000,
    )
    [summary], episode_ids, _ = runner.finish([1], [True])
    assert episode_ids.tolist() == [0]
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
        "duration_s": 2.5,  # from the start's now_ns to that of the round it ended in
        "predict_ms": 2.0,  # 6 ms of model time over 3 steps
        "step_ms": 4.0,  # 12 ms of env time over 3 steps
        "error": None,
        "reset_digest": core.value_digest(OBSERVATION),  # the episode's first observation's
        "trajectory_digest": summary.trajectory_digest,  # tests/core/test_digests.py checks it
    }
    assert list(summary.to_dict()) == SUMMARY_FIELDS
    # Plain Python types (dict equality alone would let 1 pass for True or numpy for int).
    expected_types = dict.fromkeys(SUMMARY_FIELDS, int)
    expected_types.update(dict.fromkeys(["terminated", "truncated", "success"], bool))
    expected_types.update(dict.fromkeys(["reward", "duration_s", "predict_ms", "step_ms"], float))
    expected_types["error"] = type(None)  # an episode that ended has no env error
    expected_types.update(dict.fromkeys(["reset_digest", "trajectory_digest"], str))
    for field, value in summary.to_dict().items():
        assert getattr(summary, field) == value
        assert type(value) is expected_types[field], field
        assert type(getattr(summary, field)) is expected_types[field], field


def test_summary_means_are_per_step(core):
    runner = runner_of(core, 1, 1)
    start(runner, [0])
    for step_ns in (1_000_000, 2_000_000, 4_000_000, 1_000_000):
        step(runner, step_ns=step_ns, predict_ns=step_ns // 2)
    step(runner, terminated=[0], step_ns=2_000_000, predict_ns=0, now_ns=250_000_000)
    [summary], _, _ = runner.finish([0], [None])
    assert summary.steps == 5
    assert summary.step_ms == pytest.approx(2.0)
    assert summary.predict_ms == pytest.approx(0.8)
    assert summary.duration_s == pytest.approx(0.25)


def test_success_is_true_false_or_unknown(core):
    runner = runner_of(core, 3, 6)
    start(runner, np.arange(3))
    given = finish(runner, [0, 1, 2], success=[True, False, None])
    assert [summary.success for summary in given] == [True, False, None]

    start(runner, np.arange(3))
    # numpy booleans and 0/1 come back as plain bools.
    from_numpy = finish(runner, [0, 1], success=np.array([1, 0]))
    assert [summary.success for summary in from_numpy] == [True, False]
    assert all(type(summary.success) is bool for summary in from_numpy)
    [unknown] = finish(runner, [2])
    assert unknown.success is None


def test_finish_returns_summaries_in_given_order_and_frees_lanes(core):
    runner = runner_of(core, 3, 6)
    start(runner, np.arange(3))
    step(runner, terminated=[0, 2])
    summaries, episode_ids, _ = runner.finish(np.array([2, 0]), [None, None])
    assert [(s.env_index, s.index, s.episode_id) for s in summaries] == [(2, 2, 2), (0, 0, 0)]
    assert episode_ids.tolist() == [2, 0]
    assert lane_states(runner) == ["vacant", "running", "vacant"]
    assert runner.episode_ids([0, 1, 2]).tolist() == [-1, 1, -1]
    assert runner.snapshot()["completed"] == 2
    cleared = lanes_of(runner)[0]
    assert (cleared["index"], cleared["seed"], cleared["surplus"]) == (-1, None, False)


def test_summaries_are_listed_in_finishing_order(core):
    runner = runner_of(core, 2, 2)
    start(runner, [0, 1])
    finish(runner, [1])
    finish(runner, [0])
    listed = runner.summaries()
    assert [summary.index for summary in listed] == [1, 0]
    listed.clear()  # the runner hands out a copy
    assert len(runner.summaries()) == 2
    assert runner.snapshot()["summaries"] == [s.to_dict() for s in runner.summaries()]


def test_finish_refuses_an_episode_still_running_and_finishes_none(core):
    runner = runner_of(core, 2, 2)
    start(runner, [0, 1])
    step(runner, terminated=[1])
    message = (
        r"^lane 0 episode 0 is still running: only lanes end_round returned as ended may be "
        r"finished$"
    )
    with pytest.raises(ValueError, match=message):
        runner.finish([1, 0], [None, None])
    assert lane_states(runner) == ["running", "ended"]  # lane 1 was not finished either


def test_finishing_a_lane_twice_is_ignored_and_never_double_scored(core):
    runner = runner_of(core, 1, 3)
    start(runner, [0])
    [first] = finish(runner, [0])
    summaries, episode_ids, model_ends = runner.finish([0], [True])
    assert (summaries, episode_ids.tolist(), model_ends.tolist()) == ([], [-1], [])
    snapshot = runner.snapshot()
    assert (snapshot["ignored_completions"], snapshot["completed"]) == (1, 1)
    assert [summary.to_dict() for summary in runner.summaries()] == [first.to_dict()]


def test_finishing_a_vacant_or_idle_lane_is_ignored(core):
    runner = runner_of(core, 3, 1)
    start(runner, [0, 2])
    assert runner.finish([1, 2], [None, None])[0] == []
    assert runner.snapshot()["ignored_completions"] == 2
    assert lane_states(runner) == ["running", "vacant", "idle"]


def test_done_and_completed_over_a_run(core):
    runner = runner_of(core, 2, 3)
    start(runner, [0, 1])

    def progress():
        snapshot = runner.snapshot()
        return snapshot["slots_claimed"], snapshot["completed"], runner.done

    assert progress() == (2, 0, False)
    finish(runner, [1])
    start(runner, [1])
    assert progress() == (3, 1, False)
    finish(runner, [1])
    assert start(runner, [1]).lanes.tolist() == []  # no slot left: lane 1 goes idle
    assert lane_states(runner)[1] == "idle"
    assert progress() == (3, 2, False)
    finish(runner, [0])
    assert progress() == (3, 3, True)


def test_a_refused_success_value_finishes_nothing(core):
    runner = runner_of(core, 2, 2)
    start(runner, [0, 1])
    step(runner, terminated=[0, 1])
    before = runner.snapshot()
    # The truth value of a two-element array is ambiguous: the call must fail before any lane
    # is finished.
    with pytest.raises(ValueError, match="truth value"):
        runner.finish([0, 1], [True, np.array([1, 2])])
    assert runner.snapshot() == before


# ---------------------------------------------------------------------------- model ends


def test_a_model_end_is_owed_once_when_its_episode_finishes(core):
    runner = runner_of(core, 2, 4)
    start(runner, [0, 1])
    step(runner, terminated=[0, 1])
    assert runner.snapshot()["untold_model_ends"] == []  # not finished: nothing owed yet
    _, episode_ids, model_ends = runner.finish(np.array([1, 0]), [None, None])
    assert model_ends.dtype == np.int64
    assert model_ends.tolist() == episode_ids.tolist() == [1, 0]  # in the order given
    assert runner.snapshot()["untold_model_ends"] == []
    assert runner.take_all_model_ends().tolist() == []


def test_no_model_end_is_owed_for_an_episode_never_predicted(core):
    runner = runner_of(core, 2, 2)
    start(runner, [0, 1])
    assert step(runner, terminated=[0], predict=False) == [0]
    assert runner.finish([0], [None])[2].tolist() == []
    assert step(runner, terminated=[1]) == [1]  # predicted in its last round
    assert runner.finish([1], [None])[2].tolist() == [1]
    assert runner.take_all_model_ends().tolist() == []


def test_a_model_end_is_owed_for_surplus_episodes(core):
    runner = runner_of(core, 2, 1, overflow="surplus")
    starts = start(runner, [0, 1])
    [surplus_id] = starts.surplus_episode_ids.tolist()
    step(runner, terminated=[1])
    summaries, _, model_ends = runner.finish([1], [None])
    assert summaries == []
    assert model_ends.tolist() == [surplus_id]


def test_predicting_twice_still_owes_one_end(core):
    runner = runner_of(core, 1, 2)
    start(runner, [0])
    step(runner)
    step(runner, terminated=[0])
    assert runner.finish([0], [None])[2].tolist() == [0]
    assert runner.take_all_model_ends().tolist() == []


def test_take_all_model_ends_at_teardown(core):
    runner = runner_of(core, 4, 10)
    start(runner, np.arange(4))  # episodes 0..3
    step(runner, terminated=[0])
    runner.finish([0], [None])  # its end is owed, and taken, here
    step(runner, terminated=[1])  # ended, predicted, not finished
    start(runner, [0])  # episode 4, never predicted
    # Owed: ended 1, running 2 and 3. Not 0 (already told) or 4 (never predicted).
    owed = runner.take_all_model_ends()
    assert owed.dtype == np.int64
    assert owed.tolist() == [1, 2, 3]
    assert runner.take_all_model_ends().tolist() == []
    # Finishing those episodes later owes nothing more: each end is delivered once.
    assert runner.finish([1], [None])[2].tolist() == []
    assert runner.snapshot()["untold_model_ends"] == []
    assert not any(lane["predicted"] for lane in lanes_of(runner))


def test_take_all_model_ends_is_ascending(core):
    runner = runner_of(core, 3, 6)
    start(runner, [2, 1, 0])  # lane 2 holds episode 0, lane 0 episode 2
    step(runner, terminated=[0], predict=False)
    runner.finish([0], [None])
    start(runner, [0])  # episode 3
    step(runner)
    assert runner.take_all_model_ends().tolist() == [0, 1, 3]


# ---------------------------------------------------------------------------- observe_rolls


def test_first_observed_env_episode_id_is_a_baseline(core):
    runner = runner_of(core, 3, 3, overflow="surplus")
    starts = runner.observe_rolls(np.arange(3), np.array([5, 0, 5]), now_ns=0)
    assert starts_as_lists(starts) == NOTHING_STARTED
    assert [lane["env_episode_id"] for lane in lanes_of(runner)] == [5, 0, 5]
    assert runner.snapshot()["slots_claimed"] == 0
    # The same ids again: nothing rolled.
    assert starts_as_lists(runner.observe_rolls([0, 1, 2], [5, 0, 5], now_ns=0)) == (
        NOTHING_STARTED
    )


def test_rolled_lane_claims_the_next_slot_with_no_seed(core):
    runner = runner_of(core, 3, 5, trial_index_base=100, overflow="surplus")
    start(runner, np.arange(3))
    runner.observe_rolls(np.arange(3), np.zeros(3, dtype=np.int64), now_ns=0)
    finish(runner, [1])
    starts = runner.observe_rolls(np.arange(3), np.array([0, 1, 0]), now_ns=50)
    assert starts_as_lists(starts) == {
        **NOTHING_STARTED,
        "lanes": [1],
        "episode_ids": [3],
        "indices": [3],
        "seeds": [None],  # the environment chose the start
        "trials": [103],
    }
    lane = lanes_of(runner)[1]
    assert (lane["state"], lane["seed"], lane["env_episode_id"]) == ("running", None, 1)
    runner.set_observations([1], [OBSERVATION])
    [summary] = finish(runner, [0, 1, 2], now_ns=150)[1:2]
    assert (summary.index, summary.seed, summary.trial) == (3, None, 103)
    assert summary.duration_s == pytest.approx(100e-9)


def test_roll_on_a_single_lane(core):
    runner = runner_of(core, 4, 8)
    start(runner, np.arange(4))
    runner.observe_rolls(np.arange(4), [0, 0, 0, 0], now_ns=0)
    finish(runner, [2])
    starts = runner.observe_rolls([2], [1], now_ns=0)
    assert starts.lanes.tolist() == [2]
    assert starts.indices.tolist() == [4]
    assert runner.running_lanes().tolist() == [0, 1, 2, 3]
    assert [lane["env_episode_id"] for lane in lanes_of(runner)] == [0, 0, 1, 0]


def test_rolls_after_the_budget_run_surplus(core):
    runner = runner_of(core, 2, 2, overflow="surplus")
    start(runner, [0, 1])
    runner.observe_rolls([0, 1], [0, 0], now_ns=0)
    finish(runner, [0])
    starts = runner.observe_rolls([0, 1], [1, 0], now_ns=0)
    assert starts.lanes.tolist() == []
    assert starts.surplus_lanes.tolist() == [0]
    assert starts.surplus_episode_ids.tolist() == [2]
    runner.set_observations([0], [OBSERVATION])
    step(runner)
    assert runner.wasted_steps == 1


def test_roll_of_a_lane_still_holding_an_episode_is_refused(core):
    runner = runner_of(core, 2, 4, overflow="surplus")
    start(runner, [0, 1])
    runner.observe_rolls([0, 1], [0, 0], now_ns=0)
    running = (
        r"^lane 1 rolled to env episode 6 but still holds running episode 1: "
        r"complete it before starting another$"
    )
    with pytest.raises(ValueError, match=running):
        runner.observe_rolls([0, 1], [0, 6], now_ns=0)
    step(runner, terminated=[0])
    ended = r"^lane 0 rolled to env episode 1 but still holds ended episode 0: complete it"
    with pytest.raises(ValueError, match=ended):
        runner.observe_rolls([0], [1], now_ns=0)
    # A refused roll does not move the baseline either.
    assert [lane["env_episode_id"] for lane in lanes_of(runner)] == [0, 0]


@pytest.mark.parametrize(
    ("lanes", "env_ids", "message"),
    [
        ([0, 1], [3], "env_episode_ids has 1 entries but lanes has 2"),
        ([0], [1.5], "env_episode_ids must hold integers, got dtype float64"),
        ([0, 2], [1, 1], "lane 2 is out of range: this route has lanes 0..1"),
        ([1, 1], [1, 2], "lane 1 appears twice in lanes"),
        ([0], [0], "now_ns must be an integer in [-2**63, 2**63), got float"),
    ],
)
def test_observe_rolls_refuses_bad_arguments(core, lanes, env_ids, message):
    runner = runner_of(core, 2, 2, overflow="surplus")
    now_ns = 0.5 if message.startswith("now_ns") else 0
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        runner.observe_rolls(lanes, env_ids, now_ns=now_ns)


# ---------------------------------------------------------------------------- atomicity


def prepared_runner(core):
    """Lane 0 running, 1 ended, 2 running, 3 vacant, all predicted once; baselines seen."""
    runner = runner_of(core, 4, 6, seeds=[10, 11, 12, 13, 14, 15], overflow="surplus")
    start(runner, [0, 1, 2], now_ns=100)
    runner.observe_rolls(np.arange(4), [0, 0, 0, 0], now_ns=100)
    step(runner, terminated=[1], step_ns=7, predict_ns=3, now_ns=200)
    return runner


INVALID_CALLS = {
    "start-running-lane": (
        lambda runner: runner.start([3, 0], now_ns=0),
        "lane 0 still holds running",
    ),
    "start-ended-lane": (lambda runner: runner.start([3, 1], now_ns=0), "lane 1 still holds ended"),
    "start-bad-clock": (lambda runner: runner.start([3], now_ns=0.5), "now_ns must be"),
    "start-duplicate": (lambda runner: runner.start([3, 3], now_ns=0), "lane 3 appears twice"),
    "finish-running": (
        lambda runner: runner.finish([1, 0], [None, None]),
        "lane 0 episode 0 is still running",
    ),
    "finish-short-successes": (
        lambda runner: runner.finish([1], [True, False]),
        "successes has 2 entries",
    ),
    "finish-out-of-range": (
        lambda runner: runner.finish([1, 4], [None, None]),
        "lane 4 is out of range",
    ),
    "finish-duplicate": (
        lambda runner: runner.finish([1, 1], [None, None]),
        "lane 1 appears twice",
    ),
    "roll-running-lane": (
        lambda runner: runner.observe_rolls([3, 0], [9, 9], now_ns=0),
        "lane 0 rolled to env episode 9",
    ),
    "roll-out-of-range": (
        lambda runner: runner.observe_rolls([3, 9], [9, 9], now_ns=0),
        "lane 9 is out of range",
    ),
    "query-duplicate": (lambda runner: runner.episode_ids([0, 0]), "lane 0 appears twice"),
}


@pytest.mark.parametrize("name", list(INVALID_CALLS))
def test_a_refused_call_changes_nothing(core, name):
    call, message = INVALID_CALLS[name]
    runner = prepared_runner(core)
    untouched = prepared_runner(core)
    before = runner.snapshot()
    with pytest.raises(ValueError, match=re.escape(message)):
        call(runner)
    assert runner.snapshot() == before
    # State the snapshot does not show (start times, timings) must be untouched too: the same
    # continuation on both runners gives the same summaries.
    for twin in (runner, untouched):
        twin.finish([1], [True])
        step(twin, terminated=[0, 2], step_ns=5, predict_ns=2, now_ns=2_000)
        twin.finish([0, 2], [None, None])
    assert [s.to_dict() for s in runner.summaries()] == [s.to_dict() for s in untouched.summaries()]
    assert runner.take_all_model_ends().tolist() == untouched.take_all_model_ends().tolist() == []


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


def run_cartpole(core, num_lanes: int, episodes: int, base_seed: int, lockstep: bool):
    """Drive separate CartPole lanes through the runner's phases the way the driver does.

    Lanes that step alone go idle once the budget is spent; lockstep lanes restart whenever
    they end, running surplus episodes past the budget.
    """
    envs = [make_cartpole() for _ in range(num_lanes)]
    plan = compile_spec(None, envs[0].observation_space, envs[0].action_space)
    overflow = "surplus" if lockstep else "idle"
    runner = core.RoundRunner(
        num_lanes, episodes, plan.observation, plan.action, base_seed=base_seed, overflow=overflow
    )
    surplus_lanes: set[int] = set()
    surplus_steps = 0
    clock = 0

    def reset(lanes):
        starts = runner.start(lanes, now_ns=clock)
        surplus_lanes.difference_update(starts.lanes.tolist())
        surplus_lanes.update(starts.surplus_lanes.tolist())
        seeds = [*starts.seeds, *[None] * len(starts.surplus_lanes)]
        restarted = [*starts.lanes.tolist(), *starts.surplus_lanes.tolist()]
        observations = [
            envs[lane].reset(seed=seed)[0] for lane, seed in zip(restarted, seeds, strict=True)
        ]
        runner.set_observations(restarted, observations)

    reset(np.arange(num_lanes))
    while not runner.done:
        clock += 1_000
        running, _, payload = runner.begin_round()
        output = np.array([cartpole_policy(row) for row in payload], dtype=np.int64)
        actions = runner.take_actions(output, 10)
        surplus_steps += len(surplus_lanes.intersection(running.tolist()))
        results = [envs[lane].step(actions[k]) for k, lane in enumerate(running.tolist())]
        runner.set_observations(running, [result[0] for result in results])
        ended, _ = runner.end_round(
            np.array([result[1] for result in results], dtype=np.float64),
            np.array([result[2] for result in results], dtype=np.bool_),
            np.array([result[3] for result in results], dtype=np.bool_),
            10,
            clock,
        )
        _, episode_ids, model_ends = runner.finish(ended, [None] * len(ended))
        assert model_ends.tolist() == episode_ids.tolist()
        reset(ended)
    for env in envs:
        env.close()
    return runner, surplus_steps


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
        runner, surplus_steps = run_cartpole(core, num_lanes, episodes, base_seed, lockstep)
        results = sorted(comparable(summary) for summary in runner.summaries())
        assert results == expected, f"num_lanes={num_lanes}"
        snapshot = runner.snapshot()
        assert snapshot["completed"] == snapshot["slots_claimed"] == episodes
        assert snapshot["ignored_completions"] == 0
        # Exactly the lane-steps spent on surplus episodes are wasted.
        assert runner.wasted_steps == surplus_steps
        states = [lane["state"] for lane in snapshot["lanes"]]
        if lockstep:
            assert "idle" not in states
            assert surplus_steps > 0 or num_lanes == 1
        else:
            assert runner.wasted_steps == 0
            assert runner.running_lanes().tolist() == []
            assert states == ["idle"] * num_lanes
        # Surplus episodes still running at teardown that the model predicted on are owed
        # their end (each end before was taken as it finished).
        predicted = [lane["episode_id"] for lane in snapshot["lanes"] if lane["predicted"]]
        assert runner.take_all_model_ends().tolist() == sorted(predicted)
        if not lockstep:
            assert predicted == []
        elif num_lanes == 8:
            assert predicted


def test_timing_sums_past_int64_stay_exact():
    """Rust sums timings in i128, so it agrees with Python's unbounded ints."""
    summaries = {}
    for name in ("rust", "python"):
        runner = runner_of(load_core(name), 1, 1)
        start(runner, [0], now_ns=-(2**63))
        for done in (False, False, True):
            step(
                runner,
                terminated=[0] if done else [],
                step_ns=2**62,
                predict_ns=2**62,
                now_ns=2**63 - 1,
            )
        summaries[name] = runner.finish([0], [None])[0][0].to_dict()
    assert summaries["rust"] == summaries["python"]
    assert summaries["python"]["step_ms"] == 2**62 / 1e6
    assert summaries["python"]["duration_s"] == float(2**64 - 1) / 1e9


def test_a_run_can_play_only_some_slots_with_their_own_seeds(core):
    runner = runner_of(core, 2, 6, base_seed=3, indices=[1, 4, 5])
    assert runner.snapshot()["indices"] == [1, 4, 5]
    starts = start(runner, [0, 1])
    assert starts.indices.tolist() == [1, 4]
    assert starts.seeds == [core.episode_seed(3, 1), core.episode_seed(3, 4)]
    finish(runner, [0, 1])
    assert not runner.done
    last = start(runner, [1, 0])
    assert last.indices.tolist() == [5]
    assert lane_states(runner) == ["idle", "running"]
    finish(runner, [1])
    assert runner.done
    assert sorted(summary.index for summary in runner.summaries()) == [1, 4, 5]


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
        runner_of(core, 1, 6, indices=indices)
