"""The raw-bytes gRPC transport (``WireChannel``, ``WireStream``, ``WireServer``) of both cores:
real servers on loopback and unix sockets, against each other and against plain grpcio."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import weakref
from concurrent import futures
from types import ModuleType

import grpc
import pytest
from rlmesh.core import CORE_NAMES, load_core
from servers import read_line

MAX = 4 << 20
WAIT = 10.0  # seconds any one wait in these tests may take before it fails


def echo(method, metadata, requests, call):
    """Answers every message with itself."""
    yield from requests


@contextlib.contextmanager
def serving(core: ModuleType, dispatch=echo, *, max_message_bytes: int = MAX, target=None):
    server = core.WireServer(target or "127.0.0.1:0", dispatch, max_message_bytes=max_message_bytes)
    try:
        yield server
    finally:
        server.close(grace=0.5)


@contextlib.contextmanager
def dialling(core: ModuleType, target: str, *, max_message_bytes: int = MAX):
    channel = core.WireChannel(target, max_message_bytes=max_message_bytes, connect_timeout=WAIT)
    try:
        yield channel
    finally:
        channel.close()


@contextlib.contextmanager
def connected(core: ModuleType, dispatch=echo, **limits):
    with (
        serving(core, dispatch, max_message_bytes=limits.get("server", MAX)) as server,
        dialling(
            core, f"127.0.0.1:{server.port}", max_message_bytes=limits.get("client", MAX)
        ) as channel,
    ):
        yield server, channel


def messages() -> list[bytes]:
    """Empty, small, binary and 1 MB messages."""
    return [b"", b"x", bytes(range(256)), os.urandom(64), os.urandom(1 << 20), b"\x00" * 7]


def test_unary_and_bidi_echo_keep_every_byte(core):
    with connected(core) as (_, channel):
        for message in messages():
            assert channel.unary("/test.Echo/Say", message) == message
        stream = channel.stream("/test.Echo/Talk")
        for round_trip in range(300):
            message = messages()[round_trip % 6] if round_trip % 50 == 0 else os.urandom(64)
            stream.send(message)
            assert stream.receive(timeout=WAIT) == message
        stream.close_send()
        assert stream.receive(timeout=WAIT) is None


@pytest.mark.parametrize("form", ["unix:///absolute", "unix:relative"])
def test_echo_over_a_unix_socket(core, tmp_path, monkeypatch, form):
    if form == "unix:relative":
        monkeypatch.chdir(tmp_path)
        target = "unix:wire.sock"
    else:
        target = f"unix://{tmp_path / 'wire.sock'}"
    with serving(core, target=target) as server, dialling(core, target) as channel:
        assert server.port == 0
        assert channel.unary("/test.Echo/Say", b"over unix") == b"over unix"
        stream = channel.stream("/test.Echo/Talk")
        for message in messages():
            stream.send(message)
            assert stream.receive(timeout=WAIT) == message
        stream.close_send()
        assert stream.receive(timeout=WAIT) is None


@pytest.mark.parametrize("client_core", CORE_NAMES)
@pytest.mark.parametrize("server_core", CORE_NAMES)
def test_each_core_s_client_talks_to_each_core_s_server(client_core, server_core):
    client, server_module = load_core(client_core), load_core(server_core)
    with (
        serving(server_module) as server,
        dialling(client, f"127.0.0.1:{server.port}") as channel,
    ):
        assert channel.unary("/test.Echo/Say", b"unary") == b"unary"
        stream = channel.stream("/test.Echo/Talk")
        for message in messages():
            stream.send(message)
            assert stream.receive(timeout=WAIT) == message
        stream.close_send()
        assert stream.receive(timeout=WAIT) is None


def refusing_missing(method, metadata, requests, call):
    """An echo, but ``/Missing`` methods end with NOT_FOUND before any message."""
    if method.endswith("/Missing"):
        call.set_status(5, "no such thing here")
        return
    yield from requests


def test_a_plain_grpcio_client_talks_to_the_core_s_server(core):
    with serving(core, refusing_missing) as server:
        channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        try:
            say = channel.unary_unary("/test.Echo/Say")
            assert say(b"unary", timeout=WAIT) == b"unary"
            requests: queue.SimpleQueue[object] = queue.SimpleQueue()
            end = object()
            responses = channel.stream_stream("/test.Echo/Talk")(
                iter(requests.get, end), timeout=WAIT
            )
            for message in messages():
                requests.put(message)
                assert next(responses) == message
            requests.put(end)
            assert next(responses, None) is None
            assert responses.code() == grpc.StatusCode.OK
            with pytest.raises(grpc.RpcError) as caught:
                channel.unary_unary("/test.Echo/Missing")(b"", timeout=WAIT)
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
            assert caught.value.details() == "no such thing here"
        finally:
            channel.close()


class _PlainEcho(grpc.GenericRpcHandler):
    """A grpcio server's handler written against grpcio alone: every method echoes, but
    ``/Missing`` methods, which end with NOT_FOUND before any message."""

    def service(self, handler_call_details):
        missing = handler_call_details.method.endswith("/Missing")

        def serve(request_iterator, context):
            if missing:
                context.abort(grpc.StatusCode.NOT_FOUND, "no such thing here")
            yield from request_iterator

        return grpc.stream_stream_rpc_method_handler(serve)


def test_the_core_s_client_talks_to_a_plain_grpcio_server(core):
    executor = futures.ThreadPoolExecutor(max_workers=4)
    server = grpc.server(executor, handlers=[_PlainEcho()])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with dialling(core, f"127.0.0.1:{port}") as channel:
            assert channel.unary("/test.Echo/Say", b"unary") == b"unary"
            stream = channel.stream("/test.Echo/Talk")
            for message in messages():
                stream.send(message)
                assert stream.receive(timeout=WAIT) == message
            stream.close_send()
            assert stream.receive(timeout=WAIT) is None
            with pytest.raises(core.WireStatusError) as caught:
                channel.unary("/test.Echo/Missing", b"")
            assert (caught.value.code, caught.value.details) == ("NOT_FOUND", "no such thing here")
            stream = channel.stream("/test.Echo/Missing")
            with pytest.raises(core.WireStatusError) as caught:
                stream.receive(timeout=WAIT)
            assert (caught.value.code, caught.value.details) == ("NOT_FOUND", "no such thing here")
    finally:
        server.stop(0).wait()
        executor.shutdown(wait=True)


# gRPC's status codes, numbered as grpcio numbers them
STATUS = {code.value[0]: code.name for code in grpc.StatusCode}


@pytest.mark.parametrize("number", [1, 3, 5, 7, 9, 12, 14, 16])
def test_the_status_a_server_sets_reaches_the_client(core, number):
    def failing(method, metadata, requests, call):
        for message in requests:
            if message == b"stop":
                break
            yield message
        call.set_status(number, f"status {number} from {method}")

    with connected(core, failing) as (_, channel):
        with pytest.raises(core.WireStatusError) as caught:
            channel.unary("/test.Fail/Say", b"stop")
        assert caught.value.code == STATUS[number]
        assert caught.value.details == f"status {number} from /test.Fail/Say"
        assert str(caught.value) == f"{STATUS[number]}: status {number} from /test.Fail/Say"
        stream = channel.stream("/test.Fail/Talk")
        stream.send(b"kept")
        assert stream.receive(timeout=WAIT) == b"kept"
        stream.send(b"stop")
        with pytest.raises(core.WireStatusError) as caught:
            stream.receive(timeout=WAIT)
        assert (caught.value.code, caught.value.details) == (
            STATUS[number],
            f"status {number} from /test.Fail/Talk",
        )


def test_a_dispatch_that_raises_gives_unknown_and_the_server_keeps_serving(core):
    def fragile(method, metadata, requests, call):
        for message in requests:
            if message == b"boom":
                raise ValueError("the handler broke on boom")
            yield message

    with connected(core, fragile) as (_, channel):
        for _ in range(3):
            with pytest.raises(core.WireStatusError) as caught:
                channel.unary("/test.Fragile/Say", b"boom")
            assert caught.value.code == "UNKNOWN"
            assert caught.value.details == "ValueError: the handler broke on boom"
            stream = channel.stream("/test.Fragile/Talk")
            stream.send(b"fine")
            assert stream.receive(timeout=WAIT) == b"fine"
            stream.send(b"boom")
            with pytest.raises(core.WireStatusError, match="UNKNOWN: ValueError"):
                stream.receive(timeout=WAIT)
            assert channel.unary("/test.Fragile/Say", b"still serving") == b"still serving"


def test_wrong_arguments_are_refused_naming_what_was_wrong(core):
    with connected(core) as (server, channel):
        with pytest.raises(ValueError, match="method must be a path"):
            channel.unary("test.Echo/Say", b"")
        with pytest.raises(ValueError, match="method must be a path"):
            channel.stream("Say")
        with pytest.raises(ValueError, match="timeout must be a non-negative"):
            channel.unary("/test.Echo/Say", b"", timeout=-1.0)
        with pytest.raises(ValueError, match="timeout must be a non-negative"):
            channel.stream("/test.Echo/Talk").receive(timeout=float("nan"))
        with pytest.raises(ValueError, match="max_message_bytes must be positive"):
            core.WireChannel(f"127.0.0.1:{server.port}", max_message_bytes=0, connect_timeout=1)
    with pytest.raises(TypeError, match="dispatch must be callable"):
        core.WireServer("127.0.0.1:0", "echo", max_message_bytes=MAX)

    def bad_status(method, metadata, requests, call):
        call.set_status(17, "no such code")
        yield b""

    with connected(core, bad_status) as (_, channel):
        with pytest.raises(core.WireStatusError) as caught:
            channel.unary("/test.Bad/Say", b"")
        assert caught.value.code == "UNKNOWN"
        assert "code must be a gRPC status code 0..16, got 17" in caught.value.details


def test_a_stream_refuses_sends_once_it_is_over(core):
    with connected(core) as (_, channel):
        stream = channel.stream("/test.Echo/Talk")
        stream.close_send()
        with pytest.raises(core.WireStatusError) as caught:
            stream.send(b"after close_send")
        assert caught.value.code == "FAILED_PRECONDITION"
        assert stream.receive(timeout=WAIT) is None
        stream = channel.stream("/test.Echo/Talk")
        stream.cancel()
        with pytest.raises(core.WireStatusError) as caught:
            stream.send(b"after cancel")
        assert caught.value.code == "CANCELLED"


def _unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_dialling_a_port_nobody_listens_on_is_unavailable_within_the_timeout(core):
    target = f"127.0.0.1:{_unused_port()}"
    started = time.monotonic()
    with pytest.raises(core.WireStatusError) as caught:
        core.WireChannel(target, max_message_bytes=MAX, connect_timeout=0.5)
    assert caught.value.code == "UNAVAILABLE"
    assert target in caught.value.details
    assert time.monotonic() - started < 0.5 + 2.0


def test_a_server_that_cannot_bind_raises_os_error_naming_the_target(core, tmp_path):
    with serving(core) as server:
        taken = f"127.0.0.1:{server.port}"
        with pytest.raises(OSError, match=taken):
            core.WireServer(taken, echo, max_message_bytes=MAX)
    nowhere = f"unix://{tmp_path / 'no such directory' / 'wire.sock'}"
    with pytest.raises(OSError, match="no such directory"):
        core.WireServer(nowhere, echo, max_message_bytes=MAX)


# A timeout well under a millisecond fires too.
@pytest.mark.parametrize("timeout", [0.0005, 0.05])
def test_a_receive_that_times_out_leaves_the_stream_usable(core, timeout):
    with connected(core) as (_, channel):
        stream = channel.stream("/test.Echo/Talk")
        for attempt in range(3):
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                stream.receive(timeout=timeout)
            assert time.monotonic() - started < timeout + 1.0
            stream.send(b"after timeout %d" % attempt)
            assert stream.receive(timeout=WAIT) == b"after timeout %d" % attempt
        stream.close_send()
        assert stream.receive(timeout=WAIT) is None


def within(timeout: float) -> float:
    """The most a server may see left of ``timeout``: gRPC rounds grpc-timeout up to a few
    significant digits to keep the header short."""
    return timeout * 1.05 + 0.01


def test_a_unary_timeout_is_deadline_exceeded_and_the_server_sees_its_deadline(core):
    seen: queue.SimpleQueue[tuple[float | None, bool]] = queue.SimpleQueue()

    def slow(method, metadata, requests, call):
        remaining = call.time_remaining()
        message = next(requests)
        if message == b"slow":  # waits until the client gave up, at most WAIT s
            deadline = time.monotonic() + WAIT
            while call.is_active() and time.monotonic() < deadline:
                time.sleep(0.01)
        seen.put((remaining, call.is_active()))
        yield message

    with connected(core, slow) as (_, channel):
        started = time.monotonic()
        with pytest.raises(core.WireStatusError) as caught:
            channel.unary("/test.Slow/Say", b"slow", timeout=0.3)
        assert caught.value.code == "DEADLINE_EXCEEDED"
        assert time.monotonic() - started < 0.3 + 2.0
        remaining, active = seen.get(timeout=WAIT)
        assert 0 < remaining <= within(0.3)
        assert not active
        assert channel.unary("/test.Slow/Say", b"quick", timeout=WAIT) == b"quick"
        remaining, _ = seen.get(timeout=WAIT)
        assert 0 < remaining <= within(WAIT)
        assert channel.unary("/test.Slow/Say", b"no deadline") == b"no deadline"
        assert seen.get(timeout=WAIT)[0] is None


def test_an_oversize_request_is_resource_exhausted(core):
    with connected(core, server=1024, client=MAX) as (_, channel):
        assert channel.unary("/test.Echo/Say", b"x" * 1000) == b"x" * 1000
        with pytest.raises(core.WireStatusError) as caught:
            channel.unary("/test.Echo/Say", b"x" * 2048)
        assert caught.value.code == "RESOURCE_EXHAUSTED"
        stream = channel.stream("/test.Echo/Talk")
        stream.send(b"x" * 2048)
        with pytest.raises(core.WireStatusError) as caught:
            stream.receive(timeout=WAIT)
        assert caught.value.code == "RESOURCE_EXHAUSTED"


def test_an_oversize_response_is_resource_exhausted(core):
    def inflating(method, metadata, requests, call):
        for message in requests:
            yield message * 2

    with connected(core, inflating, server=MAX, client=1024) as (_, channel):
        assert channel.unary("/test.Inflate/Say", b"x" * 500) == b"x" * 1000
        with pytest.raises(core.WireStatusError) as caught:
            channel.unary("/test.Inflate/Say", b"x" * 1000)
        assert caught.value.code == "RESOURCE_EXHAUSTED"
        stream = channel.stream("/test.Inflate/Talk")
        stream.send(b"x" * 1000)
        with pytest.raises(core.WireStatusError) as caught:
            stream.receive(timeout=WAIT)
        assert caught.value.code == "RESOURCE_EXHAUSTED"


def _watched(ended: queue.SimpleQueue):
    """An echo that reports, once its requests end, whether its call is still active (given
    up to WAIT s to notice, as grpcio may end the requests a moment before it does). A call
    that ended while a response was on its way is not iterated again but closed (at its
    ``yield``), hence the ``finally``."""

    def dispatch(method, metadata, requests, call):
        try:
            yield from requests
        finally:
            deadline = time.monotonic() + WAIT
            while call.is_active() and time.monotonic() < deadline:
                time.sleep(0.01)
            ended.put(call.is_active())

    return dispatch


def test_a_client_cancel_ends_the_server_s_requests(core):
    ended: queue.SimpleQueue[bool] = queue.SimpleQueue()
    with connected(core, _watched(ended)) as (_, channel):
        stream = channel.stream("/test.Echo/Talk")
        stream.send(b"one")
        assert stream.receive(timeout=WAIT) == b"one"
        stream.cancel()
        assert ended.get(timeout=WAIT) is False
        with pytest.raises(core.WireStatusError) as caught:
            stream.receive(timeout=WAIT)
        assert caught.value.code == "CANCELLED"
        with pytest.raises(core.WireStatusError):
            stream.send(b"after cancel")


@pytest.mark.parametrize("timed", [False, True], ids=["receive", "receive(timeout)"])
def test_a_stream_dropped_unfinished_is_cancelled(core, timed):
    ended: queue.SimpleQueue[bool] = queue.SimpleQueue()
    with connected(core, _watched(ended)) as (_, channel):
        stream = channel.stream("/test.Echo/Talk")
        stream.send(b"one")
        assert stream.receive(timeout=WAIT if timed else None) == b"one"
        del stream
        gc.collect()
        assert ended.get(timeout=WAIT) is False
        assert channel.unary("/test.Echo/Say", b"still open") == b"still open"


IDLE_S = 0.6


def _slow_echo(method, metadata, requests, call):
    """Echoes; a ``b"slow"`` message after ``IDLE_S`` seconds."""
    for message in requests:
        if message == b"slow":
            time.sleep(IDLE_S)
        yield message


def _cpu_share(work) -> float:
    """This process's CPU time over the wall time that ``work()`` takes."""
    cpu, wall = time.process_time(), time.perf_counter()
    work()
    return (time.process_time() - cpu) / (time.perf_counter() - wall)


