"""The model: the ``Model`` base class, which of its corners exist, and the handler that calls them.

A model has up to four *corners*, one per kind of call (DESIGN.md, "Corners of a model"):

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

``ModelHandler`` is how the driver calls a model: once per group step, for the K lanes that need
an action, through the most specific corner that exists. Missing corners are derived: per-lane
corners are called lane by lane and stacked, and a chunk corner serves an un-chunked run by
asking for horizon 1 and keeping the first action.

Example:
    >>> import asyncio
    >>> import numpy as np
    >>> class Doubler(Model):
    ...     def predict_batch(self, obs):
    ...         return obs * 2
    >>> handler = ModelHandler(Doubler())
    >>> handler.corner, handler.chunked
    ('predict_batch', False)
    >>> asyncio.run(handler.predict(np.array([[1.0], [2.0]]), num_lanes=2)).tolist()
    [[2.0], [4.0]]
    >>> per_lane = ModelHandler(lambda obs: obs["x"].sum())  # a bare callable is a predict
    >>> per_lane.corner
    'predict'
    >>> asyncio.run(per_lane.predict({"x": np.ones((2, 3))}, num_lanes=2)).tolist()
    [3.0, 3.0]
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from .contexts import CONTEXT_PARAMETER, EpisodeContexts, accepts_context
from .errors import (
    ModelDefinitionError,
    ModelError,
    ModelOutputError,
    RlmeshError,
    StatefulModelError,
    call_failure,
)
from .utils import leaves, map_leaves, path_text

if TYPE_CHECKING:
    import gymnasium

    from .adapters import ModelSpec, Plan

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

# The stateful-model probe's statistical check (see ``ModelHandler.check_stateless``): rounds of
# (b, a, a), and how strongly the outputs for ``a`` must line up with call order, or split by
# what came before, to count as state. For outputs that are pure noise, a rank correlation with
# the call count of 0.9 over 32 outputs has odds of about 1e-12 (t-distribution, 30 degrees of
# freedom); a rank-biserial correlation of 0.99 between the 16 outputs after ``b`` and the 16
# after ``a`` (both groups apart but for at most one swapped pair) has odds of 4 in
# C(32, 16) = 6e8, about 7e-9. So even thousands of output elements tested at once leave false
# alarms negligible; a state that grows with every call, or that remembers the last input
# more than the noise blurs it, reaches 1.
PROBE_ROUNDS = 16
PROBE_THRESHOLD = 0.9
PROBE_SPLIT_THRESHOLD = 0.99
# The quick check that comes first: a, a, then a, b, a. A deterministic pure model is done
# after these; only outputs for `a` that differ lead to the statistical check.
QUICK_PROBE_CALLS = 5


@dataclass(frozen=True)
class Route:
    """What a run tells its model before the first prediction (``Model.on_route``).

    Attributes:
        env: how the run names the env (``Lanes.name``).
        observation_space, action_space: one lane's raw spaces.
        plan: the model's spec compiled against them: what each payload holds and how each
            action is applied.
        execution_horizon: the actions a lane replays from one chunk (1: un-chunked).
    """

    env: str
    observation_space: gymnasium.Space[Any]
    action_space: gymnasium.Space[Any]
    plan: Plan
    execution_horizon: int


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

    def run(self, env: Any, **kwargs: Any) -> Any:
        """Evaluate this model on ``env``: ``rlmesh.driver.run(self, env, **kwargs)``."""
        from . import driver  # the driver imports this module: import it only when needed

        return driver.run(self, env, **kwargs)


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


@runtime_checkable
class RoundModel(Protocol):
    """The model as the core's ``RoundRunner.run_rounds`` calls it (``ModelHandler`` is one).

    Attributes:
        lane_corner: a per-lane function ``predict(lane_input) -> action`` the core may call on
            each lane's input itself (a row of an array payload, or an array of the lane's
            own; then ``combine`` stacks the outputs); None when the model must be called
            through ``predict_now``.
        wants_episode_ids: when true, ``predict_now`` takes the predict lanes' episode ids
            (``[P]``), and ``lane_corner`` is not used.
        calls_per_lane: a prediction for ``P`` lanes is ``P`` calls of a per-lane corner (for
            the telemetry's count of model calls).
    """

    lane_corner: Callable[[Any], Any] | None
    wants_episode_ids: bool
    calls_per_lane: bool

    def predict_now(
        self, payload: Any, num_lanes: int, episode_ids: Sequence[int] | None = None
    ) -> Any:
        """The model's output for the ``P = num_lanes`` lanes of ``payload`` (``[P, ...]``, or
        chunks ``[P, H, ...]``), without an event loop."""
        ...

    def combine(self, outputs: list[Any], num_lanes: int) -> Any:
        """``P`` per-lane outputs of ``lane_corner``, in lane order, as one batch."""
        ...

    def failure(self, error: Exception, rounds: int) -> Exception:
        """What the run raises (``from error``) when calling the model raised ``error`` after
        ``rounds`` rounds."""
        ...


class ModelHandler:
    """Calls a user model the way the driver needs: once per group step, for the lanes that need
    an action.

    Args:
        model: a ``Model`` (subclass) instance, or a bare callable (taken as ``predict``).
        execution_horizon: ``E >= 1``, the actions a lane replays from one chunk. ``E > 1``
            asks for chunks; a model without a chunk corner warns once and runs un-chunked.

    Attributes:
        model: the wrapped ``Model``.
        spec: the model's ``spec`` attribute, None when it has none.
        chunked: whether ``predict`` returns chunks ``[K, H, ...]`` rather than ``[K, ...]``.
        corner: the corner ``predict`` calls.

    Raises:
        ModelDefinitionError: ``model`` is a class, not an instance, or defines no corner (a
            ``TypeError`` too).
    """

    def __init__(self, model: Any, *, execution_horizon: int = 1) -> None:
        self.model = _as_model(model)
        self.spec: ModelSpec | None = getattr(self.model, "spec", None)

        self._defined = defined_corners(self.model)
        if not self._defined:
            raise ModelDefinitionError(
                f"{type(self.model).__name__} defines none of the four predict corners "
                f"({', '.join(CORNERS)}): override at least one in the Model subclass (e.g. "
                f"`def predict(self, obs): return action`), or pass a function fn(obs) -> "
                f"action, or Model(fn)"
            )
        wants_chunks = execution_horizon > 1
        self.chunked = wants_chunks and any(corner in self._defined for corner in CHUNKED_ORDER)
        if wants_chunks and not self.chunked:
            warnings.warn(
                f"execution_horizon={execution_horizon} but {type(self.model).__name__} has no "
                f"chunk corner (predict_chunk or predict_chunk_batch): running un-chunked, one "
                f"action per prediction",
                UserWarning,
                stacklevel=2,
            )
        self.execution_horizon = execution_horizon
        self._horizon_asked = execution_horizon if self.chunked else 1
        order = CHUNKED_ORDER if self.chunked else UNCHUNKED_ORDER
        self._use_corner(next(corner for corner in order if corner in self._defined))
        self._end_takes_id = _takes_an_argument(self.model.on_episode_end)
        self._loaded = False
        self._closed = False
        # Whether telling the model of an episode's end can do anything: the base class's
        # on_episode_end and reset do nothing.
        self.wants_episode_ends = any(
            getattr(type(self.model), name) is not getattr(Model, name) or name in vars(self.model)
            for name in ("on_episode_end", "reset")
        )

    def _use_corner(self, corner: str) -> None:
        """Call the model through ``corner`` from now on."""
        self.corner = corner
        self._batched = corner.endswith("_batch")
        # A chunk corner in an un-chunked run is asked for one action and cut to its first.
        self._first_action_only = "chunk" in corner and not self.chunked
        method = getattr(self.model, corner)
        if corner == "predict" and type(self.model).predict is Model.predict:
            # Model(fn) (or a subclass that leaves predict alone): call fn itself, so its own
            # signature says whether it takes a context.
            method = self.model._fn or method
        self._call = _corner_call(method, corner, self._horizon_asked)
        self._synchronous = not _is_async(method)
        # The running episodes' contexts, when the corner declares a `context` parameter.
        self.contexts = EpisodeContexts() if accepts_context(method) else None

    def fit_route(
        self,
        env: str,
        observation_space: gymnasium.Space[Any],
        action_space: gymnasium.Space[Any],
        plan: Plan,
    ) -> None:
        """Tell the model the run's route (``Model.on_route``), once, before ``load``."""
        on_route = getattr(self.model, "on_route", None)
        if on_route is not None:
            on_route(Route(env, observation_space, action_space, plan, self.execution_horizon))

    def with_horizon(self, execution_horizon: int) -> ModelHandler:
        """A handler of the same model for runs of another ``execution_horizon``, sharing this
        one's load: a served model answers drivers of several horizons. Closing it does
        nothing (this handler closes the model)."""
        other = ModelHandler(self.model, execution_horizon=execution_horizon)
        other._loaded = self._loaded
        other._closed = True
        return other

    def fit_lanes(self, num_lanes: int) -> None:
        """Pick the cheapest corner for a run of ``num_lanes`` lanes, before its first call.

        On one lane a batched corner only wraps each observation in a batch of one and unwraps
        the action again, so a model that also defines the per-lane corner of the same kind
        (``predict`` beside ``predict_batch``, ``predict_chunk`` beside
        ``predict_chunk_batch``) is called through that one; its actions are the same for a
        pure model. On several lanes the batched corner stays.

        Example:
            >>> class Both(Model):
            ...     def predict(self, obs):
            ...         return obs * 2
            ...     def predict_batch(self, obs):
            ...         return obs * 2
            >>> handler = ModelHandler(Both())
            >>> handler.corner, handler.fit_lanes(1), handler.corner
            ('predict_batch', None, 'predict')
        """
        if num_lanes != 1 or not self._batched:
            return
        per_lane = self.corner.removesuffix("_batch")
        if per_lane in self._defined:
            self._use_corner(per_lane)

    # ------------------------------------------------------------------ lifecycle

    async def load(self) -> None:
        """``model.load()``, once; later calls do nothing."""
        if not self._loaded:
            await _resolved(self.model.load())
            self._loaded = True

    async def episode_end(self, episode_id: int) -> None:
        """``model.on_episode_end(episode_id)`` (or ``on_episode_end()`` when it takes no
        argument), then ``model.reset()``."""
        if self._end_takes_id:
            await _resolved(self.model.on_episode_end(episode_id))
        else:
            await _resolved(self.model.on_episode_end())
        await _resolved(self.model.reset())

    def start_episodes(self, episode_ids: Sequence[int], seeds: Sequence[int | None]) -> None:
        """New episodes (``[S]`` ids and their seeds): a corner that takes a ``context`` gets
        a fresh one for each."""
        if self.contexts is not None and episode_ids:
            self.contexts.start(episode_ids, seeds)

    async def end_episodes(self, episode_ids: Sequence[int], model_ends: Sequence[int]) -> None:
        """Finished episodes (``[E]`` ids): their contexts go, and the model is told of those
        whose end it is owed (``model_ends``, the ones it predicted on), in order."""
        if self.contexts is not None:
            self.contexts.end(episode_ids)
        if self.wants_episode_ends:
            for episode_id in model_ends:
                await self.episode_end(episode_id)

    async def close(self) -> None:
        """``model.close()``, once; later calls do nothing."""
        if not self._closed:
            self._closed = True
            await _resolved(self.model.close())

    # ------------------------------------------------------------------ prediction

    @property
    def synchronous(self) -> bool:
        """The corner is a plain function, so ``predict_now`` calls it without an event loop."""
        return self._synchronous

    async def predict(
        self, payload: Any, num_lanes: int, episode_ids: Sequence[int] | None = None
    ) -> Any:
        """The model's batched output for K lanes.

        Args:
            payload: the fused input of ``K = num_lanes`` lanes: an array ``[K, ...]``, or a
                (nested) dict whose array leaves are ``[K, ...]`` and whose text leaves are
                lists of K strings.
            num_lanes: K.
            episode_ids: ``[K]``, the episode of each lane, for a corner that takes a
                ``context`` (``wants_episode_ids``); None outside any episode.

        Returns:
            numpy arrays with a leading lane axis, in the structure the model returned (an
            array, or a dict of them): ``[K, H, ...]`` per leaf when ``chunked``, else
            ``[K, ...]``. Per-lane chunks of different lengths are all cut to the shortest H:
            a shorter chunk only means the lane re-plans sooner (DESIGN.md, "Action chunks").

        Raises:
            ModelOutputError: a batched corner returned another leading dimension than K, or
                per-lane outputs that cannot be stacked.
            Anything the model raises, unchanged (the driver says where it happened).

        The model is loaded first if it was not. Per-lane corners are called in lane order, one
        call at a time, so a model never sees overlapping calls.
        """
        if not self._loaded:
            await self.load()
        calls = self._calls(payload, num_lanes, episode_ids)
        return self.combine([await _resolved(output) for output in calls], num_lanes)

    def predict_now(
        self, payload: Any, num_lanes: int, episode_ids: Sequence[int] | None = None
    ) -> Any:
        """``predict`` of a ``synchronous`` corner of a loaded model, without an event loop.

        Raises:
            TypeError: the corner returned an awaitable (declare it ``async def``), or the
                model is not loaded.
        """
        if not self._loaded:
            raise TypeError("predict_now needs a loaded model: await load() first")
        return self.combine(self._calls(payload, num_lanes, episode_ids), num_lanes)

    @property
    def lane_corner(self) -> Callable[[Any], Any] | None:
        """The plain per-lane corner, ``predict(lane_input) -> action``, when that is what
        this model is called through (un-chunked, without a context); None otherwise. A
        caller may call it once per lane row itself and stack the outputs with ``combine``:
        what ``predict_now`` does on an array payload."""
        return self._call if self.corner == "predict" and self.contexts is None else None

    @property
    def calls_per_lane(self) -> bool:
        """Whether a prediction for P lanes is P calls of the corner (a per-lane corner)
        rather than one (a batched corner): what telemetry counts as model calls."""
        return not self._batched

    @property
    def wants_episode_ids(self) -> bool:
        """The corner takes a ``context``: ``predict`` and ``predict_now`` need each lane's
        episode id."""
        return self.contexts is not None

    def combine(self, outputs: list[Any], num_lanes: int) -> Any:
        """The corner's outputs (one batched output, or one per lane in lane order) as one
        batch ``[K, ...]`` (``[K, H, ...]`` for chunks), as ``predict`` returns it.

        Raises:
            TypeError: an output is an awaitable (from a plain function: declare it
                ``async def``).
            ModelOutputError: outputs that do not make one batch of K lanes.
        """
        for output in outputs:
            if inspect.isawaitable(output):
                for pending in outputs:
                    if inspect.iscoroutine(pending):
                        pending.close()
                raise TypeError(
                    f"{type(self.model).__name__}.{self.corner} is a plain function but "
                    f"returned an awaitable: declare it `async def`"
                )
        return self._combined(outputs, num_lanes)

    def failure(self, error: Exception, rounds: int) -> Exception:
        """What a run raises when calling this model raised ``error`` after ``rounds``
        rounds: an ``RlmeshError`` as it is, anything else as a ``ModelError`` naming the
        corner (raise it ``from error``)."""
        return call_failure(f"model.{self.corner}", error, rounds)

    def _calls(self, payload: Any, num_lanes: int, episode_ids: Sequence[int] | None) -> list[Any]:
        """The corner called on ``payload``: one output, or one per lane in lane order."""
        contexts = None if self.contexts is None else self.contexts.advance(episode_ids, num_lanes)
        if self._batched:
            return [
                self._call(payload) if contexts is None else self._call(payload, context=contexts)
            ]
        if isinstance(payload, np.ndarray):
            inputs = [payload[lane] for lane in range(num_lanes)]
        else:
            inputs = [_lane(payload, lane) for lane in range(num_lanes)]
        if contexts is None:
            return [self._call(each) for each in inputs]
        return [
            self._call(each, context=context)
            for each, context in zip(inputs, contexts, strict=True)
        ]

    def _combined(self, outputs: list[Any], num_lanes: int) -> Any:
        if self._batched:
            output = _arrays(outputs[0])
            self._check_rows(output, num_lanes)
        elif "chunk" in self.corner:
            outputs = [_arrays(output) for output in outputs]
            shortest = min(self._horizon(output, lane) for lane, output in enumerate(outputs))
            output = self._stacked(
                [map_leaves(out, lambda leaf: leaf[:shortest]) for out in outputs]
            )
        else:
            output = _stacked_numbers(outputs)
            if output is None:
                output = self._stacked([_arrays(output) for output in outputs])
        if self._first_action_only:
            output = map_leaves(output, self._first_of_chunk)
        return output

    def _check_rows(self, output: Any, num_lanes: int) -> None:
        for path, leaf in leaves(output):
            rows = leaf.shape[0] if leaf.ndim else 0
            if rows != num_lanes:
                raise ModelOutputError(
                    f"{self.corner} returned {rows} rows for {num_lanes} lanes: "
                    f"{path_text('output', path)} has shape {leaf.shape}, expected one row per "
                    f"lane along the leading axis"
                )

    def _horizon(self, chunk: Any, lane: int) -> int:
        """H of one lane's chunk: the length of its first leaf (the cores check the rest)."""
        path, leaf = next(leaves(chunk))
        if leaf.ndim == 0:
            raise ModelOutputError(
                f"{self.corner} returned {path_text('output', path)} of shape () for lane "
                f"{lane}: expected a chunk [H, ...] of H actions"
            )
        return leaf.shape[0]

    def _stacked(self, outputs: list[Any]) -> Any:
        try:
            return map_leaves(outputs[0], lambda *rows: np.stack(rows), *outputs[1:])
        except (ValueError, KeyError) as err:
            raise ModelOutputError(
                f"{self.corner} returned outputs that cannot be stacked across lanes: every lane's "
                f"action must have the same keys and shapes ({err})"
            ) from None

    def _first_of_chunk(self, leaf: np.ndarray) -> np.ndarray:
        if leaf.ndim < 2:
            raise ModelOutputError(
                f"{self.corner} returned shape {leaf.shape}: expected chunks [K, H, ...]"
            )
        return leaf[:, 0]

    # ------------------------------------------------------------------ the stateful-model probe

    @property
    def needs_probe(self) -> bool:
        """Whether ``check_stateless`` calls the model at all: not for a model that declares
        ``stateless = True``, nor for a corner that takes a ``context`` (its memory lives in
        each episode's context by design)."""
        return not getattr(self.model, "stateless", False) and self.contexts is None

    async def check_stateless(self, sample_a: Any, sample_b: Any) -> None:
        """Refuse a model whose output depends on earlier calls: lanes cannot share it.

        With ``num_envs > 1`` one model serves every lane, so a model that keeps state across
        calls (a step counter, a recurrent state, a remembered observation) would mix the lanes'
        histories. The probe cannot see state directly; it looks for its effect on outputs.

        The quick check, ``QUICK_PROBE_CALLS`` = 5 one-lane calls: ``a, a`` (the noise floor:
        a deterministic model answers twice the same), then ``a, b, a`` (drift: a model that
        counts its calls or remembers its last input answers the last ``a`` differently). If
        all four outputs for ``a`` are identical, the model passes. Otherwise the outputs
        cannot tell noise from state, and the statistical check decides, with
        ``3 * PROBE_ROUNDS`` = 48 more calls on the sequence ``b, a, a``: the 32 outputs for
        ``a`` are, for a pure model, draws of one distribution, so their order says nothing.
        *Drift* is order that the noise cannot explain, in any output element: the rank
        correlation of the ``a`` outputs with the call count reaching ``PROBE_THRESHOLD`` =
        0.9 (state that grows, like a counter or running statistics), or the rank-biserial
        correlation between those that followed ``b`` and those that followed ``a`` reaching
        ``PROBE_SPLIT_THRESHOLD`` = 0.99 (state that remembers recent inputs: the two groups
        do not overlap). Pure noise gets there with odds below 1e-8 per element, so a noisy
        pure model passes. A state that changes the output once, cycles with the call count,
        or hides under much larger noise, can slip through.

        No call is made when ``needs_probe`` is false. The probe's calls are not the run's:
        they count in no telemetry and in no episode. An error the model raises here (or an
        output of the wrong kind) is raised as an ``RlmeshError`` that says it came from the
        probe.

        Args:
            sample_a, sample_b: two one-lane payloads, batched with K = 1 as ``predict`` takes
                them, preferably different observations.

        Raises:
            StatefulModelError: drift found; the message says what was seen and what to do.
            ModelOutputError, ModelError: the model failed on a probe call.

        Example:
            >>> import asyncio
            >>> calls = []
            >>> handler = ModelHandler(lambda obs: calls.append(obs) or obs * 2)
            >>> asyncio.run(handler.check_stateless(np.zeros((1, 2)), np.ones((1, 2))))
            >>> len(calls)  # a deterministic model: the quick check alone
            5
        """
        if not self.needs_probe:
            return
        try:
            outputs = [
                _numbers(await self._probe_call(sample))
                for sample in (sample_a, sample_a, sample_a, sample_b, sample_a)
            ]
            outputs_a = outputs[:3] + outputs[4:]
            if all(_identical(outputs_a[0], output) for output in outputs_a[1:]):
                return
            await self._statistical_check(sample_a, sample_b)
        except StatefulModelError:
            raise
        except Exception as err:
            raise self._probe_failure(err) from err

    async def _statistical_check(self, sample_a: Any, sample_b: Any) -> None:
        outputs_a: list[np.ndarray] = []
        follows_b: list[bool] = []
        for _ in range(PROBE_ROUNDS):
            await self._probe_call(sample_b)
            for after_b in (True, False):
                outputs_a.append(_numbers(await self._probe_call(sample_a)))
                follows_b.append(after_b)
        # Chunks may change length between calls: compare the elements every output has.
        size = min(output.size for output in outputs_a)
        table = np.stack([output[:size] for output in outputs_a])  # [calls, elements]
        calls = np.arange(len(outputs_a), dtype=np.float64)
        after_b = np.array(follows_b)
        for name, statistic, correlation_of, threshold in (
            (
                "the number of earlier calls",
                "rank correlation",
                lambda values: _rank_correlation(values, calls),
                PROBE_THRESHOLD,
            ),
            (
                "which input came just before it",
                "rank-biserial correlation",
                lambda values: _rank_biserial(values, after_b),
                PROBE_SPLIT_THRESHOLD,
            ),
        ):
            for element in range(size):
                correlation = correlation_of(table[:, element])
                if abs(correlation) >= threshold:
                    raise StatefulModelError(
                        self._stateful_message(name, element, statistic, correlation, threshold)
                    )

    async def _probe_call(self, sample: Any) -> Any:
        if self._synchronous and self._loaded:
            return self.predict_now(sample, 1)
        return await self.predict(sample, 1)

    def _probe_failure(self, err: Exception) -> RlmeshError:
        """``err``, raised by a probe call, as the error of the same kind saying so."""
        where = (
            f"during the statefulness probe (before the first round: {type(self.model).__name__}"
            f".{self.corner} was called on one lane's observation, K = 1, to check that lanes "
            f"can share it; set `stateless = True` on the model class to skip the probe)"
        )
        if isinstance(err, RlmeshError):
            try:
                return type(err)(f"{err} {where}")
            except TypeError:  # an error class of the user's, built otherwise
                pass
        return ModelError(f"model.{self.corner} raised {err!r} {where}")

    def _stateful_message(
        self, name: str, element: int, statistic: str, correlation: float, threshold: float
    ) -> str:
        return (
            f"{type(self.model).__name__}.{self.corner} keeps state across calls, so lanes "
            f"cannot share it (num_envs > 1): called {2 * PROBE_ROUNDS} times on one fixed "
            f"observation with another one in between, element {element} of its output tracked "
            f"{name} ({statistic} {correlation:+.2f}; outputs that vary by noise alone stay "
            f"below {threshold}). Keep what the model remembers per episode: declare a "
            f"`context` parameter on {self.corner} and keep it in context['state'] (one "
            f"dict per episode), or carry history in the observation (stack= in the "
            f"ModelSpec); or run with num_envs=1, where one lane owns the model"
        )


