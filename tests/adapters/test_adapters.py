"""ModelSpec, its leaves and the plans compiled from them against real Gymnasium spaces."""

from __future__ import annotations

import ast
import dataclasses
import doctest
import importlib
import json
import pkgutil
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from gymnasium import spaces
from rlmesh.adapters import (
    Action,
    ActionLeafPlan,
    Concat,
    Custom,
    Image,
    LeafPlan,
    ModelSpec,
    State,
    Text,
    compile_spec,
)
from rlmesh.errors import ModelOutputError, RlmeshError, SpecError

IMAGE = spaces.Box(0, 255, (84, 84, 3), np.uint8)
ARM = spaces.Box(-2.0, 2.0, (7,), np.float32)


def robot_observation_space() -> spaces.Dict:
    """A robot's observation: a camera, joints, a gripper, an instruction, nested sensors.

    Gymnasium sorts a Dict space's keys, so plans and messages list them alphabetically.
    """
    return spaces.Dict(
        {
            "pixels": IMAGE,
            "joints": spaces.Box(-1.0, 1.0, (7,), np.float64),
            "gripper": spaces.Discrete(2),
            "instruction": spaces.Text(32),
            "sensors": spaces.Dict(
                {
                    "force": spaces.Box(-10.0, 10.0, (3,), np.float32),
                    "contact": spaces.MultiBinary(4),
                }
            ),
        }
    )


def crop_center(observation):
    """A module-level function, so a Custom leaf holding it can be saved by import path."""
    return observation["pixels"][21:63, 21:63]


def env_spaces(env_id: str) -> tuple[spaces.Space, spaces.Space]:
    """The observation and action spaces of a registered Gymnasium environment."""
    env = gym.make(env_id)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def only_leaf(spec: ModelSpec, observation_space: spaces.Space | None = None) -> LeafPlan:
    """The one observation leaf of ``spec`` compiled against the robot's (or the given) space."""
    if observation_space is None:
        observation_space = robot_observation_space()
    plan = spec.compile(observation_space, ARM)
    (leaf,) = plan.observation
    return leaf


# ----------------------------------------------------------------------------------------------
# Errors


def test_errors_are_rlmesh_errors_and_value_errors():
    assert issubclass(SpecError, RlmeshError) and issubclass(SpecError, ValueError)
    assert issubclass(ModelOutputError, RlmeshError) and issubclass(ModelOutputError, ValueError)
    assert not issubclass(SpecError, ModelOutputError)
    assert rlmesh.SpecError is SpecError and rlmesh.RlmeshError is RlmeshError


# ----------------------------------------------------------------------------------------------
# Constructing leaves


def test_keys_are_normalized_to_paths():
    assert Image().key == ()
    assert Image("pixels").key == ("pixels",)
    assert State(["sensors", "force"]).key == ("sensors", "force")
    assert Text("instruction") == Text(("instruction",))
    assert Concat("joints", ("sensors", "force")).keys == (("joints",), ("sensors", "force"))


def test_normalize_is_stored_as_a_range():
    assert Image(dtype="float32", normalize=True).normalize == (0.0, 1.0)
    assert Image(dtype="float32", normalize=(-1, 1)).normalize == (-1.0, 1.0)
    assert Image(dtype="float32").normalize is False


