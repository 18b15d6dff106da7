"""The peer's Python names, checked against the published rlmesh 0.1.0 itself: the same spec
source runs unchanged on both and gives the same v1 JSON, and every well-known role the peer
registers is ours, with the same string and the same width law."""

from __future__ import annotations

import json
import os
import subprocess

import gymnasium as gym
import numpy as np
import pytest
from rlmesh import adapters
from servers import peer_python

# Written as a spec for rlmesh 0.1 is: the four examples among them, verbatim.
SPEC_SOURCE = """
tags = adapters.EnvTags(
    observation={
        "agentview": adapters.ImageTag(adapters.IMAGE_PRIMARY, upside_down=True),
        "eef_pos": adapters.StateTag(adapters.EEF_POS),
        "eef_quat": adapters.StateTag(adapters.EEF_ROT, encoding="quat_xyzw"),
        "task": adapters.TextTag(adapters.INSTRUCTION),
        "flat": adapters.Split(
            adapters.Field(adapters.GRIPPER_POS, dim=2),
            adapters.Field(dim=4),
            adapters.Field(adapters.JOINT_POS, dim=7, range=(-3, 3)),
        ),
    },
    action=adapters.Action(
        adapters.Actuator(adapters.ACTION_DELTA_POS, dim=3),
        adapters.Actuator(adapters.ACTION_DELTA_ROT, dim=3, encoding="axis_angle"),
        adapters.Actuator(adapters.ACTION_GRIPPER, dim=1, range=(-1, 1)),
    ),
)
state = adapters.Concat(adapters.EEF_POS, adapters.State(adapters.EEF_ROT, encoding="rot6d"))
spec = adapters.ModelSpec(
    input={
        "image": adapters.Image(adapters.IMAGE_PRIMARY, size=224),
        "state": state,
        "joints": adapters.State(adapters.JOINT_POS, dim=7, range=(-1, 1)),
        "task": adapters.Text(adapters.INSTRUCTION),
    },
    output=adapters.Action(
        adapters.Actuator(adapters.ACTION_DELTA_POS, dim=3),
        adapters.Actuator(adapters.ACTION_DELTA_ROT, dim=6, encoding="rot6d"),
        adapters.Actuator(adapters.ACTION_GRIPPER, dim=1, range=(-1, 1)),
    ),
)
"""

# Which widths 1..9 a role takes, by resolving a spec that declares it at each width.
WIDTH_LAW = """
import gymnasium as gym
import numpy as np

WIDTHS = range(1, 10)


def _resolves(role, width):
    box = gym.spaces.Box(-1, 1, (width,), np.float32)
    if role.split("/")[0] in ("action", "command"):
        tags = adapters.EnvTags(
            observation={"s": adapters.StateTag(adapters.JOINT_POS)},
            action=adapters.Action(adapters.Actuator(role, dim=width)),
        )
        spec = adapters.ModelSpec(
            input={"s": adapters.State(adapters.JOINT_POS)},
            output=adapters.Action(adapters.Actuator(role, dim=width)),
        )
        spaces = gym.spaces.Dict({"s": gym.spaces.Box(-1, 1, (2,), np.float32)}), box
    else:
        gripper = adapters.Action(adapters.Actuator(adapters.ACTION_GRIPPER, dim=1))
        tags = adapters.EnvTags(observation={"s": adapters.StateTag(role)}, action=gripper)
        spec = adapters.ModelSpec(input={"s": adapters.State(role, dim=width)}, output=gripper)
        spaces = gym.spaces.Dict({"s": box}), gym.spaces.Box(-1, 1, (1,), np.float32)
    try:
        adapters.resolve(tags, *spaces, spec)
    except Exception:
        return False
    return True


def width_law(role):
    return [width for width in WIDTHS if _resolves(role, width)]
"""

PEER_SCRIPT = f"""
import json
import rlmesh.adapters as adapters
{SPEC_SOURCE}
{WIDTH_LAW}
roles = {{
    name: value
    for name, value in vars(adapters).items()
    if name.isupper() and isinstance(value, str) and value.split("/")[0] in (
        "image", "proprio", "text", "action", "command"
    )
}}
laws = {{
    role: width_law(role)
    for role in roles.values()
    if role.split("/")[0] in ("proprio", "action", "command")
}}
print(json.dumps({{"tags": tags.to_dict(), "spec": spec.to_dict(), "roles": roles, "laws": laws}}))
"""

PEER_ENVIRONMENT = {"PYTHONPATH": ""}  # the peer's own package, not this checkout's


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    script = tmp_path_factory.mktemp("peer") / "names.py"
    script.write_text(PEER_SCRIPT)
    done = subprocess.run(
        [peer_python(), str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **PEER_ENVIRONMENT},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _ours() -> dict:
    scope = {"adapters": adapters, "gym": gym, "np": np}
    exec(SPEC_SOURCE + WIDTH_LAW, scope)
    return scope


def test_a_spec_written_for_the_peer_runs_unchanged_and_serializes_the_same(peer):
    ours = _ours()
    assert ours["tags"].to_dict() == peer["tags"]
    assert ours["spec"].to_dict() == peer["spec"]
    assert adapters.EnvTags.from_dict(peer["tags"]) == ours["tags"]
    assert adapters.ModelSpec.from_dict(peer["spec"]) == ours["spec"]


def test_every_role_the_peer_registers_is_ours_with_its_width_law(peer):
    ours = _ours()
    for name, role in peer["roles"].items():
        assert getattr(adapters, name, None) == role, name
    for role, widths in peer["laws"].items():
        assert ours["width_law"](role) == widths, role
