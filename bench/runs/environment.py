"""Facts about the machine, the software and the payload that a run folder records.

Nothing here imports jax: `device_facts` is given the imported jax module by its caller, so the
report and `bench runs` stay fast and work where jax is absent. Every function returns plain JSON-ready data;
unknown facts are None, never a guess.

- `host_facts()`: CPU model, logical/usable cores, architecture, memory (bytes), OS, Python.
- `package_versions()`: installed versions (importlib.metadata) of the packages a run depends on.
- `git_state(path)`: commit and dirty flag, (None, None) outside a git checkout or without git.
- `build_id(source_roots, checkpoint_hash, config)`: 12 hex chars naming the payload of a run.
- `device_facts(jax_module)`: platform, device kind, count, memory, compute capability, driver/CUDA.
- `device_slug(device_kind)`: short chip name for run-folder names (cpu, t4, t4g, l4, a100, h100, h200, ...).
- `gpu_architecture(compute_capability)`: NVIDIA architecture name (Turing, Ampere, Ada, Hopper, ...).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench.errors import InputError

PACKAGES = (
    "jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-cuda12-plugin", "jax-cuda12-pjrt", "flax",
    "numpy", "safetensors", "tokenizers", "huggingface_hub", "ml_dtypes", "xprof", "typer", "pandas", "matplotlib",
)  # fmt: skip
"""Packages whose versions a run records (those that can change a number or a token)."""


# ---- host ------------------------------------------------------------------------------------------------------
def _cpuinfo_model(text: str) -> str | None:
    """CPU model from /proc/cpuinfo text: x86 `model name`, else ARM `Model`/`Hardware`, else None."""
    for key in ("model name", "Model", "Hardware", "cpu model"):
        m = re.search(rf"^{re.escape(key)}\s*:\s*(.+)$", text, re.MULTILINE)
        if m and m.group(1).strip():
            return m.group(1).strip()
    return None


def _memory_bytes() -> int | None:
    """Total host memory in bytes (/proc/meminfo MemTotal, else sysconf), None when unknown."""
    return _meminfo_bytes("MemTotal", "SC_PHYS_PAGES")


def host_available_bytes() -> int | None:
    """Host memory available to new allocations now (bytes): /proc/meminfo MemAvailable (the kernel reports kB,
    meaning KiB), else the available physical pages (sysconf); None when neither can be read."""
    return _meminfo_bytes("MemAvailable", "SC_AVPHYS_PAGES")


def _meminfo_bytes(key: str, pages: str) -> int | None:
    """/proc/meminfo's `key` line in bytes (its kB are KiB), else sysconf's page size x its `pages` count; None
    when neither can be read."""
    try:
        m = re.search(rf"^{key}:\s*(\d+)\s*kB", Path("/proc/meminfo").read_text(), re.MULTILINE)
        if m:
            return int(m.group(1)) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf(pages))
    except (ValueError, OSError, AttributeError):
        return None


MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")
"""Where a Linux machine keeps its id (systemd's machine-id(5); D-Bus's older copy)."""


def machine_id(paths: Iterable[str | Path] = MACHINE_ID_FILES) -> str | None:
    """This machine's id as a run records it: the first 16 hex digits of sha256("gemma4-bench host " + the id in
    the first readable non-empty file of `paths`), so runs of one machine can be told apart from runs of another of
    the same model (docs/method.md, "Rerun intervals") without publishing the id itself (hashed with a fixed
    prefix, as machine-id(5) asks of ids shown to others). None where there is none. Never raises."""
    for path in paths:
        try:
            text = Path(path).read_text(encoding="ascii", errors="replace").strip()
        except OSError:
            continue
        if text:
            return hashlib.sha256(f"gemma4-bench host {text}".encode()).hexdigest()[:16]
    return None


def host_facts() -> dict[str, Any]:
    """The host: cpu_model, logical_cpus, usable_cpus (this process's affinity), arch, memory_bytes, os, python,
    machine_id (`machine_id`: a hash; None where the machine has no id).

    Never raises; unknown values are None.
    """
    try:
        cpu_model = _cpuinfo_model(Path("/proc/cpuinfo").read_text())
    except OSError:
        cpu_model = None
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    return {
        "cpu_model": cpu_model or (platform.processor() or None),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable,
        "arch": platform.machine() or None,
        "memory_bytes": _memory_bytes(),
        "os": f"{platform.system()} {platform.release()}".strip() or None,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "machine_id": machine_id(),
    }


def package_versions(names: Iterable[str] = PACKAGES) -> dict[str, str | None]:
    """{package: installed version or None when absent}, plus `python`. Read from importlib.metadata, no imports."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


# ---- git and build id --------------------------------------------------------------------------------------------
def git_state(path: str | Path = ".") -> dict[str, Any]:
    """{"commit": 40-hex or None, "dirty": bool or None} for the checkout holding `path`.

    Dirty means tracked files differ from the commit (`git status --porcelain --untracked-files=no`): untracked
    files do not count, because run folders and caches are untracked by design; the build id covers every source
    file whether tracked or not. Outside a checkout, or without git, both are None. Never raises.
    """
    git = shutil.which("git")
    if git is None:
        return {"commit": None, "dirty": None}

    def _git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                [git, *args], cwd=path, capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit.strip(), "dirty": None if status is None else bool(status.strip())}