def test_spec_objects_are_frozen():
    image = Image("pixels")
    with pytest.raises(dataclasses.FrozenInstanceError):
        image.stack = 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        ModelSpec(input=image).output = Action()


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Image(3), r"Image: a key is None .* got 3"),
        (lambda: State(("a", 1)), r"State: a key is None .* got \('a', 1\)"),
        (
            lambda: Image("pixels", layout="nhwc"),
            r'Image\(key="pixels"\): layout must be one of "hwc", "chw", got \'nhwc\'',
        ),
        (
            lambda: Image("pixels", dtype="float64"),
            r'Image\(key="pixels"\): dtype must be one of "uint8", "float32", got \'float64\'',
        ),
        (
            lambda: Image("pixels", normalize=True),
            r'Image\(key="pixels"\): normalize .* needs dtype="float32", got dtype="uint8"',
        ),
        (
            lambda: Image("pixels", dtype="float32", normalize=(1, 0)),
            r'Image\(key="pixels"\): normalize must be finite with lo < hi, got \(1, 0\)',
        ),
        (
            lambda: Image("pixels", dtype="float32", normalize="yes"),
            r'Image\(key="pixels"\): normalize must be a pair \(lo, hi\) of numbers',
        ),
        (
            lambda: Image("pixels", stack=0),
            r'Image\(key="pixels"\): stack .* must be an int in 1\.\.64, got 0',
        ),
        (
            lambda: State(("sensors", "force"), stack=65),
            r'State\(key=\("sensors", "force"\)\): stack .* in 1\.\.64, got 65',
        ),
        (lambda: State("joints", stack=True), r"got True"),
        (
            lambda: State("joints", dtype="int8"),
            r'State\(key="joints"\): dtype must be one of "float32", "float64", "int64"',
        ),
        (lambda: Concat(), r"Concat\(\) needs at least one key"),
        (
            lambda: Concat("joints", None, dtype="uint8"),
            r'Concat\("joints", None\): dtype must be one of',
        ),
        (lambda: Custom(3), r"Custom: fn must be a callable fn\(raw_obs\) -> value, got 3"),
        (
            lambda: Action(rescale=(1, 1)),
            r"Action: rescale must be finite with lo < hi, got \(1, 1\)",
        ),
        (
            lambda: Action(rescale=(0, float("inf"))),
            r"Action: rescale must be finite with lo < hi, got \(0, inf\)",
        ),
        (lambda: Action(clip="yes"), r"Action: clip must be True or False, got 'yes'"),
        (lambda: ModelSpec(input=3), r"ModelSpec: input must be a leaf \(Image, State, .*got 3"),
        (lambda: ModelSpec(input={}), r"ModelSpec: input must be .* non-empty dict"),
        (
            lambda: ModelSpec(input={"arm": {"cam": "pixels"}}),
            r'ModelSpec: input\["arm"\]\["cam"\] must be a leaf .* got \'pixels\'',
        ),
        (lambda: ModelSpec(output=Image()), r"ModelSpec: output must be an Action"),
    ],
)
def test_invalid_arguments_are_refused_when_constructed(build, message):
    with pytest.raises(SpecError, match=message):
        build()


# ----------------------------------------------------------------------------------------------
# Compiling observation leaves


def test_image_compiles_to_transpose_cast_normalize_and_stack():
    image = Image("pixels", layout="chw", dtype="float32", normalize=True, stack=4)
    assert only_leaf(ModelSpec(input={"image": image})) == LeafPlan(
        slot=("image",),
        kind="array",
        sources=(("pixels",),),
        source_shapes=((84, 84, 3),),
        source_dtypes=("uint8",),
        transpose=(2, 0, 1),
        flatten=False,
        dtype="float32",
        scale=1 / 255,
        offset=0.0,
        stack=4,
        frame_shape=(3, 84, 84),
        leaf='Image(key="pixels")',
    )


def test_image_in_the_env_layout_is_not_transformed():
    leaf = only_leaf(ModelSpec(input=Image("pixels")))
    assert (leaf.slot, leaf.transpose, leaf.dtype) == ((), None, "uint8")
    assert (leaf.scale, leaf.offset, leaf.stack) == (1.0, 0.0, 1)
    assert leaf.frame_shape == (84, 84, 3)


def test_image_normalized_into_a_range_scales_and_offsets():
    leaf = only_leaf(ModelSpec(input=Image("pixels", dtype="float32", normalize=(-1, 1))))
    assert leaf.scale == pytest.approx(2 / 255)
    assert leaf.offset == -1.0
    pixels = np.array([0, 255], np.uint8)
    assert np.allclose(pixels.astype(np.float32) * leaf.scale + leaf.offset, [-1.0, 1.0])


