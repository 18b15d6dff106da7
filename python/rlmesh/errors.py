"""The errors rlmesh raises. Every one is an ``RlmeshError``, so one ``except`` catches them all.

The errors about a model's spec or output are also ``ValueError``s: a caller that already
guards against bad values catches them without knowing rlmesh.

Example:
    >>> from rlmesh.errors import RlmeshError, SpecError
    >>> try:
    ...     raise SpecError('Image(key="pixels"): obs has no key "pixels"')
    ... except RlmeshError as err:
    ...     print(type(err).__name__, isinstance(err, ValueError))
    SpecError True
"""

from __future__ import annotations


class RlmeshError(Exception):
    """The base of every error rlmesh raises."""


class SpecError(RlmeshError, ValueError):
    """A model spec is malformed, or does not fit the environment's spaces.

    Raised when a leaf or ``Action`` is constructed with an invalid argument (an unknown
    layout or dtype, ``stack`` out of 1..64), when ``ModelSpec.from_dict`` meets an unknown
    type or field (or a ``Custom`` leaf it was not allowed to import), when ``to_dict``
    cannot name a ``Custom`` function, and when compiling a spec against the observation and
    action spaces finds a key the observation lacks, a leaf of the wrong kind, or a rescale
    the action space cannot take. The message names the leaf, the key and what the space
    holds.
    """


class ModelOutputError(RlmeshError, ValueError):
    """The model returned an action of the wrong shape, dtype, count or range.

    Raised while applying the action plan to what the model returned. The message names the
    lane, what the action space expects and what came back.
    """


class ObservationError(RlmeshError, ValueError):
    """An environment returned an observation that does not fit its observation space.

    Raised while assembling the model's input: a key the plan reads is missing, or a leaf has
    another shape than the space declares. The message names the lane, the key, what the space
    declares and what came back.
    """


class ModelDefinitionError(RlmeshError, TypeError):
    """The object given as the model cannot be called as one.

    Raised when the run is configured, before any env is made: the model defines none of the
    four corners (``predict``, ``predict_batch``, ``predict_chunk``, ``predict_chunk_batch``),
    is a class rather than an instance, or is neither a ``Model`` nor a callable. The message
    names the model and how to fix it.
    """


class ModelError(RlmeshError):
    """The model raised while loading, predicting or handling an episode's end.

    The model's own exception is the ``__cause__``; the message says which call failed.
    """


class HookError(RlmeshError):
    """A ``RunHooks`` callback or a transform hook raised; the run stops.

    Observers in ``RuntimeHooks`` never raise this: their errors are logged and counted.
    """


class OperationTimeout(RlmeshError):  # noqa: N818 - the public name the run API promises
    """An operation (``reset``, ``step`` or ``predict``) took longer than its limit in
    ``timeouts=``. The message names the operation, the step and the limit.
    """


class StatefulModelError(RlmeshError):
    """A model keeps state across calls, so the lanes of a run with ``num_envs > 1`` cannot share
    it.

    Raised by the probe the driver runs before such a run (``ModelHandler.check_stateless``).
    The message says which output element drifted, with what, and what to do instead.
    """


class EnvError(RlmeshError):
    """The environment could not be made, or raised.

    Raised by ``rlmesh.lanes.make_lanes`` when ``gymnasium.make`` or the user's factory fails
    (an unknown id, a bad keyword), and by a lane vector when an env's ``reset`` or ``step``
    raises. The message names the env and, where one is involved, the lane; the env's own
    exception is chained as ``__cause__``.
    """


class LaneFailures(EnvError):  # noqa: N818 - an EnvError that names its lanes
    """The envs of some lanes raised during one ``reset`` or ``step`` of several lanes, and
    the other lanes' results are kept.

    Raised by ``Lanes.reset`` / ``Lanes.step`` (in-process, process and remote lanes), which
    call every lane even when one fails. Its message and ``__cause__`` are those of the first
    failed lane's ``EnvError``, so a run with ``on_error="raise"`` fails as with any env
    error; with ``"record"`` or ``"retry"`` the driver abandons the failed lanes' episodes and
    goes on with the rest.

    Attributes:
        errors: ``{lane: "<ExceptionType>: <message>"}``, the env's own exception per lane
            that failed.
        outcome: what the call returned for the lanes that did not fail: a ``StepBatch`` of
            them (``step``), or ``(lanes, observations, infos)`` (``reset``).

    Example:
        >>> failure = LaneFailures("lane 1 (Pit): step() raised OSError: gone",
        ...                        errors={1: "OSError: gone"}, outcome=None)
        >>> isinstance(failure, EnvError), failure.errors
        (True, {1: 'OSError: gone'})
    """

    def __init__(self, message: str, *, errors: dict[int, str], outcome: object) -> None:
        super().__init__(message)
        self.errors = errors
        self.outcome = outcome


class RemoteError(RlmeshError):
    """A served env or model failed: it could not be reached, refused the handshake or the
    token, went away mid-run, or answered with an error.

    Attributes:
        address: the server's address as the user gave it (``"tcp://127.0.0.1:50051"``).
        code: the wire's error code name (``"ENV_ERROR_CODE_TIMEOUT"``), or the gRPC status
            name (``"UNAVAILABLE"``), or None.
        detail: the server's own message when it answered with an error (the message above
            adds the address, the call and the code around it), else None.
    """

    def __init__(
        self, message: str, *, address: str, code: str | None = None, detail: str | None = None
    ) -> None:
        super().__init__(message)
        self.address = address
        self.code = code
        self.detail = detail


class ResultsFileError(RlmeshError):
    """A results file cannot be written or resumed as asked.

    Raised by ``rlmesh.results.ResultsFile`` when a file that already holds results is opened
    without ``resume`` (pass ``--resume`` / ``resume=True``, or choose another path), when its
    header records another configuration than the run's (the message lists each differing
    field, the file's value and the run's), and when a line is not a results line. The message
    names the file and, where one is involved, the line.
    """


class ResultsFileLockedError(ResultsFileError):
    """Another writer holds the results file: a second run must not append to it.

    Raised by ``rlmesh.results.ResultsFile.open`` (and so by ``rlmesh.run(results_path=...)``
    and ``rlmesh eval --out``) before the file is read or written. ``path`` is the results
    file; ``holder`` is what the holder recorded of itself (``pid``, ``host``, ``since``), empty
    when it had not recorded it yet. Readers (``read_results``, ``rlmesh report``) take no lock.
    """

    def __init__(self, message: str, *, path: str, holder: dict) -> None:
        super().__init__(message)
        self.path = path
        self.holder = holder


def call_failure(where: str, error: Exception, rounds: int) -> Exception:
    """The error a run raises when the env or model call ``where`` (``"env.step"``,
    ``"model.predict"``, ...) raised ``error`` after ``rounds`` rounds: an ``RlmeshError`` as
    it is, anything else as an ``EnvError`` (``where`` an ``env.`` call) or a ``ModelError``
    that says where and when (raise it ``from error``).

    Example:
        >>> call_failure("model.predict", RuntimeError("boom"), 12)
        ModelError("model.predict raised RuntimeError('boom') at round 12")
    """
    if isinstance(error, RlmeshError):
        return error
    kind = EnvError if where.startswith("env.") else ModelError
    return kind(f"{where} raised {error!r} at round {rounds}")
