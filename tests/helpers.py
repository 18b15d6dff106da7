"""What several test modules share: a CartPole policy, comparing runs, forcing the awaited path."""

from __future__ import annotations

import os
from pathlib import Path

import gymnasium as gym
import rlmesh

CORES = ["rust", "python"]
TIMING_FIELDS = {"duration_s", "predict_ms", "step_ms"}
AUTORESET_MODES = [
    gym.vector.AutoresetMode.DISABLED,
    gym.vector.AutoresetMode.NEXT_STEP,
    gym.vector.AutoresetMode.SAME_STEP,
]


def cartpole_policy(obs):
    """A balance heuristic: push toward the side the pole falls to."""
    return int(obs[2] + 0.3 * obs[3] > 0)


def comparable(result, *, drop=("env_index",), reward_digits=None):
    """Each episode's fields but timings (and, across lane counts, the lane it ran on); with
    ``reward_digits``, the reward rounded to that many decimals, for a simulator whose one
    seed gives rewards that differ in the last bits from run to run (PushT's pymunk), and
    without the trajectory digest, which those bits change (the reset digest stays)."""
    dropped = TIMING_FIELDS | set(drop)
    if reward_digits is not None:
        dropped.add("trajectory_digest")
    episodes = [
        {key: value for key, value in episode.to_dict().items() if key not in dropped}
        for episode in result.episodes
    ]
    if reward_digits is not None:
        for episode in episodes:
            episode["reward"] = round(episode["reward"], reward_digits)
    return episodes


class AwaitEveryStep(rlmesh.RunHooks):
    """Listens to every step, so the driver awaits each round instead of the core running
    them."""

    def on_step(self, event):
        pass


def live_processes(marker: bytes) -> set[int]:
    """The live processes (not zombies, not this one) whose command line holds ``marker``:
    what a test checks is gone after it (a sandbox's server, a Ray actor)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if marker in command and state != "Z":
            found.add(int(entry.name))
    return found
