"""ActionApplier: the model's batched action checked and converted into the action space.

Every test runs against both cores (the ``core`` fixture), on plans compiled from real
Gymnasium spaces. Messages are matched in full where they are the contract.
"""

from __future__ import annotations

import dataclasses
import re
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from rlmesh.adapters import Action, ModelSpec, compile_spec
from rlmesh.errors import ModelOutputError, RlmeshError

OBSERVATION = spaces.Box(-1.0, 1.0, (3,), np.float32)
CAST_ONLY = None  # a model without a spec: its action is only cast into the action space


def applier(core, action_space: spaces.Space, output: Action | None = CAST_ONLY):
    spec = None if output is None else ModelSpec(output=output)
    return core.ActionApplier(compile_spec(spec, OBSERVATION, action_space).action)


def raises(message: str):
    """``pytest.raises`` for a ModelOutputError whose message is exactly ``message``."""
    return pytest.raises(ModelOutputError, match=f"^{re.escape(message)}$")


def assert_applied(actual: np.ndarray, expected: list, dtype: str) -> None:
    assert isinstance(actual, np.ndarray)
    assert actual.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(actual, np.array(expected, dtype=dtype))


# ----------------------------------------------------------------------------------------------
# Box


def test_box_rescales_then_clips_then_casts(core):
    box = applier(core, spaces.Box(-2.0, 2.0, (3,), np.float32), Action(rescale=(-1, 1)))
    action = box.apply_actions(np.array([[-1.0, 0.0, 1.0], [0.5, 1.5, -3.0]]), [0, 5])
    # -1..1 onto -2..2 is x * 2; 1.5 -> 3 and -3 -> -6 are then clipped.
    assert_applied(action, [[-2.0, 0.0, 2.0], [1.0, 2.0, -2.0]], "float32")


def test_box_rescale_uses_each_elements_bounds_in_float64(core):
    space = spaces.Box(np.array([0.0, -1.0]), np.array([10.0, 1.0]), dtype=np.float64)
    box = applier(core, space, Action(rescale=(0, 3), clip=False))
    action = box.apply_actions([[1.0, 2.0], [4.5, -1.5]], [2, 3])
    low, high = np.array([0.0, -1.0]), np.array([10.0, 1.0])
    x = np.array([[1.0, 2.0], [4.5, -1.5]])
    assert_applied(action, low + (x - 0.0) * (high - low) / (3.0 - 0.0), "float64")
    assert action[1].tolist() == [15.0, -2.0]  # past the bounds: clip=False keeps it


def test_box_out_of_bounds_passes_unchanged_unless_clip_is_asked(core):
    space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    output = [[5.0, -7.25]]
    assert_applied(applier(core, space).apply_actions(output, [0]), output, "float32")
    unclipped = applier(core, space, Action(clip=False)).apply_actions(output, [0])
    assert_applied(unclipped, output, "float32")
    clipped = applier(core, space, Action()).apply_actions(output, [0])
    assert_applied(clipped, [[1.0, -1.0]], "float32")


def test_box_casts_any_numeric_input_and_returns_a_new_array(core):
    box = applier(core, spaces.Box(-10.0, 10.0, (2,), np.float64))
    output = np.array([[1, 2], [3, 4]], dtype=np.int32)
    action = box.apply_actions(output, [0, 1])
    assert_applied(action, [[1.0, 2.0], [3.0, 4.0]], "float64")
    same_dtype = np.array([[1.5, 2.5]])
    copied = box.apply_actions(same_dtype, [0])
    same_dtype[0, 0] = 9.0
    assert copied[0, 0] == 1.5  # the action does not alias the model's array


def test_a_row_of_another_shape_is_refused_not_reshaped(core):
    """Six values are not an action of Box[2,3] unless they come as [2,3], as in Gymnasium."""
    space = spaces.Box(-1.0, 1.0, (2, 3), np.float32)
    box = applier(core, space)
    actions = np.arange(12, dtype=np.float32).reshape(2, 2, 3) / 20
    assert_applied(box.apply_actions(actions, [4, 1]), actions.tolist(), "float32")
    for row_shape in [(6,), (1, 6), (3, 2), (2, 3, 1), (1, 2, 3)]:
        with raises(
            f"lane 4: action: expected shape [2,3] per lane for Box float32[2,3], got "
            f"[{','.join(map(str, row_shape))}]"
        ):
            box.apply_actions(actions.reshape(2, *row_shape), [4, 1])
        assert not space.contains(actions[0].reshape(row_shape))  # Gymnasium refuses it too


