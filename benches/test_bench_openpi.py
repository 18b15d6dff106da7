"""openpi's WebSocket protocol: rlmesh's server beside openpi's reference server, and rlmesh's
openpi client beside rlmesh-wire-v1.

- one client's round trip: a 224x224x3 uint8 image and 8 float32 state values in, a 10x7
  float32 chunk out, on a model that costs nothing, served by rlmesh
  (``serve_model(..., protocol="openpi")``) and by ``openpi-server`` (openpi's
  ``WebsocketPolicyServer``, in its own venv: ``openpi_peer.py``), each in its own process. The
  client is the same for both: ``websockets``' sync client with rlmesh's openpi codec, packing
  and unpacking every request. Issue target: rlmesh's p50 at most 1.2x the reference's.
- eight clients at once (asyncio, one connection each, the same request) against a model
  costing 2 ms a call plus 0.1 ms a row (``openpi_peer.cost``): requests/s. rlmesh's server
  batches the connections' requests into one call; the reference server calls its policy once
  per request, one at a time. Issue target: rlmesh at least 3x the reference.
- ``OpenPIModel`` driving 8 CartPole lanes (a request per lane-step: a chunk of 1, horizon 1)
  against rlmesh's openpi server, beside ``RemoteModel`` on the same model over rlmesh-wire-v1:
  lane-steps/s. The two runs' episodes are the same.

Run: ``pytest benches/test_bench_openpi.py --benchmark-enable`` (pytest-benchmark's figures), or
``python benches/test_bench_openpi.py [--quick] [--json out.json]`` for both sides of each row
interleaved (A B A B ...), their medians and ratios. Without ``--benchmark-enable`` each
benchmark runs once, briefly, as a smoke test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rlmesh
from cartpole import ENV_ID, batched_policy
from openpi_peer import (
    CHUNK_SHAPE,
    chunks,
    cost,
    observation,
    openpi_server_python,
    reference_server,
)
from rlmesh.core import CORE_NAMES
from rlmesh.remote.openpi.client import NO_PROXY, OpenPIModel
from rlmesh.remote.openpi.codec import packb, unpackb
from websockets.asyncio.client import connect
from websockets.sync.client import connect as connect_sync

CLIENTS = 8
LANES = 8
TIMEOUT_S = 30.0
SIDES = ("rlmesh", "openpi-server")
PROTOCOLS = ("openpi", "rlmesh-wire")


class ChunkModel(rlmesh.Model):
    """The round trip's model: ``openpi_peer.chunks`` of the requests' states."""

    def predict_chunk_batch(self, obs, execution_horizon=None):
        return chunks(obs["state"])


class CostedModel(rlmesh.Model):
    """``ChunkModel`` costing 2 ms a call plus 0.1 ms a row (``openpi_peer.cost``)."""

    def predict_chunk_batch(self, obs, execution_horizon=None):
        cost(len(obs["state"]))
        return chunks(obs["state"])


class CartPoleChunk(rlmesh.Model):
    """The CartPole heuristic as chunks of one action (openpi's client sends a plain
    observation under ``"observation"``; rlmesh-wire sends the array)."""

    def predict_chunk_batch(self, obs, execution_horizon=None):
        obs = obs["observation"] if isinstance(obs, dict) else obs
        return batched_policy(obs)[:, None, None]


MODELS = {"chunk": ChunkModel, "costed": CostedModel, "cartpole": CartPoleChunk}


# ---------------------------------------------------------------------------------- servers


def _serve(conn: Any, model: str, protocol: str) -> None:
    server = rlmesh.serve_model(MODELS[model](), "127.0.0.1:0", protocol=protocol)
    conn.send(server.address)
    try:
        while (message := conn.recv()) != "stop":
            if message == "stats":
                stats = server.stats()
                conn.send((stats.requests, stats.rows, stats.model_calls, stats.largest_batch))
    finally:
        server.close()


@contextlib.contextmanager
def our_server(model: str, protocol: str = "openpi") -> Iterator[tuple[str, Callable[[], tuple]]]:
    """rlmesh serving ``MODELS[model]`` in a process of its own: yields ``(address, stats)``,
    ``stats()`` giving ``(requests, rows, model calls, largest batch)`` so far."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    process = context.Process(target=_serve, args=(theirs, model, protocol), daemon=True)
    process.start()
    try:
        if not ours.poll(60):
            raise RuntimeError("rlmesh's model server process did not start within 60 s")
        address = ours.recv()

        def stats() -> tuple:
            ours.send("stats")
            return ours.recv()

        yield address, stats
    finally:
        with contextlib.suppress(OSError):
            ours.send("stop")
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
            process.join(timeout=30)


