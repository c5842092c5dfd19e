"""Probe (issue 43): do the engine's reads of its quantized tables copy a whole table in each call, and how fast are
they, with the tables stored as bytes (int8 / packed uint8, the layout before) and as uint32 words (the layout
`model.quantspec.WORD_TABLES` gives them now)?

Run from the repository root on the machine to measure (Python 3.11+, jax, numpy; the repository's `model`
package is imported from this checkout, so the programs measured are the engine's own `take_rows` and `matmul`):

    OUT=/tmp/out python scripts/probes/gather_layout.py          # E2B shapes (TPU: about 1-2 minutes, < 6 GB)
    JAX_PLATFORMS=cpu python scripts/probes/gather_layout.py --small   # small shapes, to check it runs

Variants, each jitted with the table as an ARGUMENT (as the engine's decode program receives its parameters):
- ple4_bytes / ple4_words: `take_rows` of one row (a dynamic id) of the PLE table [262144, 8960] at 4 bits, scales
  bfloat16 [262144, 35]: uint8 [262144, 4480] against uint32 [262144, 1120] (the same bytes, little-endian).
- ple8_bytes / ple8_words: the same at 8 bits: int8 [262144, 8960] against uint32 [262144, 2240].
- head_bytes / head_words: `matmul` of a bfloat16 activation [1, 1, 1536] with the int8 head [262144, 1536]
  (scales [262144, 1]): int8 (the dot form) against uint32 [262144, 384] (on a TPU the plane form,
  `model.quant._planes_form`; elsewhere the bytes the words hold). The engine stores the head in words on a TPU
  only (`model.quantspec.WORD_TABLES`).
- head_dense: the bfloat16 table [262144, 1536] times the activation (the dense model's head), for reference.
- pair_bytes / pair_words: one program holding both reads of `--quant ple4,int8_lm_head` (the PLE row and the head
  product), as a decode step does.
- floor: an almost empty jitted call (the per-call cost every figure includes).
Each word variant is checked against its byte variant on the device: identical PLE rows; head logits within
float32 summation order.

Per variant it prints and records: the copy / copy-start / transpose instructions of the compiled program
(`jax.jit(f).lower(...).compile().as_text()`) with their shapes, any instruction whose result is at least 64 MiB
(a relayout in disguise), the median wall time of `--calls` calls after 3 warm-up calls (block_until_ready), the
bytes the call must read (values + scales actually read), and GB/s = bytes / (median - floor) for the products.
Results: $OUT/gather_layout.json (or --out DIR), and each variant's optimized HLO as $OUT/hlo/<variant>.txt.
Each variant's arrays are deleted before the next is made. Exit 0, or 2 with one line for a bad argument.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from model.quant import QuantArray, matmul, take_rows  # noqa: E402

E2B_ROWS, PLE_X, HIDDEN, PLE_GROUP = 262_144, 35 * 256, 1536, 256
"""E2B's shapes (model.config.E2B): vocabulary rows, PLE row width (35 layers x 256), hidden size, PLE scale group."""

BIG_BYTES = 64 * 2**20
"""An instruction whose result is at least this many bytes is listed (a whole-table copy inside a fusion)."""

ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s4": 0.5, "u4": 0.5, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4,
            "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}  # fmt: skip
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?(\S+)\s*=\s*(.+?)\s+([a-z][a-z0-9\-]*)\((.*)$")
_ARRAY = re.compile(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]")


def _type_bytes(text: str) -> int:
    """Bytes of an HLO result type (an array or a tuple of arrays), from its dtypes and dimensions."""
    total = 0.0
    for dtype, dims in _ARRAY.findall(text):
        if dtype in ITEMSIZE:
            total += ITEMSIZE[dtype] * math.prod(int(d) for d in dims.split(",") if d)
    return int(total)


def hlo_findings(hlo: str) -> dict:
    """The layout-changing instructions (copy, copy-start, transpose) and the big results of an optimized HLO text."""
    layout_ops, big = [], []
    for line in hlo.splitlines():
        m = _INSTR.match(line)
        if m is None:
            continue
        name, rtype, op, rest = m.groups()
        size = _type_bytes(rtype)
        operands = _ARRAY.findall(rest.split("),")[0])
        entry = {"name": name, "op": op, "result": rtype[:120], "bytes": size,
                 "operands": [f"{d}[{s}]" for d, s in operands][:3]}  # fmt: skip
        if op in ("copy", "copy-start", "transpose"):
            layout_ops.append(entry)
        if size >= BIG_BYTES and op not in ("parameter", "get-tuple-element", "bitcast", "tuple"):
            big.append(entry)
    return {"layout_ops": layout_ops, "layout_op_count": len(layout_ops),
            "layout_op_bytes": sum(e["bytes"] for e in layout_ops), "big_results": big}  # fmt: skip


def median_ms(f, args, calls: int) -> tuple[float, list[float]]:
    """Median wall milliseconds of `calls` calls of f(*args) after 3 warm-up calls, each waited for."""
    for _ in range(3):
        jax.block_until_ready(f(*args))
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), times