def test_waiters_stop_polling_so_an_idle_stream_and_a_slow_answer_cost_no_cpu(core):
    """A lone stream's waiters poll only for a while (the Rust core's ``POLL``, 2 ms), then
    park: a session left open while its driver thinks must not keep the server's side busy,
    nor a ``receive`` that waits on a slow answer the client's. This process holds both ends,
    so a waiter that never parked would cost it a whole CPU."""
    with connected(core, _slow_echo) as (_, channel):
        stream = channel.stream("/test.Echo/Talk")
        for _ in range(20):  # warm, and the last answer starts the server's poll
            stream.send(b"ping")
            assert stream.receive(timeout=WAIT) == b"ping"
        idle = _cpu_share(lambda: time.sleep(IDLE_S))
        stream.send(b"slow")
        waiting = _cpu_share(lambda: stream.receive(timeout=WAIT))
        stream.close_send()
    assert idle < 0.25, f"an idle stream: {idle:.0%} of a CPU"
    assert waiting < 0.25, f"a receive waiting {IDLE_S} s for its answer: {waiting:.0%} of a CPU"


SLOW_ANSWER_S = 0.01  # a slow env's step or a model's forward pass: longer than POLL


def _delayed_echo(method, metadata, requests, call):
    for message in requests:
        time.sleep(SLOW_ANSWER_S)
        yield message


