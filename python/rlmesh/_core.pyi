"""Type stubs for ``rlmesh._core``, the Rust core (``rust/src/``).

The pure-Python core ``rlmesh._pycore`` has the same API and is its specification: see
``rlmesh/_pycore/rounds.py`` (and the ledger it owns, ``rlmesh/_pycore/ledger.py``, internal to
the runner in both cores) and ``rlmesh/_pycore/chunks.py`` for the full contract of each
method.
"""

from collections.abc import Callable, Sequence
from typing import Any, final

import numpy as np
import numpy.typing as npt

Int64Array = npt.NDArray[np.int64]

def episode_seed(base: int, index: int) -> int:
    """The reset seed of episode ``index`` for base seed ``base``, in ``[0, 2**31)``."""

def value_digest(value: Any) -> str:
    """The digest of an observation or action (16 hex digits): an episode's ``reset_digest``
    is this of its first observation. See ``rlmesh/_pycore/digests.py`` for what is hashed."""

@final
class EpisodeSummary:
    """One completed, scored episode."""

    @property
    def index(self) -> int: ...
    @property
    def episode_id(self) -> int: ...
    @property
    def seed(self) -> int | None: ...
    @property
    def trial(self) -> int: ...
    @property
    def env_index(self) -> int: ...
    @property
    def steps(self) -> int: ...
    @property
    def reward(self) -> float: ...
    @property
    def terminated(self) -> bool: ...
    @property
    def truncated(self) -> bool: ...
    @property
    def success(self) -> bool | None: ...
    @property
    def duration_s(self) -> float: ...
    @property
    def predict_ms(self) -> float: ...
    @property
    def step_ms(self) -> float: ...
    @property
    def error(self) -> str | None: ...
    @property
    def reset_digest(self) -> str | None: ...
    @property
    def trajectory_digest(self) -> str | None: ...
    def to_dict(self) -> dict[str, Any]: ...

@final
class EpisodeStarts:
    """What one ``RoundRunner.start`` or ``observe_rolls`` call started (arrays are ``[S]``,
    the surplus ones ``[U]``; a lane in neither went idle)."""

    @property
    def lanes(self) -> Int64Array: ...
    @property
    def episode_ids(self) -> Int64Array: ...
    @property
    def indices(self) -> Int64Array: ...
    @property
    def seeds(self) -> list[int | None]: ...
    @property
    def trials(self) -> Int64Array: ...
    @property
    def surplus_lanes(self) -> Int64Array: ...
    @property
    def surplus_episode_ids(self) -> Int64Array: ...

class ObservationAssembler:
    """Builds the model's input for a group of lanes from their raw observations.

    See ``rlmesh._pycore.assembly.ObservationAssembler`` for the full contract.
    """

    def __init__(self, observation_leaves: Sequence[Any]) -> None: ...
    @property
    def window_count(self) -> int: ...
    def assemble(self, raw_lane_observations: Sequence[Any], episode_ids: npt.ArrayLike) -> Any:
        """``[K, (stack,) *frame_shape]`` per array leaf, nested like the spec."""
    def push(self, raw_lane_observations: Sequence[Any], episode_ids: npt.ArrayLike) -> None: ...
    def evict(self, episode_id: int) -> None: ...

def split_chunk(chunk: Any, num_lanes: int | None = None) -> int:
    """Check a chunk (``[H, ...]``, or ``[N, H, ...]`` with ``num_lanes=N``); return ``H``."""

class ChunkQueues:
    """Per-lane replay queues of chunked actions."""

    def __init__(self, num_lanes: int, execution_horizon: int) -> None: ...
    @property
    def execution_horizon(self) -> int: ...
    def push(self, lanes: npt.ArrayLike, episode_ids: npt.ArrayLike, chunks: Any) -> None: ...
    def pop(self, lanes: npt.ArrayLike, episode_ids: npt.ArrayLike) -> Any: ...
    def drop(self, episode_id: int) -> int: ...
    def lanes_needing_predict(self, lanes: npt.ArrayLike | None = None) -> Int64Array: ...
    def queued(self, lanes: npt.ArrayLike | None = None) -> Int64Array: ...

class TemporalEnsembles:
    """Per-lane, per-episode buffers of predicted chunks, each step's action their
    ``exp(-m * i)``-weighted average (``i = 0`` the oldest). See
    ``rlmesh/_pycore/ensembles.py`` for every rule; both cores agree to the bit."""

    def __init__(self, num_lanes: int, m: float) -> None: ...
    @property
    def m(self) -> float: ...
    def push(self, lanes: npt.ArrayLike, episode_ids: npt.ArrayLike, chunks: Any) -> None: ...
    def pop(self, lanes: npt.ArrayLike, episode_ids: npt.ArrayLike) -> Any: ...
    def drop(self, episode_id: int) -> int: ...
    def held(self, lanes: npt.ArrayLike | None = None) -> Int64Array: ...