# ----------------------------------------------------------------------------------------------
# Helpers: what the model is, how its corner is called, and payload / output trees


def _as_model(model: Any) -> Model:
    if isinstance(model, type):
        raise ModelDefinitionError(
            f"model is the class {model.__name__}, not an instance: pass {model.__name__}()"
        )
    if isinstance(model, Model):
        return model
    if callable(model):
        return Model(model)
    raise ModelDefinitionError(
        f"model must be a rlmesh.Model instance or a callable fn(obs) -> action, got "
        f"{type(model).__name__}, which defines none of {', '.join(CORNERS)}"
    )


def _corner_call(method: Callable[..., Any], corner: str, horizon: int) -> Callable[..., Any]:
    """``method`` as a call ``call(obs, **extra)``; chunk corners get ``horizon`` if they
    accept it."""
    if "chunk" not in corner:
        return method
    parameters = inspect.signature(method).parameters.values()
    if any(
        parameter.name == "execution_horizon" or parameter.kind is parameter.VAR_KEYWORD
        for parameter in parameters
    ):
        return lambda obs, **extra: method(obs, execution_horizon=horizon, **extra)
    positional = [p for p in parameters if p.kind in POSITIONAL and p.name != CONTEXT_PARAMETER]
    if len(positional) >= 2:
        # A second positional parameter, named otherwise.
        return lambda obs, **extra: method(obs, horizon, **extra)
    return method


