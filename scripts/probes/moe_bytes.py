"""What recording the experts read costs a decode step (docs/method.md, "Bytes that follow the routing").

A model with experts' decode program returns, beside its next token, the distinct experts per layer of the step's
routing (model.moe.distinct_experts: an [L, N*K, E] comparison reduced to [L]), and the host loop begins that small
array's copy to the host at dispatch, as it does the token's. This probe times a stand-in step (one [B, D] x [D, D]
product reading D*D*2 bytes, the routing ids derived from its output) in the engine's host loop (two steps
dispatched ahead, copies begun at dispatch) with and without the counts, at 26B-A4B's L = 30, E = 128, K = 8 and
B = 1, 8, 32, alternating the two forms over rounds (median ms per step of each).

Self-contained: jax and numpy only (Python 3.11 + jax 0.10.2 on the TPU machine). Run:
    OUT=/tmp/out python scripts/probes/moe_bytes.py          # the TPU shapes, about a minute
    python scripts/probes/moe_bytes.py --small               # a CPU smoke run
Writes $OUT/moe_bytes.json (or prints only, without OUT) and prints one line per batch.
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

L, E, K = 30, 128, 8  # 26B-A4B: layers, experts, top k


def distinct(ids_LA: jax.Array) -> jax.Array:
    """The engine's count (model.moe.distinct_experts): distinct ids per row of [L, A] -> int32 [L]."""
    return jnp.sum(jnp.any(ids_LA[:, :, None] == jnp.arange(E, dtype=jnp.int32), axis=1), axis=-1, dtype=jnp.int32)


def make_step(counts: bool):
    @jax.jit
    def step(w, x_BD):
        y = (x_BD @ w).astype(jnp.float32)
        token = jnp.argmax(y, axis=-1).astype(jnp.int32)
        x_next = (x_BD + y.astype(x_BD.dtype) * 1e-3).astype(x_BD.dtype)
        if not counts:
            return token, x_next
        ids = (jnp.arange(L * token.shape[0] * K, dtype=jnp.int32).reshape(L, -1) * 7 + token.sum()) % E
        return (token, distinct(ids)), x_next

    return step


def loop_ms(step, w, x, steps: int) -> float:
    """ms per step of `steps` steps, two dispatched ahead, every output's copy begun at dispatch (the engine's
    host loop), each token read on the host in order."""
    pending: collections.deque = collections.deque()
    t0 = time.perf_counter()
    for _ in range(min(2, steps)):
        out, x = step(w, x)
        jax.tree_util.tree_map(lambda a: a.copy_to_host_async(), out)
        pending.append(out)
    for i in range(steps):
        ready = pending.popleft()
        if i + 2 < steps:
            out, x = step(w, x)
            jax.tree_util.tree_map(lambda a: a.copy_to_host_async(), out)
            pending.append(out)
        np.asarray(ready[0] if isinstance(ready, tuple) else ready)
    return (time.perf_counter() - t0) * 1e3 / steps


def main() -> None:
    small = "--small" in sys.argv
    d, steps, rounds = (256, 20, 3) if small else (4096, 200, 7)
    dtype = jnp.float32 if small else jnp.bfloat16
    w = jax.random.normal(jax.random.PRNGKey(0), (d, d), dtype)
    out = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "d": d, "steps": steps, "rounds": rounds,
           "L": L, "E": E, "K": K, "batches": {}}  # fmt: skip
    for b in (1, 8, 32):
        x = jax.random.normal(jax.random.PRNGKey(b), (b, d), dtype)
        forms = {"token": make_step(False), "token+counts": make_step(True)}
        for f in forms.values():  # compile and warm
            loop_ms(f, w, x, 4)
        ms: dict[str, list[float]] = {k: [] for k in forms}
        for _ in range(rounds):
            for k, f in forms.items():
                ms[k].append(loop_ms(f, w, x, steps))
        med = {k: statistics.median(v) for k, v in ms.items()}
        out["batches"][b] = {"ms_per_step": ms, "median": med, "added_ms": med["token+counts"] - med["token"]}
        print(f"B={b}: token only {med['token']:.4f} ms/step, with counts {med['token+counts']:.4f} ms/step "
              f"(+{med['token+counts'] - med['token']:.4f} ms; {rounds} rounds of {steps} steps, d={d})")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "moe_bytes.json"), "w") as fh:
            json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()
