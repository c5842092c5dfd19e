"""SIGINT (Ctrl-C) and SIGTERM handled by a command for a while, then given back: the one place that installs and
restores them, for the sweep's stop flag (`bench.sweep.local.StopSignals`), the run folder's must-finish writes
(`bench.runs`) and `bench profile`'s immediate stop; and `stop_now`, the immediate end of the process that a second
stop signal asks for.

Why a second signal ends the process instead of raising KeyboardInterrupt: a Python signal handler runs in whatever
Python code the main thread runs next, including a garbage-collection callback (jax registers one), a `__del__`
or a weakref finaliser, where an exception is printed as "Exception ignored in ..." and discarded: the signal
would be lost (about 1 time in 5 during a sweep's cold request). `stop_now` cannot be swallowed: it runs the
registered last actions (`on_hard_stop`: e.g. the run folder marked incomplete) and calls `os._exit`. Signals
arriving while the main thread is inside native code (an XLA compile, a long prefill) reach the Python handler only
when that code returns, and two of them reach it as one (CPython keeps one "tripped" flag per signal); so
`deliveries_counted` counts every delivery on a thread of its own, through the wakeup fd that CPython's C-level
handler writes one byte to per delivery (`signal.set_wakeup_fd`), and a second stop signal ends the process at once
even while the main thread is still inside native code.
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
_STOPPING = threading.Lock()  # held by the one stop_now that ends the process (another caller waits for the end)


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


@contextlib.contextmanager
def deliveries_counted(on_delivery: Callable[[int, int], None]) -> Iterator[None]:
    """While entered, every delivery of SIGINT or SIGTERM to the process calls `on_delivery(signum, count)` on a
    daemon thread, `count` being the stop signals delivered since entering (1, 2, ...), whether or not the main
    thread has run its Python handler yet: two signals during one native call (a prefill) are two calls here. It
    uses the wakeup fd (`signal.set_wakeup_fd`, one per process: the previous one is restored on leaving), so it
    does not install or replace a handler: enter it inside `stop_signals_handled` (a signal with the default action
    ends the process before anything is counted). Outside the main thread nothing is counted. `on_delivery` runs
    beside the main thread: it must be short and thread-safe (e.g. `stop_now`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # set_wakeup_fd's requirement: a full pipe must never block a signal handler
    previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def count() -> None:
        seen = 0
        while chunk := os.read(read_fd, 64):  # EOF once the write end is closed on leaving
            for signum in chunk:
                if signum in STOP_SIGNALS:
                    seen += 1
                    on_delivery(signum, seen)

    counter = threading.Thread(target=count, name="stop-signal-count", daemon=True)
    counter.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        os.close(write_fd)
        counter.join(timeout=5.0)
        if not counter.is_alive():
            os.close(read_fd)


def stop_now(line: str, code: int = INTERRUPTED_EXIT) -> NoReturn:
    """End the process at once: run the `on_hard_stop` actions (last registered first; an exception of one is
    ignored so that the others run), write `line` to stderr and `os._exit(code)`. No exception is raised, so no
    Python code on the way (a `finally`, an `except BaseException`, a gc callback) can swallow or delay it; files
    written with `os.replace` stay whole (a temporary file may be left next to them), flocks are released by the
    kernel. Called on the main thread, buffered stdout and stderr are flushed when that is possible (not from
    another thread: the main thread may hold a stream's buffer lock while it waits on this one's end). Safe from
    any thread: when two call it (the signal counter of `deliveries_counted` and the main thread's handler), one
    ends the process and the other waits for that end."""
    _STOPPING.acquire()  # never released: the process ends below
    for action in reversed(list(_LAST_ACTIONS)):
        try:
            action()
        except BaseException:  # noqa: BLE001 -- on the way out: the process ends regardless
            pass
    on_main = threading.current_thread() is threading.main_thread()
    for stream in (sys.stdout, sys.stderr) if on_main else ():
        with contextlib.suppress(BaseException):  # a re-entrant flush (the handler landed inside a write) may fail
            stream.flush()
    with contextlib.suppress(OSError):
        os.write(2, (line.rstrip("\n") + "\n").encode())
    os._exit(code)
