"""Anytime-valid statistics: confidence sequences for a bounded mean, and a paired e-process.

A fixed-n interval (``intervals.wilson_interval``) holds at the one n chosen before the data:
looked at after every episode, and the run stopped once it looks narrow enough, it misses far
more often than its 5%. A **confidence sequence** (CS) is a sequence of intervals
``[lower_n, upper_n]`` that covers the mean at every n at once, with probability at least
``1 - alpha``, so a run may look after every episode and stop whenever it likes. Both CSs here
are for the mean of observations in [0, 1] that share one conditional mean given the past (a
success rate; a return rescaled from known bounds with ``rescale``), and come from Waudby-Smith
and Ramdas, "Estimating means of bounded random variables by betting", J. R. Stat. Soc. B
86(1), 2024 (online 2023; arXiv:2010.09686), "WSR" below. Each takes the running intersection
(``lower_n`` never falls, ``upper_n`` never rises), which keeps the coverage.

The predictable estimates both use (WSR's regularised ones): before observation t,
``mu_{t-1} = (1/2 + sum_{i<t} x_i) / t`` and ``s2_{t-1} = (1/4 + sum_{i<t} (x_i - mu_i)^2) / t``
(``mu_0 = 1/2``, ``s2_0 = 1/4``), and the bet
``b_t = sqrt(2 log(2/alpha) / (s2_{t-1} t log(1 + t)))``.

- ``"betting"`` (the default; WSR Theorem 3, the hedged capital CS): for a candidate mean m,
  ``K+_t(m) = prod_{i<=t} (1 + min(b_i, c/m) (x_i - m))`` bets that the mean is above m and
  ``K-_t(m) = prod_{i<=t} (1 - min(b_i, c/(1-m)) (x_i - m))`` below it (``c = 1/2``). Under
  mean m both are nonnegative martingales of initial value 1, so by Ville's inequality
  ``max(K+/2, K-/2)``, bounded by their average, reaches ``1/alpha`` with probability at most
  ``alpha``: the CS is every m where it has not. ``K+`` falls and ``K-`` rises with m, so the
  CS is an interval, found on the grid ``m = j / grid``: ``lower_n`` is the largest grid
  point ``K+`` rejects (0 if none), ``upper_n`` the smallest ``K-`` rejects (1 if none). The
  grid only widens the interval (by at most ``1/grid`` a side), never narrows it. It is the
  tighter of the two over the first few hundred observations, and for rates near 0 or 1
  (at n=100: 10 to 30% narrower); by n=1000 the two are within a few percent.
- ``"empirical_bernstein"`` (WSR Theorem 2, the predictable plug-in empirical-Bernstein CS):
  with ``l_t = min(b_t, c)``, ``v_t = 4 (x_t - mu_{t-1})^2`` and
  ``psi(l) = (-log(1 - l) - l) / 4``, the interval is
  ``sum l_i x_i / sum l_i -/+ (log(2/alpha) + sum v_i psi(l_i)) / sum l_i``, clipped to
  [0, 1]. A closed form: cheaper, and wider over the first few hundred observations.

The **paired test** (``paired_test``) is for two policies played on the same episodes: the
differences ``d_k = a_k - b_k`` in [-1, 1] become ``y_k = (d_k + 1) / 2`` in [0, 1], and "no
difference" is mean ``1/2``. Its e-process is the hedged capital at ``m = 1/2``,
``E_n = max(K+_n(1/2), K-_n(1/2)) / 2``: bounded by a nonnegative martingale of initial value 1
under the null, so ``P(sup_n E_n >= 1/alpha) <= alpha`` (Ville). Its anytime-valid p-value is
``p_n = min(1, 1 / max_{k<=n} E_k)``: rejecting when ``p_n <= alpha``, checked after every
pair or every block, is wrong with probability at most ``alpha``. ``E_n`` is computed with the
very arithmetic of the CS's grid point ``1/2``, so ``p_n <= alpha`` exactly when the CS of the
difference has left 0 behind (``lower_n >= 0`` or ``upper_n <= 0``).

Everything takes arrays of any leading shape ``[..., n]`` (runs side by side) and returns
arrays of that shape; ``ConfidenceSequence`` is the same computation one observation at a
time (what a run that stops on precision updates after each episode).

Example:
    >>> x = np.array([1, 0, 1, 1, 0, 1, 1, 1] * 25, dtype=float)  # 200 values, mean 0.75
    >>> lower, upper = confidence_sequence(x)
    >>> lower.shape, bool(lower[-1] < 0.75 < upper[-1]), bool(upper[-1] - lower[-1] < 0.3)
    ((200,), True, True)
    >>> test = paired_test(np.ones(60), np.zeros(60))  # A always wins
    >>> bool(test.p_value[-1] <= 0.05), float(test.lower[-1]) > 0
    (True, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

METHODS = ("betting", "empirical_bernstein")
"""The confidence sequences ``confidence_sequence`` computes (the module docstring gives each)."""
DEFAULT_METHOD = "betting"
GRID = 1000
"""The betting CS's candidate means ``j / GRID``: its bounds are at most ``1/GRID`` wider a
side than the exact CS's."""
TRUNCATION = 0.5
"""``c``: a bet never risks more than this share of the capital (WSR's suggested 1/2)."""
THETA = 0.5
"""The hedge: the weight of the bet on a larger mean (WSR's 1/2: no side favoured)."""