def test_waiters_whose_messages_keep_coming_slowly_park_at_once(core):
    """Round after round of answers that take longer than ``POLL``: the client's ``receive``
    and the server's wait for the next request stop polling after the first such waits (but
    for a probe now and then), so a driver of a slow simulator or model leaves the
    CPUs to it. Polling 2 ms of every 10 ms wait at both ends would cost this process, which
    holds both, about 40% of a CPU."""
    with connected(core, _delayed_echo) as (_, channel):
        stream = channel.stream("/test.Echo/Talk")

        def rounds() -> None:
            for _ in range(40):
                stream.send(b"ping")
                assert stream.receive(timeout=WAIT) == b"ping"

        share = _cpu_share(rounds)
        stream.close_send()
    assert share < 0.15, f"40 rounds of {SLOW_ANSWER_S * 1000:.0f} ms answers: {share:.0%} of a CPU"


def test_close_send_ends_the_server_s_request_iterator(core):
    def counting(method, metadata, requests, call):
        count = sum(1 for _ in requests)
        yield str(count).encode()

    with connected(core, counting) as (_, channel):
        stream = channel.stream("/test.Count/Talk")
        for message in (b"a", b"b", b"c"):
            stream.send(message)
        stream.close_send()
        assert stream.receive(timeout=WAIT) == b"3"
        assert stream.receive(timeout=WAIT) is None


