"""The env and model services on a core's ``WireServer``: grpcio servicers, hosted.

The services are written as grpcio servicers, registered by their generated
``add_*Servicer_to_server(servicer, server)``. A ``ServicerHost`` stands in for the
``grpc.Server`` they register on: the core's transport (``rlmesh._core.WireServer``, or the
Python core's over grpcio) hands it every call as raw bytes, and the host answers it. It
checks the bearer token, runs the method's handler with a ``ServicerContext`` (the part of
``grpc.ServicerContext`` a servicer uses), and serves ``grpc.health.v1`` itself.

Example:
    >>> host = ServicerHost(token=None)
    >>> sorted(host.methods())
    ['/grpc.health.v1.Health/Check', '/grpc.health.v1.Health/Watch']
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

TOKEN_HEADER = "authorization"
HEALTH_SERVICE = "grpc.health.v1.Health"
HEALTH_WATCH_POLL_S = 0.5  # how soon a Watch notices its client went away


class AbortCall(Exception):  # noqa: N818 - it ends a call; it is not an error of ours
    """Ends a call with a gRPC status other than OK (``ServicerContext.abort``)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class ServicerContext:
    """What a servicer's method gets as ``context``: ``grpc.ServicerContext``'s calls that the
    env, model and health services use, over the transport's ``ServerCall``."""

    def __init__(self, call: Any, metadata: Sequence[tuple[str, str]]) -> None:
        self._call = call
        self._metadata = tuple(metadata)
        self._callbacks: list[Callable[[], None]] = []
        self.code: grpc.StatusCode = grpc.StatusCode.OK
        self.details = ""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def send_initial_metadata(self, metadata: Sequence[tuple[str, str]] = ()) -> None:
        self._call.send_headers()

    def cancel(self) -> None:
        self._call.cancel()

    def is_active(self) -> bool:
        return self._call.is_active()

    def time_remaining(self) -> float | None:
        return self._call.time_remaining()

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise AbortCall(code, details)

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    def add_callback(self, callback: Callable[[], None]) -> bool:
        """``callback()`` runs once the call has ended."""
        self._callbacks.append(callback)
        return True

    def peer(self) -> str:
        return "unknown"

    def end(self) -> None:
        """The call's status to the transport, then its callbacks."""
        self._call.set_status(self.code.value[0], self.details)
        for callback in self._callbacks:
            callback()


class ServicerHost:
    """The servicers of one server, answering the calls its ``WireServer`` hands over.

    ``dispatch(method, metadata, requests, call)`` is the transport's callback: it yields the
    call's serialized answers and sets its status. With a ``token``, every call but the health
    check must carry ``authorization: Bearer <token>``; any other gets UNAUTHENTICATED before
    it reaches a servicer.
    """

    def __init__(self, token: str | None) -> None:
        self._expected = None if token is None else f"Bearer {token}"
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        self._closing = threading.Event()
        self.add_registered_method_handlers(HEALTH_SERVICE, _health_handlers(self._closing))

    # ------------------------------------------------- what add_*Servicer_to_server calls

    def add_generic_rpc_handlers(self, handlers: Sequence[Any]) -> None:
        """Ignored: generated code registers the same methods by name as well, below."""

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        for name, handler in handlers.items():
            self._handlers[f"/{service}/{name}"] = handler

    def methods(self) -> list[str]:
        """The full method paths this host answers."""
        return list(self._handlers)

    # ------------------------------------------------- serving

    def dispatch(
        self, method: str, metadata: Sequence[tuple[str, str]], requests: Iterator[bytes], call: Any
    ) -> Iterator[bytes]:
        """Answer one call: its serialized responses, its status set on ``call`` at the end."""
        context = ServicerContext(call, metadata)
        try:
            handler = self._handlers.get(method)
            if handler is None:
                raise AbortCall(
                    grpc.StatusCode.UNIMPLEMENTED, f"this server has no method {method}"
                )
            if not self._admits(method, context.invocation_metadata()):
                raise AbortCall(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "this server needs a bearer token: pass token= (or --token) to the client",
                )
            yield from _answers(handler, requests, context)
        except AbortCall as abort:
            context.code, context.details = abort.code, abort.details
        except Exception as err:  # a servicer's bug: the call fails, the server goes on
            context.code = grpc.StatusCode.UNKNOWN
            context.details = f"Exception calling application: {type(err).__name__}: {err}"
        finally:
            context.end()

    def _admits(self, method: str, metadata: Sequence[tuple[str, str]]) -> bool:
        if self._expected is None or method.startswith(f"/{HEALTH_SERVICE}/"):
            return True
        return dict(metadata).get(TOKEN_HEADER) == self._expected

    def close(self) -> None:
        """End the health watches (the server is stopping)."""
        self._closing.set()


def _answers(
    handler: grpc.RpcMethodHandler, requests: Iterator[bytes], context: ServicerContext
) -> Iterator[bytes]:
    """Run ``handler`` over the raw ``requests``, yielding its raw answers."""
    parse = handler.request_deserializer or (lambda raw: raw)
    serialize = handler.response_serializer or (lambda message: message)
    if handler.request_streaming:
        incoming: Any = (parse(raw) for raw in requests)
    else:
        raw = next(requests, None)
        if raw is None:
            raise AbortCall(grpc.StatusCode.INTERNAL, "the call ended before its request came")
        incoming = parse(raw)
    behaviour = (
        (handler.stream_stream if handler.response_streaming else handler.stream_unary)
        if handler.request_streaming
        else (handler.unary_stream if handler.response_streaming else handler.unary_unary)
    )
    answer = behaviour(incoming, context)
    if handler.response_streaming:
        for message in answer:
            yield serialize(message)
    elif context.code == grpc.StatusCode.OK:
        yield serialize(answer)


def _health_handlers(closing: threading.Event) -> dict[str, grpc.RpcMethodHandler]:
    """``grpc.health.v1``: the server (service ``""``) is SERVING while it runs."""
    serving = health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    def check(request: health_pb2.HealthCheckRequest, context: ServicerContext) -> Any:
        if request.service:
            context.set_code(grpc.StatusCode.NOT_FOUND)
            context.set_details(f"unknown service {request.service!r}")
        return serving

    def watch(request: health_pb2.HealthCheckRequest, context: ServicerContext) -> Iterator[Any]:
        yield serving
        while context.is_active() and not closing.wait(HEALTH_WATCH_POLL_S):
            pass

    return {
        "Check": grpc.unary_unary_rpc_method_handler(
            check,
            request_deserializer=health_pb2.HealthCheckRequest.FromString,
            response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
        ),
        "Watch": grpc.unary_stream_rpc_method_handler(
            watch,
            request_deserializer=health_pb2.HealthCheckRequest.FromString,
            response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
        ),
    }


__all__ = ["TOKEN_HEADER", "AbortCall", "ServicerContext", "ServicerHost"]
