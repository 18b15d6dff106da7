"""``rlmesh ab --resume`` (``rlmesh.ab(..., resume=True)``), served policies in ``rlmesh ab``,
and the line a comparison reports after each block (``progress=``).

A comparison that was interrupted (here by a hook that raises partway through a block, as a
Ctrl-C or a crash would stop it) and then resumed must give the comparison an uninterrupted
run gives, playing none of the episodes its files already hold.
"""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
import rlmesh
from rlmesh.cli import main
from rlmesh.policies import CartPoleHeuristic, RandomPolicy
from rlmesh.results import read_results

ENV = "CartPole-v1"


def core_name(core):
    return "rust" if core.__name__ == "rlmesh._core" else "python"


class Interrupt(rlmesh.RunHooks):
    """Stops the comparison after ``after`` episodes, in the middle of a block."""

    def __init__(self, after):
        self.left = after

    def on_episode_end(self, result):
        self.left -= 1
        if self.left == 0:
            raise KeyboardInterrupt  # what a Ctrl-C raises


class Starts(rlmesh.RunHooks):
    """Every episode a run starts: what it plays, as against what it reads back."""

    def __init__(self):
        self.started = []

    def on_episode_start(self, *, episode, seed):
        self.started.append(episode)


def comparison(core, out_dir, episodes, **extra):
    return rlmesh.ab(
        CartPoleHeuristic(),
        RandomPolicy(gym.make(ENV).action_space),
        ENV,
        episodes=episodes,
        success=100,
        block=4,
        alpha=0.001,  # a strict level: the comparison runs past the first cap
        out_dir=out_dir,
        core=core_name(core),
        **extra,
    )


def test_a_resumed_comparison_is_the_uninterrupted_one(core, tmp_path):
    whole = comparison(core, tmp_path / "whole", 40)
    assert whole.decision == "A" and whole.episodes > 8  # it ran past the interruption
    with pytest.raises(KeyboardInterrupt):
        comparison(core, tmp_path / "cut", 40, hooks=Interrupt(after=11))
    on_file = sum(len(read_results(tmp_path / "cut" / name)[1]) for name in ("a.jsonl", "b.jsonl"))
    assert on_file == 11  # A's first 4 and B's, A's next 3: mid-block
    with pytest.raises(FileExistsError, match="or resume=True"):
        comparison(core, tmp_path / "cut", 40)
    starts = Starts()
    resumed = comparison(core, tmp_path / "cut", 40, resume=True, hooks=starts)
    for field in ("decision", "episodes", "decided_at", "difference", "p_value", "e_value"):
        assert getattr(resumed, field) == getattr(whole, field), field
    # The 8 pairs on file were read back: the hooks heard only the episodes played now.
    assert len(starts.started) == 2 * whole.episodes - on_file
    for name in ("a.jsonl", "b.jsonl"):
        kept = [(e.index, e.seed, e.reward) for e in read_results(tmp_path / "cut" / name)[1]]
        fresh = [(e.index, e.seed, e.reward) for e in read_results(tmp_path / "whole" / name)[1]]
        assert sorted(kept) == sorted(fresh)


def test_resume_needs_a_directory():
    with pytest.raises(ValueError, match="pass out_dir= too"):
        rlmesh.ab(lambda obs: 0, lambda obs: 1, ENV, episodes=4, resume=True, success=10)


class ServedHeuristic(rlmesh.Model):
    """CartPole's heuristic behind openpi's protocol: the observation arrives under its key."""

    stateless = True

    def predict(self, obs):
        from rlmesh.remote.openpi.client import OBSERVATION_KEY

        state = obs[OBSERVATION_KEY] if isinstance(obs, dict) else obs
        return [int(state[2] + 0.3 * state[3] > 0)]  # openpi answers carry a chunk of actions


def test_rlmesh_ab_compares_a_served_policy_with_a_local_one(tmp_path, capsys):
    from rlmesh.remote.openpi.server import serve_openpi

    with serve_openpi(ServedHeuristic()) as server:
        address = "openpi://" + server.address.removeprefix("ws://")
        command = ["ab", address, "random", "--env", ENV, "--episodes", "40", "--block", "5"]
        code = main([*command, "--success-reward", "100", "--out-dir", str(tmp_path), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["decision"] == "A"
    header = read_results(tmp_path / "a.jsonl")[0]
    assert header["policy"] == address and header["policy_sha256"] is None
    local = rlmesh.run(CartPoleHeuristic(), ENV, episodes=5)
    served = {e.index: e.reward for e in read_results(tmp_path / "a.jsonl")[1]}
    assert [served[e.index] for e in local.episodes] == [e.reward for e in local.episodes]


def test_progress_says_where_the_comparison_stands_after_each_block(core, tmp_path, capsys):
    lines = []
    result = comparison(core, tmp_path, 40, progress=lines.append)
    assert len(lines) == result.episodes // 4  # one line a block of 4 pairs
    pairs = [int(line.split(" ")[2].split("/")[0]) for line in lines]
    assert pairs == list(range(4, result.episodes + 1, 4))
    assert lines[-1] == (
        f"rlmesh ab: {result.episodes}/40 pairs, success a-b {result.difference:+.1%} "
        f"[{result.lower:+.1%}, {result.upper:+.1%}], p {result.p_value:.3g}"
    )
    command = ["ab", "cartpole-heuristic", "random", "--env", ENV, "--episodes", "20"]
    command += ["--success-reward", "100", "--block", "5"]
    assert main([*command, "--out-dir", str(tmp_path / "cli")]) == 0
    assert capsys.readouterr().err.startswith("rlmesh ab: 5/20 pairs, success a-b ")
    assert main([*command, "--out-dir", str(tmp_path / "quiet"), "--no-progress"]) == 0
    assert capsys.readouterr().err == ""
