"""Rotation encodings, converted through the 3x3 rotation matrix.

Mirrors ``rust/src/rotations.rs`` name for name. Encodings (widths): ``quat_xyzw`` and
``quat_wxyz`` (4; normalized on the way in, a zero quaternion is the identity; written with
``w >= 0``), ``axis_angle`` (3, a rotation vector, angle in ``[0, pi]``), ``euler_xyz`` (3,
roll, pitch, yaw about the fixed x, y, z axes: ``R = Rz(yaw) Ry(pitch) Rx(roll)``, as
scipy's ``"xyz"``), ``rot6d`` (6, the first two columns of R, column after column),
``rot6d_rowmajor`` (6, the same 3x2 block row after row) and ``matrix`` (9, row-major).
A 6-D input is orthonormalized (Gram-Schmidt), so any two independent vectors are a rotation.
Computed in float64.

Example:
    >>> import numpy as np
    >>> convert(np.array([0.5, 0.5, 0.5, 0.5]), "quat_xyzw", "rot6d").round(6).tolist()
    [0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
"""

from __future__ import annotations

import math

import numpy as np

WIDTHS = {
    "quat_xyzw": 4,
    "quat_wxyz": 4,
    "axis_angle": 3,
    "euler_xyz": 3,
    "rot6d": 6,
    "rot6d_rowmajor": 6,
    "matrix": 9,
}
EPS = 1e-12


def convert(values: np.ndarray, source: str, target: str) -> np.ndarray:
    """One rotation ``values`` (float, ``WIDTHS[source]`` long) re-encoded as ``target``."""
    if source == target:
        return np.asarray(values, np.float64)
    return from_matrix(to_matrix(values, source), target)


def _quat_matrix(x: float, y: float, z: float, w: float) -> np.ndarray:
    norm = math.sqrt(x * x + y * y + z * z + w * w)
    if norm <= EPS:
        return np.eye(3)
    x, y, z, w = x / norm, y / norm, z / norm, w / norm
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


def _unit(v: list[float]) -> list[float]:
    norm = max(math.sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]), EPS)
    return [v[0] / norm, v[1] / norm, v[2] / norm]


def _gram_schmidt(a1: list[float], a2: list[float]) -> np.ndarray:
    """The rotation whose first two columns are ``a1`` and ``a2`` orthonormalized. Scalar
    arithmetic in a fixed order, as the Rust core does it, so both give the same bits."""
    b1 = _unit(a1)
    dot = b1[0] * a2[0] + b1[1] * a2[1] + b1[2] * a2[2]
    b2 = _unit([a2[0] - dot * b1[0], a2[1] - dot * b1[1], a2[2] - dot * b1[2]])
    b3 = [
        b1[1] * b2[2] - b1[2] * b2[1],
        b1[2] * b2[0] - b1[0] * b2[2],
        b1[0] * b2[1] - b1[1] * b2[0],
    ]
    return np.array([b1, b2, b3]).T


