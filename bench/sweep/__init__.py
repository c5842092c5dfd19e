"""`bench sweep`: cells of (input size, max_new_tokens), cold / warm-up / timed requests, into a run folder.

- `SweepConfig`, `run_sweep`, `sweep_cells`, `build_prompts`, `parse_inputs`, `StopSignals`
                                                         (bench.sweep.local: the in-process engine)
- `sweep_target`, `TargetError`                         (bench.sweep.remote: any OpenAI-compatible server)
- `LoadConfig`, `run_load_sweep`, `run_level`, `parse_concurrency`, `poisson_offsets`
                                                         (bench.sweep.load: a server under load, `--concurrency`)
- `build_plan`, `write_plan`, `read_requests`, `import_peer`, `PeerRequests`, `PeerError`
                                                         (bench.sweep.peer: the transformers peer's plan and import)

The remote sweeps (one at a time, and under load) never import the server (an import contract).
"""

from bench.sweep.local import (
           StopSignals,
           SweepConfig,
           build_prompts,
           parse_inputs,
           run_sweep,
           sweep_cells,
)
from bench.sweep.peer import PeerError, PeerRequests, build_plan, import_peer, read_requests, write_plan
from bench.sweep.remote import TargetError, sweep_target
from bench.sweep.load import LoadConfig, parse_concurrency, poisson_offsets, run_level, run_load_sweep  # noqa: E402

__all__ = ["StopSignals", "SweepConfig", "build_prompts", "parse_inputs", "run_sweep", "sweep_cells",
           "TargetError", "sweep_target", "LoadConfig", "parse_concurrency", "poisson_offsets", "run_level",
           "run_load_sweep", "PeerError", "PeerRequests", "build_plan", "import_peer", "read_requests",
           "write_plan"]  # fmt: skip
