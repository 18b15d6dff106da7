"""A raw-bytes gRPC transport: channels, bidi streams and a generic server, over grpcio.

The mirror of ``rust/src/wire/transport.rs`` (tonic): the same classes with the same behaviour.
Messages are bytes both ways; protobuf and all protocol logic stay with the caller. grpcio is
an optional extra, so it is imported only when a class here is first used.

Example:
    >>> def echo(method, metadata, requests, call):
    ...     return iter(requests)
    >>> server = WireServer("127.0.0.1:0", echo, max_message_bytes=1 << 20)
    >>> channel = WireChannel(
    ...     f"127.0.0.1:{server.port}", max_message_bytes=1 << 20, connect_timeout=5.0
    ... )
    >>> channel.unary("/echo.Echo/Say", b"hi")
    b'hi'
    >>> stream = channel.stream("/echo.Echo/Talk")
    >>> stream.send(b"ping")
    >>> stream.receive(timeout=5.0)
    b'ping'
    >>> stream.close_send()
    >>> stream.receive(timeout=5.0) is None
    True
    >>> channel.close()
    >>> server.close()
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent import futures
from typing import Any

_END = object()  # ends a stream's request iterator (close_send)
# gRPC's own headers, which never reach dispatch (the same set as the Rust core drops)
_RESERVED_HEADERS = ("te", "content-type", "user-agent")
_NO_DEADLINE = 1e8  # grpcio reports "no deadline" as a time remaining of ~forever
_SERVER_THREADS = 256  # grpcio holds one thread per open call; the pool grows up to this


class WireStatusError(Exception):
    """A channel or stream call that ended with a gRPC status other than OK.

    ``code`` is the status name (``"UNAVAILABLE"``, ``"DEADLINE_EXCEEDED"``, ...), ``details``
    the server's or the transport's message; ``str(err) == f"{code}: {details}"``.

    Example:
        >>> str(WireStatusError("UNAVAILABLE", "no server"))
        'UNAVAILABLE: no server'
    """

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


def _status_error(err: Any) -> WireStatusError:
    """A grpcio ``RpcError`` (a finished call) as a ``WireStatusError``."""
    code = err.code() if hasattr(err, "code") else None
    details = err.details() if hasattr(err, "details") else str(err)
    return WireStatusError(code.name if code is not None else "UNKNOWN", details or "")


def _check_method(method: str) -> str:
    if not isinstance(method, str) or not method.startswith("/"):
        raise ValueError(f'method must be a path like "/pkg.Service/Method", got {method!r}')
    return method


def _check_seconds(value: float | None, what: str) -> float | None:
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{what} must be a non-negative number of seconds or None, got {value!r}")
    return value


def _message_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


class WireChannel:
    """A connected HTTP/2 channel to ``target`` (``"host:port"`` or ``"unix:///abs/path"``).

    Connects at once, or raises ``WireStatusError("UNAVAILABLE", ...)`` naming the target after
    ``connect_timeout`` seconds. Messages above ``max_message_bytes`` are refused with
    ``RESOURCE_EXHAUSTED`` in either direction. Threads may share a channel.

    Example:
        >>> WireChannel("127.0.0.1:1", max_message_bytes=1024, connect_timeout=0.2)
        Traceback (most recent call last):
        ...
        rlmesh._pycore.wire.transport.WireStatusError: UNAVAILABLE: no server answered at ...
    """

    def __init__(self, target: str, *, max_message_bytes: int, connect_timeout: float) -> None:
        import grpc

        _check_seconds(connect_timeout, "connect_timeout")
        if max_message_bytes <= 0:
            raise ValueError(f"max_message_bytes must be positive, got {max_message_bytes!r}")
        self._target = target
        options = _message_options(max_message_bytes)
        if target.startswith("unix:"):
            # grpcio's default :authority for a socket is its path, which HTTP/2 servers
            # other than grpcio's (tonic: the Rust core's, rlmesh 0.1.0's) refuse.
            options.append(("grpc.default_authority", "localhost"))
        self._channel = grpc.insecure_channel(target, options=options)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=connect_timeout)
        except grpc.FutureTimeoutError:
            self._channel.close()
            raise WireStatusError(
                "UNAVAILABLE", f"no server answered at {target} within {connect_timeout:g} s"
            ) from None
        self._closed = False
        self._unary: dict[str, Any] = {}
        self._streams: dict[str, Any] = {}

    def unary(
        self,
        method: str,
        request: bytes,
        *,
        metadata: Sequence[tuple[str, str]] = (),
        timeout: float | None = None,
    ) -> bytes:
        """Call ``method`` (``"/pkg.Service/Method"``) with one message and return its answer.

        ``timeout`` seconds bound the call (``DEADLINE_EXCEEDED``); any status but OK raises
        ``WireStatusError``.
        """
        import grpc

        _check_seconds(timeout, "timeout")
        self._check_open()
        call = self._unary.get(method)
        if call is None:
            call = self._unary[method] = self._channel.unary_unary(_check_method(method))
        try:
            return call(request, metadata=tuple(metadata), timeout=timeout)
        except grpc.RpcError as err:
            raise _status_error(err) from None

    def stream(self, method: str, *, metadata: Sequence[tuple[str, str]] = ()) -> WireStream:
        """Open a bidirectional stream on ``method``."""
        self._check_open()
        call = self._streams.get(method)
        if call is None:
            call = self._streams[method] = self._channel.stream_stream(_check_method(method))
        return WireStream(call, tuple(metadata))

    def close(self) -> None:
        """Close the channel; its open streams end (their ``receive`` raises ``CANCELLED``).
        Closing again does nothing."""
        self._closed = True
        self._channel.close()

    def _check_open(self) -> None:
        if self._closed:
            raise WireStatusError("CANCELLED", "the channel is closed")

    def __repr__(self) -> str:
        return f"WireChannel({self._target}, {'closed' if self._closed else 'open'})"


class WireStream:
    """One bidirectional call: ``send`` queues messages, ``receive`` waits for the next answer.

    Made by ``WireChannel.stream``.
    """

    def __init__(self, call: Any, metadata: tuple[tuple[str, str], ...]) -> None:
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._responses = call(iter(self._requests.get, _END), metadata=metadata)
        # grpcio's next() takes no timeout: from the first receive that has one, a reader
        # thread moves the answers here, until the stream ends
        self._inbox: queue.SimpleQueue[Any] | None = None
        self._last: Any = _END  # the stream's final outcome (None or an error), once read
        self._half_closed = False

    def send(self, message: bytes) -> None:
        """Queue ``message``; ``WireStatusError`` once the stream has finished."""
        if self._half_closed:
            raise WireStatusError("FAILED_PRECONDITION", "send after close_send")
        if self._responses.done():
            code = self._responses.code()
            if code.name != "OK":
                raise WireStatusError(code.name, self._responses.details() or "")
            raise WireStatusError("FAILED_PRECONDITION", "the stream has finished")
        self._requests.put(message)

    def receive(self, timeout: float | None = None) -> bytes | None:
        """The next message, or None once the server finished with OK.

        Raises:
            WireStatusError: the server finished with another status, or the connection broke.
            TimeoutError: nothing came within ``timeout`` seconds (the stream stays usable).
        """
        _check_seconds(timeout, "timeout")
        if self._last is not _END:
            outcome = self._last
        elif self._inbox is None and timeout is None:
            outcome = _next_outcome(self._responses)
        else:
            if self._inbox is None:
                self._inbox = queue.SimpleQueue()
                # the reader holds the call, not this stream, so dropping the stream cancels it
                reader = threading.Thread(
                    target=_read, args=(self._responses, self._inbox), daemon=True
                )
                reader.start()
            try:
                outcome = self._inbox.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"no message within {timeout:g} s") from None
        if outcome is None or isinstance(outcome, WireStatusError):
            self._last = outcome
        if isinstance(outcome, WireStatusError):
            raise outcome
        return outcome

    def close_send(self) -> None:
        """Half-close: the server's request iterator ends; answers may still come."""
        if not self._half_closed:
            self._half_closed = True
            self._requests.put(_END)

    def cancel(self) -> None:
        """End the call now (the server sees it cancelled); a later ``receive`` raises
        ``WireStatusError("CANCELLED")``."""
        self._responses.cancel()

    def __del__(self) -> None:
        # a stream dropped unfinished is cancelled, so the server's call ends too
        responses = getattr(self, "_responses", None)
        if responses is not None:
            responses.cancel()


