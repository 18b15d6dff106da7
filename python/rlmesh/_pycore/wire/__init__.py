"""The wire part of the Python core: what a served env and the gRPC transport do per message.

``served.py`` ~ ``rust/src/wire/served.rs`` steps a served env's lanes and keeps its episode
tallies; ``transport.py`` ~ ``rust/src/wire/transport.rs`` is the raw-bytes gRPC transport over
grpcio (imported only when it is used). This package exports the names the Rust core's
``wire::register`` adds to ``rlmesh._core``.
"""

from .served import ServedEpisodes, ServedSteps
from .transport import (
    ServerCall,
    ServerRequests,
    WireChannel,
    WireServer,
    WireStatusError,
    WireStream,
)

__all__ = [
    "ServedEpisodes",
    "ServedSteps",
    "ServerCall",
    "ServerRequests",
    "WireChannel",
    "WireServer",
    "WireStatusError",
    "WireStream",
]
