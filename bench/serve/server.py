"""The HTTP server's stop signals: the first SIGTERM or SIGINT (Ctrl-C) shuts down gracefully (no new connections;
the requests in flight finish, uvicorn's own shutdown), a second of either forces the quit at once.

uvicorn (0.54) forces the quit only on a second SIGINT, never on a second SIGTERM (what a process manager sends),
and its forced quit cancels the requests in flight, whose tasks log tracebacks, then re-raises the signals it
caught. Here a second signal of either kind ends the process through `bench.signals.stop_now`: one line on stderr,
exit code 130 (`bench.signals.INTERRUPTED_EXIT`), no traceback; the requests in flight are dropped (their clients
see the connection close). The server writes no run folder, so nothing on disk is left half-done.
"""

from __future__ import annotations

from typing import Any

from bench.signals import stop_now

FORCED_QUIT = "forced quit (a second stop signal): the requests in flight were dropped"


def handle_stop_signal(server: Any, signum: int, frame: Any, *, graceful) -> None:
    """The server's signal handler: the first stop signal calls `graceful(signum, frame)` (uvicorn's
    `Server.handle_exit`: it sets `should_exit`); once `server.should_exit` is set, any stop signal ends the
    process at once (`stop_now(FORCED_QUIT)`, exit code 130)."""
    if server.should_exit:
        stop_now(FORCED_QUIT)
    graceful(signum, frame)


def make_server(config: Any):
    """A `uvicorn.Server` for `config` (a `uvicorn.Config`) whose second SIGTERM or SIGINT forces the quit
    (`handle_stop_signal`). Imports uvicorn when called."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            handle_stop_signal(self, sig, frame, graceful=super().handle_exit)

    return Server(config)
