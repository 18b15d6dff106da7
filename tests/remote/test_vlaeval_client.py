"""``rlmesh.remote.VlaEvalModel`` against vla-eval's own ``serve`` (a ``PredictModelServer``
written here, in vla-eval's venv) and against rlmesh's own vla-eval server: a run gives the
per-episode results of the local run, with chunks and the execution horizon, at 1 and 4 lanes
on both cores, stateful servers included (episode_start resets them); images travel as PNG;
errors, keys and missing servers are ``RemoteError``s."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import rlmesh
from helpers import CORES, comparable
from rlmesh.cli import main
from rlmesh.errors import RemoteError
from rlmesh.remote.vlaeval.client import OBSERVATION_KEY, VlaEvalModel
from rlmesh.remote.vlaeval.server import serve_vlaeval
from servers import served
from test_vlaeval_codec import vlaeval_python

CHUNK = 4  # the servers' H, whatever the run's execution_horizon
RUN = {"episodes": 6, "seed": 3, "max_episode_steps": 60}

# vla-eval's PredictModelServer serving chunk_policy (below, the same arithmetic): arguments
# "stateful" (count each episode's predictions, reset by episode_start), the chunk_size
# ("none": answer whole chunks; a number: replay that many actions server-side) and "fail".
# An observation holding "image" is answered [sum, height, width, channels] of what it got.
PEER_SERVER = """
import sys, anyio, numpy as np
from vla_eval.model_servers.predict import PredictModelServer
from vla_eval.model_servers.serve import serve_async

stateful, chunk_size, fail = sys.argv[1] == "stateful", sys.argv[2], sys.argv[3] == "fail"

class ChunkServer(PredictModelServer):
    def __init__(self):
        super().__init__(chunk_size=None if chunk_size == "none" else int(chunk_size))
        self.calls = {}

    async def on_episode_start(self, config, ctx):
        self.calls[ctx.session_id] = 0
        await super().on_episode_start(config, ctx)

    def predict(self, obs, ctx):
        if fail:
            raise ValueError("boom")
        if "image" in obs:
            image = obs["image"]
            return {"actions": np.array([[image.sum(), *image.shape]], np.float64)}
        observation = obs["observation"]
        latest = observation[-1] if observation.ndim == 2 else observation
        calls = self.calls.get(ctx.session_id, 0)
        self.calls[ctx.session_id] = calls + 1
        lean = latest[2] + 0.3 * latest[3] - 0.01 * (calls if stateful else 0)
        return {"actions": np.array([[float(lean + 0.02 * k > 0)] for k in range(4)])}

async def main():
    async with anyio.create_task_group() as group:
        port = await group.start(serve_async, ChunkServer(), "127.0.0.1", 0)
        print(f"serving at ws://127.0.0.1:{port}", flush=True)

