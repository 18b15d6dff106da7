"""Action chunks: split_chunk and the per-lane replay queues, against both cores."""

from __future__ import annotations

import re

import numpy as np
import pytest
from rlmesh.errors import ModelOutputError, RlmeshError


def raises(error: type[Exception], message: str):
    """pytest.raises matching the whole message exactly."""
    return pytest.raises(error, match="^" + re.escape(message) + "$")


def batch(num_lanes: int, horizon: int, *step_shape: int, dtype=np.float32) -> np.ndarray:
    """A ``[N, H, *step_shape]`` chunk batch whose values say where they are: 100*lane + step."""
    values = 100 * np.arange(num_lanes)[:, None] + np.arange(horizon)[None, :]
    values = values.reshape(num_lanes, horizon, *([1] * len(step_shape)))
    return np.broadcast_to(values, (num_lanes, horizon, *step_shape)).astype(dtype)


# ---------------------------------------------------------------------------------- split_chunk


def test_split_chunk_gives_the_horizon_of_an_array_a_list_and_a_nested_dict(core):
    assert core.split_chunk(np.zeros((8, 7), dtype=np.float32)) == 8
    assert core.split_chunk([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]) == 3
    assert core.split_chunk(np.arange(5)) == 5  # a Discrete action per step: [H]
    chunk = {"arm": np.zeros((4, 7)), "hand": {"grip": np.zeros(4), "roll": [1, 2, 3, 4]}}
    assert core.split_chunk(chunk) == 4


def test_split_chunk_of_a_batch_gives_the_horizon_after_the_lane_axis(core):
    assert core.split_chunk(np.zeros((256, 8, 7)), num_lanes=256) == 8
    assert core.split_chunk({"a": np.zeros((3, 2)), "b": np.zeros((3, 2, 5))}, num_lanes=3) == 2
    assert core.split_chunk(np.zeros((0, 6, 2)), num_lanes=0) == 6


def test_an_empty_chunk_is_a_model_output_error(core):
    with raises(
        ModelOutputError,
        "action is an empty chunk: shape (0, 7) holds H = 0 actions, expected at least 1",
    ):
        core.split_chunk(np.zeros((0, 7)))
    with raises(
        ModelOutputError,
        'action["arm"] is an empty chunk: shape (4, 0, 7) holds H = 0 actions, expected at least 1',
    ):
        core.split_chunk({"arm": np.zeros((4, 0, 7))}, num_lanes=4)


def test_leaves_that_disagree_on_the_horizon_are_both_named(core):
    with raises(
        ModelOutputError,
        'action["hand"]["grip"] has H = 3 actions but action["arm"] has H = 8: every leaf of '
        "a chunk must share the horizon H",
    ):
        core.split_chunk({"arm": np.zeros((8, 7)), "hand": {"grip": np.zeros(3)}})
    with raises(
        ModelOutputError,
        'action["b"] has H = 5 actions but action["a"] has H = 4: every leaf of a chunk must '
        "share the horizon H",
    ):
        core.split_chunk({"a": np.zeros((2, 4)), "b": np.zeros((2, 5))}, num_lanes=2)


def test_a_leaf_with_too_few_dimensions_says_what_was_expected(core):
    with raises(
        ModelOutputError,
        "action has shape (): expected [H, ...], a chunk of H actions along the leading axis",
    ):
        core.split_chunk(np.float32(0.5))
    with raises(
        ModelOutputError,
        'action["grip"] has shape (4,): expected [N, H, ...], a chunk of H actions for each of '
        "N = 4 lanes",
    ):
        core.split_chunk({"arm": np.zeros((4, 8, 7)), "grip": np.zeros(4)}, num_lanes=4)


def test_a_batch_for_the_wrong_number_of_lanes_is_refused(core):
    with raises(
        ModelOutputError,
        "action has shape (3, 8, 7): expected [N, H, ...] with N = 4 lanes, got N = 3",
    ):
        core.split_chunk(np.zeros((3, 8, 7)), num_lanes=4)