SOURCE_SUFFIXES = (".py", ".cc")
"""The files of the payload's code: Python, and the C++ of the engine's CPU kernels (`model/backends/cpu/cpu_bf16.cc`,
compiled on first use), so a change to a kernel alone is another build."""


def _sources(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file()
                  and "__pycache__" not in p.parts)  # fmt: skip


def build_id(source_roots: Iterable[str | Path], checkpoint_hash: str | None, config: dict[str, Any]) -> str:
    """Short hash (12 hex chars) of the payload a run executes: code, weights and configuration.

    sha256 over, in order: every `.py` and `.cc` file under each of `source_roots` (e.g. `model/` and `bench/`; sorted,
    each as its path relative to its root plus its bytes), the checkpoint content hash, and `config` as sorted-key
    JSON (values that are not JSON types are written with `str`). Two runs with one build id ran the same payload.
    Raises InputError when a source root does not exist.
    """
    h = hashlib.sha256()
    for root in source_roots:
        root = Path(root)
        if not root.exists():
            raise InputError(f"build id: source folder {root} does not exist; pass the engine and harness folders")
        for file in _sources(root):
            rel = file.name if root.is_file() else file.relative_to(root).as_posix()
            h.update(f"{root.name}/{rel}\0".encode())
            h.update(file.read_bytes())
            h.update(b"\0")
    h.update(f"checkpoint:{checkpoint_hash}\0".encode())
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    return h.hexdigest()[:12]


# ---- device ------------------------------------------------------------------------------------------------------
_ARCHITECTURES = (  # (minimum compute capability, name): NVIDIA's CUDA GPU list
    ((12, 0), "Blackwell"), ((10, 0), "Blackwell"), ((9, 0), "Hopper"), ((8, 9), "Ada"), ((8, 0), "Ampere"),
    ((7, 5), "Turing"), ((7, 0), "Volta"), ((6, 0), "Pascal"), ((5, 0), "Maxwell"),
)  # fmt: skip


def gpu_architecture(compute_capability: str | None) -> str | None:
    """NVIDIA architecture of a compute capability such as "7.5" (Turing) or "8.9" (Ada); None when unknown."""
    if not compute_capability:
        return None
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", str(compute_capability))
    if not m:
        return None
    cc = (int(m.group(1)), int(m.group(2)))
    return next((name for floor, name in _ARCHITECTURES if cc >= floor), None)


_SLUG_PATTERNS = (  # first match wins; searched in the lower-cased device kind
    (r"\bh200\b", "h200"), (r"\bh100\b", "h100"), (r"\bgh200\b", "gh200"), (r"\bb200\b", "b200"),
    (r"\ba100\b", "a100"), (r"\ba10g\b", "a10g"), (r"\ba10\b", "a10"), (r"\bl40s\b", "l40s"), (r"\bl40\b", "l40"),
    (r"\bl4\b", "l4"), (r"\bt4g\b", "t4g"), (r"\bt4\b", "t4"), (r"\bv100\b", "v100"),
    (r"tpu\s*v(\d+)\s*lite", r"tpuv\1e"), (r"tpu\s*v(\d+[a-z]?)", r"tpuv\1"),
)  # fmt: skip
_VENDOR_WORDS = {"nvidia", "tesla", "geforce", "quadro", "amd", "radeon", "intel", "pcie", "sxm", "sxm4", "sxm5"}


