"""The model handler: how a run calls a model (``ModelHandler``), and what the core calls
(``RoundModel``, which the handler is).

``ModelHandler`` is how the driver calls a model: once per group step, for the K lanes that need
an action, through the most specific corner that exists. Missing corners are derived: per-lane
corners are called lane by lane and stacked, and a chunk corner serves an un-chunked run by
asking for horizon 1 and keeping the first action.

Example:
    >>> import asyncio
    >>> import numpy as np
    >>> from rlmesh.model import Model
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
from typing import TYPE_CHECKING, Any

import numpy as np

from ..contexts import CONTEXT_PARAMETER, EpisodeContexts, accepts_context
from ..errors import (
    ModelDefinitionError,
    ModelOutputError,
    call_failure,
)
from ..utils import leaves, map_leaves, path_text
from .base import CHUNKED_ORDER, CORNERS, POSITIONAL, UNCHUNKED_ORDER, Model, Route, defined_corners
from .probe import check_stateless

if TYPE_CHECKING:
    import gymnasium

    from ..adapters import ModelSpec, Plan
    from .tensors import TensorBridge


class ModelHandler:
    """Calls a user model the way the driver needs: once per group step, for the lanes that need
    an action.

    Args:
        model: a ``Model`` (subclass) instance, or a bare callable (taken as ``predict``).
        execution_horizon: ``E >= 1``, the actions a lane replays from one chunk. ``E > 1``
            asks for chunks; a model without a chunk corner warns once and runs un-chunked.
        ensemble: the run averages chunks (temporal ensembling): the model's chunk corner is
            called at every step with ``execution_horizon=None`` (its whole chunk), and
            ``predict`` returns chunks. Needs ``execution_horizon=1`` and a chunk corner.

    Attributes:
        model: the wrapped ``Model``.
        spec: the model's ``spec`` attribute, None when it has none.
        chunked: whether ``predict`` returns chunks ``[K, H, ...]`` rather than ``[K, ...]``.
        corner: the corner ``predict`` calls.

    Raises:
        ModelDefinitionError: ``model`` is a class, not an instance, or defines no corner (a
            ``TypeError`` too), or an ``ensemble`` run's model has no chunk corner.
        ValueError: ``ensemble`` with ``execution_horizon > 1``.
    """

    def __init__(self, model: Any, *, execution_horizon: int = 1, ensemble: bool = False) -> None:
        self.model = _as_model(model)
        # A framework model's converter (rlmesh.model.tensors), asked once; None: numpy.
        self._bridge: TensorBridge | None = self.model.tensor_bridge()
        self.spec: ModelSpec | None = getattr(self.model, "spec", None)

        self._defined = defined_corners(self.model)
        if not self._defined:
            raise ModelDefinitionError(
                f"{type(self.model).__name__} defines none of the four predict corners "
                f"({', '.join(CORNERS)}): override at least one in the Model subclass (e.g. "
                f"`def predict(self, obs): return action`), or pass a function fn(obs) -> "
                f"action, or Model(fn)"
            )
        if ensemble and execution_horizon > 1:
            raise ValueError(
                f"temporal ensembling executes one averaged action per step, and "
                f"execution_horizon={execution_horizon} replays several actions of one chunk: "
                f"pass one of them"
            )
        has_chunks = any(corner in self._defined for corner in CHUNKED_ORDER)
        if ensemble and not has_chunks:
            raise ModelDefinitionError(
                f"temporal ensembling averages chunks, but {type(self.model).__name__} defines "
                f"neither predict_chunk nor predict_chunk_batch: define one that returns the "
                f"model's chunk [H, ...] (or [K, H, ...]), or run without ensemble="
            )
        self.ensemble = ensemble
        wants_chunks = execution_horizon > 1 or ensemble
        self.chunked = wants_chunks and has_chunks
        if wants_chunks and not self.chunked:
            warnings.warn(
                f"execution_horizon={execution_horizon} but {type(self.model).__name__} has no "
                f"chunk corner (predict_chunk or predict_chunk_batch): running un-chunked, one "
                f"action per prediction",
                UserWarning,
                stacklevel=2,
            )
        self.execution_horizon = execution_horizon
        # An ensemble keeps every action of a chunk, so the corner is asked for all of them.
        self._horizon_asked: int | None = (
            None if ensemble else execution_horizon if self.chunked else 1
        )
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
        # A framework model converts once per call: a synchronous batched corner inside one
        # wrapper the bridge makes (its cheapest form); any other corner in _calls / _combined.
        self._converts = self._bridge is not None
        if self._bridge is not None and self._batched and self._synchronous:
            self._call = self._bridge.around(self._call, context=self.contexts is not None)
            self._converts = False

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
            on_route(
                Route(
                    env,
                    observation_space,
                    action_space,
                    plan,
                    self.execution_horizon,
                    self.ensemble,
                )
            )

    def with_horizon(self, execution_horizon: int) -> ModelHandler:
        """A handler of the same model for runs of another ``execution_horizon``, sharing this
        one's load: a served model answers drivers of several horizons. Closing it does
        nothing (this handler closes the model)."""
        other = ModelHandler(
            self.model, execution_horizon=execution_horizon, ensemble=self.ensemble
        )
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
            await resolved(self.model.load())
            self._loaded = True

    async def episode_end(self, episode_id: int) -> None:
        """``model.on_episode_end(episode_id)`` (or ``on_episode_end()`` when it takes no
        argument), then ``model.reset()``."""
        if self._end_takes_id:
            await resolved(self.model.on_episode_end(episode_id))
        else:
            await resolved(self.model.on_episode_end())
        await resolved(self.model.reset())

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
            await resolved(self.model.close())

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
            a shorter chunk only means the lane re-plans sooner (docs/semantics.md, "Action
            chunks").

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
        return self.combine([await resolved(output) for output in calls], num_lanes)

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
        what ``predict_now`` does on an array payload. None too for a model with a tensor
        bridge: ``predict_now`` converts the whole batch once, where rows would be converted
        one by one."""
        if self.corner == "predict" and self.contexts is None and self._bridge is None:
            return self._call
        return None

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
        if self._converts:  # once for the whole batch; lanes get parts of it
            payload = self._bridge.to_model(payload)
        if self._batched:
            return [
                self._call(payload) if contexts is None else self._call(payload, context=contexts)
            ]
        if self._converts:
            inputs = self._bridge.lanes(payload, num_lanes)
        elif isinstance(payload, np.ndarray):
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
        if self._converts:  # the framework's tensors as numpy, once per call
            if self._batched:
                outputs = [self._bridge.from_model(outputs[0])]
            else:
                outputs = self._bridge.from_lanes(outputs)
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

    @property
    def needs_probe(self) -> bool:
        """Whether ``check_stateless`` calls the model at all: not for a model that declares
        ``stateless = True``, nor for a corner that takes a ``context`` (its memory lives in
        each episode's context by design)."""
        return not getattr(self.model, "stateless", False) and self.contexts is None

    async def check_stateless(self, sample_a: Any, sample_b: Any) -> None:
        """Refuse a model whose output depends on earlier calls (``rlmesh.model.probe``)."""
        await check_stateless(self, sample_a, sample_b)

    async def probe_call(self, sample: Any) -> Any:
        """The model's output for one probe input, a call that counts in no telemetry."""
        if self._synchronous and self._loaded:
            return self.predict_now(sample, 1)
        return await self.predict(sample, 1)


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


def _corner_call(
    method: Callable[..., Any], corner: str, horizon: int | None
) -> Callable[..., Any]:
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


async def resolved(value: Any) -> Any:
    """``value``, awaited if it is awaitable (an ``async`` corner or lifecycle method)."""
    if inspect.isawaitable(value):
        return await value
    return value


def _arrays(output: Any) -> Any:
    return map_leaves(output, np.asarray)


def _lane(payload: Any, lane: int) -> Any:
    """One lane's input from a fused payload: every array and text list indexed at ``lane``."""
    return map_leaves(payload, lambda leaf: leaf[lane])
