"""The sandboxes' virtual environments (``rlmesh.sandbox.venvs``) and what they hold
(``rlmesh.sandbox.requirements``): built once per requirements and Python, by one process at a
time, again after a build that did not finish; a failed build says why and leaves nothing."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from rlmesh import benchmarks
from rlmesh.sandbox import (
    SandboxBuildError,
    cached_venv,
    extra_requirements,
    runtime_requirements,
    venvs,
)
from rlmesh.sandbox.venvs import MARKER, interpreter_identity, venv_key
from servers import read_line

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser before it joined the standard library
    import tomli as tomllib

PROJECT = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]


def target_of(root, requirements=()):
    return root / venv_key(list(requirements), interpreter_identity())


def test_the_key_is_the_sorted_requirements_and_the_interpreter():
    identity = interpreter_identity()
    assert venv_key(["b", "a"], identity) == venv_key(["a", "b", "a"], identity)
    assert venv_key(["a"], identity) != venv_key(["a", "c"], identity)
    assert venv_key(["a"], identity) != venv_key(["a"], (identity[0], "3.99.0", identity[2]))


def test_an_environment_is_built_once_then_reused(tmp_path):
    told = []
    python = cached_venv([], root=tmp_path, progress=told.append)
    assert any("building a virtual environment" in line for line in told)
    assert subprocess.run(
        [python, "-c", "import sys; print(sys.prefix)"], check=True, capture_output=True, text=True
    ).stdout.strip() == str(target_of(tmp_path))
    told.clear()
    assert cached_venv([], root=tmp_path, progress=told.append) == python
    assert told == []


def test_a_build_that_did_not_finish_is_built_again(tmp_path):
    target = target_of(tmp_path)
    (target / "bin").mkdir(parents=True)
    (target / "leftover").write_text("a killed build left this")
    told = []
    cached_venv([], root=tmp_path, progress=told.append)
    assert not (target / "leftover").exists() and (target / MARKER).is_file()
    assert any("building" in line for line in told)


def test_an_environment_of_an_older_layout_is_built_again(tmp_path):
    python = cached_venv([], root=tmp_path, progress=lambda line: None)
    (target_of(tmp_path) / MARKER).write_text('{"requirements": []}\n')  # layout 1's marker
    told = []
    assert cached_venv([], root=tmp_path, progress=told.append) == python
    assert any("building" in line for line in told)
    assert f'"layout": {venvs.LAYOUT}' in (target_of(tmp_path) / MARKER).read_text()


@pytest.mark.parametrize("tool", ["uv", "pip"])
def test_the_packages_bytecode_is_compiled_at_build_time(tmp_path, monkeypatch, tool):
    # A sandboxed server cannot write .pyc files, so they must exist before it starts.
    if tool == "pip":
        monkeypatch.setattr(venvs, "find_uv", lambda: None)
    elif venvs.find_uv() is None:
        pytest.skip("uv is not installed (the test extra installs it)")
    told = []
    python = cached_venv(["six==1.16.0"], root=tmp_path, progress=told.append)
    named = {"uv": "with uv", "pip": "with venv and pip"}[tool]
    assert any(f"building a virtual environment {named}" in line for line in told)
    site = subprocess.run(
        [python, "-c", "import six, sys; print(six.__file__, sys.implementation.cache_tag)"],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    ).stdout.split()
    source, tag = Path(site[0]), site[1]
    assert (source.parent / "__pycache__" / f"six.{tag}.pyc").is_file()


def test_a_failed_build_says_why_and_leaves_nothing(tmp_path):
    with pytest.raises(SandboxBuildError) as caught:
        cached_venv(["numpy>>>2"], root=tmp_path, progress=lambda line: None)
    assert caught.value.output and "numpy>>>2" in str(caught.value)
    assert list(tmp_path.iterdir()) == []  # neither the environment nor its lock


BUILD = """
import sys
from rlmesh.sandbox.venvs import cached_venv
python = cached_venv([], root=sys.argv[1], progress=lambda line: print(line, flush=True))
print("python", python, flush=True)
"""


def test_two_processes_asking_for_one_environment_build_it_once(tmp_path):
    lock = target_of(tmp_path).with_name(target_of(tmp_path).name + ".lock")
    holder = open(lock, "a+")  # noqa: SIM115 - a builder holding the lock, as cached_venv does
    fcntl.flock(holder, fcntl.LOCK_EX)
    askers = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    try:
        for asker in askers:  # both wait behind the lock
            assert read_line(asker, timeout=60).startswith("waiting for another process")
        os.unlink(lock)  # the holder is done (and built nothing): each asker must re-check
        holder.close()
        outputs = [asker.communicate(timeout=300)[0] for asker in askers]
    finally:
        holder.close()
        for asker in askers:
            if asker.poll() is None:
                asker.kill()
                asker.communicate()
    assert sum(output.count("building a virtual environment") for output in outputs) == 1
    pythons = {
        line for output in outputs for line in output.splitlines() if line.startswith("python ")
    }
    assert pythons == {f"python {target_of(tmp_path) / 'bin' / 'python'}"}
    assert not lock.exists()


def normalized(requirements):
    """The requirements that apply to this interpreter, as packaging writes them: an installed
    rlmesh's metadata (read when it does not run from a checkout) orders specifiers and writes
    markers its own way (``python_full_version`` for ``python_version``)."""
    applying = [Requirement(line) for line in requirements]
    applying = [r for r in applying if r.marker is None or r.marker.evaluate()]
    for requirement in applying:
        requirement.marker = None
    return [str(requirement) for requirement in applying]


def test_the_server_side_gets_rlmeshs_dependencies_and_the_remote_extra():
    wanted = runtime_requirements()
    assert set(normalized(PROJECT["dependencies"])) <= set(normalized(wanted))
    assert set(normalized(PROJECT["optional-dependencies"]["remote"])) <= set(normalized(wanted))
    assert wanted == sorted(set(wanted))


def test_each_built_in_suite_knows_its_packages():
    extras = PROJECT["optional-dependencies"]
    for name, info in benchmarks.SUITES.items():
        assert normalized(extra_requirements(info.extra)) == normalized(extras[info.extra]), name
    # An extra that names another is expanded.
    assert normalized(extra_requirements("vlaeval")) == normalized(extras["openpi"])


def test_an_unknown_extra_is_refused_naming_the_extras():
    with pytest.raises(ValueError, match=r"no extra 'nope'; its extras are .*pusht"):
        extra_requirements("nope")
