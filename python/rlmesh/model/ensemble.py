"""``TemporalEnsemble``: a run's setting for executing action chunks by temporal ensembling.

An action-chunking policy (ACT, diffusion policies, pi0) predicts ``H`` future actions at a
time. Replaying them (``execution_horizon=E``) executes ``E`` actions of one chunk before the
model is asked again. Temporal ensembling (ACT, Zhao et al. 2023, "Learning Fine-Grained
Bimanual Manipulation with Low-Cost Hardware") asks the model at every step instead, and
executes at step ``t`` the weighted average of every prediction made for ``t``: with ``n``
chunks predicted at steps ``s_0 < s_1 < ... < s_{n-1} <= t`` that still reach ``t``,

    a_t = sum_i w_i * chunk_i[t - s_i] / sum_i w_i,    w_i = exp(-m * i),  i = 0 the oldest.

The buffers live in the core (``TemporalEnsembles``, both cores, to the bit), one per lane and
per episode: a lane's next episode starts with an empty buffer. The average is taken of the
env actions (after the spec's rescaling and clipping), so every action leaf must be a Box of
floats; a run with a discrete leaf is refused.

Example:
    >>> TemporalEnsemble()
    TemporalEnsemble(m=0.01)
    >>> TemporalEnsemble(m=0.1).to_json()
    {'m': 0.1}
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..utils import path_text

if TYPE_CHECKING:
    from ..adapters import Plan

DEFAULT_RATE = 0.01
"""ACT's ``m``: older predictions weigh slightly more."""


@dataclass(frozen=True)
class TemporalEnsemble:
    """Execute chunks by temporal ensembling: ``rlmesh.run(..., ensemble=TemporalEnsemble())``
    (``rlmesh eval --ensemble M``).

    Args:
        m: the weights' rate, ``w_i = exp(-m * i)`` with ``i = 0`` the oldest chunk covering
            the step; finite and ``>= 0`` (0: a plain mean; larger: trust older predictions
            more).

    Raises:
        ValueError: ``m`` is not a finite number >= 0.
    """

    m: float = DEFAULT_RATE

    def __post_init__(self) -> None:
        if isinstance(self.m, bool) or not isinstance(self.m, (int, float)):
            raise ValueError(f"TemporalEnsemble(m=...) takes a number >= 0, got {self.m!r}")
        if not (math.isfinite(self.m) and self.m >= 0):
            raise ValueError(f"TemporalEnsemble(m=...) takes a finite number >= 0, got {self.m}")
        object.__setattr__(self, "m", float(self.m))

    def check_actions(self, plan: Plan, env: str) -> None:
        """Refuse a run whose actions cannot be averaged: every leaf of ``plan.action`` must
        be a Box of floats.

        Raises:
            ValueError: naming the leaf, its kind and dtype, and the env.

        Example:
            >>> import gymnasium as gym
            >>> from rlmesh.adapters import compile_spec
            >>> plan = compile_spec(None, gym.spaces.Box(0, 1, (2,)), gym.spaces.Discrete(3))
            >>> TemporalEnsemble().check_actions(plan, "Toy-v0")
            Traceback (most recent call last):
            ...
            ValueError: ensemble= averages actions, but Toy-v0's action is a discrete leaf ...
        """
        for leaf in plan.action:
            if leaf.kind != "box" or not leaf.dtype.startswith("float"):
                raise ValueError(
                    f"ensemble= averages actions, but {env}'s {path_text('action', leaf.path)} "
                    f"is a {leaf.kind.replace('_', '-')} leaf of {leaf.dtype}, and an average "
                    f"of those is not an action: temporal ensembling needs Box actions of "
                    f"floats; run this env without ensemble= (execution_horizon= replays "
                    f"chunks instead)"
                )

    def to_json(self) -> dict[str, Any]:
        """What a results file's header records (and a resumed run must match)."""
        return {"m": self.m}
