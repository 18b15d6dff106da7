"""Meta-World's multi-task benchmarks, MT10 and MT50, as one Gymnasium env and two suites.

``MetaWorldEnv(task)`` is one Meta-World task (``"reach-v3"``, ...) set, episode by episode,
to one of its benchmark's fixed task variations (a goal and object placement), under the
benchmark's evaluation protocol:

- **variations**: a benchmark (``MT1``, ``MT10``, ``MT50``) built with a seed draws 50 fixed
  variations per task (``benchmark_seed``, default 42, the seed of Meta-World's own README
  examples; a trained agent is evaluated on the variations it was trained on, so pass its
  training seed). Episode ``k`` of a run is variation ``k mod 50`` whatever lane or worker
  runs it (the env declares ``metadata["rlmesh.trial_index"]``); a reset without a trial
  index takes option ``task_variation``, else ``seed mod 50``, else the variation after the
  previous episode's (0 first), so resets after a seeded one follow from its seed.
- **episodes**: 50 per task, one per variation; **step cap**: 500 (``max_path_length``; the
  env truncates there itself).
- **success**: the episode succeeds if ``info["success"]`` is 1 at any step; ``is_success``
  in every info is that, sticky over the episode, and the episode terminates at the first
  success (``terminate_on_success=True``, as Meta-World's ``evaluation`` sets it).

The simulator is built at the first reset, in the process that steps it, and reused across
episodes; the benchmark's variations (MT50 takes about 25 s to draw) are kept per process and
in a cache file per Meta-World version, benchmark and seed, which the first process to miss
it draws while the others wait (``cache_dir``; default ``$RLMESH_CACHE_DIR``, else
``$XDG_CACHE_HOME/rlmesh``, else ``~/.cache/rlmesh``; ``""`` keeps none).

Observations are Meta-World's 39 float64 values (``obs_type="state"``), an upright camera
image (``"pixels"``), or both (``"pixels_state"``); the action is 4 values in [-1, 1]: a hand
displacement (x, y, z) and the gripper (+1 closes). Both are tagged for role-based model
specs (``rlmesh.adapters``): the hand is ``proprio/eef_pos``, the gripper's opening
``proprio/gripper``, the objects, the previous frame and the goal ``x/metaworld_*`` roles;
the action ``action/delta_eef_pos`` and ``action/gripper`` in (-1, 1).

Source: Meta-World's docs, docs/evaluation/evaluation.md (one episode per training goal per
    task, 50 per task; success if the flag is 1 at any point).
Source: metaworld 3.0.0, metaworld/evaluation.py (``evaluation``: ``num_episodes=50``,
    ``toggle_terminate_on_success(True)``), metaworld/__init__.py (``_N_GOALS = 50``,
    ``_make_tasks``, ``MT10`` / ``MT50``), metaworld/sawyer_xyz_env.py
    (``max_path_length = 500``, the observation layout), metaworld/env_dict.py (the task lists).
Source: LeRobot, src/lerobot/envs/metaworld.py (terminates on success; flips the corner
    camera's image on both axes).

Example:
    >>> SUITES["metaworld_mt10"].tasks[:2], SUITES["metaworld_mt50"].episodes
    (('reach-v3', 'push-v3'), 50)
    >>> env = MetaWorldEnv("reach-v3", benchmark="MT10")  # nothing is built yet
    >>> env.observation_space.shape, env.action_space.shape, env.metadata["render_fps"]
    ((39,), (4,), 80)
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pickle
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import gymnasium
import numpy as np

from .. import adapters
from ..lanes.base import TRIAL_INDEX_FLAG, TRIAL_INDEX_OPTION
from .base import SuiteInfo, distribution_version, import_benchmark, simulator_stack

try:
    import fcntl
except ImportError:  # Windows: processes that miss the cache at once each draw
    fcntl = None  # type: ignore[assignment]

ENV_ID = "rlmesh/MetaWorld-v0"
"""The Gymnasium id this module registers on import."""

SUITE_ENV = f"rlmesh.benchmarks:{ENV_ID}"
"""The env of the suites' tasks: the id, with the module that registers it."""

