"""Host, versions, git state, build id and device facts: plain data, no crash outside a checkout, jax taken lazily."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.errors import InputError
from bench.runs.environment import (
    build_id,
    device_facts,
    device_slug,
    git_state,
    gpu_architecture,
    host_facts,
    package_versions,
)

REPO = Path(__file__).resolve().parents[1]


def test_host_facts_are_plain_and_plausible() -> None:
    host = host_facts()
    assert host["logical_cpus"] >= 1
    assert host["usable_cpus"] is None or 1 <= host["usable_cpus"] <= host["logical_cpus"]
    assert host["arch"]
    assert host["memory_bytes"] is None or host["memory_bytes"] > 2**20
    assert re.fullmatch(r"\d+\.\d+\.\d+", host["python"])


def test_package_versions_reads_metadata_and_marks_absent_packages() -> None:
    versions = package_versions(("pytest", "no-such-package-for-gemma4-bench"))
    assert versions["pytest"] == pytest.__version__
    assert versions["no-such-package-for-gemma4-bench"] is None
    assert versions["python"] == ".".join(map(str, sys.version_info[:3]))


def test_git_state_inside_and_outside_a_checkout(tmp_path: Path) -> None:
    inside = git_state(REPO)
    if inside["commit"] is not None:  # the repository is a git checkout
        assert re.fullmatch(r"[0-9a-f]{40}", inside["commit"])
        assert isinstance(inside["dirty"], bool)
    assert git_state(tmp_path) == {"commit": None, "dirty": None}


def test_git_state_sees_a_dirty_tree(tmp_path: Path) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    clean = git_state(tmp_path)
    assert clean["dirty"] is False and re.fullmatch(r"[0-9a-f]{40}", clean["commit"])
    (tmp_path / "untracked.json").write_text("{}")  # run folders are untracked: not dirty
    assert git_state(tmp_path)["dirty"] is False
    (tmp_path / "a.py").write_text("x = 2\n")
    assert git_state(tmp_path)["dirty"] is True


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_build_id_hashes_sources_checkpoint_and_config(tmp_path: Path) -> None:
    engine = _tree(tmp_path / "model", {"a.py": "A = 1\n", "sub/b.py": "B = 2\n", "notes.txt": "ignored"})
    harness = _tree(tmp_path / "bench", {"c.py": "C = 3\n"})
    config = {"buckets": [64, 512], "dtype": "float32"}
    first = build_id([engine, harness], "sha256:abc", config)
    assert re.fullmatch(r"[0-9a-f]{12}", first)
    assert build_id([engine, harness], "sha256:abc", dict(reversed(config.items()))) == first  # key order
    (engine / "notes.txt").write_text("not python")
    (engine / "__pycache__").mkdir()
    (engine / "__pycache__" / "a.cpython-312.py").write_text("cached")
    assert build_id([engine, harness], "sha256:abc", config) == first  # only .py sources outside caches count
    assert build_id([engine, harness], "sha256:abd", config) != first
    assert build_id([engine, harness], "sha256:abc", {**config, "dtype": "bfloat16"}) != first
    (engine / "sub" / "b.py").write_text("B = 3\n")
    second = build_id([engine, harness], "sha256:abc", config)
    assert second != first
    (engine / "sub" / "kernel.cc").write_text("int k = 1;\n")  # the engine's C++ kernels are its code too
    third = build_id([engine, harness], "sha256:abc", config)
    assert third != second
    (engine / "sub" / "kernel.cc").write_text("int k = 2;\n")
    assert build_id([engine, harness], "sha256:abc", config) != third


def test_build_id_names_a_missing_source_folder(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="nowhere"):
        build_id([tmp_path / "nowhere"], None, {})


@pytest.mark.parametrize(
    ("kind", "slug"),
    [
        ("NVIDIA H200", "h200"), ("NVIDIA T4G", "t4g"), ("Tesla T4", "t4"), ("NVIDIA L4", "l4"),
        ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA A10G", "a10g"),
        ("cpu", "cpu"), ("TPU v5 lite", "tpuv5e"), ("TPU v4", "tpuv4"), ("NVIDIA GeForce RTX 4090", "rtx4090"),
        (None, "unknown"), ("", "unknown"),
    ],
)  # fmt: skip
def test_device_slug(kind: str | None, slug: str) -> None:
    assert device_slug(kind) == slug


@pytest.mark.parametrize(
    ("cc", "arch"),
    [("7.5", "Turing"), ("8.0", "Ampere"), ("8.6", "Ampere"), ("8.9", "Ada"), ("9.0", "Hopper"), ("7.0", "Volta"),
     ("10.0", "Blackwell"), (None, None), ("sm_75", None)],
)  # fmt: skip
def test_gpu_architecture(cc: str | None, arch: str | None) -> None:
    assert gpu_architecture(cc) == arch


def test_device_facts_from_a_given_jax_module() -> None:
    gpu = SimpleNamespace(platform="gpu", device_kind="NVIDIA H200", compute_capability="9.0",
                          memory_stats=lambda: {"bytes_limit": 140 * 2**30})  # fmt: skip
    facts = device_facts(SimpleNamespace(devices=lambda: [gpu, gpu]))
    assert facts["count"] == 2 and facts["slug"] == "h200" and facts["architecture"] == "Hopper"
    assert facts["memory_bytes"] == 140 * 2**30 and facts["compute_capability"] == "9.0"

    def no_stats() -> dict:
        raise RuntimeError("memory_stats unsupported")

    cpu = SimpleNamespace(platform="cpu", device_kind="cpu", memory_stats=no_stats)
    facts = device_facts(SimpleNamespace(devices=lambda: [cpu]))
    assert facts["slug"] == "cpu" and facts["memory_bytes"] is None and facts["compute_capability"] is None
    assert facts["driver_version"] is None


def test_device_memory_takes_the_fullest_device_and_none_without_stats() -> None:
    from bench.runs.environment import device_memory

    def dev(stats):
        return SimpleNamespace(memory_stats=lambda: stats)

    two = SimpleNamespace(local_devices=lambda: [
        dev({"bytes_limit": 16_000, "peak_bytes_in_use": 9_000, "bytes_in_use": 7_000, "num_allocs": 3}),
        dev({"bytes_limit": 16_000, "peak_bytes_in_use": 11_000, "bytes_in_use": 6_000})])  # fmt: skip
    assert device_memory(two) == {"bytes_limit": 16_000, "peak_bytes_in_use": 11_000, "bytes_in_use": 7_000}
    assert device_memory(SimpleNamespace(local_devices=lambda: [dev(None)])) is None  # a CPU reports none


def test_a_sweep_records_the_device_memory_beside_the_weights(tmp_path, monkeypatch) -> None:
    """`bench sweep`'s end on a device that reports memory: the manifest's device_memory and the line in run.log;
    on a device that reports none, nothing."""
    import logging

    import bench.runs.environment as environment
    from bench.sweep.command import _record_device_memory
    from runfolders import make_measured_run

    run = make_measured_run(tmp_path, "mem", status="running")
    engine = SimpleNamespace(weight_bytes=4_565_044_294)
    monkeypatch.setattr(environment, "device_memory", lambda _jax: None)
    _record_device_memory(run, engine, logging.getLogger("test"))
    assert "device_memory" not in run.manifest
    stats = {"bytes_limit": 16_909_336_064, "peak_bytes_in_use": 5_100_000_000, "bytes_in_use": 4_900_000_000}
    monkeypatch.setattr(environment, "device_memory", lambda _jax: stats)
    _record_device_memory(run, engine, logging.getLogger("test"))
    assert run.manifest["device_memory"] == {**stats, "weight_bytes": 4_565_044_294}
    log = (run.path / "run.log").read_text()
    assert "device memory: peak 5.100 GB in use (0.535 GB beyond the weights' 4.565 GB) of the allocator's " \
           "16.909 GB limit" in log


def test_importing_environment_does_not_import_jax() -> None:
    code = "import sys, bench.runs.environment; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_host_memory_reads_meminfo_in_kib_else_sysconf(monkeypatch, tmp_path):
    """MemTotal / MemAvailable are kB meaning KiB; without /proc/meminfo, sysconf's page size x pages."""
    import os

    from bench.runs import environment

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       1000 kB\nMemFree:         300 kB\nMemAvailable:    500 kB\n")
    monkeypatch.setattr(environment, "Path", lambda _: meminfo)
    assert environment._memory_bytes() == 1000 * 1024
    assert environment.host_available_bytes() == 500 * 1024
    meminfo.unlink()
    pages = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 10, "SC_AVPHYS_PAGES": 3}
    monkeypatch.setattr(os, "sysconf", lambda name: pages[name])
    assert environment._memory_bytes() == 4096 * 10
    assert environment.host_available_bytes() == 4096 * 3
