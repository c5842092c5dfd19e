"""Checks for the GPU machine's Python stack, used by scripts/gpu-wheels.sh and scripts/gpu-rehearsal.sh.

    python3 scripts/gpu_image.py pins NAME...           NAME==VERSION for each: the image's version where
                                                         scripts/gpu-image-packages.txt gives one, else constraints.txt's
    python3 scripts/gpu_image.py constraints             constraints.txt with the image's known versions put in
    python3 scripts/gpu_image.py check-wheels DIR [LEFT_OUT,...]
                                                         each wheel's needs are carried too or in the image (or
                                                         named as left out on purpose); prints sizes
    python3 scripts/gpu_image.py check-venv PYTHON       every distribution that PYTHON sees is one the image has
    python3 scripts/gpu_image.py extras PYTHON           the names of those it sees that the image lacks
    python3 scripts/gpu_image.py travel-bytes            bytes of this checkout that a device call sends

Standard library only (any Python >= 3.9); markers and version ranges use pip's vendored `packaging` when the
project's own is not importable. Bad input: one `error:` line on stderr, exit 2. A check that fails: its findings,
one per line, then exit 1.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

try:
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.version import Version
except ImportError:  # pragma: no cover - bare interpreters
    from pip._vendor.packaging.markers import default_environment
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
IMAGE_FILE = REPO / "scripts" / "gpu-image-packages.txt"
CONSTRAINTS = REPO / "constraints.txt"

# The image's interpreter and platform, for evaluating wheels' environment markers (Python 3.12.3, Linux x86-64).
IMAGE_ENV = dict(default_environment(), python_version="3.12", python_full_version="3.12.3",
                 implementation_name="cpython", platform_python_implementation="CPython", sys_platform="linux",
                 platform_system="Linux", platform_machine="x86_64", os_name="posix")  # fmt: skip


class Bad(Exception):
    """Bad input: reported as one `error:` line, exit 2."""


def norm(name: str) -> str:
    """A distribution name in PEP 503 form (lower case, runs of '-', '_', '.' as one '-')."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path, allow_bare: bool) -> dict[str, str | None]:
    """{normalised name: version or None} from a file of `name==version` (or bare `name` when `allow_bare`) lines;
    `#` starts a comment. One entry per name."""
    if not path.is_file():
        raise Bad(f"{path} is missing")
    out: dict[str, str | None] = {}
    for i, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:==([A-Za-z0-9.+!_-]+))?", line)
        if not m or (m.group(2) is None and not allow_bare):
            raise Bad(f"{path}:{i}: expected {'name or ' if allow_bare else ''}name==version, got {raw.strip()!r}")
        name = norm(m.group(1))
        if name in out:
            raise Bad(f"{path}:{i}: {m.group(1)} is listed twice")
        out[name] = m.group(2)
    return out


def image() -> dict[str, str | None]:
    """The image's packages: {name: version, or None where nobody has read it}; `python` is the interpreter."""
    return read_pins(IMAGE_FILE, allow_bare=True)


def constraints() -> dict[str, str]:
    return read_pins(CONSTRAINTS, allow_bare=False)  # type: ignore[return-value]


def pins(names: list[str]) -> list[str]:
    """NAME==VERSION per name: the image's version when known (the rehearsal runs what the image runs), else ours."""
    img, ours = image(), constraints()
    out = []
    for name in names:
        n = norm(name)
        version = img.get(n) or ours.get(n)
        if version is None:
            raise Bad(f"{name} has no version: not pinned in {CONSTRAINTS.name} nor read in {IMAGE_FILE.name}")
        out.append(f"{n}=={version}")
    return out


def merged_constraints() -> list[str]:
    """constraints.txt with every version the image file gives put in its place (and the image-only ones added)."""
    img, ours = image(), constraints()
    merged = dict(ours)
    merged.update({n: v for n, v in img.items() if v is not None and n != "python"})
    return [f"{n}=={v}" for n, v in sorted(merged.items())]


def wheel_meta(path: Path) -> tuple[str, str, list[str]]:
    """(normalised name, version, Requires-Dist lines) of a .whl file."""
    try:
        with zipfile.ZipFile(path) as zf:
            meta = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1), None)
            if meta is None:
                raise Bad(f"{path.name}: no */METADATA inside: not a wheel")
            text = zf.read(meta).decode("utf-8", "replace")
    except zipfile.BadZipFile as exc:
        raise Bad(f"{path.name}: not a wheel ({exc})") from exc
    head = text.split("\n\n", 1)[0].splitlines()
    field = {k: v for k, v in (ln.split(": ", 1) for ln in head if ": " in ln) if k in ("Name", "Version")}
    reqs = [ln.split(": ", 1)[1] for ln in head if ln.startswith("Requires-Dist: ")]
    return norm(field["Name"]), field["Version"], reqs