def to_matrix(values: np.ndarray, encoding: str) -> np.ndarray:
    """The 3x3 rotation matrix ``values`` encode."""
    v = [float(item) for item in np.asarray(values, np.float64).reshape(-1)]
    if encoding == "quat_xyzw":
        return _quat_matrix(v[0], v[1], v[2], v[3])
    if encoding == "quat_wxyz":
        return _quat_matrix(v[1], v[2], v[3], v[0])
    if encoding == "axis_angle":
        angle = math.sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2])
        if angle <= EPS:
            return np.eye(3)
        x, y, z = v[0] / angle, v[1] / angle, v[2] / angle
        half = angle / 2
        s = math.sin(half)
        return _quat_matrix(x * s, y * s, z * s, math.cos(half))
    if encoding == "euler_xyz":
        sr, cr = math.sin(v[0]), math.cos(v[0])
        sp, cp = math.sin(v[1]), math.cos(v[1])
        sy, cy = math.sin(v[2]), math.cos(v[2])
        return np.array(
            [
                [cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
                [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
                [-sp, cp * sr, cp * cr],
            ]
        )
    if encoding == "rot6d":
        return _gram_schmidt(v[0:3], v[3:6])
    if encoding == "rot6d_rowmajor":
        return _gram_schmidt(v[0:6:2], v[1:6:2])
    if encoding == "matrix":
        return np.array(v).reshape(3, 3)
    raise ValueError(f"unknown rotation encoding {encoding!r}; expected one of {list(WIDTHS)}")


def _matrix_quat(m: np.ndarray) -> tuple[float, float, float, float]:
    """(x, y, z, w) of a rotation matrix, with w >= 0 (Shepperd's method)."""
    m00, m01, m02 = (float(item) for item in m[0])
    m10, m11, m12 = (float(item) for item in m[1])
    m20, m21, m22 = (float(item) for item in m[2])
    trace = m00 + m11 + m22
    if trace > 0:
        s = 2 * math.sqrt(trace + 1)
        x, y, z, w = (m21 - m12) / s, (m02 - m20) / s, (m10 - m01) / s, s / 4
    elif m00 > m11 and m00 > m22:
        s = 2 * math.sqrt(1 + m00 - m11 - m22)
        x, y, z, w = s / 4, (m01 + m10) / s, (m02 + m20) / s, (m21 - m12) / s
    elif m11 > m22:
        s = 2 * math.sqrt(1 + m11 - m00 - m22)
        x, y, z, w = (m01 + m10) / s, s / 4, (m12 + m21) / s, (m02 - m20) / s
    else:
        s = 2 * math.sqrt(1 + m22 - m00 - m11)
        x, y, z, w = (m02 + m20) / s, (m12 + m21) / s, s / 4, (m10 - m01) / s
    if w < 0:
        x, y, z, w = -x, -y, -z, -w
    norm = math.sqrt(x * x + y * y + z * z + w * w)
    return x / norm, y / norm, z / norm, w / norm


def _matrix_euler_xyz(m: np.ndarray) -> tuple[float, float, float]:
    """(roll, pitch, yaw) of a rotation matrix, pitch in ``[-pi/2, pi/2]``.

    Near pitch = +-pi/2 (gimbal lock) the entries roll and yaw are usually read from shrink to
    rounding noise, so yaw is read first, then roll from entries that stay of size one given
    that yaw: the angles always rebuild the matrix. At the lock itself yaw is taken as 0, as
    scipy does.
    """
    m00, m01, m02 = (float(item) for item in m[0])
    m10, m11, m12 = (float(item) for item in m[1])
    m20 = float(m[2, 0])
    cos_pitch = math.sqrt(m00 * m00 + m10 * m10)
    pitch = math.atan2(-m20, cos_pitch)
    yaw = math.atan2(m10, m00) if cos_pitch > 1e-9 else 0.0
    sin_yaw, cos_yaw = math.sin(yaw), math.cos(yaw)
    # Rz(yaw)^T R = Ry(pitch) Rx(roll), whose middle row is (0, cos roll, -sin roll).
    roll = math.atan2(sin_yaw * m02 - cos_yaw * m12, cos_yaw * m11 - sin_yaw * m01)
    return roll, pitch, yaw


def from_matrix(m: np.ndarray, encoding: str) -> np.ndarray:
    """A rotation matrix written in ``encoding``."""
    if encoding in ("quat_xyzw", "quat_wxyz"):
        x, y, z, w = _matrix_quat(m)
        return np.array([x, y, z, w] if encoding == "quat_xyzw" else [w, x, y, z])
    if encoding == "axis_angle":
        x, y, z, w = _matrix_quat(m)
        sin_half = math.sqrt(x * x + y * y + z * z)
        if sin_half <= EPS:
            return np.zeros(3)
        angle = 2 * math.atan2(sin_half, w)
        return np.array([x, y, z]) * (angle / sin_half)
    if encoding == "euler_xyz":
        return np.array(_matrix_euler_xyz(m))
    if encoding == "rot6d":
        return np.concatenate([m[:, 0], m[:, 1]]).astype(np.float64)
    if encoding == "rot6d_rowmajor":
        return np.asarray(m[:, :2], np.float64).reshape(-1)
    if encoding == "matrix":
        return np.asarray(m, np.float64).reshape(-1)
    raise ValueError(f"unknown rotation encoding {encoding!r}; expected one of {list(WIDTHS)}")
