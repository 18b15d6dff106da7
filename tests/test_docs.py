"""The examples in docstrings are run, so they stay true: every module of the package has one,
but those ``WITHOUT_EXAMPLES`` names."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest
import rlmesh

# Modules that hold no example of their own: packages that only gather their modules' names,
# and code whose use needs processes or a cluster (its callers' examples and tests cover it).
WITHOUT_EXAMPLES = frozenset(
    {
        "rlmesh._pycore",
        "rlmesh._pycore.args",
        "rlmesh._pycore.wire",
        "rlmesh.cluster",
        "rlmesh.lanes.process.worker",
        "rlmesh.lanes.vector_env",
        "rlmesh.remote",
        "rlmesh.remote.openpi",
        "rlmesh.video",
    }
)


def _modules() -> list[str]:
    """Every Python module of the package but the generated wire code and ``python -m rlmesh``
    (the native core's docstrings are its mirror's, ``rlmesh._pycore``, run here)."""
    return sorted(
        info.name
        for info in pkgutil.walk_packages(rlmesh.__path__, "rlmesh.")
        if not info.name.startswith("rlmesh.remote.wire")
        and info.name not in ("rlmesh.__main__", "rlmesh._core")
    )


DOCUMENTED_MODULES = tuple(name for name in _modules() if name not in WITHOUT_EXAMPLES)


def test_the_modules_without_examples_still_exist():
    assert set(_modules()) >= WITHOUT_EXAMPLES


@pytest.mark.parametrize("module_name", DOCUMENTED_MODULES)
def test_docstring_examples_hold(module_name):
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{module_name} has no docstring example"
    assert result.failed == 0
