"""The adapters-v1 conformance vectors, read as they are: one parametrized test per case."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from helpers import CORES
from rlmesh import adapters
from rlmesh.core import load_core
from rlmesh.errors import SpecError

CASES_DIR = Path(__file__).parents[1] / "conformance" / "adapters-v1" / "cases"
CASE_FILES = sorted(CASES_DIR.glob("*.json"))


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _case_ids(kind: str) -> list[Path]:
    return [path for path in CASE_FILES if _load(path)["kind"] == kind]


def test_the_vectors_are_all_here():
    kinds = [_load(path)["kind"] for path in CASE_FILES]
    assert (kinds.count("apply"), kinds.count("resolve"), kinds.count("serialization")) == (
        16,
        10,
        2,
    )


@pytest.mark.parametrize("path", _case_ids("serialization"), ids=lambda path: path.stem)
def test_serialization_case(path):
    case = _load(path)
    side = {"env": adapters.EnvTags, "model": adapters.ModelSpec}[case["side"]]
    assert side.from_dict(case["doc"]).to_dict() == case["doc"]
    assert side.from_json(json.dumps(case["doc"])).to_dict() == case["doc"]


def test_a_leaf_takes_a_role_in_place_of_a_key():
    assert adapters.Image("pixels").key == ("pixels",)
    image = adapters.Image(adapters.IMAGE_PRIMARY, size=224)
    assert (image.role, image.key, image.height, image.width) == ("image/primary", (), 224, 224)
    state = adapters.Concat(adapters.EEF_POS, adapters.State(adapters.EEF_ROT, encoding="rot6d"))
    assert [part.role for part in state.parts] == ["proprio/eef_pos", "proprio/eef_rot"]
    assert adapters.StateTag(adapters.EEF_ROT, encoding="quat_xyzw").encoding == "quat_xyzw"
    gripper = adapters.Actuator(adapters.ACTION_GRIPPER, dim=1, range=(-1, 1))
    assert gripper.range == (-1.0, 1.0)


def test_a_state_component_that_sets_nothing_but_its_role_is_written_as_the_role():
    state = adapters.Concat(adapters.EEF_POS, adapters.State(adapters.EEF_ROT, encoding="rot6d"))
    components = state.to_dict()["components"]
    assert components == ["proprio/eef_pos", {"role": "proprio/eef_rot", "encoding": "rot6d"}]
    spec = {"input": {"type": "state", "components": [{"role": "proprio/eef_pos"}]}}
    read = adapters.ModelSpec.from_dict(spec).to_dict()["input"]["components"]
    assert read == ["proprio/eef_pos"]  # the one canonical form, as the peer writes it


def test_a_key_based_leaf_refuses_role_only_options():
    with pytest.raises(SpecError) as err:
        adapters.Image("pixels", size=224)
    assert "need(s) a role-based leaf" in str(err.value)


def test_reading_v1_rejects_a_bare_unknown_field_and_carries_extensions():
    doc = {"type": "text", "role": "text/instruction", "container": "str", "fill": None}
    spec = {"input": {"t": {**doc, "x-note": "kept"}}, "output": {"clip": None, "components": []}}
    assert adapters.ModelSpec.from_dict(spec).to_dict() == spec
    with pytest.raises(Exception, match=r"unknown field\(s\) \['colour'\]"):
        adapters.ModelSpec.from_dict({"input": {"t": {**doc, "colour": 1}}})


def test_an_unknown_rotation_encoding_names_the_known_ones():
    with pytest.raises(Exception, match="unknown rotation encoding 'quat'; expected one of"):
        adapters.StateTag(adapters.EEF_ROT, encoding="quat")


def _space(doc: dict) -> gym.spaces.Space:
    """A Gymnasium space from a vector's space description."""
    kind = doc["kind"]
    if kind == "dict":
        return gym.spaces.Dict(
            {key: _space(child) for key, child in zip(doc["keys"], doc["children"], strict=True)}
        )
    if kind == "text":
        return gym.spaces.Text(256)
    assert kind == "box", doc
    dtype = np.dtype(doc["dtype"])
    if dtype == np.uint8:
        return gym.spaces.Box(0, 255, tuple(doc["shape"]), dtype)
    return gym.spaces.Box(-np.inf, np.inf, tuple(doc["shape"]), dtype)


def _resolve(case: dict) -> adapters.Plan:
    return adapters.resolve(
        adapters.EnvTags.from_dict(case["env_tags"]),
        _space(case["observation_space"]),
        _space(case["action_space"]),
        adapters.ModelSpec.from_dict(case["model_spec"]),
    )


@pytest.mark.parametrize("path", _case_ids("resolve"), ids=lambda path: path.stem)
def test_resolve_case(path):
    case = _load(path)
    expect = case["expect"]
    if "error_contains" in expect:
        env_tags = adapters.EnvTags.from_dict(case["env_tags"])
        spec = adapters.ModelSpec.from_dict(case["model_spec"])
        spaces = _space(case["observation_space"]), _space(case["action_space"])
        with pytest.raises(SpecError) as err:
            adapters.resolve(env_tags, *spaces, spec)
        assert expect["error_contains"] in str(err.value)
    else:
        assert expect["ok"] is True
        assert _resolve(case).describe() == expect["describe"]