def test_closing_the_server_ends_open_streams_and_releases_the_port(core):
    ended: queue.SimpleQueue[bool] = queue.SimpleQueue()
    server = core.WireServer("127.0.0.1:0", _watched(ended), max_message_bytes=MAX)
    port = server.port
    try:
        with dialling(core, f"127.0.0.1:{port}") as channel:
            stream = channel.stream("/test.Echo/Talk")
            stream.send(b"one")
            assert stream.receive(timeout=WAIT) == b"one"
            started = time.monotonic()
            server.close(grace=0.3)
            assert time.monotonic() - started < 0.3 + 3.0
            assert ended.get(timeout=WAIT) is False
            try:
                outcome = stream.receive(timeout=WAIT)
            except core.WireStatusError:
                outcome = None
            assert outcome is None
        server.close()  # again: nothing to do
    finally:
        server.close()
    with serving(core, target=f"127.0.0.1:{port}") as again:
        assert again.port == port


def test_a_call_may_close_its_own_server(core):
    closing: list = []

    def admin(method, metadata, requests, call):
        for message in requests:
            if method.endswith("/Shutdown"):
                closing[0].close(grace=0.2)
            yield message

    server = core.WireServer("127.0.0.1:0", admin, max_message_bytes=MAX)
    closing.append(server)
    try:
        with dialling(core, f"127.0.0.1:{server.port}") as channel:
            assert channel.unary("/test.Admin/Ping", b"ping", timeout=WAIT) == b"ping"
            started = time.monotonic()
            with contextlib.suppress(core.WireStatusError):  # its own call may be cut short
                channel.unary("/test.Admin/Shutdown", b"bye", timeout=WAIT)
            assert time.monotonic() - started < WAIT
    finally:
        server.close()
    with pytest.raises(core.WireStatusError):
        core.WireChannel(f"127.0.0.1:{server.port}", max_message_bytes=MAX, connect_timeout=0.3)


