"""A worker of `bench ab`'s worker mode seen from the session (docs/commands/ab.md, "Worker mode"): started once in
its side's checkout (`python -m bench ab-worker ...`, `bench.ab.worker`), asked for one request at a time over its
stdin and stdout (`bench.ab.protocol`), and stopped at the end. Its stderr (the engine's log) goes to a file,
whose last lines are quoted when it fails. No jax here.

A worker runs in a session of its own (`start_new_session`): Ctrl-C reaches the session alone, which then stops its
workers; a worker whose session died sees its stdin close and exits.
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Any

from bench.ab.protocol import PROTOCOL, decode, encode
from bench.errors import BenchError, InputError


class WorkerError(BenchError):
    """A worker that ended or answered out of turn during a session (its side's last log lines quoted)."""


def last_lines(log: Path, n: int = 3) -> str:
    """The last `n` non-empty lines of a log, joined by " | " (what a failure message quotes)."""
    try:
        lines = [ln.strip() for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no output)"
    return " | ".join(lines[-n:]) or "(no output)"


class Worker:
    """One side's worker process: `start` it, `ready` (its manifest), `measure` one request at a time, `close`."""

    def __init__(self, side: str, argv: list[str], cwd: Path, env: dict[str, str], log: Path):
        self.side, self.argv, self.cwd, self.env, self.log = side, argv, cwd, env, log
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        """Start the process (it loads its engine meanwhile; `ready` waits for it)."""
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(self.argv, cwd=self.cwd, env=self.env, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, start_new_session=True)  # fmt: skip

    def _read(self) -> dict[str, Any] | None:
        """The next message, None when the worker's stdout ended (it exited). WorkerError for a line that is not a
        message (something other than the worker wrote to its stdout)."""
        line = self.proc.stdout.readline()
        if not line:
            return None
        try:
            return decode(line)
        except ValueError as exc:
            raise WorkerError(f"side {self.side}'s worker: {exc}") from None

    def _gone(self, when: str) -> str:
        code = self.proc.wait(timeout=30) if self.proc is not None else None
        return f"side {self.side}'s worker ended {when} (exit {code}): {last_lines(self.log)}"

    def ready(self) -> dict[str, Any]:
        """The worker's "ready" message (its sweep manifest: build id, device, checkpoint). InputError (the side's
        flags or build are at fault) when it exits first, quoting its last log lines, or speaks another protocol."""
        msg = self._read()
        if msg is None:
            raise InputError(self._gone("before it was ready"))
        if msg.get("event") != "ready" or msg.get("protocol") != PROTOCOL:
            raise InputError(f"side {self.side}'s worker speaks protocol {msg.get('protocol')!r}, this `bench ab` "
                             f"speaks {PROTOCOL}: measure it with --mode processes")  # fmt: skip
        return msg

    def measure(self, kind: str, index: int, delay_ms: float | None = None) -> dict[str, Any]:
        """One request ("warmup" or "timed") and its "measured" reply. WorkerError when the worker has ended or
        replies with an error."""
        try:
            self.proc.stdin.write(encode({"op": "measure", "kind": kind, "index": index, "delay_ms": delay_ms}))
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerError(self._gone(f"before measurement {index}")) from None
        msg = self._read()
        if msg is None:
            raise WorkerError(self._gone(f"during measurement {index}"))
        if msg.get("event") != "measured":
            raise WorkerError(f"side {self.side}'s worker refused measurement {index}: {msg.get('message', msg)}")
        return msg

    def close(self) -> int | None:
        """Ask the worker to quit and wait for it (10 s), then end it (terminate, then kill); its exit code."""
        if self.proc is None:
            return None
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write(encode({"op": "quit"}))
                self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass
        code = None
        for stop in (None, self.proc.terminate, self.proc.kill):
            if stop is not None:
                stop()
            try:
                code = self.proc.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()
        return code