def test_state_flattens_a_nested_leaf_and_stacks():
    leaf = only_leaf(ModelSpec(input={"force": State(("sensors", "force"), stack=3)}))
    assert leaf.sources == (("sensors", "force"),)
    assert (leaf.source_shapes, leaf.source_dtypes) == (((3,),), ("float32",))
    assert (leaf.flatten, leaf.dtype, leaf.stack, leaf.frame_shape) == (True, "float32", 3, (3,))
    assert leaf.leaf == 'State(key=("sensors", "force"))'


def test_state_of_a_discrete_is_one_int64_element():
    leaf = only_leaf(ModelSpec(input=State("gripper", dtype="int64")))
    assert (leaf.source_shapes, leaf.source_dtypes) == (((),), ("int64",))
    assert (leaf.dtype, leaf.frame_shape) == ("int64", (1,))


def test_state_flattens_a_multi_dimensional_box():
    space = spaces.Dict({"grid": spaces.Box(0.0, 1.0, (2, 3, 4), np.float32)})
    assert only_leaf(ModelSpec(input=State("grid")), space).frame_shape == (24,)


def test_concat_flattens_every_numeric_kind_in_order():
    space = spaces.Dict(
        {
            "joints": spaces.Box(-1.0, 1.0, (7,), np.float32),
            "gripper": spaces.Discrete(2),
            "mode": spaces.MultiDiscrete([3, 4]),
            "contact": spaces.MultiBinary((2, 2)),
        }
    )
    leaf = only_leaf(ModelSpec(input=Concat("contact", "joints", "gripper", "mode")), space)
    assert leaf.sources == (("contact",), ("joints",), ("gripper",), ("mode",))
    assert leaf.source_shapes == ((2, 2), (7,), (), (2,))
    assert leaf.source_dtypes == ("int8", "float32", "int64", "int64")
    assert (leaf.flatten, leaf.dtype, leaf.stack, leaf.frame_shape) == (True, "float32", 1, (14,))


def test_text_passes_the_string_through():
    leaf = only_leaf(ModelSpec(input={"prompt": Text("instruction")}))
    assert (leaf.slot, leaf.kind, leaf.sources, leaf.dtype) == (
        ("prompt",),
        "text",
        (("instruction",),),
        "str",
    )
    assert (leaf.frame_shape, leaf.stack, leaf.leaf) == ((), 1, 'Text(key="instruction")')


def test_custom_reads_the_whole_observation():
    leaf = only_leaf(ModelSpec(input={"crop": Custom(crop_center)}))
    assert (leaf.kind, leaf.fn, leaf.sources) == ("custom", crop_center, ((),))
    assert leaf.leaf == "Custom(fn=crop_center)"


def test_a_bare_leaf_reads_a_real_env_observation_whole():
    observation_space, action_space = env_spaces("CartPole-v1")
    (leaf,) = (
        ModelSpec(input=State(dtype="float64")).compile(observation_space, action_space).observation
    )
    assert (leaf.slot, leaf.sources, leaf.source_dtypes) == ((), ((),), ("float32",))
    assert (leaf.dtype, leaf.frame_shape) == ("float64", (4,))


def test_a_nested_input_dict_gives_nested_slots_in_order():
    spec = ModelSpec(
        input={
            "cameras": {"main": Image("pixels")},
            "state": State("joints"),
            "text": Text("instruction"),
        }
    )
    plan = spec.compile(robot_observation_space(), ARM)
    assert [leaf.slot for leaf in plan.observation] == [("cameras", "main"), ("state",), ("text",)]


# ----------------------------------------------------------------------------------------------
# Compiling the action


