"""Envs and models served over gRPC, speaking rlmesh-wire-v1 (edition 2026.06).

The parts both ends share:

- ``address``: the address forms (``tcp://host:port``, ``host:port``, ``unix:///path``);
- ``codec``: spaces, values and infos as the wire's messages;
- ``protocol``: the capability and metadata keys, the vector form of infos, and
  ``RequestError``, the one error a server answers a bad request with;
- ``connection``: channels, handshakes and ``Server``, over either core's transport;
- ``hosting``: grpcio servicers hosted on a core's transport (``ServicerHost``);
- ``wire/``: the protobuf and gRPC modules generated from ``proto/`` by
  ``scripts/generate_wire.py`` (do not edit them).

The ends: ``env_server`` (``serve_env``) and ``model_server`` (``serve_model``) serve;
``model_client`` (``RemoteModel``) drives a served model, and a served env's client is a kind
of lanes, ``rlmesh.lanes.remote.RemoteEnv`` (also importable from ``env_client``). No client
imports a server module: what both need is in ``protocol``.

``replicas``: several servers of one model. Every served-model client (``RemoteModel``,
``OpenPIModel``, ``VlaEvalModel``) takes ``replicas=[address, ...]`` and hands its calls to a
``ReplicaSet``, which sends each episode to one server, and a lost server's episodes, their
earlier requests replayed first, to the others (``ReplicaLostError``: a loss).

Needs the ``remote`` extra: ``pip install "rlmesh[remote]"``.

``openpi/`` speaks openpi's WebSocket policy protocol instead; its client,
``rlmesh.remote.OpenPIModel``, is imported on first use and needs the ``openpi`` extra
(``pip install "rlmesh[openpi]"``), not grpcio. ``vlaeval/`` speaks vla-eval's WebSocket
protocol; its client, ``rlmesh.remote.VlaEvalModel``, needs the same two packages (msgpack and
websockets: the ``vlaeval`` extra, or ``openpi``); Pillow, when installed, decodes its PNG
images faster.
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


def require_openpi(what: str) -> None:
    """Raise ``ImportError`` saying how to install the openpi extra, if msgpack or websockets
    is missing."""
    missing = [name for name in ("msgpack", "websockets") if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(
            f"rlmesh.{what} speaks openpi's WebSocket protocol, which needs "
            f'{" and ".join(missing)}: pip install "rlmesh[openpi]"'
        )


def require_vlaeval(what: str) -> None:
    """Raise ``ImportError`` saying what to install, if msgpack or websockets is missing."""
    missing = [name for name in ("msgpack", "websockets") if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(
            f"rlmesh.{what} speaks vla-eval's WebSocket protocol, which needs "
            f'{" and ".join(missing)}: pip install "rlmesh[vlaeval]"'
        )


# Imported on first use, so `import rlmesh` loads neither msgpack nor websockets.
_OPENPI = {"OpenPIModel": "rlmesh.remote.openpi.client"}
_VLAEVAL = {"VlaEvalModel": "rlmesh.remote.vlaeval.client"}


def __getattr__(name: str) -> object:
    if name in _VLAEVAL:
        require_vlaeval(f"remote.{name}")
        return getattr(importlib.import_module(_VLAEVAL[name]), name)
    if name not in _OPENPI:
        raise AttributeError(f"module 'rlmesh.remote' has no attribute {name!r}")
    require_openpi(f"remote.{name}")
    return getattr(importlib.import_module(_OPENPI[name]), name)
