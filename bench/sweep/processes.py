"""One in-process sweep run by several jax processes at once (jax.distributed: a mesh over several hosts' devices,
`python -m bench.fleet.distributed -- sweep --mesh tp=N ...`; docs/devices/fleet.md, "Several hosts").

Every process runs the same sweep: the mesh's programs are collective (each process runs its own devices' part of
the same program, and the all-reduces wait for every process), so every process must run the same programs in the
same order, or one waits forever for another that went on to something else. The sweep's order is the same in
every process (the same cells, warm-ups and repeats) except where a process would decide alone: from its own
clock (another timed repeat under --min-duration / --max-duration, `SweepConfig.timed_more`) or its own signals
(stop before the next request, `StopSignals`). Those decisions are agreed here before they are acted on:
- `first_process`: process 0's decision, sent to all (`multihost_utils.broadcast_one_to_all`): the repeats;
- `any_process`: true where any process's is (`multihost_utils.process_allgather`): a stop signal on one host
  stops every host at the same request.
Each is a small collective of its own, run between requests (never inside a timed one), called the same number of
times in every process because every earlier decision was agreed. In one process (no jax.distributed) both return
the process's own decision and run nothing: a one-process sweep is unchanged.

What is not agreed: a second stop signal ends its own process at once (`bench.signals.stop_now`), and a request
that fails in one process only (its host out of memory) makes a failed cell there alone; the other processes'
next collective then fails or waits (docs/devices/fleet.md, "Several hosts", says what was seen on a CPU).
"""

from __future__ import annotations

import sys
from collections.abc import Callable


def process_count() -> int:
    """How many jax processes run this sweep: `jax.process_count()` once jax.distributed is initialized, else 1
    (without importing jax or starting a backend: a sweep through a server has none)."""
    jax = sys.modules.get("jax")
    if jax is None or not jax.distributed.is_initialized():
        return 1
    return jax.process_count()


def first_process(decision: bool) -> bool:
    """Process 0's `decision`, the same in every process (a broadcast from process 0); `decision` itself in one
    process. Every process must call it at the same point of the sweep."""
    if process_count() == 1:
        return decision
    import numpy as np
    from jax.experimental import multihost_utils

    return bool(np.asarray(multihost_utils.broadcast_one_to_all(np.int32(decision))))


def any_process(decision: bool) -> bool:
    """True in every process when `decision` is true in any (an all-gather of each process's); `decision` itself in
    one process. Every process must call it at the same point of the sweep."""
    if process_count() == 1:
        return decision
    import numpy as np
    from jax.experimental import multihost_utils

    return bool(np.asarray(multihost_utils.process_allgather(np.int32(decision))).any())


def agreed_stop(should_stop: Callable[[], bool]) -> Callable[[], bool]:
    """`should_stop` (this process's stop predicate, polled before every request) agreed across the processes
    (`any_process`): every process stops at the same request when any received a signal. In one process the
    predicate itself."""
    if process_count() == 1:
        return should_stop
    return lambda: any_process(should_stop())