@contextlib.contextmanager
def both_servers(model: str) -> Iterator[dict[str, str]]:
    """rlmesh's openpi server and openpi-server, both serving ``model``: their addresses."""
    with our_server(model) as (ours, _), reference_server(model) as theirs:
        yield {"rlmesh": ours, "openpi-server": theirs}


# ---------------------------------------------------------------------------------- workloads


class Client:
    """One lockstep connection: ``round_trip`` packs the observation, sends it and unpacks the
    answer, as an openpi client does."""

    def __init__(self, address: str) -> None:
        self._stack = contextlib.ExitStack()
        self.ws = self._stack.enter_context(
            connect_sync(address, compression=None, max_size=None, open_timeout=TIMEOUT_S)
        )
        self.metadata = unpackb(self.ws.recv(timeout=TIMEOUT_S))
        self.obs = observation()

    def round_trip(self) -> dict:
        self.ws.send(packb(self.obs))
        return unpackb(self.ws.recv(timeout=TIMEOUT_S))

    def close(self) -> None:
        self._stack.close()


def round_trips(addresses: dict[str, str], samples: int, block: int = 25) -> dict[str, list]:
    """Each side's round-trip times (s), ``samples`` each, in alternating blocks."""
    clients = {side: Client(address) for side, address in addresses.items()}
    try:
        for client in clients.values():  # warm-up, and the answer is right
            answer = client.round_trip()["actions"]
            np.testing.assert_array_equal(answer, chunks(client.obs["state"][None])[0])
        times: dict[str, list[float]] = {side: [] for side in clients}
        while min(map(len, times.values())) < samples:
            for side, client in clients.items():
                for _ in range(min(block, samples - len(times[side]))):
                    start = time.perf_counter()
                    client.round_trip()
                    times[side].append(time.perf_counter() - start)
        return times
    finally:
        for client in clients.values():
            client.close()


async def _clients(address: str, requests: int, bound_s: float) -> tuple[int, float]:
    """``CLIENTS`` connections sending ``requests`` each (or until ``bound_s``), started
    together: (requests answered, seconds)."""
    connections = [
        await connect(
            address,
            compression=None,
            max_size=None,
            ping_interval=None,
            open_timeout=TIMEOUT_S,
            **NO_PROXY,
        )
        for _ in range(CLIENTS)
    ]
    try:
        for ws in connections:
            unpackb(await asyncio.wait_for(ws.recv(), TIMEOUT_S))
        deadline = time.perf_counter() + bound_s

        async def client(index: int, ws: Any) -> int:
            obs = observation(index)
            expected = chunks(obs["state"][None])[0]
            for done in range(requests):
                if time.perf_counter() > deadline:
                    return done
                await ws.send(packb(obs))
                answer = unpackb(await asyncio.wait_for(ws.recv(), TIMEOUT_S))
                if done == 0:  # each client gets its own answer, not another's
                    np.testing.assert_array_equal(answer["actions"], expected)
            return requests

        start = time.perf_counter()
        answered = await asyncio.gather(*(client(i, ws) for i, ws in enumerate(connections)))
        return sum(answered), time.perf_counter() - start
    finally:
        await asyncio.gather(*(ws.close() for ws in connections), return_exceptions=True)


def requests_per_s(address: str, requests: int, bound_s: float = 120.0) -> float:
    """``CLIENTS`` clients at once against ``address``: requests answered per second."""
    answered, elapsed = asyncio.run(_clients(address, requests, bound_s))
    return answered / elapsed