MT10_TASKS = (
    "reach-v3",
    "push-v3",
    "pick-place-v3",
    "door-open-v3",
    "drawer-open-v3",
    "drawer-close-v3",
    "button-press-topdown-v3",
    "peg-insert-side-v3",
    "window-open-v3",
    "window-close-v3",
)
"""MT10's tasks, in Meta-World's order (``metaworld.env_dict.MT10_V3``)."""

MT50_TASKS = (
    "assembly-v3",
    "basketball-v3",
    "bin-picking-v3",
    "box-close-v3",
    "button-press-topdown-v3",
    "button-press-topdown-wall-v3",
    "button-press-v3",
    "button-press-wall-v3",
    "coffee-button-v3",
    "coffee-pull-v3",
    "coffee-push-v3",
    "dial-turn-v3",
    "disassemble-v3",
    "door-close-v3",
    "door-lock-v3",
    "door-open-v3",
    "door-unlock-v3",
    "hand-insert-v3",
    "drawer-close-v3",
    "drawer-open-v3",
    "faucet-open-v3",
    "faucet-close-v3",
    "hammer-v3",
    "handle-press-side-v3",
    "handle-press-v3",
    "handle-pull-side-v3",
    "handle-pull-v3",
    "lever-pull-v3",
    "pick-place-wall-v3",
    "pick-out-of-hole-v3",
    "pick-place-v3",
    "plate-slide-v3",
    "plate-slide-side-v3",
    "plate-slide-back-v3",
    "plate-slide-back-side-v3",
    "peg-insert-side-v3",
    "peg-unplug-side-v3",
    "soccer-v3",
    "stick-push-v3",
    "stick-pull-v3",
    "push-v3",
    "push-wall-v3",
    "push-back-v3",
    "reach-v3",
    "reach-wall-v3",
    "shelf-place-v3",
    "sweep-into-v3",
    "sweep-v3",
    "window-open-v3",
    "window-close-v3",
)
"""MT50's tasks, every Meta-World v3 task, in Meta-World's order
(``metaworld.env_dict.ALL_V3_ENVIRONMENTS``)."""

BENCHMARK_TASKS = {"MT1": MT50_TASKS, "MT10": MT10_TASKS, "MT50": MT50_TASKS}
"""The benchmarks whose variations an env can take, and the tasks each holds (MT1: any task,
alone)."""

VARIATIONS = 50
"""Fixed variations per task in every benchmark (Meta-World's ``_N_GOALS``)."""

MAX_PATH_LENGTH = 500
"""Meta-World's step cap (``SawyerXYZEnv.max_path_length``): the env truncates there."""

DEFAULT_BENCHMARK_SEED = 42

CAMERAS = ("corner", "corner2", "corner3", "topview", "behindGripper", "gripperPOV")
"""Meta-World's cameras (its docs/rendering/rendering.md)."""

OBS_TYPES = ("state", "pixels", "pixels_state")

# The hand's bounds in the observation (SawyerXYZEnv._HAND_SPACE); the gripper's are [-1, 1].
HAND_LOW = (-0.525, 0.348, -0.0525)
HAND_HIGH = (0.525, 1.025, 0.7)

# The 39 state values: this frame's hand, gripper and two objects (zeros where a task has one),
# the previous frame's 18, and the goal. Meta-World's object quaternions are xyzw in some
# tasks and wxyz in others (and zeros for a missing object), so they carry no encoding.
STATE_TAG = adapters.Split(
    adapters.Field(adapters.EEF_POS, 3),
    adapters.Field(adapters.GRIPPER_POS, 1),
    adapters.Field("x/metaworld_object_pos", 3),
    adapters.Field("x/metaworld_object_quat", 4),
    adapters.Field("x/metaworld_object_2_pos", 3),
    adapters.Field("x/metaworld_object_2_quat", 4),
    adapters.Field("x/metaworld_previous_frame", 18),
    adapters.Field("x/metaworld_goal_pos", 3),
)

