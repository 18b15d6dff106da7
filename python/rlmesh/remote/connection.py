"""What env and model services share: the listening ``Server``, the dialled channel, the bearer
token and the rlmesh-wire-v1 handshake.

Security defaults: a server binds loopback unless the address names another host; with a
``token`` every call but the gRPC health check must carry ``authorization: Bearer <token>``,
and any other call gets ``UNAUTHENTICATED`` before it reaches the env or model.

Example:
    >>> server = Server.start("127.0.0.1:0", services=[], component="example")
    >>> server.address.startswith("tcp://127.0.0.1:") and not server.address.endswith(":0")
    True
    >>> server.close()
"""

from __future__ import annotations

import os
import platform
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from ..core import active, load_core
from ..errors import RemoteError
from .address import Address, parse_address
from .codec import PROTOCOL_GENERATION, WORKFLOW_EDITION
from .hosting import TOKEN_HEADER, ServicerHost
from .wire.core.v1 import handshake_pb2

HEALTH_PREFIX = "/grpc.health.v1.Health/"
DEFAULT_MAX_MESSAGE_MB = 64

AddService = Callable[[ServicerHost], None]
"""Registers one servicer on a host (``add_EnvServiceServicer_to_server`` bound to it)."""


def wire_transport(core: str | None = None) -> ModuleType:
    """The core whose ``WireChannel`` / ``WireServer`` carry the calls: ``core`` (``"rust"``
    or ``"python"``), else the active one. The Rust core's transport is its own (tonic); the
    Python core's is grpcio."""
    return active if core is None else load_core(core)


def message_bytes(max_message_mb: float) -> int:
    """``max_message_mb`` MiB in bytes, after checking it is positive."""
    if not max_message_mb > 0:
        raise ValueError(f"max_message_mb must be positive, got {max_message_mb!r}")
    return int(max_message_mb * 1024 * 1024)


