"""Probe: forms of the 26B-A4B expert products, timed on this machine's default jax device (issue 45, part 2).

Forms, each of one layer's expert block (gate_up then down, the routing weights applied, summed per token):
  tiles      the engine's form (model.moe.expert_products): one expert's weights sliced per tile inside a loop;
             decode (N*K <= E) one tile per (token, expert), prefill the assignments sorted into tiles
  ragged     jax.lax.ragged_dot over the sorted assignments and the whole [E, D, X] weight arrays
  gather     the chosen experts' weights gathered per assignment ([N*K, D, X]) and one batched product
  dense      every expert on every token, then the chosen ones picked (the upper bound on reads and FLOPs)

Then the engine's tiles on w8 and w4 experts (group 128), their values stored as bytes or in uint32 words (the
storage the engine picks on a TPU), at 1 and 8 tokens.

Each form runs `STEPS` times inside one jitted loop on fresh routes (ids drawn per step), so the time per call
includes no dispatch; `bytes_chosen` is the expert weight bytes the chosen experts hold (the least a form must
read), and `gbps_chosen` those bytes over the time. Writes results.json into $OUT (or the folder given as the first
argument) and prints one line per case.

Run on a TPU (python 3.11, jax 0.10.2), from the repository root:
    OUT=/tmp/moe-forms python scripts/probes/moe_forms.py          # 26B-A4B shapes, bfloat16, a few minutes
    OUT=/tmp/moe-forms python scripts/probes/moe_forms.py --small  # small shapes (what the CPU measurement used)
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from model.moe import expert_products  # noqa: E402

STEPS = 8
SIZES = (1, 8, 32, 128, 512)


class _Layer:
    """The two expert weights of one layer, as `model.params.LayerParams` names them."""

    def __init__(self, gu, dn):
        self.experts_gate_up_EDX, self.experts_down_EDF = gu, dn


def _gelu_glu(z):
    f = z.shape[-1] // 2
    return jax.nn.gelu(z[..., :f], approximate=True) * z[..., f:]


def tiles(gu, dn, x, idx, w):
    return expert_products(_Layer(gu, dn), x, idx, w, gu.shape[0])


def ragged(gu, dn, x, idx, w):
    n_tok, k = idx.shape
    e_n = idx.reshape(-1)
    order = jnp.argsort(e_n, stable=True)
    sizes = jnp.bincount(e_n, length=gu.shape[0]).astype(jnp.int32)
    xs = x[order // k]
    h = _gelu_glu(jax.lax.ragged_dot(xs, gu, sizes))
    y = jax.lax.ragged_dot(h, jnp.swapaxes(dn, 1, 2), sizes)
    y = jnp.zeros_like(y).at[order].set(y)
    return jnp.einsum("NKD,NK->ND", y.reshape(n_tok, k, -1).astype(jnp.float32), w).astype(x.dtype)


def gather(gu, dn, x, idx, w):
    n_tok, k = idx.shape
    e_n = idx.reshape(-1)
    xr = jnp.repeat(x, k, axis=0)
    h = _gelu_glu(jnp.einsum("nD,nDX->nX", xr, jnp.take(gu, e_n, axis=0)))
    y = jnp.einsum("nF,nDF->nD", h, jnp.take(dn, e_n, axis=0))
    return jnp.einsum("NKD,NK->ND", y.reshape(n_tok, k, -1).astype(jnp.float32), w).astype(x.dtype)


def dense(gu, dn, x, idx, w):
    h = _gelu_glu(jnp.einsum("ND,EDX->NEX", x, gu))
    y = jnp.einsum("NEF,EDF->NED", h, dn)
    y = jnp.take_along_axis(y, idx[:, :, None], axis=1)
    return jnp.einsum("NKD,NK->ND", y.astype(jnp.float32), w).astype(x.dtype)


FORMS = {"tiles": tiles, "ragged": ragged, "gather": gather, "dense": dense}


def timed(form, gu, dn, x, k: int, e: int) -> tuple[float, jax.Array]:
    """Seconds per call of `form` (median of 3 runs of a STEPS-call jitted loop on fresh routes), and its output."""

    @jax.jit
    def loop(gu, dn, x, key):
        def body(i, acc):
            kk = jax.random.fold_in(key, i)
            idx = jnp.argsort(jax.random.uniform(kk, (x.shape[0], e)), axis=-1)[:, :k].astype(jnp.int32)
            w = jnp.full(idx.shape, 1.0 / k, jnp.float32)
            return acc + form(gu, dn, x + acc, idx, w)

        return jax.lax.fori_loop(0, STEPS, body, jnp.zeros_like(x))

    key = jax.random.key(0)
    return median_per_step(lambda: loop(gu, dn, x, key))


def median_per_step(run) -> tuple[float, object]:
    """`run()` (a jitted loop of STEPS steps) once to compile and warm, then 3 times timed: (median seconds per step,
    the first call's result). Shared with moe_w4_tpu.py."""
    out = jax.block_until_ready(run())
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        jax.block_until_ready(run())
        runs.append((time.perf_counter() - t0) / STEPS)
    return float(np.median(runs)), out


def small_and_out_dir() -> tuple[bool, Path]:
    """The command line shared with moe_w4_tpu.py: (--small given, the output folder: the first argument, else
    $OUT, else ".", created)."""
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    out_dir = Path(args[0] if args else os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    return "--small" in sys.argv, out_dir


def main() -> None:
    small, out_dir = small_and_out_dir()
    e, d, i, k = (32, 512, 128, 4) if small else (128, 2816, 704, 8)
    dtype = jnp.float32 if small else jnp.bfloat16
    rng = np.random.default_rng(0)
    gu = jnp.asarray(rng.standard_normal((e, d, 2 * i), np.float32) * d**-0.5, dtype)
    dn = jnp.asarray(rng.standard_normal((e, d, i), np.float32) * i**-0.5, dtype)
    per_expert = (d * 2 * i + d * i) * np.dtype(dtype).itemsize
    results = {"device": str(jax.devices()[0]), "jax": jax.__version__, "E": e, "D": d, "I": i, "K": k,
               "dtype": np.dtype(dtype).name, "steps": STEPS, "cases": []}  # fmt: skip
    for n_tok in SIZES:
        x = jnp.asarray(rng.standard_normal((n_tok, d), np.float32), dtype)
        chosen = min(n_tok * k, e) * per_expert  # distinct experts at most: the bytes a form must read
        ref = None
        for name, form in FORMS.items():
            if name == "dense" and n_tok * e * d * 3 * i > 2e11:
                continue
            if name == "gather" and n_tok * k * per_expert > 4e9:
                continue
            try:
                sec, y = timed(form, gu, dn, x, k, e)
            except Exception as exc:  # a form this jax or device cannot run: say so, go on
                results["cases"].append({"tokens": n_tok, "form": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
                print(f"tokens {n_tok:4d} {name:7s} error {type(exc).__name__}", flush=True)
                continue
            ref = y if ref is None else ref
            err = float(jnp.max(jnp.abs(y.astype(jnp.float32) - ref.astype(jnp.float32))))
            case = {"tokens": n_tok, "form": name, "ms": round(sec * 1e3, 4), "bytes_chosen_max": chosen,
                    "gbps_chosen": round(chosen / sec / 1e9, 1), "max_abs_diff_vs_first": err}  # fmt: skip
            results["cases"].append(case)
            print(f"tokens {n_tok:4d} {name:7s} {sec * 1e3:9.3f} ms  {chosen / sec / 1e9:7.1f} GB/s of chosen experts  "
                  f"diff {err:.2e}", flush=True)  # fmt: skip
    # Quantized experts through the engine's tiles: the value bytes as int8/uint8 arrays or in uint32 words (the
    # storage model.quantspec.leaf_layout picks on a TPU), at the decode sizes.
    from model.quant import quantize
    from model.quantspec import channels_block

    for bits, group in ((8, None), (4, 128)):
        for words in (False, True):
            q_gu = quantize(gu, bits, channels_block(gu.shape, (1,), group), words=words)
            q_dn = quantize(dn, bits, channels_block(dn.shape, (2,), group), words=words)
            stored = sum(int(a.nbytes) for a in (q_gu.values, q_gu.scales, q_dn.values, q_dn.scales)) // e
            for n_tok in (1, 8):
                x = jnp.asarray(rng.standard_normal((n_tok, d), np.float32), dtype)
                name = f"tiles-w{bits}-{'words' if words else 'bytes'}"
                try:
                    sec, _ = timed(tiles, q_gu, q_dn, x, k, e)
                except Exception as exc:
                    results["cases"].append({"tokens": n_tok, "form": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
                    print(f"tokens {n_tok:4d} {name} error {type(exc).__name__}", flush=True)
                    continue
                chosen = min(n_tok * k, e) * stored
                results["cases"].append({"tokens": n_tok, "form": name, "ms": round(sec * 1e3, 4),
                                         "bytes_chosen_max": chosen, "gbps_chosen": round(chosen / sec / 1e9, 1)})
                print(f"tokens {n_tok:4d} {name:16s} {sec * 1e3:9.3f} ms  {chosen / sec / 1e9:7.1f} GB/s of chosen "
                      "experts", flush=True)  # fmt: skip
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