ACTION_TAG = adapters.Action(
    adapters.Actuator(adapters.ACTION_DELTA_POS, dim=3),
    adapters.Actuator(adapters.ACTION_GRIPPER, dim=1, range=(-1, 1)),
    clip=(-1, 1),
)
"""The 4-D action: the hand's displacement (x, y, z, scaled by 1/100 m) and the gripper's
effort (+1 closes)."""

_OPTIONS = {TRIAL_INDEX_OPTION, "task_variation"}


def _state_space() -> gymnasium.spaces.Box:
    # Meta-World bounds the goal per task, once its simulator is built; unbounded here, so the
    # space is known before anything is built.
    frame_low = [*HAND_LOW, -1.0, *[-np.inf] * 14]
    frame_high = [*HAND_HIGH, 1.0, *[np.inf] * 14]
    low = np.array([*frame_low, *frame_low, *[-np.inf] * 3], np.float64)
    high = np.array([*frame_high, *frame_high, *[np.inf] * 3], np.float64)
    return gymnasium.spaces.Box(low, high, dtype=np.float64)


def _cache_root(cache_dir: str | os.PathLike[str] | None) -> Path | None:
    """Where variation tables are kept: ``cache_dir``, else the default; None for ``""``."""
    if cache_dir is None:
        cache_dir = os.environ.get("RLMESH_CACHE_DIR")
        if cache_dir is None:
            base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
            cache_dir = os.path.join(base, "rlmesh")
    return Path(os.path.expanduser(cache_dir)) if str(cache_dir) else None


def _read_table(path: Path, task: str) -> np.ndarray | None:
    """The cached variations of ``task`` in ``path``, or None (missing, unreadable, or not a
    table of VARIATIONS finite rows: it is then drawn again and rewritten)."""
    try:
        rows = json.loads(path.read_text())["variations"][task]
        table = np.array(rows, dtype=np.float64)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if table.ndim != 2 or len(table) != VARIATIONS or not np.isfinite(table).all():
        return None
    return table


