"""TPU probe: the W4A16 kernel's (`model.kernels.w4a16_tpu`) speed at decode's one row across tilings (bn, bk) of
every w4 projection shape of E2B, to choose `model.kernels.fit_tpu`'s preference from measurement.

Why: the fit check prefers the fewest grid steps (the largest block that fits), so most E2B products run as one
grid step (qkv 1536 x 2560, o 2048 x 1536, the PLE projections) and the largest as 3-6. Pallas's TPU pipeline
overlaps a block's copy from HBM with the previous block's compute, so a one-step grid copies, then computes, with
no overlap; issue 43's kernel probe (2026-12-07) read 350 GB/s on the small products against 629 on gate_up.

Besides the grid of --bns x --bks, each shape's tiling under each policy of `fit_tpu.TILING_POLICIES` (at the
v5e's VMEM budget: "fewest", the engine's default, and "steps") is timed, and its case names the policies that
choose it, so the JSON answers which policy's tiling is faster per shape. Shapes run in the order of the question
(the one-step products first) until --budget-s, which is checked before every tiling; the JSON is rewritten after
each, so a probe cut short keeps what it measured, and a summary per shape ends the output.

--resident also times the kernel's experimental resident form (every operand whole in VMEM, one grid step: XLA
copies the weight in before the call, a copy its scheduler may overlap with earlier ops) on the shapes it takes;
--policies-only skips the (bn, bk) grid (the policies' tilings only).

Timing as `w4_hybrid_tpu.py` (whose helpers this imports): one jitted program multiplies one activation row by L
distinct weights of the shape (about --total-mb MB together, passed as arguments), `reps` times in a dependent loop;
per product = (median at reps - median at 1) / ((reps - 1) L). GB/s = packed bytes (K N / 2 + 2 K N / g of
bfloat16 scales) / that. Each tiling's result is checked against dequantize-then-matmul (float32) on the device;
a tiling Mosaic refuses is recorded with its error. XLA's bfloat16 product of the same shape is timed beside it
(bytes 2 K N) as the reference a dense decode reaches.

    PYTHONPATH=$PYTHONPATH:. python3 scripts/probes/w4_tiling_tpu.py --budget-s 150  # on the TPU
    JAX_PLATFORMS=cpu PYTHONPATH=. python3 scripts/probes/w4_tiling_tpu.py --interpret --small
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from w4_hybrid_tpu import G, _per_product_ms  # noqa: E402

from model.kernels.fit import Projection  # noqa: E402
from model.kernels.fit_tpu import (MAX_GROUPS_PER_STEP, TILING_POLICIES, TpuTiling, budget, choose_tpu,  # noqa: E402
                                   tiling_problem_tpu, vmem_capacity)
from model.kernels.tpu_layout import pack_words  # noqa: E402
from model.kernels.w4a16_tpu import RESIDENT_MAX_BYTES, w4a16_tpu_matmul  # noqa: E402

# E2B's w4 projections (`bench kernels fit --device-capability tpu`): name -> (K, N), the one-step products of the
# default policy first (layers per shape: qkv_q 16, o 28, qkv 12, ple 35 each, qkv_4096 4, qkv_full 3, o_full 7)
SHAPES = {
    "qkv_q": (1536, 2048), "o": (2048, 1536), "qkv": (1536, 2560), "ple_gate": (1536, 256), "ple_proj": (256, 1536),
    "down": (6144, 1536), "qkv_4096": (1536, 4096), "qkv_full": (1536, 5120), "o_full": (4096, 1536),
    "gate_up": (1536, 12288), "down_wide": (12288, 1536), "gate_up_wide": (1536, 24576),
}  # fmt: skip
SMALL = {"small": (256, 512)}
BNS = (256, 512, 1024, 1536, 2048, 2560)
BKS = (256, 512, 1024, 1536, 2048)


def policy_tilings(k: int, n: int) -> dict[TpuTiling, list[str]]:
    """Each policy's tiling of K x N at the v5e's budget (`fit_tpu.choose_tpu`) -> the policies that choose it."""
    out: dict[TpuTiling, list[str]] = {}
    for policy in TILING_POLICIES:
        t = choose_tpu(Projection(field="", k=k, n=n, axis=0, group=G), budget(vmem_capacity("v5e")), policy=policy).tiling
        if t is not None:
            out.setdefault(t, []).append(policy)
    return out


def tilings(k: int, n: int, bns, bks, *, policies_only: bool = False) -> list[TpuTiling]:
    """The policies' tilings (`policy_tilings`), then (unless `policies_only`) every other (bn, bk) of the lists that
    tiles K x N under the kernel's rules, with bm 128."""
    out = list(policy_tilings(k, n))
    if not policies_only:
        out += [t for t in (TpuTiling(bm=128, bn=bn, bk=bk) for bn in bns for bk in bks)
                if t not in out and tiling_problem_tpu(k, n, G, t) is None]  # fmt: skip
    return out or [TpuTiling(bm=128, bn=min(n, 512), bk=k)]


