"""Core selection: RLMESH_CORE picks the core at import; rlmesh.core_name() reports it.

Selection happens once, at import, so each case runs in a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import rlmesh
from rlmesh.core import CORE_NAMES, active, core_name, load_core

# Importing with `sys.modules["rlmesh._core"] = None` makes the Rust core fail to import, the
# way it does on an installation built without it.
BLOCK_RUST = 'import sys; sys.modules["rlmesh._core"] = None\n'

# Prints the active core, the module behind it, and every warning raised by the import.
REPORT = """
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import rlmesh
from rlmesh.core import active
print(json.dumps({
    "core_name": rlmesh.core_name(),
    "module": active.__name__,
    "episode_seed_module": rlmesh.episode_seed is active.episode_seed,
    "warnings": [
        [w.category.__name__, str(w.message)]
        for w in caught
        if str(w.message).startswith("rlmesh")
    ],
}))
"""


def run_python(code: str, rlmesh_core: str | None, tmp_path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("RLMESH_CORE", None)
    env.pop("PYTHONWARNINGS", None)
    if rlmesh_core is not None:
        env["RLMESH_CORE"] = rlmesh_core
    # Run outside the checkout so only the installed package can be imported.
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def report(rlmesh_core: str | None, tmp_path, *, block_rust: bool = False) -> dict:
    result = run_python((BLOCK_RUST if block_rust else "") + REPORT, rlmesh_core, tmp_path)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_core_name_documented_one_liner_prints_the_python_core(tmp_path):
    result = run_python("import rlmesh; print(rlmesh.core_name())", "python", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "python\n"


@pytest.mark.parametrize("value", ["python", "PYTHON", " python "])
def test_rlmesh_core_python_selects_the_pure_python_core(tmp_path, value):
    assert report(value, tmp_path) == {
        "core_name": "python",
        "module": "rlmesh._pycore",
        "episode_seed_module": True,
        "warnings": [],
    }


def test_rlmesh_core_python_works_without_the_rust_core(tmp_path):
    # Choosing the Python core must not even try the Rust one (no warning, no error).
    assert report("python", tmp_path, block_rust=True)["core_name"] == "python"
    assert report("python", tmp_path, block_rust=True)["warnings"] == []


def test_rlmesh_core_rust_selects_the_rust_core(tmp_path):
    assert report("rust", tmp_path) == {
        "core_name": "rust",
        "module": "rlmesh._core",
        "episode_seed_module": True,
        "warnings": [],
    }


def test_rlmesh_core_rust_fails_loudly_when_the_rust_core_is_missing(tmp_path):
    result = run_python(BLOCK_RUST + "import rlmesh", "rust", tmp_path)
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("ImportError: RLMESH_CORE=rust but the Rust core rlmesh._core")
    assert "RLMESH_CORE=python" in last_line  # says how to get going anyway


@pytest.mark.parametrize("value", [None, ""], ids=["unset", "empty"])
def test_unset_rlmesh_core_prefers_rust_when_it_imports(tmp_path, value):
    assert report(value, tmp_path) == {
        "core_name": "rust",
        "module": "rlmesh._core",
        "episode_seed_module": True,
        "warnings": [],
    }


def test_unset_rlmesh_core_falls_back_from_missing_rust_with_one_line_warning(tmp_path):
    outcome = report(None, tmp_path, block_rust=True)
    assert outcome["core_name"] == "python"
    assert outcome["module"] == "rlmesh._pycore"
    assert outcome["episode_seed_module"] is True
    [(category, message)] = outcome["warnings"]
    assert category == "RuntimeWarning"
    assert message.startswith("rlmesh: the Rust core does not import")
    assert "pure-Python core" in message
    assert "\n" not in message


@pytest.mark.parametrize("value", ["cuda", "rust,python", "1"])
def test_invalid_rlmesh_core_is_refused_at_import(tmp_path, value):
    result = run_python("import rlmesh", value, tmp_path)
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line == f"ValueError: RLMESH_CORE must be 'rust' or 'python', got {value!r}"


def test_load_core_returns_the_named_core_modules():
    assert load_core("python").__name__ == "rlmesh._pycore"
    assert CORE_NAMES == ("rust", "python")


def test_load_core_refuses_an_unknown_name():
    with pytest.raises(ValueError, match=r"^core must be one of \('rust', 'python'\), got 'java'$"):
        load_core("java")


def test_core_name_in_process_matches_the_active_module():
    assert core_name() in CORE_NAMES
    assert rlmesh.core_name is core_name
    assert active is load_core(core_name())
    assert "core_name" in rlmesh.__all__
