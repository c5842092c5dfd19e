"""The two sides of an A/B session: which build runs (this checkout, another worktree, or a git ref checked out
in a temporary worktree) and with which engine flags of `bench sweep`.

A side is written as one text (`bench ab --a TEXT --b TEXT`): an optional BUILD first, then sweep flags, split as
a POSIX shell would (`shlex.split`). BUILD is a folder holding a checkout of this project (a worktree: it has
`bench/__main__.py`), or a git ref of the repository this command runs in (a branch, tag or commit), resolved to
its commit and checked out with `git worktree add --detach` into a temporary folder that is removed afterwards.
No BUILD: this checkout, as it is on disk (uncommitted changes included). Examples: `"--quant w8"`, `"main"`,
`"../wt/other --dtype bfloat16"`.

The flags go to `python -m bench sweep` unchanged (its own parser checks them); the workload flags that
`bench ab` sets itself (`RESERVED_FLAGS`) are refused here, one line, before anything runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bench.errors import InputError

RESERVED_FLAGS = ("--inputs", "--max-new-tokens", "--repeats", "--min-duration", "--max-duration", "--name",
                  "--runs-dir", "--resume", "--decode-loop", "--decode-block", "--target", "--model", "--concurrency",
                  "--request-rate", "--num-requests", "--seed", "--batch", "--api-key")  # fmt: skip
"""Sweep flags a side may not set: `bench ab` sets the cell, the run folder and the host decode loop of every
measurement itself (`--inputs`, `--max-new-tokens`, `--repeats` are its own flags), and measures the in-process
engine only."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Side:
    """One side as given: `name` ("A" or "B"), `text` (as typed), `build` (the BUILD word, None for this
    checkout) and `flags` (the sweep flags, in order)."""

    name: str
    text: str
    build: str | None
    flags: tuple[str, ...]

    def describe(self) -> str:
        """"A: this checkout --quant w8" (how the terminal and the report name the side)."""
        build = self.build if self.build is not None else "this checkout"
        return f"{self.name}: {build}" + (f" {shlex.join(self.flags)}" if self.flags else "")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Checkout:
    """Where a side's `python -m bench` runs: `root` (the folder), `kind` ("this checkout", "worktree" or
    "git ref"), `ref` (the ref as given, for a git ref) and `commit` (40 hex, where git knows it)."""

    root: Path
    kind: str
    ref: str | None = None
    commit: str | None = None


def parse_side(name: str, text: str) -> Side:
    """The `Side` of `text` (see the module docstring). InputError (one line) for text a shell cannot split, a
    flag of `RESERVED_FLAGS`, or a second word that is not a flag after BUILD."""
    try:
        words = shlex.split(text or "")
    except ValueError as exc:
        raise InputError(f"--{name.lower()} {text!r}: cannot split it as a shell would ({exc}); quote it as "
                         "'[BUILD] [SWEEP FLAGS]', e.g. --b \"--quant w8\"") from None  # fmt: skip
    build = None
    if words and not words[0].startswith("-"):
        build, words = words[0], words[1:]
    for word in words:
        flag = word.split("=", 1)[0]
        if flag in RESERVED_FLAGS:
            raise InputError(f"--{name.lower()} {text!r}: {flag} is set by `bench ab` for both sides (the cell: "
                             "--inputs, --max-new-tokens, --repeats of `bench ab`); drop it from the side")  # fmt: skip
    return Side(name=name, text=text or "", build=build, flags=tuple(words))


def _git(repo: Path, *args: str) -> str | None:
    """stdout of `git -C repo ARGS` (stripped), None when git is missing or the command fails."""
    if shutil.which("git") is None:
        return None
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def is_checkout(folder: Path) -> bool:
    """True when `folder` holds this project's command line (`bench/__main__.py`)."""
    return (folder / "bench" / "__main__.py").is_file()


def locate(side: Side, here: Path) -> Checkout | str:
    """Where `side` runs, without changing anything: a `Checkout` for this checkout or a worktree folder, else the
    commit (40 hex) its git ref names in the repository of `here`. InputError for a BUILD that is neither."""
    if side.build is None:
        return Checkout(root=here, kind="this checkout", commit=_git(here, "rev-parse", "HEAD"))
    folder = Path(side.build).expanduser()
    if folder.is_dir():
        if not is_checkout(folder):
            raise InputError(f"--{side.name.lower()} {side.text!r}: {folder} is a folder but holds no checkout of "
                             "this project (no bench/__main__.py); name a worktree of it, or a git ref")  # fmt: skip
        return Checkout(root=folder.resolve(), kind="worktree", commit=_git(folder, "rev-parse", "HEAD"))
    commit = _git(here, "rev-parse", "--verify", "--quiet", f"{side.build}^{{commit}}")
    if not commit:
        raise InputError(f"--{side.name.lower()} {side.text!r}: {side.build!r} is neither a folder nor a git ref of "
                         f"the repository at {here} (a branch, tag or commit); expected '[BUILD] [SWEEP FLAGS]'")  # fmt: skip
    return commit


@contextlib.contextmanager
def checked_out(side: Side, here: Path, log=lambda line: None) -> Iterator[Checkout]:  # noqa: ANN001
    """The side's `Checkout` for the duration of the block. A git ref is checked out (`git worktree add --detach`)
    into a temporary folder first and removed afterwards (`git worktree remove --force`, then the folder), however
    the block ends. InputError as `locate`; InputError when git cannot add the worktree."""
    where = locate(side, here)
    if isinstance(where, Checkout):
        yield where
        return
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-ab-{side.name.lower()}-"))
    if _git(here, "worktree", "add", "--detach", str(tmp), where) is None:
        shutil.rmtree(tmp, ignore_errors=True)
        raise InputError(f"--{side.name.lower()} {side.text!r}: git could not check out {where[:12]} into {tmp} "
                         "(`git worktree add --detach`); check `git worktree list`")  # fmt: skip
    log(f"side {side.name}: {side.build} ({where[:12]}) checked out in {tmp}")
    try:
        yield Checkout(root=tmp, kind="git ref", ref=side.build, commit=where)
    finally:
        _git(here, "worktree", "remove", "--force", str(tmp))
        shutil.rmtree(tmp, ignore_errors=True)
