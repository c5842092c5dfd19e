"""`python -m bench.fleet.distributed [--devices N] [--port P] -- BENCH ARGS`: join this host's jax process to the
others of a SkyPilot multi-node task with `jax.distributed.initialize`, then run `bench BENCH ARGS` in this same
process (a multi-host fleet task runs its sweeps this way: docs/devices/fleet.md, "Several hosts").

SkyPilot runs a task's `run` on every node (and on every host of a multi-host TPU slice) with
(docs.skypilot.co, "Distributed Multi-Node Jobs", and sky/skylet/constants.py in SkyPilot 0.14):
- SKYPILOT_NODE_RANK: this node's rank, 0 .. nodes - 1 (0 is the head node);
- SKYPILOT_NODE_IPS: the nodes' IP addresses, one a line, in rank order;
- SKYPILOT_NUM_NODES: how many nodes.
From them (`read_cluster`): the coordinator is rank 0's address at `--port` (default `PORT`), the process count is
the node count and this process's id its rank: `jax.distributed.initialize(coordinator_address, num_processes,
process_id)`, every local device of the host visible to its one process. A missing variable, a rank or count that
is not a whole number, an IP list whose length is not the count, or a rank out of range is refused in one line
(exit 2) before jax is imported. After the initialization, with `--devices N`, jax must see N devices in all (the
task's mesh), else one line and exit 2: a mesh over devices that are not there would fail later, less clearly.
`jax.distributed.initialize` failing (a coordinator that does not answer within its timeout) is one line, exit 1.

Then `bench BENCH ARGS` runs in this process (`runpy` runs the `bench` package's __main__, as `python -m bench`
would): jax.distributed must be initialized in the process that computes, so it cannot be a child. A hand-over,
not an import: this package never imports `bench.cli` (like bench/gpurun/__main__.py's `os.execv`). This is the
one module of bench.fleet that imports jax (inside `jax_initialize`, an exception the import contract names);
nothing imports it.

Offline, this is tested with fake variables (`read_cluster`) and two real processes on the CPU (`jax.distributed`
with a coordinator on 127.0.0.1), which also run `sweep --mesh tp=2` to the end with one device's tokens (each
process measures on its own devices and agrees with the others where it would decide alone:
bench/sweep/processes.py): a launch across real hosts needs cloud credentials and is not tested here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from bench.errors import InputError

RANK, IPS, NODES = "SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS", "SKYPILOT_NUM_NODES"
"""SkyPilot's multi-node variables (sky.skylet.constants, SkyPilot 0.14)."""
PORT = 8482
"""The coordinator's port on rank 0: the one jax's own Cloud TPU detection uses (jax/_src/clusters/
cloud_tpu_cluster.py, `coordinator_port`); any port free on rank 0 and agreed by all would do."""
USAGE = "python -m bench.fleet.distributed [--devices N] [--port P] -- BENCH ARGS (e.g. -- sweep --mesh tp=8 ...)"
EXIT_USAGE, EXIT_FAILED = 2, 1


@dataclass(frozen=True)
class Cluster:
    """This process's place among the task's hosts: `rank` (0 .. len(ips) - 1) and `ips` (rank order)."""

    rank: int
    ips: tuple[str, ...]

    @property
    def processes(self) -> int:
        """One jax process per host."""
        return len(self.ips)

    def coordinator(self, port: int) -> str:
        """Rank 0's address and `port`, "IP:PORT" ("[IPv6]:PORT")."""
        head = self.ips[0]
        return f"[{head}]:{port}" if ":" in head else f"{head}:{port}"


