"""The raw-bytes gRPC transport: a bidi echo of a 64-byte message over loopback, round trip by
round trip, on the Rust core (tonic) and on the Python core (grpcio).

The server (``python test_bench_transport.py serve --core=NAME``, a ``WireServer`` whose
dispatch echoes) runs in its own process, as a served env does; the client is this process's
``WireChannel.stream``: ``send`` then ``receive`` per round trip. Both sides use the same core.

Run: ``pytest benches/test_bench_transport.py --benchmark-enable``.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from collections.abc import Iterator

from test_bench_remote_env import served

ROUND_TRIPS = 2000
MESSAGE = b"x" * 64
MAX_MESSAGE_BYTES = 1 << 20
WAIT_S = 10.0  # the longest one receive may take before the bench fails


def echo(method, metadata, requests, call):
    yield from requests


@contextlib.contextmanager
def echo_stream(core_name: str) -> Iterator[object]:
    """An open, warm echo stream of core ``core_name`` to a server of the same core in its own
    process."""
    from rlmesh.core import load_core

    core = load_core(core_name)
    argv = [sys.executable, __file__, "serve", f"--core={core_name}"]
    with served(argv) as address:
        channel = core.WireChannel(
            address.removeprefix("tcp://"),
            max_message_bytes=MAX_MESSAGE_BYTES,
            connect_timeout=WAIT_S,
        )
        try:
            stream = channel.stream("/bench.Echo/Join")
            stream.send(MESSAGE)
            assert stream.receive(timeout=WAIT_S) == MESSAGE  # connected and warm
            yield stream
            stream.close_send()
        finally:
            channel.close()


def round_trips(stream, count: int) -> None:
    for _ in range(count):
        stream.send(MESSAGE)
        if stream.receive(timeout=WAIT_S) != MESSAGE:
            raise AssertionError("the echo came back changed")


def round_trip_us(core_name: str, count: int = ROUND_TRIPS) -> float:
    """Microseconds per bidi echo round trip on core ``core_name``, over ``count`` of them."""
    with echo_stream(core_name) as stream:
        started = time.perf_counter()
        round_trips(stream, count)
        return (time.perf_counter() - started) / count * 1e6


def test_bidi_echo_round_trip(benchmark, core):
    benchmark.group = "transport: bidi echo round trip, 64 bytes (per 200)"
    name = "rust" if core.__name__ == "rlmesh._core" else "python"
    with echo_stream(name) as stream:
        benchmark.pedantic(round_trips, args=(stream, 200), rounds=5)


def _serve(core_name: str) -> None:
    from rlmesh.core import load_core

    core = load_core(core_name)
    server = core.WireServer("127.0.0.1:0", echo, max_message_bytes=MAX_MESSAGE_BYTES)
    print(f"tcp://127.0.0.1:{server.port}", flush=True)
    try:
        signal.pause()  # until the bench kills the process group
    finally:
        server.close(grace=0)


def main() -> None:
    parser = argparse.ArgumentParser(description="the server side of the transport bench")
    parser.add_argument("mode", choices=("serve",))
    parser.add_argument("--core", choices=("rust", "python"), required=True)
    args = parser.parse_args()
    _serve(args.core)


if __name__ == "__main__":
    main()
