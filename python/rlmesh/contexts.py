"""What a corner may be told of the episode it predicts for: ``PredictContext``.

One model serves every lane, so a model that remembers anything across its predictions (a
history buffer, a plan, a recurrent state, a sampler seed) must keep it per episode, not on
the model object. A corner that declares a parameter named ``context`` gets it:

- ``predict(obs, context)`` and ``predict_chunk(obs, execution_horizon, context)``: one
  ``PredictContext``;
- ``predict_batch(obs, context)`` and ``predict_chunk_batch(obs, execution_horizon,
  context)``: a list of them, one per row of the batch, in row order.

A context is the episode's id (the one ``on_episode_end`` later receives), its reset seed,
how many times the episode was predicted for before (a chunked model re-plans once per
chunk), a per-prediction seed derived from those two, and ``state``: a dict that lives as long
as the episode, for the model to keep whatever it carries across predictions. Everything in it
follows the episode, not the lane, so a context-aware model gives the same results for any
``num_envs``.

Example:
    >>> contexts = EpisodeContexts()
    >>> contexts.start([7], seeds=[1234])
    >>> first, = contexts.advance([7])
    >>> first["episode_id"], first["episode_seed"], first["predict_index"]
    (7, 1234, 0)
    >>> first["state"]["seen"] = 1
    >>> second, = contexts.advance([7])
    >>> second["predict_index"], second["state"]
    (1, {'seen': 1})
    >>> contexts.end([7])
    >>> len(contexts)
    0
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypedDict

from .core import active as _core

CONTEXT_PARAMETER = "context"


class PredictContext(TypedDict):
    """What a corner is told of the episode it predicts for.

    Attributes:
        episode_id: the episode's id in this run (``on_episode_end`` receives the same); None
            for a prediction outside any episode (the statefulness probe).
        episode_seed: the seed the episode was reset with; None when the env chose it.
        predict_index: how many times this episode was predicted for before: 0 on its first
            prediction (one per chunk for a chunked model, not one per env step).
        predict_seed: ``rlmesh._core.episode_seed(episode_seed, predict_index)``, a seed for a
            stochastic head that is the same on any lane and any ``num_envs``; None when the
            episode has no seed.
        state: a dict that lives as long as the episode, empty at its first prediction and
            dropped when it ends.
    """

    episode_id: int | None
    episode_seed: int | None
    predict_index: int
    predict_seed: int | None
    state: dict[str, Any]


def accepts_context(fn: Callable[..., Any]) -> bool:
    """Whether the corner ``fn`` declares a parameter named ``context`` (passed by keyword)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature takes no context
        return False
    return any(
        parameter.name == CONTEXT_PARAMETER
        and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
        for parameter in parameters
    )


class _Episode:
    __slots__ = ("predictions", "seed", "state")

    def __init__(self, seed: int | None) -> None:
        self.seed = seed
        self.predictions = 0
        self.state: dict[str, Any] = {}


class EpisodeContexts:
    """The running episodes' contexts, from their start to their end.

    Memory is bounded by the running episodes: an episode's entry goes at ``end``.
    """

    def __init__(self) -> None:
        self._episodes: dict[int, _Episode] = {}

    def __len__(self) -> int:
        return len(self._episodes)

    def start(self, episode_ids: Iterable[int], seeds: Sequence[int | None]) -> None:
        """Episodes ``episode_ids`` started, reset with ``seeds`` (None: the env chose)."""
        for episode_id, seed in zip(episode_ids, seeds, strict=True):
            self._episodes[int(episode_id)] = _Episode(seed)

    def end(self, episode_ids: Iterable[int]) -> None:
        """Episodes ``episode_ids`` ended: their contexts and state go."""
        for episode_id in episode_ids:
            self._episodes.pop(int(episode_id), None)

    def advance(self, episode_ids: Iterable[int] | None, count: int = 1) -> list[PredictContext]:
        """The contexts of one prediction for each of ``episode_ids``, in order; each
        episode's ``predict_index`` moves on by one.

        ``episode_ids=None`` is a prediction outside any episode: ``count`` anonymous
        contexts with fresh, empty state.

        Raises:
            KeyError: an episode that never started, or already ended.
        """
        if episode_ids is None:
            return [_context(None, _Episode(None)) for _ in range(count)]
        contexts = []
        for episode_id in episode_ids:
            episode = self._episodes.get(int(episode_id))
            if episode is None:
                raise KeyError(f"episode {episode_id} has no context: it never started or ended")
            contexts.append(_context(int(episode_id), episode))
            episode.predictions += 1
        return contexts


def _context(episode_id: int | None, episode: _Episode) -> PredictContext:
    seed = episode.seed
    return PredictContext(
        episode_id=episode_id,
        episode_seed=seed,
        predict_index=episode.predictions,
        predict_seed=None if seed is None else _core.episode_seed(seed, episode.predictions),
        state=episode.state,
    )