def test_rescale_and_clip_onto_a_real_box_action_space():
    observation_space, action_space = env_spaces("Pendulum-v1")
    plan = ModelSpec(output=Action(rescale=(-1, 1))).compile(observation_space, action_space)
    (action,) = plan.action
    assert (action.path, action.kind, action.shape, action.dtype) == ((), "box", (1,), "float32")
    assert (action.rescale, action.clip) == ((-1.0, 1.0), True)
    assert action.low.dtype == np.float64 and action.low.tolist() == [-2.0]
    assert action.high.tolist() == [2.0]
    with pytest.raises(ValueError, match="read-only"):
        action.high[0] = 3.0


def test_a_spec_clips_by_default_and_no_spec_only_casts():
    observation_space, action_space = env_spaces("Pendulum-v1")
    assert ModelSpec().compile(observation_space, action_space).action[0].clip is True
    (cast_only,) = compile_spec(None, observation_space, action_space).action
    assert (cast_only.clip, cast_only.rescale) == (False, None)


def test_a_discrete_action_keeps_its_start_and_size():
    observation_space, action_space = env_spaces("CartPole-v1")
    (action,) = compile_spec(None, observation_space, action_space).action
    assert action == ActionLeafPlan(
        path=(), kind="discrete", shape=(), dtype="int64", low=None, high=None, start=0, n=2
    )


def test_multi_discrete_and_multi_binary_actions_inside_a_dict():
    action_space = spaces.Dict(
        {
            "mode": spaces.MultiDiscrete([3, 4], start=[1, 0]),
            "valves": spaces.Dict({"open": spaces.MultiBinary(5)}),
        }
    )
    mode, valves = compile_spec(None, IMAGE, action_space).action
    assert (mode.path, mode.kind, mode.shape, mode.dtype) == (
        ("mode",),
        "multi_discrete",
        (2,),
        "int64",
    )
    assert mode.nvec.tolist() == [3, 4] and mode.nvec_start.tolist() == [1, 0]
    assert (valves.path, valves.kind, valves.shape, valves.dtype) == (
        ("valves", "open"),
        "multi_binary",
        (5,),
        "int8",
    )


def test_rescale_on_a_dict_action_space_applies_to_every_box_leaf():
    action_space = spaces.Dict({"arm": ARM, "gripper": spaces.Discrete(2)})
    arm, gripper = ModelSpec(output=Action(rescale=(-1, 1))).compile(IMAGE, action_space).action
    assert (arm.path, arm.rescale, arm.clip) == (("arm",), (-1.0, 1.0), True)
    assert (gripper.path, gripper.rescale, gripper.clip) == (("gripper",), None, False)


# ----------------------------------------------------------------------------------------------
# Specs that do not fit the spaces


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            ModelSpec(input=Image("camera")),
            r'Image\(key="camera"\): obs has no key "camera"; it holds Dict with keys '
            r'\["gripper", "instruction", "joints", "pixels", "sensors"\]',
        ),
        (
            ModelSpec(input={"force": State(("sensors", "torque"))}),
            r'State\(key=\("sensors", "torque"\)\) at input\["force"\]: obs\["sensors"\] has no '
            r'key "torque"; it holds Dict with keys \["contact", "force"\]',
        ),
        (
            ModelSpec(input=State(("joints", "elbow"))),
            r'obs\["joints"\] has no key "elbow"; it holds Box float64\[7\]',
        ),
        (
            ModelSpec(input=Concat("joints", "instruction")),
            r'Concat\("joints", "instruction"\): obs\["instruction"\] holds '
            r"Text\(max_length=32\), not a numeric leaf",
        ),
        (
            ModelSpec(input=State("sensors")),
            r'State\(key="sensors"\): obs\["sensors"\] holds Dict with keys '
            r'\["contact", "force"\], not a numeric leaf .*; name a leaf inside it with a tuple '
            r'path, e\.g\. key=\("sensors", "contact"\)',
        ),
        (
            ModelSpec(input=Image("joints")),
            r'Image\(key="joints"\): obs\["joints"\] holds Box float64\[7\] of rank 1; an image '
            r"needs rank 3",
        ),
        (
            ModelSpec(input={"cam": Image("gripper")}),
            r'Image\(key="gripper"\) at input\["cam"\]: obs\["gripper"\] holds Discrete\(2\), '
            r"not a Box image",
        ),
        (
            ModelSpec(input=Text("joints")),
            r'Text\(key="joints"\): obs\["joints"\] holds Box float64\[7\], not a Text space',
        ),
    ],
)
def test_a_spec_that_does_not_fit_the_observation_names_leaf_key_and_space(spec, message):
    with pytest.raises(SpecError, match=message):
        spec.compile(robot_observation_space(), ARM)


