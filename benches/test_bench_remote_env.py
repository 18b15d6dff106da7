"""A served env over loopback (rlmesh-wire-v1): CartPole at 1 and 16 lanes.

- ours: ``rlmesh serve env CartPole-v1 --num-envs N`` in its own process, ``rlmesh.run`` here
  (one StepRequest per round for every running lane);
- the floor: the same ``rlmesh.run`` in-process; the difference per round is the wire's cost;
- the peer (``report.py --peer``): rlmesh 0.1.0's ``EnvServer`` in its own process, driven by
  0.1.0's own ``rlmesh.run`` (its ``Model.run``), both in 0.1.0's venv. This file is also that
  venv's script (``python test_bench_remote_env.py serve|drive ...``), so it imports nothing
  of this package at module level;
- the transport's floor: a bare grpcio bidi echo (``... ping-pong``), timed beside them;
- a served CPU-heavy env (``cpu_heavy.py``, 8 lanes) whose server steps its lanes in 2 worker
  processes (``--workers 2``) against one that steps them in its own process.

Run: ``pytest benches/test_bench_remote_env.py --benchmark-enable``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import selectors
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from cartpole import ENV_ID, SEEDS, batched_policy, policy

REMOTE_LANES = 16
ONE_LANE_SEEDS = SEEDS[:4]  # 2,000 steps: a few seconds per sample over the wire
REMOTE_EPISODES = 32  # 16 lanes: 16,000 lane-steps
CPU_LANES, CPU_EPISODES = 8, 48  # the CPU-heavy env served, its episodes 40 to 119 steps
HERE = Path(__file__).resolve().parent
_ADDRESS = re.compile(r"((?:tcp|unix)://\S+)")


@contextlib.contextmanager
def served(argv: Sequence[str], env: dict[str, str] | None = None) -> Iterator[str]:
    """Run a server process until the block ends; yields the address it prints."""
    process = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    try:
        selector = selectors.DefaultSelector()
        selector.register(process.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and selector.select(deadline - time.monotonic()):
            match = _ADDRESS.search(process.stdout.readline() or "\n")
            if match:
                yield match.group(1)
                return
            if process.poll() is not None:
                break
        raise RuntimeError(f"{' '.join(argv)} printed no address within 60 s")
    finally:
        # SIGTERM first: a server then closes its lanes, whose worker processes, shared memory
        # and semaphores a SIGKILL of the whole session would leave behind.
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        process.stdout.close()


def our_server(num_lanes: int) -> contextlib.AbstractContextManager[str]:
    argv = [sys.executable, "-m", "rlmesh", "serve", "env", ENV_ID, "--num-envs", str(num_lanes)]
    return served(argv)


def cpu_server(workers: int) -> contextlib.AbstractContextManager[str]:
    """The CPU-heavy env served on ``CPU_LANES`` lanes, stepped in ``workers`` processes (1:
    in the server's own)."""
    argv = [sys.executable, "-m", "rlmesh", "serve", "env", "cpu_heavy:make_short_episodes"]
    argv += ["--num-envs", str(CPU_LANES), "--workers", str(workers)]
    path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    return served(argv, env={"PYTHONPATH": path})  # the server and its workers import cpu_heavy


def batched_model(batched=batched_policy):
    """``batched`` (``[N, ...]`` observations to ``[N]`` actions) as a model with a batch
    corner (imports rlmesh late)."""
    import rlmesh

    class Model(rlmesh.Model):
        stateless = True

        def predict_batch(self, obs):
            return batched(obs)

    return Model()


def run_remote_one_lane(address: str, seeds=ONE_LANE_SEEDS, core=None):
    import rlmesh

    return rlmesh.run(policy, address, seeds=seeds, core=core)


def run_local_one_lane(seeds=ONE_LANE_SEEDS, core=None):
    import rlmesh

    return rlmesh.run(policy, ENV_ID, seeds=seeds, core=core)


def run_remote_lanes(address: str, episodes=REMOTE_EPISODES, core=None):
    import rlmesh

    return rlmesh.run(batched_model(), address, episodes=episodes, core=core)


def run_local_lanes(episodes=REMOTE_EPISODES, core=None):
    import rlmesh

    return rlmesh.run(batched_model(), ENV_ID, episodes=episodes, num_envs=REMOTE_LANES, core=core)


def run_remote_cpu(address: str, episodes=CPU_EPISODES):
    import rlmesh
    from cpu_heavy import batched_policy as cpu_policy

    return rlmesh.run(batched_model(cpu_policy), address, episodes=episodes)


def rounds_of(result) -> int:
    """The driver rounds a run took (its ``driver.round`` count)."""
    return next(
        row.count
        for row in result.telemetry
        if row.op == "driver.round" and row.metric == "latency"
    )


def test_remote_cartpole_one_lane(benchmark):
    benchmark.group = "served env, CartPole 1 lane (vs in-process)"
    with our_server(1) as address:
        result = benchmark.pedantic(run_remote_one_lane, args=(address,), rounds=3)
    assert [e.steps for e in result.episodes] == [e.steps for e in run_local_one_lane().episodes]


def test_remote_cartpole_sixteen_lanes(benchmark):
    benchmark.group = "served env, CartPole 16 lanes (vs in-process)"
    with our_server(REMOTE_LANES) as address:
        result = benchmark.pedantic(run_remote_lanes, args=(address,), rounds=3)
    assert result.total_steps == run_local_lanes().total_steps


def _bench_cpu_server(benchmark, workers: int):
    benchmark.group = f"served env, CPU-heavy env {CPU_LANES} lanes (server workers 1 vs 2)"
    with cpu_server(workers) as address:
        return benchmark.pedantic(run_remote_cpu, args=(address, 16), rounds=2)


def test_remote_cpu_heavy_server_one_worker(benchmark):
    assert _bench_cpu_server(benchmark, 1).num_episodes == 16


def test_remote_cpu_heavy_server_two_workers(benchmark):
    result = _bench_cpu_server(benchmark, 2)
    with cpu_server(1) as address:
        alone = run_remote_cpu(address, 16)
    assert [(e.index, e.steps, e.reward) for e in result.episodes] == [
        (e.index, e.steps, e.reward) for e in alone.episodes
    ]


# ------------------------------------------------------------------------------ the floor

PING_PONGS = 2000


def _ping_pong_serve() -> None:
    """A bare grpcio bidi echo (sync server), the transport a served env pays per round."""
    from concurrent import futures

    import grpc

    def echo(requests, context):
        context.send_initial_metadata(())
        yield from requests

    handler = grpc.method_handlers_generic_handler(
        "floor.Echo", {"Join": grpc.stream_stream_rpc_method_handler(echo)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers([handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"tcp://127.0.0.1:{port}", flush=True)
    server.wait_for_termination()


def grpc_round_trip_us(count: int = PING_PONGS) -> float:
    """Microseconds per round trip of a bare grpcio bidi stream over loopback (one small
    message each way, a request queue feeding the stream as ``RemoteEnv`` does): the floor
    under a served env's wire overhead per round on this machine, now."""
    import queue

    import grpc

    with served([sys.executable, __file__, "ping-pong"]) as address:
        channel = grpc.insecure_channel(address.removeprefix("tcp://"))
        requests: queue.SimpleQueue = queue.SimpleQueue()
        responses = channel.stream_stream("/floor.Echo/Join")(iter(requests.get, None))
        message = b"x" * 64
        requests.put(message)
        next(responses)  # connected and warm
        started = time.perf_counter()
        for _ in range(count):
            requests.put(message)
            next(responses)
        elapsed = time.perf_counter() - started
        requests.put(None)
        responses.cancel()
        channel.close()
    return elapsed / count * 1e6


# ------------------------------------------------------------------------------ the peer's side


def _peer_serve(width: int) -> None:
    import gymnasium as gym
    import rlmesh

    if width == 1:
        env = gym.make(ENV_ID)
    else:
        env = gym.vector.SyncVectorEnv([lambda: gym.make(ENV_ID) for _ in range(width)])
    server = rlmesh.EnvServer(env, "127.0.0.1:0")
    server.start()
    print(server.address, flush=True)
    server.wait()


def _peer_drive(address: str, width: int, repeats: int, seeds: int, episodes: int) -> None:
    import rlmesh
    from rlmesh.numpy import Model

    class BatchedPolicy(Model):
        workflow_edition = "2026.06"

        def predict(self, obs):
            return policy(obs)

        def predict_batch(self, obs):
            return batched_policy(obs)

    samples, steps = [], 0
    for _ in range(repeats + 1):  # the first run warms up
        started = time.perf_counter()
        if width == 1:
            result = rlmesh.run(BatchedPolicy(), address, seeds=SEEDS[:seeds])
        else:
            result = rlmesh.run(BatchedPolicy(), address, episodes=episodes)
        samples.append(time.perf_counter() - started)
        steps = result.total_steps
    print(json.dumps({"steps_per_s": steps / statistics.median(samples[1:]), "steps": steps}))


def main() -> None:
    import warnings

    warnings.simplefilter("ignore")
    parser = argparse.ArgumentParser(description="the peer's side of the served-env bench")
    parser.add_argument("mode", choices=("serve", "drive", "ping-pong"))
    parser.add_argument("--address")
    parser.add_argument("--width", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=len(ONE_LANE_SEEDS))
    parser.add_argument("--episodes", type=int, default=REMOTE_EPISODES)
    args = parser.parse_args()
    if args.mode == "ping-pong":
        _ping_pong_serve()
    elif args.mode == "serve":
        _peer_serve(args.width)
    else:
        _peer_drive(args.address, args.width, args.repeats, args.seeds, args.episodes)


if __name__ == "__main__":
    main()
