"""Cluster runs on a real local Ray cluster (``ray.init(num_cpus=2)``, started once for the
module): the same episodes as a run on one process, faults, resume, hooks and the CLI.

Every run here is bounded: a window's worker may die at most ``max_retries`` times, and each
test is given ``TEST_SECONDS`` (an alarm that fails it) to finish.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

ray = pytest.importorskip(
    "ray", reason='Ray is not installed (the ray extra): pip install "rlmesh[ray]"'
)
pytestmark = pytest.mark.usefixtures("ray_cluster", "bounded_in_time")  # conftest.py

import envs_for_cluster as workers  # noqa: E402 - after the skip: only with Ray
import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import rlmesh  # noqa: E402
from helpers import CORES  # noqa: E402
from rlmesh.cli import main  # noqa: E402
from rlmesh.cluster import NotPicklableError, WorkerLostError  # noqa: E402
from rlmesh.results import read_results  # noqa: E402

EPISODES = 37
ENVS = {
    # env id: (plain policy, chunked model, cap on episode steps to keep runs short)
    "CartPole-v1": (workers.balance, "envs_for_cluster:BalanceChunks", 80),
    "Pendulum-v1": (workers.swing, "envs_for_cluster:SwingChunks", 50),
}


def episodes_of(result):
    """What must equal across a cluster run and a run on one process: per-episode fields."""
    return [
        (e.index, e.seed, e.trial, e.steps, e.reward, e.terminated, e.truncated, e.success)
        for e in result.episodes
    ]


def local_run(model, env_id, core, **kwargs):
    if isinstance(model, str):  # a spec the workers load: load it here the same way
        module, _, name = model.partition(":")
        model = getattr(__import__(module), name)()
    return rlmesh.run(model, env_id, episodes=EPISODES, seed=5, core=core, **kwargs)


# ---------------------------------------------------------------------------- equal to one process


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("env_id", list(ENVS))
@pytest.mark.parametrize("chunked", [False, True], ids=["plain", "chunked"])
def test_a_cluster_run_equals_a_run_on_one_process(core, env_id, chunked):
    plain, chunks, cap = ENVS[env_id]
    model, horizon = (chunks, 4) if chunked else (plain, 1)
    options = {"execution_horizon": horizon, "max_episode_steps": cap}
    reference = episodes_of(local_run(model, env_id, core, **options))
    for count in (1, 2, 3):
        result = rlmesh.run(
            model, env_id, episodes=EPISODES, seed=5, core=core, num_envs=2, cluster="ray",
            workers=count, **options,
        )  # fmt: skip
        assert episodes_of(result) == reference, count
        assert result.episodes_requested == EPISODES and result.core == core
        assert result.cluster.workers == count
        assert sum(w.episodes for w in result.cluster.per_worker) == EPISODES


@pytest.mark.parametrize("core", CORES)
def test_seeds_trials_and_indices_mean_what_they_mean_locally(core):
    options = {
        "seeds": list(range(100, 100 + EPISODES)),
        "trial_index_base": 1000,
        "indices": list(range(3, EPISODES, 2)),
        "max_episode_steps": 40,
        "core": core,
    }
    reference = rlmesh.run(workers.balance, "CartPole-v1", **options)
    result = rlmesh.run(workers.balance, "CartPole-v1", cluster="ray", workers=2, **options)
    assert episodes_of(result) == episodes_of(reference)
    assert [e.trial for e in result.episodes] == [1000 + k for k in range(3, EPISODES, 2)]
    assert result.episodes_requested == len(options["indices"])


@pytest.mark.parametrize(("core", "pipeline"), [("rust", False), ("python", False), ("rust", True)])
def test_each_worker_may_step_its_lanes_in_local_worker_processes(core, pipeline):
    options = {"episodes": 12, "seed": 5, "num_envs": 2, "max_episode_steps": 40, "core": core}
    reference = rlmesh.run(workers.balance, "CartPole-v1", **options)
    result = rlmesh.run(
        workers.balance, "CartPole-v1", cluster="ray", workers=1, processes_per_worker=2,
        pipeline=pipeline, **options,
    )  # fmt: skip
    assert episodes_of(result) == episodes_of(reference)


def test_pipelining_on_a_cluster_needs_worker_processes_in_each_window():
    with pytest.raises(ValueError, match=r"with cluster='ray', pass processes_per_worker=2"):
        rlmesh.run(workers.balance, "CartPole-v1", episodes=2, cluster="ray", pipeline=True)


# ---------------------------------------------------------------------------- faults


@pytest.mark.parametrize("core", CORES)
def test_a_worker_killed_mid_window_has_its_window_run_again_with_the_same_seeds(core, tmp_path):
    target = rlmesh.episode_seed(5, 11)  # episode 11 kills its worker once, at its step 20
    factory = workers.KillingFactory("CartPole-v1", seed=target, marker=str(tmp_path / "died"))
    out = tmp_path / "results.jsonl"
    result = rlmesh.run(
        workers.balance, factory, episodes=EPISODES, seed=5, core=core, max_episode_steps=80,
        cluster="ray", workers=2, results_path=out,
    )  # fmt: skip
    assert (tmp_path / "died").exists()  # the worker did die
    assert result.cluster.retries == 1
    reference = local_run(workers.balance, "CartPole-v1", core, max_episode_steps=80)
    assert episodes_of(result) == episodes_of(reference)
    _, on_file = read_results(out)  # refuses a file that repeats an index
    assert [e.index for e in on_file] == list(range(EPISODES))


@pytest.mark.parametrize("core", CORES)
def test_a_window_that_keeps_losing_its_worker_fails_typed_keeping_what_completed(core, tmp_path):
    target = rlmesh.episode_seed(5, 11)  # kills every worker that runs episode 11
    factory = workers.KillingFactory("CartPole-v1", seed=target)
    out = tmp_path / "results.jsonl"
    with pytest.raises(WorkerLostError) as failed:
        rlmesh.run(
            workers.balance, factory, episodes=EPISODES, seed=5, core=core,
            max_episode_steps=80, cluster="ray", workers=2, max_retries=1, results_path=out,
        )  # fmt: skip
    error = failed.value
    assert error.attempts == 2 and 11 in error.indices
    assert "max_retries=1" in str(error) and str(out) in str(error)
    partial = error.partial_result
    assert 11 not in [e.index for e in partial.episodes]
    reference = dict(
        (row[0], row)
        for row in episodes_of(local_run(workers.balance, "CartPole-v1", core,
                                         max_episode_steps=80))
    )  # fmt: skip
    assert episodes_of(partial) == [reference[e.index] for e in partial.episodes]
    _, on_file = read_results(out)
    assert [e.index for e in on_file] == [e.index for e in partial.episodes]


def test_an_error_in_a_window_fails_the_run_as_it_would_locally():
    class Wrong(rlmesh.Model):
        def predict(self, obs):
            return [0, 1, 2]  # CartPole takes one action, not three

    with pytest.raises(rlmesh.ModelOutputError) as failed:
        rlmesh.run(Wrong(), "CartPole-v1", episodes=6, cluster="ray", workers=2)
    assert "raised on Ray worker" in "".join(getattr(failed.value, "__notes__", []))
    assert failed.value.partial_result.num_episodes == 0


# ---------------------------------------------------------------------------- results, hooks


@pytest.mark.parametrize("core", CORES)
def test_episodes_land_in_the_results_file_as_they_complete(core, tmp_path):
    out = tmp_path / "results.jsonl"
    seen_on_disk = []

    class Watch(rlmesh.RunHooks):
        def on_episode_end(self, result):
            _, episodes = read_results(out)
            seen_on_disk.append(result.index in {e.index for e in episodes})

    result = rlmesh.run(
        workers.balance, "CartPole-v1", episodes=EPISODES, seed=5, core=core,
        max_episode_steps=60, cluster="ray", workers=2, window_episodes=12, hooks=Watch(),
        results_path=out,
    )  # fmt: skip
    assert seen_on_disk == [True] * EPISODES  # each on disk before the hooks heard of it
    header, on_file = read_results(out)
    assert header["episodes"] == EPISODES and len(on_file) == EPISODES
    assert result.summary()["episodes"] == EPISODES
    local = rlmesh.run(
        workers.balance, "CartPole-v1", episodes=EPISODES, seed=5, core=core,
        max_episode_steps=60,
    )  # fmt: skip
    assert episodes_of(result) == episodes_of(local)
    again = rlmesh.run(
        workers.balance, "CartPole-v1", episodes=EPISODES, seed=5, core=core,
        max_episode_steps=60, cluster="ray", results_path=out, resume=True,
    )  # fmt: skip
    assert again.cluster is None and episodes_of(again) == episodes_of(local)  # nothing ran


@pytest.mark.parametrize("core", CORES)
def test_a_windows_episodes_land_as_they_complete_not_when_it_ends(core):
    landed = []

    class When(rlmesh.RunHooks):
        def on_episode_end(self, result):
            landed.append(time.perf_counter())

    # One window of 20 episodes, one after another on one lane, each of 60 steps of 1 ms or
    # more: the last completes at least a second after the first.
    rlmesh.run(
        workers.slow_balance, "CartPole-v1", episodes=20, seed=5, core=core,
        max_episode_steps=60, cluster="ray", workers=1, window_episodes=20, hooks=When(),
    )  # fmt: skip
    assert len(landed) == 20 and landed[-1] - landed[0] > 1.0


@pytest.mark.parametrize("core", CORES)
def test_a_run_started_on_one_process_resumes_on_the_cluster_running_only_the_rest(core, tmp_path):
    out = tmp_path / "results.jsonl"
    options = {"episodes": EPISODES, "seed": 5, "core": core, "max_episode_steps": 60}
    rlmesh.run(workers.balance, "CartPole-v1", indices=range(10), results_path=out, **options)
    result = rlmesh.run(
        workers.balance, "CartPole-v1", cluster="ray", workers=2, results_path=out,
        resume=True, **options,
    )  # fmt: skip
    assert sum(w.episodes for w in result.cluster.per_worker) == EPISODES - 10
    reference = rlmesh.run(workers.balance, "CartPole-v1", **options)
    assert episodes_of(result) == episodes_of(reference)
    _, on_file = read_results(out)
    assert [e.index for e in on_file] == list(range(EPISODES))


def test_the_cli_progress_bar_counts_every_episode_across_the_cluster():
    from rlmesh.cli import _EpisodeSink, _Progress, _Throughput

    progress = _Progress(EPISODES, enabled=False)
    result = rlmesh.run(
        workers.balance, "CartPole-v1", episodes=EPISODES, seed=5, max_episode_steps=60,
        cluster="ray", workers=2, hooks=[_EpisodeSink(progress), _Throughput(progress)],
    )  # fmt: skip
    assert sorted(progress.rewards) == sorted(e.reward for e in result.episodes)
    assert progress.lane_steps_per_s > 0
    assert progress.status().endswith("success 0.0%")  # CartPole-v1 at 60 steps: below 475


@pytest.mark.parametrize("core", CORES)
def test_hooks_run_on_the_coordinator_once_per_episode_across_the_cluster(core):
    events = []

    class Count(rlmesh.RunHooks):
        def on_run_start(self, context):
            events.append(("run_start", context["cluster"], context["workers"]))

        def on_episode_start(self, *, episode, seed):
            events.append(("start", episode, seed))

        def on_episode_end(self, result):
            events.append(("end", result.index))

        def on_run_end(self, result):
            events.append(("run_end", result.num_episodes))

    class Throughput(rlmesh.RuntimeHooks):
        def telemetry_snapshot(self, rows):
            events.append(("snapshot", {(row.op, row.metric): row.count for row in rows}))

    result = rlmesh.run(
        workers.balance, "CartPole-v1", episodes=EPISODES, seed=5, core=core,
        max_episode_steps=60, cluster="ray", workers=2, hooks=[Count(), Throughput()],
        telemetry_window=0.01,
    )  # fmt: skip
    assert events[0] == ("run_start", "ray", 2) and events[-1] == ("run_end", EPISODES)
    starts = [event[1:] for event in events if event[0] == "start"]
    assert sorted(starts) == [(k, rlmesh.episode_seed(5, k)) for k in range(EPISODES)]
    ends = [event[1] for event in events if event[0] == "end"]
    assert sorted(ends) == list(range(EPISODES))
    counts = [event[1][("driver", "lane-steps")] for event in events if event[0] == "snapshot"]
    assert counts and counts == sorted(counts) and counts[-1] <= result.total_steps


def test_per_worker_throughput_and_the_coordinator_overhead_are_reported():
    result = rlmesh.run(
        workers.balance, "CartPole-v1", episodes=EPISODES, seed=5, max_episode_steps=60,
        cluster="ray", workers=2, window_episodes=5,
    )  # fmt: skip
    report = result.cluster
    assert len(report.windows) == 8 and report.retries == 0  # ceil(37 / 5) windows
    assert sum(w.steps for w in report.per_worker) == result.total_steps
    assert all(w.steps_per_s > 0 and w.windows >= 1 for w in report.per_worker)
    assert report.coordinator_s > 0 and report.coordinator_s_per_window > 0
    assert report.startup_s >= 0 and report.dispatch_s_per_window >= 0
    assert all(w.wall_s >= w.task_s > 0 for w in report.windows)
    throughput = {(row.op, row.metric): row for row in result.telemetry}
    assert throughput[("driver", "lane-steps")].count == result.total_steps
    assert "workers 2, windows 8" in report.format()


def test_hooks_that_need_the_envs_are_refused_before_anything_runs():
    class Steps(rlmesh.RunHooks):
        def on_step(self, event):
            pass

    with pytest.raises(ValueError, match=r"Steps\.on_step watch the envs' steps"):
        rlmesh.run(workers.balance, "CartPole-v1", episodes=4, cluster="ray", hooks=Steps())


def test_a_model_that_does_not_pickle_is_refused_saying_which_form_to_use():
    import threading

    class Locked(rlmesh.Model):
        def __init__(self):
            super().__init__()
            self.lock = threading.Lock()

        def predict(self, obs):
            return 0

    with pytest.raises(NotPicklableError, match=r"pass it as 'path/to/file.py:Name' or"):
        rlmesh.run(Locked(), "CartPole-v1", episodes=4, cluster="ray")


def test_an_env_instance_is_refused_naming_what_to_pass():
    env = gym.make("CartPole-v1")
    try:
        with pytest.raises(ValueError, match=r"pass a Gymnasium id .*, a zero-argument factory"):
            rlmesh.run(workers.balance, env, episodes=4, cluster="ray")
    finally:
        env.close()


# ---------------------------------------------------------------------------- the CLI

POLICY_FILE = textwrap.dedent(
    """
    import time
    import rlmesh

    class Policy(rlmesh.Model):
        def predict(self, obs):
            time.sleep(DELAY)
            return int(obs[2] + 0.3 * obs[3] > 0)
    """
)


def _policy_file(tmp_path, delay=0.0):
    path = tmp_path / "cluster_policy.py"
    path.write_text(POLICY_FILE.replace("DELAY", repr(delay)))
    return path


def _stable(path):
    _, episodes = read_results(path)
    return [(e.index, e.seed, e.trial, e.steps, e.reward, e.terminated) for e in episodes]


@pytest.mark.parametrize("core", CORES)
def test_the_cli_starts_a_local_ray_instance_with_a_bare_ray_flag(core, tmp_path):
    policy = _policy_file(tmp_path)
    argv = [
        "eval", f"{policy}:Policy", "--env", "CartPole-v1", "--episodes", str(EPISODES),
        "--max-episode-steps", "60", "--core", core, "--json",
    ]  # fmt: skip
    out, reference = tmp_path / "ray.jsonl", tmp_path / "local.jsonl"
    shown = subprocess.run(
        [sys.executable, "-m", "rlmesh", *argv, "--out", str(out), "--ray", "--workers", "2"],
        capture_output=True, text=True, timeout=150, cwd=tmp_path,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    summary = json.loads(shown.stdout)
    assert summary["episodes"] == EPISODES and summary["cluster"]["workers"] == 2
    assert summary["cluster"]["ray_address"] is None  # a local instance of its own
    assert main([*argv, "--out", str(reference)]) == 0
    assert _stable(out) == _stable(reference)


def test_the_cli_joins_a_cluster_at_an_address_and_prints_the_cluster_lines(
    ray_cluster, tmp_path, capsys
):
    policy = _policy_file(tmp_path)
    argv = ["eval", f"{policy}:Policy", "--env", "CartPole-v1", "--episodes", "8",
            "--max-episode-steps", "30", "--no-progress"]  # fmt: skip
    assert main([*argv, "--ray", ray_cluster, "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "mean reward" in out and "workers 2, windows" in out and "steps/s" in out


class ServedHeuristic(rlmesh.Model):
    """CartPole's heuristic as a served model: the rlmesh wire sends the observation's array,
    openpi's protocol a dict of it under ``"observation"``."""

    stateless = True

    def predict_batch(self, obs):
        obs = obs["observation"] if isinstance(obs, dict) else obs
        return (obs[:, 2] + 0.3 * obs[:, 3] > 0).astype(np.int64)


