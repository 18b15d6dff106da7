"""The two cores, and the Rust core's typed stubs, name the same classes and methods."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import rlmesh
from rlmesh import _pycore
from rlmesh.core import CORE_NAMES, load_core

STUBS = Path(rlmesh.__file__).with_name("_core.pyi")
# The checkout the tests run from: the installed package may sit in site-packages.
RUST_SOURCES = Path(__file__).resolve().parents[2] / "rust" / "src"


def public(cls: type) -> set[str]:
    """A class's public methods, properties and attributes (a dataclass's fields too, which
    only its instances hold)."""
    fields = (
        {field.name for field in dataclasses.fields(cls)}
        if dataclasses.is_dataclass(cls)
        else set()
    )
    return {name for name in dir(cls) if not name.startswith("_")} | fields


def stubbed() -> dict[str, set[str]]:
    """The stub's top-level names, each class with its public methods, properties and
    attributes."""
    names: dict[str, set[str]] = {}
    for node in ast.parse(STUBS.read_text()).body:
        if isinstance(node, ast.ClassDef):
            members = set()
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    members.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members.add(item.target.id)  # an attribute
            names[node.name] = {name for name in members if not name.startswith("_")}
        elif isinstance(node, ast.FunctionDef):
            names[node.name] = set()
    return names


# The raw-bytes gRPC transport's classes.
TRANSPORT = {
    "WireStatusError",
    "WireChannel",
    "WireStream",
    "WireServer",
    "ServerRequests",
    "ServerCall",
}


def modules(root: Path, suffix: str, package_files: tuple[str, ...]) -> set[str]:
    """The module paths of a core's source tree, ``wire/served`` for ``wire/served.rs``; a
    package's own file (``lib.rs``, ``mod.rs``, ``__init__.py``) is its folder's path."""
    found = set()
    for source in root.rglob(f"*{suffix}"):
        relative = source.relative_to(root).with_suffix("")
        if source.name in package_files:
            relative = relative.parent
        found.add(relative.as_posix())
    return found


def test_the_python_core_mirrors_the_rust_core_file_for_file():
    python_core = Path(_pycore.__file__).parent
    assert modules(python_core, ".py", ("__init__.py",)) == modules(
        RUST_SOURCES, ".rs", ("lib.rs", "mod.rs")
    )


def test_both_cores_have_the_same_classes_with_the_same_methods():
    rust, python = load_core("rust"), load_core("python")
    for name in _pycore.__all__:
        assert hasattr(rust, name), f"the Rust core lacks {name}"
        python_object, rust_object = getattr(python, name), getattr(rust, name)
        if isinstance(python_object, type):
            assert public(rust_object) == public(python_object), name


def test_the_stubs_declare_what_the_rust_core_has():
    rust = load_core("rust")
    stubs = stubbed()
    for name in _pycore.__all__:
        assert name in stubs, f"_core.pyi does not declare {name}"
        rust_object = getattr(rust, name)
        if isinstance(rust_object, type) and not issubclass(rust_object, BaseException):
            assert stubs[name] == public(rust_object), name


def test_the_stubs_declare_the_python_core_s_transport():
    stubs = stubbed()
    for name in TRANSPORT:
        python_object = getattr(_pycore, name)
        if not issubclass(python_object, BaseException):
            assert stubs[name] == public(python_object), name


def test_both_cores_status_errors_carry_code_and_details():
    """An exception's attributes live on its instances: the stub declares them, and each
    core's error has them."""
    assert stubbed()["WireStatusError"] == {"code", "details"}
    for name in CORE_NAMES:
        core = load_core(name)
        with pytest.raises(core.WireStatusError) as caught:
            core.WireChannel("127.0.0.1:1", max_message_bytes=1024, connect_timeout=0.1)
        assert issubclass(core.WireStatusError, Exception)
        assert caught.value.code == "UNAVAILABLE"
        assert str(caught.value) == f"UNAVAILABLE: {caught.value.details}"


def test_importing_rlmesh_and_either_core_imports_no_grpc():
    """grpcio is an optional extra: only using the transport imports it."""
    code = (
        "import sys, rlmesh, rlmesh._pycore, rlmesh.core; rlmesh.core.load_core('rust'); "
        "print('grpc' in sys.modules)"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert shown.stdout.strip() == "False"