class ActionApplier:
    """Checks the model's batched action and converts it into the action space.

    ``action_leaves`` is ``Plan.action``. See ``rlmesh/_pycore/actions.py`` for every rule.
    """

    def __init__(self, action_leaves: Sequence[Any]) -> None: ...
    def apply_actions(
        self, batched_model_output: Any, lanes: npt.ArrayLike
    ) -> npt.NDArray[Any] | dict[str, Any]:
        """One array ``[K, *shape]`` per leaf (nested in dicts for a Dict action space).

        Raises ``rlmesh.ModelOutputError`` naming the lane, what was expected and what came
        back; ``ValueError`` for ``lanes`` that are not a 1-D array of integers.
        """

class LatencyStats:
    """Count, mean, max and quantiles of nanosecond durations, in bounded memory.

    See ``rlmesh/_pycore/telemetry.py`` for the bucket layout and the error bound.
    """

    def __init__(self) -> None: ...
    def record(self, ns: int) -> None: ...
    def record_many(self, ns: npt.ArrayLike) -> None:
        """Add every duration of a ``[K]`` integer array; all or none of them."""
    def merge(self, other: LatencyStats) -> None: ...
    def reset(self) -> None: ...
    @property
    def count(self) -> int: ...
    @property
    def total_ns(self) -> int: ...
    @property
    def max_ns(self) -> int: ...
    def quantile(self, q: float) -> int:
        """Within 1/128 of the exact nearest-rank ``q``-quantile, never above ``max_ns``."""
    def snapshot(self) -> dict[str, Any]:
        """``{count, avg_ns, p50_ns, p95_ns, p99_ns, max_ns}``."""

