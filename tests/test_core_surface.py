"""The two cores, and the Rust core's typed stubs, name the same classes and methods."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import rlmesh
from rlmesh import _pycore
from rlmesh.core import load_core

STUBS = Path(rlmesh.__file__).with_name("_core.pyi")


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
        if isinstance(rust_object, type):
            assert stubs[name] == public(rust_object), name