@pytest.mark.parametrize(
    "space",
    [
        spaces.Box(-1.0, 1.0, (1,), np.float32),
        spaces.Box(-1.0, 1.0, (), np.float32),
        spaces.Discrete(3),
        spaces.MultiBinary(1),
        spaces.MultiDiscrete([3]),
    ],
    ids=["Box[1]", "Box[]", "Discrete", "MultiBinary[1]", "MultiDiscrete[1]"],
)
def test_a_leaf_of_one_value_takes_a_scalar_or_a_one_element_vector(core, space):
    one_value = applier(core, space)
    expected = np.array([1, 0], dtype=space.dtype).reshape(2, *space.shape)
    for output in ([1, 0], [[1], [0]], np.array([1, 0], np.int64), np.array([[1.0], [0.0]])):
        assert_applied(one_value.apply_actions(output, [0, 1]), expected.tolist(), space.dtype)
    for wrong, got in (([[1, 0], [0, 1]], "[2]"), ([[[1]], [[0]]], "[1,1]")):
        refusal = r"expected shape \[\] or \[1\] per lane for .+, got "
        with pytest.raises(ModelOutputError, match=f"^lane 5: action: {refusal}{re.escape(got)}$"):
            one_value.apply_actions(wrong, [5, 6])


def test_box_reads_non_contiguous_arrays(core):
    box = applier(core, spaces.Box(-1.0, 1.0, (2,), np.float32))
    wide = np.array([[0.1, 9.0, 0.2], [0.3, 9.0, 0.4]], dtype=np.float32)
    action = box.apply_actions(wide[:, ::2], [0, 1])
    np.testing.assert_array_equal(action, np.array([[0.1, 0.2], [0.3, 0.4]], np.float32))