def _write_tables(path: Path, tables: dict[str, np.ndarray], header: dict[str, Any]) -> None:
    """Write atomically (processes drawing the same tables at once each replace the file)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        content = {**header, "variations": {k: v.tolist() for k, v in tables.items()}}
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(handle, "w") as file:
            json.dump(content, file)
        os.replace(temporary, path)
    except OSError:
        pass  # a cache that cannot be written costs time, not correctness


@functools.lru_cache(maxsize=8)
def _draw(benchmark: str, seed: int, task: str) -> dict[str, np.ndarray]:
    """Every task's variations as Meta-World's benchmark draws them (``rand_vec`` of each of
    its ``train_tasks``); ``task`` matters only for MT1."""
    metaworld = import_benchmark("metaworld", extra="metaworld", benchmark="Meta-World")
    if benchmark == "MT1":
        built = metaworld.MT1(task, seed=seed)
    else:
        built = getattr(metaworld, benchmark)(seed=seed)
    rows: dict[str, list[np.ndarray]] = {}
    for item in built.train_tasks:  # Meta-World's own tasks, made in this process
        rows.setdefault(item.env_name, []).append(pickle.loads(item.data)["rand_vec"])
    return {name: np.array(values, dtype=np.float64) for name, values in rows.items()}


@contextlib.contextmanager
def _drawing(path: Path) -> Iterator[None]:
    """Hold ``path``'s drawing lock: processes that miss the same cache file at once (a run's
    workers) wait for the first to draw it instead of each drawing it (MT50: 25 s of CPU)."""
    if fcntl is None:
        yield
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # an unwritable cache: draw without waiting
        yield
        return
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released with the descriptor, however this ends
        yield
    finally:
        os.close(handle)


@functools.lru_cache(maxsize=64)
def _variations(benchmark: str, seed: int, task: str, cache: str) -> np.ndarray:
    """``task``'s VARIATIONS rows of ``benchmark`` drawn with ``seed``, read from the cache
    directory ``cache`` ("" for none) when there, else drawn and written there."""
    if not cache:
        return _draw(benchmark, seed, task)[task]
    version = distribution_version("metaworld") or "unknown"
    name = f"MT1-{task}" if benchmark == "MT1" else benchmark
    path = Path(cache, "metaworld", version, f"{name}-seed{seed}.json")
    if (table := _read_table(path, task)) is not None:
        return table
    with _drawing(path):
        if (table := _read_table(path, task)) is not None:  # drawn while this one waited
            return table
        tables = _draw(benchmark, seed, task)
        header = {"metaworld": version, "benchmark": benchmark, "seed": seed}
        _write_tables(path, tables, header)
    return tables[task]


class MetaWorldEnv(gymnasium.Env):
    """One Meta-World task under its benchmark's evaluation protocol (see the module).

    Args:
        task: the task's name (``MT50_TASKS``, e.g. ``"reach-v3"``).
        benchmark: whose variations: ``"MT1"`` (the task's own), ``"MT10"`` or ``"MT50"``.
        benchmark_seed: the seed the benchmark draws its variations with.
        obs_type: ``"state"`` (39 float64), ``"pixels"`` (``{"pixels": HxWx3 uint8}``) or
            ``"pixels_state"`` (``{"pixels": ..., "state": ...}``).
        camera: the camera of pixel observations and ``render()`` (``CAMERAS``).
        width, height: their size in pixels.
        terminate_on_success: end the episode at its first success (the protocol's rule).
        render_mode: None or ``"rgb_array"``; ``render()`` returns an upright frame either way.
        cache_dir: where the variation tables are kept (see the module; ``""`` for nowhere).

    Raises:
        ValueError: an argument out of its range; the message names it and what it may be.

    Example:
        >>> env = MetaWorldEnv("door-open-v3", obs_type="pixels", width=64, height=48)
        >>> env.observation_space["pixels"].shape
        (48, 64, 3)
        >>> MetaWorldEnv("sweep-v3", benchmark="MT10")
        Traceback (most recent call last):
        ...
        ValueError: MetaWorldEnv: task 'sweep-v3' is not in MT10; expected one of ...
    """

    metadata: ClassVar[dict[str, Any]] = {
        "render_modes": ["rgb_array"],
        "render_fps": 80,
        TRIAL_INDEX_FLAG: True,
    }

    def __init__(
        self,
        task: str,
        *,
        benchmark: str = "MT1",
        benchmark_seed: int = DEFAULT_BENCHMARK_SEED,
        obs_type: str = "state",
        camera: str = "corner2",
        width: int = 480,
        height: int = 480,
        terminate_on_success: bool = True,
        render_mode: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        _check_arguments(
            task, benchmark, benchmark_seed, obs_type, camera, width, height, render_mode
        )
        self.task, self.benchmark, self.benchmark_seed = task, benchmark, int(benchmark_seed)
        self.obs_type, self.camera = obs_type, camera
        self.width, self.height = int(width), int(height)
        self.terminate_on_success = bool(terminate_on_success)
        self.render_mode = render_mode
        root = _cache_root(cache_dir)
        self._cache = "" if root is None else str(root)
        image = gymnasium.spaces.Box(0, 255, (self.height, self.width, 3), np.uint8)
        if obs_type == "state":
            self.observation_space = _state_space()
            observation_tags: Any = STATE_TAG
        elif obs_type == "pixels":
            self.observation_space = gymnasium.spaces.Dict({"pixels": image})
            observation_tags = {"pixels": adapters.ImageTag(adapters.IMAGE_PRIMARY)}
        else:
            self.observation_space = gymnasium.spaces.Dict(
                {"pixels": image, "state": _state_space()}
            )
            observation_tags = {
                "pixels": adapters.ImageTag(adapters.IMAGE_PRIMARY),
                "state": STATE_TAG,
            }
        self.action_space = gymnasium.spaces.Box(-1.0, 1.0, (4,), np.float32)
        tags = adapters.EnvTags(observation=observation_tags, action=ACTION_TAG)
        self.metadata = {**type(self).metadata, adapters.ENV_TAGS_METADATA_KEY: tags.to_dict()}
        self._env: Any = None  # Meta-World's env, built at the first reset
        self._tasks: list[Any] = []
        self._flip = False
        self._frame: np.ndarray | None = None
        self._next_variation = 0
        self._succeeded = False

    @staticmethod
    def simulator_stack() -> dict[str, Any]:
        """The simulator stack scores depend on (Meta-World's and mujoco's versions, GL).

        Example:
            >>> sorted(MetaWorldEnv.simulator_stack())
            ['MUJOCO_GL', 'distribution', 'mujoco', 'version']
        """
        return simulator_stack(("metaworld",))

    def _simulator(self) -> Any:
        """Meta-World's env, built on first use in this process, with the benchmark's
        variations of the task as Meta-World ``Task`` objects."""
        if self._env is not None:
            return self._env
        metaworld = import_benchmark("metaworld", extra="metaworld", benchmark="Meta-World")
        task_type = import_benchmark("metaworld.types", extra="metaworld", benchmark="Meta-World")
        env_class = metaworld.env_dict.ALL_V3_ENVIRONMENTS[self.task]
        table = _variations(self.benchmark, self.benchmark_seed, self.task, self._cache)
        # What Meta-World's benchmarks put in a Task (_make_tasks): the variation, the class,
        # and the goal observable (the multi-task setting).
        self._tasks = [
            task_type.Task(
                env_name=self.task,
                data=pickle.dumps(
                    {"rand_vec": row, "env_cls": env_class, "partially_observable": False}
                ),
            )
            for row in table
        ]
        env = env_class(
            render_mode="rgb_array", camera_name=self.camera, width=self.width, height=self.height
        )
        # Some cameras look with the image's up axis pointing down in the world (the corner
        # ones): their frames are turned half a turn to stand upright.
        self._flip = bool(env.data.camera(self.camera).xmat[7] < 0)
        self._env = env
        return env

    def _variation(self, seed: int | None, options: dict[str, Any] | None) -> int:
        variation = self._chosen_variation(seed, options)
        self._next_variation = (variation + 1) % VARIATIONS
        return variation

    def _chosen_variation(self, seed: int | None, options: dict[str, Any] | None) -> int:
        options = dict(options or {})
        unknown = set(options) - _OPTIONS
        if unknown:
            raise ValueError(
                f"MetaWorldEnv.reset: unknown options {sorted(unknown)}; expected "
                f"{sorted(_OPTIONS)}"
            )
        for key in ("task_variation", TRIAL_INDEX_OPTION):
            value = options.get(key)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                    raise ValueError(
                        f"MetaWorldEnv.reset: option {key!r} must be an int, got {value!r}"
                    )
                return int(value) % VARIATIONS
        if seed is not None:
            return int(seed) % VARIATIONS
        return self._next_variation

    def _observe(self, state: np.ndarray) -> Any:
        self._frame = None
        if self.obs_type == "state":
            return state
        pixels = self.render()
        if self.obs_type == "pixels":
            return {"pixels": pixels}
        return {"pixels": pixels, "state": state}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Start an episode on variation ``trial_index mod 50`` (see the module), seeded with
        ``seed`` when given. The info holds ``task_variation`` and ``is_success`` (False)."""
        super().reset(seed=seed)
        variation = self._variation(seed, options)
        env = self._simulator()
        env.set_task(self._tasks[variation])
        if seed is not None:
            env.seed(int(seed))
        state, info = env.reset()
        self._succeeded = False
        info = {**info, "task_variation": variation, "is_success": False}
        return self._observe(state), info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """One step of Meta-World's env; ``is_success`` is sticky over the episode and a
        success terminates it when ``terminate_on_success``."""
        if self._env is None:
            raise gymnasium.error.ResetNeeded("MetaWorldEnv.step before reset: call reset() first")
        state, reward, _, truncated, info = self._env.step(np.asarray(action, np.float32))
        success = bool(info["success"])
        self._succeeded = self._succeeded or success
        info = {**info, "is_success": self._succeeded}
        terminated = success and self.terminate_on_success
        return self._observe(state), float(reward), terminated, bool(truncated), info

    def render(self) -> np.ndarray:
        """The camera's current frame, ``(height, width, 3)`` uint8, upright."""
        if self._env is None:
            raise gymnasium.error.ResetNeeded("MetaWorldEnv.render before reset: call reset()")
        if self._frame is None:
            # Gymnasium's renderer draws with whichever GL context is current (the one made
            # last, by any env): with two tasks' envs in one process, one would draw its scene
            # with the other's meshes and textures. Its own is made current first.
            viewer = self._env.mujoco_renderer.viewer
            if viewer is not None:
                viewer.make_context_current()
            frame = self._env.render()
            if self._flip:
                frame = frame[::-1, ::-1]
            self._frame = np.ascontiguousarray(frame)
        return self._frame

    def close(self) -> None:
        """Close Meta-World's env (its renderer's GL context), if it was built."""
        if self._env is not None:
            self._env.close()
            self._env = None
            self._frame = None


def _check_arguments(
    task: Any,
    benchmark: Any,
    seed: Any,
    obs_type: Any,
    camera: Any,
    width: Any,
    height: Any,
    render_mode: Any,
) -> None:
    def refuse(what: str, expected: str) -> None:
        raise ValueError(f"MetaWorldEnv: {what}; expected {expected}")

    if benchmark not in BENCHMARK_TASKS:
        refuse(f"benchmark is {benchmark!r}", f"one of {list(BENCHMARK_TASKS)}")
    if task not in BENCHMARK_TASKS[benchmark]:
        refuse(f"task {task!r} is not in {benchmark}", f"one of {list(BENCHMARK_TASKS[benchmark])}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        refuse(f"benchmark_seed is {seed!r}", "an int >= 0")
    if obs_type not in OBS_TYPES:
        refuse(f"obs_type is {obs_type!r}", f"one of {list(OBS_TYPES)}")
    if camera not in CAMERAS:
        refuse(f"camera is {camera!r}", f"one of {list(CAMERAS)}")
    for name, value in (("width", width), ("height", height)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            refuse(f"{name} is {value!r}", "an int >= 1")
    if render_mode not in (None, "rgb_array"):
        refuse(f"render_mode is {render_mode!r}", "None or 'rgb_array'")


_SOURCE = (
    "Meta-World docs/evaluation/evaluation.md (one episode per training goal, 50 per task; "
    "success if info['success'] is 1 at any step); metaworld 3.0.0 metaworld/evaluation.py "
    "(num_episodes=50, terminate on success), metaworld/sawyer_xyz_env.py "
    "(max_path_length=500), metaworld/__init__.py (_N_GOALS=50 variations per task)"
)

_OPTIONS_DEFAULTS = {
    "benchmark_seed": DEFAULT_BENCHMARK_SEED,
    "obs_type": "state",
    "camera": "corner2",
    "width": 480,
    "height": 480,
    "terminate_on_success": True,
}


def _suite(name: str, benchmark: str, tasks: tuple[str, ...]) -> SuiteInfo:
    return SuiteInfo(
        name=name,
        benchmark="Meta-World",
        extra="metaworld",
        module="metaworld",
        env=SUITE_ENV,
        tasks=tasks,
        episodes=VARIATIONS,
        max_episode_steps=MAX_PATH_LENGTH,
        source=_SOURCE,
        task_kwargs=tuple({"task": task, "benchmark": benchmark} for task in tasks),
        options=dict(_OPTIONS_DEFAULTS),
    )


SUITES: dict[str, SuiteInfo] = {
    "metaworld_mt10": _suite("metaworld_mt10", "MT10", MT10_TASKS),
    "metaworld_mt50": _suite("metaworld_mt50", "MT50", MT50_TASKS),
}
"""Meta-World's suites: MT10's 10 tasks and MT50's 50, each on its benchmark's variations."""

if ENV_ID not in gymnasium.registry:
    gymnasium.register(ENV_ID, entry_point="rlmesh.benchmarks.metaworld:MetaWorldEnv")
