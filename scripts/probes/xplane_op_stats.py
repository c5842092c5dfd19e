"""Probe: what a jax trace's per-op events carry on this device (names, stats, HLO text), for `bench profile`'s
per-op bytes and findings (issue 43 part 4).

Runs with only jax and numpy (the TPU image's Python 3.11 + jax 0.10.2 included). It jits small programs, one of
them built to relayout a parameter every call (a uint8 table gathered one row at a time, the shape of the packed
PLE table), traces 3 calls of each with `jax.profiler`, and writes into $OUT (or argv[1]):
- `<program>.hlo.txt`: the compiled module's HLO text (`compile().as_text()`);
- `<program>.events.json`: for every plane and line, up to 200 events: name, duration, and every stat (name and
  value, bytes shown by length);
- `<program>.xplane.pb`: the raw trace (small), to build test fixtures from.
Usage: OUT=/tmp/out python scripts/probes/xplane_op_stats.py

What it showed on the lent TPU v5e (jax 0.10.2, 2026-12-07; the facts `bench.profile.xspace` and
`bench.profile.analysis` rely on): the `XLA Ops` event names are the instructions' HLO text with operand shapes and
tiled layouts; `gather_row` relaid its parameter out every call, `%copy = u8[65536,4480]{1,0:T(8,128)(4,1)}
copy(u8[65536,4480]{1,0:T(32,128)(4,1)} %T.1)`, 0.89 ms a call (E2B's `copy.191` in small); the events' own stats
are only device_offset_ps / device_duration_ps, while their metadata carry `bytes_accessed` (587202560 for that
copy: read + written), `raw_bytes_accessed`, `shape_with_layout`, `hlo_category` ("data formatting"), `flops`,
`tf_op`, `source`; the HLO proto on `/host:metadata` holds the parameter numbers and tiled layouts.
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


def programs():
    rng = np.random.default_rng(0)
    rows, width = 65536, 4480
    table = jnp.asarray(rng.integers(0, 255, (rows, width), dtype=np.uint8))
    w = jnp.asarray(rng.standard_normal((2048, 1024), np.float32)).astype(jnp.bfloat16)

    def gather_row(tok, table):
        row = jnp.take(table, tok, axis=0)
        return (row.astype(jnp.float32) * 0.5).sum(), tok + 1

    def transpose_dot(x, w):
        return jnp.tanh(x @ jnp.transpose(w).T.astype(jnp.float32)), w

    def transpose_copy(x, w):  # a transposed parameter kept as a value: XLA must materialise it
        wt = jnp.transpose(w)
        return (x[:, :1024] @ wt.astype(jnp.float32)).sum() + wt[3, 5].astype(jnp.float32), w

    tok = jnp.array([7], jnp.int32)
    x = jnp.ones((1, 2048), jnp.float32)
    return {
        "gather_row": (jax.jit(gather_row), lambda s: (s[1], table), (tok, table)),
        "transpose_dot": (jax.jit(transpose_dot), lambda s: (x, w), (x, w)),
        "transpose_copy": (jax.jit(transpose_copy), lambda s: (x, w), (x, w)),
    }


def value(v):
    if isinstance(v, (bytes, bytearray)):
        return f"<{len(v)} bytes>"
    if isinstance(v, (int, float, bool)) or v is None:
        return v
    s = str(v)
    return s if len(s) < 4000 else s[:4000] + "...(cut)"


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "probe-out"))
    out.mkdir(parents=True, exist_ok=True)
    print("jax", jax.__version__, "device", jax.devices()[0].device_kind, flush=True)
    for name, (fn, next_args, args) in programs().items():
        t0 = time.perf_counter()
        (out / f"{name}.hlo.txt").write_text(fn.lower(*args).compile().as_text())
        res = jax.block_until_ready(fn(*args))
        trace_dir = out / f"trace-{name}"
        opts = jax.profiler.ProfileOptions()
        opts.host_tracer_level = 1
        opts.python_tracer_level = 0
        jax.profiler.start_trace(str(trace_dir), profiler_options=opts)
        for i in range(3):
            with jax.profiler.StepTraceAnnotation("decode", step_num=i):
                res = jax.block_until_ready(fn(*next_args(res)))
        jax.profiler.stop_trace()
        pb = sorted(trace_dir.rglob("*.xplane.pb"))[-1]
        data = pb.read_bytes()
        (out / f"{name}.xplane.pb").write_bytes(data)
        pd = jax.profiler.ProfileData.from_serialized_xspace(data)
        dump = []
        for plane in pd.planes:
            p = {"plane": plane.name, "stats": {k: value(v) for k, v in plane.stats}, "lines": []}
            for line in plane.lines:
                evs = []
                for ev in list(line.events)[:200]:
                    evs.append({"name": value(ev.name), "duration_ns": ev.duration_ns,
                                "stats": {k: value(v) for k, v in ev.stats}})
                p["lines"].append({"line": line.name, "events": evs})
            dump.append(p)
        (out / f"{name}.events.json").write_text(json.dumps(dump, indent=1))
        print(f"{name}: {len(data)} trace bytes, {time.perf_counter() - t0:.1f} s", flush=True)
        for plane in dump:
            for line in plane["lines"]:
                if line["line"] == "XLA Ops":
                    for ev in line["events"][:12]:
                        print("  ", plane["plane"], "|", ev["name"][:300], "|", ev["stats"], flush=True)


if __name__ == "__main__":
    main()
