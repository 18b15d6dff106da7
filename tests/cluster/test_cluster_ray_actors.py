"""Actor mode (``ray_mode="actors"``) on a real local Ray cluster (``ray.init(num_cpus=2)``,
started once for the module): the same episodes as a run on one process, the model loaded
and closed once per actor, an actor killed mid-window, and the CLI's ``--ray-mode``.

Every run here is bounded: a window's actor may die at most ``max_retries`` times, and each
test is given ``RAY_TEST_SECONDS`` (an alarm that fails it) to finish.
"""

from __future__ import annotations

import json
import textwrap

import pytest

ray = pytest.importorskip(
    "ray", reason='Ray is not installed (the ray extra): pip install "rlmesh[ray]"'
)
pytestmark = pytest.mark.usefixtures("ray_cluster", "bounded_in_time")  # conftest.py

import envs_for_cluster as workers  # noqa: E402 - after the skip: only with Ray
import rlmesh  # noqa: E402
from helpers import CORES  # noqa: E402
from rlmesh.cli import main  # noqa: E402
from rlmesh.cluster import WorkerLostError  # noqa: E402
from rlmesh.results import read_results  # noqa: E402
from test_cluster_ray import ENVS, EPISODES, episodes_of, local_run  # noqa: E402


def pids_of(report):
    """The processes that completed windows, from the report's ``host:pid`` worker names."""
    return {int(worker.worker.rpartition(":")[2]) for worker in report.per_worker}


# ---------------------------------------------------------------------------- equal to one process


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("env_id", list(ENVS))
@pytest.mark.parametrize("chunked", [False, True], ids=["plain", "chunked"])
def test_an_actor_mode_run_equals_a_run_on_one_process(core, env_id, chunked):
    plain, chunks, cap = ENVS[env_id]
    model, horizon = (chunks, 4) if chunked else (plain, 1)
    options = {"execution_horizon": horizon, "max_episode_steps": cap}
    reference = episodes_of(local_run(model, env_id, core, **options))
    for count in (1, 2):
        result = rlmesh.run(
            model, env_id, episodes=EPISODES, seed=5, core=core, num_envs=2, cluster="ray",
            workers=count, ray_mode="actors", **options,
        )  # fmt: skip
        assert episodes_of(result) == reference, count
        report = result.cluster
        assert report.ray_mode == "actors" and report.workers == count
        assert len(report.per_worker) <= count  # every window ran on one of the K actors
        assert sum(w.episodes for w in report.per_worker) == EPISODES


# ---------------------------------------------------------------------------- the model's lifecycle


