"""Envs and models served over gRPC, speaking rlmesh-wire-v1 (edition 2026.06).

- ``address``: the address forms (``tcp://host:port``, ``host:port``, ``unix:///path``);
- ``codec``: spaces, values and infos as the wire's messages;
- ``wire/``: the protobuf and gRPC modules generated from ``proto/`` by
  ``scripts/generate_wire.py`` (do not edit them).

Needs the ``remote`` extra: ``pip install "rlmesh[remote]"``.
"""

from __future__ import annotations

import importlib.util


def require_grpc(what: str) -> None:
    """Raise ``ImportError`` saying how to install the remote extra, if grpcio is missing."""
    if importlib.util.find_spec("grpc") is None:
        raise ImportError(
            f"rlmesh.{what} serves or reaches envs and models over gRPC, which needs the "
            f'remote extra: pip install "rlmesh[remote]"'
        )