class RoundRunner:
    """Every per-lane part of one run: episode lifecycle, rounds, frame windows, chunk queues.

    It builds and owns the run's ledger (internal: slots, seeds, ids, each lane's steps and
    clock), ``ObservationAssembler``, ``ActionApplier`` and (with an ``execution_horizon``)
    ``ChunkQueues`` or (with an ``ensemble`` rate) ``TemporalEnsembles``. Each lane's step
    count and clock live in its ledger: from ``start`` (just before the reset) to the return
    of the episode's last step; ``duration_s`` and ``max_episode_seconds`` both read it. See
    ``rlmesh/_pycore/rounds.py`` for the full contract.
    """

    def __init__(
        self,
        num_lanes: int,
        episodes: int,
        observation_plan: Sequence[Any],
        action_plan: Sequence[Any],
        *,
        execution_horizon: int | None = None,
        ensemble: float | None = None,
        seeds: Sequence[int] | None = None,
        base_seed: int | None = 0,
        trial_index_base: int | None = 0,
        indices: Sequence[int] | None = None,
        overflow: str = "idle",
        max_episode_steps: int | None = None,
        max_episode_seconds: float | None = None,
        digests: bool = True,
    ) -> None:
        """``digests=False`` keeps no episode digests: for measuring what they cost only."""
    @property
    def num_lanes(self) -> int: ...
    @property
    def rounds(self) -> int: ...
    @property
    def done(self) -> bool:
        """True once every slot the run plays has been finished."""
    @property
    def wasted_steps(self) -> int: ...
    def summaries(self) -> list[EpisodeSummary]: ...
    def snapshot(self) -> dict[str, Any]: ...
    def start(self, lanes: npt.ArrayLike, *, now_ns: int) -> EpisodeStarts:
        """Claim slots for the vacant ``lanes`` (``[K]``); their clocks start at ``now_ns``."""
    def observe_rolls(
        self, lanes: npt.ArrayLike, env_episode_ids: npt.ArrayLike, *, now_ns: int
    ) -> EpisodeStarts: ...
    def finish(
        self, lanes: npt.ArrayLike, successes: Sequence[bool | None]
    ) -> tuple[list[EpisodeSummary], Int64Array, Int64Array]:
        """``(summaries, episode_ids [E], model_ends [F])`` of the ended ``lanes`` (``[E]``);
        their frame windows and queued actions go."""
    def abandon(
        self, lanes: npt.ArrayLike, errors: Sequence[str | None], *, now_ns: int
    ) -> tuple[list[EpisodeSummary], Int64Array, Int64Array]:
        """Abandon the running episodes of ``lanes`` (``[K]``) whose env failed: play the slot
        again (``errors[k]`` None) or record it failed with ``errors[k]``; ``(summaries of the
        failed, episode_ids [K], model_ends [F])``; they leave an open round."""
    def take_all_model_ends(self) -> Int64Array: ...
    def set_observations(self, lanes: npt.ArrayLike, observations: Sequence[Any]) -> None: ...
    def observations(self, lanes: npt.ArrayLike) -> list[Any]: ...
    def running_lanes(self) -> Int64Array: ...
    def episode_ids(self, lanes: npt.ArrayLike) -> Int64Array: ...
    def lane_episodes(
        self, lanes: npt.ArrayLike
    ) -> tuple[Int64Array, list[int | None], Int64Array]:
        """``(indices [K], seeds, steps [K])`` of the episode each of ``lanes`` holds."""
    def begin_round(self, lanes: npt.ArrayLike | None = None) -> tuple[Int64Array, Int64Array, Any]:
        """``(running [K], predict_lanes [P], payload)`` over the running lanes in no parked
        round (with ``lanes`` ``[L]``, those among them); the payload is None when ``P = 0``."""
    def park_round(self, key: int) -> None:
        """Set the open round aside under ``key`` while its lanes' envs step."""
    def resume_round(self, key: int) -> None:
        """Make the round parked under ``key`` the open round again."""
    def take_actions(self, output: Any, predict_ns: int) -> npt.NDArray[Any] | dict[str, Any]:
        """The env actions ``[K, ...]`` (or a dict of them) in the order of the running lanes;
        each of the P predicted lanes is charged ``predict_ns / P`` (shares adding up to it)."""
    def end_round(
        self,
        rewards: npt.ArrayLike,
        terminated: npt.ArrayLike,
        truncated: npt.ArrayLike,
        step_ns: int,
        now_ns: int,
    ) -> tuple[Int64Array, npt.NDArray[np.bool_]]:
        """``(ended [E], truncated [K])``: a cap reached truncates an episode that did not end.
        Each of the K running lanes is charged ``step_ns / K`` (shares adding up to it)."""
    def run_rounds(
        self,
        model: Any,
        env_steps: Sequence[Callable[[Any], tuple[Any, Any, Any, Any, Any]]]
        | Callable[[Int64Array, Any], Any],
        env_name: str,
        *,
        until_ns: int,
        stats: Sequence[LatencyStats],
        failures: dict[int, str] | None = None,
    ) -> tuple[Int64Array, list[dict[str, Any]], int, int]:
        """``(ended, infos, rounds, lane_steps)``. ``model``: ``predict_now(payload, P)``,
        ``lane_corner`` (a per-lane function or None), ``wants_episode_ids`` (then
        ``predict_now(payload, P, episode_ids)``), ``combine(outputs, P)``, ``failure(error,
        rounds)`` and optionally ``calls_per_lane`` (then a prediction for P lanes is recorded
        as P model calls, each an equal share of its time), as ``rlmesh.model.ModelHandler``
        has them; an error calling the model is raised as what ``failure`` returns. Each
        lane's env step is timed and recorded on its own, and charged to that lane's
        episode; each predicted lane is charged its share of the model call. A lane's
        ``step`` that raises becomes an ``rlmesh.EnvError`` naming the lane and the env, the
        error chained as ``__cause__``; with ``failures``, its ``"<Type>: <message>"`` goes
        there under its lane, the lane leaves the round, and the call returns after it.
        ``env_steps`` may instead be one callable stepping every running lane, a
        ``Lanes.step``: ``step(lanes [K], actions) -> StepBatch``, timed as one call, each
        lane charged its share. A ``LaneFailures`` it raises, with ``failures``, puts its
        errors there and its outcome stands for the step; an ``RlmeshError`` is raised as it
        is, any other exception as an ``EnvError`` naming the env; a batch of other lanes is
        a ``ValueError``."""

# ------------------------------------------------------------------ a served env's steps
# (``rust/src/wire/served.rs``; ``rlmesh/_pycore/wire/served.py``)

