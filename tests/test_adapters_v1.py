"""The adapters-v1 conformance vectors, read as they are: one parametrized test per case."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
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
