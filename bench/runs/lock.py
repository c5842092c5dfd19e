"""The writer lock of a run folder, and whether the writer of a run that says "running" is still alive.

One process writes a run at a time: it holds an exclusive `flock` on `<run>/.lock` (released by the kernel when
the process ends, even by SIGKILL) and writes its pid and host into that file. A run whose manifest still says
"running" is therefore interrupted when its `.lock` is missing or can be locked by someone else: its writer is
gone. A lock test on the same host is the liveness check (a pid alone may have been reused by another process);
a run written on another host is only reported as such, never declared dead from here.

Standard library only, like the rest of `bench.runs`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import re
import socket
import time
from pathlib import Path
from typing import IO

from bench.errors import RunFolderError

LOCK = ".lock"  # flock held by the process that writes the run
_HOLDER = re.compile(r"pid (?P<pid>\d+)(?: on (?P<host>\S+))?")


def _holder_line() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}\n"


def take_lock(folder: Path, *, wait_s: float = 1.0) -> IO[str]:
    """Take the writer lock of the run `folder`, retrying in 20 ms steps for up to `wait_s` seconds (a reader's
    `writer_state` holds a shared lock for an instant; a writer is not refused for that); returns the open `.lock`
    file (keep it open: the lock lives as long as the file). Writes "pid N on HOST" into it. RunFolderError, naming
    the holder as its file says, when another process still holds it after `wait_s`."""
    fh = open(folder / LOCK, "a+", encoding="utf-8")  # noqa: SIM115  (held for the writer's life)
    if not _flock_within(fh, wait_s):
        fh.seek(0)
        holder = fh.read().strip() or "another process"
        fh.close()
        raise RunFolderError(
            f"run {folder} is being written by {holder}; wait for it to finish (or stop it), then --resume"
        )
    fh.seek(0)
    fh.truncate()
    fh.write(_holder_line())
    fh.flush()
    return fh


def _flock_within(fh: IO[str], wait_s: float) -> bool:
    """Whether an exclusive flock on `fh` was had within `wait_s` seconds (tried at once, then every 20 ms)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


def release_lock(folder: Path, fh: IO[str]) -> None:
    """Remove `.lock` and release the lock held through `fh` (closed in every case)."""
    try:
        (folder / LOCK).unlink(missing_ok=True)
        fcntl.flock(fh, fcntl.LOCK_UN)
    finally:
        fh.close()


@dataclasses.dataclass(frozen=True, kw_only=True)
class WriterState:
    """Who writes a run folder, as seen from this process.

    alive: True (the lock is held), False (nobody holds it: the writer is gone), None (cannot tell: the writer
    ran on another host). pid, host: as the lock file names them (None when it names none, e.g. no `.lock`).
    """

    alive: bool | None
    pid: int | None
    host: str | None

    def interrupted_note(self, name: str) -> str | None:
        """The one line for a run that says "running" ("interrupted (writer pid N is gone); resume with --resume
        NAME"), or None while its writer is alive; for a writer on another host, where it runs."""
        if self.alive:
            return None
        if self.alive is None:
            return f"written on host {self.host} (pid {self.pid}); its liveness cannot be checked from here"
        who = f"writer pid {self.pid} is gone" if self.pid is not None else "its writer is gone"
        return f"interrupted ({who}); resume with --resume {name}"


def writer_state(folder: Path) -> WriterState:
    """Whether a process holds the writer lock of the run `folder` (`WriterState`). The lock is tested by taking a
    shared lock for an instant, without waiting (a writer starting in that instant is told the run is being
    written only if it outlasts the writer's retries). Never creates `.lock`; no `.lock` at all means no writer."""
    path = folder / LOCK
    try:
        fh = open(path, encoding="utf-8")  # noqa: SIM115
    except FileNotFoundError:
        return WriterState(alive=False, pid=None, host=None)
    except OSError:
        return WriterState(alive=None, pid=None, host=None)
    with fh:
        match = _HOLDER.search(fh.read())
        pid = int(match["pid"]) if match else None
        host = match["host"] if match else None
        if host is not None and host != socket.gethostname():
            return WriterState(alive=None, pid=pid, host=host)
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return WriterState(alive=True, pid=pid, host=host)
        with contextlib.suppress(OSError):
            fcntl.flock(fh, fcntl.LOCK_UN)
        return WriterState(alive=False, pid=pid, host=host)
