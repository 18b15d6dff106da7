"""Where ``RemoteEnv`` lived: the client of a served env is a kind of lanes, now in
``rlmesh/lanes/remote.py``, and the infos' vector form in ``remote/protocol.py``; the names
stay importable from here (``from rlmesh.remote.env_client import RemoteEnv``).

Example:
    >>> from rlmesh.lanes.remote import RemoteEnv as Moved
    >>> RemoteEnv is Moved
    True
"""

from __future__ import annotations

from ..lanes.remote import (
    COMPONENT,
    ENV_FAILURE_CODES,
    HANDSHAKE,
    JOIN,
    RemoteEnv,
    SessionEndedError,
)
from .protocol import split_vector_infos

__all__ = [
    "COMPONENT",
    "ENV_FAILURE_CODES",
    "HANDSHAKE",
    "JOIN",
    "RemoteEnv",
    "SessionEndedError",
    "split_vector_infos",
]