def token_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata that carries ``token`` (empty without one)."""
    return () if token is None else ((TOKEN_HEADER, f"Bearer {token}"),)


class Server:
    """A running gRPC server: an env or model service beside ``grpc.health.v1``.

    Use ``serve_env`` / ``serve_model``, which build one. ``address`` is the bound address,
    with the real port when port 0 was asked for. ``close()`` stops it (idempotent); it is a
    context manager; ``wait()`` blocks until it stops.
    """

    def __init__(
        self, wire_server: Any, host: ServicerHost, address: Address, on_close: Callable[[], None]
    ):
        self._server = wire_server
        self._host = host
        self._address = address
        self._on_close = on_close
        self._closed = threading.Event()
        self._close_lock = threading.Lock()

    @classmethod
    def start(
        cls,
        address: str,
        *,
        services: Sequence[AddService],
        component: str,
        token: str | None = None,
        max_message_mb: float = DEFAULT_MAX_MESSAGE_MB,
        on_close: Callable[[], None] = lambda: None,
        core: str | None = None,
    ) -> Server:
        """Bind ``address`` and start serving ``services`` (and the health check) on ``core``'s
        transport (the active core's by default).

        Raises:
            ValueError: a malformed address, or ``max_message_mb <= 0``.
            RemoteError: the address cannot be bound (in use, no permission).
        """
        limit = message_bytes(max_message_mb)
        parsed = parse_address(address)
        host = ServicerHost(token)
        for add in services:
            add(host)
        try:
            server = wire_transport(core).WireServer(
                parsed.target, host.dispatch, max_message_bytes=limit
            )
        except OSError as err:
            raise RemoteError(
                f"cannot listen on {address} ({component}): {err}", address=str(parsed), code=None
            ) from err
        if parsed.scheme == "tcp":
            parsed = parsed.with_port(server.port)
        return cls(server, host, parsed, on_close)

    @property
    def address(self) -> str:
        """``tcp://host:port`` (the bound port) or ``unix:///path``."""
        return str(self._address)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server stops; False if ``timeout`` seconds passed first."""
        return self._closed.wait(timeout)

    def close(self, grace: float | None = 1.0) -> None:
        """Stop serving (open calls get ``grace`` seconds), then release the env or model."""
        with self._close_lock:
            if self._closed.is_set():
                return
            self._host.close()
            self._server.close(0.0 if grace is None else grace)
            try:
                self._on_close()
            finally:
                self._closed.set()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed.is_set() else "serving"
        return f"Server({self.address}, {state})"


def open_channel(
    address: str,
    *,
    connect_timeout: float,
    max_message_mb: float = DEFAULT_MAX_MESSAGE_MB,
    core: str | None = None,
) -> tuple[Any, Address]:
    """A ``WireChannel`` of ``core``'s transport to ``address``, connected, or a
    ``RemoteError`` after ``connect_timeout`` seconds naming the address."""
    parsed = parse_address(address)
    transport = wire_transport(core)
    try:
        channel = transport.WireChannel(
            parsed.target,
            max_message_bytes=message_bytes(max_message_mb),
            connect_timeout=connect_timeout,
        )
    except transport.WireStatusError:
        raise RemoteError(
            f"no server answered at {parsed} within {connect_timeout:g} s (connect_timeout): "
            f"is it running, and is the address right?",
            address=str(parsed),
            code="UNAVAILABLE",
        ) from None
    return channel, parsed


# ------------------------------------------------------------------------------ handshake


def peer_info(component: str) -> handshake_pb2.PeerInfo:
    """This process as the handshake describes it."""
    from importlib.metadata import PackageNotFoundError, version

    import gymnasium
    import numpy

    try:
        package_version = version("rlmesh")
    except PackageNotFoundError:
        package_version = "0+unknown"
    return handshake_pb2.PeerInfo(
        component=component,
        package_version=package_version,
        language="python",
        language_version=platform.python_version(),
        os=sys.platform,
        os_version=platform.release(),
        arch=platform.machine(),
        framework_versions={"numpy": numpy.__version__, "gymnasium": gymnasium.__version__},
        extra={"rlmesh.workflow.edition": WORKFLOW_EDITION},
    )


def handshake_request(component: str) -> handshake_pb2.HandshakeRequest:
    """What a client sends first: our protocol generation and the editions we follow."""
    return handshake_pb2.HandshakeRequest(
        protocol_generation=PROTOCOL_GENERATION,
        peer_info=peer_info(component),
        supported_workflow_editions=[WORKFLOW_EDITION],
    )


def handshake_response(
    request: handshake_pb2.HandshakeRequest,
    component: str,
    capabilities: dict[str, str] | None = None,
) -> handshake_pb2.HandshakeResponse:
    """A server's answer: compatible exactly when the protocol generations are equal."""
    response = handshake_pb2.HandshakeResponse(
        compatible=request.protocol_generation == PROTOCOL_GENERATION,
        peer_info=peer_info(component),
        capabilities=capabilities or {},
        supported_workflow_editions=[WORKFLOW_EDITION],
    )
    if not response.compatible:
        response.error_message = (
            f"protocol generation {request.protocol_generation!r} is not "
            f"{PROTOCOL_GENERATION!r}: this server speaks only {PROTOCOL_GENERATION}"
        )
    return response


def check_handshake(response: handshake_pb2.HandshakeResponse, address: str) -> None:
    """Raise ``RemoteError`` unless the server is compatible and follows our edition."""
    if not response.compatible:
        raise RemoteError(
            f"the server at {address} refused the handshake: {response.error_message}",
            address=address,
        )
    if WORKFLOW_EDITION not in response.supported_workflow_editions:
        raise RemoteError(
            f"the server at {address} follows editions {list(response.supported_workflow_editions)}"
            f", not {WORKFLOW_EDITION}, the one this rlmesh follows",
            address=address,
        )


def remote_failure(err: Exception, address: str, doing: str) -> RemoteError:
    """A transport's ``WireStatusError`` as the ``RemoteError`` a run raises, naming the
    address, the call and the gRPC status."""
    name = getattr(err, "code", None)
    details = getattr(err, "details", str(err))
    hint = ""
    if name == "UNAUTHENTICATED":
        hint = ": the server needs the right token (token= / --token)"
    elif name == "UNAVAILABLE":
        hint = ": the server went away or cannot be reached"
    return RemoteError(
        f"{doing} at {address} failed with {name}: {details}{hint}",
        address=address,
        code=name,
        detail=details,
    )


# ------------------------------------------------------------------------------ ids


def uuid7() -> str:
    """A fresh UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then random bits, so ids sort
    by creation time and never repeat.

    Example:
        >>> import uuid
        >>> uuid.UUID(uuid7()).version
        7
    """
    millis = time.time_ns() // 1_000_000
    random = int.from_bytes(os.urandom(10), "big")  # 80 bits: 12 for rand_a, 62 (of 68) rand_b
    value = (millis & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76 | (random >> 68) << 64  # version 7, rand_a
    value |= 0b10 << 62 | (random & ((1 << 62) - 1))  # the RFC variant, rand_b
    return str(uuid.UUID(int=value))


__all__ = [
    "DEFAULT_MAX_MESSAGE_MB",
    "Server",
    "check_handshake",
    "handshake_request",
    "handshake_response",
    "message_bytes",
    "open_channel",
    "peer_info",
    "remote_failure",
    "token_metadata",
    "uuid7",
    "wire_transport",
]
