"""Several replicas of one served model (``replicas=[...]``, ``rlmesh.remote.replicas``), over
each protocol: rlmesh-wire-v1 (``RemoteModel``), openpi's (``OpenPIModel``) and vla-eval's
(``VlaEvalModel``), against rlmesh's own servers on loopback.

The served model keeps per-episode state on the server (its corner's ``context``: each
episode's ``predict_index`` shifts its actions), so an episode that reached a replica without
its history would act differently. A run over several replicas gives the per-episode results
of a run against one server; so does a run whose primary replica is a process that kills
itself (SIGKILL) at its Nth model call, mid-run, its episodes moved to the others and replayed
there; and with every replica gone the run fails naming each one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
from collections.abc import Iterator

import pytest
import rlmesh
from helpers import CORES, comparable
from rlmesh.cli import main
from rlmesh.errors import RemoteError
from rlmesh.policies import load_object
from rlmesh.remote.replicas import ReplicaLostError
from servers import read_address, rlmesh_cli, stop

pytest.importorskip("websockets", reason="the openpi extra (websockets) is not installed")
from rlmesh.remote.openpi.client import OpenPIModel
from rlmesh.remote.vlaeval.client import VlaEvalModel

# The served models, in a file of their own: rlmesh's servers load it in this process and in
# the process of the replica that dies (RLMESH_TEST_DIE_AT: at which model call).
SERVED = """
import os
import signal

import numpy as np
import rlmesh

CHUNK = 4
DIE_AT = int(os.environ.get("RLMESH_TEST_DIE_AT", "0"))
CALLS = [0]


def lean(observation, context):
    \"\"\"The pole's lean, less the more often the episode was predicted for before.\"\"\"
    if isinstance(observation, dict):
        observation = observation["observation"]
    state = np.asarray(observation, dtype=np.float64)
    return state[2] + 0.3 * state[3] - 0.004 * context["predict_index"]


def counted():
    CALLS[0] += 1
    if CALLS[0] == DIE_AT:
        os.kill(os.getpid(), signal.SIGKILL)


class WireLeaning(rlmesh.Model):
    \"\"\"One CartPole action per predict (rlmesh-wire-v1).\"\"\"

    def predict(self, obs, context):
        counted()
        return int(lean(obs, context) > 0)


class ChunkLeaning(rlmesh.Model):
    \"\"\"(CHUNK, 1) CartPole chunks (openpi's and vla-eval's protocols).\"\"\"

    def predict_chunk(self, obs, execution_horizon=None, context=None):
        counted()
        base = lean(obs, context)
        return np.array([[float(base + 0.02 * k > 0)] for k in range(CHUNK)], np.float32)
"""

RUN = {"episodes": 8, "num_envs": 4, "seed": 11, "max_episode_steps": 80}
DIE_AT = 12  # the dying replica's model calls: mid-run, its first episodes still running


class Protocol:
    """How one protocol's servers are started and its client is made."""

    def __init__(self, name: str, model_class: str, client: type, run: dict) -> None:
        self.name = name
        self.model_class = model_class
        self.client = client
        self.run = {**RUN, **run}

    def serve(self, models: str, core: str) -> rlmesh.remote.model_server.ModelServer:
        model = load_object(f"{models}:{self.model_class}", "model", "the served model")()
        if self.name == "rlmesh":
            return rlmesh.serve_model(model, core=core)
        return rlmesh.serve_model(model, protocol=self.name)

    def model(self, addresses: list[str], core: str, timeout_s: float = 10.0) -> rlmesh.Model:
        more = addresses[1:] or None
        if self.name == "rlmesh":
            return rlmesh.RemoteModel(
                addresses[0], replicas=more, core=core, connect_timeout=timeout_s
            )
        return self.client(addresses[0], replicas=more, timeout_s=timeout_s)


PROTOCOLS = [
    Protocol("rlmesh", "WireLeaning", rlmesh.RemoteModel, {}),
    Protocol("openpi", "ChunkLeaning", OpenPIModel, {"execution_horizon": 2}),
    Protocol("vla-eval", "ChunkLeaning", VlaEvalModel, {"execution_horizon": 2}),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("replicas") / "served_models.py"
    path.write_text(SERVED)
    return str(path)


@pytest.fixture(scope="module")
def one_server(models: str) -> Iterator:
    """``one_server(protocol, core)``: the comparable results of the run against one server,
    made once per protocol and core for the module's tests."""
    done: dict[tuple[str, str], list] = {}

    def results(protocol: Protocol, core: str) -> list:
        key = (protocol.name, core)
        if key not in done:
            with servers(protocol, models, core, 1) as (alone,):
                model = protocol.model([alone.address], core)
                result = rlmesh.run(model, "CartPole-v1", **protocol.run, core=core)
            assert len(result.episodes) == RUN["episodes"]
            done[key] = comparable(result)
        return done[key]

    yield results


@contextlib.contextmanager
def servers(protocol: Protocol, models: str, core: str, count: int) -> Iterator[list]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(protocol.serve(models, core)) for _ in range(count)]


@contextlib.contextmanager
def dying_server(protocol: Protocol, models: str, die_at: int) -> Iterator[tuple[str, object]]:
    """A server in a process of its own that SIGKILLs itself at its ``die_at``-th model call:
    its address and the process."""
    argv = rlmesh_cli(
        "serve", "model", f"{models}:{protocol.model_class}", "--address", "127.0.0.1:0"
    )
    if protocol.name != "rlmesh":
        argv += ["--protocol", protocol.name]
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "RLMESH_TEST_DIE_AT": str(die_at)},
    )
    try:
        yield read_address(process, 60.0), process
    finally:
        stop(process)