def cartpole_lanes(
    address: str, protocol: str, *, core: str | None, episodes: int, max_steps: int
) -> tuple[float, list[tuple]]:
    """``LANES`` CartPole lanes driven by ``OpenPIModel`` (openpi) or ``RemoteModel``
    (rlmesh-wire), a request per lane-step: (lane-steps/s, the episodes' scored fields)."""
    model = OpenPIModel(address) if protocol == "openpi" else rlmesh.RemoteModel(address)
    try:
        start = time.perf_counter()
        result = rlmesh.run(
            model,
            ENV_ID,
            episodes=episodes,
            num_envs=LANES,
            seed=0,
            execution_horizon=1,
            max_episode_steps=max_steps,
            core=core,
        )
        elapsed = time.perf_counter() - start
    finally:
        model.close()
    episodes_seen = [(e.index, e.seed, e.steps, e.reward, e.terminated) for e in result.episodes]
    return result.total_steps / elapsed, episodes_seen


# ---------------------------------------------------------------------------------- benchmarks


@pytest.fixture(scope="module")
def openpi_server_venv() -> str:
    """openpi-server's venv, made once; the benchmarks that need it skip if pip cannot."""
    try:
        return openpi_server_python()
    except RuntimeError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="module")
def chunk_servers(openpi_server_venv) -> Iterator[dict[str, str]]:
    with both_servers("chunk") as addresses:
        yield addresses


@pytest.mark.parametrize("side", SIDES)
def test_one_client_round_trip(benchmark, chunk_servers, side):
    benchmark.group = "openpi, 1 client: 224x224x3 uint8 + 8 floats -> 10x7, round trip"
    client = Client(chunk_servers[side])
    try:
        answer = benchmark(client.round_trip)
    finally:
        client.close()
    assert answer["actions"].shape == CHUNK_SHAPE


@pytest.mark.parametrize("side", SIDES)
def test_eight_clients_on_a_costed_model(benchmark, openpi_server_venv, side):
    benchmark.group = "openpi, 8 clients, model 2 ms a call + 0.1 ms a row"
    requests = 3 if benchmark.disabled else 200
    if side == "rlmesh":
        with our_server("costed") as (address, stats):
            rate = benchmark.pedantic(requests_per_s, args=(address, requests), rounds=1)
            _, rows, calls, largest = stats()
        benchmark.extra_info.update(mean_batch=rows / calls, largest_batch=largest)
    else:
        with reference_server("costed") as address:
            rate = benchmark.pedantic(requests_per_s, args=(address, requests), rounds=1)
    benchmark.extra_info["requests_per_s"] = rate
    assert rate > 0


@pytest.mark.parametrize("core", CORE_NAMES)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_openpi_client_on_cartpole_lanes(benchmark, core, protocol):
    benchmark.group = f"8 CartPole lanes, a request per lane-step, {core} core"
    episodes, max_steps = (LANES, 10) if benchmark.disabled else (4 * LANES, 200)
    served = "openpi" if protocol == "openpi" else "rlmesh"
    with our_server("cartpole", served) as (address, _):
        rate, _ = benchmark.pedantic(
            cartpole_lanes,
            args=(address, protocol),
            kwargs={"core": core, "episodes": episodes, "max_steps": max_steps},
            rounds=1,
        )
    benchmark.extra_info["lane_steps_per_s"] = rate
    assert rate > 0


# ---------------------------------------------------------------------------------- side by side


