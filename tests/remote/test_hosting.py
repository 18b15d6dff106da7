"""The servicer host on each core's transport: a grpcio servicer's call answered, a missing
method UNIMPLEMENTED, a servicer that raises UNKNOWN (the server goes on serving), the token
checked before any servicer runs, and the health check. Real servers on loopback, a plain
grpcio client."""

from __future__ import annotations

import contextlib

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rlmesh.core import load_core
from rlmesh.remote.hosting import ServicerHost

WAIT = 10.0


@contextlib.contextmanager
def hosted(core_name: str, token: str | None = None):
    """A host with ``/test.Calc/Double`` (doubles a byte string) and ``/test.Calc/Boom``
    (raises), on ``core_name``'s server; yields a grpcio channel to it and the calls seen."""
    seen: list[bytes] = []

    def double(request: bytes, context) -> bytes:
        seen.append(request)
        return request * 2

    def boom(request: bytes, context) -> bytes:
        raise RuntimeError("the servicer broke")

    host = ServicerHost(token)
    host.add_registered_method_handlers(
        "test.Calc",
        {
            "Double": grpc.unary_unary_rpc_method_handler(double),
            "Boom": grpc.unary_unary_rpc_method_handler(boom),
        },
    )
    wire_server = load_core(core_name).WireServer
    server = wire_server("127.0.0.1:0", host.dispatch, max_message_bytes=1 << 20)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            yield channel, seen
    finally:
        host.close()
        server.close(grace=0.5)


@pytest.mark.parametrize("core_name", ["rust", "python"])
def test_a_servicer_answers_and_failures_get_their_status(core_name):
    with hosted(core_name) as (channel, seen):
        assert channel.unary_unary("/test.Calc/Double")(b"ab", timeout=WAIT) == b"abab"
        with pytest.raises(grpc.RpcError) as missing:
            channel.unary_unary("/test.Calc/Triple")(b"ab", timeout=WAIT)
        assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "/test.Calc/Triple" in missing.value.details()
        with pytest.raises(grpc.RpcError) as broke:
            channel.unary_unary("/test.Calc/Boom")(b"ab", timeout=WAIT)
        assert broke.value.code() == grpc.StatusCode.UNKNOWN
        assert "RuntimeError: the servicer broke" in broke.value.details()
        assert channel.unary_unary("/test.Calc/Double")(b"c", timeout=WAIT) == b"cc"
        assert seen == [b"ab", b"c"]


@pytest.mark.parametrize("core_name", ["rust", "python"])
def test_the_token_is_checked_before_the_servicer_and_health_needs_none(core_name):
    with hosted(core_name, token="s3cret") as (channel, seen):
        double = channel.unary_unary("/test.Calc/Double")
        for metadata in ((), (("authorization", "Bearer wrong"),)):
            with pytest.raises(grpc.RpcError) as refused:
                double(b"ab", metadata=metadata, timeout=WAIT)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert seen == []
        assert double(b"ab", metadata=(("authorization", "Bearer s3cret"),), timeout=WAIT)
        health = health_pb2_grpc.HealthStub(channel)
        answer = health.Check(health_pb2.HealthCheckRequest(), timeout=WAIT)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as unknown:
            health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=WAIT)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