def test_leaves_must_hold_numbers_and_dicts_str_keys_and_at_least_one_leaf(core):
    with raises(
        ModelOutputError, 'action["cmd"] has dtype <U4: expected booleans, integers or floats'
    ):
        core.split_chunk({"cmd": np.array(["up", "down"])})
    with raises(ModelOutputError, "action has dtype object: expected booleans, integers or floats"):
        core.split_chunk(np.array([None, None]))
    with raises(
        ModelOutputError, "action has dtype complex128: expected booleans, integers or floats"
    ):
        core.split_chunk(np.zeros((2, 3), dtype=complex))
    with raises(ModelOutputError, "action is an empty dict: expected at least one action leaf"):
        core.split_chunk({})
    with raises(
        ModelOutputError, 'action["hand"] is an empty dict: expected at least one action leaf'
    ):
        core.split_chunk({"arm": np.zeros((2, 7)), "hand": {}})
    with raises(ModelOutputError, 'action["hand"] has key 3: expected str keys'):
        core.split_chunk({"hand": {3: np.zeros(2)}})


def test_model_output_errors_are_value_errors_and_rlmesh_errors(core):
    with pytest.raises(ValueError) as caught:
        core.split_chunk(np.zeros(0))
    assert isinstance(caught.value, ModelOutputError)
    assert isinstance(caught.value, RlmeshError)


def test_split_chunk_refuses_a_negative_lane_count(core):
    with raises(ValueError, "num_lanes must be an integer in [0, 2**64), got -1"):
        core.split_chunk(np.zeros((1, 2)), num_lanes=-1)


# ---------------------------------------------------------------------------------- ChunkQueues


def test_the_queues_need_at_least_one_lane_and_a_horizon_of_at_least_one(core):
    queues = core.ChunkQueues(num_lanes=4, execution_horizon=8)
    assert queues.execution_horizon == 8
    assert repr(queues) == "ChunkQueues(num_lanes=4, execution_horizon=8, queued=0)"
    with raises(ValueError, "num_lanes must be at least 1, got 0"):
        core.ChunkQueues(0, 8)
    with raises(ValueError, "execution_horizon must be at least 1, got 0"):
        core.ChunkQueues(4, 0)
    with raises(ValueError, "execution_horizon must be an integer, got float"):
        core.ChunkQueues(4, 2.5)


def test_a_chunk_longer_than_the_horizon_is_truncated_and_popped_in_chunk_order(core):
    queues = core.ChunkQueues(2, 3)
    queues.push([0, 1], [10, 11], batch(2, 5, 1))
    assert queues.queued().tolist() == [3, 3]
    popped = [queues.pop([0, 1], [10, 11])[:, 0].tolist() for _ in range(3)]
    assert popped == [[0, 100], [1, 101], [2, 102]]  # steps 3 and 4 were never queued
    assert queues.lanes_needing_predict().tolist() == [0, 1]


def test_a_chunk_shorter_than_the_horizon_re_plans_sooner(core):
    queues = core.ChunkQueues(2, 8)
    queues.push([0], [1], batch(1, 2, 3))
    queues.push([1], [2], batch(1, 5, 3))
    assert queues.queued().tolist() == [2, 5]
    for _ in range(2):
        queues.pop([0, 1], [1, 2])
    assert queues.lanes_needing_predict().tolist() == [0]  # lane 1 keeps replaying
    assert queues.queued().tolist() == [0, 3]


def test_row_k_goes_to_lanes_k_and_pop_rows_follow_the_lanes_given(core):
    queues = core.ChunkQueues(4, 4)
    queues.push([3, 0, 2], [7, 8, 9], batch(3, 2, 2))  # lane 3 gets row 0, lane 0 row 1, ...
    first = queues.pop([0, 2, 3], [8, 9, 7])
    np.testing.assert_array_equal(first, [[100, 100], [200, 200], [0, 0]])
    second = queues.pop([2, 3, 0], [9, 7, 8])
    np.testing.assert_array_equal(second, [[201, 201], [1, 1], [101, 101]])
    assert queues.lanes_needing_predict().tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int8, np.uint8, np.bool_])
