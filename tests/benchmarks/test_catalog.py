"""The built-in suites as a whole: their facts, ``suite(name)``, ``rlmesh benchmarks``, ``rlmesh
eval --suite NAME``, a missing package's error and the simulator stack in the results header.
Each benchmark's own episodes are tested in its own module."""

from __future__ import annotations

import json
import sys

import gymnasium as gym
import pytest
import rlmesh
from rlmesh import benchmarks
from rlmesh.benchmarks.base import BenchmarkNotInstalledError, SuiteInfo, import_benchmark
from rlmesh.cli import main
from rlmesh.results import read_results
from rlmesh.suites import TASK_NAME

CORES = ["rust", "python"]
NAMES = (
    "libero_spatial",
    "libero_object",
    "libero_goal",
    "libero_10",
    "libero_90",
    "pusht",
    "aloha",
    "metaworld_mt10",
    "metaworld_mt50",
)


def test_every_suite_the_issue_names_is_built_in_and_makes_its_tasks():
    assert set(benchmarks.names()) == set(NAMES)
    for name in NAMES:
        facts = benchmarks.info(name)
        tasks = benchmarks.suite(name)
        assert [task.name for task in tasks] == list(facts.tasks)
        assert len(set(facts.tasks)) == len(facts.tasks), name
        for task in tasks:
            assert TASK_NAME.fullmatch(task.name), task.name
            assert task.episodes == facts.episodes > 0
            assert task.max_episode_steps == facts.max_episode_steps > 0
            assert task.env == facts.env
            # Every option reaches every task's env, at its default.
            for key, value in facts.options.items():
                expected = list(value) if isinstance(value, tuple) else value
                assert task.env_kwargs[key] == expected, (name, key)
        # The id the tasks make is registered once rlmesh.benchmarks is imported.
        assert facts.env.partition(":")[2] in gym.registry, facts.env
        assert facts.source and facts.extra and facts.benchmark


def test_the_published_libero_protocol():
    caps = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520}
    caps["libero_90"] = 400
    for name, cap in caps.items():
        facts = benchmarks.info(name)
        assert (facts.max_episode_steps, facts.episodes, facts.extra) == (cap, 50, "libero")
        assert len(facts.tasks) == (90 if name == "libero_90" else 10)


def test_episodes_caps_seed_and_options_apply_to_each_task():
    tasks = benchmarks.suite(
        "libero_goal", episodes=3, max_episode_steps=7, seed=5, image_size=64, cameras=["wrist"]
    )
    assert {(t.episodes, t.max_episode_steps, t.seed) for t in tasks} == {(3, 7, 5)}
    assert {t.env_kwargs["image_size"] for t in tasks} == {64}
    assert {tuple(t.env_kwargs["cameras"]) for t in tasks} == {("wrist",)}
    # Each task keeps its own kwargs: the tasks differ in what they make.
    assert len({json.dumps(t.env_kwargs, sort_keys=True) for t in tasks}) == len(tasks)


def test_a_wrong_name_or_option_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"no built-in suite named 'pushT'; .*pusht.*metaworld"):
        benchmarks.suite("pushT")
    with pytest.raises(ValueError, match=r"suite 'libero_10' has no option 'imagesize'; .*image"):
        benchmarks.suite("libero_10", imagesize=128)


def test_a_missing_package_is_one_line_naming_the_extra():
    with pytest.raises(BenchmarkNotInstalledError) as caught:
        import_benchmark("rlmesh_no_such_simulator.envs", extra="demo", benchmark="Demo")
    message = str(caught.value)
    assert "\n" not in message
    assert "pip install 'rlmesh[demo]'" in message
    info = SuiteInfo(
        name="demo",
        benchmark="Demo",
        extra="demo",
        module="rlmesh_no_such_simulator",
        env="CartPole-v1",
        tasks=("a",),
        episodes=1,
        max_episode_steps=1,
        source="here",
    )
    assert not info.installed()


def test_a_broken_package_keeps_its_own_error(tmp_path, monkeypatch):
    # The package is there but a dependency of it is missing: that says more than "install".
    (tmp_path / "rlmesh_broken_sim.py").write_text("import rlmesh_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as caught:
        import_benchmark("rlmesh_broken_sim", extra="demo", benchmark="Demo")
    assert not isinstance(caught.value, BenchmarkNotInstalledError)
    assert caught.value.name == "rlmesh_missing_dependency"
    sys.modules.pop("rlmesh_broken_sim", None)


def test_rlmesh_benchmarks_lists_every_suite(capsys):
    assert main(["benchmarks"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["suite", "benchmark", "tasks"]
    listed = {line.split()[0]: line for line in lines[1:]}
    assert set(listed) == set(NAMES)
    for name in NAMES:
        facts = benchmarks.info(name)
        cells = listed[name].split()
        assert cells[2:4] == [str(len(facts.tasks)), str(facts.episodes)]
        assert cells[4] == str(facts.max_episode_steps)
        assert cells[6] == ("yes" if facts.installed() else "no:")

    assert main(["benchmarks", "metaworld_mt10", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["tasks"] == list(benchmarks.info("metaworld_mt10").tasks)
    assert row["extra"] == "metaworld"

    assert main(["benchmarks", "libero"]) == 2
    assert "the built-in suites are libero_spatial" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--suite", "libero"], "no such file and no built-in suite of that name; the built-in"),
        (
            [
                "--suite",
                "pusht",
                "--env-kwargs",
                "{}",
                "--episodes",
                "1",
                "--max-episode-steps",
                "2",
            ],
            None,
        ),
        (["--suite", "pusht", "--max-episode-seconds", "3"], "--max-episode-seconds cannot go"),
        (["--suite", "pusht", "--suite-options", '{"size": 1}'], "has no option 'size'"),
        (["--suite-options", '{"image_size": 1}', "--env", "CartPole-v1"], "needs --suite"),
    ],
)
def test_eval_suite_name_errors_are_one_line(argv, message, capsys, tmp_path):
    status = main(["eval", "random", *argv, "--out", str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err
    if message is None:  # --env-kwargs {} is empty: nothing was given, nothing to refuse
        assert status == 0, err
        return
    assert status == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("core", CORES)
def test_eval_a_builtin_suite_records_its_simulator_stack(core, tmp_path, capsys):
    out = tmp_path / "pusht.jsonl"
    argv = ["eval", "random", "--suite", "pusht", "--episodes", "3", "--max-episode-steps", "4"]
    argv += ["--num-envs", "2", "--core", core, "--out", str(out), "--seed", "9"]
    assert main(argv) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "pusht" in printed
    header, episodes = read_results(out)
    assert [episode.index for episode in episodes] == [0, 1, 2]
    assert {episode.steps for episode in episodes} <= {1, 2, 3, 4}
    assert all(episode.success is not None for episode in episodes)
    stack = header["provenance"]["simulator"]
    assert stack["distribution"] == "gym-pusht"
    assert stack["version"] and stack["MUJOCO_GL"] == "egl"
    # rlmesh report shows it beside the other versions.
    assert main(["report", str(out)]) == 0
    [row] = [line for line in capsys.readouterr().out.splitlines() if "simulator" in line]
    assert f"gym-pusht {stack['version']}" in row and "MUJOCO_GL=egl" in row
    # Episode k is seeded by its index from --seed, as for any env.
    assert [episode.seed for episode in episodes] == [rlmesh.episode_seed(9, k) for k in range(3)]