def words_and_bytes(rng: np.random.Generator, rows: int, row_bytes: int, byte_dtype) -> tuple[np.ndarray, np.ndarray]:
    """Random value bytes [rows, row_bytes] (row_bytes a multiple of 4) as (uint32 words, the same memory viewed as
    `byte_dtype` bytes): the words hold the bytes little-endian, as `model.quant` stores them."""
    words = rng.integers(0, 2**32, size=(rows, row_bytes // 4), dtype=np.uint32)
    as_bytes = words.astype("<u4", copy=False).view(np.uint8).reshape(rows, row_bytes).view(byte_dtype)
    return words, as_bytes


def scales(rng: np.random.Generator, shape) -> np.ndarray:
    """Positive bfloat16-representable scales of about 1e-2."""
    return (rng.uniform(0.5, 1.5, size=shape).astype(np.float32) * 1e-2).astype(jnp.bfloat16)


def table(values, s, shape, bits: int, block, words: bool) -> QuantArray:
    """A `QuantArray` placed on the default device."""
    return QuantArray(values=jax.device_put(values), scales=jax.device_put(s), shape=shape, bits=bits, block=block,
                      words=words)  # fmt: skip


def run_variant(name: str, fn, args, *, calls: int, out: Path, read_bytes: int, floor_ms: float | None,
                product: bool) -> tuple[dict, object]:  # fmt: skip
    """Compile, inspect and time one variant; returns (its record, one result for the cross-check)."""
    t0 = time.perf_counter()
    jf = jax.jit(fn)
    compiled = jf.lower(*args).compile()
    hlo = compiled.as_text()
    compile_s = time.perf_counter() - t0
    (out / "hlo").mkdir(parents=True, exist_ok=True)
    (out / "hlo" / f"{name}.txt").write_text(hlo)
    found = hlo_findings(hlo)
    ms, times = median_ms(jf, args, calls)
    result = jax.device_get(jf(*args))
    rec = {"median_ms": ms, "min_ms": min(times), "max_ms": max(times), "calls": calls, "compile_s": compile_s,
           "read_bytes": read_bytes, **found}  # fmt: skip
    if product and floor_ms is not None:
        rec["gb_s_raw"] = read_bytes / (ms * 1e-3) / 1e9
        rec["gb_s_above_floor"] = read_bytes / max(ms - floor_ms, 1e-6) * 1e3 / 1e9
    ops = ", ".join(f"{e['op']} {e['result']}" for e in found["layout_ops"]) or "none"
    rate = f", {rec['gb_s_above_floor']:.0f} GB/s above the floor" if "gb_s_above_floor" in rec else ""
    print(f"{name:12s} {ms:8.3f} ms (min {min(times):.3f}){rate}; layout ops: {found['layout_op_count']} "
          f"({ops}); big results: {len(found['big_results'])}", flush=True)  # fmt: skip
    return rec, result


def release(*arrays) -> None:
    """Free device buffers now (before the next variant's arrays are placed)."""
    for leaf in jax.tree_util.tree_leaves(arrays, is_leaf=lambda x: isinstance(x, QuantArray)):
        for a in ((leaf.values, leaf.scales) if isinstance(leaf, QuantArray) else (leaf,)):
            if isinstance(a, jax.Array):
                a.delete()
    gc.collect()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="4096 rows instead of E2B's 262144 (a check that it runs)")
    ap.add_argument("--calls", type=int, default=50, help="timed calls per variant (default 50)")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="results folder (default $OUT)")
    args = ap.parse_args(argv)
    if args.out is None or args.calls < 1:
        print(f"gather_layout: got --out {args.out!r}, --calls {args.calls}; expected an output folder (--out DIR "
              "or $OUT) and --calls >= 1", file=sys.stderr)  # fmt: skip
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = 4096 if args.small else E2B_ROWS
    t_start = time.perf_counter()
    rng = np.random.default_rng(0)
    dev = jax.devices()[0]
    res: dict = {"jax": jax.__version__, "device": getattr(dev, "device_kind", str(dev)), "platform": dev.platform,
                 "rows": rows, "variants": {}, "checks": {}}  # fmt: skip
    print(f"gather_layout: jax {jax.__version__} on {res['device']} ({dev.platform}), {rows} rows", flush=True)
    floor, _ = median_ms(jax.jit(lambda i: i + 1), (jnp.ones((1,), jnp.int32),), args.calls)
    res["floor_ms"] = floor
    print(f"floor        {floor:8.3f} ms (an almost empty jitted call)", flush=True)
    ids = jnp.asarray([[rows // 3 + 7]], jnp.int32)
    x = jnp.asarray(rng.standard_normal((1, 1, HIDDEN)).astype(np.float32)).astype(jnp.bfloat16)
    var = res["variants"]

    def ple_row(t, i):
        return take_rows(t, i, jnp.bfloat16)

    def head(t, a):
        return matmul(a, t, "BTD,VD->BTV").astype(jnp.float32)

    def pair(p, h, i, a):
        return take_rows(p, i, jnp.bfloat16), matmul(a, h, "BTD,VD->BTV").astype(jnp.float32)

    # ---- the PLE table at 4 and 8 bits: one row gathered ----
    for bits in (4, 8):
        row_bytes = PLE_X // 2 if bits == 4 else PLE_X
        words, as_bytes = words_and_bytes(rng, rows, row_bytes, np.uint8 if bits == 4 else np.int8)
        s = scales(rng, (rows, PLE_X // PLE_GROUP))
        read = row_bytes + (PLE_X // PLE_GROUP) * 2
        got = {}
        for form, values in (("bytes", as_bytes), ("words", words)):
            t = table(values, s, (rows, PLE_X), bits, (1, PLE_GROUP), form == "words")
            var[f"ple{bits}_{form}"], got[form] = run_variant(f"ple{bits}_{form}", ple_row, (t, ids), calls=args.calls,
                                                              out=out, read_bytes=read, floor_ms=floor, product=False)
            release(t)
        res["checks"][f"ple{bits}_words_equal_bytes"] = bool(np.array_equal(np.asarray(got["words"], np.float32),
                                                                            np.asarray(got["bytes"], np.float32)))
        del words, as_bytes
        gc.collect()

    # ---- the int8 head: the product over every row ----
    words, as_bytes = words_and_bytes(rng, rows, HIDDEN, np.int8)
    s = scales(rng, (rows, 1))
    read = rows * HIDDEN + rows * 2
    got = {}
    for form, values in (("bytes", as_bytes), ("words", words)):
        t = table(values, s, (rows, HIDDEN), 8, (1, HIDDEN), form == "words")
        var[f"head_{form}"], got[form] = run_variant(f"head_{form}", head, (t, x), calls=args.calls, out=out,
                                                     read_bytes=read, floor_ms=floor, product=True)  # fmt: skip
        release(t)
    ref = np.asarray(got["bytes"], np.float64)
    res["checks"]["head_words_max_abs_diff"] = float(np.max(np.abs(np.asarray(got["words"], np.float64) - ref)))
    res["checks"]["head_max_abs_logit"] = float(np.max(np.abs(ref)))
    dense = jax.device_put((as_bytes.astype(np.float32) * 1e-2).astype(jnp.bfloat16))
    var["head_dense"], _ = run_variant("head_dense", lambda w, a: jnp.einsum("BTD,VD->BTV", a, w).astype(jnp.float32),
                                       (dense, x), calls=args.calls, out=out, read_bytes=rows * HIDDEN * 2,
                                       floor_ms=floor, product=True)  # fmt: skip
    release(dense)

    # ---- both reads of ple4,int8_lm_head in one program, as a decode step ----
    ple_words, ple_bytes = words_and_bytes(rng, rows, PLE_X // 2, np.uint8)
    ple_s = scales(rng, (rows, PLE_X // PLE_GROUP))
    read = read + PLE_X // 2 + (PLE_X // PLE_GROUP) * 2
    for form, pv, hv in (("bytes", ple_bytes, as_bytes), ("words", ple_words, words)):
        p = table(pv, ple_s, (rows, PLE_X), 4, (1, PLE_GROUP), form == "words")
        h = table(hv, s, (rows, HIDDEN), 8, (1, HIDDEN), form == "words")
        var[f"pair_{form}"], _ = run_variant(f"pair_{form}", pair, (p, h, ids, x), calls=args.calls, out=out,
                                             read_bytes=read, floor_ms=floor, product=True)  # fmt: skip
        release(p, h)
    res["total_s"] = time.perf_counter() - t_start
    (out / "gather_layout.json").write_text(json.dumps(res, indent=1))
    print(f"checks: {json.dumps(res['checks'])}")
    print(f"gather_layout: {res['total_s']:.0f} s; wrote {out / 'gather_layout.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
