"""Cross-driver batching: concurrent drivers' predicts answered by one call of the model's
batched corner, each driver's results equal to its solo run."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import rlmesh
from helpers import CORES, comparable

DRIVERS = 8


class BatchRecorder(rlmesh.Model):
    """CartPole's pole-angle rule, recording the rows of every call it gets."""

    def __init__(self):
        super().__init__()
        self.batches = []

    def predict_batch(self, obs):  # [K, 4]
        self.batches.append(len(obs))
        return (obs[:, 2] > 0).astype(np.int64)


class PerLane(rlmesh.Model):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def predict(self, obs):
        self.calls += 1
        return int(obs[2] > 0)


class ContextCounter(rlmesh.Model):
    """Uses its context: the episode's seed and how often it was predicted for."""

    def predict_batch(self, obs, context):
        flips = np.array([(c["predict_index"] + c["episode_seed"]) % 7 == 0 for c in context])
        return ((obs[:, 2] > 0) ^ flips).astype(np.int64)


def run_drivers(address, core, count=DRIVERS, **run):
    """``count`` drivers of one lane each, at once (threads), driver ``i`` with seed ``i``."""
    results, errors = [None] * count, []
    start = threading.Barrier(count)

    def drive(i):
        try:
            model = rlmesh.RemoteModel(address)
            start.wait(timeout=30)
            results[i] = rlmesh.run(model, "CartPole-v1", seed=i, core=core, **run)
        except Exception as err:  # handed to the test's thread
            errors.append(err)

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a driver did not finish"
    assert not errors, errors
    return results


@pytest.mark.parametrize("core", CORES)
def test_eight_drivers_share_batches_and_each_gets_its_solo_results(core):
    model = BatchRecorder()
    with rlmesh.serve_model(model, max_wait_ms=200) as server:
        results = run_drivers(server.address, core, episodes=3)
        stats = server.stats()
    solo = [
        rlmesh.run(BatchRecorder(), "CartPole-v1", seed=i, episodes=3, core=core)
        for i in range(DRIVERS)
    ]
    for remote, local in zip(results, solo, strict=True):
        assert comparable(remote) == comparable(local)
    print(f"mean batch {stats.mean_batch:.2f} rows over {stats.model_calls} calls")
    assert stats.largest_batch > 1
    assert stats.mean_batch > 1.5
    assert max(model.batches) == stats.largest_batch <= DRIVERS
    assert stats.rows == sum(model.batches) == sum(r.total_steps for r in results)
    assert stats.model_calls == len(model.batches) < stats.requests == stats.rows


def test_max_batch_caps_the_rows_of_one_model_call():
    model = BatchRecorder()
    with rlmesh.serve_model(model, max_batch=3, max_wait_ms=200) as server:
        results = run_drivers(server.address, "rust", episodes=2)
        remote_wide = rlmesh.run(
            rlmesh.RemoteModel(server.address), "CartPole-v1", num_envs=7, episodes=7
        )
    assert max(model.batches) == 3
    assert comparable(remote_wide) == comparable(
        rlmesh.run(BatchRecorder(), "CartPole-v1", num_envs=7, episodes=7)
    )
    for i, remote in enumerate(results):
        local = rlmesh.run(BatchRecorder(), "CartPole-v1", seed=i, episodes=2)
        assert comparable(remote) == comparable(local)


def test_a_per_lane_model_is_called_per_row_and_gives_the_solo_results():
    model = PerLane()
    with rlmesh.serve_model(model, max_wait_ms=50) as server:
        results = run_drivers(server.address, "rust", count=4, episodes=2)
        stats = server.stats()
    assert stats.model_calls == stats.rows == model.calls
    for i, remote in enumerate(results):
        local = rlmesh.run(PerLane(), "CartPole-v1", seed=i, episodes=2)
        assert comparable(remote) == comparable(local)


@pytest.mark.parametrize("core", CORES)
def test_per_episode_contexts_live_on_the_server_and_match_a_local_run(core):
    with rlmesh.serve_model(ContextCounter(), max_wait_ms=100) as server:
        results = run_drivers(server.address, core, count=4, episodes=3, num_envs=2)
        wide = rlmesh.run(
            rlmesh.RemoteModel(server.address), "CartPole-v1", episodes=5, num_envs=3, core=core
        )
    for i, remote in enumerate(results):
        local = rlmesh.run(ContextCounter(), "CartPole-v1", seed=i, episodes=3, num_envs=2)
        assert comparable(remote) == comparable(local)
    local = rlmesh.run(ContextCounter(), "CartPole-v1", episodes=5, num_envs=3, core=core)
    assert comparable(wide) == comparable(local)


def test_drivers_of_other_horizons_get_their_own_chunks():
    class Chunks(rlmesh.Model):
        def predict_chunk_batch(self, obs, execution_horizon=1):
            first = (obs[:, 2] > 0).astype(np.int64)
            return np.stack([first, 1 - first, first, first][:execution_horizon], axis=1)

    with rlmesh.serve_model(Chunks()) as server:
        for horizon in (1, 2, 4):
            remote = rlmesh.run(
                rlmesh.RemoteModel(server.address),
                "CartPole-v1",
                episodes=4,
                num_envs=2,
                execution_horizon=horizon,
            )
            local = rlmesh.run(
                Chunks(), "CartPole-v1", episodes=4, num_envs=2, execution_horizon=horizon
            )
            assert comparable(remote) == comparable(local)
