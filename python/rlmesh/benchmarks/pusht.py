"""PushT (the ``gym-pusht`` package) as a built-in benchmark: push a T-shaped block onto its
goal pose with a round pusher, in 2-D (pymunk physics, pygame drawing; no GL).

``PushTEnv`` wraps the package's env unchanged: the same observations, rewards, termination
and infos, seed for seed. It builds the package's env at its first reset, in the process that
steps it, and reuses it for every later episode; importing this module imports neither
gym-pusht nor pygame.

The protocol (Diffusion Policy's, which gym-pusht and LeRobot keep):

- observation ``obs_type="pixels_agent_pos"``: ``{"pixels": 96x96x3 uint8, "agent_pos": the
  pusher's (x, y), float64 in [0, 512]}``; also ``"pixels"``, ``"state"`` (agent x, y, block
  x, y, angle) and ``"environment_state_agent_pos"`` (the T's 8 keypoints, flattened, and
  ``agent_pos``), the package's other observation types;
- action: the pusher's target (x, y) in [0, 512], float32, tracked by a PD controller;
- 300 steps an episode at 10 Hz, 50 episodes (Diffusion Policy's 50 test initial states);
- reward: the block's goal coverage / 0.95, clipped to [0, 1] (Diffusion Policy reports its
  maximum over the episode); success: coverage above 95%, which the package reports as the
  final info's ``is_success`` and which ends the episode (``terminated``), as in Diffusion
  Policy's env;
- initial states: the pusher's and the block's, drawn from the reset's seed by the env's own
  generator (gym-pusht 0.1.6 on). Diffusion Policy's test states (a legacy
  ``RandomState(100000 + i)``, which gym-pusht 0.1.5 still drew) are other states, so scores
  compare with its numbers in distribution, not episode for episode;
- reproducibility: an episode is its seed's, but once the pusher touches the block, pymunk's
  contact solving can make the rewards of one seed differ in their last bits (about 1e-15)
  from run to run, in the package's own env as in this one; successes and step counts agree.

Roles (adapters-v1 tags in ``metadata[ENV_TAGS_METADATA_KEY]``): the image is
``image/primary``; the pusher is a two-axis Cartesian robot, so its position is
``proprio/joint_pos`` (2-D) and its target ``action/joint_pos`` with range (0, 512): a model
spec that declares another range (LeRobot's policies emit (-1, 1)) is mapped onto it. The
block's pose (``state``) and keypoints (``environment_state``) have no standard role:
``x/pusht_block_pose`` and ``x/pusht_keypoints``.

Source: gym-pusht 0.1.8, gym_pusht/envs/pusht.py (spaces, reward, ``is_success``,
termination at coverage > 0.95) and its README.
Source: LeRobot, src/lerobot/envs/configs.py, ``PushtEnv`` (obs_type "pixels_agent_pos",
episode_length 300, fps 10, visualization 384x384).
Source: Diffusion Policy (Chi et al., RSS 2023), diffusion_policy/config/task/pusht_image.yaml
(96x96 image and 2-D agent_pos, n_test 50, max_steps 300) and
diffusion_policy/env/pusht/pusht_env.py (done when coverage > 0.95).

Example:
    >>> info = SUITES["pusht"]
    >>> info.tasks, info.episodes, info.max_episode_steps
    (('pusht',), 50, 300)
    >>> env = PushTEnv()  # nothing is built (nor imported) until the first reset
    >>> env.observation_space["pixels"].shape, env.action_space.shape
    ((96, 96, 3), (2,))
    >>> env.metadata[ENV_TAGS_METADATA_KEY]["observation"]["agent_pos"]["role"]
    'proprio/joint_pos'
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from ..adapters import (
    ACTION_JOINT_POS,
    ENV_TAGS_METADATA_KEY,
    IMAGE_PRIMARY,
    JOINT_POS,
    Action,
    Actuator,
    EnvTags,
    Field,
    ImageTag,
    Split,
    StateTag,
)
from .base import SuiteInfo, distribution_version, import_benchmark, simulator_stack

ENV_ID = "rlmesh/PushT-v0"
OBS_TYPES = ("pixels_agent_pos", "pixels", "state", "environment_state_agent_pos")
BLOCK_POSE = "x/pusht_block_pose"
"""The role of the block's (x, y, angle) in the ``state`` observation (no standard role)."""
KEYPOINTS = "x/pusht_keypoints"
"""The role of the T's 8 keypoints, (x, y) each, in ``environment_state``."""
WORKSPACE = 512.0  # positions and targets are in [0, 512] on both axes

SUITES: dict[str, SuiteInfo] = {
    "pusht": SuiteInfo(
        name="pusht",
        benchmark="PushT",
        extra="pusht",
        module="gym_pusht",
        env=f"rlmesh.benchmarks:{ENV_ID}",
        tasks=("pusht",),
        episodes=50,
        max_episode_steps=300,
        source=(
            "Diffusion Policy (Chi et al. 2023), config/task/pusht_image.yaml: n_test 50, "
            "max_steps 300; LeRobot envs/configs.py PushtEnv: pixels_agent_pos, "
            "episode_length 300; gym-pusht 0.1.8: success = coverage > 0.95"
        ),
        task_kwargs=({},),
        options={"obs_type": "pixels_agent_pos"},
    )
}