def _next_outcome(responses: Any) -> bytes | WireStatusError | None:
    """A call's next message; None once it finished with OK; its error once it failed."""
    import grpc

    try:
        return next(responses)
    except StopIteration:
        return None
    except grpc.RpcError as err:
        return _status_error(err)


def _read(responses: Any, inbox: queue.SimpleQueue[Any]) -> None:
    """Move a call's outcomes into ``inbox`` until it ends."""
    while True:
        outcome = _next_outcome(responses)
        inbox.put(outcome)
        if outcome is None or isinstance(outcome, WireStatusError):
            return


class ServerRequests:
    """The incoming messages of one server call, as an iterator of bytes.

    Ends when the client half-closed, cancelled or went away, or the server closed.
    """

    def __init__(self, requests: Iterator[bytes]) -> None:
        self._requests = requests

    def __iter__(self) -> ServerRequests:
        return self

    def __next__(self) -> bytes:
        import grpc

        try:
            return next(self._requests)
        except grpc.RpcError:  # the call was cancelled, or the client went away
            raise StopIteration from None


class ServerCall:
    """One incoming call's controls: its status, cancellation and deadline."""

    def __init__(self, context: Any) -> None:
        self._context = context
        self._code = 0
        self._details = ""
        self._headers_sent = False
        self._ended = False

    def send_headers(self) -> None:
        """Send the response headers now (before the first message); once is enough."""
        if not self._headers_sent:
            self._headers_sent = True
            self._context.send_initial_metadata(())

    def set_status(self, code: int, details: str) -> None:
        """The gRPC status (code 0..16) the call ends with once its responses end."""
        if not 0 <= code <= 16:
            raise ValueError(f"set_status: code must be a gRPC status code 0..16, got {code!r}")
        self._code, self._details = code, details

    def cancel(self) -> None:
        """End the call now: the client sees ``CANCELLED`` and the requests stop."""
        self._context.cancel()

    def is_active(self) -> bool:
        """False once the client cancelled or went away, or the call ended."""
        return not self._ended and self._context.is_active()

    def time_remaining(self) -> float | None:
        """Seconds left before the client's deadline (``grpc-timeout``), None without one."""
        remaining = self._context.time_remaining()
        return None if remaining is None or remaining > _NO_DEADLINE else remaining


