"""What the provenance record says of the machine and the env's stack: the GL backend and
renderer variables, the CPU, the GPUs ``nvidia-smi`` lists, the env's packages; checked
against this machine, and a run's results header holding them."""

from __future__ import annotations

import importlib.metadata
import json
import os
import stat
from pathlib import Path

import pytest
import rlmesh
from helpers import cartpole_policy
from rlmesh.provenance import (
    GRAPHICS_VARIABLES,
    cpu_model,
    env_packages,
    format_provenance,
    gpu_models,
    graphics_variables,
)


def test_a_run_s_header_records_the_machine_and_the_env_stack(tmp_path, monkeypatch):
    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    monkeypatch.delenv("PYOPENGL_PLATFORM", raising=False)
    monkeypatch.setenv("LIBGL_ALWAYS_SOFTWARE", "1")
    path = tmp_path / "run.jsonl"
    rlmesh.run(cartpole_policy, "CartPole-v1", episodes=1, results_path=path)
    record = json.loads(path.read_text().splitlines()[0])["provenance"]
    assert record["graphics"]["MUJOCO_GL"] == "osmesa"
    assert record["graphics"]["PYOPENGL_PLATFORM"] is None  # unset, and said so
    assert record["graphics"]["LIBGL_ALWAYS_SOFTWARE"] == "1"
    assert set(record["graphics"]) <= set(GRAPHICS_VARIABLES)
    assert record["cpu"]["logical_cores"] == os.cpu_count()
    assert record["gpus"] == [dict(gpu) for gpu in gpu_models()]
    for name in ("gymnasium", "numpy", "cloudpickle"):
        assert record["env_packages"][name] == importlib.metadata.version(name)
    text = format_provenance([record])
    assert "MUJOCO_GL=osmesa, PYOPENGL_PLATFORM=-, LIBGL_ALWAYS_SOFTWARE=1" in text
    assert f"gymnasium {importlib.metadata.version('gymnasium')}" in text


def test_graphics_variables_hold_the_two_backends_always_and_the_others_when_set(monkeypatch):
    for name in GRAPHICS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert graphics_variables() == {"MUJOCO_GL": None, "PYOPENGL_PLATFORM": None}
    monkeypatch.setenv("PYOPENGL_PLATFORM", "egl")
    monkeypatch.setenv("EGL_DEVICE_ID", "1")
    assert graphics_variables() == {
        "MUJOCO_GL": None,
        "PYOPENGL_PLATFORM": "egl",
        "EGL_DEVICE_ID": "1",
    }


def test_the_cpu_model_is_the_one_proc_cpuinfo_names():
    info = Path("/proc/cpuinfo")
    if not info.exists():
        pytest.skip("no /proc/cpuinfo on this machine")
    names = [
        line.partition(":")[2].strip()
        for line in info.read_text().splitlines()
        if line.partition(":")[0].strip() in ("model name", "Model", "Hardware")
    ]
    if not names:
        pytest.skip("/proc/cpuinfo names no model on this machine")
    assert cpu_model()["model"] == names[0]


def test_the_simulator_distribution_s_packages_are_recorded():
    pytest.importorskip("gym_pusht", reason="the pusht extra (gym-pusht) is not installed")
    packages = env_packages("rlmesh.benchmarks:rlmesh/PushT-v0")
    assert packages["gym-pusht"] == importlib.metadata.version("gym-pusht")
    assert packages["pymunk"] == importlib.metadata.version("pymunk")
    assert "pytest" not in packages  # a requirement of its test extra only


def _nvidia_smi(folder: Path, script: str) -> None:
    """An ``nvidia-smi`` in ``folder`` that runs ``script`` (a GPU-less machine has none)."""
    tool = folder / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\n{script}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)


def test_gpus_are_read_from_nvidia_smi_and_a_failing_one_gives_none(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    _nvidia_smi(tmp_path, 'echo "NVIDIA A100-SXM4-80GB, 535.104.05"; echo "Tesla T4, 535.104.05"')
    gpu_models.cache_clear()
    try:
        assert gpu_models() == (
            {"name": "NVIDIA A100-SXM4-80GB", "driver": "535.104.05"},
            {"name": "Tesla T4", "driver": "535.104.05"},
        )
        _nvidia_smi(tmp_path, "echo 'NVIDIA-SMI has failed' >&2; exit 9")
        gpu_models.cache_clear()
        assert gpu_models() == ()
    finally:
        gpu_models.cache_clear()  # the next caller asks the real machine again
