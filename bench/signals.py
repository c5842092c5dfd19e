"""SIGINT (Ctrl-C) and SIGTERM handled by a command for a while, then given back: the one place that installs and
restores them, for the sweep's stop flag (`bench.sweep.local.StopSignals`), the run folder's must-finish writes
(`bench.runs`) and `bench profile`'s immediate stop; and `stop_now`, the immediate end of the process that a second
stop signal asks for.

Why a second signal ends the process instead of raising KeyboardInterrupt: a Python signal handler runs in whatever
Python code the main thread runs next, including a garbage-collection callback (jax registers one), a `__del__`
or a weakref finaliser, where an exception is printed as "Exception ignored in ..." and discarded: the signal
would be lost (about 1 time in 5 during a sweep's cold request). `stop_now` cannot be swallowed: it runs the
registered last actions (`on_hard_stop`: e.g. the run folder marked incomplete) and calls `os._exit`. Signals
arriving while the main thread is inside native code (an XLA compile) are handled when that code returns to Python.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
INTERRUPTED_EXIT = 130  # the exit code of an interrupted command (the CLI's, for KeyboardInterrupt, too)

_LAST_ACTIONS: list[Callable[[], None]] = []  # what stop_now runs on the way out, last registered first


@contextlib.contextmanager
def stop_signals_handled(handler: Callable[[int, Any], None]) -> Iterator[dict[int, Any]]:
    """While entered, SIGINT and SIGTERM call `handler(signum, frame)`; yields the previous handlers by signal
    number, which are restored on leaving (one not set from Python, None, comes back as the default action).
    Outside the main thread, where Python cannot install handlers, nothing is installed and it yields {}."""
    if threading.current_thread() is not threading.main_thread():
        yield {}
        return
    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield previous
    finally:
        for sig, old in previous.items():
            signal.signal(sig, signal.SIG_DFL if old is None else old)


@contextlib.contextmanager
def on_hard_stop(action: Callable[[], None]) -> Iterator[None]:
    """While entered, `stop_now` runs `action()` before the process ends (e.g. `RunFolder.end_at_once`: the run
    marked incomplete). `action` must be short, must not raise, and must not need the main thread's state to be
    consistent (it runs from a signal handler, between any two Python instructions)."""
    _LAST_ACTIONS.append(action)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            _LAST_ACTIONS.remove(action)


def stop_now(line: str, code: int = INTERRUPTED_EXIT) -> NoReturn:
    """End the process at once: run the `on_hard_stop` actions (last registered first; an exception of one is
    ignored so that the others run), write `line` to stderr and `os._exit(code)`. No exception is raised, so no
    Python code on the way (a `finally`, an `except BaseException`, a gc callback) can swallow or delay it; files
    written with `os.replace` stay whole (a temporary file may be left next to them), flocks are released by the
    kernel. Buffered stdout is flushed when that is possible."""
    for action in reversed(list(_LAST_ACTIONS)):
        try:
            action()
        except BaseException:  # noqa: BLE001 -- on the way out: the process ends regardless
            pass
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):  # a re-entrant flush (the handler landed inside a write) may fail
            stream.flush()
    with contextlib.suppress(OSError):
        os.write(2, (line.rstrip("\n") + "\n").encode())
    os._exit(code)
