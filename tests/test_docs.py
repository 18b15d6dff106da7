"""The examples in docstrings are run, so they stay true."""

from __future__ import annotations

import doctest
import importlib

import pytest

DOCUMENTED_MODULES = (
    "rlmesh.core",
    "rlmesh._pycore.seeding",
    "rlmesh._pycore.ledger",
    "rlmesh._pycore.assembly",
    "rlmesh._pycore.resize",
    "rlmesh._pycore.rotations",
    "rlmesh._pycore.chunks",
    "rlmesh._pycore.actions",
    "rlmesh._pycore.telemetry",
    "rlmesh._pycore.rounds",
    "rlmesh._pycore.transport",
    "rlmesh.adapters",
    "rlmesh.adapters.spec",
    "rlmesh.adapters.roles",
    "rlmesh.adapters.tags",
    "rlmesh.adapters.v1",
    "rlmesh.adapters.resolve",
    "rlmesh.errors",
    "rlmesh.results",
    "rlmesh.telemetry",
    "rlmesh.model",
    "rlmesh.contexts",
    "rlmesh.driver",
    "rlmesh.numpy",
    "rlmesh.lanes",
    "rlmesh.lanes.local",
    "rlmesh.lanes.process",
    "rlmesh.lanes.process.layout",
    "rlmesh.utils",
    "rlmesh.deadlines",
    "rlmesh.settings",
    "rlmesh.stats",
    "rlmesh.report",
    "rlmesh.provenance",
    "rlmesh.report.plots",
    "rlmesh.report.html",
    "rlmesh.cli",
    "rlmesh.spaces",
    "rlmesh.remote.codec",
    "rlmesh.remote.address",
    "rlmesh.remote.connection",
    "rlmesh.remote.hosting",
)


@pytest.mark.parametrize("module_name", DOCUMENTED_MODULES)
def test_docstring_examples_hold(module_name):
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{module_name} has no docstring example"
    assert result.failed == 0