def test_popped_actions_keep_the_pushed_dtype_and_step_shape(core, dtype):
    queues = core.ChunkQueues(3, 2)
    chunk = np.random.default_rng(0).integers(-5, 5, size=(3, 2, 2, 3)).astype(dtype)
    queues.push([0, 1, 2], [0, 1, 2], chunk)
    for step in range(2):
        action = queues.pop([0, 1, 2], [0, 1, 2])
        assert action.dtype == dtype
        assert action.shape == (3, 2, 3)
        np.testing.assert_array_equal(action, chunk[:, step])


def test_scalar_actions_pop_as_one_value_per_lane(core):
    queues = core.ChunkQueues(2, 4)
    queues.push([0, 1], [0, 1], np.array([[3, 1, 2], [0, 0, 1]], dtype=np.int64))
    action = queues.pop([1, 0], [1, 0])
    assert action.shape == (2,)
    assert action.dtype == np.int64
    assert action.tolist() == [0, 3]


def test_dict_chunks_pop_as_dicts_of_batched_actions_in_the_pushed_key_order(core):
    queues = core.ChunkQueues(2, 4)
    chunk = {
        "arm": batch(2, 3, 7),
        "hand": {"grip": batch(2, 3, dtype=np.int8), "open": np.ones((2, 3), dtype=bool)},
    }
    queues.push([1, 0], [5, 6], chunk)
    action = queues.pop([0, 1], [6, 5])
    assert list(action) == ["arm", "hand"]
    assert list(action["hand"]) == ["grip", "open"]
    np.testing.assert_array_equal(action["arm"], chunk["arm"][[1, 0], 0])
    assert action["arm"].dtype == np.float32
    assert action["hand"]["grip"].dtype == np.int8
    assert action["hand"]["grip"].tolist() == [100, 0]
    assert action["hand"]["open"].dtype == np.bool_
    # A later push may list the same leaves in another order; pops keep the first order.
    queues.drop(5)
    queues.drop(6)
    reordered = {"hand": {"open": chunk["hand"]["open"], "grip": chunk["hand"]["grip"]}}
    reordered["arm"] = chunk["arm"]
    queues.push([0, 1], [7, 8], reordered)
    action = queues.pop([0, 1], [7, 8])
    assert list(action) == ["arm", "hand"]
    assert list(action["hand"]) == ["grip", "open"]
    np.testing.assert_array_equal(action["hand"]["grip"], [0, 100])


def test_dropping_an_episode_never_touches_another_lane(core):
    queues = core.ChunkQueues(3, 4)
    queues.push([0, 1, 2], [10, 11, 12], batch(3, 4, 1))
    queues.pop([0, 1, 2], [10, 11, 12])
    assert queues.drop(11) == 3
    assert queues.queued().tolist() == [3, 0, 3]
    assert queues.lanes_needing_predict().tolist() == [1]
    assert queues.drop(11) == 0  # nothing left: a no-op
    assert queues.drop(99) == 0
    np.testing.assert_array_equal(queues.pop([0, 2], [10, 12])[:, 0], [1, 201])


def test_a_lanes_chunk_never_leaks_into_its_next_episode(core):
    queues = core.ChunkQueues(2, 4)
    queues.push([0, 1], [0, 1], batch(2, 4, 1))
    queues.pop([0, 1], [0, 1])
    # Lane 0's episode 0 ended with 3 actions left; its next episode is 2.
    with raises(
        ValueError,
        "lane 0 holds queued actions of episode 0, not episode 2: drop an episode's queue "
        "when it ends",
    ):
        queues.pop([0], [2])
    queues.drop(0)
    with raises(
        ValueError,
        "lane 0 has no queued action for episode 2: call the model for lanes_needing_predict first",
    ):
        queues.pop([0, 1], [2, 1])
    assert queues.lanes_needing_predict([1, 0]).tolist() == [0]
    queues.push([0], [2], np.full((1, 2, 1), -7.0, dtype=np.float32))
    assert queues.pop([0, 1], [2, 1])[:, 0].tolist() == [-7.0, 101.0]


