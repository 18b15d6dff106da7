"""The ``Model`` base class: a model's corners, its hooks, and which corners it defines.

A model has up to four *corners*, one per kind of call (docs/semantics.md, "Corners of a
model"):

- ``predict(obs)`` -> one action;
- ``predict_batch(obs[K, ...])`` -> ``[K, ...]``, one action per lane;
- ``predict_chunk(obs[, execution_horizon])`` -> ``[H, ...]``, H consecutive actions;
- ``predict_chunk_batch(obs[K, ...][, execution_horizon])`` -> ``[K, H, ...]``.

A subclass defines any subset. Batched corners receive one fused observation: each leaf gains a
leading lane axis (a Dict stays a dict of arrays, a text leaf is a list of K strings) and return
one batched action (an array, or a dict of arrays, each with the leading lane axis). A plain
callable, or ``Model(callable)``, is a ``predict``. Any corner may be ``async``. A corner that
declares a parameter named ``context`` also gets the ``PredictContext`` of each lane's episode
(a list of them for a batched corner): where a model keeps what it remembers across
predictions, per episode (``rlmesh.contexts``).

Example:
    >>> class Doubler(Model):
    ...     def predict_batch(self, obs):
    ...         return obs * 2
    >>> defined_corners(Doubler())
    ('predict_batch',)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import gymnasium

    from ..adapters import ModelSpec, Plan
    from .tensors import TensorBridge

CORNERS = ("predict", "predict_batch", "predict_chunk", "predict_chunk_batch")
# The corner a run uses is the first one the model defines, in this order: batched before
# per-lane (one call per group step instead of K), and for an un-chunked run the plain corners
# before the chunk ones (which are asked for horizon 1 and cut to their first action).
CHUNKED_ORDER = ("predict_chunk_batch", "predict_chunk")
UNCHUNKED_ORDER = ("predict_batch", "predict", "predict_chunk_batch", "predict_chunk")
POSITIONAL = (
    inspect.Parameter.POSITIONAL_ONLY,
    inspect.Parameter.POSITIONAL_OR_KEYWORD,
    inspect.Parameter.VAR_POSITIONAL,
)


@dataclass(frozen=True)
class Route:
    """What a run tells its model before the first prediction (``Model.on_route``).

    Attributes:
        env: how the run names the env (``Lanes.name``).
        observation_space, action_space: one lane's raw spaces.
        plan: the model's spec compiled against them: what each payload holds and how each
            action is applied.
        execution_horizon: the actions a lane replays from one chunk (1: un-chunked).
        ensemble: the run executes chunks by temporal ensembling (``rlmesh.TemporalEnsemble``):
            the chunk corner is asked for its whole chunk at every step.
    """

    env: str
    observation_space: gymnasium.Space[Any]
    action_space: gymnasium.Space[Any]
    plan: Plan
    execution_horizon: int
    ensemble: bool = False


class Model:
    """The base class of a user model: override any subset of the four corners.

    Args:
        fn: optional; ``Model(fn)`` makes the callable ``fn(obs) -> action`` the ``predict``
            corner, for a model written as a plain function.

    Attributes:
        spec: a ``ModelSpec`` saying what the model consumes and emits, or None for the raw
            observation in, an action cast into the action space out. A class attribute a
            subclass may set.
        stateless: set ``stateless = True`` on a subclass to promise that its output depends
            only on its input, never on earlier calls: a run with several lanes then skips
            the statefulness probe (``ModelHandler.check_stateless``) and its model calls.
            For a remote or paid model, or one too slow to call a few extra times. Default
            False: the probe runs.

    The lifecycle methods are no-ops here; override those you need. The driver calls
    ``on_route(route)`` once when the run is configured (the spaces and plan it will use),
    ``load()`` once before the first prediction, ``on_episode_end(episode_id)`` (or
    ``on_episode_end()`` when it takes no argument) then ``reset()`` each time an episode the
    model predicted on ends, and ``close()`` at the end, also on failure. Any of them, and any
    corner, may be ``async``.

    Example:
        >>> import numpy as np
        >>> class Policy(Model):
        ...     def predict_chunk(self, obs, execution_horizon=None):
        ...         return np.repeat(obs[None], execution_horizon or 4, axis=0)  # [H, ...]
        >>> Policy().predict_chunk(np.zeros(2), 3).shape
        (3, 2)
        >>> Model(abs).predict(-1)
        1
    """

    spec: ModelSpec | None = None
    stateless: bool = False
    # Set by Model(fn). A class attribute too, so a subclass whose __init__ skips
    # super().__init__() still works.
    _fn: Callable[[Any], Any] | None = None

    def __init__(self, fn: Callable[[Any], Any] | None = None) -> None:
        if fn is not None and not callable(fn):
            raise TypeError(f"Model(fn): fn must be a callable fn(obs) -> action, got {fn!r}")
        self._fn = fn

    # ------------------------------------------------------------------ corners

    def predict(self, obs: Any) -> Any:
        """One lane's action for one observation; ``fn(obs)`` for ``Model(fn)``."""
        if self._fn is None:
            raise _missing(self, "predict")
        return self._fn(obs)

    def predict_batch(self, obs: Any) -> Any:
        """K lanes' actions ``[K, ...]`` for a fused observation (every leaf ``[K, ...]``)."""
        raise _missing(self, "predict_batch")

    def predict_chunk(self, obs: Any, execution_horizon: int | None = None) -> Any:
        """H consecutive actions ``[H, ...]`` for one observation.

        ``execution_horizon`` is how many of them the run replays before asking again; a chunk
        may hold more (the rest is dropped) or fewer (the lane re-plans sooner).
        """
        raise _missing(self, "predict_chunk")

    def predict_chunk_batch(self, obs: Any, execution_horizon: int | None = None) -> Any:
        """K lanes' chunks ``[K, H, ...]`` for a fused observation (every leaf ``[K, ...]``)."""
        raise _missing(self, "predict_chunk_batch")

    # ------------------------------------------------------------------ lifecycle

    def on_route(self, route: Route) -> None:
        """Called once per run, before ``load()``, with the run's ``Route``: a model that
        forwards predictions elsewhere (``rlmesh.RemoteModel``) learns there what the payloads
        and actions will be. Synchronous."""

    def load(self) -> None:
        """Called once, before the first prediction: load weights, warm up."""

    def on_episode_end(self, episode_id: int) -> None:
        """Called when an episode the model predicted on ends, before ``reset()``."""

    def reset(self) -> None:
        """Called at each episode end, after ``on_episode_end``."""

    def close(self) -> None:
        """Called once at the end of a run, also when it fails."""

    def tensor_bridge(self) -> TensorBridge | None:
        """How this model's inputs become a framework's tensors and its outputs numpy again
        (``rlmesh.model.tensors``), or None: numpy in, numpy out, as here. The model handler
        asks once, when it is made; ``rlmesh.torch.Model`` and ``rlmesh.jax.Model`` return
        the bridge for their ``device``."""
        return None

    def run(self, env: Any, **kwargs: Any) -> Any:
        """Evaluate this model on ``env``: ``rlmesh.run(self, env, **kwargs)``."""
        from ..api import run  # upward, for convenience: rlmesh.api imports this module

        return run(self, env, **kwargs)


def _missing(model: Model, corner: str) -> NotImplementedError:
    return NotImplementedError(
        f"{type(model).__name__} does not define {corner}; a Model subclass overrides at least "
        f"one of {', '.join(CORNERS)}"
    )


def defined_corners(model: Model) -> tuple[str, ...]:
    """The corners ``model`` defines: overridden by its class, set on the instance, or
    ``predict`` given as ``Model(fn)``.

    Example:
        >>> class Chunky(Model):
        ...     def predict_chunk(self, obs, execution_horizon=None):
        ...         return [obs]
        >>> defined_corners(Chunky()), defined_corners(Model(abs))
        (('predict_chunk',), ('predict',))
    """
    return tuple(
        corner
        for corner in CORNERS
        if getattr(type(model), corner) is not getattr(Model, corner)
        or corner in vars(model)
        or (corner == "predict" and model._fn is not None)
    )