RESIDENT = "resident"
"""The case name of the kernel's experimental resident form (`w4a16_tpu_matmul(..., resident=True)`)."""


def resident_fits(k: int, n: int) -> bool:
    """Whether the resident form takes K x N (`model.kernels.w4a16_tpu._resident`'s bounds)."""
    return k // G <= MAX_GROUPS_PER_STEP and k * n // 2 <= RESIDENT_MAX_BYTES


def summary(cases: list[dict]) -> list[str]:
    """One line per shape: the fastest tiling and each policy's, GB/s (cases without a time left out)."""
    lines = []
    for shape in dict.fromkeys(c["shape"] for c in cases):
        timed = [c for c in cases if c["shape"] == shape and c.get("gb_s") and c["tiling"] != "xla bf16"]
        if not timed:
            continue
        best = max(timed, key=lambda c: c["gb_s"])
        xla = next((c for c in cases if c["shape"] == shape and c["tiling"] == "xla bf16"), None)
        parts = [f"best {best['tiling']} ({best['steps']} steps) {best['gb_s']:.1f} GB/s"]
        for policy in TILING_POLICIES:
            mine = next((c for c in timed if policy in c.get("policies", [])), None)
            if mine:
                parts.append(f"{policy} {mine['tiling']} ({mine['steps']} steps) {mine['gb_s']:.1f}")
        res = next((c for c in timed if c["tiling"] == RESIDENT), None)
        if res:
            parts.append(f"{RESIDENT} {res['gb_s']:.1f}")
        if xla and xla.get("gb_s"):
            parts.append(f"xla bf16 {xla['gb_s']:.1f}")
        lines.append(f"{shape:12s} " + "; ".join(parts))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--interpret", action="store_true")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--shapes", default="", help="comma-separated names of SHAPES (default: all)")
    ap.add_argument("--bns", default=",".join(map(str, BNS)))
    ap.add_argument("--bks", default=",".join(map(str, BKS)))
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--no-ref", action="store_true", help="skip XLA's bfloat16 product of each shape")
    ap.add_argument("--resident", action="store_true",
                    help="also time the kernel's experimental resident form where it fits (operands whole in VMEM)")
    ap.add_argument("--policies-only", action="store_true", help="only the policies' tilings, not the (bn, bk) grid")
    ap.add_argument("--total-mb", type=float, default=120.0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    t0 = time.time()
    rng = np.random.default_rng(0)
    res = {"jax": jax.__version__, "device": str(jax.devices()[0].device_kind), "rows": a.rows, "cases": []}
    print(f"w4_tiling_tpu: jax {jax.__version__}, {res['device']}, rows {a.rows}", flush=True)
    shapes = SMALL if a.small else SHAPES
    if a.shapes:
        unknown = [s for s in a.shapes.split(",") if s not in shapes]
        if unknown:
            print(f"error: --shapes {a.shapes}: unknown {', '.join(unknown)}; expected names of {', '.join(shapes)}",
                  file=sys.stderr)
            raise SystemExit(2)
        shapes = {s: shapes[s] for s in a.shapes.split(",")}
    os.makedirs(a.out, exist_ok=True)
    out_path = os.path.join(a.out, f"w4_tiling_tpu_rows{a.rows}.json")
    bns, bks = [int(b) for b in a.bns.split(",")], [int(b) for b in a.bks.split(",")]
    for name, (k, n) in shapes.items():
        if time.time() - t0 > a.budget_s:
            print(f"budget reached before {name}", flush=True)
            break
        nbytes = k * n // 2 + 2 * k * n // G
        count = 1 if a.interpret else max(2, int(a.total_mb * 1e6 // nbytes))
        q = rng.integers(-8, 8, size=(k, n)).astype(np.int8)
        s = (rng.random((k // G, n)) * 0.02 + 0.001).astype(np.float32)
        w0, s0 = pack_words(jnp.asarray(q), G), jnp.asarray(s, jnp.bfloat16)
        ws = [w0 + jnp.int32(0) * i for i in range(count)]  # distinct device buffers, same values
        ss = [s0 + jnp.bfloat16(0) * i for i in range(count)]
        deq = q.astype(np.float32) * np.repeat(np.asarray(s0, np.float32), G, axis=0)
        x = jnp.asarray(rng.standard_normal((a.rows, k)), jnp.bfloat16)
        ref = np.asarray(x, np.float32) @ deq
        if not (a.interpret or a.no_ref):  # XLA's bfloat16 product of the shape: the dense reference
            dcount = max(2, int(a.total_mb * 1e6 // (2 * k * n)))
            d0 = jnp.asarray(deq, jnp.bfloat16)
            dws = [d0 + jnp.bfloat16(0) * i for i in range(dcount)]
            ms = _per_product_ms(lambda xi, w, _s: xi @ w, x, dws, [None] * dcount, a.reps, a.iters)
            res["cases"].append({"shape": name, "k": k, "n": n, "tiling": "xla bf16", "ms": ms,
                                 "gb_s": 2 * k * n / (ms * 1e-3) / 1e9 if ms > 0 else None})
            print(f"{name:12s} K={k:5d} N={n:5d} {'xla bf16':26s} {ms:.4f} ms {res['cases'][-1]['gb_s'] or 0:7.1f} GB/s",
                  flush=True)
            del dws
        chosen = policy_tilings(k, n)
        forms = [(t, False) for t in tilings(k, n, bns, bks, policies_only=a.policies_only)]
        if a.resident and resident_fits(k, n):  # first, so a probe cut short by its budget still has it
            forms.insert(0, (forms[0][0], True))
        for t, resident in forms:
            if time.time() - t0 > a.budget_s:
                print(f"budget reached at {name} {t.text}", flush=True)
                break
            steps = 1 if resident else (n // t.bn) * (k // t.bk)
            case = {"shape": name, "k": k, "n": n, "tiling": RESIDENT if resident else t.text, "steps": steps,
                    "products": count, "policies": [] if resident else chosen.get(t, [])}
            prod = functools.partial(w4a16_tpu_matmul, k=k, n=n, group=G, tiling=t, interpret=a.interpret,
                                     resident=resident)  # fmt: skip
            try:
                got = np.asarray(prod(x, ws[0], ss[0]), np.float32)
                case["rel_err"] = float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
                if not a.interpret:
                    ms = _per_product_ms(prod, x, ws, ss, a.reps, a.iters)
                    case.update(ms=ms, gb_s=nbytes / (ms * 1e-3) / 1e9 if ms > 0 else None)
            except Exception as e:  # noqa: BLE001 - a probe records and goes on
                case["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            res["cases"].append(case)
            print(f"{name:12s} K={k:5d} N={n:5d} {case['tiling']:26s} steps {steps:3d} {case.get('ms', 0):.4f} ms "
                  f"{case.get('gb_s') or 0:7.1f} GB/s rel_err {case.get('rel_err', float('nan')):.2e} "
                  f"{','.join(case['policies'])} {case.get('error', '')}", flush=True)
            res["seconds"] = round(time.time() - t0, 1)
            with open(out_path, "w") as fh:
                json.dump(res, fh, indent=1)
        del ws, ss
    res["summary"] = summary(res["cases"])
    res["seconds"] = round(time.time() - t0, 1)
    with open(out_path, "w") as fh:
        json.dump(res, fh, indent=1)
    print("\n".join(["summary (GB/s of packed bytes at one row):", *res["summary"]]), flush=True)


if __name__ == "__main__":
    main()
