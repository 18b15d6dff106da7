"""A served model answering 8 drivers at once: cross-driver batching against none.

The model server runs in its own process (``serve_model`` of a cheap deterministic batched
CartPole policy); 8 drivers of one lane each (threads of this process, ``rlmesh.run`` with
``RemoteModel``) evaluate CartPole against it at once. Measured: lane-steps/s of all drivers
together, model calls per lane-step and the mean batch (the server's counts), and the predict
latency each driver sees (its run's ``model.predict`` telemetry: the median of the drivers'
p50s, the worst of their p99s). The baseline is the same server with ``max_batch=1`` (every
predict its own model call).

Run: ``pytest benches/test_bench_remote_model.py --benchmark-enable``; ``benches/report.py`` prints
the row.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import statistics
import threading
import time
from collections.abc import Iterator

import numpy as np
import rlmesh

DRIVERS = 8
EPISODES_PER_DRIVER = 10
ENV_ID = "CartPole-v1"


class CheapBatched(rlmesh.Model):
    """Push toward the side the pole falls to: a few numpy ops for the whole batch."""

    def predict_batch(self, obs):  # [K, 4]
        return (obs[:, 2] + 0.3 * obs[:, 3] > 0).astype(np.int64)


def _serve(conn, max_batch, max_wait_ms) -> None:
    server = rlmesh.serve_model(CheapBatched(), max_batch=max_batch, max_wait_ms=max_wait_ms)
    conn.send(server.address)
    try:
        while (message := conn.recv()) != "stop":
            if message == "stats":
                stats = server.stats()
                conn.send((stats.rows, stats.model_calls, stats.mean_batch))
    finally:
        server.close()


@contextlib.contextmanager
def model_server(max_batch: int | None = None, max_wait_ms: float = 2) -> Iterator[tuple]:
    """A model server process: yields ``(address, stats)`` where ``stats()`` is
    ``(rows, model calls, mean batch)`` so far."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    process = context.Process(target=_serve, args=(theirs, max_batch, max_wait_ms), daemon=True)
    process.start()
    try:
        if not ours.poll(60):
            raise RuntimeError("the model server process did not start within 60 s")
        address = ours.recv()

        def stats() -> tuple[int, int, float]:
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


def drive(address: str, episodes: int = EPISODES_PER_DRIVER, drivers: int = DRIVERS) -> dict:
    """``drivers`` one-lane runs at once against ``address``; their lane-steps, wall time and
    predict latencies."""
    results: list[rlmesh.RunResult | None] = [None] * drivers
    errors: list[BaseException] = []
    models = [rlmesh.RemoteModel(address) for _ in range(drivers)]
    start = threading.Barrier(drivers + 1)

    def one(i: int) -> None:
        try:
            start.wait(timeout=60)
            results[i] = rlmesh.run(models[i], ENV_ID, episodes=episodes, seed=i)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(drivers)]
    for thread in threads:
        thread.start()
    start.wait(timeout=60)
    began = time.perf_counter()
    for thread in threads:
        thread.join(timeout=300)
    elapsed = time.perf_counter() - began
    if errors or any(thread.is_alive() for thread in threads):
        raise RuntimeError(f"a driver failed or hung: {errors}")
    latency = [
        next(row for row in result.telemetry if row.op == "model.predict" and row.unit == "ms")
        for result in results
    ]
    return {
        "lane_steps": sum(result.total_steps for result in results),
        "elapsed_s": elapsed,
        "p50_ms": statistics.median(row.p50 for row in latency),
        "p99_ms": max(row.p99 for row in latency),
    }


def measure(episodes: int = EPISODES_PER_DRIVER, **server) -> dict:
    """One 8-driver evaluation against a fresh server: ``drive``'s figures plus the server's
    model calls per lane-step and mean batch."""
    with model_server(**server) as (address, stats):
        figures = drive(address, episodes)
        rows, calls, mean_batch = stats()
    assert rows == figures["lane_steps"]
    return {
        **figures,
        "lane_steps_per_s": figures["lane_steps"] / figures["elapsed_s"],
        "calls_per_lane_step": calls / rows,
        "mean_batch": mean_batch,
    }


def test_eight_drivers_one_model_server(benchmark):
    benchmark.group = "served model, 8 drivers of 1 CartPole lane"
    figures = benchmark.pedantic(measure, kwargs={"episodes": 2}, rounds=1)
    benchmark.extra_info.update(figures)
    assert figures["mean_batch"] >= 1