@pytest.mark.parametrize(("value", "shown"), [(np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf")])
def test_a_non_finite_box_value_names_the_lane_and_element(core, value, shown):
    box = applier(core, spaces.Box(-1.0, 1.0, (3,), np.float32), Action())
    output = np.zeros((2, 3))
    output[1, 2] = value
    output[1, 1] = 0.25  # a finite value before it is fine
    with raises(f"lane 7: action[2] is {shown}; expected a finite number for Box float32[3]"):
        box.apply_actions(output, [3, 7])


def test_the_first_bad_value_in_row_major_order_is_reported(core):
    box = applier(core, spaces.Box(-1.0, 1.0, (2, 2), np.float32), Action())
    output = np.zeros((2, 2, 2))
    output[1, 1, 0] = np.nan
    output[1, 0, 1] = np.inf
    with raises("lane 1: action[0, 1] is inf; expected a finite number for Box float32[2,2]"):
        box.apply_actions(output, [0, 1])


def test_an_integer_box_rounds_a_rescaled_value_half_to_even(core):
    box = applier(core, spaces.Box(0, 255, (3,), np.uint8), Action(rescale=(-1, 1)))
    action = box.apply_actions([[-1.0, 0.0, 1.0], [-0.2, 0.2, 5.0]], [0, 1])
    # 0.0 -> 127.5 -> 128 (even); -0.2 -> 102.0; 0.2 -> 153.0; 5.0 -> 765 -> clipped to 255.
    assert_applied(action, [[0, 128, 255], [102, 153, 255]], "uint8")


def test_an_integer_box_refuses_fractions_and_what_its_dtype_cannot_hold(core):
    space = spaces.Box(0, 255, (2,), np.uint8)
    with raises("lane 2: action[1] is 2.5; expected an integer for Box uint8[2]"):
        applier(core, space, Action()).apply_actions([[1.0, 2.5]], [2])
    with raises(
        "lane 2: action[0] is 300; expected an integer uint8 holds (0..255) for Box uint8[2]"
    ):
        applier(core, space).apply_actions(np.array([[300, 1]]), [2])
    rescaled = applier(core, space, Action(rescale=(-1, 1), clip=False))
    with raises(
        "lane 2: action[0] is 1.5 (319.0 after rescale); expected an integer uint8 holds "
        "(0..255) for Box uint8[2]"
    ):
        rescaled.apply_actions([[1.5, 0.0]], [2])
    assert_applied(
        applier(core, space, Action()).apply_actions([[300, -4]], [2]), [[255, 0]], "uint8"
    )


def test_float16_and_bool_boxes_keep_their_dtype(core):
    half = applier(core, spaces.Box(-1.0, 1.0, (2,), np.float16))
    assert_applied(half.apply_actions([[0.1, -0.5]], [0]), [[0.1, -0.5]], "float16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # past float16's range is inf, silently, in both cores
        assert_applied(half.apply_actions([[1e6, -0.5]], [0]), [[np.inf, -0.5]], "float16")
    switch = applier(core, spaces.Box(0, 1, (2,), np.bool_))
    assert_applied(switch.apply_actions([[1, 0]], [0]), [[True, False]], "bool")
    with raises("lane 0: action[0] is 2; expected an integer bool holds (0..1) for Box bool[2]"):
        switch.apply_actions([[2, 0]], [0])


# ----------------------------------------------------------------------------------------------
# Wrong count, shape or dtype


def test_the_row_count_must_be_the_lane_count(core):
    box = applier(core, spaces.Box(-1.0, 1.0, (3,), np.float32))
    with raises("action: expected 3 rows (one per lane) of Box float32[3], got shape [2,3]"):
        box.apply_actions(np.zeros((2, 3)), [0, 1, 2])
    with raises("action: expected 1 row (one per lane) of Box float32[3], got shape []"):
        box.apply_actions(0.5, [4])


def test_each_row_must_hold_one_action(core):
    box = applier(core, spaces.Box(-1.0, 1.0, (3,), np.float32))
    with raises("lane 6: action: expected shape [3] per lane for Box float32[3], got [4]"):
        box.apply_actions(np.zeros((2, 4)), [6, 2])
    with raises("lane 6: action: expected shape [3] per lane for Box float32[3], got []"):
        box.apply_actions(np.zeros(2), [6, 2])
    grip = applier(core, spaces.Dict({"grip": spaces.Box(0.0, 1.0, (2,), np.float32)}))
    with raises(
        'lane 6: action["grip"]: expected shape [2] per lane for Box float32[2], got [1,2]'
    ):
        grip.apply_actions({"grip": np.zeros((2, 1, 2))}, [6, 2])


@pytest.mark.parametrize(
    ("output", "dtype"),
    [(["a", "b"], "<U1"), ([None, None], "object"), ([1j, 2j], "complex128")],
)
def test_an_action_must_hold_numbers(core, output, dtype):
    discrete = applier(core, spaces.Discrete(3))
    with raises(f"action: expected numbers for Discrete int64[], got dtype {dtype}"):
        discrete.apply_actions(output, [0, 1])


def test_an_output_numpy_cannot_read_is_a_model_output_error(core):
    box = applier(core, spaces.Box(-1.0, 1.0, (2,), np.float32))
    message = (
        "action: expected 2 rows (one per lane) of Box float32[2], got list that numpy "
        "cannot read as an array: "
    )
    with pytest.raises(ModelOutputError, match=f"^{re.escape(message)}.*inhomogeneous"):
        box.apply_actions([[0.0, 1.0], [0.0]], [0, 1])


def test_no_lanes_give_an_empty_action(core):
    box = applier(core, spaces.Box(-1.0, 1.0, (3,), np.float32))
    action = box.apply_actions(np.zeros((0, 3)), np.zeros(0, dtype=np.int64))
    assert action.shape == (0, 3)
    assert action.dtype == np.float32


def test_lanes_are_checked_like_the_ledgers(core):
    box = applier(core, spaces.Box(-1.0, 1.0, (1,), np.float32))
    with pytest.raises(ValueError, match=re.escape("lanes must be a 1-D array, got shape (1, 2)")):
        box.apply_actions(np.zeros((2, 1)), [[0, 1]])
    with pytest.raises(ValueError, match="lanes must hold integers, got dtype float64"):
        box.apply_actions(np.zeros((2, 1)), [0.0, 1.0])


def test_model_output_error_is_an_rlmesh_error_and_a_value_error(core):
    with pytest.raises(RlmeshError) as caught:
        applier(core, spaces.Discrete(2)).apply_actions([5], [0])
    assert isinstance(caught.value, ValueError)
    assert type(caught.value) is ModelOutputError


# ----------------------------------------------------------------------------------------------
# Discrete, MultiDiscrete, MultiBinary


def test_discrete_accepts_integral_values_in_start_to_start_plus_n(core):
    discrete = applier(core, spaces.Discrete(3, start=-1))
    assert_applied(discrete.apply_actions([-1, 1.0, 0], [0, 1, 2]), [-1, 1, 0], "int64")
    column = discrete.apply_actions(np.array([[1], [-1]], dtype=np.float32), [0, 1])
    assert_applied(column, [1, -1], "int64")
    assert_applied(discrete.apply_actions(np.array([True]), [0]), [1], "int64")


@pytest.mark.parametrize(
    ("value", "shown"),
    [(2, "2"), (-2, "-2"), (0.5, "0.5"), (np.nan, "nan"), (np.inf, "inf"), (1e20, "1e+20")],
)
def test_discrete_refuses_fractions_and_values_out_of_range(core, value, shown):
    discrete = applier(core, spaces.Discrete(3, start=-1))
    output = np.array([0, value]) if isinstance(value, int) else np.array([0.0, value])
    with raises(f"lane 4: action is {shown}; expected an integer in -1..1 for Discrete int64[]"):
        discrete.apply_actions(output, [9, 4])


def test_multi_discrete_checks_each_element_against_its_start_and_nvec(core):
    space = spaces.MultiDiscrete([3, 2], start=[1, -1])
    multi = applier(core, space)
    assert_applied(multi.apply_actions([[1, -1], [3.0, 0]], [0, 1]), [[1, -1], [3, 0]], "int64")
    with raises("lane 9: action[0] is 4; expected an integer in 1..3 for MultiDiscrete int64[2]"):
        multi.apply_actions(np.array([[1, 0], [4, 0]]), [8, 9])
    with raises(
        "lane 8: action[1] is 0.5; expected an integer in -1..0 for MultiDiscrete int64[2]"
    ):
        multi.apply_actions([[1, 0.5], [4, 0]], [8, 9])


def test_multi_discrete_of_rank_two_keeps_its_shape_and_dtype(core):
    space = spaces.MultiDiscrete(np.array([[2, 3], [4, 5]]), dtype=np.int32)
    multi = applier(core, space)
    action = multi.apply_actions(np.array([[[1, 2], [3, 4]]]), [0])
    assert_applied(action, [[[1, 2], [3, 4]]], "int32")
    with raises(
        "lane 0: action[1, 1] is 5; expected an integer in 0..4 for MultiDiscrete int32[2,2]"
    ):
        multi.apply_actions(np.array([[[1, 2], [3, 5]]]), [0])
    with raises(
        "lane 0: action: expected shape [2,2] per lane for MultiDiscrete int32[2,2], got [4]"
    ):
        multi.apply_actions(np.array([[1, 2, 3, 4]]), [0])  # flat: not reshaped


def test_multi_binary_takes_zeros_and_ones_as_int8(core):
    binary = applier(core, spaces.MultiBinary(4))
    bools = np.array([[True, False, True, True]])
    assert_applied(binary.apply_actions(bools, [0]), [[1, 0, 1, 1]], "int8")
    assert_applied(binary.apply_actions([[0.0, 1.0, 1, 0]], [0]), [[0, 1, 1, 0]], "int8")
    for value, shown in ((2, "2"), (-1, "-1"), (0.5, "0.5")):
        with raises(f"lane 3: action[2] is {shown}; expected 0 or 1 for MultiBinary int8[4]"):
            binary.apply_actions(np.array([[0, 1, value, 2]]), [3])


# ----------------------------------------------------------------------------------------------
# Dict action spaces


def robot_action_space() -> spaces.Dict:
    """An arm, a gripper and a mobile base; Gymnasium sorts the keys: arm, base, gripper."""
    return spaces.Dict(
        {
            "arm": spaces.Box(-2.0, 2.0, (2,), np.float32),
            "gripper": spaces.Discrete(2),
            "base": spaces.Dict(
                {"turn": spaces.Discrete(3, start=-1), "lights": spaces.MultiBinary(2)}
            ),
        }
    )


def robot_output(lanes: int = 2) -> dict:
    return {
        "arm": np.full((lanes, 2), 0.5),
        "gripper": np.ones(lanes, dtype=np.int64),
        "base": {"turn": np.full(lanes, -1.0), "lights": np.ones((lanes, 2), dtype=bool)},
    }


def lane_action(action, row: int):
    """One lane's action out of a batched (possibly nested) action."""
    if isinstance(action, dict):
        return {key: lane_action(value, row) for key, value in action.items()}
    return action[row]


def test_a_dict_action_space_is_applied_leaf_by_leaf(core):
    robot = applier(core, robot_action_space(), Action(rescale=(-1, 1)))
    action = robot.apply_actions(robot_output(), [0, 3])
    assert list(action) == ["arm", "base", "gripper"]
    assert list(action["base"]) == ["lights", "turn"]
    assert_applied(action["arm"], [[1.0, 1.0], [1.0, 1.0]], "float32")
    assert_applied(action["gripper"], [1, 1], "int64")
    assert_applied(action["base"]["turn"], [-1, -1], "int64")
    assert_applied(action["base"]["lights"], [[1, 1], [1, 1]], "int8")
    for row in range(2):
        assert robot_action_space().contains(lane_action(action, row))


def test_a_missing_or_extra_key_is_named(core):
    robot = applier(core, robot_action_space())
    expected = 'expected keys ["arm", "base", "gripper"]'
    output = robot_output()
    del output["gripper"]
    with raises(f'action: missing key "gripper"; {expected}'):
        robot.apply_actions(output, [0, 1])
    with raises(f'action: unexpected key "wheels"; {expected}'):
        robot.apply_actions(robot_output() | {"wheels": np.zeros(2)}, [0, 1])
    with raises(f"action: unexpected key 7; {expected}"):
        robot.apply_actions(robot_output() | {7: np.zeros(2)}, [0, 1])
    nested = robot_output()
    del nested["base"]["turn"]
    with raises('action["base"]: missing key "turn"; expected keys ["lights", "turn"]'):
        robot.apply_actions(nested, [0, 1])


def test_a_dict_space_needs_a_dict(core):
    robot = applier(core, robot_action_space())
    with raises('action: expected a dict with keys ["arm", "base", "gripper"], got ndarray'):
        robot.apply_actions(np.zeros((2, 5)), [0, 1])
    output = robot_output()
    output["base"] = [1, 2]
    with raises('action["base"]: expected a dict with keys ["lights", "turn"], got list'):
        robot.apply_actions(output, [0, 1])


def test_a_bad_leaf_of_a_dict_names_its_path_and_the_first_leaf_wins(core):
    robot = applier(core, robot_action_space())
    output = robot_output()
    output["base"]["turn"] = np.array([-1, 2])
    with raises(
        'lane 3: action["base"]["turn"] is 2; expected an integer in -1..1 for Discrete int64[]'
    ):
        robot.apply_actions(output, [0, 3])
    output["arm"] = np.zeros((3, 2))  # "arm" comes before "base": its error is raised first
    with raises('action["arm"]: expected 2 rows (one per lane) of Box float32[2], got shape [3,2]'):
        robot.apply_actions(output, [0, 3])


# ----------------------------------------------------------------------------------------------
# Plans the applier refuses


def test_a_malformed_plan_is_refused(core):
    (box,) = compile_spec(None, OBSERVATION, spaces.Box(-1.0, 1.0, (2,))).action
    with pytest.raises(ValueError, match=r"^action: unknown action leaf kind 'text'; expected one"):
        core.ActionApplier([dataclasses.replace(box, kind="text")])
    with pytest.raises(
        ValueError, match=re.escape("action: low has 3 values for an action of shape [2]")
    ):
        core.ActionApplier([dataclasses.replace(box, low=np.zeros(3))])
    arm = dataclasses.replace(box, path=("arm",))
    overlapping = dataclasses.replace(box, path=("arm", "joint"))
    with pytest.raises(ValueError, match=re.escape('action["arm"]["joint"] overlaps another')):
        core.ActionApplier([arm, overlapping])
    with pytest.raises(ValueError, match=r"^action overlaps another action leaf"):
        core.ActionApplier([arm, box])


# ----------------------------------------------------------------------------------------------
# Real environments


def test_pendulum_lanes_step_with_the_applied_action(core):
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("Pendulum-v1")] * 3)
    try:
        plan = compile_spec(
            ModelSpec(output=Action(rescale=(-1, 1))),
            envs.single_observation_space,
            envs.single_action_space,
        )
        pendulum = core.ActionApplier(plan.action)
        envs.reset(seed=0)
        model_output = np.array([[0.5], [-1.5], [1.0]], dtype=np.float32)  # a tanh-like head
        action = pendulum.apply_actions(model_output, np.arange(3))
        assert_applied(action, [[1.0], [-2.0], [2.0]], "float32")
        assert all(envs.single_action_space.contains(row) for row in action)
        observation, reward, *_ = envs.step(action)
        assert observation.shape == (3, 3) and np.all(np.isfinite(reward))
    finally:
        envs.close()


def test_cartpole_steps_with_an_applied_discrete_action(core):
    env = gym.make("CartPole-v1")
    try:
        cartpole = core.ActionApplier(
            compile_spec(None, env.observation_space, env.action_space).action
        )
        env.reset(seed=0)
        action = cartpole.apply_actions(np.array([[1.0]]), [0])  # a float head's argmax
        assert_applied(action, [1], "int64")
        assert env.action_space.contains(action[0])
        env.step(action[0])
        with raises("lane 0: action is 2; expected an integer in 0..1 for Discrete int64[]"):
            cartpole.apply_actions([2], [0])
    finally:
        env.close()
