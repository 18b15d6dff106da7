"""rlmesh: exact, reproducible, fast evaluation of RL agents and robot policies.

Episodes are numbered in the order they start, each is seeded by its index, and a run scores
exactly the episodes asked for, whatever the number of parallel environments.
"""

from .ab import ABResult, ab
from .adapters import Action, Concat, Custom, Image, ModelSpec, Plan, State, Text, compile_spec
from .api import arun, run
from .contexts import PredictContext
from .core import active as _active_core
from .core import core_name
from .errors import (
    EnvError,
    HookError,
    ModelDefinitionError,
    ModelError,
    ModelOutputError,
    ObservationError,
    OperationTimeout,
    RemoteError,
    ResultsFileError,
    ResultsFileLockedError,
    RlmeshError,
    SpecError,
    StatefulModelError,
)
from .hooks import RunHooks, RuntimeHooks, StepEvent
from .model import Model, TemporalEnsemble
from .results import (
    EpisodeResult,
    ResultsFile,
    RunResult,
    TelemetryRow,
    read_results,
    read_suite,
)
from .stats.stopping import Precision
from .suites import SuiteResult, Task, arun_suite, load_suite, run_suite
from .version import __version__

episode_seed = _active_core.episode_seed

__all__ = [
    "ABResult",
    "Action",
    "Concat",
    "Custom",
    "EnvError",
    "EpisodeResult",
    "HookError",
    "Image",
    "Model",
    "ModelDefinitionError",
    "ModelError",
    "ModelOutputError",
    "ModelSpec",
    "ObservationError",
    "OperationTimeout",
    "Plan",
    "Precision",
    "PredictContext",
    "RemoteEnv",
    "RemoteError",
    "RemoteModel",
    "ResultsFile",
    "ResultsFileError",
    "ResultsFileLockedError",
    "RlmeshError",
    "RunHooks",
    "RunResult",
    "RuntimeHooks",
    "SandboxEnv",
    "SandboxModel",
    "SpecError",
    "State",
    "StatefulModelError",
    "StepEvent",
    "SuiteResult",
    "Task",
    "TelemetryRow",
    "TemporalEnsemble",
    "Text",
    "__version__",
    "ab",
    "arun",
    "arun_suite",
    "compare",
    "compile_spec",
    "core_name",
    "episode_seed",
    "load_suite",
    "read_results",
    "read_suite",
    "run",
    "run_suite",
    "serve_env",
    "serve_model",
]

# Served envs and models need the `remote` extra (grpcio); `import rlmesh` stays light and
# imports them on first use.
_REMOTE = {
    "RemoteEnv": "rlmesh.lanes.remote",
    "RemoteModel": "rlmesh.remote.model_client",
    "SandboxEnv": "rlmesh.sandbox",
    "SandboxModel": "rlmesh.sandbox",
    "serve_env": "rlmesh.remote.env_server",
    "serve_model": "rlmesh.remote.model_server",
}


# What reads results files (rlmesh.report) is imported on first use too.
_REPORT = {"compare": "rlmesh.report.compare"}


def __getattr__(name: str) -> object:
    import importlib

    if name in _REPORT:
        return getattr(importlib.import_module(_REPORT[name]), name)
    if name not in _REMOTE:
        raise AttributeError(f"module 'rlmesh' has no attribute {name!r}")
    from .remote import require_grpc

    require_grpc(name)
    return getattr(importlib.import_module(_REMOTE[name]), name)
