"""What both ends of rlmesh-wire-v1 agree on beyond the generated messages: the capability and
metadata keys, the vector form of infos, rows of a batch, and ``RequestError``, the one error
a server answers a bad request with.

Clients (``rlmesh.lanes.remote``, ``model_client``) and servers (``env_server``,
``model_server``) import these from here, so no client imports a server module.

Example:
    >>> infos = vector_infos([{"a": 1}, {}])
    >>> infos
    {'a': [1, None], '_a': [True, False]}
    >>> split_vector_infos(infos, 2)
    [{'a': 1}, {}]
    >>> split_rows({"x": [10, 20]}, 2)
    [{'x': 10}, {'x': 20}]
"""

from __future__ import annotations

from typing import Any

from ..errors import RlmeshError
from ..utils import lane_actions

SUBSET_STEP = "subset_step"
"""The capability an env server advertises when any subset of its lanes steps alone."""

SPEC_METADATA = {
    "rlmesh.spec.id": "id",
    "rlmesh.spec.reward_threshold": "reward_threshold",
    "rlmesh.spec.max_episode_steps": "max_episode_steps",
}
"""Env contract metadata keys -> the ``EnvSpec`` fields they carry, so a driver rebuilds the
served env's spec (its ``reward_threshold`` decides success when nothing else does)."""

RENDER_FPS_KEY = "rlmesh.render_fps"
"""Env contract metadata key: the frame rate of a served env that renders (its envs'
``metadata["render_fps"]``), for the videos a driver records of its frames."""

MODEL_SPEC_KEY = "rlmesh.model_spec.v1"
"""``peer_info.extra`` key of a model server's handshake: the served model's ``ModelSpec`` as
JSON (absent for a model without a spec). The driver assembles the payload from it."""


class RequestError(RlmeshError):
    """A request a server answers in-band with an error (an env server's ``EnvError``, a model
    server's ``ModelError``) of ``code`` rather than a result.

    Attributes:
        code: the wire's error code (``EnvErrorCode`` or ``ModelErrorCode``).
        recoverable: whether the session goes on after it (the wire's ``is_recoverable``).
    """

    def __init__(self, code: int, message: str, recoverable: bool = True) -> None:
        super().__init__(message)
        self.code = code
        self.recoverable = recoverable


def split_rows(batch: Any, count: int) -> list[Any]:
    """A batch of ``count`` values as a list of per-row values (array rows are views)."""
    return list(lane_actions(batch, count))


def vector_infos(infos: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-row info dicts in Gymnasium's vector form: each key a list of one value per row
    (None where a row lacks it) and ``_key`` the rows that have it."""
    out: dict[str, Any] = {}
    keys = list(dict.fromkeys(key for info in infos for key in info))
    for key in keys:
        out[key] = [info.get(key) for info in infos]
        out[f"_{key}"] = [key in info for info in infos]
    return out


def split_vector_infos(info: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """Gymnasium's vector form of infos (``key`` a list of one value per row, ``_key`` its
    mask) as ``count`` per-row dicts; a key without a mask goes to every row as it is."""
    rows: list[dict[str, Any]] = [{} for _ in range(count)]
    for key, value in info.items():
        if key.startswith("_") and key[1:] in info:
            continue
        mask = info.get(f"_{key}")
        per_row = isinstance(mask, list) and isinstance(value, list) and len(value) == count
        for row, target in enumerate(rows):
            if not per_row:
                target[key] = value
            elif mask[row]:
                target[key] = value[row]
    return rows


__all__ = [
    "MODEL_SPEC_KEY",
    "RENDER_FPS_KEY",
    "SPEC_METADATA",
    "SUBSET_STEP",
    "RequestError",
    "split_rows",
    "split_vector_infos",
    "vector_infos",
]