def test_a_push_goes_only_to_empty_queues_and_an_episode_lives_on_one_lane(core):
    queues = core.ChunkQueues(3, 4)
    queues.push([0], [5], batch(1, 2, 1))
    with raises(
        ValueError,
        "lane 0 still holds 2 queued actions of episode 5: push only to lanes whose queue is "
        "empty (lanes_needing_predict)",
    ):
        queues.push([1, 0], [6, 5], batch(2, 2, 1))
    with raises(
        ValueError, "episode 5 already has queued actions on lane 0: an episode lives on one lane"
    ):
        queues.push([2], [5], batch(1, 2, 1))
    with raises(ValueError, "episode 6 is given for lanes 1 and 2: an episode lives on one lane"):
        queues.push([1, 2], [6, 6], batch(2, 2, 1))
    assert queues.queued().tolist() == [2, 0, 0]  # refused pushes queue nothing


def test_a_bad_batch_in_a_push_is_a_model_output_error_and_queues_nothing(core):
    queues = core.ChunkQueues(3, 4)
    with raises(
        ModelOutputError,
        "action has shape (3, 2, 1): expected [N, H, ...] with N = 2 lanes, got N = 3",
    ):
        queues.push([0, 1], [0, 1], batch(3, 2, 1))
    with raises(
        ModelOutputError,
        "action is an empty chunk: shape (2, 0, 1) holds H = 0 actions, expected at least 1",
    ):
        queues.push([0, 1], [0, 1], batch(2, 0, 1))
    assert queues.queued().tolist() == [0, 0, 0]
    # The refused pushes did not fix the layout: the first good push does.
    queues.push([0, 1], [0, 1], batch(2, 2, 3, dtype=np.int64))
    assert queues.pop([0, 1], [0, 1]).shape == (2, 3)


def test_every_push_must_keep_the_layout_of_the_first(core):
    queues = core.ChunkQueues(2, 4)
    queues.push([0], [0], {"arm": batch(1, 2, 7), "grip": batch(1, 2)})
    with raises(
        ValueError,
        'chunks hold leaves [action["arm"], action["roll"]] but earlier pushes held '
        '[action["arm"], action["grip"]]',
    ):
        queues.push([1], [1], {"arm": batch(1, 2, 7), "roll": batch(1, 2)})
    with raises(
        ValueError,
        'chunks hold leaves [action] but earlier pushes held [action["arm"], action["grip"]]',
    ):
        queues.push([1], [1], batch(1, 2, 7))
    with raises(
        ValueError,
        'action["arm"] holds float32 actions of shape (6,) but earlier pushes held float32 '
        "actions of shape (7,)",
    ):
        queues.push([1], [1], {"arm": batch(1, 2, 6), "grip": batch(1, 2)})
    with raises(
        ValueError,
        'action["grip"] holds float64 actions of shape () but earlier pushes held float32 '
        "actions of shape ()",
    ):
        queues.push([1], [1], {"arm": batch(1, 2, 7), "grip": batch(1, 2, dtype=np.float64)})
    assert queues.queued().tolist() == [2, 0]
    queues.drop(0)  # dropping discards actions, not the layout
    assert queues.queued().tolist() == [0, 0]
    with raises(
        ValueError,
        'chunks hold leaves [action] but earlier pushes held [action["arm"], action["grip"]]',
    ):
        queues.push([1], [1], batch(1, 2, 7))


def test_a_pop_before_any_push_has_no_layout_to_build(core):
    queues = core.ChunkQueues(2, 4)
    with raises(
        ValueError,
        "nothing was pushed yet: ChunkQueues learns the action layout from the first push",
    ):
        queues.pop([], [])
    queues.push([0], [0], {"arm": batch(1, 3, 7, dtype=np.float64)})
    empty = queues.pop([], [])
    assert empty["arm"].shape == (0, 7)
    assert empty["arm"].dtype == np.float64