def test_closing_the_channel_ends_its_streams(core):
    with serving(core) as server:
        target = f"127.0.0.1:{server.port}"
        assert repr(server) == f"WireServer(127.0.0.1:0, port={server.port}, serving)"
        channel = core.WireChannel(target, max_message_bytes=MAX, connect_timeout=WAIT)
        assert repr(channel) == f"WireChannel({target}, open)"
        try:
            stream = channel.stream("/test.Echo/Talk")
            stream.send(b"one")
            assert stream.receive(timeout=WAIT) == b"one"
        finally:
            channel.close()
        with pytest.raises(core.WireStatusError) as caught:
            stream.receive(timeout=WAIT)
        assert caught.value.code == "CANCELLED"
        channel.close()  # again: nothing to do
        assert repr(channel) == f"WireChannel({target}, closed)"
        for call in (lambda: channel.unary("/test.Echo/Say", b""), lambda: channel.stream("/t/T")):
            with pytest.raises(core.WireStatusError) as caught:
                call()
            assert (caught.value.code, caught.value.details) == (
                "CANCELLED",
                "the channel is closed",
            )
    assert repr(server).endswith(", closed)")


def test_unary_calls_from_four_threads_run_beside_an_open_stream(core):
    with connected(core) as (_, channel):
        stream = channel.stream("/test.Echo/Join")
        stream.send(b"open")
        assert stream.receive(timeout=WAIT) == b"open"

        def calls(worker: int) -> list[bytes]:
            return [channel.unary("/test.Echo/Say", b"%d-%d" % (worker, n)) for n in range(25)]

        with futures.ThreadPoolExecutor(max_workers=4) as pool:
            answers = list(pool.map(calls, range(4), timeout=WAIT * 3))
        assert answers == [[b"%d-%d" % (worker, n) for n in range(25)] for worker in range(4)]
        stream.send(b"still open")
        assert stream.receive(timeout=WAIT) == b"still open"
        stream.close_send()
        assert stream.receive(timeout=WAIT) is None


