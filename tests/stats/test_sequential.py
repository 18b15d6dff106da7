"""Anytime-valid confidence sequences and the paired e-process (``rlmesh.stats.sequential``).

Coverage is checked by simulation, at every n of each simulated run at once: a run counts as
covered only if no interval along it missed the true mean. The runs are seeded, so every
figure here is the same on every machine.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from rlmesh.stats.sequential import (
    GRID,
    THETA,
    TRUNCATION,
    ConfidenceSequence,
    confidence_sequence,
    paired_test,
    rescale,
)

RATES = (0.05, 0.3, 0.5, 0.9)
ALPHA = 0.05
METHODS = ("betting", "empirical_bernstein")


def bernoulli_runs(rate: float, runs: int, n: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).random((runs, n)) < rate).astype(np.float64)


def covered_everywhere(rate: float, runs: int, n: int, method: str, seed: int) -> float:
    """The share of ``runs`` simulated Bernoulli(rate) runs whose CS covers ``rate`` at every
    n up to ``n`` (200 runs at a time: the betting CS holds [runs, grid] arrays)."""
    x = bernoulli_runs(rate, runs, n, seed)
    missed = 0
    for block in range(0, runs, 200):
        lower, upper = confidence_sequence(x[block : block + 200], alpha=ALPHA, method=method)
        missed += int(((lower > rate) | (upper < rate)).any(axis=1).sum())
    return 1 - missed / runs


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("rate", RATES)
def test_the_cs_covers_the_rate_at_every_n_in_most_runs(rate, method):
    # 400 runs: a CS that held the rate at every n in only 95% of runs would pass this with
    # probability about 1%; these CSs miss in 1-3% of runs, so they pass by a wide margin.
    runs = 400
    tolerance = 2.33 * math.sqrt(ALPHA * (1 - ALPHA) / runs)
    coverage = covered_everywhere(rate, runs, 200, method, seed=int(rate * 1000))
    assert coverage >= 1 - ALPHA - tolerance


@pytest.mark.benchmarks
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("rate", RATES)
def test_the_cs_covers_the_rate_at_every_n_in_95_percent_of_2000_runs(rate, method):
    assert covered_everywhere(rate, 2000, 300, method, seed=7 + int(rate * 1000)) >= 1 - ALPHA


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_the_cs_narrows_and_betting_is_the_tighter_early(rate):
    x = bernoulli_runs(rate, 50, 1000, seed=3)
    widths = {}
    for method in METHODS:
        lower, upper = confidence_sequence(x, method=method)
        width = upper - lower
        assert np.all(np.diff(width, axis=1) <= 1e-12)  # the running intersection
        assert np.all(width[:, -1] < width[:, 99])
        widths[method] = width.mean(axis=0)
    # At n=1000 a fixed-n 95% interval's half-width is 1.96 sqrt(p(1-p)/n): 0.019 at 0.1,
    # 0.031 at 0.5. An anytime-valid one pays a factor of about 2 for holding at every n.
    fixed = 1.96 * math.sqrt(rate * (1 - rate) / 1000)
    assert fixed < widths["betting"][-1] / 2 < 2.5 * fixed
    # Betting is the tighter over the first hundreds; by n=1000 the two are close.
    assert widths["betting"][99] < 0.95 * widths["empirical_bernstein"][99]
    assert widths["betting"][-1] == pytest.approx(widths["empirical_bernstein"][-1], rel=0.1)


def test_one_observation_at_a_time_equals_the_whole_sequence_and_runs_are_independent():
    x = np.random.default_rng(11).random((3, 150))
    for method in METHODS:
        lower, upper = confidence_sequence(x, method=method)
        cs = ConfidenceSequence(method=method)
        for k in range(150):
            low, high = cs.update(x[1, k])
            assert (float(low), float(high)) == (lower[1, k], upper[1, k])
        alone_lower, alone_upper = confidence_sequence(x[2], method=method)
        np.testing.assert_array_equal(alone_lower, lower[2])
        np.testing.assert_array_equal(alone_upper, upper[2])


def hedged_bounds_by_hand(x: list[float], grid: int) -> tuple[list[float], list[float]]:
    """WSR's hedged capital CS written out as plain loops: at each n, the grid means whose
    capital ``max(K+, K-) / 2`` reached ``1/alpha``, and the interval between them."""
    lowers, uppers = [], []
    means = [j / grid for j in range(grid + 1)]
    above = [1.0] * len(means)
    below = [1.0] * len(means)
    total, squares, variance = 0.0, 0.25, 0.25
    lower, upper = 0.0, 1.0
    for t, value in enumerate(x, start=1):
        bet = math.sqrt(2 * math.log(2 / ALPHA) / (variance * t * math.log(1 + t)))
        for j, m in enumerate(means):
            above[j] *= 1 + min(bet, TRUNCATION / m if m else math.inf) * (value - m)
            below[j] *= 1 - min(bet, TRUNCATION / (1 - m) if m < 1 else math.inf) * (value - m)
        total += value
        mean = (0.5 + total) / (t + 1)
        squares += (value - mean) ** 2
        variance = squares / (t + 1)
        rejected_low = [m for j, m in enumerate(means) if THETA * above[j] >= 1 / ALPHA]
        rejected_high = [m for j, m in enumerate(means) if (1 - THETA) * below[j] >= 1 / ALPHA]
        lower = max(lower, max(rejected_low, default=0.0))
        upper = min(upper, min(rejected_high, default=1.0))
        lowers.append(lower)
        uppers.append(upper)
    return lowers, uppers


def test_the_betting_cs_is_the_hedged_capital_cs_of_the_paper():
    x = np.random.default_rng(5).random(40).round(2)
    x[:10] = 1.0  # a run of successes first: the bets hit their caps c/m
    lower, upper = confidence_sequence(x, grid=50)
    by_hand = hedged_bounds_by_hand(x.tolist(), 50)
    np.testing.assert_allclose(lower, by_hand[0], atol=1e-12)
    np.testing.assert_allclose(upper, by_hand[1], atol=1e-12)
    assert lower[-1] > 0 and upper[-1] < 1  # the comparison saw bounds move


def test_the_grid_only_widens_the_interval():
    x = bernoulli_runs(0.3, 10, 200, seed=2)
    fine_lower, fine_upper = confidence_sequence(x, grid=2000)
    coarse_lower, coarse_upper = confidence_sequence(x, grid=20)
    assert np.all(coarse_lower <= fine_lower + 1e-12)
    assert np.all(coarse_upper >= fine_upper - 1e-12)


# ---------------------------------------------------------------------------- paired test


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.8])
def test_equal_policies_are_told_apart_in_at_most_alpha_of_runs(rate):
    """Independent outcomes of two equal policies, checked after every pair (and so after
    every block of pairs too, a subset of those looks)."""
    rng = np.random.default_rng(int(rate * 100))
    a = (rng.random((2000, 400)) < rate).astype(np.float64)
    b = (rng.random((2000, 400)) < rate).astype(np.float64)
    test = paired_test(a, b, alpha=ALPHA, interval=False)
    assert (test.p_value <= ALPHA).any(axis=1).mean() <= ALPHA
    # The p-value is anytime-valid at every level, not only at alpha.
    smallest = test.p_value.min(axis=1)
    for level in (0.01, 0.1, 0.2):
        assert (smallest <= level).mean() <= level


def test_correlated_equal_policies_are_told_apart_in_at_most_alpha_of_runs():
    # Two equal policies on the same episodes: each episode's difficulty moves both.
    rng = np.random.default_rng(21)
    difficulty = rng.random((2000, 400))
    a = (rng.random((2000, 400)) < difficulty).astype(np.float64)
    b = (rng.random((2000, 400)) < difficulty).astype(np.float64)
    test = paired_test(a, b, interval=False)
    assert (test.p_value <= ALPHA).any(axis=1).mean() <= ALPHA


def test_a_better_policy_is_found_and_the_decision_matches_the_interval():
    rng = np.random.default_rng(4)
    a = (rng.random((100, 300)) < 0.8).astype(np.float64)
    b = (rng.random((100, 300)) < 0.5).astype(np.float64)
    for first, second, side in ((a, b, 1), (b, a, -1)):
        test = paired_test(first, second)
        decided = test.p_value <= ALPHA
        assert decided[:, -1].mean() >= 0.95
        # The e-process is the CS's capital at no difference: rejecting is the CS leaving 0.
        np.testing.assert_array_equal(decided, (test.lower >= 0) | (test.upper <= 0))
        at = decided.argmax(axis=1)[decided[:, -1]]
        assert np.all(test.favours[decided[:, -1], at] == side)
    n, winner = paired_test(a[0], b[0], interval=False).decision(ALPHA)
    assert winner == 1 and n == int(decided.argmax(axis=1)[0]) + 1


def test_the_paired_cs_covers_the_true_difference():
    rng = np.random.default_rng(8)
    a = (rng.random((300, 200)) < 0.7).astype(np.float64)
    b = (rng.random((300, 200)) < 0.4).astype(np.float64)
    test = paired_test(a, b)
    missed = ((test.lower > 0.3) | (test.upper < 0.3)).any(axis=1).mean()
    assert missed <= ALPHA + 2.33 * math.sqrt(ALPHA * (1 - ALPHA) / 300)


# ---------------------------------------------------------------------------- inputs


def test_rescale_maps_bounds_onto_the_unit_interval_and_refuses_values_outside():
    np.testing.assert_array_equal(rescale([-1.0, 0.0, 3.0], -1, 3), [0.0, 0.25, 1.0])
    with pytest.raises(ValueError, match=r"value 4.0 at position 1 is outside the bounds"):
        rescale([0.0, 4.0], 0, 3)
    with pytest.raises(ValueError, match="finite with low < high"):
        rescale([0.0], 1, 1)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"x": [0.5, 1.2]}, r"observations must be in \[0, 1\]"),
        ({"x": [0.5, float("nan")]}, r"observations must be in \[0, 1\]"),
        ({"x": [0.5], "alpha": 1.0}, r"alpha must be in \(0, 1\)"),
        ({"x": [0.5], "method": "hoeffding"}, "method must be one of"),
        ({"x": [0.5], "grid": 1}, "grid must be an integer of at least 2"),
        ({"x": 0.5}, "got a scalar"),
    ],
)
def test_bad_inputs_are_refused_saying_what_was_expected(arguments, message):
    with pytest.raises(ValueError, match=message):
        confidence_sequence(**arguments)


def test_the_paired_test_refuses_unpaired_or_unbounded_observations():
    with pytest.raises(ValueError, match="paired observations of one shape"):
        paired_test(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match=r"b must hold values in \[0, 1\]"):
        paired_test(np.ones(3), np.full(3, 2.0))
    with pytest.raises(ValueError, match="grid must be even"):
        paired_test(np.ones(3), np.ones(3), grid=GRID + 1)


# ---------------------------------------------------------------------------- an established one


def _confseq():
    """confseq's betting and predictable-mixture modules, or a skip saying why not.

    confseq 0.0.11 (the newest on PyPI) has no wheel: its sdist builds C++ extensions that
    need the Boost headers (Debian: libboost-math-dev) and, on Python 3.11 and later, a
    pybind11 newer than the 2.6 its build pins (``pip install pybind11>=2.10 scikit-build
    cmake`` then ``pip install --no-build-isolation confseq``). Its Python modules name
    ``np.float_`` in their type aliases, which NumPy 2 removed: the alias is lent for the
    import only (they use it in annotations, never in arithmetic).
    """
    pytest.importorskip(
        "confseq",
        reason="confseq (the reference implementation .ci/run installs) is not installed: it "
        "builds from source, with the Boost headers (Debian: libboost-math-dev); see .ci/run",
    )
    lent = not hasattr(np, "float_")
    if lent:
        np.float_ = np.float64
    try:
        from confseq.betting import betting_mart, hedged_cs
        from confseq.predmix import predmix_empbern_twosided_cs
    except (ImportError, AttributeError) as exc:
        pytest.skip(f"confseq is installed but its modules do not import here: {exc}")
    finally:
        if lent:
            del np.float_
    return hedged_cs, predmix_empbern_twosided_cs, betting_mart


@pytest.mark.parametrize("rate", RATES)
def test_the_bounds_equal_confseq_s_on_the_same_inputs(rate):
    hedged_cs, predmix_empbern_twosided_cs, _ = _confseq()
    rng = np.random.default_rng(int(rate * 100))
    for x in ((rng.random(300) < rate).astype(np.float64), rng.random(200) * rate):
        # The hedged capital CS, with the same bets, caps, hedge and grid: the same bounds.
        theirs = hedged_cs(x, alpha=ALPHA, breaks=GRID, running_intersection=True)
        ours = confidence_sequence(x, alpha=ALPHA)
        np.testing.assert_allclose(ours, theirs, atol=1e-9)
        # The empirical-Bernstein CS: confseq centres each v_t on the plain running mean
        # (0 before any observation), WSR's formula on the regularised one; both are valid.
        their_lower, their_upper = predmix_empbern_twosided_cs(
            x, alpha=ALPHA, truncation=TRUNCATION, running_intersection=True
        )
        lower, upper = confidence_sequence(x, alpha=ALPHA, method="empirical_bernstein")
        assert np.abs(lower - their_lower).max() <= 0.04
        assert np.abs(upper - their_upper).max() <= 0.04
        width, their_width = upper - lower, their_upper - their_lower
        np.testing.assert_allclose(width[49:], their_width[49:], rtol=0.05)


@pytest.mark.parametrize(("rate_a", "rate_b"), [(0.5, 0.5), (0.7, 0.4), (0.2, 0.6)])
def test_the_paired_e_process_equals_confseq_s_betting_martingale(rate_a, rate_b):
    """The paired test's e-process is WSR's hedged capital at 1/2 of y = (a - b + 1) / 2:
    confseq's ``betting_mart(y, 1/2)`` with its defaults (predictable-mixture bets tuned to
    alpha/2 a side, truncated at 1/2 / m, the max of the two halves). The two must agree to
    rounding at every n, under the null and away from it."""
    _, _, betting_mart = _confseq()
    rng = np.random.default_rng(int(rate_a * 10 + rate_b * 100))
    a = (rng.random(300) < rate_a).astype(np.float64)
    b = (rng.random(300) < rate_b).astype(np.float64)
    theirs = betting_mart((a - b + 1) / 2, 0.5, alpha=ALPHA)
    ours = paired_test(a, b, alpha=ALPHA, interval=False).e_value
    np.testing.assert_allclose(np.log(ours), np.log(theirs), rtol=0, atol=1e-9)
