"""The adapters-v1 conformance vectors, read as they are: one parametrized test per case."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from helpers import CORES
from rlmesh import adapters
from rlmesh.errors import SpecError

CASES_DIR = Path(__file__).parent / "conformance" / "adapters-v1" / "cases"
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

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
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
    with pytest.raises(SpecError) as err:
        rlmesh.run(_role_model(), _TaggedEnv(), episodes=1, core=core)
    message = str(err.value)
    assert "the env has no tags" in message
    assert '"proprio/eef_pos", "proprio/gripper", "action/gripper"' in message


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