def test_threads_sharing_a_channel_each_drive_their_own_stream(core):
    with connected(core) as (_, channel):

        def talk(worker: int) -> bool:
            stream = channel.stream("/test.Echo/Talk")
            for n in range(50):
                stream.send(b"%d-%d" % (worker, n))
                if stream.receive(timeout=WAIT) != b"%d-%d" % (worker, n):
                    return False
            stream.close_send()
            return stream.receive(timeout=WAIT) is None

        with futures.ThreadPoolExecutor(max_workers=4) as pool:
            assert all(pool.map(talk, range(4), timeout=WAIT * 3))


def test_metadata_reaches_dispatch(core):
    def telling(method, metadata, requests, call):
        for _ in requests:
            yield json.dumps([method, metadata]).encode()

    sent = [("authorization", "Bearer x"), ("x-rlmesh-lane", "3")]
    with connected(core, telling) as (_, channel):
        method, metadata = json.loads(channel.unary("/test.Tell/Say", b"", metadata=sent))
        assert method == "/test.Tell/Say"
        assert all(list(pair) in metadata for pair in sent)
        assert not any(key.startswith("grpc-") or key == "te" for key, _ in metadata)
        stream = channel.stream("/test.Tell/Join", metadata=sent)
        stream.send(b"")
        method, metadata = json.loads(stream.receive(timeout=WAIT))
        assert method == "/test.Tell/Join"
        assert all(list(pair) in metadata for pair in sent)