def test_normalize_needs_a_uint8_image():
    space = spaces.Dict({"depth": spaces.Box(0.0, 10.0, (64, 64, 1), np.float32)})
    spec = ModelSpec(input=Image("depth", dtype="float32", normalize=True))
    with pytest.raises(
        SpecError,
        match=r'Image\(key="depth"\): normalize maps uint8 \[0, 255\] .* obs\["depth"\] holds '
        r"Box float32\[64,64,1\]",
    ):
        spec.compile(space, ARM)


def test_a_tuple_observation_needs_custom():
    space = spaces.Dict({"pair": spaces.Tuple((spaces.Discrete(2), spaces.Discrete(3)))})
    with pytest.raises(SpecError, match=r'obs\["pair"\] holds Tuple.*read it with Custom\(fn\)'):
        ModelSpec(input=State("pair")).compile(space, ARM)
    with pytest.raises(SpecError, match=r'obs\["pair"\] holds Tuple.*without a spec'):
        compile_spec(None, space, ARM)


@pytest.mark.parametrize(
    ("action_space", "message"),
    [
        (
            spaces.Discrete(2),
            r"Action\(rescale=\(-1, 1\)\) maps onto the bounds of a Box action space, but the "
            r"action space holds no Box: it is Discrete\(2\)",
        ),
        (
            spaces.Dict({"gripper": spaces.Discrete(2)}),
            r'holds no Box: it is Dict with keys \["gripper"\]',
        ),
        (
            spaces.Dict({"arm": spaces.Box(-np.inf, np.inf, (3,), np.float32)}),
            r'Action\(rescale=\(-1, 1\)\) maps onto the bounds of action\["arm"\], but it is Box '
            r"float32\[3\] with infinite bounds",
        ),
    ],
)
def test_rescale_needs_a_bounded_box(action_space, message):
    spec = ModelSpec(output=Action(rescale=(-1, 1)))
    with pytest.raises(SpecError, match=message):
        spec.compile(IMAGE, action_space)


def test_an_action_space_rlmesh_cannot_apply_is_refused():
    action_space = spaces.Dict({"say": spaces.Text(8)})
    with pytest.raises(SpecError, match=r'action\["say"\] is Text\(max_length=8\)'):
        compile_spec(None, IMAGE, action_space)


# ----------------------------------------------------------------------------------------------
# Round trips through dicts and JSON


@pytest.mark.parametrize(
    "leaf",
    [
        Image(),
        Image(("cameras", "wrist"), layout="chw", dtype="float32", normalize=(-1, 1), stack=8),
        Image("pixels", dtype="float32", normalize=True),
        State("joints", dtype="float64", stack=2),
        Concat("joints", ("sensors", "force"), None, dtype="int64"),
        Text("instruction"),
        Custom(crop_center),
    ],
    ids=repr,
)
def test_every_leaf_round_trips_through_json(leaf):
    spec = ModelSpec(input={"slot": leaf})
    data = json.loads(json.dumps(spec.to_dict()))
    assert data["input"]["slot"]["type"] == type(leaf).__name__
    restored = ModelSpec.from_dict(data, allow_custom=isinstance(leaf, Custom))
    assert restored == spec
    assert restored.input["slot"] is not leaf


