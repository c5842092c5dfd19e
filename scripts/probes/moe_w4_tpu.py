"""Probe: the TPU expert kernel against the per-assignment XLA route, w4 experts at 26B-A4B's shapes (issue 45,
part 2). Timed on this machine's default jax device; meant for a TPU (python 3.11, jax 0.10.2).

Routes, each one layer's expert block (`model.moe.expert_products`: gate_up, gelu_tanh(gate) * up, down, the
routing weights applied, summed per token), w4 experts with groups of 128 along the contraction axis:
  xla-bytes   values as uint8 bytes, one expert sliced per tile in a loop, XLA's product (CPU/GPU storage)
  xla-words   values in uint32 words (the storage `model.quantspec.leaf_layout` picks on a TPU today), the same loop
              multiplying the slice plane by plane
  kernel      the batched TPU layout (`model.kernels.tpu_layout.to_tpu_experts`) at the tilings the plan picks
              (`model.kernels.fit_tpu.expert_projections`), one expert-kernel call per projection
              (`model.kernels.w4a16_tpu.w4a16_tpu_expert_matmul`)
Then the kernel alone: gate_up's and down's single calls over the step's tiles (decode: one row per assignment).

Each route runs STEPS times inside one jitted loop on fresh routes (K distinct experts per token drawn per step), so
a call's time includes no dispatch; `bytes_chosen` is the w4 bytes (values and scales) of the distinct experts the
step chose at most (min(N K, E) experts), `gbps_chosen` those over the time. `max_abs_diff` is against xla-bytes on
the same inputs (the same values; float32 sums in another order). Writes results.json into $OUT (or the folder
given as the first argument) and prints one line per case.

Run on a TPU, from the repository root (a few minutes; the 26B-A4B weights are random, about 2.3 GB in all):
    OUT=/tmp/moe-w4 python scripts/probes/moe_w4_tpu.py
    OUT=/tmp/moe-w4 python scripts/probes/moe_w4_tpu.py --small   # small shapes (CPU: the kernel interpreted)
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from moe_forms import STEPS, median_per_step, small_and_out_dir  # noqa: E402
from model.kernels import fit_tpu  # noqa: E402
from model.kernels.tpu_layout import to_tpu_experts  # noqa: E402
from model.kernels.w4a16_tpu import w4a16_tpu_expert_matmul  # noqa: E402
from model.moe import expert_products  # noqa: E402
from model.quant import packed_bytes, quantize, with_words  # noqa: E402
from model.quantspec import channels_block  # noqa: E402

TOKENS = (1, 8, 32)
GROUP = 128


@dataclasses.dataclass(frozen=True)
class _Layer:
    """The two expert weights of one layer, as `model.params.LayerParams` names them."""

    experts_gate_up_EDX: object
    experts_down_EDF: object


jax.tree_util.register_dataclass(_Layer, data_fields=["experts_gate_up_EDX", "experts_down_EDF"], meta_fields=[])


def _route(key, n_tok: int, e: int, k: int):
    idx = jnp.argsort(jax.random.uniform(key, (n_tok, e)), axis=-1)[:, :k].astype(jnp.int32)
    return idx, jnp.full(idx.shape, 1.0 / k, jnp.float32)


def timed(fn, args, n_tok: int, e: int, k: int) -> tuple[float, jax.Array]:
    """Seconds per call of fn(*args, idx, w) (median of 3 runs of a STEPS-call jitted loop on fresh routes), and
    the first step's output."""

    @jax.jit
    def loop(args, key):
        def body(i, acc):
            idx, w = _route(jax.random.fold_in(key, i), n_tok, e, k)
            return acc + fn(*args, idx, w).astype(jnp.float32)

        first = fn(*args, *_route(jax.random.fold_in(key, 0), n_tok, e, k))
        return jax.lax.fori_loop(0, STEPS, body, jnp.zeros(first.shape, jnp.float32)), first

    key = jax.random.key(0)
    seconds, (_, first) = median_per_step(lambda: loop(args, key))
    return seconds, first


def timed_fixed(fn, args, ids, e: int) -> float:
    """Seconds per call of fn(*args, ids_i) (median of 3 runs of a STEPS-call jitted loop), step i's expert ids
    (ids + i) mod e: as many distinct experts as `ids` every step, without the routing `timed` draws in each step
    (a random draw and an argsort, about 0.11-0.13 ms a step on the v5e by the 2026-12-08 probe: its 1- and 8-token
    kernel-only times fitted as a constant plus a cost per tile)."""

    @jax.jit
    def loop(args, ids):
        first = fn(*args, ids).astype(jnp.float32)
        return jax.lax.fori_loop(0, STEPS, lambda i, acc: acc + fn(*args, (ids + i) % e).astype(jnp.float32), first)

    seconds, _ = median_per_step(lambda: loop(args, ids))
    return seconds