def free_address() -> str:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def served_address(protocol: Protocol, host_port: str) -> str:
    return {"rlmesh": "tcp://", "openpi": "openpi://", "vla-eval": "vlaeval://"}[
        protocol.name
    ] + host_port


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda protocol: protocol.name)
def test_replicas_give_the_results_of_one_server(protocol, models, one_server, core):
    with servers(protocol, models, core, 3) as three:
        model = protocol.model([server.address for server in three], core)
        spread = rlmesh.run(model, "CartPole-v1", **protocol.run, core=core)
        requests = [server.stats().requests for server in three]
    assert comparable(spread) == one_server(protocol, core)
    assert all(count > 0 for count in requests), requests  # every replica served episodes


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda protocol: protocol.name)
def test_a_replica_killed_mid_run_has_its_episodes_moved_and_replayed(
    protocol, models, one_server, core
):
    with (
        dying_server(protocol, models, DIE_AT) as (dying, process),
        servers(protocol, models, core, 2) as others,
    ):
        # The dying one first: the first episodes go to it.
        model = protocol.model([dying, *(server.address for server in others)], core)
        survived = rlmesh.run(model, "CartPole-v1", **protocol.run, core=core)
        assert process.wait(timeout=10) == -signal.SIGKILL  # it died at its DIE_AT-th call
    assert comparable(survived) == one_server(protocol, core)


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda protocol: protocol.name)
def test_a_replica_down_from_the_start_is_passed_over(protocol, models, one_server):
    with servers(protocol, models, "rust", 1) as (alive,):
        down = served_address(protocol, free_address())
        model = protocol.model([down, alive.address], "rust", 2.0)
        result = rlmesh.run(model, "CartPole-v1", **protocol.run, core="rust")
    assert comparable(result) == one_server(protocol, "rust")


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda protocol: protocol.name)
def test_with_every_replica_gone_the_error_names_each(protocol, models):
    addresses = [served_address(protocol, free_address()) for _ in range(2)]
    with pytest.raises(RemoteError) as caught:
        rlmesh.run(protocol.model(addresses, "rust", 0.5), "CartPole-v1", **protocol.run)
    message = str(caught.value)
    assert "every replica of the served model is lost (2 given)" in message
    for address in addresses:
        assert f"{address}: " in message


def test_the_last_replica_dying_mid_run_fails_the_run_naming_both(models):
    protocol = PROTOCOLS[1]  # openpi
    with (
        dying_server(protocol, models, DIE_AT) as (first, _),
        dying_server(protocol, models, 2 * DIE_AT) as (second, _),
        pytest.raises(RemoteError) as caught,
    ):
        model = protocol.model([first, second], "rust")
        rlmesh.run(model, "CartPole-v1", **protocol.run)
    message = str(caught.value)
    assert "every replica of the served model is lost (2 given)" in message
    assert all(f"{address}: " in message for address in model.addresses), message
    assert "dropped the connection" in message
    assert len(caught.value.partial_result.episodes) < RUN["episodes"]


def test_one_server_lost_is_raised_as_it_is(models):
    address = served_address(PROTOCOLS[1], free_address())
    with pytest.raises(ReplicaLostError, match=r"could not reach the openpi server at"):
        rlmesh.run(PROTOCOLS[1].model([address], "rust"), "CartPole-v1", **PROTOCOLS[1].run)


def test_replicas_are_checked_where_they_are_given():
    with pytest.raises(ValueError, match=r"openpi://127.0.0.1:1 is given twice"):
        OpenPIModel("openpi://127.0.0.1:1", replicas=["127.0.0.1:1"])
    with pytest.raises(TypeError, match=r"replicas must be a list of addresses"):
        VlaEvalModel("vlaeval://127.0.0.1:1", replicas="vlaeval://127.0.0.1:2")


class Stacked(rlmesh.Model):
    """A model whose spec stacks frames: another payload than the raw observation's."""

    spec = rlmesh.ModelSpec(input=rlmesh.State(None, stack=2))

    def predict(self, obs):
        return 0


def test_replicas_serving_other_specs_are_refused():
    with (
        rlmesh.serve_model(lambda obs: 0) as plain,
        rlmesh.serve_model(Stacked()) as stacked,
        pytest.raises(RemoteError, match=r"replicas must serve one model"),
    ):
        rlmesh.RemoteModel(plain.address, replicas=[stacked.address])


def test_the_cli_takes_replicas_as_comma_separated_addresses(models, one_server, capsys):
    protocol = PROTOCOLS[1]
    run = protocol.run
    with servers(protocol, models, "rust", 2) as (first, second):
        policy = ",".join(
            server.address.replace("ws://", "openpi://") for server in (first, second)
        )
        argv = [
            "eval",
            policy,
            "--env",
            "CartPole-v1",
            "--episodes",
            str(run["episodes"]),
            "--num-envs",
            str(run["num_envs"]),
            "--seed",
            str(run["seed"]),
            "--max-episode-steps",
            str(run["max_episode_steps"]),
            "--horizon",
            str(run["execution_horizon"]),
            "--no-progress",
            "--json",
        ]
        assert main(argv) == 0
        summary = json.loads(capsys.readouterr().out)
        requests = [first.stats().requests, second.stats().requests]
    one = one_server(protocol, "rust")
    assert summary["episodes"] == run["episodes"]
    mean_reward = sum(episode["reward"] for episode in one) / len(one)
    assert summary["mean_reward"] == pytest.approx(mean_reward)
    assert all(count > 0 for count in requests), requests
    # Replicas speak the first one's protocol.
    other = policy.split(",")[0] + ",tcp://127.0.0.1:1"
    assert main(["eval", other, "--env", "CartPole-v1", "--no-progress"]) == 2
    assert "does not speak openpi's protocol" in capsys.readouterr().err
