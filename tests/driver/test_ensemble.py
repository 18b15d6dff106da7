"""Runs with temporal ensembling (``ensemble=rlmesh.TemporalEnsemble(m)``, ``--ensemble M``).

The env here records every action it is given, and its observations do not depend on them, so
the test can replay each episode with ACT's formula (written here) and compare what the run
executed. The model's chunks differ from step to step and from episode to episode.
"""

from __future__ import annotations

import json
import runpy

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from gymnasium import spaces
from helpers import comparable
from rlmesh.cli import main
from rlmesh.errors import ModelDefinitionError

HORIZON = 4
M = 0.3


class RecordingEnv(gym.Env):
    """Observation ``[seed, t]``; the episode lasts ``3 + seed % 6`` steps, so lanes end at
    different rounds and start their next episode mid-run. Every action is recorded under the
    episode's seed."""

    observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = spaces.Box(-10.0, 10.0, (3,), np.float32)
    actions: dict[int, list[np.ndarray]] = {}  # noqa: RUF012 - the test reads it back

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._seed, self._t = int(seed) % 1000, 0
        RecordingEnv.actions[self._seed] = []
        return self._observation(), {}

    def _observation(self):
        return np.array([self._seed, self._t], dtype=np.float32)

    def step(self, action):
        RecordingEnv.actions[self._seed].append(np.array(action))
        self._t += 1
        reward = float(-np.abs(action).sum())
        return self._observation(), reward, self._t >= 3 + self._seed % 6, False, {}


def chunk_of(observation: np.ndarray) -> np.ndarray:
    """``[HORIZON, 3]``: a function of the episode and the step, so every chunk differs."""
    seed, t = float(observation[0]), float(observation[1])
    grid = np.arange(HORIZON)[:, None] * 0.5 + np.arange(3)[None, :] * 0.2
    return (3 * np.sin(seed * 1.3 + t * 0.7 + grid)).astype(np.float32)


class ChunkPolicy(rlmesh.Model):
    stateless = True

    def predict_chunk(self, obs, execution_horizon=None):
        assert execution_horizon is None  # an ensemble asks for the whole chunk
        return chunk_of(obs)


class BatchChunkPolicy(rlmesh.Model):
    stateless = True

    def predict_chunk_batch(self, obs, execution_horizon=None):
        return np.stack([chunk_of(row) for row in obs])


def act_actions(seed: int, steps: int, m: float) -> list[np.ndarray]:
    """What ACT's temporal ensemble executes in an episode of ``steps`` steps."""
    chunks = [chunk_of(np.array([seed, t], np.float32)).astype(np.float64) for t in range(steps)]
    executed = []
    for t in range(steps):
        covering = [chunks[s][t - s] for s in range(max(0, t - HORIZON + 1), t + 1)]
        weights = np.exp(-m * np.arange(len(covering)))
        average = (np.stack(covering) * (weights / weights.sum())[:, None]).sum(axis=0)
        executed.append(average.astype(np.float32))
    return executed


def core_name(core):
    return "rust" if core.__name__ == "rlmesh._core" else "python"


@pytest.mark.parametrize("num_envs", [1, 4])
@pytest.mark.parametrize("policy", [ChunkPolicy, BatchChunkPolicy])
def test_each_episode_executes_acts_temporal_ensemble(core, num_envs, policy):
    RecordingEnv.actions.clear()
    result = rlmesh.run(
        policy(),
        RecordingEnv,
        episodes=6,
        num_envs=num_envs,
        core=core_name(core),
        ensemble=rlmesh.TemporalEnsemble(m=M),
    )
    assert len(result.episodes) == 6
    for episode in result.episodes:
        recorded = RecordingEnv.actions[episode.seed % 1000]
        expected = act_actions(episode.seed % 1000, episode.steps, M)
        assert len(recorded) == episode.steps == 3 + (episode.seed % 1000) % 6
        np.testing.assert_allclose(np.stack(recorded), np.stack(expected), rtol=1e-6, atol=1e-6)