def _takes_an_argument(method: Callable[..., Any]) -> bool:
    """Whether the bound ``method`` accepts one positional argument."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(parameter.kind in POSITIONAL for parameter in parameters)


def _is_async(fn: Any) -> bool:
    """``fn`` is an ``async def`` function, or a callable object whose ``__call__`` is one."""
    return fn is not None and (
        inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)
    )


def _stacked_numbers(outputs: list[Any]) -> np.ndarray | None:
    """Per-lane outputs stacked in one ``np.asarray`` when every lane returned a number or an
    array of one shape (the common case, kept cheap); None otherwise."""
    try:
        stacked = np.asarray(outputs)
    except ValueError:  # ragged: the general path says which lanes disagree
        return None
    return None if stacked.dtype == object else stacked


async def _resolved(value: Any) -> Any:
    """``value``, awaited if it is awaitable (an ``async`` corner or lifecycle method)."""
    if inspect.isawaitable(value):
        return await value
    return value


def _arrays(output: Any) -> Any:
    return map_leaves(output, np.asarray)


def _lane(payload: Any, lane: int) -> Any:
    """One lane's input from a fused payload: every array and text list indexed at ``lane``."""
    return map_leaves(payload, lambda leaf: leaf[lane])


def _numbers(output: Any) -> np.ndarray:
    """Every element of an output as one float vector, for the probe to compare."""
    parts = []
    for path, leaf in leaves(output):
        if leaf.dtype.kind not in "biuf":
            raise ModelOutputError(
                f"{path_text('output', path)} has dtype {leaf.dtype}: expected booleans, "
                f"integers or floats"
            )
        parts.append(leaf.astype(np.float64).ravel())
    return np.concatenate(parts)