def test_nothing_of_a_call_outlives_the_closed_server(core):
    """Every call's thread ends with the server: no Python thread of the server is left, and
    nothing holds the dispatch any more (each Rust call thread holds it while it lives)."""

    class Echo:
        def __call__(self, method, metadata, requests, call):
            return echo(method, metadata, requests, call)

    dispatch = Echo()
    held = weakref.ref(dispatch)
    server = core.WireServer("127.0.0.1:0", dispatch, max_message_bytes=MAX)
    del dispatch
    try:
        with dialling(core, f"127.0.0.1:{server.port}") as channel:
            streams = [channel.stream("/test.Echo/Talk") for _ in range(4)]
            for stream in streams:
                stream.send(b"hi")
                assert stream.receive(timeout=WAIT) == b"hi"
            server.close(grace=0.2)
    finally:
        server.close()
    del server, streams, stream
    gc.collect()
    assert held() is None
    assert not [thread.name for thread in threading.enumerate() if "rlmesh-wire" in thread.name]


SERVE_ECHO = """
import sys, time
from rlmesh.core import load_core
core = load_core(sys.argv[1])
def echo(method, metadata, requests, call):
    yield from requests
server = core.WireServer("127.0.0.1:0", echo, max_message_bytes=1 << 20)
print(server.port, flush=True)
time.sleep(60)
"""


def test_a_server_that_dies_mid_stream_is_unavailable(core):
    name = "rust" if core.__name__ == "rlmesh._core" else "python"
    process = subprocess.Popen(
        [sys.executable, "-c", SERVE_ECHO, name], stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(read_line(process, WAIT))
        with dialling(core, f"127.0.0.1:{port}") as channel:
            stream = channel.stream("/test.Echo/Talk")
            stream.send(b"one")
            assert stream.receive(timeout=WAIT) == b"one"
            process.kill()
            process.wait(timeout=WAIT)
            with pytest.raises(core.WireStatusError) as caught:
                stream.send(b"two")  # may already know
                stream.receive(timeout=WAIT)
            assert caught.value.code == "UNAVAILABLE", caught.value.details
    finally:
        process.kill()
        process.wait(timeout=WAIT)
        process.stdout.close()