def device_slug(device_kind: str | None) -> str:
    """Short lower-case chip name for a run folder: "cpu", "t4g", "l4", "h200", "a100", "tpuv5e", ...

    Known chips come from a table; any other name becomes its significant words joined (vendor words and memory
    sizes dropped), at most 16 characters, e.g. "NVIDIA GeForce RTX 4090" -> "rtx4090". None or "" -> "unknown".
    """
    if not device_kind:
        return "unknown"
    kind = device_kind.strip().lower()
    if kind == "cpu" or kind.startswith("cpu"):
        return "cpu"
    for pattern, slug in _SLUG_PATTERNS:
        m = re.search(pattern, kind)
        if m:
            return m.expand(slug)
    words = [w for w in re.split(r"[^a-z0-9]+", kind) if w and w not in _VENDOR_WORDS and not re.fullmatch(r"\d+gb", w)]
    return ("".join(words)[:16]) or "unknown"


def _nvidia_smi_driver() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else None


def device_facts(jax_module: Any) -> dict[str, Any]:
    """The accelerator jax will use: platform, device_kind, count, memory_bytes, compute_capability,
    architecture, driver_version, cuda_plugin (the jax CUDA plugin package and version, e.g. "jax-cuda13-plugin
    0.11.1"), slug.

    `jax_module` is the imported jax (or a stand-in with `devices()`); this module never imports jax itself.
    memory_bytes is the device's allocatable limit (`memory_stats()["bytes_limit"]`) where the backend reports it.
    Unknown values are None.
    """
    devices = jax_module.devices()
    dev = devices[0]
    kind = getattr(dev, "device_kind", None)
    memory = None
    try:
        stats = dev.memory_stats()
        if stats:
            memory = stats.get("bytes_limit")
    except Exception:  # noqa: BLE001  (backends without memory stats raise various errors)
        memory = None
    cc = getattr(dev, "compute_capability", None)
    platform_name = getattr(dev, "platform", None)
    plugin = None
    if platform_name == "gpu" or platform_name == "cuda":
        versions = package_versions(("jax-cuda13-plugin", "jax-cuda12-plugin"))
        plugin = next((f"{k} {v}" for k, v in versions.items() if k != "python" and v), None)
    return {
        "platform": platform_name,
        "device_kind": kind,
        "count": len(devices),
        "memory_bytes": int(memory) if memory is not None else None,
        "compute_capability": str(cc) if cc is not None else None,
        "architecture": gpu_architecture(str(cc)) if cc is not None else None,
        "driver_version": _nvidia_smi_driver() if platform_name in ("gpu", "cuda") else None,
        "cuda_plugin": plugin,
        "slug": "cpu" if platform_name == "cpu" else device_slug(kind),
    }


MEMORY_STATS = ("bytes_limit", "peak_bytes_in_use", "bytes_in_use")
"""The allocator figures `device_memory` records (the keys of jax's `Device.memory_stats()` on a TPU or a GPU)."""


def device_memory(jax_module: Any) -> dict[str, int] | None:
    """The allocator's figures of the devices jax uses, bytes: each of `MEMORY_STATS`, the largest over the local
    devices (a mesh's fullest device), or None where no device reports them (a CPU: `memory_stats()` is None).
    `peak_bytes_in_use` is the process's high-water mark so far, the weights, the KV caches, the compiled programs'
    buffers and every transient included: the measured evidence beside the fit check's stated reserve
    (`model.accounting.MEMORY_RESERVE`). `jax_module`: the imported jax or a stand-in with `local_devices()`."""
    out: dict[str, int] = {}
    for dev in jax_module.local_devices():
        try:
            stats = dev.memory_stats() or {}
        except Exception:  # noqa: BLE001  (backends without memory stats raise various errors)
            stats = {}
        for key in MEMORY_STATS:
            if stats.get(key) is not None:
                out[key] = max(out.get(key, 0), int(stats[key]))
    return out or None


def python_command_line() -> list[str]:
    """The command line of this process as a list (what manifest.json's `command_line` stores)."""
    return [Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python", *sys.argv[1:]]