def test_a_whole_spec_round_trips_through_json():
    spec = ModelSpec(
        input={
            "cameras": {"main": Image("pixels", layout="chw", dtype="float32", normalize=True)},
            "state": Concat("joints", ("sensors", "force")),
        },
        output=Action(rescale=(-1, 1), clip=False),
    )
    data = spec.to_dict()
    assert data["output"] == {"type": "Action", "rescale": [-1.0, 1.0], "clip": False}
    assert data["input"]["state"] == {
        "type": "Concat",
        "keys": [["joints"], ["sensors", "force"]],
        "dtype": "float32",
    }
    assert ModelSpec.from_dict(json.loads(json.dumps(data))) == spec


def test_custom_saves_its_function_by_import_path():
    assert Custom(crop_center).to_dict() == {
        "type": "Custom",
        "fn": f"{__name__}:crop_center",
    }


def test_a_lambda_or_local_function_cannot_be_saved():
    def local_crop(observation):
        return observation

    for fn in (lambda observation: observation, local_crop):
        with pytest.raises(
            SpecError,
            match=r"Custom\(fn=.*\) cannot be saved: .*define fn with `def` at the top level",
        ):
            ModelSpec(input=Custom(fn)).to_dict()


def test_from_dict_accepts_keys_as_a_user_writes_them():
    data = {"input": {"a": {"type": "Image", "key": "pixels"}, "b": {"type": "State", "key": None}}}
    assert ModelSpec.from_dict(data) == ModelSpec(input={"a": Image("pixels"), "b": State()})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"input": {"type": "Imag"}}, r"unknown type 'Imag'; expected one of \['Image', 'State'"),
        ({"input": {"type": "Image", "colour": 1}}, r"Image has no field\(s\) \['colour'\]"),
        ({"input": {"type": "Custom"}}, r"Custom is missing field\(s\) \['fn'\]"),
        ({"input": {"type": "Custom", "fn": "math:no_such"}}, r'cannot import fn "math:no_such"'),
        ({"input": {"type": "Custom", "fn": "math:pi"}}, r'fn "math:pi" names 3\.14.*not callable'),
        ({"input": {"type": "State", "stack": 65}}, r"State\(key=None\): stack .* got 65"),
        (
            {"input": None, "output": {"type": "Clip"}},
            r"unknown type 'Clip'; expected one of \['Action'\]",
        ),
        ({"input": None, "model": "x"}, r"unknown field\(s\) \['model'\]"),
        ({"input": {"a": 3}}, r'input\["a"\] must be a leaf dict with a "type"'),
    ],
)
def test_from_dict_refuses_what_it_does_not_know_by_name(data, message):
    with pytest.raises(SpecError, match=message):
        ModelSpec.from_dict(data, allow_custom=True)


MARKED_MODULE = """
import os
from pathlib import Path

Path(os.environ["RLMESH_TEST_MARKS"], f"imported-{os.getpid()}").touch()


def norm(observation):
    return observation
"""


@pytest.fixture
def marked_module(tmp_path, monkeypatch):
    """An importable module that leaves a mark (one file per process) when it is imported."""
    name = f"rlmesh_marked_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(MARKED_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("RLMESH_TEST_MARKS", str(tmp_path))
    yield name, tmp_path
    import sys

    sys.modules.pop(name, None)


def test_reading_a_spec_runs_no_code_unless_custom_is_allowed(marked_module):
    import os

    name, marks = marked_module
    text = json.dumps({"input": {"norm": {"type": "Custom", "fn": f"{name}:norm"}}})
    for read in (
        lambda: ModelSpec.from_json(text),
        lambda: ModelSpec.from_dict(json.loads(text)),
    ):
        with pytest.raises(SpecError, match=r'input\["norm"\]: a Custom leaf names code'):
            read()
    assert not (marks / f"imported-{os.getpid()}").exists()
    spec = ModelSpec.from_json(text, allow_custom=True)
    assert (marks / f"imported-{os.getpid()}").exists()
    assert spec.input["norm"].fn.__module__ == name


# ----------------------------------------------------------------------------------------------
# describe() and advisories()


