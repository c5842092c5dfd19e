"""SIGINT (Ctrl-C) and SIGTERM handled by a command for a while, then given back: the one place that installs and
restores them, for the sweep's stop flag (`bench.sweep.local.StopSignals`), the run folder's must-finish writes
(`bench.runs`) and `bench profile`'s immediate stop."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


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
