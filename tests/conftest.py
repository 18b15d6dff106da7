"""Shared fixtures: every core-facing test runs against both cores."""

from __future__ import annotations

from types import ModuleType

import pytest
from rlmesh.core import load_core


@pytest.fixture(params=["rust", "python"], ids=["rust", "python"])
def core(request: pytest.FixtureRequest) -> ModuleType:
    """The core module under test: ``rlmesh._core`` (rust) or ``rlmesh._pycore`` (python).

    A missing Rust core fails the test rather than skipping it: a wheel without its core must
    never pass the suite quietly.
    """
    try:
        return load_core(request.param)
    except ImportError as exc:
        pytest.fail(f"the {request.param} core does not import: {exc}")