def test_describe_says_what_each_leaf_does():
    spec = ModelSpec(
        input={
            "image": Image("pixels", layout="chw", dtype="float32", normalize=True, stack=4),
            "state": Concat("joints", "gripper"),
            "prompt": Text("instruction"),
            "crop": Custom(crop_center),
        },
        output=Action(rescale=(-1, 1)),
    )
    action_space = spaces.Dict({"arm": ARM, "mode": spaces.MultiDiscrete([3, 4])})
    assert spec.compile(robot_observation_space(), action_space).describe().splitlines() == [
        'image: obs["pixels"] uint8[84,84,3] -> float32[3,84,84] (chw, x/255 -> [0, 1], stack 4)',
        'state: obs["joints"] float64[7] + obs["gripper"] int64[] -> float32[8] (flatten)',
        'prompt: obs["instruction"] -> str',
        "crop: Custom(fn=crop_center) on the whole observation",
        'action["arm"]: rescale [-1, 1] onto [-2, 2], clip to [-2, 2], cast to float32[7]',
        'action["mode"]: cast to int64[2] in [0, 0]..[2, 3]',
    ]


def test_describe_per_element_bounds_and_binary_actions():
    action_space = spaces.Dict(
        {
            "arm": spaces.Box(np.float32([-1, -2]), np.float32([1, 2])),
            "valves": spaces.MultiBinary(3),
        }
    )
    assert ModelSpec().compile(IMAGE, action_space).describe().splitlines()[1:] == [
        'action["arm"]: clip to the per-element bounds, cast to float32[2]',
        'action["valves"]: cast to int8[3] in 0..1',
    ]


def test_describe_the_raw_plan_of_a_real_env():
    observation_space, action_space = env_spaces("Pendulum-v1")
    assert compile_spec(None, observation_space, action_space).describe() == (
        "input: obs float32[3] -> float32[3]\naction: cast to float32[1]"
    )


def test_a_wider_source_cast_to_float32_is_advised():
    spec = ModelSpec(input={"state": Concat("joints", ("sensors", "force"), "gripper")})
    advisories = spec.compile(robot_observation_space(), ARM).advisories()
    assert [text for text in advisories if "casts" in text] == [
        'Concat("joints", ("sensors", "force"), "gripper") casts obs["joints"] from float64 to '
        "float32, which can lose precision.",
        'Concat("joints", ("sensors", "force"), "gripper") casts obs["gripper"] from int64 to '
        "float32, which can lose precision.",
    ]


def test_unread_keys_are_advised_outermost_first():
    spec = ModelSpec(input={"image": Image("pixels"), "force": State(("sensors", "force"))})
    assert spec.compile(robot_observation_space(), ARM).advisories() == [
        'obs["gripper"] is never read: no leaf of the spec names it.',
        'obs["instruction"] is never read: no leaf of the spec names it.',
        'obs["joints"] is never read: no leaf of the spec names it.',
        'obs["sensors"]["contact"] is never read: no leaf of the spec names it.',
    ]
    only_pixels = ModelSpec(input=Image("pixels")).compile(robot_observation_space(), ARM)
    assert 'obs["sensors"] is never read: no leaf of the spec names it.' in only_pixels.advisories()
    assert not any('obs["sensors"][' in text for text in only_pixels.advisories())


def test_nothing_is_advised_when_every_key_is_read_without_loss():
    spec = ModelSpec(
        input={
            "image": Image("pixels", dtype="float32", normalize=True),
            "state": Concat("joints", ("sensors", "force"), dtype="float64"),
            "discrete": Concat("gripper", ("sensors", "contact"), dtype="int64"),
            "prompt": Text("instruction"),
        },
        output=Action(clip=True),
    )
    assert spec.compile(robot_observation_space(), ARM).advisories() == []


def test_a_custom_leaf_sees_every_key():
    spec = ModelSpec(input={"crop": Custom(crop_center)})
    assert spec.compile(robot_observation_space(), ARM).advisories() == []