anyio.run(main)
"""


def chunk_policy(obs: np.ndarray, calls: int = 0) -> np.ndarray:
    """A deterministic (CHUNK, 1) CartPole chunk: push toward the fall, a little less sure the
    later the step (so the chunk's actions differ and the horizon matters). ``calls``, the
    episode's earlier predictions, shifts it further with every call (a stateful policy)."""
    lean = obs[2] + 0.3 * obs[3] - 0.01 * calls
    return np.array([[float(lean + 0.02 * k > 0)] for k in range(CHUNK)], dtype=np.float32)


def latest(observation: np.ndarray) -> np.ndarray:
    """The newest frame of a stacked ``[S, 4]`` observation (a plain ``[4]`` one as it is)."""
    return observation[-1] if observation.ndim == 2 else observation


def unwrap(obs):
    return latest(obs[OBSERVATION_KEY] if isinstance(obs, dict) else obs)


class LocalChunkPolicy(rlmesh.Model):
    """``chunk_policy`` as a local chunked model."""

    stateless = True

    def predict_chunk(self, obs, execution_horizon=None):
        return chunk_policy(unwrap(obs))


class LocalStatefulPolicy(rlmesh.Model):
    """``chunk_policy`` counting each episode's predictions in its context."""

    def predict_chunk(self, obs, execution_horizon=None, context=None):
        return chunk_policy(unwrap(obs), context["predict_index"])


@pytest.fixture(scope="module")
def peer_servers() -> Iterator:
    """Start vla-eval servers with ``peer_servers(stateful, chunk_size, fail)``; one process
    per set of arguments, shared by the module's tests, all stopped at its end."""
    python = vlaeval_python()
    running: dict[tuple[str, ...], str] = {}
    with contextlib.ExitStack() as stack:

        def start(stateful: bool = True, chunk_size: str = "none", fail: bool = False) -> str:
            args = ("stateful" if stateful else "pure", chunk_size, "fail" if fail else "ok")
            if args not in running:
                address = stack.enter_context(served([python, "-c", PEER_SERVER, *args]))
                running[args] = address.replace("ws://", "vlaeval://")
            return running[args]

        yield start


# ------------------------------------------------------------------------------ vla-eval's serve


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(("num_envs", "horizon"), [(1, 1), (4, 4)])
def test_vlaevals_server_gives_the_local_results(peer_servers, core, num_envs, horizon):
    """vla-eval's own server, counting each episode's predictions from its episode_start:
    the run's results are a local stateful model's, chunks replayed with the run's horizon."""
    run = {**RUN, "num_envs": num_envs, "execution_horizon": horizon, "core": core}
    local = rlmesh.run(LocalStatefulPolicy(), "CartPole-v1", **run)
    model = VlaEvalModel(peer_servers(stateful=True))
    remote = rlmesh.run(model, "CartPole-v1", **run)
    assert comparable(remote) == comparable(local)
    assert len(remote.episodes) == RUN["episodes"]
    assert model.server_info["model_server"] == "ChunkServer"
    assert model.server_info["protocol_version"] == 1


def test_a_server_that_replays_chunks_itself_answers_one_action_each(peer_servers):
    """vla-eval's chunk_size=3: one action per observation, the chunk replayed on the
    server; the client takes each as a chunk of one, so the run is a local horizon-3 run's."""
    address = peer_servers(stateful=False, chunk_size="3")
    run = {**RUN, "num_envs": 2, "execution_horizon": 3}
    local = rlmesh.run(LocalChunkPolicy(), "CartPole-v1", **run)
    model = VlaEvalModel(address)
    try:
        assert model.predict_chunk_batch(np.zeros((2, 4), np.float32), 3).shape == (2, 1, 1)
    finally:
        model.close()
    remote = rlmesh.run(VlaEvalModel(address), "CartPole-v1", **run)
    assert comparable(remote) == comparable(local)


def test_images_travel_as_png_that_vlaeval_decodes(peer_servers):
    model = VlaEvalModel(peer_servers(stateful=False))
    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, (2, 24, 32, 3), dtype=np.uint8)
    try:
        answers = model.predict_chunk_batch({"image": images}, 1)
    finally:
        model.close()
    for image, answer in zip(images, answers, strict=True):
        assert answer.tolist() == [[float(image.sum()), 24, 32, 3]]


def test_a_server_error_raises_remote_error_naming_the_address(peer_servers):
    address = peer_servers(fail=True)
    with pytest.raises(RemoteError) as caught:
        rlmesh.run(VlaEvalModel(address), "CartPole-v1", episodes=2, num_envs=2)
    assert caught.value.address == address and address in str(caught.value)
    assert "observation_failed: ValueError: boom" in str(caught.value)


# ------------------------------------------------------------------------------ rlmesh's server


@pytest.mark.parametrize("policy", [LocalChunkPolicy, LocalStatefulPolicy])
@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(("num_envs", "horizon"), [(1, 1), (4, 4)])
def test_a_model_served_by_rlmesh_s_vlaeval_server(policy, core, num_envs, horizon):
    """Both ends of rlmesh: whole chunks, the run's horizon and each episode's seed travel,
    so the served model's results are the local run's, a stateful one's too."""
    run = {**RUN, "num_envs": num_envs, "execution_horizon": horizon, "core": core}
    local = rlmesh.run(policy(), "CartPole-v1", **run)
    with serve_vlaeval(policy()) as server:
        model = VlaEvalModel(server.address)
        remote = rlmesh.run(model, "CartPole-v1", **run)
        stats = server.stats()
    assert comparable(remote) == comparable(local)
    assert model.server_info["capabilities"] == {"action_chunks": True}
    # One request per chunk: horizon 4 replays every action of a 4-action chunk.
    assert stats.requests <= sum(episode.steps for episode in remote.episodes) / horizon + 6


class SeededPolicy(rlmesh.Model):
    """Chunks drawn from each prediction's seed: the same only if the episode's seed is."""

    def predict_chunk(self, obs, execution_horizon=None, context=None):
        rng = np.random.default_rng(context["predict_seed"])
        return rng.integers(0, 2, (CHUNK, 1)).astype(np.float32)