Dispatch = Callable[[str, list[tuple[str, str]], ServerRequests, ServerCall], Iterable[bytes]]
"""A server's one handler: ``dispatch(method, metadata, requests, call) -> responses``."""


class WireServer:
    """A gRPC server for any method path: every call goes to ``dispatch`` on its own thread.

    ``dispatch(method, metadata, requests, call)`` returns the call's responses (bytes); when
    they end, the call ends with the status ``call.set_status`` set (OK by default); if it
    raises, with ``UNKNOWN`` and ``"TypeName: message"``. A call that ends (the client
    cancelled or went away) while its responses are being sent is not iterated again: its
    iterator is closed (a generator's ``finally`` runs). ``target`` is ``"host:port"`` (port
    0 picks one: see ``port``) or ``"unix:..."``.

    Raises:
        OSError: ``target`` cannot be bound (naming the target and why).

    Example:
        >>> server = WireServer("127.0.0.1:0", lambda *_: iter(()), max_message_bytes=1024)
        >>> server.port > 0
        True
        >>> server.close()
    """

    def __init__(self, target: str, dispatch: Dispatch, *, max_message_bytes: int) -> None:
        import grpc

        if not callable(dispatch):
            raise TypeError(
                "dispatch must be callable as dispatch(method, metadata, requests, call)"
            )
        if max_message_bytes <= 0:
            raise ValueError(f"max_message_bytes must be positive, got {max_message_bytes!r}")
        self._target = target
        self._thread_prefix = f"rlmesh-wire-{id(self):x}"
        self._executor = futures.ThreadPoolExecutor(
            max_workers=_SERVER_THREADS, thread_name_prefix=self._thread_prefix
        )
        self._server = grpc.server(
            self._executor,
            handlers=[_handler(dispatch)],
            # without SO_REUSEPORT a taken port fails to bind, as it does for the Rust core
            options=[*_message_options(max_message_bytes), ("grpc.so_reuseport", 0)],
        )
        try:
            port = self._server.add_insecure_port(target)
        except RuntimeError as err:
            self._executor.shutdown(wait=False)
            raise OSError(f"cannot listen on {target}: {err}") from None
        if target.startswith("unix:"):
            port = 0
        elif port == 0:
            self._executor.shutdown(wait=False)
            raise OSError(f"cannot listen on {target}: the address is taken or not available")
        self._port = port
        self._closed = False
        self._close_lock = threading.Lock()
        self._server.start()

    @property
    def port(self) -> int:
        """The bound TCP port (the one picked for port 0); 0 on a unix socket."""
        return self._port

    def close(self, grace: float = 1.0) -> None:
        """Stop accepting calls; open calls get ``grace`` seconds, then are cancelled. Returns
        once every call's thread is done. Closing again does nothing."""
        _check_seconds(grace, "grace")
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._server.stop(grace).wait()
            # a call may close its own server (a Shutdown method): it cannot wait for itself
            own_call = threading.current_thread().name.startswith(self._thread_prefix)
            self._executor.shutdown(wait=not own_call)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "serving"
        return f"WireServer({self._target}, port={self.port}, {state})"


def _handler(dispatch: Dispatch) -> Any:
    """grpcio's generic handler: every method is a bidi stream of raw bytes into ``dispatch``."""
    import grpc

    codes = {code.value[0]: code for code in grpc.StatusCode}

    def behaviour(method: str) -> Callable[[Iterator[bytes], Any], Iterator[bytes]]:
        def serve(request_iterator: Iterator[bytes], context: Any) -> Iterator[bytes]:
            call = ServerCall(context)
            metadata = [
                (key, value)
                for key, value in context.invocation_metadata()
                if key not in _RESERVED_HEADERS and not key.startswith("grpc-")
            ]
            try:
                yield from dispatch(method, metadata, ServerRequests(request_iterator), call)
            except Exception as err:  # a failing handler ends its call, never the server
                call.set_status(2, f"{type(err).__name__}: {err}")
            finally:
                call._ended = True
            if call._code != 0:
                context.set_code(codes[call._code])
                context.set_details(call._details)

        return serve

    class Generic(grpc.GenericRpcHandler):
        def service(self, handler_call_details: Any) -> Any:
            return grpc.stream_stream_rpc_method_handler(behaviour(handler_call_details.method))

    return Generic()


__all__ = [
    "ServerCall",
    "ServerRequests",
    "WireChannel",
    "WireServer",
    "WireStatusError",
    "WireStream",
]