def test_each_actor_loads_and_closes_the_model_once_where_tasks_do_it_per_window(tmp_path):
    options = {"episodes": 12, "seed": 5, "max_episode_steps": 30, "window_episodes": 2}
    for mode in ("actors", "tasks"):
        log = tmp_path / f"{mode}.log"
        result = rlmesh.run(
            workers.CountsItsLifecycle(str(log)), "CartPole-v1", cluster="ray", workers=2,
            ray_mode=mode, **options,
        )  # fmt: skip
        calls = workers.lifecycle_of(log)
        assert len(result.cluster.windows) == 6 and set(calls) == pids_of(result.cluster)
        if mode == "actors":
            assert all(done == ["load", "close"] for done in calls.values()), calls
        else:  # each window's run loads the model and closes it again
            assert sum(done.count("load") for done in calls.values()) == 6
            assert all(done == ["load", "close"] * (len(done) // 2) for done in calls.values())
        reference = rlmesh.run(
            workers.balance, "CartPole-v1", **options | {"window_episodes": None}
        )
        assert episodes_of(result) == episodes_of(reference)


def test_a_model_that_fails_to_close_on_an_actor_fails_the_run_as_on_a_task():
    options = {"episodes": 6, "seed": 5, "max_episode_steps": 20, "cluster": "ray", "workers": 2}
    for mode in ("tasks", "actors"):
        with pytest.raises(RuntimeError, match="the weights would not unload") as failed:
            rlmesh.run(workers.FailsToClose(), "CartPole-v1", ray_mode=mode, **options)
        if mode == "actors":  # closed at the end: every episode had landed, and is kept
            assert failed.value.partial_result.num_episodes == 6
            assert "closing its model" in "".join(failed.value.__notes__)


# ---------------------------------------------------------------------------- results, videos


@pytest.mark.parametrize("core", CORES)
def test_an_actor_mode_run_resumes_a_file_running_only_the_rest(core, tmp_path):
    from rlmesh.cli import _EpisodeSink, _Progress

    out = tmp_path / "results.jsonl"
    options = {"episodes": 20, "seed": 5, "core": core, "max_episode_steps": 40}
    rlmesh.run(workers.balance, "CartPole-v1", indices=range(8), results_path=out, **options)
    progress = _Progress(20, enabled=False)
    result = rlmesh.run(
        workers.balance, "CartPole-v1", cluster="ray", workers=2, ray_mode="actors",
        results_path=out, resume=True, hooks=_EpisodeSink(progress), **options,
    )  # fmt: skip
    assert sum(w.episodes for w in result.cluster.per_worker) == 20 - 8
    assert len(progress.rewards) == 20  # the bar counts the file's 8 and the cluster's 12
    reference = rlmesh.run(workers.balance, "CartPole-v1", **options)
    assert episodes_of(result) == episodes_of(reference)
    _, on_file = read_results(out)
    assert [e.index for e in on_file] == list(range(20))


def test_an_actor_mode_run_records_the_same_videos_as_a_local_run(tmp_path):
    from helpers import comparable
    from test_video import FRAME, check_videos, make_rendered, policy

    options = {"episodes": 6, "seed": 4, "record_video": 3}
    placements = {"local": {}, "actors": {"cluster": "ray", "workers": 2, "ray_mode": "actors"}}
    results = {}
    for name, placement in placements.items():
        (tmp_path / name).mkdir()
        path = tmp_path / name / "run.jsonl"
        results[name] = rlmesh.run(policy, make_rendered, results_path=path, **options, **placement)
        check_videos(results[name], tmp_path / name / "run_videos", tmp_path / name, 3,
                     "RenderedEnv", FRAME)  # fmt: skip
    assert comparable(results["actors"]) == comparable(results["local"])  # links included


# ---------------------------------------------------------------------------- faults


@pytest.mark.parametrize("core", CORES)
def test_an_actor_killed_mid_window_has_its_window_run_again_with_the_same_seeds(core, tmp_path):
    target = rlmesh.episode_seed(5, 11)  # episode 11 kills its actor once, at its step 20
    factory = workers.KillingFactory("CartPole-v1", seed=target, marker=str(tmp_path / "died"))
    out, log = tmp_path / "results.jsonl", tmp_path / "lifecycle.log"
    result = rlmesh.run(
        workers.CountsItsLifecycle(str(log)), factory, episodes=EPISODES, seed=5, core=core,
        max_episode_steps=80, cluster="ray", workers=2, ray_mode="actors", results_path=out,
    )  # fmt: skip
    assert (tmp_path / "died").exists()  # the actor did die
    assert result.cluster.retries == 1
    reference = local_run(workers.balance, "CartPole-v1", core, max_episode_steps=80)
    assert episodes_of(result) == episodes_of(reference)
    _, on_file = read_results(out)  # refuses a file that repeats an index
    assert [e.index for e in on_file] == list(range(EPISODES))
    # Each actor loaded the model once; the killed one never closed it, the others did.
    calls = workers.lifecycle_of(log)
    closed = {pid for pid, done in calls.items() if done == ["load", "close"]}
    assert [pid for pid in calls if pid not in closed] != [] and len(closed) == len(calls) - 1
    assert all(calls[pid] == ["load"] for pid in calls if pid not in closed)
    assert pids_of(result.cluster) <= set(calls)


@pytest.mark.parametrize("core", CORES)
def test_a_window_that_keeps_losing_its_actor_fails_typed_keeping_what_completed(core, tmp_path):
    target = rlmesh.episode_seed(5, 11)  # kills every actor that runs episode 11
    factory = workers.KillingFactory("CartPole-v1", seed=target)
    out = tmp_path / "results.jsonl"
    with pytest.raises(WorkerLostError) as failed:
        rlmesh.run(
            workers.balance, factory, episodes=EPISODES, seed=5, core=core,
            max_episode_steps=80, cluster="ray", workers=2, ray_mode="actors", max_retries=1,
            results_path=out,
        )  # fmt: skip
    error = failed.value
    assert error.attempts == 2 and 11 in error.indices and "max_retries=1" in str(error)
    partial = error.partial_result
    assert 11 not in [e.index for e in partial.episodes]
    reference = {
        row[0]: row
        for row in episodes_of(
            local_run(workers.balance, "CartPole-v1", core, max_episode_steps=80)
        )
    }
    assert episodes_of(partial) == [reference[e.index] for e in partial.episodes]
    _, on_file = read_results(out)
    assert [e.index for e in on_file] == [e.index for e in partial.episodes]


# ---------------------------------------------------------------------------- the CLI

LOADING_POLICY = textwrap.dedent(
    """
    import os
    import rlmesh

    class Policy(rlmesh.Model):
        def load(self):
            with open(LOG, "a") as log:
                log.write(f"load {os.getpid()}\\n")

        def predict(self, obs):
            return int(obs[2] + 0.3 * obs[3] > 0)
    """
)


def stable(path):
    _, episodes = read_results(path)
    return [
        (e.index, e.seed, e.trial, e.steps, e.reward, e.terminated, e.truncated) for e in episodes
    ]


def test_the_cli_runs_windows_on_actors_with_ray_mode_actors(ray_cluster, tmp_path, capsys):
    log = tmp_path / "loads.log"
    policy = tmp_path / "loading_policy.py"
    policy.write_text(LOADING_POLICY.replace("LOG", repr(str(log))))
    out, reference = tmp_path / "actors.jsonl", tmp_path / "local.jsonl"
    argv = ["eval", f"{policy}:Policy", "--env", "CartPole-v1", "--episodes", "12",
            "--max-episode-steps", "30", "--json"]  # fmt: skip
    cluster = ["--ray", ray_cluster, "--workers", "2", "--ray-mode", "actors"]
    assert main([*argv, "--out", str(out), *cluster]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"] == 12 and summary["cluster"]["ray_mode"] == "actors"
    windows = len(summary["cluster"]["windows"])
    loads = log.read_text().split("\n")[:-1]
    assert 1 <= len(loads) <= 2 < windows and len(set(loads)) == len(loads)  # once an actor
    log.unlink()
    assert main([*argv, "--out", str(reference)]) == 0
    assert stable(out) == stable(reference)


def test_the_cli_refuses_ray_mode_without_ray(capsys):
    argv = ["eval", "random", "--env", "CartPole-v1", "--episodes", "2", "--ray-mode", "actors"]
    assert main(argv) == 2
    assert "--ray-mode actors says how Ray workers run their windows: it needs --ray" in (
        capsys.readouterr().err
    )
