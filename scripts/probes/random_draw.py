"""Probe: how fast jax.random fills E2B-sized tables on the live device, and what it costs in memory.

Self-contained (jax and numpy only; Python 3.11 + jax 0.10.2 is enough). Run on the TPU machine:

    OUT=$OUT python scripts/probes/random_draw.py            # writes $OUT/random_draw.json, prints one line a case

Cases (each timed once after a warm-up call of the same program on a small table, device-synced):
- "fill" of the E2B PLE table shape [262144, 8960] in bfloat16, block by block of rows into one donated buffer
  (the way `model.random_weights` draws a large table), with the threefry key (jax's default) and with "rbg"
  (XLA's RngBitGenerator) keys;
- one-shot draws of the E2B embedding [262144, 1536] bfloat16 (threefry, rbg);
- a layer-sized draw, [1536, 24576] bfloat16 (E2B's widest gate/up), 20 times (threefry).
Each case records seconds and the device's peak bytes in use (memory_stats, where the device reports it).
"""

from __future__ import annotations

import json
import os
import sys
import time
from functools import partial

import jax
import jax.numpy as jnp

BLOCK = 1 << 24  # scalars per block


def _peak() -> int | None:
    try:
        return int((jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use", 0)) or None
    except Exception:
        return None


@partial(jax.jit, static_argnames=("rows", "impl"), donate_argnums=(0,))
def _fill(buf, seed, r0, *, rows, impl):
    key = jax.random.key(seed, impl=impl)
    key = jax.random.fold_in(key, r0)
    block = (jax.random.normal(key, (rows, buf.shape[1]), jnp.float32) * 0.02).astype(buf.dtype)
    return jax.lax.dynamic_update_slice(buf, block, (r0, 0))


@partial(jax.jit, static_argnames=("shape", "impl"))
def _whole(seed, *, shape, impl):
    key = jax.random.key(seed, impl=impl)
    return (jax.random.normal(key, shape, jnp.float32) * 0.02).astype(jnp.bfloat16)


def fill_table(shape, impl: str) -> float:
    rows = min(shape[0], max(1, BLOCK // shape[1]))
    warm = jnp.zeros((rows, shape[1]), jnp.bfloat16)
    jax.block_until_ready(_fill(warm, 0, 0, rows=rows, impl=impl))
    t0 = time.perf_counter()
    buf = jnp.zeros(shape, jnp.bfloat16)
    for start in range(0, shape[0], rows):
        r0 = min(start, shape[0] - rows)
        buf = _fill(buf, 0, r0, rows=rows, impl=impl)
    jax.block_until_ready(buf)
    dt = time.perf_counter() - t0
    del buf
    return dt


def whole(shape, impl: str, times: int = 1) -> float:
    jax.block_until_ready(_whole(1, shape=(8, shape[1]), impl=impl))
    jax.block_until_ready(_whole(1, shape=shape, impl=impl))  # compile this shape
    t0 = time.perf_counter()
    for i in range(times):
        x = _whole(i + 2, shape=shape, impl=impl)
        jax.block_until_ready(x)
        del x
    return time.perf_counter() - t0


def main() -> int:
    out = os.environ.get("OUT") or (sys.argv[1] if len(sys.argv) > 1 else ".")
    results = {"jax": jax.__version__, "device": str(jax.devices()[0].device_kind), "cases": []}
    cases = [
        ("fill PLE [262144,8960] bf16 threefry", lambda: fill_table((262144, 8960), "threefry2x32")),
        ("fill PLE [262144,8960] bf16 rbg", lambda: fill_table((262144, 8960), "rbg")),
        ("whole embed [262144,1536] bf16 threefry", lambda: whole((262144, 1536), "threefry2x32")),
        ("whole embed [262144,1536] bf16 rbg", lambda: whole((262144, 1536), "rbg")),
        ("whole layer [1536,24576] bf16 threefry x20", lambda: whole((1536, 24576), "threefry2x32", 20)),
    ]
    for name, fn in cases:
        try:
            secs = fn()
            row = {"case": name, "seconds": round(secs, 4), "peak_bytes": _peak()}
        except Exception as exc:  # one failed case must not hide the others
            row = {"case": name, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        results["cases"].append(row)
        print(json.dumps(row), flush=True)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "random_draw.json"), "w") as f:
        json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