def _whole(name: str, text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise InputError(f"{name}={text!r}: expected a whole number >= 0 (SkyPilot sets it on each node)")
    return int(text)


def read_cluster(env: Mapping[str, str]) -> Cluster:
    """The `Cluster` SkyPilot's variables in `env` describe (module docstring). Raises InputError (one line: what was
    found, what is expected) when one is missing or they disagree."""
    missing = [v for v in (RANK, IPS, NODES) if not env.get(v, "").strip()]
    if missing:
        raise InputError(f"{', '.join(missing)} not set: expected SkyPilot's multi-node variables {RANK}, {IPS} and "
                         f"{NODES}; run this from a SkyPilot task's run command (num_nodes > 1 or a multi-host TPU "
                         "slice), or set them by hand")  # fmt: skip
    rank, nodes = _whole(RANK, env[RANK].strip()), _whole(NODES, env[NODES].strip())
    ips = tuple(line.strip() for line in env[IPS].splitlines() if line.strip())
    if any(len(ip.split()) != 1 for ip in ips):
        raise InputError(f"{IPS}={env[IPS]!r}: expected one address a line")
    if len(ips) != nodes:
        raise InputError(f"{NODES}={nodes} but {IPS} lists {len(ips)} address(es) ({', '.join(ips) or 'none'}); "
                         "expected one address per node")  # fmt: skip
    if nodes < 1 or rank >= nodes:
        raise InputError(f"{RANK}={rank}: expected a rank from 0 to {nodes - 1} ({NODES}={nodes})")
    return Cluster(rank=rank, ips=ips)


def parse_argv(argv: Sequence[str]) -> tuple[int | None, int, list[str]]:
    """argv -> (devices or None, port, the bench command after "--"). InputError (one line, `USAGE`) for an option
    it does not know, a value that is not a whole number >= 1 (a port: 1..65535), or no command."""
    if "--" not in argv:
        raise InputError(f"expected `--` and the bench command after it: {USAGE}")
    cut = list(argv).index("--")
    opts, command = list(argv[:cut]), list(argv[cut + 1:])
    values: dict[str, int] = {}
    while opts:
        flag = opts.pop(0)
        if flag not in ("--devices", "--port") or not opts:
            raise InputError(f"{flag}: expected --devices N or --port P before `--`: {USAGE}")
        text = opts.pop(0)
        limit = 65535 if flag == "--port" else None
        if not (text.isascii() and text.isdigit()) or int(text) < 1 or (limit and int(text) > limit):
            raise InputError(f"{flag} {text}: expected a whole number from 1{f' to {limit}' if limit else ''}")
        values[flag] = int(text)
    if not command:
        raise InputError(f"no bench command after `--`: {USAGE}")
    return values.get("--devices"), values.get("--port", PORT), command


def jax_initialize(coordinator: str, processes: int, process_id: int) -> int:
    """`jax.distributed.initialize(coordinator, processes, process_id)`; returns `jax.device_count()` (every
    process's devices). Raises RuntimeError (one line) when the initialization fails."""
    import jax

    try:
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=processes, process_id=process_id)
    except Exception as exc:  # XlaRuntimeError, RuntimeError, ValueError: any becomes one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise RuntimeError(f"jax.distributed.initialize({coordinator}, {processes} processes, process "
                           f"{process_id}) failed: {first}") from None  # fmt: skip
    return jax.device_count()


def run_bench(command: list[str]) -> None:
    """Run `bench COMMAND` in this process: the `bench` package's __main__ with sys.argv set, as `python -m bench
    COMMAND` would (it exits through SystemExit)."""
    import runpy

    sys.argv = ["bench", *command]
    runpy.run_module("bench", run_name="__main__", alter_sys=True)


def main(argv: Sequence[str], env: Mapping[str, str] = os.environ, *,
         initialize: Callable[[str, int, int], int] = jax_initialize,
         hand_over: Callable[[list[str]], None] = run_bench) -> int:  # fmt: skip
    """Check argv and the variables, initialize jax.distributed, check the devices, hand over to bench (module
    docstring). Returns EXIT_USAGE or EXIT_FAILED after one line on stderr; the bench command's own exit otherwise
    (it raises SystemExit). `initialize` and `hand_over` are the jax and bench steps (tests pass stand-ins)."""
    try:
        devices, port, command = parse_argv(argv)
        cluster = read_cluster(env)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        seen = initialize(cluster.coordinator(port), cluster.processes, cluster.rank)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if devices is not None and seen != devices:
        print(f"error: --devices {devices}: jax sees {seen} device(s) over {cluster.processes} process(es) after "
              f"jax.distributed.initialize; expected {devices} (the task's mesh): check the accelerator count and "
              "that every node started", file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    print(f"bench.fleet.distributed: process {cluster.rank} of {cluster.processes}, coordinator "
          f"{cluster.coordinator(port)}, {seen} device(s) in all; running: bench {' '.join(command)}", flush=True)  # fmt: skip
    hand_over(command)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
