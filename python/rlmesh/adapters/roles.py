"""The well-known roles, their width laws, and the rotation encodings (adapters-v1).

A role is a string an env tag and a model spec agree on verbatim; its prefix names the kind
of feature (``image/``, ``proprio/``, ``text/``, ``action/``, ``command/``). The constants
below are the shared conventions, rlmesh 0.1.0's registry (plus a second arm's ``_2`` roles):
a registered role of fixed width (``proprio/eef_pos`` is 3-D) validates a declared ``dim``, a
rotation role's width follows its encoding, and any other string still pairs by verbatim
agreement (``x/...`` marks one as deliberately non-standard).

Example:
    >>> EEF_POS, fixed_width(EEF_POS), fixed_width(JOINT_POS)
    ('proprio/eef_pos', 3, None)
    >>> encoding_width("rot6d"), is_role("image/primary"), is_role("pixels")
    (6, True, False)
"""

from __future__ import annotations

IMAGE_PRIMARY = "image/primary"
IMAGE_SECONDARY = "image/secondary"
IMAGE_WRIST = "image/wrist"
INSTRUCTION = "text/instruction"
JOINT_POS = "proprio/joint_pos"
JOINT_VEL = "proprio/joint_vel"
EEF_POS = "proprio/eef_pos"
EEF_ROT = "proprio/eef_rot"
EEF_WRENCH = "proprio/eef_wrench"  # force and torque, 6-D
GRIPPER_POS = "proprio/gripper"
ACTION_JOINT_POS = "action/joint_pos"
ACTION_JOINT_VEL = "action/joint_vel"
ACTION_EEF_POS = "action/eef_pos"  # an absolute Cartesian target
ACTION_EEF_ROT = "action/eef_rot"
ACTION_DELTA_POS = "action/delta_eef_pos"
ACTION_DELTA_ROT = "action/delta_eef_rot"
ACTION_GRIPPER = "action/gripper"
# A floating base (legged robots): its gyro, its orientation, and the velocity command.
BASE_ANG_VEL = "proprio/base_ang_vel"
BASE_ROT = "proprio/base_rot"
COMMAND_BASE_VEL = "command/base_vel"  # (forward, sideways, yaw rate)
# The second arm of a bimanual robot: the same roles with a "_2" suffix.
EEF_POS_2 = "proprio/eef_pos_2"
EEF_ROT_2 = "proprio/eef_rot_2"
GRIPPER_POS_2 = "proprio/gripper_2"
ACTION_DELTA_POS_2 = "action/delta_eef_pos_2"
ACTION_DELTA_ROT_2 = "action/delta_eef_rot_2"
ACTION_GRIPPER_2 = "action/gripper_2"

ROLE_KINDS = ("image", "proprio", "text", "action", "command", "x")

# Registered roles whose width is fixed by convention; a declared dim must match.
_FIXED_WIDTHS = {
    EEF_POS: 3,
    EEF_POS_2: 3,
    EEF_WRENCH: 6,
    ACTION_EEF_POS: 3,
    ACTION_DELTA_POS: 3,
    ACTION_DELTA_POS_2: 3,
    BASE_ANG_VEL: 3,
    COMMAND_BASE_VEL: 3,
}

# Rotation encodings and their native widths. "matrix" is the 3x3 matrix, row-major.
ENCODING_WIDTHS = {
    "quat_xyzw": 4,
    "quat_wxyz": 4,
    "axis_angle": 3,
    "euler_xyz": 3,
    "rot6d": 6,
    "rot6d_rowmajor": 6,
    "matrix": 9,
}
ENCODINGS = tuple(ENCODING_WIDTHS)


def is_role(value: object) -> bool:
    """Whether ``value`` is written as a role (``kind/name``) rather than an observation key.

    Keys of Gymnasium Dict spaces do not hold a ``/``; to read a key that does, pass it as a
    one-element tuple path or with ``key=``.
    """
    return isinstance(value, str) and "/" in value and value.split("/", 1)[0] != ""


def fixed_width(role: str) -> int | None:
    """The width a registered role has by convention, or None (variable or by encoding)."""
    return _FIXED_WIDTHS.get(role)


def encoding_width(encoding: str) -> int:
    """The native width of a rotation encoding (``KeyError`` for an unknown one)."""
    return ENCODING_WIDTHS[encoding]
