"""`bench sweep`: cells of (input size, max_new_tokens), cold / warm-up / timed requests, into a run folder.

- `SweepConfig`, `run_sweep`, `sweep_cells`, `build_prompts`, `parse_inputs`, `StopSignals`
                                                         (bench.sweep.local: the in-process engine)
- `sweep_target`, `TargetError`                         (bench.sweep.remote: any OpenAI-compatible server)
- `build_plan`, `write_plan`, `read_requests`, `import_peer`, `PeerRequests`, `PeerError`
                                                         (bench.sweep.peer: the transformers peer's plan and import)

The remote sweep never imports the server (an import contract).
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

__all__ = ["StopSignals", "SweepConfig", "build_prompts", "parse_inputs", "run_sweep", "sweep_cells",
           "TargetError", "sweep_target", "PeerError", "PeerRequests", "build_plan", "import_peer", "read_requests",
           "write_plan"]  # fmt: skip
