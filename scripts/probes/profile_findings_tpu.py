"""Probe: `bench profile`'s findings on a TPU, end to end, without the CLI's packages (issue 43 part 4).

Runs with jax, numpy and this repository on PYTHONPATH (`bench.profile` imports nothing else), so on the lent TPU
(Python 3.11, jax 0.10.2) no wheels are needed. One jitted "decode step" shaped like E2B's `ple4,int8_lm_head`
step in small: a packed u8 table [65536, 4480] of which one row is gathered, and an int8 head s8[65536, 1536]
multiplied by the activations, both passed as arguments as the engine passes its weights. It is traced for 3 steps
by `bench.profile.capture.capture_steps`, analysed by `bench.profile.analysis.analyze_trace`, given a roofline whose
bytes per step are what the step should read (one table row, the whole head, the activations), and its findings are
printed and written with the whole profile.json to $OUT (or argv[1]).

Expected on the TPU v5e (the lead's probes of 2026-12-07, /work/tpu-notes/01-gather-layouts.md): a "layout change
of parameter" finding for the table and one for the head, each from T(32,128)(4,1) to T(8,128)(4,1), with "trace
bytes_accessed" bytes. On a CPU no parameter is relaid out; the head's product, this toy's whole step, is named for
its bytes share alone (measured here: 0.101 GB = 100% of the step, "bytes from shapes"). Usage:
    PYTHONPATH=$PWD OUT=/tmp/out python3 scripts/probes/profile_findings_tpu.py
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from bench.profile.analysis import analyze_trace, attach_roofline
from bench.profile.capture import capture_steps
from bench.profile.findings import format_finding

ROWS, PLE_WIDTH, HIDDEN = 65536, 4480, 1536


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "probe-out"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)  # numpy on the host: jax.random on 1e8-element int arrays is slow on the TPU
    table = jax.device_put(rng.integers(0, 256, (ROWS, PLE_WIDTH), dtype=np.uint8))
    head = jax.device_put(rng.integers(-127, 128, (ROWS, HIDDEN), dtype=np.int8))
    scales = jax.device_put(np.full((ROWS,), 0.01, np.float32))
    x = jnp.ones((1, HIDDEN), jnp.bfloat16)

    @jax.jit
    def step(token, table, head, scales):
        row = jnp.take(table, token, axis=0).astype(jnp.float32)
        logits = (x @ head.astype(jnp.bfloat16).T).astype(jnp.float32) * scales
        return (jnp.argmax(logits[0]) + row.sum().astype(jnp.int32)) % ROWS

    state = jnp.array([7], jnp.int32)
    capture = capture_steps(lambda s: step(s, table, head, scales).reshape(1), state, 3, out / "trace", warmup=1)
    analysis = analyze_trace(capture.xplane_path)
    should_read = PLE_WIDTH + ROWS * HIDDEN + ROWS * 4 + HIDDEN * 2
    data = attach_roofline(analysis, bytes_per_step=should_read, bandwidth_bytes_s=819e9).to_json()
    (out / "profile.json").write_text(json.dumps(data, indent=1))
    print(f"jax {jax.__version__} on {capture.device_kind}; {time.perf_counter() - t0:.1f} s")
    print(f"bytes the step should read: {should_read:,}; the ops moved {data['totals']['op_bytes_per_step']:,.0f} "
          f"per step ({data['totals']['op_bytes_sources']})")  # fmt: skip
    for row in data["ops"][:8]:
        print(f"  {row['name'][:40]:40s} {row['pct']:5.1f}% {row['bytes_per_step'] or 0:>14,.0f} B "
              f"({row['bytes_source']}) {row['hlo'][:160]}")  # fmt: skip
    print(f"findings: {len(data['findings'])}")
    for finding in data["findings"]:
        print(f"finding: {format_finding(finding)}")


if __name__ == "__main__":
    main()
