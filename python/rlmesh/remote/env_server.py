"""Serving an env over rlmesh-wire-v1: ``serve_env`` and the ``rlmesh.env.v1.EnvService``.

The served env is any ``env=`` ``rlmesh.run`` accepts, turned into ``Lanes`` by
``rlmesh.lanes.make_lanes``. A driver handshakes (``EnvContract``: spaces, ``num_envs``,
metadata), then opens one ``Join`` stream and sends requests one at a time, each answered in
order with its ``request_id``:

- ``ConfigureEnv`` (optional, first when sent): the edition the driver pins; only ``2026.06``;
- ``Reset``: all lanes, or the ``env_indices`` given, with ``seeds`` and driver-minted
  ``episode_ids`` aligned to them by position; the ``trial_index`` reset option is an int (every
  lane) or a list aligned with ``env_indices``;
- ``Step``: all lanes, or the ``env_indices`` given (any subset, when the lanes step alone:
  capability ``subset_step``), the action's rows aligned to them; the answer's rows align to
  the same lanes, and ``completed_episodes`` reports the episodes that ended, with the ids the
  driver handed in;
- ``Render``: one lane's frame (``env_indices=[k]``; none with one lane), what its env's
  ``render()`` returns as PNG, when the envs render in ``rgb_array`` mode (the contract's
  ``render_mode``, with ``render_fps`` in its metadata); no frame from envs that do not render;
- ``Close``: ends the session.

Infos travel as a ``MetaMap``: a one-lane server sends the lane's info as it is; a wider one
sends Gymnasium's vector form over the rows of the answer (each key a list of one value per
row, and ``_key`` the list of rows that have it).

Errors are answered in-band as ``EnvError`` (edition 2026.06): an action that does not fit the
action space (a wrong leaf count or byte length, a ``Discrete`` value out of its domain, NaN)
is ``INVALID_ACTION`` and recoverable (the action is never delivered); a step before its
lane's reset is ``NOT_READY``; a second session while one is open is ``BUSY``; an env that
raised is ``INTERNAL``, a request past its ``timeout_ms`` is ``TIMEOUT``: those two are not
recoverable, the env's state being unknown, and end the session. A ``render()`` that raised
is the exception: it changed nothing a step reads, so that render alone fails
(``UNSUPPORTED``, recoverable, its message naming the lane and the env's exception) and the
session goes on. A ``Join`` whose first message does not arrive within
``first_message_timeout`` seconds is cancelled.

Example:
    >>> import rlmesh
    >>> with rlmesh.serve_env("CartPole-v1", num_envs=2) as server:
    ...     env = rlmesh.RemoteEnv(server.address)
    ...     result = rlmesh.run(lambda obs: int(obs[2] > 0), env, episodes=3)
    >>> [episode.index for episode in result.episodes]
    [0, 1, 2]
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from typing import Any

import grpc
import gymnasium
import numpy as np
from gymnasium import spaces

from ..adapters import ENV_TAGS_CONTRACT_KEY, EnvTags, checked_env_tags, env_tags_of
from ..errors import EnvError
from ..lanes import Lanes, make_lanes
from ..lanes.base import (
    SAME_STEP,
    TRIAL_INDEX_FLAG,
    TRIAL_INDEX_OPTION,
    lanes_accepts_trial_index,
    lanes_autoreset,
    lanes_render_fps,
    lanes_rendering,
)
from ..spaces import batch_leaves, leaf_shape, space_leaves
from ..utils import positive_int
from .codec import (
    WORKFLOW_EDITION,
    SpaceCodec,
    WireFormatError,
    from_meta_map,
    meta_map,
    space_spec,
)
from .connection import DEFAULT_MAX_MESSAGE_MB, Server, handshake_response, wire_transport
from .png import encode_png
from .protocol import (
    RENDER_FPS_KEY,
    SPEC_METADATA,
    SUBSET_STEP,
    RequestError,
    split_rows,
    vector_infos,
)
from .wire.core.v1 import env_contract_pb2, handshake_pb2
from .wire.env.v1 import interaction_pb2 as wire
from .wire.env.v1 import service_pb2, service_pb2_grpc

COMPONENT = "rlmesh-env"

Code = wire.EnvErrorCode


def serve_env(
    env: Any,
    address: str = "127.0.0.1:0",
    *,
    num_envs: int | None = None,
    workers: int = 1,
    token: str | None = None,
    max_message_mb: float = DEFAULT_MAX_MESSAGE_MB,
    allow_shutdown: bool = False,
    first_message_timeout: float = 10.0,
    env_tags: Any = None,
    core: str | None = None,
) -> Server:
    """Serve ``env`` at ``address`` (rlmesh-wire-v1) until the returned ``Server`` closes.

    Args:
        env: what ``rlmesh.run``'s ``env=`` takes: a Gymnasium id, a ``gymnasium.Env``, a
            zero-argument factory, a ``VectorEnv`` or ``Lanes``.
        address: ``host:port``, ``tcp://host:port`` (port 0 picks one; read
            ``server.address``) or ``unix:///path``. Loopback unless you name another host.
        num_envs: the lanes to build from an id or a factory (default 1); a vector serves
            its own width.
        workers: step the lanes in this many worker processes (``rlmesh.lanes.ProcessLanes``,
            built there from an id or a module-level factory), so a slow simulator's lanes
            step in parallel on the server; 1 (the default) steps them in the server's
            process. A driver sees the same episodes either way.
        token: require ``authorization: Bearer <token>`` on every call (else UNAUTHENTICATED,
            before the env is touched).
        max_message_mb: the largest message accepted or sent, in MiB.
        allow_shutdown: accept the ``Shutdown`` RPC (refused by default).
        first_message_timeout: seconds a new ``Join`` stream may wait for its first message.
        env_tags: the env's role tags (``rlmesh.adapters.EnvTags``, their v1 dict or JSON
            text), published in the contract's metadata so a driver's role-based model spec
            resolves against them; default: the tags in the env's own ``metadata``.
        core: whose transport serves it: ``"rust"`` (the Rust core's, tonic) or ``"python"``
            (grpcio); default the active core.

    Returns:
        The running ``Server`` (``.address``, ``.wait()``, ``.close()``, a context manager).
        Closing it closes the env.

    Example:
        >>> server = serve_env("Pendulum-v1", num_envs=4)
        >>> server.address.startswith("tcp://127.0.0.1:")
        True
        >>> server.close()

        A simulator's 8 lanes in 2 worker processes (in a script, under
        ``if __name__ == "__main__":``, as any program that starts processes)::

            server = serve_env("Hopper-v5", num_envs=8, workers=2)
    """
    tags = None if env_tags is None else checked_env_tags("serve_env(env_tags=...)", env_tags)
    lanes = make_lanes(env, num_envs=num_envs, workers=positive_int("workers", workers))
    try:
        servicer = EnvServicer(
            lanes,
            core=core,
            allow_shutdown=allow_shutdown,
            first_message_timeout=first_message_timeout,
            env_tags=tags,
        )
        server = Server.start(
            address,
            services=[
                lambda host: service_pb2_grpc.add_EnvServiceServicer_to_server(servicer, host)
            ],
            component=COMPONENT,
            token=token,
            max_message_mb=max_message_mb,
            on_close=servicer.close,
            core=core,
        )
    except BaseException:
        lanes.close()
        raise
    servicer.server = server
    return server


def env_contract(lanes: Lanes, env_tags: EnvTags | None = None) -> env_contract_pb2.EnvContract:
    """What the handshake tells a driver of ``lanes``: spaces, width, metadata (the spec's
    fields, the trial-index flag, the role tags: ``env_tags``, else the lanes' own), autoreset."""
    metadata: dict[str, Any] = {}
    if lanes_accepts_trial_index(lanes):
        metadata[TRIAL_INDEX_FLAG] = True
    tags = env_tags or env_tags_of(lanes.metadata)
    if tags is not None:
        metadata[ENV_TAGS_CONTRACT_KEY] = tags.to_dict()
    spec = lanes.spec
    if spec is not None:
        for key, field in SPEC_METADATA.items():
            value = getattr(spec, field, None)
            if value is not None:
                metadata[key] = value
    rendering = lanes_rendering(lanes)
    render_mode = "" if rendering is None else rendering.render_mode or ""
    fps = lanes_render_fps(lanes) if render_mode else None
    if fps:
        metadata[RENDER_FPS_KEY] = float(fps)
    if lanes.resets_itself:
        autoreset = (
            env_contract_pb2.AUTORESET_MODE_SAME_STEP
            if lanes_autoreset(lanes) == SAME_STEP
            else env_contract_pb2.AUTORESET_MODE_NEXT_STEP
        )
    else:
        autoreset = env_contract_pb2.AUTORESET_MODE_DISABLED
    return env_contract_pb2.EnvContract(
        spec=env_contract_pb2.EnvSpec(
            id=lanes.name,
            observation_space=space_spec(lanes.single_observation_space, "observation_space"),
            action_space=space_spec(lanes.single_action_space, "action_space"),
            metadata=meta_map(metadata),
        ),
        num_envs=lanes.num_lanes,
        render_mode=render_mode,
        autoreset_mode=autoreset,
    )


class EnvServicer(service_pb2_grpc.EnvServiceServicer):
    """``rlmesh.env.v1.EnvService`` over ``lanes``: one ``Join`` session at a time."""

    def __init__(
        self,
        lanes: Lanes,
        *,
        allow_shutdown: bool = False,
        first_message_timeout: float = 10.0,
        env_tags: EnvTags | None = None,
        core: str | None = None,
    ) -> None:
        self.lanes = lanes
        self.server: Server | None = None
        self.allow_shutdown = allow_shutdown
        self.first_message_timeout = first_message_timeout
        self.contract = env_contract(lanes, env_tags)
        self.capabilities = {} if lanes.lockstep else {SUBSET_STEP: "true"}
        self._session_slot = threading.Lock()
        # Held by whatever runs an env call, so an op abandoned at its deadline keeps the env
        # from the next request until it returns.
        self._env_lock = threading.Lock()
        self._deadline_pool: futures.ThreadPoolExecutor | None = None
        self.core = wire_transport(core)
        self._session = Session(self)

    # ---------------------------------------------------------------- unary calls

    def Handshake(  # noqa: N802 - the gRPC method's name
        self, request: service_pb2.HandshakeRequest, context: grpc.ServicerContext
    ) -> service_pb2.HandshakeResponse:
        base = handshake_response(request.base, COMPONENT, self.capabilities)
        return service_pb2.HandshakeResponse(
            base=base, env_contract=self.contract if base.compatible else None
        )

    def Shutdown(  # noqa: N802
        self, request: service_pb2.ShutdownRequest, context: grpc.ServicerContext
    ) -> service_pb2.ShutdownResponse:
        if not self.allow_shutdown or self.server is None:
            return service_pb2.ShutdownResponse(
                base=handshake_pb2.ShutdownResponse(
                    accepted=False,
                    message="remote shutdown is disabled for this env server: serve it with "
                    "allow_shutdown=True to allow it",
                )
            )
        # Closing waits for open calls, this one included: it must happen after we answer.
        threading.Thread(target=self.server.close, name="rlmesh-env-shutdown").start()
        reason = request.base.reason or "no reason given"
        return service_pb2.ShutdownResponse(
            base=handshake_pb2.ShutdownResponse(accepted=True, message=f"shutting down: {reason}")
        )

    # ---------------------------------------------------------------- the session stream

    def Join(  # noqa: N802
        self, request_iterator: Iterator[wire.JoinRequest], context: grpc.ServicerContext
    ) -> Iterator[wire.JoinResponse]:
        # Clients that wait for the response headers before sending (tonic's do) get them now.
        context.send_initial_metadata(())
        # An idle client that never sends must not hold a thread (or the session) for good.
        watchdog = threading.Timer(self.first_message_timeout, context.cancel)
        watchdog.daemon = True
        watchdog.start()
        if not self._session_slot.acquire(blocking=False):
            try:
                first = next(request_iterator, None)
            finally:
                watchdog.cancel()
            if first is not None:
                yield _error_response(
                    first.request_id,
                    RequestError(
                        Code.ENV_ERROR_CODE_BUSY,
                        "this env server already has an open session (one driver at a time): "
                        "wait for it to close, or serve another instance",
                        recoverable=True,
                    ),
                )
            return
        session = self._session
        try:
            session.open()
            first = True
            for request in request_iterator:
                if first:
                    watchdog.cancel()
                    first = False
                response, end = session.handle(request)
                yield response
                if end:
                    return
        finally:
            watchdog.cancel()
            session.end()
            self._session_slot.release()

    # ---------------------------------------------------------------- env calls

    def call_env(
        self, fn: Callable[..., Any], args: tuple[Any, ...], timeout_ms: int, doing: str
    ) -> Any:
        """``fn(*args)`` under the env lock; past ``timeout_ms`` (0: none) a TIMEOUT error, the
        call left to finish on its own thread (holding the env until it does)."""
        try:
            if not timeout_ms:
                with self._env_lock:
                    return fn(*args)
            return self._run_with_deadline(fn, args, timeout_ms, doing)
        except RequestError:
            raise
        except Exception as err:
            raise RequestError(
                Code.ENV_ERROR_CODE_INTERNAL,
                f"the served env's {doing} raised {type(err).__name__}: {err}",
                recoverable=False,
            ) from err

    def _run_with_deadline(
        self, fn: Callable[..., Any], args: tuple[Any, ...], timeout_ms: int, doing: str
    ) -> Any:
        if self._deadline_pool is None:
            self._deadline_pool = futures.ThreadPoolExecutor(1, thread_name_prefix="rlmesh-env")

        def locked() -> Any:
            with self._env_lock:
                return fn(*args)

        future = self._deadline_pool.submit(locked)
        try:
            return future.result(timeout=timeout_ms / 1000)
        except futures.TimeoutError:
            raise RequestError(
                Code.ENV_ERROR_CODE_TIMEOUT,
                f"{doing} did not finish within its timeout_ms={timeout_ms}; the env's state is "
                f"unknown, so the session ends",
                recoverable=False,
            ) from None

    def close(self) -> None:
        """Release the env (the ``Server``'s ``on_close``)."""
        if self._deadline_pool is not None:
            self._deadline_pool.shutdown(wait=False, cancel_futures=True)
        self.lanes.close()


class Session:
    """The state of the open ``Join`` session: which lanes run an episode, with what id, seed,
    steps and reward so far."""

    def __init__(self, servicer: EnvServicer) -> None:
        self.servicer = servicer
        lanes = servicer.lanes
        self.lanes = lanes
        self.num_lanes = lanes.num_lanes
        self.all_lanes = np.arange(self.num_lanes, dtype=np.int64)
        self.observation_codec = SpaceCodec(lanes.single_observation_space)
        self.action_codec = SpaceCodec(lanes.single_action_space)
        self.observation_space = lanes.single_observation_space
        self.action_checks = ValueChecks(lanes.single_action_space, "action")
        self.observation_checks = ValueChecks(lanes.single_observation_space, "observation")
        # How a request's lanes step: the core steps in-process lanes' envs itself (their
        # ``env_steps``), other lanes step through ``Lanes.step``.
        self._step_all = (
            self._lanes_step
            if lanes.env_steps is None
            else servicer.core.ServedSteps(
                lanes.env_steps, lanes.name, self._step_observation_leaves, self._plain_layout()
            ).step
        )
        self.open()

    def _plain_layout(self) -> tuple[np.dtype[Any], tuple[int, ...], Any] | None:
        """The observation space's one numeric leaf as ``ServedSteps`` takes it, or None."""
        rule = self.observation_checks.plain_rule
        if rule is NO_PLAIN_RULE:
            return None
        space = self.observation_space
        return space.dtype, leaf_shape(space), rule

    def open(self) -> None:
        n = self.num_lanes
        self._last_step_indices: list[int] = []
        self._last_step_lanes = self.all_lanes
        self.episodes = self.servicer.core.ServedEpisodes(n)
        self.episode_ids = np.full(n, "", dtype=object)
        self.seeds: list[int | None] = [None] * n
        self.started_ns = np.zeros(n, dtype=np.int64)

    def end(self) -> None:
        self.episodes.stop()

    def handle(self, request: wire.JoinRequest) -> tuple[wire.JoinResponse, bool]:
        """The answer to one request, and whether the session ends with it."""
        started = time.perf_counter_ns()
        kind = request.WhichOneof("kind")
        try:
            if kind == "step":
                # Filled in place: a StepResponse handed to JoinResponse(step=) is copied.
                response = wire.JoinResponse()
                self.step(request.step, response.step)
            elif kind == "reset":
                response = wire.JoinResponse(reset=self.reset(request.reset))
            elif kind == "configure":
                response = wire.JoinResponse(configure=self.configure(request.configure))
            elif kind == "render":
                response = wire.JoinResponse(render=self.render(request.render))
            elif kind == "close":
                response = wire.JoinResponse(
                    close=wire.CloseEnvsResponse(final_episodes=self.interrupt_all())
                )
                response.request_id = request.request_id
                return response, True
            else:
                raise RequestError(
                    Code.ENV_ERROR_CODE_UNSUPPORTED,
                    "an empty or unknown Join request: expected configure, reset, step, render "
                    "or close",
                    recoverable=True,
                )
        except RequestError as err:
            if not err.recoverable:
                self.interrupt_all()
            return _error_response(request.request_id, err), not err.recoverable
        response.request_id = request.request_id
        response.endpoint_total_ns = time.perf_counter_ns() - started
        return response, False

    # ---------------------------------------------------------------- requests

    def configure(self, request: wire.ConfigureEnvRequest) -> wire.ConfigureEnvResponse:
        edition = request.selected_workflow_edition
        if edition and edition != WORKFLOW_EDITION:
            raise RequestError(
                Code.ENV_ERROR_CODE_UNSUPPORTED,
                f"the driver pinned workflow edition {edition!r}; this server follows only "
                f"{WORKFLOW_EDITION!r}",
                recoverable=False,
            )
        return wire.ConfigureEnvResponse()

    def reset(self, request: wire.ResetRequest) -> wire.ResetResponse:
        lanes = self._lanes_of(request.env_indices, "ResetRequest")
        count = len(lanes)
        for name, values in (("seeds", request.seeds), ("episode_ids", request.episode_ids)):
            if len(values) not in (0, count):
                raise RequestError(
                    Code.ENV_ERROR_CODE_INVALID_ACTION,
                    f"ResetRequest.{name} has {len(values)} entries for {count} lanes: give one "
                    f"per lane reset (aligned with env_indices), or none",
                    recoverable=True,
                )
        seeds: list[int | None] = list(request.seeds) if len(request.seeds) else [None] * count
        trials = self._trials(from_meta_map(request.options), count)
        observations, infos = self.servicer.call_env(
            self.lanes.reset, (lanes, seeds, trials), request.timeout_ms, "reset"
        )
        observation = self._observation_leaves(observations, lanes, "reset")
        self.episodes.start(lanes)
        self.started_ns[lanes] = time.time_ns()
        self.episode_ids[lanes] = list(request.episode_ids) or [""] * count
        for lane, seed in zip(lanes.tolist(), seeds, strict=True):
            self.seeds[lane] = seed
        response = wire.ResetResponse(infos=self._encode_infos(infos))
        response.observation.leaves.extend(observation)
        return response

    def step(self, request: wire.StepRequest, out: wire.StepResponse) -> None:
        """Step the request's lanes and write the answer into ``out``."""
        lanes, indices = self._step_lanes(request.env_indices)
        count = len(lanes)
        idle = self.episodes.not_running(lanes)
        if idle:
            raise RequestError(
                Code.ENV_ERROR_CODE_NOT_READY,
                f"lanes {idle} have no running episode (never reset, or it "
                f"ended): reset them before stepping them",
                recoverable=True,
            )
        try:
            actions = self.action_codec.decode(request.action, count)
        except WireFormatError as err:
            raise RequestError(
                Code.ENV_ERROR_CODE_INVALID_ACTION,
                f"StepRequest.action for lanes {lanes.tolist()} does not fit the action space "
                f"{self.action_codec.space}: {err}",
                recoverable=True,
            ) from None
        problem = self.action_checks.first_failure(actions)
        if problem is not None:
            row, message = problem
            raise RequestError(
                Code.ENV_ERROR_CODE_INVALID_ACTION,
                f"the action for lane {int(lanes[row])}: {message}; it was not delivered",
                recoverable=True,
            )
        leaves, rewards, terminated, truncated, infos = self.servicer.call_env(
            self._step_all, (lanes, actions), request.timeout_ms, "step"
        )
        self.episodes.add(lanes, rewards)
        out.observation.leaves.extend(leaves)
        out.rewards.extend(rewards)
        out.terminated_mask = terminated
        out.truncated_mask = truncated
        if any(infos):
            out.infos.CopyFrom(self._encode_infos(infos))
        out.env_indices[:] = indices  # from a list: far cheaper than from the request's field
        if terminated.count(0) != count or truncated.count(0) != count:
            ended = np.frombuffer(terminated, np.bool_) | np.frombuffer(truncated, np.bool_)
            out.completed_episodes.extend(
                self._complete(
                    int(lanes[row]), bool(terminated[row]), bool(truncated[row]), infos[row]
                )
                for row in np.flatnonzero(ended).tolist()
            )

    def _lanes_step(
        self, lanes: np.ndarray, actions: Any
    ) -> tuple[list[bytes], list[float], bytes, bytes, list[dict[str, Any]]]:
        """``ServedSteps.step`` through ``Lanes.step``, for lanes the core cannot step itself
        (worker processes, a vector)."""
        batch = self.lanes.step(lanes, actions)
        if len(batch.stepped) != len(lanes):
            raise RequestError(
                Code.ENV_ERROR_CODE_INTERNAL,
                f"the served lanes moved {batch.stepped.tolist()} when asked to step "
                f"{lanes.tolist()}",
                recoverable=False,
            )
        return (
            self._step_observation_leaves(batch.observations, lanes),
            np.asarray(batch.rewards, dtype=np.float64).tolist(),
            np.asarray(batch.terminated, dtype=np.bool_).tobytes(),
            np.asarray(batch.truncated, dtype=np.bool_).tobytes(),
            batch.infos,
        )

    def _step_observation_leaves(self, observations: list[Any], lanes: np.ndarray) -> list[bytes]:
        return self._observation_leaves(observations, lanes, "step")

    # ---------------------------------------------------------------- helpers

    def _step_lanes(self, env_indices: Sequence[int]) -> tuple[np.ndarray, list[int]]:
        """The lanes a ``StepRequest`` names, as an array and as its ``env_indices`` list. A
        driver steps the same lanes round after round: they are checked once per change."""
        if env_indices != self._last_step_indices:
            indices = list(env_indices)
            self._last_step_lanes = self._lanes_of(indices, "StepRequest")
            self._last_step_indices = indices
        return self._last_step_lanes, self._last_step_indices

    def render(self, request: wire.RenderRequest) -> wire.RenderResponse:
        """One lane's frame as PNG, from envs that render in ``rgb_array`` mode; no frame
        from envs that do not render (the contract's ``render_mode`` says which)."""
        rendering = lanes_rendering(self.lanes)
        if rendering is None or rendering.render_mode != "rgb_array":
            return wire.RenderResponse()
        lanes = self._lanes_of(request.env_indices, "RenderRequest")
        if len(lanes) != 1:
            raise RequestError(
                Code.ENV_ERROR_CODE_INVALID_ACTION,
                f"a RenderRequest draws one lane: name it in env_indices (this server has "
                f"{self.num_lanes} lanes), got {list(request.env_indices)}",
                recoverable=True,
            )
        lane = int(lanes[0])
        try:
            frame = self.servicer.call_env(
                rendering.render, (lane,), request.timeout_ms, f"render of lane {lane}"
            )
        except RequestError as err:
            # A render() that raised drew nothing, and changed nothing a step reads: only this
            # frame fails, the session and its episodes go on (the driver decides what the
            # failure costs). One past its deadline still ends the session (TIMEOUT): it may
            # still be running, holding the env.
            if err.code != Code.ENV_ERROR_CODE_INTERNAL or err.__cause__ is None:
                raise
            raise RequestError(
                Code.ENV_ERROR_CODE_UNSUPPORTED, _render_failure(lane, err.__cause__)
            ) from err.__cause__
        if not (
            isinstance(frame, np.ndarray)
            and frame.dtype == np.uint8
            and frame.size
            and (frame.ndim == 2 or (frame.ndim == 3 and frame.shape[2] in (1, 3, 4)))
        ):
            got = getattr(frame, "shape", None)
            described = type(frame).__name__ if got is None else f"shape {got} {frame.dtype}"
            raise RequestError(
                Code.ENV_ERROR_CODE_UNSUPPORTED,
                f"render() of lane {lane} returned {described}; a frame crosses the wire as an "
                f"[H, W, 3] (or [H, W], [H, W, 4]) uint8 array",
                recoverable=True,
            )
        return wire.RenderResponse(frame=encode_png(frame), format=wire.RENDER_FORMAT_PNG)

    def _lanes_of(self, env_indices: Sequence[int], what: str) -> np.ndarray:
        if not len(env_indices):
            return self.all_lanes
        lanes = np.asarray(env_indices, dtype=np.int64)
        if lanes.max() >= self.num_lanes:
            raise RequestError(
                Code.ENV_ERROR_CODE_INVALID_ACTION,
                f"{what}.env_indices {lanes.tolist()} name lanes out of range: this server has "
                f"lanes 0..{self.num_lanes - 1}",
                recoverable=True,
            )
        if len(np.unique(lanes)) != len(lanes):
            raise RequestError(
                Code.ENV_ERROR_CODE_INVALID_ACTION,
                f"{what}.env_indices {lanes.tolist()} name a lane twice",
                recoverable=True,
            )
        if self.lanes.lockstep and len(lanes) != self.num_lanes and what == "StepRequest":
            raise RequestError(
                Code.ENV_ERROR_CODE_UNSUPPORTED,
                f"this server's {self.num_lanes} lanes step together (a lockstep vector), so a "
                f"step must move all of them; it does not offer subset_step",
                recoverable=True,
            )
        return lanes

    def _trials(self, options: dict[str, Any], count: int) -> list[int | None]:
        unknown = sorted(set(options) - {TRIAL_INDEX_OPTION})
        if unknown:
            raise RequestError(
                Code.ENV_ERROR_CODE_UNSUPPORTED,
                f"ResetRequest.options has {unknown}: this server takes only the "
                f"{TRIAL_INDEX_OPTION!r} reset option",
                recoverable=True,
            )
        trial = options.get(TRIAL_INDEX_OPTION)
        if trial is None:
            return [None] * count
        trials = trial if isinstance(trial, list) else [trial] * count
        if len(trials) != count or not all(isinstance(t, int) for t in trials):
            raise RequestError(
                Code.ENV_ERROR_CODE_INVALID_ACTION,
                f"ResetRequest.options[{TRIAL_INDEX_OPTION!r}] must be an int or a list of "
                f"{count} ints (one per lane reset), got {trial!r}",
                recoverable=True,
            )
        return trials

    def _observation_leaves(
        self, observations: list[Any], lanes: np.ndarray, doing: str
    ) -> list[bytes]:
        """The lanes' observations as the leaves of one SpaceValue, refused (INTERNAL) where
        one does not fit the observation space: the served env broke its own contract."""
        space = self.observation_space
        # One array leaf (most envs): the rows stack with one call, no walk of the space.
        batch = (
            np.asarray(observations)
            if self.observation_codec.single_array
            else stack_rows(space, observations)
        )
        problem = self.observation_checks.first_failure(batch)
        if problem is not None:
            row, message = problem
            raise RequestError(
                Code.ENV_ERROR_CODE_INTERNAL,
                f"the env's {doing} of lane {int(lanes[row])} returned an observation outside "
                f"its space: {message}",
                recoverable=False,
            )
        try:
            return self.observation_codec.encode_leaves(batch, len(lanes))
        except WireFormatError as err:
            raise RequestError(
                Code.ENV_ERROR_CODE_INTERNAL,
                f"the env's {doing} returned an observation outside its observation space "
                f"{space}: {err}",
                recoverable=False,
            ) from None

    def _encode_infos(self, infos: list[dict[str, Any]]) -> Any:
        if self.num_lanes == 1:
            return meta_map(infos[0]) if infos and infos[0] else None
        if not any(infos):
            return None
        return meta_map(vector_infos(infos))

    def _complete(
        self, lane: int, terminated: bool, truncated: bool, final_info: dict[str, Any] | None
    ) -> wire.EpisodeMetadata:
        steps, cumulative_reward = self.episodes.finish(lane)
        metadata = wire.EpisodeMetadata(
            episode_id=self.episode_ids[lane],
            seed=self.seeds[lane],
            env_index=lane,
            step_count=steps,
            cumulative_reward=cumulative_reward,
            terminated=terminated,
            truncated=truncated,
            start_timestamp_ns=int(self.started_ns[lane]),
            end_timestamp_ns=time.time_ns(),
        )
        if final_info:
            metadata.final_info.CopyFrom(meta_map(final_info))
        return metadata

    def interrupt_all(self) -> list[wire.EpisodeMetadata]:
        """End every running episode as truncated (a Close, or a session that failed)."""
        return [self._complete(lane, False, True, None) for lane in self.episodes.running_lanes()]


def _render_failure(lane: int, err: BaseException) -> str:
    """What a lane's ``render()`` that raised ``err`` is answered with: the lanes' own
    ``EnvError`` (it names the lane, the env and the exception), else the exception."""
    if isinstance(err, EnvError):
        return str(err)
    return f"lane {lane}: render() raised {type(err).__name__}: {err}"


def _error_response(request_id: str, err: RequestError) -> wire.JoinResponse:
    return wire.JoinResponse(
        request_id=request_id,
        error=wire.EnvError(code=err.code, message=str(err), is_recoverable=err.recoverable),
    )


# ------------------------------------------------------------------------------ values


def stack_rows(space: gymnasium.Space[Any], rows: list[Any]) -> Any:
    """Per-lane values of ``space`` as one batch (each leaf gains a leading row axis)."""
    if isinstance(space, spaces.Dict):
        return {key: stack_rows(child, [row[key] for row in rows]) for key, child in space.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(
            stack_rows(child, [row[i] for row in rows]) for i, child in enumerate(space.spaces)
        )
    if isinstance(space, spaces.Text):
        return list(rows)
    return np.asarray(rows)


LeafCheck = Callable[[np.ndarray], "np.ndarray | None"]


NO_PLAIN_RULE = "none: the space's checks have no plain form"


class ValueChecks:
    """The structural checks of the edition's value conformance over batches of one space:
    per leaf, a ``Discrete`` or ``MultiDiscrete`` value in its range, ``MultiBinary`` elements 0
    or 1, no NaN in a float ``Box``. Leaves with nothing to check (an integer ``Box``, ``Text``)
    cost nothing.

    Args:
        space: the space the batches hold values of.
        root: what the values are, for messages (``"action"``, ``"observation"``).

    Example:
        >>> import gymnasium as gym
        >>> checks = ValueChecks(gym.spaces.Discrete(3), "action")
        >>> checks.first_failure(np.array([0, 2])) is None
        True
        >>> checks.first_failure(np.array([0, 5]))
        (1, "action leaf 'value' is 5, expected an integer in [0, 3)")
    """

    def __init__(self, space: gymnasium.Space[Any], root: str) -> None:
        self.space = space
        self.root = root
        self._composite = isinstance(space, (spaces.Dict, spaces.Tuple))
        self._checks: list[tuple[int, str, str, LeafCheck]] = []
        # The rule of a one-leaf space as ``ServedSteps`` takes it: None (nothing to check),
        # "nan" or (low, high); a MultiDiscrete's per-element bounds have no such form.
        self.plain_rule: Any = None
        for position, (path, leaf) in enumerate(space_leaves(space)):
            where = "/".join(path) or "value"
            if isinstance(leaf, spaces.Discrete):
                low, high = int(leaf.start), int(leaf.start + leaf.n)
                expected, check = f"an integer in [{low}, {high})", _outside(low, high, 0)
                self.plain_rule = (low, high)
            elif isinstance(leaf, spaces.MultiDiscrete):
                low = np.asarray(leaf.start)
                expected = f"elements in [start, start + nvec) of {leaf}"
                check = _outside(low, low + np.asarray(leaf.nvec), leaf.nvec.ndim)
                self.plain_rule = NO_PLAIN_RULE
            elif isinstance(leaf, spaces.MultiBinary):
                expected, check = "elements 0 or 1", _outside(0, 2, len(leaf.shape))
                self.plain_rule = (0, 2)
            elif isinstance(leaf, spaces.Box) and np.issubdtype(leaf.dtype, np.floating):
                expected, check = "no NaN element", _nan_rows(tuple(range(1, 1 + len(leaf.shape))))
                self.plain_rule = "nan"
            else:
                continue
            self._checks.append((position, where, expected, check))
        if self._composite or isinstance(space, spaces.Text):
            self.plain_rule = NO_PLAIN_RULE

    def first_failure(self, batch: Any) -> tuple[int, str] | None:
        """The first row of ``batch`` (batched as ``rlmesh.spaces`` describes) that breaks a
        check, and what is wrong with it; None when every row conforms."""
        if not self._checks:
            return None
        leaves = batch_leaves(self.space, batch) if self._composite else (batch,)
        for position, where, expected, check in self._checks:
            leaf = leaves[position]
            if type(leaf) is not np.ndarray:
                leaf = np.asarray(leaf)
            bad = check(leaf)
            if bad is not None:
                row = int(np.flatnonzero(bad)[0])
                value = leaf[row]
                shown = value.tolist() if isinstance(value, np.ndarray) else value.item()
                return row, f"{self.root} leaf {where!r} is {shown!r}, expected {expected}"
        return None


SMALL_BATCH = 64
"""Up to this many elements, a value check reduces a Python list rather than the array."""


def _outside(low: Any, high: Any, ndim: int) -> LeafCheck:
    axes = tuple(range(1, 1 + ndim))
    scalar = np.ndim(low) == 0 and np.ndim(high) == 0

    def check(batch: np.ndarray) -> np.ndarray | None:
        # Scalar bounds settle the common case, every row in range, with a min and a max
        # (in Python for a small batch: numpy's reductions cost more than they save there).
        if scalar:
            if batch.size <= SMALL_BATCH:
                values = batch.ravel().tolist()
                if not values or (min(values) >= low and max(values) < high):
                    return None
            elif batch.min() >= low and batch.max() < high:
                return None
        bad = (batch < low) | (batch >= high)
        if not bad.any():
            return None
        return bad.any(axis=axes) if axes else bad

    return check


def _nan_rows(axes: tuple[int, ...]) -> LeafCheck:
    def check(batch: np.ndarray) -> np.ndarray | None:
        # One reduction: the sum is NaN whenever an element is (or infinities cancel, which
        # the exact check below then clears).
        total = sum(batch.ravel().tolist()) if batch.size <= SMALL_BATCH else batch.sum()
        if total == total:
            return None
        bad = np.isnan(batch)
        if not bad.any():
            return None
        return bad.any(axis=axes) if axes else bad

    return check


__all__ = [
    "COMPONENT",
    "SPEC_METADATA",
    "SUBSET_STEP",
    "EnvServicer",
    "RequestError",
    "env_contract",
    "serve_env",
    "split_rows",
    "vector_infos",
]
