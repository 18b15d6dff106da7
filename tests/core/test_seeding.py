"""episode_seed: pinned values, range, agreement between cores, argument checks."""

from __future__ import annotations

import numpy as np
import pytest
import rlmesh
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rlmesh.core import core_name, load_core

U64_MAX = 2**64 - 1
u64s = st.integers(min_value=0, max_value=U64_MAX)

# Stability pin: these values are part of the result format (seeds recorded in results files
# must reproduce forever, on every platform). Never regenerate this table; a failure here means
# episode_seed changed, which is a breaking change.
PINNED_SEEDS = [
    (0, 0, 1401122455),
    (0, 1, 73039572),
    (0, 2, 1810254650),
    (0, 3, 1678256936),
    (1, 0, 790680964),
    (1, 1, 1962848292),
    (42, 0, 737213789),
    (42, 1, 2041050258),
    (42, 999, 124376955),
    (12345, 67890, 1576243273),
    (0, 2**32, 379462316),
    (2**32, 0, 1610252987),
    (2**63, 0, 1131268468),
    (0, 2**63, 700640191),
    (U64_MAX, 0, 786498899),
    (0, U64_MAX, 384570948),
    (U64_MAX, U64_MAX, 830769695),
    (0xDEADBEEF, 7, 114497576),
    (7, 0xDEADBEEF, 30982167),
    (2**31 - 1, 2**31 - 1, 1337236902),
]


def reference_splitmix64(x: int) -> int:
    """One SplitMix64 output for state ``x``, written out independently of both cores."""
    z = (x + 0x9E3779B97F4A7C15) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return z ^ (z >> 31)


def reference_episode_seed(base: int, index: int) -> int:
    """The documented formula: ``splitmix64(splitmix64(base) ^ index) >> 33``."""
    return reference_splitmix64(reference_splitmix64(base) ^ index) >> 33


def test_reference_splitmix64_matches_published_vector():
    # Vigna's reference SplitMix64 seeded with 0 first outputs 0xE220A8397B1DCDAF; this anchors
    # the reference (and so the pinned table) to the real algorithm, not to a core's copy of it.
    assert reference_splitmix64(0) == 0xE220A8397B1DCDAF


@pytest.mark.parametrize(("base", "index", "expected"), PINNED_SEEDS)
def test_episode_seed_is_pinned(core, base, index, expected):
    seed = core.episode_seed(base, index)
    assert seed == expected
    assert type(seed) is int


@pytest.mark.parametrize(("base", "index", "expected"), PINNED_SEEDS)
def test_pinned_table_follows_documented_formula(base, index, expected):
    assert reference_episode_seed(base, index) == expected


# The `core` fixture only hands back a module, so sharing it across examples is safe.
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(base=u64s, index=u64s)
def test_episode_seed_follows_documented_formula_in_range(core, base, index):
    seed = core.episode_seed(base, index)
    assert seed == reference_episode_seed(base, index)
    assert 0 <= seed < 2**31


@settings(max_examples=300, deadline=None)
@given(base=u64s, index=u64s)
def test_rust_and_python_episode_seed_agree(base, index):
    assert load_core("rust").episode_seed(base, index) == load_core("python").episode_seed(
        base, index
    )


def test_episode_seed_spreads_neighbouring_indices(core):
    # Consecutive episodes must get unrelated seeds, not base + index.
    seeds = [core.episode_seed(7, index) for index in range(2000)]
    assert len(set(seeds)) == len(seeds)
    assert all(0 <= seed < 2**31 for seed in seeds)
    assert sum(seed % 2 for seed in seeds) in range(900, 1100)  # low bit is not stuck


def test_episode_seed_depends_on_base(core):
    assert core.episode_seed(0, 5) != core.episode_seed(1, 5)


def test_episode_seed_accepts_integer_like_values(core):
    # The driver may hand over numpy scalars (e.g. from a seeds array).
    assert core.episode_seed(np.int64(42), np.uint64(999)) == 124376955
    assert core.episode_seed(np.uint64(U64_MAX), 0) == 786498899


@pytest.mark.parametrize(
    ("base", "index", "message"),
    [
        (-1, 0, r"^base must be an integer in \[0, 2\*\*64\), got -1$"),
        (0, -5, r"^index must be an integer in \[0, 2\*\*64\), got -5$"),
        (2**64, 0, r"^base must be an integer in \[0, 2\*\*64\), got 18446744073709551616$"),
        (0, 2**70, r"^index must be an integer in \[0, 2\*\*64\), got 1180591620717411303424$"),
        (1.0, 0, r"^base must be an integer in \[0, 2\*\*64\), got float$"),
        (0, "3", r"^index must be an integer in \[0, 2\*\*64\), got str$"),
        (None, 0, r"^base must be an integer in \[0, 2\*\*64\), got NoneType$"),
        (0, 2.5, r"^index must be an integer in \[0, 2\*\*64\), got float$"),
    ],
)
def test_episode_seed_rejects_bad_input_naming_the_argument(core, base, index, message):
    with pytest.raises(ValueError, match=message):
        core.episode_seed(base, index)


def test_package_exports_the_active_cores_episode_seed():
    active = load_core(core_name())
    assert rlmesh.episode_seed is active.episode_seed
    assert "episode_seed" in rlmesh.__all__
