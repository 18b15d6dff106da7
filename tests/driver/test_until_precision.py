"""Runs that stop on precision (``until=rlmesh.Precision(...)``, ``--until-precision``).

The env here decides each episode by its seed: a success takes ``SHORT`` steps, a failure
``LONG``. So with several lanes the successes finish first, and a rule that read the episodes
in the order they finished would see mostly successes: it would stop early, on a biased
estimate. A stopped run must instead read the prefix of indices, and hold exactly the first n
episodes of the same run left to its cap.
"""

from __future__ import annotations

import json
import re

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from gymnasium import spaces
from helpers import comparable
from rlmesh.cli import main
from rlmesh.errors import RlmeshError
from rlmesh.results import ResultsFileError, read_results, read_run
from rlmesh.stats.sequential import confidence_sequence
from rlmesh.stats.stopping import CAP_REACHED, PRECISION_REACHED, Precision

SHORT, LONG = 2, 30
CAP = 240
PRECISION = 0.2
ENV_ID = "rlmesh-tests/SuccessIsShort-v0"


class SuccessIsShortEnv(gym.Env):
    """Each episode succeeds with probability 1/2, drawn from its seed; a success ends after
    ``SHORT`` steps, a failure after ``LONG``. Reward 1 a step; the final info says
    ``is_success``."""

    observation_space = spaces.Box(0.0, float(LONG), (1,), np.float32)
    action_space = spaces.Discrete(2)
    reward_range = (0.0, 1.0)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.success = bool(self.np_random.random() < 0.5)
        self.length, self.t = (SHORT if self.success else LONG), 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        done = self.t >= self.length
        info = {"is_success": self.success} if done else {}
        return np.array([self.t], np.float32), 1.0, done, False, info


gym.register(ENV_ID, entry_point=SuccessIsShortEnv)


def policy(observation):
    return 0


def core_name(core):
    return "rust" if core.__name__ == "rlmesh._core" else "python"


class Heard(rlmesh.RunHooks):
    """The episodes the hooks heard end, in that order."""

    def __init__(self):
        self.ended = []

    def on_episode_end(self, result):
        self.ended.append(result.index)


@pytest.fixture(scope="module")
def unstopped():
    """The run left to its cap, on 16 lanes (its hooks hear episodes as they finish)."""
    heard = Heard()
    result = rlmesh.run(policy, SuccessIsShortEnv, episodes=CAP, num_envs=16, hooks=heard)
    return result, heard.ended


def first_precise(successes, half_width):
    """The first n where the CS of ``successes[:n]`` is within +/-``half_width``, and it."""
    lower, upper = confidence_sequence(np.asarray(successes, dtype=float))
    n = int(np.flatnonzero((upper - lower) / 2 <= half_width)[0]) + 1
    return n, (lower[n - 1], upper[n - 1])


@pytest.mark.parametrize(
    ("num_envs", "workers", "pipeline"),
    [(1, None, False), (8, None, False), (4, 2, False), (4, 2, True)],
    ids=["1 lane", "8 lanes", "workers=2", "workers=2 pipelined"],
)
def test_a_stopped_run_holds_the_first_n_episodes_of_the_unstopped_run(
    unstopped, core, num_envs, workers, pipeline
):
    reference, _ = unstopped
    n, interval = first_precise([e.success for e in reference.episodes], PRECISION)
    assert n < CAP // 2  # the rule stops well before the cap
    result = rlmesh.run(
        policy,
        SuccessIsShortEnv,
        episodes=CAP,
        num_envs=num_envs,
        workers=workers,
        pipeline=pipeline,
        core=core_name(core),
        until=Precision(success=PRECISION),
    )
    assert [e.index for e in result.episodes] == list(range(n))
    assert comparable(result) == comparable(reference)[:n]
    stop = result.stop
    assert (stop.reason, stop.episodes, stop.cap) == (PRECISION_REACHED, n, CAP)
    assert (stop.lower, stop.upper) == interval
    # What was running or finished past n is named, and is past n.
    assert all(n <= index < n + num_envs * LONG for index in stop.cancelled + stop.discarded)
    assert len(stop.cancelled) < num_envs
    assert result.summary()["complete"] is True