def test_the_queue_owns_its_actions(core):
    queues = core.ChunkQueues(1, 4)
    chunk = batch(1, 3, 2)
    queues.push([0], [0], chunk)
    chunk[:] = -1.0  # a model that reuses its output buffer
    assert queues.pop([0], [0]).tolist() == [[0.0, 0.0]]
    popped = queues.pop([0], [0])
    popped[:] = 5.0
    assert queues.pop([0], [0]).tolist() == [[2.0, 2.0]]


def test_strided_batches_are_read_by_position_not_memory_order(core):
    queues = core.ChunkQueues(2, 8)
    base = batch(4, 6, 3)
    queues.push([0, 1], [0, 1], base[::2, ::2])  # lanes 0 and 2 of the base, steps 0, 2, 4
    fortran = np.asfortranarray(batch(2, 3, 3, dtype=np.int64))
    other = core.ChunkQueues(2, 8)
    other.push([1, 0], [3, 4], fortran)
    for step in (0, 2, 4):
        np.testing.assert_array_equal(queues.pop([1, 0], [1, 0]), base[[2, 0], step])
    np.testing.assert_array_equal(other.pop([0, 1], [4, 3]), fortran[[1, 0], 0])


def test_drop_discards_only_the_ended_episodes_queue_and_its_ownership(core):
    queues = core.ChunkQueues(3, 4)
    queues.push([0, 1, 2], [0, 1, 2], batch(3, 3, 1))
    assert (queues.drop(2), queues.drop(0)) == (3, 3)
    assert queues.queued().tolist() == [0, 3, 0]
    assert queues.drop(0) == 0  # lane 0's episode no longer has anything queued
    queues.push([0], [1_000], batch(1, 2, 1))  # lane 0 is free for a new episode
    assert repr(queues) == "ChunkQueues(num_lanes=3, execution_horizon=4, queued=5)"
    assert (queues.drop(1_000), queues.drop(1)) == (2, 3)
    queues.push([0, 1, 2], [1, 2, 3], batch(3, 1, 1))  # the episodes' ownership went too
    assert queues.queued([2, 1]).tolist() == [1, 1]


def test_a_huge_horizon_costs_only_the_chunks_actually_queued(core):
    queues = core.ChunkQueues(2, 2**40)
    queues.push([0, 1], [0, 1], batch(2, 3, 4))
    assert queues.queued().tolist() == [3, 3]
    assert queues.execution_horizon == 2**40


OUT_OF_RANGE = "is out of range: this route has lanes 0..2"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda q: q.pop([0, 3], [0, 0]), f"lane 3 {OUT_OF_RANGE}"),
        (lambda q: q.pop([1, 1], [1, 1]), "lane 1 appears twice in lanes"),
        (lambda q: q.pop([0, 1], [0]), "episode_ids has 1 entries but lanes has 2"),
        (lambda q: q.pop([0.5], [0]), "lanes must hold integers, got dtype float64"),
        (lambda q: q.push([[0]], [0], None), "lanes must be a 1-D array, got shape (1, 1)"),
        (lambda q: q.push([0], ["a"], None), "episode_ids must hold integers, got dtype <U1"),
        (lambda q: q.lanes_needing_predict([-1]), f"lane -1 {OUT_OF_RANGE}"),
        (lambda q: q.queued([2, 2]), "lane 2 appears twice in lanes"),
        (lambda q: q.drop("7"), "episode_id must be an integer in [-2**63, 2**63), got str"),
    ],
)  # fmt: skip
def test_bad_lane_arguments_are_refused_like_the_ledger_refuses_them(core, call, message):
    queues = core.ChunkQueues(3, 2)
    queues.push([0, 1, 2], [0, 1, 2], batch(3, 2, 1))
    with raises(ValueError, message):
        call(queues)
    assert queues.queued().tolist() == [2, 2, 2]


def test_lanes_needing_predict_keeps_the_order_given(core):
    queues = core.ChunkQueues(5, 2)
    queues.push([1, 3], [0, 1], batch(2, 2, 1))
    assert queues.lanes_needing_predict([4, 3, 0, 1, 2]).tolist() == [4, 0, 2]
    assert queues.lanes_needing_predict([]).dtype == np.int64
    assert queues.queued([3, 4]).dtype == np.int64
