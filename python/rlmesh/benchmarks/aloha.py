"""ALOHA (the ``gym-aloha`` package) as a built-in benchmark: two simulated ViperX arms
(MuJoCo through dm_control) insert a peg into a socket, or hand a cube from one arm to the
other.

``AlohaEnv`` wraps the package's env: the same observations, rewards, termination and infos,
seed for seed. It builds the package's env at its first reset, in the process that steps it
(a GL context must not cross a fork), and reuses it for every later episode; importing this
module imports neither gym-aloha, dm_control nor mujoco. Two things differ from the package,
on purpose:

- each step renders only the camera the observation holds: the package renders three
  640x480 cameras and keeps one, so a step on a CPU renderer costs a third (the observation
  is bit-identical, which the tests check against the package's env); and
  ``observation_width`` / ``observation_height`` size the image it holds (the package's own
  observations are always 640x480 whatever its space says);
- the action space has the arms' real bounds (each joint's control range from the package's
  MJCF, each gripper in [0, 1]) rather than the package's (-1, 1), which the joint targets
  leave (the start pose's elbow is at 1.16): a spec that clips or rescales onto the space
  then keeps the actions the simulator takes (MuJoCo clamps each control to the same range).

The protocol (ACT's, which gym-aloha and LeRobot keep):

- observation ``obs_type="pixels_agent_pos"``: ``{"pixels": {"top": 480x640x3 uint8},
  "agent_pos": 14 float64}``, the state being, per arm (left, then right), its 6 joint
  angles and its gripper opening normalized to [0, 1]; also ``"pixels"`` (``{"top": ...}``);
- action: 14 absolute targets in the same layout, at 50 Hz;
- 400 steps an episode, 50 episodes per task;
- reward: the task's stage, 0 to 4 each step; success: reaching 4, the maximum, which the
  package reports as ``info["is_success"]`` and which ends the episode (``terminated``).
  ACT runs all 400 steps and counts an episode a success when its highest reward is the
  maximum: the same verdict, since the first step at 4 decides it.

Roles (adapters-v1 tags in ``metadata[ENV_TAGS_METADATA_KEY]``): the top camera is
``image/primary``; ``agent_pos`` is split into ``proprio/joint_pos`` (6), ``proprio/gripper``
(1), ``proprio/joint_pos_2`` (6) and ``proprio/gripper_2`` (1), the second arm's roles being
the first's with ``_2``; the action into ``action/joint_pos``, ``action/gripper`` (range
(0, 1)), ``action/joint_pos_2`` and ``action/gripper_2`` (range (0, 1)). A model that reads
LeRobot's 14-D state reads ``Concat(JOINT_POS, GRIPPER_POS, JOINT_POS_2, GRIPPER_POS_2)``.

Source: gym-aloha 0.1.5, gym_aloha/env.py (spaces, ``is_success`` and termination at reward
4), gym_aloha/tasks/sim.py (rewards, observation), gym_aloha/constants.py, its README.
Source: LeRobot, src/lerobot/envs/configs.py, ``AlohaEnv`` (obs_type "pixels_agent_pos",
episode_length 400, fps 50, top camera 480x640).
Source: ACT (Zhao et al., RSS 2023), constants.py (sim_insertion_scripted and
sim_transfer_cube_scripted: episode_len 400, camera "top") and imitate_episodes.py
(num_rollouts 50; success iff the highest reward equals the task's max_reward).

Example:
    >>> info = SUITES["aloha"]
    >>> info.tasks, info.episodes, info.max_episode_steps
    (('insertion', 'transfer_cube'), 50, 400)
    >>> env = AlohaEnv(task="transfer_cube")  # nothing is built until the first reset
    >>> env.observation_space["pixels"]["top"].shape, env.action_space.shape
    ((480, 640, 3), (14,))
"""

from __future__ import annotations

import os
import sys
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from ..adapters import (
    ACTION_GRIPPER,
    ACTION_GRIPPER_2,
    ACTION_JOINT_POS,
    ENV_TAGS_METADATA_KEY,
    GRIPPER_POS,
    GRIPPER_POS_2,
    IMAGE_PRIMARY,
    JOINT_POS,
    Action,
    Actuator,
    EnvTags,
    Field,
    ImageTag,
    Split,
)
from .base import SuiteInfo, distribution_version, import_benchmark, simulator_stack

ENV_ID = "rlmesh/ALOHA-v0"
TASKS = ("insertion", "transfer_cube")
OBS_TYPES = ("pixels_agent_pos", "pixels")
CAMERA = "top"
JOINT_POS_2 = "proprio/joint_pos_2"
"""The second (right) arm's joint angles: ``JOINT_POS`` with the second arm's ``_2``."""
ACTION_JOINT_POS_2 = "action/joint_pos_2"
"""The second (right) arm's joint targets."""
MAX_WIDTH, MAX_HEIGHT = 640, 480  # MuJoCo's default offscreen buffer, which the MJCF keeps