def test_the_episodes_are_the_same_on_any_lane_count_core_and_corner():
    runs = [
        comparable(
            rlmesh.run(
                policy(),
                RecordingEnv,
                episodes=7,
                num_envs=num_envs,
                core=core,
                ensemble=rlmesh.TemporalEnsemble(m=M),
            )
        )
        for core in ("rust", "python")
        for num_envs in (1, 3, 4)
        for policy in (ChunkPolicy, BatchChunkPolicy)
    ]
    assert all(run == runs[0] for run in runs[1:])
    replayed = comparable(
        rlmesh.run(BatchChunkPolicy(), RecordingEnv, episodes=7, num_envs=3, execution_horizon=2)
    )
    assert [e["reward"] for e in replayed] != [e["reward"] for e in runs[0]]


def pendulum_chunks(obs, execution_horizon=None):
    return np.tanh(obs[:2].sum()) * np.linspace(-2, 2, 6, dtype=np.float32)[:, None]


def test_worker_processes_and_a_suite_play_the_same_ensembled_episodes(core):
    model = rlmesh.Model()
    model.predict_chunk = pendulum_chunks
    model.stateless = True
    arguments = dict(episodes=4, max_episode_steps=25, ensemble=rlmesh.TemporalEnsemble(0.05))
    alone = rlmesh.run(model, "Pendulum-v1", num_envs=1, core=core_name(core), **arguments)
    workers = rlmesh.run(
        model, "Pendulum-v1", num_envs=4, workers=2, core=core_name(core), **arguments
    )
    assert comparable(workers) == comparable(alone)
    suite = rlmesh.run_suite(
        model,
        [rlmesh.Task("pendulum", "Pendulum-v1", episodes=4, max_episode_steps=25)],
        ensemble=rlmesh.TemporalEnsemble(0.05),
        num_envs=2,
        core=core_name(core),
    )
    assert comparable(suite["pendulum"], drop=("env_index", "task")) == comparable(
        alone, drop=("env_index", "task")
    )


def test_what_cannot_be_ensembled_is_refused_before_the_first_reset():
    ensemble = rlmesh.TemporalEnsemble()
    with pytest.raises(ValueError, match=r"CartPole-v1's action is a discrete leaf of int64"):
        rlmesh.run(ChunkPolicy(), "CartPole-v1", episodes=1, ensemble=ensemble)
    with pytest.raises(ModelDefinitionError, match="defines neither predict_chunk nor"):
        rlmesh.run(lambda obs: obs[:3], RecordingEnv, episodes=1, ensemble=ensemble)
    with pytest.raises(ValueError, match="execution_horizon=3 replays several actions"):
        rlmesh.run(ChunkPolicy(), RecordingEnv, episodes=1, execution_horizon=3, ensemble=ensemble)
    with pytest.raises(ValueError, match=r"ensemble must be rlmesh.TemporalEnsemble\(m=...\)"):
        rlmesh.run(ChunkPolicy(), RecordingEnv, episodes=1, ensemble=0.01)
    for bad in (-1.0, float("nan"), "0.1"):
        with pytest.raises(ValueError, match=r"TemporalEnsemble\(m=...\) takes a"):
            rlmesh.TemporalEnsemble(m=bad)


