"""Stop signals counted as delivered: two signals that arrive while the main thread is inside one native call (a
long prefill) are two, and the second ends the process at once (`bench.signals.deliveries_counted`,
`bench.sweep.local.StopSignals`). One subprocess (a jitted loop that never returns), the rest in process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from runfolders import REPO

from bench.signals import deliveries_counted, stop_signals_handled


def _wait_for(predicate, timeout_s: float = 10.0) -> None:
    """Poll `predicate` until true; a bound on how long a failing test hangs, not a timed assert."""
    end = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < end:
        time.sleep(0.01)


def test_every_delivery_is_counted_in_order_and_the_wakeup_fd_is_given_back() -> None:
    seen: list[tuple[int, int]] = []
    handled: list[int] = []
    before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before)
    with stop_signals_handled(lambda signum, _frame: handled.append(signum)):
        with deliveries_counted(lambda signum, count: seen.append((signum, count))):
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
            _wait_for(lambda: len(seen) == 2)
    assert seen == [(signal.SIGTERM, 1), (signal.SIGINT, 2)]
    assert handled == [signal.SIGTERM, signal.SIGINT]  # the Python handlers still run as before
    assert signal.set_wakeup_fd(before) == before  # restored on leaving


def test_outside_the_main_thread_nothing_is_counted() -> None:
    entered: list[bool] = []

    def body() -> None:
        with deliveries_counted(lambda *_: None):
            entered.append(True)

    worker = threading.Thread(target=body)
    worker.start()
    worker.join()
    assert entered == [True]  # no ValueError: set_wakeup_fd is only called from the main thread


NATIVE = textwrap.dedent(
    """
    import sys
    sys.path[:0] = [{repo!r}, {tests!r}]
    import jax, jax.numpy as jnp
    from bench.runs import create_run, writing_run
    from bench.sweep.local import StopSignals
    from runfolders import manifest

    @jax.jit
    def endless(x):  # a prefill that never returns to Python: the Python handler can never run
        return jax.lax.while_loop(lambda c: c[0] >= 0, lambda c: (c[0] + 1, jnp.sin(c[1])), (0, x))[1]

    endless.lower(jnp.zeros(8)).compile()
    with StopSignals(lambda line: print(line, flush=True)):
        with writing_run(lambda: create_run({runs!r}, "native", "cpu", manifest(), date="2026-11-30")):
            print("ready", flush=True)
            endless(jnp.zeros(8)).block_until_ready()
    """
)


def test_two_signals_inside_a_native_call_stop_the_process_at_once(tmp_path: Path) -> None:
    """Before the counter, both signals waited for the native call to return (here: never) and then counted as
    one; the request ran on. Now the second ends the process with the run marked incomplete."""
    script = NATIVE.format(repo=str(REPO), tests=str(REPO / "tests"), runs=str(tmp_path))
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()[-500:]
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)  # as two Ctrl-C's or two `kill`s a moment apart
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the second signal did not end the process ({proc.communicate()[1][-300:]})")
    assert proc.returncode == 130, err
    assert "stopped at once" in err and "Traceback" not in err, err
    (folder,) = tmp_path.iterdir()
    assert json.loads((folder / "manifest.json").read_text())["status"] == "incomplete"