# Each arm's joint control ranges (waist, shoulder, elbow, forearm roll, wrist angle, wrist
# rotate), from the ctrlrange of the package's position actuators (bimanual_viperx_*.xml,
# the same for both tasks and both arms), then the gripper's normalized opening.
_ARM_LOW = (-3.14158, -1.85005, -1.76278, -3.14158, -1.8675, -3.14158, 0.0)
_ARM_HIGH = (3.14158, 1.25664, 1.6057, 3.14158, 2.23402, 3.14158, 1.0)

SUITES: dict[str, SuiteInfo] = {
    "aloha": SuiteInfo(
        name="aloha",
        benchmark="ALOHA",
        extra="aloha",
        module="gym_aloha",
        env=f"rlmesh.benchmarks:{ENV_ID}",
        tasks=TASKS,
        episodes=50,
        max_episode_steps=400,
        source=(
            "ACT (Zhao et al. 2023), constants.py: episode_len 400, imitate_episodes.py: "
            "num_rollouts 50, success = highest reward == max_reward; LeRobot "
            "envs/configs.py AlohaEnv: pixels_agent_pos, episode_length 400; gym-aloha 0.1.5"
        ),
        task_kwargs=tuple({"task": task} for task in TASKS),
        options={
            "obs_type": "pixels_agent_pos",
            "observation_width": 640,
            "observation_height": 480,
        },
    )
}


def observation_space(obs_type: str, width: int = 640, height: int = 480) -> spaces.Dict:
    """The package's observation space for ``obs_type``, without importing the package.

    Example:
        >>> sorted(observation_space("pixels_agent_pos").spaces)
        ['agent_pos', 'pixels']
    """
    top = spaces.Dict({CAMERA: spaces.Box(0, 255, (height, width, 3), dtype=np.uint8)})
    if obs_type == "pixels":
        return top
    if obs_type == "pixels_agent_pos":
        state = spaces.Box(-1000.0, 1000.0, (14,), dtype=np.float64)
        return spaces.Dict({"pixels": top, "agent_pos": state})
    raise ValueError(
        f"ALOHA: obs_type is {obs_type!r}; expected one of {', '.join(OBS_TYPES)} (gym-aloha "
        "has no state-only observation)"
    )


def action_space() -> spaces.Box:
    """The 14 joint and gripper targets, within the ranges the simulator clamps them to.

    Example:
        >>> action_space().low[:3]
        array([-3.14158, -1.85005, -1.76278], dtype=float32)
    """
    low = np.array(_ARM_LOW + _ARM_LOW, dtype=np.float32)
    high = np.array(_ARM_HIGH + _ARM_HIGH, dtype=np.float32)
    return spaces.Box(low, high, dtype=np.float32)


def env_tags(obs_type: str) -> EnvTags:
    """The adapters-v1 tags of ``AlohaEnv(obs_type=...)``.

    Example:
        >>> [field.role for field in env_tags("pixels_agent_pos").observation["agent_pos"].fields]
        ['proprio/joint_pos', 'proprio/gripper', 'proprio/joint_pos_2', 'proprio/gripper_2']
    """
    observation_space(obs_type)  # an unknown type raises, naming those there are
    top = {CAMERA: ImageTag(IMAGE_PRIMARY)}
    observation: Any = top
    if obs_type == "pixels_agent_pos":
        state = Split(
            Field(JOINT_POS, 6),
            Field(GRIPPER_POS, 1),
            Field(JOINT_POS_2, 6),
            Field(GRIPPER_POS_2, 1),
        )
        observation = {"pixels": top, "agent_pos": state}
    action = Action(
        Actuator(ACTION_JOINT_POS, dim=6),
        Actuator(ACTION_GRIPPER, dim=1, range=(0.0, 1.0)),
        Actuator(ACTION_JOINT_POS_2, dim=6),
        Actuator(ACTION_GRIPPER_2, dim=1, range=(0.0, 1.0)),
    )
    return EnvTags(observation=observation, action=action)


def _size(name: str, value: Any, largest: int) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, np.integer))
        or not 1 <= value <= largest
    ):
        raise ValueError(
            f"ALOHA: {name} is {value!r}; expected an integer from 1 to {largest} (MuJoCo's "
            "offscreen buffer)"
        )
    return int(value)


def _check_gl() -> None:
    """dm_control picks its GL backend when imported; on Linux without a display and without
    ``MUJOCO_GL`` it picks GLFW, which then fails with an OpenGL error that names neither."""
    if sys.platform.startswith("linux") and not (
        os.environ.get("MUJOCO_GL")
        or os.environ.get("DISPLAY")
        or os.environ.get("WAYLAND_DISPLAY")
    ):
        raise RuntimeError(
            "ALOHA renders with MuJoCo, and this machine has no display: set MUJOCO_GL=egl "
            "(or osmesa) in the environment before the run starts"
        )


