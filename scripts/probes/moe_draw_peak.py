"""Probe (CPU, this repository's code): does `--checkpoint random:26b-a4b --quant w4` draw its weights leaf by leaf
in their final layout, so that what the draw holds stays near the weights as placed?

Draws `model.random_weights.random_params` for 26B-A4B's shapes cut to LAYERS layers and a vocabulary of VOCAB
(every layer leaf, the expert block included, at 26B-A4B's real widths: D 2816, 128 experts of width 704), bfloat16,
under --quant (default w4), on jax's default device, and records:

- live: the bytes of every live jax array (`jax.live_arrays()`), sampled before and after each drawn block of a
  table or expert leaf (`_fill_rows`) and after each layer is quantized (`quantize_fields`); its peak against the
  weights as placed (`model.accounting.weight_bytes`) and against the stated margin (`working_bytes`);
- rss: the process's resident set (sampled every 20 ms by a thread), its peak beyond the RSS before the draw;
- the compiled programs' own temporaries (`memory_analysis().temp_size_in_bytes`) of the expert leaf's block draw;
- as a contrast, the bytes one layer's experts would take in bfloat16 (what a draw of the whole model dense first
  would hold).

    JAX_PLATFORMS=cpu python scripts/probes/moe_draw_peak.py [--layers 2] [--vocab 8192] [--quant w4] [--out F.json]

Prints one line per figure; writes them as JSON with --out (or into $OUT/moe_draw_peak.json when OUT is set).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import threading
import time

import jax
import jax.numpy as jnp


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _live() -> int:
    return sum(a.nbytes for a in jax.live_arrays() if not a.is_deleted())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--quant", default="w4")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import model.random_weights as rw
    from model.accounting import expert_params, weight_bytes
    from model.config import G26B_A4B
    from model.quantspec import parse_quant

    cfg = dataclasses.replace(G26B_A4B, num_layers=args.layers, layer_types=G26B_A4B.layer_types[6 - args.layers:6],
                              vocab_size=args.vocab)  # fmt: skip
    quant = parse_quant(args.quant)
    placed = weight_bytes(cfg, 2, quant=quant)
    work = rw.working_bytes(cfg, 2)
    samples: list[tuple[str, int]] = []
    fill, quantize_fields = rw._fill_rows, rw.quantize_fields

    def sampled(fn, before: str, after: str):
        """`fn` with the live device bytes sampled before it and after its result is ready."""

        def call(*a, **k):
            samples.append((before, _live()))
            out = fn(*a, **k)
            jax.block_until_ready(out)
            samples.append((after, _live()))
            return out

        return call

    rw._fill_rows = sampled(fill, "before block", "after block")
    rw.quantize_fields = sampled(quantize_fields, "layer dense", "layer quantized")
    peak_rss, stop = [0], threading.Event()

    def watch():
        while not stop.is_set():
            peak_rss[0] = max(peak_rss[0], _rss())
            time.sleep(0.02)

    base_live, base_rss = _live(), _rss()
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    t0 = time.perf_counter()
    params, drawn = rw.random_params(cfg, 0, dtype=jnp.bfloat16, quant=quant)
    jax.block_until_ready(params)
    seconds = time.perf_counter() - t0
    stop.set()
    thread.join()
    final_live = _live() - base_live
    peak_live = max(v for _, v in samples) - base_live
    from model.quant import tree_bytes

    # the block program of an expert leaf, compiled alone: its temporaries
    shape = (cfg.num_experts, cfg.hidden_size, 2 * cfg.moe_intermediate_size)
    from model.quantspec import leaf_layout, scale_shape, value_dtype, value_shape

    lay = leaf_layout("experts_gate_up_EDX", shape, quant, jax.default_backend())
    layouts = () if lay is None else (lay,)
    rows = rw._block_rows(shape)
    bufs = (None if lay else jax.ShapeDtypeStruct(shape, jnp.bfloat16),
            *((jax.ShapeDtypeStruct(value_shape(shape, l.bits, l.words), value_dtype(l.bits, l.words)),
               jax.ShapeDtypeStruct(scale_shape(shape, l.block), jnp.bfloat16)) for l in layouts))  # fmt: skip
    key = jax.random.key(0)
    lowered = fill.lower(bufs, key, jnp.float32(0), jnp.float32(1), jnp.int32(0), rows=rows, row=shape[1:],
                         kind="normal", dtype=jnp.bfloat16, layouts=layouts, scale_dtype=jnp.bfloat16)  # fmt: skip
    compiled = lowered.compile()
    mem = compiled.memory_analysis()
    temp = int(getattr(mem, "temp_size_in_bytes", 0) or 0) if mem is not None else None
    out = {
        "config": {"layers": cfg.num_layers, "vocab": cfg.vocab_size, "hidden": cfg.hidden_size,
                   "experts": cfg.num_experts, "expert_width": cfg.moe_intermediate_size, "quant": quant.canonical,
                   "platform": jax.default_backend()},
        "weights_as_placed": placed, "tree_bytes": tree_bytes(params), "working_bytes_margin": work,
        "live_after_draw": final_live, "live_peak_sampled": peak_live,
        "live_peak_over_placed": peak_live - placed, "rss_before": base_rss, "rss_peak": peak_rss[0],
        "rss_peak_over_before": peak_rss[0] - base_rss, "expert_block_rows": rows, "expert_block_program_temp": temp,
        "experts_dense_bf16_one_layer": expert_params(cfg) // cfg.num_layers * 2,
        "leaves_drawn": drawn, "draw_s": round(seconds, 1), "samples": len(samples),
    }
    for k, v in out.items():
        print(f"{k}: {v:,}" if isinstance(v, int) else f"{k}: {v}")
    path = args.out or (os.path.join(os.environ["OUT"], "moe_draw_peak.json") if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
