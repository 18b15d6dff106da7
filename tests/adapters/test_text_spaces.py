"""Text leaves read any space whose values are strings, such as MiniGrid's MissionSpace."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from gymnasium import spaces
from helpers import CORES
from rlmesh.adapters import is_text_space
from rlmesh.errors import SpecError

MISSIONS = ("go left", "go right", "stay")
STEPS = 3


class MissionSpace(gym.Space):
    """Like ``minigrid.core.mission.MissionSpace``: a plain ``gym.Space`` of mission strings."""

    def __init__(self, missions, seed=None):
        super().__init__(dtype=str, seed=seed)
        self.missions = tuple(missions)

    def sample(self, mask=None):
        return self.missions[int(self.np_random.integers(len(self.missions)))]

    def contains(self, x):
        return x in self.missions


class NumberSpace(gym.Space):
    """A foreign space whose values are not strings."""

    def sample(self, mask=None):
        return 7

    def contains(self, x):
        return x == 7


class MissionEnv(gym.Env):
    """Each episode draws a mission; the action that names it earns 1 per step, for 3 steps."""

    observation_space = spaces.Dict(
        {"image": spaces.Box(0, 255, (2, 2, 3), np.uint8), "mission": MissionSpace(MISSIONS)}
    )
    action_space = spaces.Discrete(len(MISSIONS))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.mission = MISSIONS[int(self.np_random.integers(len(MISSIONS)))]
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        reward = float(MISSIONS[int(action)] == self.mission)
        return self._obs(), reward, self.t >= STEPS, False, {}

    def _obs(self):
        return {"image": np.full((2, 2, 3), self.t, np.uint8), "mission": self.mission}


class ReadsTheMission(rlmesh.Model):
    spec = rlmesh.ModelSpec(input={"mission": rlmesh.Text("mission")})

    def predict(self, obs):
        assert isinstance(obs["mission"], str)
        return MISSIONS.index(obs["mission"])


class ReadsTheMissionsInABatch(rlmesh.Model):
    spec = rlmesh.ModelSpec(input=rlmesh.Text("mission"))

    def predict_batch(self, missions):
        assert all(isinstance(mission, str) for mission in missions)
        return np.array([MISSIONS.index(mission) for mission in missions])


def _no_spec_model(obs):  # the raw observation: the mission comes as a str, the image as is
    assert obs["image"].shape == (2, 2, 3)
    return MISSIONS.index(obs["mission"])


def test_which_spaces_hold_text():
    assert is_text_space(spaces.Text(8))
    assert is_text_space(MissionSpace(MISSIONS))
    assert not is_text_space(NumberSpace())
    assert not is_text_space(spaces.Discrete(3))
    assert not is_text_space(spaces.Tuple((spaces.Text(4),)))


def test_telling_text_apart_leaves_the_space_random_state_alone():
    space, twin = MissionSpace(MISSIONS, seed=3), MissionSpace(MISSIONS, seed=3)
    assert is_text_space(space)
    assert [space.sample() for _ in range(8)] == [twin.sample() for _ in range(8)]


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("model", [ReadsTheMission(), ReadsTheMissionsInABatch(), _no_spec_model])
def test_a_mission_space_is_read_as_text(core, model):
    result = rlmesh.run(model, MissionEnv, episodes=6, num_envs=2, seed=1, core=core)
    # Every step earns 1 only when the model was given the mission string itself.
    assert [episode.reward for episode in result.episodes] == [float(STEPS)] * 6


def test_text_refuses_a_space_whose_values_are_not_strings():
    observation_space = spaces.Dict({"mission": NumberSpace()})
    spec = rlmesh.ModelSpec(input=rlmesh.Text("mission"))
    with pytest.raises(
        SpecError, match=r'Text\(key="mission"\): obs\["mission"\] holds .*not a Text'
    ):
        spec.compile(observation_space, spaces.Discrete(3))