def check_wheels(folder: Path, left_out: frozenset[str] = frozenset()) -> list[str]:
    """Findings that stop a carry: two versions of one name, a wheel's need that is neither carried nor in the image
    nor in `left_out` (needs not carried on purpose), or a version that does not satisfy it. Prints each wheel, the
    needs taken on trust (image versions nobody read) or left out, and the total size."""
    wheels = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    if not wheels:
        raise Bad(f"{folder}: no .whl files (run scripts/gpu-wheels.sh {folder})")
    img = image()
    carried: dict[str, str] = {}
    metas = []
    problems = []
    for w in wheels:
        name, version, reqs = wheel_meta(w)
        if name in carried:
            problems.append(f"two versions of {name}: {carried[name]} and {version} (pip stops at two)")
        carried[name] = version
        metas.append((w, name, version, reqs))
    trusted = []
    for w, name, version, reqs in metas:
        for line in reqs:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(dict(IMAGE_ENV, extra="")):
                continue  # an extra, or not for Python 3.12 on Linux
            need = norm(req.name)
            have = carried.get(need) or img.get(need)
            where = "carried" if need in carried else "image"
            if need in left_out and need not in carried:
                trusted.append(f"left out on purpose: {name}'s {req}")
            elif need not in carried and need not in img:
                problems.append(f"{name} {version} needs {line}: neither carried nor in {IMAGE_FILE.name}")
            elif have is None:
                trusted.append(f"assumed: the image's {need} (version not read) satisfies {name}'s {req}")
            elif req.specifier and not req.specifier.contains(Version(have), prereleases=True):
                problems.append(f"{name} {version} needs {line}; {where} {need} is {have}")
    total = 0
    for w in wheels:
        size = w.stat().st_size
        total += size
        print(f"  {size / 2**20:7.2f} MiB  {w.name}")
    for line in sorted(set(trusted)):
        print(f"  {line}")
    print(f"  {total / 2**20:7.2f} MiB  total, {len(wheels)} wheels")
    return problems


def extras(python: str) -> list[str]:
    """Distributions that `python` sees (its site-packages) which the image does not have: a rehearsal with them
    would pass on a module the GPU machine lacks. Run isolated (`-I`: no current folder, no PYTHONPATH, no user
    site), so a checkout's own `*.egg-info` left by an editable install of the project is not counted."""
    code = "import importlib.metadata as m, json; print(json.dumps(sorted({d.metadata['Name'] for d in m.distributions()})))"
    try:
        proc = subprocess.run([python, "-I", "-c", code], check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise Bad(f"{python} could not list its distributions ({exc})") from exc
    img = image()
    return [n for n in json.loads(proc.stdout) if norm(n) not in img]


def check_venv(python: str) -> list[str]:
    return [f"{python} sees {n}, which {IMAGE_FILE.name} does not list" for n in extras(python)]


def travel_bytes() -> int:
    """Bytes of this checkout's tracked and untracked-not-ignored files: what a device call sends besides `carry`."""
    try:
        out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "-co", "--exclude-standard"], check=True,
                             capture_output=True).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as exc:
        raise Bad(f"{REPO} is not a git checkout, so what a device call sends cannot be measured ({exc})") from exc
    total = 0
    for rel in out.decode().split("\0"):
        p = REPO / rel
        if rel and p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total


def main(argv: list[str]) -> int:
    try:
        if not argv:
            raise Bad("expected a command: pins, constraints, check-wheels, check-venv, extras, travel-bytes")
        cmd, rest = argv[0], argv[1:]
        if cmd == "pins" and rest:
            print("\n".join(pins(rest)))
        elif cmd == "constraints" and not rest:
            print("\n".join(merged_constraints()))
        elif cmd == "check-wheels" and len(rest) in (1, 2) or cmd == "check-venv" and len(rest) == 1:
            if cmd == "check-wheels":
                left_out = frozenset(norm(n) for n in (rest[1:] or [""])[0].split(",") if n)
                problems = check_wheels(Path(rest[0]), left_out)
            else:
                problems = check_venv(rest[0])
            for line in problems:
                print(f"error: {line}", file=sys.stderr)
            return 1 if problems else 0
        elif cmd == "extras" and len(rest) == 1:
            print("\n".join(extras(rest[0])))
        elif cmd == "travel-bytes" and not rest:
            print(travel_bytes())
        else:
            raise Bad(f"bad arguments: {' '.join(argv)} (see {Path(__file__).name}'s docstring)")
    except Bad as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