def side_by_side(repeats: int, round_trip_samples: int, requests: int, episodes: int) -> dict:
    """Every row's two sides, interleaved ``repeats`` times: the figures as a dict."""
    figures: dict[str, Any] = {}
    with both_servers("chunk") as addresses:
        times = round_trips(addresses, round_trip_samples)
    figures["round_trip_ms"] = {
        side: {
            "p50": 1e3 * statistics.median(samples),
            "p90": 1e3 * statistics.quantiles(samples, n=10)[-1],
        }
        for side, samples in times.items()
    }
    rates: dict[str, list[float]] = {side: [] for side in SIDES}
    with our_server("costed") as (ours, stats), reference_server("costed") as theirs:
        addresses = {"rlmesh": ours, "openpi-server": theirs}
        for _ in range(repeats):
            for side in SIDES:
                rates[side].append(requests_per_s(addresses[side], requests))
        _, rows, calls, largest = stats()
    figures["eight_clients_rps"] = {side: statistics.median(rates[side]) for side in SIDES}
    figures["eight_clients_batches"] = {"mean": rows / calls, "largest": largest}
    for core in CORE_NAMES:
        lanes: dict[str, list[float]] = {protocol: [] for protocol in PROTOCOLS}
        runs = {}
        with (
            our_server("cartpole", "openpi") as (openpi, _),
            our_server("cartpole", "rlmesh") as (wire, _),
        ):
            addresses = {"openpi": openpi, "rlmesh-wire": wire}
            for _ in range(repeats):
                for protocol in PROTOCOLS:
                    rate, runs[protocol] = cartpole_lanes(
                        addresses[protocol],
                        protocol,
                        core=core,
                        episodes=episodes,
                        max_steps=200,
                    )
                    lanes[protocol].append(rate)
        assert runs["openpi"] == runs["rlmesh-wire"], "the two protocols' episodes differ"
        figures[f"cartpole_lane_steps_per_s_{core}"] = {
            protocol: statistics.median(lanes[protocol]) for protocol in PROTOCOLS
        }
    return figures


def print_figures(figures: dict) -> None:
    trip = figures["round_trip_ms"]
    ours, theirs = trip["rlmesh"]["p50"], trip["openpi-server"]["p50"]
    print("openpi, 1 client, 224x224x3 uint8 + 8 floats -> 10x7, round trip p50 (p90):")
    for side in SIDES:
        print(f"  {side:14} {trip[side]['p50']:.3f} ms ({trip[side]['p90']:.3f} ms)")
    print(f"  rlmesh / openpi-server: {ours / theirs:.2f}x (target: at most 1.2x)")
    rps = figures["eight_clients_rps"]
    batches = figures["eight_clients_batches"]
    print("openpi, 8 clients, model 2 ms a call + 0.1 ms a row, requests/s:")
    for side in SIDES:
        print(f"  {side:14} {rps[side]:,.0f}")
    print(
        f"  rlmesh / openpi-server: {rps['rlmesh'] / rps['openpi-server']:.2f}x (target: at "
        f"least 3x); rlmesh's mean batch {batches['mean']:.2f}, largest {batches['largest']}"
    )
    for core in CORE_NAMES:
        lanes = figures[f"cartpole_lane_steps_per_s_{core}"]
        print(f"8 CartPole lanes, a request per lane-step, {core} core, lane-steps/s:")
        for protocol in PROTOCOLS:
            print(f"  {protocol:14} {lanes[protocol]:,.0f}")
        ratio = lanes["openpi"] / lanes["rlmesh-wire"]
        print(f"  openpi / rlmesh-wire: {ratio:.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    parser.add_argument("--json", metavar="PATH", help="write the figures here")
    args = parser.parse_args(argv)
    if args.quick:
        settings = {"repeats": 1, "round_trip_samples": 50, "requests": 20, "episodes": LANES}
    else:
        settings = {"repeats": 5, "round_trip_samples": 2000, "requests": 300, "episodes": 32}
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    figures = side_by_side(**settings)
    elapsed, load_after = time.perf_counter() - started, os.getloadavg()[0]
    # Other processes on the machine take CPU from both sides alike, interleaved; say how busy.
    print(
        f"settings: {settings}; ran in {elapsed:.0f} s; load average (1 min) "
        f"{load_before:.1f} before, {load_after:.1f} after, on {os.cpu_count()} CPUs"
    )
    print_figures(figures)
    if args.json:
        report = {"settings": settings, "load": [load_before, load_after], **figures}
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
