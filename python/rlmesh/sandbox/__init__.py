"""Envs and models in environments and sandboxes of their own: ``SandboxEnv`` and
``SandboxModel``.

Robot benchmarks and policies do not share one Python environment (each pins its own mujoco,
numpy or torch), and an evaluation runs code nobody reviewed. A sandboxed side is a served
env or model (``rlmesh serve env|model``, over a unix socket) whose server rlmesh starts
itself in an interpreter of its own, watches and stops:

- ``venvs.py``: the interpreter, a virtual environment holding the packages asked for and
  rlmesh's runtime requirements (``requirements.py``), built once with ``uv`` (else ``venv``
  and pip) and cached by the sorted requirements and the Python version; or one the user
  names (``python=``);
- ``bwrap.py``: the bubblewrap sandbox around it (read-only root, private ``/tmp``, one
  writable work directory, its own PID and network namespaces, ``--die-with-parent``);
- ``server_process.py``: the server's process: started with this rlmesh's package read-only on
  its path (the same version; its Rust core takes numpy 1.x and 2.x, and the pure-Python core
  stands in where it does not import), health-checked within a deadline, its output kept for
  errors (``errors.py``), stopped;
- ``env.py``: ``SandboxEnv``, a kind of ``Lanes`` (a ``RemoteEnv`` underneath) that restarts a
  dead server and replays its episodes in flight (``restart=K``); ``factory.py`` builds its
  envs with keyword arguments in the server;
- ``model.py``: ``SandboxModel``, a ``Model`` (a ``RemoteModel`` underneath);
- ``options.py``: ``SandboxOptions``, a suite's envs sandboxed
  (``rlmesh.run_suite(..., env_sandbox=SandboxOptions(...))``).

A sandboxed env built with ``render_mode="rgb_array"`` renders in its server: each frame
crosses the socket (as PNG), so videos (``record_video=K``) and the live page take them.

Needs the ``remote`` extra (gRPC); ``uv`` (the ``sandbox`` extra) makes first builds fast;
a sandbox needs Debian's ``bubblewrap`` (``sandbox=False`` runs without it).

Example:
    >>> import sys, rlmesh
    >>> env = SandboxEnv("CartPole-v1", num_envs=2, python=sys.executable, sandbox=False)
    >>> len(rlmesh.run(lambda obs: 0, env, episodes=2).episodes)
    2
"""

from __future__ import annotations

from .env import SandboxEnv
from .errors import (
    SandboxBuildError,
    SandboxCrashedError,
    SandboxEnvCrashedError,
    SandboxError,
    SandboxStartError,
    SandboxUnavailableError,
)
from .model import SandboxModel
from .options import SandboxOptions
from .requirements import extra_requirements, runtime_requirements
from .venvs import cached_venv, sandbox_python, venv_root

__all__ = [
    "SandboxBuildError",
    "SandboxCrashedError",
    "SandboxEnv",
    "SandboxEnvCrashedError",
    "SandboxError",
    "SandboxModel",
    "SandboxOptions",
    "SandboxStartError",
    "SandboxUnavailableError",
    "cached_venv",
    "extra_requirements",
    "runtime_requirements",
    "sandbox_python",
    "venv_root",
]
