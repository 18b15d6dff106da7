"""What a cluster run checks and decides before any Ray worker runs: its arguments, the
windows it deals, the error when Ray is missing, the merge's completeness, and the cluster
modules' docstring examples. No Ray cluster is started here."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import subprocess
import sys
import textwrap

import pytest
import rlmesh
from helpers import CORES, comparable
from rlmesh.cluster import MergeIncompleteError, deal_windows
from rlmesh.cluster.coordinator import missing_from_merge
from rlmesh.cluster.windows import shuffled, window_sizes
from rlmesh.cluster.worker import HeldModel
from rlmesh.results import EpisodeResult, RunResult
from rlmesh.settings import check_cluster_settings

HAS_RAY = importlib.util.find_spec("ray") is not None


def _placement(**given):
    arguments = {
        "cluster": "ray",
        "ray_workers": None,
        "ray_address": None,
        "window_retries": 3,  # checked by run_settings (tests/driver/test_failures.py)
        "window_episodes": None,
        "processes_per_worker": None,
        **given,
    }
    return check_cluster_settings(**arguments)


# ---------------------------------------------------------------------------- arguments


def test_cluster_arguments_are_checked_once_with_their_defaults():
    placement = _placement(ray_workers=3, ray_address="auto")
    assert (placement.ray_workers, placement.ray_address, placement.window_retries) == (
        3,
        "auto",
        3,
    )
    assert placement.ray_mode == "tasks" and _placement(ray_mode="actors").ray_mode == "actors"
    assert _placement(cluster=None) is None


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"cluster": "spark"}, "cluster must be one of ['ray'] or None, got 'spark'"),
        ({"ray_workers": 0}, "workers must be a positive integer, got 0"),
        ({"ray_address": ""}, "ray_address must be a Ray cluster's address"),
        ({"window_episodes": 0}, "window_episodes must be a positive integer, got 0"),
        ({"processes_per_worker": 0}, "processes_per_worker must be a positive integer"),
        (
            {"cluster": None, "ray_address": "auto", "window_episodes": 1},
            "ray_address, window_episodes need a cluster",
        ),
        ({"ray_mode": "threads"}, "ray_mode must be one of ['tasks', 'actors'] (a Ray task"),
        ({"cluster": None, "ray_mode": "actors"}, "ray_mode needs a cluster: pass cluster='ray'"),
    ],
)
def test_bad_cluster_arguments_are_refused_saying_what_was_expected(given, message):
    with pytest.raises(ValueError) as refused:
        _placement(**given)
    assert message in str(refused.value)


def test_run_checks_the_cluster_arguments_before_anything_runs():
    with pytest.raises(ValueError, match="max_retries must be a non-negative integer"):
        rlmesh.run(lambda obs: 0, "CartPole-v1", episodes=2, cluster="ray", max_retries=-2)


# ---------------------------------------------------------------------------- a held model


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_held_model_is_loaded_by_the_first_run_and_closed_once_on_release(core, asynchronous):
    calls = []

    class Weights(rlmesh.Model):
        def on_route(self, route):
            calls.append("route")

        def predict(self, obs):
            return int(obs[2] > 0)

    if asynchronous:

        async def load(self):
            calls.append("load")

        async def close(self):
            calls.append("close")
    else:

        def load(self):
            calls.append("load")

        def close(self):
            calls.append("close")

    Weights.load, Weights.close = load, close
    model = Weights()
    held = HeldModel(model)  # what an actor does with the model of its first window
    options = {"episodes": 3, "num_envs": 2, "max_episode_steps": 30, "core": core}
    runs = [rlmesh.run(model, "CartPole-v1", seed=seed, **options) for seed in range(3)]
    # The first run routes and loads it; the later runs' routes are the same, and a model
    # that sets itself up for its route does so once (a served model resolves it on load).
    assert calls == ["route", "load"]
    held.release()
    assert calls[-1] == "close" and calls.count("close") == 1
    assert not {"on_route", "load", "close"} & set(vars(model))  # its own methods again
    fresh = [rlmesh.run(Weights(), "CartPole-v1", seed=seed, **options) for seed in range(3)]
    assert [comparable(run) for run in runs] == [comparable(run) for run in fresh]


# ---------------------------------------------------------------------------- windows


def test_windows_cover_every_index_once_each_ascending():
    windows = deal_windows(range(37), window_sizes(37, 2, None, 5), seed=5)
    assert [len(window) for window in windows] == [5] * 7 + [2]
    assert sorted(index for window in windows for index in window) == list(range(37))
    assert all(list(window) == sorted(window) for window in windows)


def test_the_shuffle_is_seeded_and_spreads_a_contiguous_range():
    assert deal_windows(range(40), [10] * 4, seed=1) == deal_windows(range(40), [10] * 4, seed=1)
    assert deal_windows(range(40), [10] * 4, seed=1) != deal_windows(range(40), [10] * 4, seed=2)
    # Ten hard episodes in a row land in more than two of the four windows, where contiguous
    # windows would put them all in one.
    hard = set(range(10, 20))
    holding = [window for window in deal_windows(range(40), [10] * 4, seed=1) if hard & set(window)]
    assert len(holding) > 2


def test_the_shuffle_is_the_documented_mixing_function():
    mix = rlmesh.core.load_core("python").episode_seed
    order = shuffled(range(20), seed=9)
    keys = [mix(9 ^ 0x9E3779B97F4A7C15, index) for index in order]
    assert keys == sorted(keys)


def test_default_windows_shrink_so_the_workers_finish_together():
    sizes = window_sizes(400, 2, None)
    assert sum(sizes) == 400 and sizes == sorted(sizes, reverse=True)
    assert sizes[0] == 100 and min(sizes) == 13  # a quarter, then down to 1/16 of a share
    assert min(window_sizes(37, 3, 8)) >= 5 and window_sizes(37, 3, 8)[0] == 8  # a lane each
    assert window_sizes(3, 4, None) == [1, 1, 1]


def test_a_window_size_given_is_every_windows_but_the_last():
    assert window_sizes(37, 2, 4, window_episodes=5) == [5] * 7 + [2]


# ---------------------------------------------------------------------------- the merge


def _episode(index):
    return EpisodeResult(index, index, index, 0, 10, 1.0, True, False, None, 0.1, 0.1, 0.1)


def test_a_merge_short_of_episodes_is_an_error_naming_the_missing_indices():
    merged = RunResult([_episode(k) for k in (0, 2, 3)], base_seed=0)
    error = missing_from_merge(range(5), merged)
    assert isinstance(error, MergeIncompleteError) and isinstance(error, rlmesh.RlmeshError)
    assert error.missing == (1, 4)
    assert str(error) == (
        "the merged results hold 3 of the 5 episodes asked for; missing indices [1, 4]"
    )
    assert missing_from_merge([0, 2], merged) is None


# ---------------------------------------------------------------------------- Ray missing

WITHOUT_RAY = textwrap.dedent(
    """
    import sys

    class NoRay:  # Ray cannot be imported, as if it were not installed
        def find_spec(self, name, path=None, target=None):
            if name == "ray" or name.startswith("ray."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoRay())
    import rlmesh
    from rlmesh.cli import main

    try:
        rlmesh.run(lambda obs: 0, "CartPole-v1", episodes=2, cluster="ray")
    except ImportError as exc:
        print(exc)
    sys.exit(main(["eval", "random", "--env", "CartPole-v1", "--episodes", "2", "--ray"]))
    """
)


def test_without_ray_a_cluster_run_says_in_one_line_what_to_install():
    shown = subprocess.run(
        [sys.executable, "-c", WITHOUT_RAY], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 2
    assert shown.stdout == (
        'cluster="ray" runs on Ray, which is not installed: pip install "rlmesh[ray]"\n'
    )
    assert shown.stderr == (
        'rlmesh: error: --ray runs on Ray, which is not installed: pip install "rlmesh[ray]"\n'
    )


# ---------------------------------------------------------------------------- docstrings

NEEDS_RAY = ("rlmesh.cluster.job", "rlmesh.cluster.coordinator")


@pytest.mark.parametrize(
    "module_name",
    [
        "rlmesh.cluster.windows",
        "rlmesh.cluster.report",
        "rlmesh.cluster.errors",
        "rlmesh.cluster.worker",
        *NEEDS_RAY,
    ],
)
def test_docstring_examples_hold(module_name):
    if module_name in NEEDS_RAY and not HAS_RAY:
        pytest.skip('its examples pickle with Ray: pip install "rlmesh[ray]"')
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{module_name} has no docstring example"
    assert result.failed == 0
