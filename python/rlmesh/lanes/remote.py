"""Driving a served env: ``RemoteEnv``, the ``Lanes`` kind whose lanes live in an env server
(``rlmesh.remote.env_client`` names it too).

``rlmesh.run(model, "tcp://host:port")`` (or ``host:port``, ``unix:///path``) builds one
through ``make_lanes``; ``env=RemoteEnv(address, token=...)`` does the same with options. It
speaks rlmesh-wire-v1 to an rlmesh env server, ours (``rlmesh serve env``) or rlmesh 0.1.0's
(``EnvServer``): one handshake, one ``Join`` session, and per round ONE ``StepRequest`` for all
the running lanes (``env_indices``), so lanes with no episode left cost nothing remotely
either. Resets carry the driver's seeds and fresh UUIDv7 episode ids, so the episodes are
exactly those of a local run.

Example:
    >>> import numpy as np, rlmesh
    >>> with rlmesh.serve_env("CartPole-v1", num_envs=2) as server:
    ...     lanes = RemoteEnv(server.address)
    ...     observations, _ = lanes.reset(np.array([0, 1]), seeds=[0, 1], trials=[0, 1])
    ...     batch = lanes.step(np.array([1]), np.array([0]))  # lane 0 waits
    ...     lanes.close()
    >>> lanes.num_lanes, batch.stepped.tolist(), batch.rewards.tolist()
    (2, [1], [1.0])
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.envs.registration import EnvSpec

from ..errors import LaneFailures, RemoteError
from ..remote.codec import (
    WORKFLOW_EDITION,
    SpaceCodec,
    WireFormatError,
    from_meta_map,
    meta_map,
    space_from_spec,
)
from ..remote.connection import (
    DEFAULT_MAX_MESSAGE_MB,
    check_handshake,
    handshake_request,
    open_channel,
    remote_failure,
    token_metadata,
    uuid7,
    wire_transport,
)
from ..remote.png import PNGError, decode_png
from ..remote.protocol import (
    RENDER_FPS_KEY,
    SPEC_METADATA,
    SUBSET_STEP,
    split_rows,
    split_vector_infos,
)
from ..remote.wire.core.v1 import env_contract_pb2
from ..remote.wire.env.v1 import interaction_pb2 as wire
from ..remote.wire.env.v1 import service_pb2
from .base import TRIAL_INDEX_FLAG, TRIAL_INDEX_OPTION, StepBatch, checked_reset

COMPONENT = "rlmesh-driver"
# The in-band errors that say the served env itself failed (it raised, or overran its
# deadline): the server ends the session with them, and ``rebuild`` opens a new one.
ENV_FAILURE_CODES = ("ENV_ERROR_CODE_INTERNAL", "ENV_ERROR_CODE_TIMEOUT", "ENV_ERROR_CODE_CRASHED")
HANDSHAKE = "/rlmesh.env.v1.EnvService/Handshake"
JOIN = "/rlmesh.env.v1.EnvService/Join"


class SessionEndedError(LaneFailures, RemoteError):
    """The served env failed, which ended its session: every lane's episode in flight is
    lost. A ``RemoteError`` as before (its address and code), and the ``LaneFailures`` that
    names every lane, for runs that record or retry env failures."""

    def __init__(
        self, message: str, *, address: str, code: str, num_lanes: int, detail: str | None = None
    ) -> None:
        RemoteError.__init__(self, message, address=address, code=code, detail=detail)
        self.errors = dict.fromkeys(range(num_lanes), f"RemoteError: {message}")
        self.outcome: Any = None


class RemoteEnv:
    """The lanes of an env served at ``address`` (rlmesh-wire-v1), as ``rlmesh.lanes.Lanes``.

    Connecting handshakes and opens the session; the contract gives the spaces, the number of
    lanes (the server's ``num_envs``) and the env's spec (``spec``, from its metadata, else
    None). A server that steps any subset of its lanes (capability ``subset_step``) or has one
    lane is stepped lane by lane as the driver asks; a wider lockstep server is refused.

    Args:
        address: ``tcp://host:port``, ``host:port`` or ``unix:///path``.
        token: the server's bearer token, if it requires one.
        connect_timeout: seconds to wait for the server to answer.
        max_message_mb: the largest message sent or accepted, in MiB.
        request_timeout: seconds the server may take per reset or step (sent as
            ``timeout_ms``; past it the server answers TIMEOUT); None sends no deadline. The
            run's ``timeouts=`` apply on this side either way.
        core: whose transport carries the calls, ``"rust"`` or ``"python"`` (grpcio);
            default the active core. ``rlmesh.run(core=...)`` passes its own.

    A served env that raises (or overruns ``request_timeout``) ends the session, as the wire's
    rule says: the call raises ``SessionEndedError`` (a ``RemoteError``) naming every lane, and
    ``rebuild`` opens a new session (the server keeps its envs and resets them on the next
    ``reset``).

    A server whose envs render (its contract's ``render_mode``, ``"rgb_array"`` for frames)
    makes these lanes ``RenderingLanes``: ``render(lane)`` asks it for the lane's frame, which
    crosses the wire as PNG, so a run records videos from ``render()`` as it does locally.

    Raises:
        RemoteError: no server answered, the handshake or the token was refused, the
            contract cannot be read, or the server is a lockstep vector of several lanes.

    Example:
        >>> import rlmesh
        >>> with rlmesh.serve_env("Pendulum-v1", num_envs=3) as server:
        ...     env = RemoteEnv(server.address)
        ...     result = rlmesh.run(lambda obs: [0.0], env, episodes=2, max_episode_steps=5)
        >>> env.num_lanes, [episode.steps for episode in result.episodes]
        (3, [5, 5])
    """

    resets_itself = False
    env_steps = None
    core_calls_step = True

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        connect_timeout: float = 10.0,
        max_message_mb: float = DEFAULT_MAX_MESSAGE_MB,
        request_timeout: float | None = None,
        core: str | None = None,
    ) -> None:
        self._closed = False
        self._status_error = wire_transport(core).WireStatusError
        self._stream: Any = None
        self._call_lock = threading.Lock()
        self._counter = 0
        self._timeout_ms = 0 if request_timeout is None else max(1, int(request_timeout * 1000))
        self._token, self._connect_timeout = token, connect_timeout
        self._session_ended = False
        self.rebuild = self._rebuild
        self._channel, parsed = open_channel(
            address, connect_timeout=connect_timeout, max_message_mb=max_message_mb, core=core
        )
        self.address = str(parsed)
        try:
            self._connect(token, connect_timeout)
        except BaseException:
            self._release()
            raise

    def _connect(self, token: str | None, connect_timeout: float) -> None:
        metadata = token_metadata(token)
        request = service_pb2.HandshakeRequest(base=handshake_request(COMPONENT))
        try:
            raw = self._channel.unary(
                HANDSHAKE, request.SerializeToString(), metadata=metadata, timeout=connect_timeout
            )
        except self._status_error as err:
            raise remote_failure(err, self.address, "the env handshake") from None
        answer = service_pb2.HandshakeResponse.FromString(raw)
        check_handshake(answer.base, self.address)
        self._read_contract(answer.env_contract, answer.base.capabilities)
        self._stream = self._channel.stream(JOIN, metadata=metadata)
        self._call(
            "configuring the session",
            "configure",
            wire.JoinRequest(
                configure=wire.ConfigureEnvRequest(selected_workflow_edition=WORKFLOW_EDITION)
            ),
        )

    def _read_contract(self, contract: env_contract_pb2.EnvContract, capabilities: Any) -> None:
        try:
            self.single_observation_space = space_from_spec(
                contract.spec.observation_space, "observation_space"
            )
            self.single_action_space = space_from_spec(contract.spec.action_space, "action_space")
        except WireFormatError as err:
            raise RemoteError(
                f"the env server at {self.address} sent a contract this rlmesh cannot read: {err}",
                address=self.address,
            ) from None
        self.num_lanes = max(1, int(contract.num_envs))
        self.lockstep = False
        if self.num_lanes > 1 and capabilities.get(SUBSET_STEP) != "true":
            raise RemoteError(
                f"the env server at {self.address} serves {self.num_lanes} lanes that step "
                f"together (no {SUBSET_STEP!r} capability), which rlmesh cannot seed episode "
                f"by episode: serve an env id or factory with `rlmesh serve env ID --num-envs "
                f"{self.num_lanes}` (any subset steps alone), or one env per server",
                address=self.address,
            )
        metadata = from_meta_map(contract.spec.metadata)
        self.metadata = metadata
        self.accepts_trial_index = metadata.get(TRIAL_INDEX_FLAG) is True
        self.name = contract.spec.id or self.address
        self.spec = _spec_from_metadata(metadata, self.name)
        # Lanes that can draw only when the server's envs render (RenderingLanes).
        self.render_mode = contract.render_mode or None
        fps = metadata.get(RENDER_FPS_KEY)
        self.render_fps = float(fps) if isinstance(fps, (int, float)) and fps > 0 else None
        if self.render_mode is not None:
            self.render = self._render
        self._observation_codec = SpaceCodec(self.single_observation_space)
        self._action_codec = SpaceCodec(self.single_action_space)
        self._episode_ids = np.full(self.num_lanes, "", dtype=object)
        self._step_key: tuple[int, ...] | None = None
        self._step_template = wire.JoinRequest()

    # ---------------------------------------------------------------- the Lanes protocol

    def reset(
        self, lanes: np.ndarray, seeds: Sequence[int | None], trials: Sequence[int | None]
    ) -> tuple[list[Any], list[dict[str, Any]]]:
        checked = checked_reset(lanes, seeds, trials, self.num_lanes)
        count = len(checked)
        seeded = [seed is not None for seed in seeds]
        if any(seeded) and not all(seeded):
            raise ValueError(
                "a remote reset seeds all the lanes it resets or none (the wire has no unset "
                f"seed), got seeds {list(seeds)}"
            )
        options: dict[str, Any] = {}
        if self.accepts_trial_index and any(trial is not None for trial in trials):
            options[TRIAL_INDEX_OPTION] = trials[0] if count == 1 else list(trials)
        episode_ids = [uuid7() for _ in checked]
        request = wire.JoinRequest(
            reset=wire.ResetRequest(
                seeds=list(seeds) if all(seeded) else [],
                env_indices=checked,
                episode_ids=episode_ids,
                options=meta_map(options) if options else None,
                timeout_ms=self._timeout_ms,
            )
        )
        try:
            answer = self._call(f"resetting lanes {checked}", "reset", request).reset
        except SessionEndedError as failure:
            failure.outcome = (np.zeros(0, dtype=np.int64), [], [])  # no lane was reset
            raise
        self._episode_ids[checked] = episode_ids
        self._step_key = None
        observations = self._observations(answer.observation, count, "reset")
        return observations, self._infos(answer.infos, count)

    def step(self, lanes: np.ndarray, actions: Any) -> StepBatch:
        lanes = np.asarray(lanes, dtype=np.int64)
        count = len(lanes)
        request, lane_list = self._step_request(lanes)
        try:
            # In place: the request is kept from round to round, only its action changes.
            request.step.action.leaves[:] = self._action_codec.encode_leaves(actions, count)
        except WireFormatError as err:
            raise WireFormatError(
                f"the actions for lanes {lane_list} do not fit the action space "
                f"{self.single_action_space} of {self.address}: {err}"
            ) from None
        try:
            answer = self._call("a step", "step", request).step
        except SessionEndedError as failure:
            nothing = np.zeros(0, dtype=np.bool_)
            failure.outcome = StepBatch(  # no lane stepped
                np.zeros(0, dtype=np.int64), [], np.zeros(0), nothing, nothing.copy(), []
            )
            raise
        if answer.env_indices != lane_list and len(answer.env_indices):
            raise self._malformed(
                f"a step of lanes {lane_list} was answered for lanes {list(answer.env_indices)}"
            )
        rewards = np.array(list(answer.rewards), dtype=np.float64)
        if len(rewards) != count:
            raise self._malformed(f"a step of {count} lanes has {len(rewards)} rewards")
        return StepBatch(
            lanes,
            self._observations(answer.observation, count, "step"),
            rewards,
            self._mask(answer.terminated_mask, count, "terminated_mask"),
            self._mask(answer.truncated_mask, count, "truncated_mask"),
            self._infos(answer.infos, count),
        )

    def _step_request(self, lanes: np.ndarray) -> tuple[wire.JoinRequest, list[int]]:
        """The ``StepRequest`` of ``lanes`` (their indices, episode ids and the deadline) and
        the lanes as a list. A driver steps the same lanes round after round, and ids change
        only at a reset: both are rebuilt only when either changes."""
        lane_list = lanes.tolist()
        key = tuple(lane_list)
        if self._step_key != key:
            request = wire.JoinRequest()
            step = request.step
            step.env_indices.extend(lane_list)
            step.episode_ids.extend(self._episode_ids[lanes].tolist())
            step.timeout_ms = self._timeout_ms
            self._step_template, self._step_key = request, key
        return self._step_template, lane_list

    def env_episode_ids(self) -> np.ndarray | None:
        return None

    def _render(self, lane: int) -> np.ndarray:
        """Lane ``lane``'s frame now, drawn by the server (``RenderingLanes.render``, present
        when the server's envs render): ``[H, W, 3]`` or ``[H, W]`` uint8."""
        request = wire.JoinRequest(
            render=wire.RenderRequest(env_indices=[int(lane)], timeout_ms=self._timeout_ms)
        )
        answer = self._call(f"rendering lane {lane}", "render", request).render
        if not answer.HasField("frame"):
            raise RemoteError(
                f"the env server at {self.address} drew no frame of lane {lane}: its envs "
                f"render in {self.render_mode!r} mode; build them with render_mode='rgb_array'",
                address=self.address,
            )
        if answer.format != wire.RENDER_FORMAT_PNG:
            raise self._malformed(f"a frame of lane {lane} in format {answer.format}, not PNG")
        try:
            frame = decode_png(answer.frame)
        except PNGError as err:
            raise self._malformed(f"the frame of lane {lane}: {err}") from None
        return frame[:, :, 0] if frame.shape[2] == 1 else frame

    def _rebuild(self, lanes: np.ndarray) -> None:
        """After a ``SessionEndedError``, a new session: its lanes, all of them, hold no episode
        until their next ``reset``."""
        if not self._session_ended:
            return
        with self._call_lock:
            self._stream.close_send()
            with contextlib.suppress(self._status_error):  # ends once the server let it go
                self._stream.receive()
            self._stream = None
        self._connect(self._token, self._connect_timeout)
        self._session_ended = False

    def close(self) -> None:
        """End the session (``Close``, when no call is still waiting on the server) and the
        channel. Closing again does nothing."""
        if self._closed:
            return
        self._closed = True
        # A call abandoned at its deadline may still hold the stream: then it is cancelled.
        if self._stream is not None and self._call_lock.acquire(blocking=False):
            try:
                self._send(wire.JoinRequest(close=wire.CloseEnvsRequest(reason="the run ended")))
                self._stream.receive()
            except self._status_error:
                pass  # the server is gone already: nothing left to close there
            finally:
                self._call_lock.release()
        self._release()

    def _release(self) -> None:
        self._closed = True
        if self._stream is not None:
            self._stream.cancel()
        self._channel.close()

    def __enter__(self) -> RemoteEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteEnv({self.address}, {self.name}, num_lanes={self.num_lanes})"

    # ---------------------------------------------------------------- the session

    def _send(self, request: wire.JoinRequest) -> str:
        self._counter += 1
        request_id = str(self._counter)
        request.request_id = request_id
        self._stream.send(request.SerializeToString())
        return request_id

    def _call(self, doing: str, kind: str, request: wire.JoinRequest) -> wire.JoinResponse:
        """Send one request and wait for its answer; a failure as a ``RemoteError``."""
        if self._closed:
            raise RemoteError(
                f"{doing} on {self.address}: this RemoteEnv is closed", address=self.address
            )
        with self._call_lock:
            try:
                request_id = self._send(request)
                raw = self._stream.receive()
            except self._status_error as err:
                raise remote_failure(err, self.address, doing) from None
            if raw is None:
                raise RemoteError(
                    f"the env server at {self.address} ended the session during {doing}",
                    address=self.address,
                    code="CLOSED",
                )
        response = wire.JoinResponse.FromString(raw)
        answered = response.WhichOneof("kind")
        if answered == "error":
            error = response.error
            name = wire.EnvErrorCode.Name(error.code) if error.code in _CODES else str(error.code)
            if name in ENV_FAILURE_CODES:
                self._session_ended = True
                raise SessionEndedError(
                    f"{doing} at {self.address} failed with {name}: {error.message}",
                    address=self.address,
                    code=name,
                    num_lanes=self.num_lanes,
                    detail=error.message,
                )
            raise RemoteError(
                f"{doing} at {self.address} failed with {name}: {error.message}",
                address=self.address,
                code=name,
                detail=error.message,
            )
        if response.request_id != request_id or answered != kind:
            raise self._malformed(
                f"request {request_id} ({kind}) was answered by request {response.request_id!r} "
                f"({answered})"
            )
        return response

    def _observations(self, value: Any, count: int, doing: str) -> list[Any]:
        try:
            batch = self._observation_codec.decode(value, count)
        except WireFormatError as err:
            raise self._malformed(f"the observations of a {doing}: {err}") from None
        return split_rows(batch, count)

    def _mask(self, raw: bytes, count: int, name: str) -> np.ndarray:
        if len(raw) not in (0, count):
            raise self._malformed(f"{name} has {len(raw)} bytes for {count} lanes")
        if raw.count(0) == len(raw):  # empty or all zero (most rounds): no lane set
            return np.zeros(count, dtype=np.bool_)
        return np.frombuffer(raw, dtype=np.uint8) != 0

    def _infos(self, infos: Any, count: int) -> list[dict[str, Any]]:
        if not infos.entries:
            return [{} for _ in range(count)]
        info = from_meta_map(infos)
        if self.num_lanes == 1:
            return [info]
        return split_vector_infos(info, count)

    def _malformed(self, what: str) -> RemoteError:
        return RemoteError(
            f"the env server at {self.address} sent a malformed answer: {what}",
            address=self.address,
            code="MALFORMED",
        )


_CODES = set(wire.EnvErrorCode.values())


def _spec_from_metadata(metadata: dict[str, Any], name: str) -> EnvSpec | None:
    """The served env's ``EnvSpec`` as its contract metadata describes it, None without."""
    fields = {
        field: metadata[key]
        for key, field in SPEC_METADATA.items()
        if metadata.get(key) is not None
    }
    if not fields:
        return None
    fields.setdefault("id", name)
    try:
        return EnvSpec(**fields)
    except Exception:  # an id Gymnasium cannot parse: keep what matters, under a plain name
        fields["id"] = "remote-env"
        return EnvSpec(**fields)


__all__ = ["RemoteEnv", "SessionEndedError"]