def check_alpha(alpha: float) -> float:
    """``alpha`` as a float in (0, 1); ValueError otherwise.

    Example:
        >>> check_alpha(0.05)
        0.05
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating)):
        raise ValueError(f"alpha must be a number in (0, 1) (0.05: 95% coverage), got {alpha!r}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1) (0.05: 95% coverage), got {alpha}")
    return float(alpha)


def rescale(x: Any, low: float, high: float) -> np.ndarray:
    """``x`` mapped from ``[low, high]`` onto [0, 1]: ``(x - low) / (high - low)``.

    Raises:
        ValueError: the bounds are not finite with ``low < high``, or a value is outside
            them (the message gives the first such value and where it is).

    Example:
        >>> rescale([0.0, 250.0, 500.0], 0, 500)
        array([0. , 0.5, 1. ])
    """
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"bounds must be finite with low < high, got ({low}, {high})")
    values = np.asarray(x, dtype=np.float64)
    outside = ~((values >= low) & (values <= high))  # nan is outside too
    if outside.any():
        where = tuple(int(i) for i in np.argwhere(outside)[0])
        raise ValueError(
            f"value {values[where]} at position {where if len(where) > 1 else where[0]} is "
            f"outside the bounds [{low}, {high}]"
        )
    return (values - low) / (high - low)


class _Estimates:
    """The predictable mean, variance and bet before each observation (the module docstring
    gives them), for runs of any leading shape."""

    def __init__(self, shape: tuple[int, ...], alpha: float) -> None:
        self.t = 0
        self.total = np.zeros(shape)
        self.squares = np.full(shape, 0.25)  # 1/4 + sum (x_i - mu_i)^2
        self.mean = np.full(shape, 0.5)  # mu_{t}
        self.variance = np.full(shape, 0.25)  # s2_{t}
        self.log_term = 2 * math.log(2 / alpha)

    def bet(self) -> np.ndarray:
        """``b_t`` for the next observation, t = observations so far + 1."""
        t = self.t + 1
        return np.sqrt(self.log_term / (self.variance * t * math.log1p(t)))

    def update(self, x: np.ndarray) -> None:
        self.t += 1
        self.total += x
        self.mean = (0.5 + self.total) / (self.t + 1)
        self.squares += (x - self.mean) ** 2
        self.variance = self.squares / (self.t + 1)


class ConfidenceSequence:
    """A CS for the mean of observations in [0, 1], updated one observation at a time (for
    ``shape`` runs side by side): what ``confidence_sequence`` computes, at each n.

    ``update(x)`` (x of ``shape``) takes the next observation of each run and returns the
    running ``(lower, upper)``; ``lower``, ``upper`` and ``n`` hold the latest. Before any
    observation the interval is [0, 1]. A run with ``method="betting"`` keeps two arrays of
    ``shape + [grid + 1]`` log capitals; an update costs O(grid) at most, and less as the
    interval narrows: only the means within some run's running interval are updated (the
    bounds are the same). ``prune=False`` keeps every mean's capital current
    (``capital_at_half`` reads one).

    Example:
        >>> cs = ConfidenceSequence(alpha=0.05)
        >>> for value in [1.0, 1.0, 0.0, 1.0] * 10:
        ...     lower, upper = cs.update(value)
        >>> cs.n, bool(0 < float(lower) < 0.75 < float(upper) < 1)
        (40, True)
    """

    def __init__(
        self,
        *,
        alpha: float = 0.05,
        method: str = DEFAULT_METHOD,
        grid: int = GRID,
        shape: tuple[int, ...] = (),
        prune: bool = True,
    ) -> None:
        self.alpha = check_alpha(alpha)
        if method not in METHODS:
            raise ValueError(f"method must be one of {list(METHODS)}, got {method!r}")
        if isinstance(grid, bool) or not isinstance(grid, (int, np.integer)) or grid < 2:
            raise ValueError(f"grid must be an integer of at least 2, got {grid!r}")
        self.method, self.grid, self.shape = method, int(grid), tuple(shape)
        self.n = 0
        self.lower = np.zeros(self.shape)
        self.upper = np.ones(self.shape)
        self._estimates = _Estimates(self.shape, self.alpha)
        if method == "betting":
            self.means = np.arange(self.grid + 1) / self.grid
            with np.errstate(divide="ignore"):
                self._cap_above = TRUNCATION / self.means  # inf at m = 0
                self._cap_below = TRUNCATION / (1 - self.means)  # inf at m = 1
            self.log_above = np.zeros((*self.shape, self.grid + 1))
            self.log_below = np.zeros((*self.shape, self.grid + 1))
            self._step = np.empty((*self.shape, self.grid + 1))
            self._factor = np.empty((*self.shape, self.grid + 1))
            self._active = (0, self.grid)  # the grid means still updated, first and last
            self._prune = prune
            self._reject_above = math.log(1 / (THETA * self.alpha))
            self._reject_below = math.log(1 / ((1 - THETA) * self.alpha))
        else:
            self._sum_bets = np.zeros(self.shape)
            self._sum_bet_x = np.zeros(self.shape)
            self._sum_penalty = np.zeros(self.shape)

    def update(self, x: Any) -> tuple[np.ndarray, np.ndarray]:
        """Take the next observation (of each run), in [0, 1]; the running interval.

        Raises:
            ValueError: a value is outside [0, 1], or the shape is not the runs' shape.
        """
        x = np.asarray(x, dtype=np.float64)
        if x.shape != self.shape:
            raise ValueError(f"expected one observation per run, shape {self.shape}, got {x.shape}")
        if not np.all((x >= 0) & (x <= 1)):
            raise ValueError(
                f"observations must be in [0, 1] (rescale returns from their bounds), got {x}"
            )
        bet = self._estimates.bet()
        if self.method == "betting":
            lower, upper = self._betting(x, bet)
        else:
            lower, upper = self._bernstein(x, bet)
        self._estimates.update(x)
        self.n += 1
        self.lower = np.maximum(self.lower, lower)
        self.upper = np.minimum(self.upper, upper)
        self._narrow()
        return self.lower, self.upper

    def _betting(self, x: np.ndarray, bet: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # Only the grid means from the lowest running lower bound to the highest upper one
        # are updated: a mean outside every run's running interval can never bound it again
        # (K+ falls with m, so a rejected mean has every lower one rejected too, and the
        # bound that counts is the largest). The bounds are those of the whole grid, at a
        # cost that shrinks with the interval.
        first, last = self._active
        active = slice(first, last + 1)
        width = last + 1 - first
        means = self.means[active]
        # In place, into two scratch arrays: a simulation updates thousands of runs at once.
        step = np.subtract(x[..., None], means, out=self._step[..., :width])
        factor = np.minimum(bet[..., None], self._cap_above[active], out=self._factor[..., :width])
        # Each factor is at least 1 - c > 0: the bets are capped at c/m and c/(1-m).
        factor *= step
        log_above = self.log_above[..., active]
        log_above += np.log1p(factor, out=factor)
        np.minimum(bet[..., None], self._cap_below[active], out=factor)
        factor *= step
        np.negative(factor, out=factor)
        log_below = self.log_below[..., active]
        log_below += np.log1p(factor, out=factor)
        # The means K+ rejects are a prefix of the grid, K-'s a suffix.
        rejected_low = np.count_nonzero(log_above >= self._reject_above, axis=-1)
        rejected_high = np.count_nonzero(log_below >= self._reject_below, axis=-1)
        # (Both sides of a where are computed: the index of "none rejected" stays in range.)
        lower_at = self.means[first + np.maximum(rejected_low, 1) - 1]
        upper_at = self.means[last + 1 - np.maximum(rejected_high, 1)]
        lower = np.where(rejected_low > 0, lower_at, 0.0)
        upper = np.where(rejected_high > 0, upper_at, 1.0)
        return lower, upper

    def _narrow(self) -> None:
        """Keep updating only the grid means within some run's running interval."""
        if self.method != "betting" or not self._prune:
            return
        first = int(np.rint(self.lower * self.grid).min(initial=self.grid))
        last = int(np.rint(self.upper * self.grid).max(initial=0))
        self._active = (max(first, self._active[0]), min(last, self._active[1]))

    def _bernstein(self, x: np.ndarray, bet: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        bet = np.minimum(bet, TRUNCATION)
        penalty = (x - self._estimates.mean) ** 2 * (-np.log1p(-bet) - bet)  # v * psi
        self._sum_bets += bet
        self._sum_bet_x += bet * x
        self._sum_penalty += penalty
        center = self._sum_bet_x / self._sum_bets
        margin = (math.log(2 / self.alpha) + self._sum_penalty) / self._sum_bets
        return np.clip(center - margin, 0, 1), np.clip(center + margin, 0, 1)

    def capital_at_half(self) -> tuple[np.ndarray, np.ndarray]:
        """The betting CS's log capitals ``(log K+_n(1/2), log K-_n(1/2))`` (an even grid,
        ``prune=False``): the paired test's e-process."""
        if self.method != "betting" or self.grid % 2 or self._prune:
            raise ValueError(
                "the capital at 1/2 needs method='betting', an even grid and prune=False"
            )
        half = self.grid // 2
        return self.log_above[..., half], self.log_below[..., half]


def confidence_sequence(
    x: Any, *, alpha: float = 0.05, method: str = DEFAULT_METHOD, grid: int = GRID
) -> tuple[np.ndarray, np.ndarray]:
    """The running anytime-valid CS for the mean of ``x`` (``[..., n]``, values in [0, 1]).

    Args:
        x: observations ``[..., n]``: the last axis is time, the others runs side by side.
        alpha: the CS covers the mean at every n at once with probability at least
            ``1 - alpha``.
        method: ``"betting"`` (hedged capital, the tighter early on) or
            ``"empirical_bernstein"`` (the module docstring gives both).
        grid: the betting CS's candidate means ``j / grid`` (its resolution).

    Returns:
        ``(lower, upper)``, each ``[..., n]``: the interval after observations ``0..k``.

    Raises:
        ValueError: a value outside [0, 1], or a bad ``alpha``, ``method`` or ``grid``.

    Example:
        >>> lower, upper = confidence_sequence([[1, 1, 0, 1], [0, 0, 0, 0]], grid=10)
        >>> lower.shape, upper[1].tolist()  # failure after failure: the bound comes down
        ((2, 4), [1.0, 1.0, 0.9, 0.8])
    """
    values = np.asarray(x, dtype=np.float64)
    if values.ndim == 0:
        raise ValueError("x must hold observations along its last axis, got a scalar")
    cs = ConfidenceSequence(alpha=alpha, method=method, grid=grid, shape=values.shape[:-1])
    lower, upper = np.empty_like(values), np.empty_like(values)
    for k in range(values.shape[-1]):
        lower[..., k], upper[..., k] = cs.update(values[..., k])
    return lower, upper


@dataclass(frozen=True)
class PairedTest:
    """The anytime-valid paired test of ``paired_test``, after each pair (each ``[..., n]``).

    ``e_value``: the e-process ``E_n`` (inf once it overflows); ``p_value``: the anytime-valid
    p-value ``min(1, 1 / max_{k<=n} E_k)``; ``lower`` / ``upper``: the CS of the mean
    difference ``a - b``, in [-1, 1] (None when not asked for); ``favours``: +1 where the
    e-process is betting on a larger ``a`` (its ``K+`` side leads), -1 on a larger ``b``, 0
    on a tie.
    """

    e_value: np.ndarray
    p_value: np.ndarray
    favours: np.ndarray
    lower: np.ndarray | None = None
    upper: np.ndarray | None = None

    def decision(self, alpha: float = 0.05) -> tuple[int | None, int]:
        """For one run (a 1-d test): ``(n, side)`` at the first pair where ``p <= alpha``,
        ``side`` +1 (a is larger) or -1 (b is larger); ``(None, 0)`` when it never is.

        Example:
            >>> paired_test(np.ones(60), np.zeros(60), interval=False).decision(0.05)
            (10, 1)
        """
        if self.p_value.ndim != 1:
            raise ValueError("decision() is for one run: index a batch's test first")
        hits = np.flatnonzero(self.p_value <= alpha)
        if not len(hits):
            return None, 0
        first = int(hits[0])
        return first + 1, int(self.favours[first])


def paired_test(
    a: Any, b: Any, *, alpha: float = 0.05, grid: int = GRID, interval: bool = True
) -> PairedTest:
    """The anytime-valid test of "a and b have the same mean", on paired observations.

    Args:
        a, b: the two policies' observations on the same episodes, ``[..., n]`` each, in
            [0, 1] (successes; returns rescaled with the same bounds).
        alpha: the level the bets are tuned for, and the CS's.
        grid: the resolution of the difference's CS (even, so that 0 is on it).
        interval: also compute the CS of the mean difference (O(grid) per pair); without
            it, the e-process alone costs O(1) per pair.

    Returns:
        A ``PairedTest`` (the module docstring gives the e-process and the p-value).

    Example:
        >>> rng = np.random.default_rng(0)
        >>> a, b = rng.random(300) < 0.8, rng.random(300) < 0.4
        >>> n, side = paired_test(a, b).decision(0.05)
        >>> side, n < 300
        (1, True)
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim == 0:
        raise ValueError(
            f"a and b must be paired observations of one shape [..., n], got {a.shape} and "
            f"{b.shape}"
        )
    for name, values in (("a", a), ("b", b)):
        if not np.all((values >= 0) & (values <= 1)):
            raise ValueError(f"{name} must hold values in [0, 1] (rescale returns first)")
    if grid % 2:
        raise ValueError(f"grid must be even (0 on the difference's grid), got {grid}")
    y = (a - b + 1) / 2
    shape = y.shape[:-1]
    # The e-process on a grid of {0, 1/2, 1}: the same arithmetic at 1/2 as the CS's grid.
    tester = ConfidenceSequence(alpha=alpha, grid=2, shape=shape, prune=False)
    cs = ConfidenceSequence(alpha=alpha, grid=grid, shape=shape) if interval else None
    e_value, favours = np.empty_like(y), np.empty(y.shape, dtype=np.int8)
    lower = np.empty_like(y) if interval else None
    upper = np.empty_like(y) if interval else None
    with np.errstate(over="ignore"):
        for k in range(y.shape[-1]):
            tester.update(y[..., k])
            above, below = tester.capital_at_half()
            e_value[..., k] = np.maximum(THETA * np.exp(above), (1 - THETA) * np.exp(below))
            favours[..., k] = np.sign(above - below)
            if cs is not None:
                low, high = cs.update(y[..., k])
                lower[..., k], upper[..., k] = 2 * low - 1, 2 * high - 1
    p_value = np.minimum(1.0, 1.0 / np.maximum.accumulate(e_value, axis=-1))
    return PairedTest(e_value, p_value, favours, lower, upper)
