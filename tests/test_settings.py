"""A run's settings: rlmesh.run's keyword arguments checked once into RunSettings, in parts,
with distinct names for what one public argument means in two places."""

from __future__ import annotations

import inspect

import pytest
import rlmesh
from rlmesh.settings import RUN_ARGUMENTS, run_settings


def test_rlmesh_run_takes_exactly_the_arguments_the_settings_list():
    for entry in (rlmesh.run, rlmesh.arun):
        parameters = list(inspect.signature(entry).parameters)
        assert parameters == ["model", "env", "hooks", *RUN_ARGUMENTS]
    assert "max_episode_seconds" in RUN_ARGUMENTS and "on_error" in RUN_ARGUMENTS


def test_an_unknown_argument_is_refused_naming_it_before_anything_runs(tmp_path):
    with pytest.raises(TypeError, match=r"rlmesh.run\(\) got unexpected keyword arguments "
                       r"\['num_env'\]; it takes hooks and seeds, episodes"):  # fmt: skip
        rlmesh.run(lambda obs: 0, "CartPole-v1", num_env=2)
    task = rlmesh.Task("a", "CartPole-v1", episodes=1)
    out = tmp_path / "suite.jsonl"
    with pytest.raises(TypeError, match=r"rlmesh.run_suite\(\) got unexpected .*\['num_env'\]"):
        rlmesh.run_suite(lambda obs: 0, [task], num_env=2, results_path=out)
    assert not out.exists()  # refused before the suite's file was opened


def test_workers_and_max_retries_get_distinct_names_inside():
    local = run_settings(workers=3, on_error="retry", max_retries=2)
    assert local.parallel.process_workers == 3 and local.placement is None
    assert local.failures.episode_retries == 2
    cluster = run_settings(cluster="ray", workers=4, processes_per_worker=2, max_retries=1)
    assert cluster.placement.ray_workers == 4 and cluster.parallel.process_workers == 2
    assert cluster.placement.window_retries == 1


def test_a_window_keeps_the_runs_episodes_and_limits_and_drops_its_placement(tmp_path):
    settings = run_settings(
        episodes=9, seed=5, max_episode_steps=30, timeouts={"step": 2.0}, cluster="ray",
        workers=2, processes_per_worker=2, results_path=tmp_path / "r.jsonl", record_video=2,
    )  # fmt: skip
    window = settings.for_window([4, 7])
    assert window.episodes.indices == [4, 7] and window.episodes.count == 9
    assert window.episodes.base_seed == 5 and window.limits == settings.limits
    assert window.placement is None and window.output.results_path is None
    assert window.parallel.process_workers == 2 and window.core is not None
    assert window.video.directory.is_absolute() and window.video.links_from is None
    assert window.video.directory == (tmp_path / "r_videos").resolve()