class _TopCamera:
    """The package task's observation with only what the wrapper reads: the joint state and
    the top camera at the observation's size (the package also renders two more cameras and
    reads the velocities and the objects' poses, which it then drops)."""

    def __init__(self, task: Any, width: int, height: int) -> None:
        self.task, self.width, self.height = task, width, height

    def __call__(self, physics: Any) -> dict[str, Any]:
        image = physics.render(height=self.height, width=self.width, camera_id=CAMERA)
        return {"qpos": self.task.get_qpos(physics), "images": {CAMERA: image}}


class AlohaEnv(gym.Env):
    """gym-aloha's env for one task, built at the first reset and reused (see the module
    docstring).

    Args:
        task: ``"insertion"`` or ``"transfer_cube"``.
        obs_type: ``"pixels_agent_pos"`` (the default, the protocol's) or ``"pixels"``.
        render_mode: ``"rgb_array"`` (the default; ``render()`` returns a frame) or None.
        observation_width, observation_height: the top camera's image in the observation
            (default 640x480, at most that).
        visualization_width, visualization_height: ``render()``'s frame (default 640x480).

    Raises:
        ValueError: an unknown task, ``obs_type`` or ``render_mode``, or a size out of range.
    """

    # The class's, which gymnasium.make reads; each env adds its tags to its own copy.
    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 50}

    def __init__(
        self,
        task: str = "insertion",
        obs_type: str = "pixels_agent_pos",
        render_mode: str | None = "rgb_array",
        observation_width: int = 640,
        observation_height: int = 480,
        visualization_width: int = 640,
        visualization_height: int = 480,
    ) -> None:
        if task not in TASKS:
            raise ValueError(f"ALOHA: task is {task!r}; expected one of {', '.join(TASKS)}")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"ALOHA: render_mode is {render_mode!r}; expected 'rgb_array' or None")
        width = _size("observation_width", observation_width, MAX_WIDTH)
        height = _size("observation_height", observation_height, MAX_HEIGHT)
        self.observation_space = observation_space(obs_type, width, height)
        self.action_space = action_space()
        self.task, self.obs_type, self.render_mode = task, obs_type, render_mode
        self._kwargs = {
            "task": task,
            "obs_type": obs_type,
            "render_mode": "rgb_array",  # the package renders its observations in this mode
            "observation_width": width,
            "observation_height": height,
            "visualization_width": _size("visualization_width", visualization_width, MAX_WIDTH),
            "visualization_height": _size("visualization_height", visualization_height, MAX_HEIGHT),
        }
        self.metadata = {
            **type(self).metadata,
            ENV_TAGS_METADATA_KEY: env_tags(obs_type).to_dict(),
        }
        self._env: Any = None
        self._reset_done = False

    def _built(self) -> Any:
        if self._env is None:
            _check_gl()
            import_benchmark("gym_aloha", extra="aloha", benchmark="ALOHA")
            module = import_benchmark("gym_aloha.env", extra="aloha", benchmark="ALOHA")
            env = module.AlohaEnv(**self._kwargs)
            task = env._env.task
            # An attribute of this task object only: dm_control's Environment calls
            # task.get_observation(physics) after every reset and step.
            task.get_observation = _TopCamera(
                task, self._kwargs["observation_width"], self._kwargs["observation_height"]
            )
            self._env = env
        return self._env

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """The package's reset: the objects placed from the seed alone, the arms at the
        start pose (MuJoCo's state is reset whole, so earlier episodes leave nothing)."""
        super().reset(seed=seed)
        observation, info = self._built().reset(seed=seed, options=options)
        self._reset_done = True
        return observation, info

    def step(self, action: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """The package's step: the stage reward, ``terminated`` and ``info["is_success"]``
        at the maximum."""
        env = self._env_after_reset("step")
        return env.step(np.asarray(action))

    def render(self) -> np.ndarray | None:
        """The top camera as an RGB frame (``visualization_height`` x
        ``visualization_width``); None when ``render_mode`` is None."""
        if self.render_mode is None:
            return None
        return self._env_after_reset("render").render()

    def _env_after_reset(self, what: str) -> Any:
        if not self._reset_done:
            raise gym.error.ResetNeeded(f"ALOHA: {what}() before the first reset(); reset first")
        return self._env

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env._env.physics.free()  # its GL context, now rather than at collection
        self._env, self._reset_done = None, False

    @staticmethod
    def simulator_stack() -> dict[str, Any]:
        """The simulator stack ALOHA scores depend on: gym-aloha's version, mujoco's, the GL
        backend, and dm_control's (which runs the physics and renders).

        Example:
            >>> AlohaEnv.simulator_stack()["distribution"] in ("gym-aloha", None)
            True
        """
        return simulator_stack(
            ("gym-aloha",), extra=lambda: {"dm_control": distribution_version("dm-control")}
        )


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point="rlmesh.benchmarks.aloha:AlohaEnv")