def main() -> None:
    small, out_dir = small_and_out_dir()
    e, d, i, k = (16, 256, 192, 4) if small else (128, 2816, 704, 8)
    dtype = jnp.bfloat16
    rng = np.random.default_rng(0)
    gu = jnp.asarray(rng.standard_normal((e, d, 2 * i), np.float32) * d**-0.5, dtype)
    dn = jnp.asarray(rng.standard_normal((e, d, i), np.float32) * i**-0.5, dtype)
    q_gu = quantize(gu, 4, channels_block(gu.shape, (1,), GROUP))
    q_dn = quantize(dn, 4, channels_block(dn.shape, (2,), GROUP))
    del gu, dn
    limit = fit_tpu.budget(fit_tpu.vmem_capacity("v5e"))
    cfg = type("Cfg", (), {"has_experts": True, "hidden_size": d, "num_experts": e, "moe_intermediate_size": i,
                           "num_layers": 1})()  # fmt: skip
    projs = {p.field: p for p in fit_tpu.expert_projections(cfg, GROUP)}
    tilings = {f: fit_tpu.choose_tpu(p, limit).tiling for f, p in projs.items()}
    leaves = {"xla-bytes": _Layer(q_gu, q_dn), "xla-words": _Layer(with_words(q_gu, True), with_words(q_dn, True))}
    tiled = {}
    for name, q, axis in (("experts_gate_up_EDX", q_gu, 1), ("experts_down_EDF", q_dn, 2)):
        values, scales = to_tpu_experts(q.values, q.scales, q.shape, axis, GROUP)
        tiled[name] = dataclasses.replace(q, values=values, scales=scales, tiling=tilings[name])
    leaves["kernel"] = _Layer(tiled["experts_gate_up_EDX"], tiled["experts_down_EDF"])
    per_expert = (packed_bytes(q_gu) + packed_bytes(q_dn)) // e
    results = {"device": str(jax.devices()[0]), "jax": jax.__version__, "E": e, "D": d, "I": i, "K": k,
               "group": GROUP, "dtype": "bfloat16", "steps": STEPS,
               "tilings": {f: t.text if t else None for f, t in tilings.items()},
               "stored_bytes_per_expert": {r: sum(packed_bytes(x) for x in (lp.experts_gate_up_EDX,
                                                                            lp.experts_down_EDF)) // e
                                           for r, lp in leaves.items()},
               "cases": []}  # fmt: skip
    print(f"tilings {results['tilings']}; stored bytes per expert {results['stored_bytes_per_expert']}", flush=True)

    def record(case: dict) -> None:
        results["cases"].append(case)
        (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")

    for n_tok in TOKENS:
        x = jnp.asarray(rng.standard_normal((n_tok, d), np.float32), dtype)
        chosen = min(n_tok * k, e) * per_expert
        ref = None
        for route, lp in leaves.items():
            try:
                sec, y = timed(lambda lp, x, idx, w: expert_products(lp, x, idx, w, e), (lp, x), n_tok, e, k)
            except Exception as exc:  # a route this jax or device cannot run: say so, go on
                record({"tokens": n_tok, "route": route, "error": f"{type(exc).__name__}: {exc}"[:400]})
                print(f"tokens {n_tok:3d} {route:9s} error {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            ref = y if ref is None else ref
            err = float(jnp.max(jnp.abs(y.astype(jnp.float32) - ref.astype(jnp.float32))))
            record({"tokens": n_tok, "route": route, "ms": round(sec * 1e3, 4), "bytes_chosen_max": chosen,
                    "gbps_chosen": round(chosen / sec / 1e9, 1), "max_abs_diff_vs_xla_bytes": err})  # fmt: skip
            print(f"tokens {n_tok:3d} {route:9s} {sec * 1e3:9.3f} ms  {chosen / sec / 1e9:7.1f} GB/s of chosen "
                  f"experts  diff {err:.2e}", flush=True)  # fmt: skip
    # The kernel alone at decode: one call over N K tiles of one row, each tile its own expert.
    for n_tok in (1, 8):
        u = n_tok * k
        for name, kk in (("experts_gate_up_EDX", d), ("experts_down_EDF", i)):
            w, p = tiled[name], projs[name]
            x = jnp.asarray(rng.standard_normal((u, 1, kk), np.float32), dtype)

            def call(w, x, idx, _w, p=p, u=u):
                return w4a16_tpu_expert_matmul(x, w.values, w.scales, idx.reshape(-1)[:u], k=p.k, n=p.n, group=GROUP,
                                               tiling=w.tiling, interpret=jax.default_backend() == "cpu")  # fmt: skip

            try:
                sec, _ = timed(call, (w, x), n_tok, e, k)
                ids = jnp.asarray(rng.permutation(e)[:u] if u <= e else rng.integers(0, e, u), jnp.int32)
                fixed = timed_fixed(lambda w, x, idx, call=call: call(w, x, idx, None), (w, x), ids, e)
            except Exception as exc:
                record({"tokens": n_tok, "route": f"kernel-only {name}", "error": f"{type(exc).__name__}: {exc}"[:400]})
                print(f"kernel-only {name} error {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            read = min(u, e) * packed_bytes(w) // e
            record({"tokens": n_tok, "route": f"kernel-only {name}", "ms": round(sec * 1e3, 4), "tiles": u,
                    "bytes_chosen_max": read, "gbps_chosen": round(read / sec / 1e9, 1),
                    "ms_fixed_ids": round(fixed * 1e3, 4), "gbps_fixed_ids": round(read / fixed / 1e9, 1)})  # fmt: skip
            print(f"tokens {n_tok:3d} kernel-only {name} ({u} tiles) {sec * 1e3:9.3f} ms  {read / sec / 1e9:7.1f} GB/s"
                  f"; fixed ids {fixed * 1e3:9.3f} ms  {read / fixed / 1e9:7.1f} GB/s", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