def test_the_stop_reads_the_prefix_not_the_episodes_that_finished_first(unstopped, core):
    reference, finish_order = unstopped
    success = {e.index: e.success for e in reference.episodes}
    n, _ = first_precise([success[k] for k in range(CAP)], PRECISION)
    # Read in the order they finished, the successes come first: that rule would stop
    # elsewhere, on a higher rate.
    biased_n, _ = first_precise([success[k] for k in finish_order], PRECISION)
    first_finished = [success[k] for k in finish_order[:biased_n]]
    assert finish_order != sorted(finish_order)
    assert biased_n != n
    assert np.mean(first_finished) > np.mean([success[k] for k in range(n)]) + 0.1
    heard = Heard()
    result = rlmesh.run(
        policy,
        SuccessIsShortEnv,
        episodes=CAP,
        num_envs=16,
        hooks=heard,
        core=core_name(core),
        until=Precision(success=PRECISION),
    )
    assert result.stop.episodes == n
    assert heard.ended == list(range(n))  # the hooks hear the prefix, in index order


def test_the_results_file_holds_the_prefix_and_a_resumption_keeps_the_stop(
    tmp_path, unstopped, core
):
    reference, _ = unstopped
    path = tmp_path / "stopped.jsonl"
    arguments = dict(episodes=CAP, num_envs=8, core=core_name(core), results_path=path)
    until = Precision(success=PRECISION)
    result = rlmesh.run(policy, SuccessIsShortEnv, until=until, **arguments)
    n = result.stop.episodes
    header, episodes = read_results(path)
    assert [e.index for e in episodes] == list(range(n))  # nothing past n on disk
    assert header["until"] == until.to_json()
    assert comparable(read_run(path)[1]) == comparable(reference)[:n]
    assert read_run(path)[1].stop == result.stop  # the file says how the run stopped

    class Starts(rlmesh.RunHooks):
        started = 0

        def on_episode_start(self, *, episode, seed):
            Starts.started += 1

    again = rlmesh.run(
        policy, SuccessIsShortEnv, until=until, resume=True, hooks=Starts(), **arguments
    )
    assert Starts.started == 0  # the file's run stopped: nothing more to play
    assert comparable(again) == comparable(result)
    assert (again.stop.reason, again.stop.episodes) == (PRECISION_REACHED, n)
    with pytest.raises(ResultsFileError, match="until: the file has"):
        rlmesh.run(
            policy, SuccessIsShortEnv, until=Precision(success=0.1), resume=True, **arguments
        )


def test_an_interrupted_stopping_run_resumes_to_the_same_stop(tmp_path, unstopped, core):
    reference, _ = unstopped
    path = tmp_path / "interrupted.jsonl"
    arguments = dict(
        episodes=CAP,
        num_envs=8,
        core=core_name(core),
        results_path=path,
        until=Precision(success=PRECISION),
    )

    class Interrupt(rlmesh.RunHooks):
        def on_episode_end(self, result):
            if result.index == 9:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rlmesh.run(policy, SuccessIsShortEnv, hooks=Interrupt(), **arguments)
    assert [e.index for e in read_results(path)[1]] == list(range(10))
    result = rlmesh.run(policy, SuccessIsShortEnv, resume=True, **arguments)
    n, _ = first_precise([e.success for e in reference.episodes], PRECISION)
    assert comparable(result) == comparable(reference)[:n]


