"""The package's layers: no module imports one above it, and import circles stay small.

Every import counts, at the top of a module, inside a function or under ``TYPE_CHECKING``.
The layers, lowest first, are ``LAYERS``: a module may import its own layer and those below.
An upward import is allowed only where ``CONVENIENCE`` lists it, with the reason; each is one
line that makes a lower object easier to use (``Model.run``). Within a layer, import circles
may span at most two modules, and at most ``MAX_CIRCLES`` exist.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
import rlmesh

PACKAGE = Path(rlmesh.__file__).parent

# Lowest first. A module belongs to the first layer with a prefix that names it or a package
# holding it (the longest prefix wins).
LAYERS: tuple[tuple[str, ...], ...] = (
    # The foundation: the cores, errors, trees of arrays, spaces, the wire's generated code.
    (
        "rlmesh._core",
        "rlmesh._pycore",
        "rlmesh.core",
        "rlmesh.errors",
        "rlmesh.version",
        "rlmesh.utils",
        "rlmesh.spaces",
        "rlmesh.deadlines",
        "rlmesh.contexts",
        "rlmesh.remote.address",
        "rlmesh.remote.wire",
    ),
    # What a model consumes and emits.
    ("rlmesh.adapters",),
    # Results: records, the file, success rules, provenance; statistics over them; reports.
    ("rlmesh.results", "rlmesh.success", "rlmesh.provenance", "rlmesh.stats"),
    ("rlmesh.report",),
    # The run's parts: telemetry, hooks, the model and its handler, and the framework models
    # (rlmesh.torch, rlmesh.jax: the model's tensor bridges).
    ("rlmesh.telemetry", "rlmesh.hooks", "rlmesh.model", "rlmesh.torch", "rlmesh.jax"),
    # The wire's shared parts: codec, protocol, connections, hosting.
    ("rlmesh.remote",),
    # What holds envs.
    ("rlmesh.lanes",),
    # The live view: its figures, lanes watched, page, table, a results file followed.
    ("rlmesh.view",),
    # A run: its settings, the recording of its videos, and the loop.
    ("rlmesh.settings",),
    ("rlmesh.video",),
    ("rlmesh.driver",),
    # Serving envs and models, loading policies, scale-out, the entry point, suites.
    (
        "rlmesh.remote.env_server",
        "rlmesh.remote.env_client",
        "rlmesh.remote.model_server",
        "rlmesh.remote.openpi.server",
        "rlmesh.remote.model_client",
        "rlmesh.policies",
        "rlmesh.sandbox",
    ),
    ("rlmesh.cluster",),
    ("rlmesh.api",),
    ("rlmesh.suites", "rlmesh.ab"),
    # The built-in benchmarks, as suites.
    ("rlmesh.benchmarks",),
    # The command line, and the package's front door.
    ("rlmesh.cli",),
    ("rlmesh", "rlmesh.__main__", "rlmesh.numpy"),
)

# (importer, imported): the upward imports allowed, each a one-line convenience.
CONVENIENCE = {
    # Model.run(env) is rlmesh.run(model, env): the entry point sits above the model.
    ("rlmesh.model.base", "rlmesh.api"),
}

MAX_CIRCLES = 3


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The package's modules an import statement loads (the deepest one each name is in)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".")
            if MODULES[module].name != "__init__.py":
                base = base[:-1]
            base = base[: len(base) - node.level + 1]
            origin = ".".join(base + ([node.module] if node.module else []))
        else:
            origin = node.module or ""
        names = [
            f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in MODULES else origin
            for alias in node.names
        ]
    for name in names:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name and name != module:
            yield name


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[module].update(_targets(module, node))
    return graph


def _layer(module: str) -> int:
    best, layer = -1, None
    for number, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, layer = len(prefix), number
    assert layer is not None, f"{module} is in no layer: add it to LAYERS"
    return layer


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


GRAPH = _graph()


def test_every_module_has_a_layer():
    for module in MODULES:
        _layer(module)


def test_no_module_imports_a_layer_above_its_own():
    upward = sorted(
        f"{module} (layer {_layer(module)}) imports {target} (layer {_layer(target)})"
        for module, targets in GRAPH.items()
        for target in targets
        if _layer(target) > _layer(module) and (module, target) not in CONVENIENCE
    )
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_the_allowed_upward_imports_are_few_and_still_there():
    assert len(CONVENIENCE) <= 3
    for module, target in CONVENIENCE:
        if module in GRAPH:
            assert target in GRAPH[module], f"{module} no longer imports {target}: drop it"


def test_import_circles_are_few_and_span_at_most_two_modules():
    graph = {
        module: {target for target in targets if (module, target) not in CONVENIENCE}
        for module, targets in GRAPH.items()
    }
    circles = _circles(graph)
    assert all(len(circle) <= 2 for circle in circles), circles
    assert len(circles) <= MAX_CIRCLES, circles


def test_no_module_imports_another_modules_private_names():
    private = []
    for module, path in MODULES.items():
        if module.startswith(("rlmesh._pycore", "rlmesh.remote.wire")):
            continue  # the core's mirror, and generated code
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                targets = list(_targets(module, node))
                for alias in node.names:
                    name = alias.name
                    if name.startswith("_") and not name.startswith("__") and targets:
                        private.append(f"{module} imports {name}")
    assert not private, "\n".join(private)


@pytest.mark.parametrize(
    ("circle_free", "graph"),
    [
        (True, {"a": {"b"}, "b": {"c"}, "c": set()}),
        (False, {"a": {"b"}, "b": {"c"}, "c": {"a"}}),
    ],
)
def test_the_circle_finder_finds_circles(circle_free, graph):
    assert (_circles(graph) == []) is circle_free
