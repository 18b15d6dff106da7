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
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ..errors import RemoteError
from .address import Address, parse_address
from .codec import PROTOCOL_GENERATION, WORKFLOW_EDITION
from .wire.core.v1 import handshake_pb2

TOKEN_HEADER = "authorization"
HEALTH_PREFIX = "/grpc.health.v1.Health/"
DEFAULT_MAX_MESSAGE_MB = 64

AddService = Callable[[grpc.Server], None]
"""Registers one servicer on a server (``add_EnvServiceServicer_to_server`` bound to it)."""


def message_options(max_message_mb: float) -> list[tuple[str, int]]:
    """gRPC channel options capping messages in both directions at ``max_message_mb``."""
    limit = int(max_message_mb * 1024 * 1024)
    return [("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit)]


def token_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata that carries ``token`` (empty without one)."""
    return () if token is None else ((TOKEN_HEADER, f"Bearer {token}"),)


class _TokenCheck(grpc.ServerInterceptor):
    """Refuses, with UNAUTHENTICATED, every call but the health check that lacks the token."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}"

        def refuse(request: Any, context: grpc.ServicerContext) -> None:
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "this server needs a bearer token: pass token= (or --token) to the client",
            )

        self._refuse_unary = grpc.unary_unary_rpc_method_handler(refuse)
        self._refuse_stream = grpc.stream_stream_rpc_method_handler(refuse)

    def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        if details.method.startswith(HEALTH_PREFIX):
            return continuation(details)
        if dict(details.invocation_metadata or ()).get(TOKEN_HEADER) == self._expected:
            return continuation(details)
        return self._refuse_stream if details.method.endswith("/Join") else self._refuse_unary


class Server:
    """A running gRPC server: an env or model service beside ``grpc.health.v1``.

    Use ``serve_env`` / ``serve_model``, which build one. ``address`` is the bound address,
    with the real port when port 0 was asked for. ``close()`` stops it (idempotent); it is a
    context manager; ``wait()`` blocks until it stops.
    """

    def __init__(self, grpc_server: grpc.Server, address: Address, on_close: Callable[[], None]):
        self._server = grpc_server
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
        max_workers: int = 16,
        on_close: Callable[[], None] = lambda: None,
    ) -> Server:
        """Bind ``address`` and start serving ``services`` (and the health check).

        Raises:
            ValueError: a malformed address, or ``max_message_mb <= 0``.
            RemoteError: the address cannot be bound (in use, no permission).
        """
        if not max_message_mb > 0:
            raise ValueError(f"max_message_mb must be positive, got {max_message_mb!r}")
        parsed = parse_address(address)
        interceptors = [] if token is None else [_TokenCheck(token)]
        executor = futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=component)
        server = grpc.server(
            executor,
            interceptors=interceptors,
            options=message_options(max_message_mb),
        )
        for add in services:
            add(server)
        health_servicer = health.HealthServicer()
        health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        try:
            port = server.add_insecure_port(parsed.target)
        except RuntimeError as err:
            raise RemoteError(
                f"cannot listen on {address}: {err}", address=str(parsed), code=None
            ) from err
        if parsed.scheme == "tcp":
            if port == 0:
                raise RemoteError(f"cannot listen on {address}: the port is taken", address=address)
            parsed = parsed.with_port(port)
        server.start()

        def release() -> None:
            try:
                on_close()
            finally:  # grpc leaves its handler threads to the executor's owner
                executor.shutdown(wait=False)

        return cls(server, parsed, release)

    @property
    def address(self) -> str:
        """``tcp://host:port`` (the bound port) or ``unix:///path``."""
        return str(self._address)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server stops; False if ``timeout`` seconds passed first."""
        return self._closed.wait(timeout)

    def close(self, grace: float | None = 1.0) -> None:
        """Stop serving (open streams get ``grace`` seconds), then release the env or model."""
        with self._close_lock:
            if self._closed.is_set():
                return
            self._server.stop(grace).wait()
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
    address: str, *, connect_timeout: float, max_message_mb: float = DEFAULT_MAX_MESSAGE_MB
) -> tuple[grpc.Channel, Address]:
    """A channel to ``address`` that is connected, or a ``RemoteError`` after
    ``connect_timeout`` seconds naming the address."""
    parsed = parse_address(address)
    channel = grpc.insecure_channel(parsed.target, options=message_options(max_message_mb))
    try:
        grpc.channel_ready_future(channel).result(timeout=connect_timeout)
    except grpc.FutureTimeoutError:
        channel.close()
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


def remote_failure(err: grpc.RpcError, address: str, doing: str) -> RemoteError:
    """A gRPC failure as the ``RemoteError`` a run raises, naming the address and the call."""
    code = err.code() if hasattr(err, "code") else None
    name = code.name if code is not None else None
    details = err.details() if hasattr(err, "details") else str(err)
    hint = ""
    if code == grpc.StatusCode.UNAUTHENTICATED:
        hint = ": the server needs the right token (token= / --token)"
    elif code == grpc.StatusCode.UNAVAILABLE:
        hint = ": the server went away or cannot be reached"
    return RemoteError(
        f"{doing} at {address} failed with {name}: {details}{hint}", address=address, code=name
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
    "message_options",
    "open_channel",
    "peer_info",
    "remote_failure",
    "token_metadata",
    "uuid7",
]