@pytest.mark.parametrize("protocol", ["rlmesh", "openpi"])
def test_the_cli_sends_a_served_policy_s_client_to_the_workers(ray_cluster, tmp_path, protocol):
    if protocol == "openpi":
        pytest.importorskip("websockets", reason="the openpi extra (websockets) is not installed")
    server = rlmesh.serve_model(ServedHeuristic(), protocol=protocol)
    address = (
        server.address if protocol == "rlmesh" else f"openpi://{server.address.split('://')[-1]}"
    )
    out, reference = tmp_path / "ray.jsonl", tmp_path / "local.jsonl"
    argv = ["eval", address, "--env", "CartPole-v1", "--episodes", "6",
            "--max-episode-steps", "40", "--no-progress"]  # fmt: skip
    try:
        assert main([*argv, "--out", str(out), "--ray", ray_cluster, "--workers", "2"]) == 0
        assert main([*argv, "--out", str(reference)]) == 0
    finally:
        server.close()
    assert len(_stable(out)) == 6
    assert _stable(out) == _stable(reference)


def test_cli_ctrl_c_then_resume_equals_an_uninterrupted_run(ray_cluster, tmp_path):
    policy = _policy_file(tmp_path, delay=0.002)
    out = tmp_path / "ray.jsonl"
    argv = [
        "eval", f"{policy}:Policy", "--env", "CartPole-v1", "--episodes", "40",
        "--max-episode-steps", "60", "--out", str(out), "--ray", ray_cluster, "--workers", "2",
    ]  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, "-m", "rlmesh", *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            if out.exists() and len(out.read_text().splitlines()) >= 4:  # header + 3 episodes
                break
            time.sleep(0.02)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:  # the test failed with the run still going
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    assert "Resume with: rlmesh eval" in err
    _, partial = read_results(out)
    assert 3 <= len(partial) < 40

    resumed = subprocess.run(
        [sys.executable, "-m", "rlmesh", *argv, "--resume", "--json"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout)
    assert summary["episodes"] == 40
    ran = sum(worker["episodes"] for worker in summary["cluster"]["per_worker"])
    assert ran == 40 - len(partial)  # only the missing episodes ran again
    reference = tmp_path / "local.jsonl"
    local = [str(reference) if a == str(out) else a for a in argv[: argv.index("--ray")]]
    assert main([*local, "--no-progress"]) == 0
    assert _stable(out) == _stable(reference)


def test_cli_flags_of_a_cluster_need_ray(capsys):
    argv = ["eval", "random", "--env", "CartPole-v1", "--episodes", "2", "--max-retries", "1"]
    assert main(argv) == 2
    assert "--max-retries needs --on-error retry" in capsys.readouterr().err


def test_a_policy_module_in_the_working_directory_loads_on_the_workers(
    ray_cluster, tmp_path, monkeypatch, capsys
):
    (tmp_path / "nearby_policy.py").write_text(POLICY_FILE.replace("DELAY", "0.0"))
    monkeypatch.chdir(tmp_path)
    argv = ["eval", "nearby_policy:Policy", "--env", "CartPole-v1", "--episodes", "4",
            "--max-episode-steps", "20", "--json", "--ray", ray_cluster]  # fmt: skip
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["episodes"] == 4


def test_the_env_tags_reach_the_workers():
    from helpers import comparable
    from test_adapters_v1_libero import TAGS, RoleModel
    from test_adapters_v1_served import UntaggedLibero

    options = {"episodes": 4, "seed": 3, "max_episode_steps": 10, "env_tags": TAGS}
    clustered = rlmesh.run(RoleModel(), UntaggedLibero, cluster="ray", workers=2, **options)
    assert comparable(clustered) == comparable(rlmesh.run(RoleModel(), UntaggedLibero, **options))


def test_a_cluster_run_s_header_records_the_provenance_a_local_run_does(tmp_path):
    from rlmesh.provenance import PROVENANCE_KEY

    options = {"episodes": 4, "seed": 2, "max_episode_steps": 30}
    records = {}
    for name, placement in (("local", {}), ("ray", {"cluster": "ray", "workers": 2})):
        path = tmp_path / f"{name}.jsonl"
        rlmesh.run(workers.balance, "CartPole-v1", results_path=path, **options, **placement)
        records[name] = read_results(path)[0][PROVENANCE_KEY]
    # When each run started is its own; everything else is the same record.
    started = {name: record.pop("started") for name, record in records.items()}
    assert records["ray"] == records["local"]
    assert started["local"] <= started["ray"]  # ISO 8601 in UTC: the text sorts as the time
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", when) for when in started.values())
    assert records["ray"]["policy"] == "envs_for_cluster:balance"
    assert records["ray"]["env_package"]["name"] == "gymnasium"


def test_a_cluster_run_records_the_same_videos_as_a_local_run(tmp_path):
    from helpers import comparable
    from test_video import FRAME, check_videos, make_rendered, policy

    options = {"episodes": 6, "seed": 4, "record_video": 3}
    results = {}
    for name, placement in (("local", {}), ("ray", {"cluster": "ray", "workers": 2})):
        (tmp_path / name).mkdir()
        path = tmp_path / name / "run.jsonl"
        results[name] = rlmesh.run(policy, make_rendered, results_path=path, **options, **placement)
        videos = tmp_path / name / "run_videos"
        check_videos(results[name], videos, tmp_path / name, 3, "RenderedEnv", FRAME)
        # The file links each video relative to its own directory, as the result does.
        linked = sorted((e.index, e.video) for e in read_results(path)[1])
        assert linked == [(e.index, e.video) for e in results[name].episodes]
    assert comparable(results["ray"]) == comparable(results["local"])  # links included