def test_each_episodes_seed_reaches_the_served_model():
    run = {**RUN, "num_envs": 3, "execution_horizon": 2}
    local = rlmesh.run(SeededPolicy(), "CartPole-v1", **run)
    with serve_vlaeval(SeededPolicy()) as server:
        remote = rlmesh.run(VlaEvalModel(server.address), "CartPole-v1", **run)
    assert comparable(remote) == comparable(local)


def test_one_connection_per_lane_across_episodes():
    with serve_vlaeval(LocalStatefulPolicy()) as server:
        result = rlmesh.run(VlaEvalModel(server.address), "CartPole-v1", **RUN, num_envs=2)
        sessions = server.sessions
    assert len(result.episodes) == RUN["episodes"]
    assert sessions == 2  # six episodes on two lanes: two sessions


def test_the_api_key_is_sent_and_a_wrong_one_refused():
    with serve_vlaeval(lambda obs: 1, token="s3cret") as server:
        model = VlaEvalModel(server.address, api_key="s3cret")
        try:
            assert model.connect()["protocol_version"] == 1
            assert model.predict_chunk_batch(np.zeros((1, 4)), 1).tolist() == [[[1]]]
        finally:
            model.close()
        for key in ("wrong", None):
            refused = VlaEvalModel(server.address, api_key=key, timeout_s=10)
            try:
                with pytest.raises(RemoteError, match="401") as caught:
                    refused.connect()
                assert caught.value.address == refused.address
            finally:
                refused.close()


def test_no_server_and_no_answer_are_remote_errors():
    release = threading.Event()

    def slow(obs):
        release.wait(10)
        return 0

    with serve_vlaeval(slow) as server:
        late = VlaEvalModel(server.address, timeout_s=0.3)
        try:
            started = time.monotonic()
            with pytest.raises(RemoteError, match=r"sent no action within 0\.3 s"):
                late.predict_chunk_batch(np.zeros((2, 4), np.float32), 1)
            assert time.monotonic() - started < 5.0
        finally:
            release.set()
            late.close()
        port = server.address.rsplit(":", 1)[1]
    gone = VlaEvalModel(f"127.0.0.1:{port}", timeout_s=5)
    try:
        with pytest.raises(RemoteError, match="could not reach"):
            gone.connect()
    finally:
        gone.close()


def test_addresses_and_arguments():
    assert VlaEvalModel("ws://localhost:8000/").address == "vlaeval://localhost:8000"
    assert VlaEvalModel("localhost:8000").address == "vlaeval://localhost:8000"
    for bad in ("CartPole-v1", "vlaeval://host", "vlaeval://host:99999", "openpi://h:1"):
        with pytest.raises(ValueError):
            VlaEvalModel(bad)
    for bad in ({"timeout_s": 0}, {"image_format": "jpeg"}):
        with pytest.raises(ValueError):
            VlaEvalModel("vlaeval://h:1", **bad)
    with pytest.raises(TypeError):
        VlaEvalModel("vlaeval://h:1", spec={"input": None})
    assert rlmesh.remote.VlaEvalModel is VlaEvalModel


def test_importing_rlmesh_imports_no_websockets():
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, rlmesh, rlmesh.cli, rlmesh.remote; "
            "print(any(name in sys.modules for name in ('websockets', 'msgpack')))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == "False", done.stderr


def test_rlmesh_eval_vlaeval_address(capsys):
    argv = ["eval", "", "--env", "CartPole-v1", "--episodes", "3", "--num-envs", "2"]
    argv += ["--horizon", "4", "--max-episode-steps", "40", "--no-progress"]
    with serve_vlaeval(LocalChunkPolicy(), token="k") as server:
        argv[1] = server.address.replace("ws://", "vlaeval://")
        assert main([*argv, "--policy-token", "k", "--json"]) == 0
        summary = json.loads(capsys.readouterr().out)
        # A wrong token: the run fails with the server's refusal, exit code 1.
        assert main([*argv, "--policy-token", "nope"]) == 1
        assert "401" in capsys.readouterr().err
    local = rlmesh.run(
        LocalChunkPolicy(),
        "CartPole-v1",
        episodes=3,
        num_envs=2,
        execution_horizon=4,
        max_episode_steps=40,
    )
    assert summary["episodes"] == 3
    assert summary["mean_reward"] == pytest.approx(local.summary()["mean_reward"])