# ----------------------------------------------------------------------------------------------
# No spec: the raw observation


def test_no_spec_passes_a_box_observation_as_is():
    observation_space, action_space = env_spaces("CartPole-v1")
    plan = compile_spec(None, observation_space, action_space)
    assert plan.observation == (
        LeafPlan(
            slot=(),
            kind="array",
            sources=((),),
            source_shapes=((4,),),
            source_dtypes=("float32",),
            transpose=None,
            flatten=False,
            dtype="float32",
            scale=1.0,
            offset=0.0,
            stack=1,
            frame_shape=(4,),
            leaf="raw obs",
        ),
    )
    assert plan.advisories() == []


def test_no_spec_passes_a_dict_observation_leaf_by_leaf():
    plan = compile_spec(None, robot_observation_space(), ARM)
    assert [(leaf.slot, leaf.kind, leaf.dtype, leaf.frame_shape) for leaf in plan.observation] == [
        (("gripper",), "array", "int64", ()),
        (("instruction",), "text", "str", ()),
        (("joints",), "array", "float64", (7,)),
        (("pixels",), "array", "uint8", (84, 84, 3)),
        (("sensors", "contact"), "array", "int8", (4,)),
        (("sensors", "force"), "array", "float32", (3,)),
    ]
    assert all(leaf.sources == (leaf.slot,) for leaf in plan.observation)
    assert all((leaf.transpose, leaf.flatten) == (None, False) for leaf in plan.observation)
    assert plan.advisories() == []


def test_no_spec_passes_a_text_observation_as_a_bare_string():
    (leaf,) = compile_spec(None, spaces.Text(16), spaces.Discrete(3)).observation
    assert (leaf.slot, leaf.kind, leaf.sources, leaf.dtype) == ((), "text", ((),), "str")


def test_a_spec_without_input_gets_the_raw_observation():
    observation_space, action_space = env_spaces("Pendulum-v1")
    spec = ModelSpec(output=Action(rescale=(-1, 1)))
    plan = spec.compile(observation_space, action_space)
    assert plan.observation == compile_spec(None, observation_space, action_space).observation
    assert plan.action[0].rescale == (-1.0, 1.0)


ADAPTERS_MODULES = sorted(
    f"rlmesh.adapters.{module.name}" for module in pkgutil.iter_modules(rlmesh.adapters.__path__)
)


@pytest.mark.parametrize("module_name", ADAPTERS_MODULES)
def test_every_adapters_module_has_examples_that_hold(module_name):
    # tests/test_docs.py lists the package's documented modules by hand; this finds every
    # module of adapters/, so a new one's examples run too.
    result = doctest.testmod(importlib.import_module(module_name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{module_name} has no docstring example"
    assert result.failed == 0


# adapters/ bottom up, as its package docstring lists it: each module imports only earlier ones.
ADAPTERS_LAYERS = [
    "roles",
    "checks",
    "keys",
    "node",
    "image",
    "state",
    "text",
    "custom",
    "action",
    "v1",
    "inputs",
    "tags",
    "plan",
    "keyed",
    "resolve_features",
    "resolve_inputs",
    "resolve_action",
    "resolve_roles",
    "model_spec",
    "resolve",
    "spec",
]


def test_adapters_modules_import_only_the_ones_below_them():
    folder = Path(rlmesh.adapters.__file__).parent
    assert sorted(ADAPTERS_LAYERS) == sorted(path.stem for path in folder.glob("[!_]*.py"))
    for rank, name in enumerate(ADAPTERS_LAYERS):
        tree = ast.parse((folder / f"{name}.py").read_text())
        imported = {
            (node.module or "").split(".")[0]
            for node in ast.walk(tree)  # every import, in a function too
            if isinstance(node, ast.ImportFrom) and node.level == 1
        }
        above = sorted(imported & set(ADAPTERS_LAYERS[rank:]))
        assert not above, f"adapters.{name} imports {above}, which are not below it"