def test_a_reward_precision_takes_its_bounds_from_the_env_or_as_declared(unstopped, core):
    reference, _ = unstopped
    # The env's reward_range (0, 1) a step, over at most 40 steps: returns in [0, 40].
    cap = LONG + 10
    derived = rlmesh.run(
        policy,
        SuccessIsShortEnv(),
        episodes=CAP,
        max_episode_steps=cap,
        core=core_name(core),
        until=Precision(reward=4.0),
    )
    assert derived.stop.rule["reward_bounds"] == [0.0, float(cap)]
    returns = np.array([e.reward for e in reference.episodes]) / cap
    n, (lower, upper) = first_precise(returns, 4.0 / cap)
    assert derived.stop.episodes == n
    assert (derived.stop.lower, derived.stop.upper) == (lower * cap, upper * cap)
    assert comparable(derived, drop=("env_index",)) == comparable(reference)[:n]
    declared = rlmesh.run(
        policy,
        SuccessIsShortEnv,
        episodes=40,
        num_envs=4,
        core=core_name(core),
        until=Precision(reward=1.0, reward_bounds=(0, 100)),
    )
    assert (declared.stop.reason, declared.num_episodes) == (CAP_REACHED, 40)


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"until": 0.05}, ValueError, r"until must be rlmesh.Precision\(success=...\)"),
        (
            {"until": Precision(success=0.1), "indices": [0, 1]},
            ValueError,
            "indices= plays chosen ones",
        ),
        (
            {"until": Precision(success=0.1), "cluster": "ray"},
            ValueError,
            "drop cluster= .* or until=",
        ),
        (
            {"until": Precision(reward=1.0)},
            ValueError,
            r"needs bounds on an episode's return.*reward_bounds=\(lo, hi\)",
        ),
    ],
)
def test_bad_stopping_arguments_are_refused_naming_the_fix(arguments, error, message):
    with pytest.raises(error, match=message):
        rlmesh.run(policy, "CartPole-v1", episodes=4, **arguments)


def test_a_success_precision_on_an_env_without_success_names_the_fix(core):
    with pytest.raises(RlmeshError, match=r"no success verdict.*pass success=R") as caught:
        rlmesh.run(
            lambda obs: np.zeros(1, np.float32),
            "Pendulum-v1",
            episodes=4,
            max_episode_steps=5,
            core=core_name(core),
            until=Precision(success=0.1),
        )
    assert caught.value.partial_result.num_episodes == 0


# ---------------------------------------------------------------------------- the command


def test_the_command_stops_on_precision_writes_the_prefix_and_says_why(tmp_path, capsys, unstopped):
    reference, _ = unstopped
    out = tmp_path / "cli.jsonl"
    (tmp_path / "zero.py").write_text("def policy(observation):\n    return 0\n")
    argv = [
        "eval",
        f"{tmp_path / 'zero.py'}:policy",  # the reference run's policy
        "--env",
        f"test_until_precision:{ENV_ID}",
        "--episodes",
        str(CAP),
        "--num-envs",
        "4",
        "--until-precision",
        str(PRECISION),
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main(argv) == 0
    table = capsys.readouterr().out
    n, (lower, upper) = first_precise([e.success for e in reference.episodes], PRECISION)
    assert f"{n} of at most {CAP}, stopped: precision reached" in table
    interval = re.escape(f"[{lower:.1%}, {upper:.1%}]")
    assert re.search(rf"success rate 95% confidence sequence +{interval}  anytime-valid", table)
    assert [e.index for e in read_results(out)[1]] == list(range(n))
    assert comparable(read_run(out)[1]) == comparable(reference)[:n]
    # `rlmesh report` says the same from the file alone.
    assert main(["report", str(out)]) == 0
    reported = capsys.readouterr().out
    assert f"{n} of at most {CAP}, stopped: precision reached" in reported
    assert re.search(rf"success rate 95% confidence sequence +{interval}  anytime-valid", reported)
    # --json: the stop, with the confidence sequence, as data.
    again = tmp_path / "again.jsonl"
    assert main([*argv[:-3], "--out", str(again), "--json", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"] == n and summary["complete"] is True
    stop = summary["stop"]
    assert (stop["reason"], stop["episodes"], stop["cap"]) == ("precision reached", n, CAP)
    assert (stop["lower"], stop["upper"]) == (lower, upper)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--until-precision", "0"], r"--until-precision: .*must be in \(0, 0.5\)"),
        (["--until-precision", "1"], r"--until-precision: .*must be in \(0, 0.5\)"),
        (["--until-reward-precision", "5"], r"needs bounds .*--reward-bounds LO HI"),
        (["--reward-bounds", "0", "500"], "--reward-bounds bounds the return for"),
        (
            ["--until-reward-precision", "300", "--reward-bounds", "0", "500"],
            "at least half the return's range",
        ),
        (
            ["--until-precision", "0.05", "--until-reward-precision", "5"],
            "pass one of them",
        ),
    ],
)
def test_the_command_refuses_a_bad_precision_naming_the_fix(capsys, options, message):
    assert main(["eval", "random", "--env", "CartPole-v1", "--no-progress", *options]) == 2
    assert re.search(message, capsys.readouterr().err)
