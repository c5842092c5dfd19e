"""What a `bench ab` session and its workers say to each other over pipes (docs/commands/ab.md, "Worker mode").
Standard library only: the session (no jax) and the worker (`bench.ab.worker`, the engine's process) share it.

A worker is `python -m bench ab-worker --inputs N --max-new-tokens M [SIDE FLAGS]`, started in its side's checkout.
It reads requests from its stdin and writes replies to its stdout, one JSON object per line (UTF-8, "\\n"); all its
other output (logs, warnings) goes to its stderr. No sockets: pipes only (the lent TPU machine has no network).

- worker, once loaded: `{"event": "ready", "protocol": PROTOCOL, "manifest": {...}, "load_s": s}`; the manifest
  is the one `bench sweep` builds for the same engine (build id, device, checkpoint, host), so the two modes'
  build ids compare.
- session: `{"op": "measure", "kind": "warmup" | "timed", "index": i, "delay_ms": ms | null}`; the worker runs
  one request of its cell (host decode loop) and replies `{"event": "measured", ...}` (`MEASURED_KEYS`).
  `delay_ms` is the test-only wait per decode step (`bench ab --test-slowdown-b`); a worker started without
  `--allow-test-delay` refuses it.
- session: `{"op": "quit"}`; the worker exits 0. A worker whose stdin closes exits too (its session has ended).
- either side, on a request it cannot serve: `{"event": "error", "message": "one line"}`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PROTOCOL = 1
"""The version of this exchange: a worker whose ready line names another is refused (one line)."""
WORKER_COMMAND = "ab-worker"
"""The hidden `bench` command that runs a worker (bench/cli/ab_cmds.py)."""
WORKER_FILE = Path("bench") / "ab" / "worker.py"
"""The file whose presence in a checkout says it has a worker (a build older than worker mode has none)."""
MEASURED_KEYS = ("gauge_tok_s", "e2e_tok_s", "cpu_tok_s", "cpu_s", "step_ms", "valid", "invalid_reason",
                 "compile_events", "generated_tokens", "seconds", "started_at", "delay_ms", "step_times_ms")  # fmt: skip
"""A "measured" reply's fields: the request's gauge, end-to-end rate and CPU rate (tok/s; tokens per CPU second),
its CPU time (s, every thread of the worker), its median decode step (ms), its validity and why not, its compile
events, the tokens it generated, its wall time (s), when it began (ISO 8601), the test-only wait it ran with (ms,
None without) and every decode step's time (ms, in order)."""


def has_worker(root: Path) -> bool:
    """True when the checkout at `root` has the worker entry point (`WORKER_FILE`)."""
    return (root / WORKER_FILE).is_file()


def encode(message: dict[str, Any]) -> bytes:
    """One line of the exchange: `message` as compact JSON, then "\\n"."""
    return (json.dumps(message, separators=(",", ":")) + "\n").encode("utf-8")


def decode(line: bytes | str) -> dict[str, Any]:
    """The message of one line; ValueError (naming the text) when it is not a JSON object."""
    text = line.decode("utf-8", errors="replace") if isinstance(line, bytes) else line
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        obj = None
    if not isinstance(obj, dict):
        raise ValueError(f"not a message of the ab worker protocol: {text.strip()[:200]!r}")
    return obj