class _TaggedEnv(gym.Env):
    """A one-key env whose metadata carries its tags (or none)."""

    observation_space = gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (3,), np.float32)})
    action_space = gym.spaces.Box(-1, 1, (1,), np.float32)

    def __init__(self, tags=None):
        self.metadata = {} if tags is None else {adapters.ENV_TAGS_METADATA_KEY: tags}
        self.resets = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.resets += 1
        return {"pos": np.zeros(3, np.float32)}, {}

    def step(self, action):
        return {"pos": np.zeros(3, np.float32)}, 0.0, True, False, {}


_ROLE_SPEC = adapters.ModelSpec(
    input={"state": adapters.Concat(adapters.EEF_POS, adapters.GRIPPER_POS)},
    output=adapters.Action(adapters.Actuator(adapters.ACTION_GRIPPER, dim=1)),
)


def _role_model():
    model = rlmesh.Model(lambda obs: np.zeros(1, np.float32))
    model.spec = _ROLE_SPEC
    return model


@pytest.mark.parametrize("core", CORES)
def test_a_role_spec_without_tags_fails_at_configure_time_naming_the_roles(core):
    env = _TaggedEnv()
    with pytest.raises(SpecError) as err:
        rlmesh.run(_role_model(), env, episodes=1, core=core)
    message = str(err.value)
    assert "the env has no tags" in message
    assert '"proprio/eef_pos", "proprio/gripper", "action/gripper"' in message
    assert env.resets == 0  # configure time: before the first episode starts


@pytest.mark.parametrize("core", CORES)
def test_tags_come_from_env_metadata_and_from_run(core):
    tags = adapters.EnvTags(
        observation={"pos": adapters.StateTag(adapters.EEF_POS)},
        action=adapters.Action(adapters.Actuator(adapters.ACTION_GRIPPER, dim=1)),
    )
    # The tags are read (the gripper role is then the one missing) from either place.
    for env, env_tags in ((_TaggedEnv(tags.to_dict()), None), (_TaggedEnv(), tags)):
        with pytest.raises(SpecError, match='needs state role "proprio/gripper"'):
            rlmesh.run(_role_model(), env, episodes=1, core=core, env_tags=env_tags)


def test_run_checks_env_tags_once_at_the_boundary():
    with pytest.raises(SpecError, match="env_tags must be EnvTags"):
        rlmesh.run(_role_model(), _TaggedEnv(), episodes=1, env_tags=42)


def _value(doc: dict):
    """A vector's value as the env or the model would hold it."""
    kind = doc["kind"]
    if kind == "array":
        return np.array(doc["data"], dtype=doc["dtype"]).reshape(doc["shape"])
    if kind == "map":
        if list(doc["data"]) == ["<obs>"]:  # the whole observation is one leaf
            return _value(doc["data"]["<obs>"])
        return {key: _value(value) for key, value in doc["data"].items()}
    return doc["data"]  # "text", "list"


def _lane_zero(batched, expect: dict):
    """Lane 0 of a batched payload, shaped like ``expect``."""
    if expect["kind"] == "map":
        assert isinstance(batched, dict) and set(batched) == set(expect["data"])
        return {key: _lane_zero(batched[key], value) for key, value in expect["data"].items()}
    return batched[0]


def _assert_value(actual, expect: dict, atol: float, where: str):
    kind = expect["kind"]
    if kind == "map":
        for key, value in expect["data"].items():
            _assert_value(actual[key], value, atol, f"{where}.{key}")
    elif kind == "array":
        assert isinstance(actual, np.ndarray), (where, actual)
        assert actual.dtype == np.dtype(expect["dtype"]), where
        assert list(actual.shape) == expect["shape"], where
        wanted = np.array(expect["data"], dtype=np.float64).reshape(expect["shape"])
        np.testing.assert_allclose(
            actual.astype(np.float64), wanted, rtol=0, atol=atol, err_msg=where
        )
    elif kind == "list":
        assert isinstance(actual, list), (where, actual)
        np.testing.assert_allclose(actual, expect["data"], rtol=0, atol=atol, err_msg=where)
    else:
        assert actual == expect["data"], where


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("path", _case_ids("apply"), ids=lambda path: path.stem)
def test_apply_case(path, core):
    case = _load(path)
    expect = case["expect"]
    atol = expect.get("atol", 1e-6)
    plan = _resolve(case)
    module = load_core(core)
    observation = _value(case["observation"])
    before = copy.deepcopy(observation)
    payload = module.ObservationAssembler(plan.observation).assemble([observation], [0])
    _assert_value(_lane_zero(payload, expect["payload"]), expect["payload"], atol, "payload")
    model_output = _value(case["model_output"])
    model_before = copy.deepcopy(model_output)
    action = module.ActionApplier(plan.action).apply_actions(model_output[None], [0])[0]
    _assert_value(action, expect["action"], atol, "action")
    # Inputs are read, never written (a copy is taken where one is converted): the vectors ask
    # it of some cases ("preserve_inputs"), and it holds for all of them.
    assert _equal(observation, before) and _equal(model_output, model_before)


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[key], b[key]) for key in a)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    return a == b