def _identical(first: np.ndarray, other: np.ndarray) -> bool:
    """The same elements, nan equal to nan (a deterministic model may answer nan)."""
    return first.shape == other.shape and bool(np.array_equal(first, other, equal_nan=True))


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing their average rank."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    return (ends - (counts - 1) / 2)[inverse.ravel()]


def _rank_biserial(values: np.ndarray, in_group: np.ndarray) -> float:
    """The rank-biserial correlation of ``values`` between ``in_group`` and the rest: twice
    the difference of their mean ranks over the count; +1 when every value in the group lies
    above every other one, 0 when either group is empty or all values tie."""
    n = len(values)
    inside = int(in_group.sum())
    if inside in (0, n):
        return 0.0
    ranks = _ranks(values)
    return float(2 * (ranks[in_group].mean() - ranks[~in_group].mean()) / n)


def _rank_correlation(values: np.ndarray, pattern: np.ndarray) -> float:
    """Spearman's correlation of ``values`` with ``pattern``; 0 when either is constant."""
    x = _ranks(values)
    y = _ranks(pattern)
    x -= x.mean()
    y -= y.mean()
    scale = np.sqrt((x @ x) * (y @ y))
    return float(x @ y / scale) if scale > 0 else 0.0


__all__ = [
    "CORNERS",
    "QUICK_PROBE_CALLS",
    "Model",
    "ModelHandler",
    "RoundModel",
    "Route",
    "defined_corners",
]
