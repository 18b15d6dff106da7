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
    type or field, when ``to_dict`` cannot name a ``Custom`` function, and when compiling a
    spec against the observation and action spaces finds a key the observation lacks, a leaf
    of the wrong kind, or a rescale the action space cannot take. The message names the leaf,
    the key and what the space holds.
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


class EnvError(RlmeshError):
    """The environment could not be made, or raised.

    Raised by ``rlmesh.envs.make_lanes`` when ``gymnasium.make`` or the user's factory fails
    (an unknown id, a bad keyword), and by a lane vector when an env's ``reset`` or ``step``
    raises. The message names the env and, where one is involved, the lane; the env's own
    exception is chained as ``__cause__``.
    """