def test_the_cli_records_the_ensemble_and_a_resumption_must_keep_it(tmp_path, capsys):
    policy = tmp_path / "ensembled_policy.py"  # a name no other test imports
    policy.write_text(
        "import numpy as np\n"
        "def predict_chunk(obs, execution_horizon=None):\n"
        "    return np.tanh(obs[:2].sum()) * np.linspace(-2, 2, 5, dtype=np.float32)[:, None]\n"
        "import rlmesh\n"
        "class Policy(rlmesh.Model):\n"
        "    stateless = True\n"
        "    def predict_chunk(self, obs, execution_horizon=None):\n"
        "        return predict_chunk(obs)\n"
    )
    out = tmp_path / "run.jsonl"
    command = [f"{policy}:Policy", "--env", "Pendulum-v1", "--episodes", "3"]
    command += ["--max-episode-steps", "10", "--out", str(out)]
    assert main(["eval", *command, "--ensemble", "0.2"]) == 0
    header = json.loads(out.read_text().splitlines()[0])
    assert header["ensemble"] == {"m": 0.2} and header["execution_horizon"] == 1
    from_python = rlmesh.run(
        runpy.run_path(str(policy))["Policy"](),
        "Pendulum-v1",
        episodes=3,
        max_episode_steps=10,
        ensemble=rlmesh.TemporalEnsemble(0.2),
    )
    on_file = rlmesh.results.read_results(out)[1]
    assert [e.trajectory_digest for e in on_file] == [
        e.trajectory_digest for e in from_python.episodes
    ]
    capsys.readouterr()
    assert main(["eval", *command, "--ensemble", "0.3", "--resume"]) == 2
    assert 'ensemble: the file has {"m": 0.2}, this run has {"m": 0.3}' in capsys.readouterr().err
    assert main(["eval", *command, "--ensemble", "-1"]) == 2
    assert "--ensemble: must be a finite number >= 0, got '-1'" in capsys.readouterr().err


class ServedChunkPolicy(rlmesh.Model):
    """``ChunkPolicy`` behind openpi's protocol: the observation arrives under its key."""

    stateless = True

    def predict_chunk(self, obs, execution_horizon=None):
        from rlmesh.remote.openpi.client import OBSERVATION_KEY

        return chunk_of(obs[OBSERVATION_KEY] if isinstance(obs, dict) else obs)


def test_a_model_served_over_openpi_ensembles_its_whole_chunks_as_a_local_one(core):
    from rlmesh.remote.openpi.client import OpenPIModel
    from rlmesh.remote.openpi.server import serve_openpi

    arguments = dict(episodes=5, num_envs=2, core=core_name(core))
    ensemble = rlmesh.TemporalEnsemble(m=M)
    local = rlmesh.run(ChunkPolicy(), RecordingEnv, ensemble=ensemble, **arguments)
    with serve_openpi(ServedChunkPolicy()) as server:
        remote = rlmesh.run(
            OpenPIModel(server.address), RecordingEnv, ensemble=ensemble, **arguments
        )
    assert comparable(remote) == comparable(local)


def test_a_model_served_over_rlmesh_wire_refuses_to_be_ensembled():
    from rlmesh.remote.model_client import RemoteModel
    from rlmesh.remote.model_server import serve_model

    server = serve_model(ChunkPolicy())
    try:
        with pytest.raises(ModelDefinitionError, match="cannot serve a run with ensemble="):
            rlmesh.run(
                RemoteModel(server.address),
                RecordingEnv,
                episodes=1,
                ensemble=rlmesh.TemporalEnsemble(),
            )
    finally:
        server.close()


def test_a_model_served_over_vla_eval_refuses_to_be_ensembled():
    """vla-eval's episode start asks for ``execution_horizon`` actions: a run that averages
    whole chunks cannot get them, so it is refused, not silently averaged over one action."""
    from rlmesh.remote.vlaeval.client import VlaEvalModel
    from rlmesh.remote.vlaeval.server import serve_vlaeval

    with serve_vlaeval(ServedChunkPolicy()) as server:
        with pytest.raises(ModelDefinitionError, match="cannot serve a run with ensemble="):
            rlmesh.run(
                VlaEvalModel(server.address),
                RecordingEnv,
                episodes=1,
                ensemble=rlmesh.TemporalEnsemble(),
            )
        # Without ensemble= the same server plays chunks as usual.
        assert len(rlmesh.run(VlaEvalModel(server.address), RecordingEnv, episodes=1).episodes)
