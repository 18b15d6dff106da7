"""The statefulness probe: refuse a model that keeps state across calls, since lanes share it.

``check_stateless`` calls the model's corner on two fixed one-lane inputs in a set order and
looks for outputs that depend on the calls before them (docs/semantics.md, "Corners of a
model"); ``ModelHandler.check_stateless`` runs it before a run's first round.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ModelError, ModelOutputError, RlmeshError, StatefulModelError
from ..utils import leaves, path_text

# Every function takes the run's ``ModelHandler`` as ``handler`` (``rlmesh.model.handler``,
# which imports this module): its model, corner and ``probe_call``.
ModelHandler = Any

# The stateful-model probe's statistical check (see ``check_stateless``): rounds of
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


async def check_stateless(handler: ModelHandler, sample_a: Any, sample_b: Any) -> None:
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
        >>> import numpy as np
        >>> from rlmesh.model import ModelHandler
        >>> calls = []
        >>> handler = ModelHandler(lambda obs: calls.append(obs) or obs * 2)
        >>> asyncio.run(handler.check_stateless(np.zeros((1, 2)), np.ones((1, 2))))
        >>> len(calls)  # a deterministic model: the quick check alone
        5
    """
    if not handler.needs_probe:
        return
    try:
        outputs = [
            _numbers(await handler.probe_call(sample))
            for sample in (sample_a, sample_a, sample_a, sample_b, sample_a)
        ]
        outputs_a = outputs[:3] + outputs[4:]
        if all(_identical(outputs_a[0], output) for output in outputs_a[1:]):
            return
        await _statistical_check(handler, sample_a, sample_b)
    except StatefulModelError:
        raise
    except Exception as err:
        raise _probe_failure(handler, err) from err


async def _statistical_check(handler: ModelHandler, sample_a: Any, sample_b: Any) -> None:
    outputs_a: list[np.ndarray] = []
    follows_b: list[bool] = []
    for _ in range(PROBE_ROUNDS):
        await handler.probe_call(sample_b)
        for after_b in (True, False):
            outputs_a.append(_numbers(await handler.probe_call(sample_a)))
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
                    _stateful_message(handler, name, element, statistic, correlation, threshold)
                )


def _probe_failure(handler: ModelHandler, err: Exception) -> RlmeshError:
    """``err``, raised by a probe call, as the error of the same kind saying so."""
    where = (
        f"during the statefulness probe (before the first round: {type(handler.model).__name__}"
        f".{handler.corner} was called on one lane's observation, K = 1, to check that lanes "
        f"can share it; set `stateless = True` on the model class to skip the probe)"
    )
    if isinstance(err, RlmeshError):
        try:
            return type(err)(f"{err} {where}")
        except TypeError:  # an error class of the user's, built otherwise
            pass
    return ModelError(f"model.{handler.corner} raised {err!r} {where}")


def _stateful_message(
    handler: ModelHandler,
    name: str,
    element: int,
    statistic: str,
    correlation: float,
    threshold: float,
) -> str:
    return (
        f"{type(handler.model).__name__}.{handler.corner} keeps state across calls, so lanes "
        f"cannot share it (num_envs > 1): called {2 * PROBE_ROUNDS} times on one fixed "
        f"observation with another one in between, element {element} of its output tracked "
        f"{name} ({statistic} {correlation:+.2f}; outputs that vary by noise alone stay "
        f"below {threshold}). Keep what the model remembers per episode: declare a "
        f"`context` parameter on {handler.corner} and keep it in context['state'] (one "
        f"dict per episode), or carry history in the observation (stack= in the "
        f"ModelSpec); or run with num_envs=1, where one lane owns the model"
    )


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