class ServedSteps:
    """A served env's steps over lanes whose envs' ``step`` the server holds; see
    ``rlmesh/_pycore/wire/served.py``."""

    def __init__(
        self,
        env_steps: Sequence[Callable[[Any], tuple[Any, ...]]],
        env_name: str,
        encode: Callable[[list[Any], Int64Array], list[bytes]],
        observation: tuple[Any, tuple[int, ...], Any] | None = None,
    ) -> None: ...
    def step(
        self, lanes: Int64Array, actions: Any
    ) -> tuple[list[bytes], list[float], bytes, bytes, list[dict[str, Any]]]:
        """``(observation leaves, rewards, terminated, truncated, infos)``, a mask a byte per
        lane; ``rlmesh.EnvError`` naming the lane whose env's ``step`` raised."""

class ServedEpisodes:
    """Which of a served env's lanes run an episode, and its steps and return so far."""

    def __init__(self, num_lanes: int) -> None: ...
    def start(self, lanes: Int64Array) -> None: ...
    def not_running(self, lanes: Int64Array) -> list[int]: ...
    def add(self, lanes: Int64Array, rewards: Sequence[float]) -> None: ...
    def finish(self, lane: int) -> tuple[int, float]:
        """``(steps, return)`` of the lane's episode, which ends."""
    def running_lanes(self) -> list[int]: ...
    def stop(self) -> None: ...

# ------------------------------------------------------------------ the raw-bytes gRPC transport
# (``rust/src/wire/transport.rs`` on tonic; mirrored over grpcio by
# ``rlmesh/_pycore/wire/transport.py``)

class WireStatusError(Exception):
    """A channel or stream call that ended with a gRPC status other than OK;
    ``str(err) == f"{code}: {details}"``."""

    code: str
    details: str

@final
class WireChannel:
    """A connected HTTP/2 channel to ``"host:port"`` or ``"unix:///abs/path"``; messages above
    ``max_message_bytes`` are refused (``RESOURCE_EXHAUSTED``)."""

    def __init__(self, target: str, *, max_message_bytes: int, connect_timeout: float) -> None:
        """Connect now, or raise ``WireStatusError("UNAVAILABLE")`` after ``connect_timeout`` s."""
    def unary(
        self,
        method: str,
        request: bytes,
        *,
        metadata: Sequence[tuple[str, str]] = (),
        timeout: float | None = None,
    ) -> bytes:
        """Call ``method`` (``"/pkg.Service/Method"``) with one message; its one answer."""
    def stream(self, method: str, *, metadata: Sequence[tuple[str, str]] = ()) -> WireStream:
        """Open a bidirectional stream on ``method``."""
    def close(self) -> None:
        """Close the channel (idempotent); open streams end with ``CANCELLED``."""

@final
class WireStream:
    """One bidirectional call, made by ``WireChannel.stream``."""

    def send(self, message: bytes) -> None:
        """Queue ``message``; ``WireStatusError`` once the stream has finished."""
    def receive(self, timeout: float | None = None) -> bytes | None:
        """The next message; None once the server finished with OK; ``WireStatusError`` for
        another status or a broken connection; ``TimeoutError`` after ``timeout`` s (the stream
        stays usable)."""
    def close_send(self) -> None:
        """Half-close: the server's requests end."""
    def cancel(self) -> None:
        """End the call now; a later ``receive`` raises ``WireStatusError("CANCELLED")``."""

@final
class ServerRequests:
    """The incoming messages (bytes) of one server call; ends when the client half-closed,
    cancelled or went away, or the server closed."""

    def __iter__(self) -> ServerRequests: ...
    def __next__(self) -> bytes: ...

@final
class ServerCall:
    """One incoming call's controls."""

    def send_headers(self) -> None:
        """Send the response headers now (they are out already with tonic)."""
    def set_status(self, code: int, details: str) -> None:
        """The status (gRPC code 0..16) the call ends with once its responses end."""
    def cancel(self) -> None:
        """End the call now: the client sees ``CANCELLED``; the requests stop."""
    def is_active(self) -> bool:
        """False once the client cancelled or went away, or the call ended."""
    def time_remaining(self) -> float | None:
        """Seconds left before the client's deadline (``grpc-timeout``), None without one."""

@final
class WireServer:
    """A gRPC server for any method path: each call runs
    ``dispatch(method, metadata, requests, call) -> Iterable[bytes]`` on its own thread."""

    port: int
    def __init__(
        self,
        target: str,
        dispatch: Callable[[str, list[tuple[str, str]], ServerRequests, ServerCall], Any],
        *,
        max_message_bytes: int,
    ) -> None:
        """Bind ``target`` (``"host:port"``, port 0 allowed, or ``"unix:..."``) and serve;
        ``OSError`` naming the target if it cannot bind."""
    def close(self, grace: float = 1.0) -> None:
        """Stop accepting; open calls get ``grace`` s, then are cancelled; idempotent."""