def observation_space(obs_type: str, width: int = 96, height: int = 96) -> spaces.Space:
    """The package's observation space for ``obs_type``, without importing the package.

    Example:
        >>> observation_space("state").shape
        (5,)
    """
    position = spaces.Box(np.zeros(2), np.full(2, WORKSPACE), dtype=np.float64)
    pixels = spaces.Box(0, 255, (height, width, 3), dtype=np.uint8)
    if obs_type == "pixels_agent_pos":
        return spaces.Dict({"pixels": pixels, "agent_pos": position})
    if obs_type == "pixels":
        return pixels
    if obs_type == "state":
        high = np.array([WORKSPACE, WORKSPACE, WORKSPACE, WORKSPACE, 2 * np.pi])
        return spaces.Box(np.zeros(5), high, dtype=np.float64)
    if obs_type == "environment_state_agent_pos":
        keypoints = spaces.Box(np.zeros(16), np.full(16, WORKSPACE), dtype=np.float64)
        return spaces.Dict({"environment_state": keypoints, "agent_pos": position})
    raise ValueError(f"PushT: obs_type is {obs_type!r}; expected one of {', '.join(OBS_TYPES)}")


def env_tags(obs_type: str) -> EnvTags:
    """The adapters-v1 tags of ``PushTEnv(obs_type=...)``: what each leaf and action dim is.

    Example:
        >>> env_tags("state").observation.dim
        5
    """
    if obs_type not in OBS_TYPES:
        raise ValueError(f"PushT: obs_type is {obs_type!r}; expected one of {', '.join(OBS_TYPES)}")
    image, agent = ImageTag(IMAGE_PRIMARY), StateTag(JOINT_POS)
    observation: Any = {
        "pixels_agent_pos": {"pixels": image, "agent_pos": agent},
        "pixels": image,
        "state": Split(Field(JOINT_POS, 2), Field(BLOCK_POSE, 3)),
        "environment_state_agent_pos": {
            "environment_state": StateTag(KEYPOINTS),
            "agent_pos": agent,
        },
    }[obs_type]
    action = Action(Actuator(ACTION_JOINT_POS, dim=2, range=(0.0, WORKSPACE)))
    return EnvTags(observation=observation, action=action)


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"PushT: {name} is {value!r}; expected a positive number of pixels")
    return int(value)


class PushTEnv(gym.Env):
    """gym-pusht's PushT env, built at the first reset and reused (see the module docstring).

    Args:
        obs_type: one of ``OBS_TYPES`` (default ``"pixels_agent_pos"``, the protocol's).
        render_mode: ``"rgb_array"`` (the default; ``render()`` returns a frame) or None.
        observation_width, observation_height: the observed image (default 96x96).
        visualization_width, visualization_height: ``render()``'s frame (default 384x384,
            LeRobot's videos).

    Raises:
        ValueError: an unknown ``obs_type`` or ``render_mode``, or a size that is not a
            positive integer.
    """

    # The class's, which gymnasium.make reads; each env adds its tags to its own copy.
    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(
        self,
        obs_type: str = "pixels_agent_pos",
        render_mode: str | None = "rgb_array",
        observation_width: int = 96,
        observation_height: int = 96,
        visualization_width: int = 384,
        visualization_height: int = 384,
    ) -> None:
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"PushT: render_mode is {render_mode!r}; expected 'rgb_array' or None")
        self.observation_space = observation_space(
            obs_type,
            _positive("observation_width", observation_width),
            _positive("observation_height", observation_height),
        )
        self.action_space = spaces.Box(0, WORKSPACE, (2,), dtype=np.float32)
        self.obs_type = obs_type
        self.render_mode = render_mode
        self._kwargs = {
            "obs_type": obs_type,
            "render_mode": "rgb_array",  # the package draws pixel observations in this mode
            "observation_width": int(observation_width),
            "observation_height": int(observation_height),
            "visualization_width": _positive("visualization_width", visualization_width),
            "visualization_height": _positive("visualization_height", visualization_height),
        }
        self.metadata = {
            **type(self).metadata,
            ENV_TAGS_METADATA_KEY: env_tags(obs_type).to_dict(),
        }
        self._env: Any = None
        self._reset_done = False

    def _built(self) -> Any:
        if self._env is None:
            # pygame greets on stdout when imported, which would mix into a command's output.
            os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
            module = import_benchmark("gym_pusht.envs", extra="pusht", benchmark="PushT")
            self._env = module.PushTEnv(**self._kwargs)
        return self._env

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """The package's reset: the pusher and the block placed from the seed alone (the
        package rebuilds its physics space on every reset)."""
        super().reset(seed=seed)
        observation, info = self._built().reset(seed=seed, options=options)
        self._reset_done = True
        return observation, info

    def step(self, action: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """The package's step: reward, ``terminated`` on success, ``info["is_success"]``."""
        return self._env_after_reset("step").step(action)

    def render(self) -> np.ndarray | None:
        """The scene as an RGB frame (``visualization_height`` x ``visualization_width``),
        the last action's target marked; None when ``render_mode`` is None."""
        if self.render_mode is None:
            return None
        return self._env_after_reset("render").render()

    def _env_after_reset(self, what: str) -> Any:
        if not self._reset_done:
            raise gym.error.ResetNeeded(f"PushT: {what}() before the first reset(); reset first")
        return self._env

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
        self._env, self._reset_done = None, False

    @staticmethod
    def simulator_stack() -> dict[str, Any]:
        """The simulator stack PushT scores depend on: gym-pusht's version, and pymunk's
        (its physics) and pygame's (its drawing of the pixels).

        Example:
            >>> sorted(PushTEnv.simulator_stack())[:3]
            ['MUJOCO_GL', 'distribution', 'mujoco']
        """
        return simulator_stack(
            ("gym-pusht",),
            extra=lambda: {
                "pymunk": distribution_version("pymunk"),
                "pygame": distribution_version("pygame"),
            },
        )


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point="rlmesh.benchmarks.pusht:PushTEnv")
