"""`bench serve`'s stop signals (bench/serve/server.py): the first shuts down gracefully, a second SIGTERM or SIGINT
forces the quit at once, exit code 130, one line, no traceback. In process for the handler; one subprocess with a
fake app (no engine, no jax) whose request never ends, so the graceful shutdown waits on it."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import uvicorn
from runfolders import REPO

import bench.serve.server as server_module
from bench.serve.server import FORCED_QUIT, make_server


class Stopped(Exception):
    """Raised by the stand-in for stop_now."""


@pytest.mark.parametrize("first, second", [(signal.SIGTERM, signal.SIGTERM), (signal.SIGINT, signal.SIGTERM),
                                           (signal.SIGTERM, signal.SIGINT)])  # fmt: skip
def test_the_second_stop_signal_of_either_kind_forces_the_quit(first, second, monkeypatch) -> None:
    calls: list[tuple[str, int]] = []

    def fake_stop(line: str, code: int = 130):
        calls.append((line, code))
        raise Stopped

    monkeypatch.setattr(server_module, "stop_now", fake_stop)
    server = make_server(uvicorn.Config(lambda *_: None))
    server.handle_exit(first, None)
    assert server.should_exit and not server.force_exit and calls == []  # the first: graceful, as uvicorn's
    with pytest.raises(Stopped):
        server.handle_exit(second, None)
    assert calls == [(FORCED_QUIT, 130)]


FAKE_SERVER = textwrap.dedent(
    """
    import asyncio, sys
    sys.path[:0] = [{repo!r}]
    import uvicorn
    from bench.serve.server import make_server

    async def app(scope, receive, send):  # every request runs until the process ends
        if scope["type"] == "http":
            print("in flight", flush=True)
            await asyncio.sleep(3600)

    server = make_server(uvicorn.Config(app, host="127.0.0.1", port={port}, lifespan="off", log_level="info"))
    server.run()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_forced_quit_exits_130_at_once_without_a_traceback(sig) -> None:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", FAKE_SERVER.format(repo=str(REPO), port=port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    client = None
    try:
        for _ in range(200):  # until the port accepts (a bound on a failing test's wait, not a timed assert)
            try:
                client = socket.create_connection(("127.0.0.1", port), timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        assert client is not None, proc.stderr.read() if proc.poll() is not None else "the server never listened"
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert proc.stdout.readline().strip() == "in flight"
        proc.send_signal(sig)  # graceful: uvicorn waits for the request in flight, which never ends
        time.sleep(0.3)
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the second signal did not force the quit ({proc.communicate()[1][-300:]})")
    finally:
        if client is not None:
            client.close()
    assert proc.returncode == 130, err
    assert "Waiting for connections to close" in err  # the first signal's graceful shutdown had begun
    assert err.splitlines()[-1] == FORCED_QUIT and "Traceback" not in err, err
