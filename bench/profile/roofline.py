"""Bytes a Gemma 4 decode step reads in the published runs' layouts, and the bandwidth roofline share they imply.

docs/method.md (Rooflines): bytes per decode step = every weight the step touches, in its stored dtype
(quantized tables at their packed size), plus the KV cache read at that context; roofline share = bytes per
step x decode tok/s / the ceiling (bench/runs/ceiling.py: max(fastest measured read, datasheet)).

Pure arithmetic, no jax: the model's facts come from `model.config`, `model.accounting` and `model.quantspec`,
which import no jax (architecture.md, wall 5: one fact, one place). A layout (`WeightLayout`) is a `--quant`
option set plus the widths of what it leaves dense; every byte count is `model.accounting.weight_bytes_by_component`
in that layout (the engine's own accounting, so the published layout and our quantized runs are counted alike).
`run_layout` builds the layout of one of our runs from its manifest's quantization and dtypes.
Measured runs use the engine's own bytes (`model.engine.Engine.decode_bytes`: weights as loaded, plus the whole KV
buffer that every layer's decode attention reads). The KV term here (`kv_cache_bytes`) reads the same
`model.accounting.kv_read_elements` over the positions up to the context instead of the whole buffer, and only
annotates the published figures (whose context length was not published).

The published runs measured google/gemma-4-E2B-it's text decoder, `model.config.E2B` (the `e2b` preset; source:
../shared/gemma4-architecture.md §1 and §3; the model's config.json): vocab 262144, hidden 1536, 35 layers with
full attention every 5th, 8 query heads, 1 KV head, head dims 256 (sliding) / 512 (full), feed-forward 6144
(12288 on the 20 KV-shared layers 15-34), PLE width 256, sliding window 512. Its parameter count is 4,628,569,379.

Layouts (`WeightLayout`): `PLE4_INT8_LM_HEAD` is the published runs' "ple4 + int8_lm_head" (`--quant
ple4,int8_lm_head`): every weight at 16 bits except the per-layer-embedding (PLE) table, packed at 4 bits with one
16-bit scale per (row, 256 values) (for E2B: per (row, layer)), and a separate int8 copy of the tied embedding for
the output projection with one 16-bit scale per row. The scale layout is inferred, not published: it is the simple
layout that reproduces the published weight total, 6,155,450,950 bytes, to the byte (the test checks it), and it
matches the published parameter dtypes {float16: 541, uint8: 1, int8: 1}.

Units: bytes; bandwidth in GiB/s (2^30 bytes/s); shares in %.
"""

from __future__ import annotations

import dataclasses

from model.accounting import (
    WeightBytes,
    decode_reads,
    global_shapes,
    kv_read_elements,
    param_counts,
    weight_bytes_by_component,
)
from model.config import ModelConfig
from model.quantspec import QuantSpec, parse_quant

from bench.errors import InputError
from bench.runs.ceiling import share_pct

GIB = 2**30



@dataclasses.dataclass(frozen=True, kw_only=True)
class WeightLayout:
    """How weights are stored: the `--quant` option set and the widths of what it leaves dense.

    name: the layout's label ("ple4 + int8_lm_head", or a run's canonical `--quant` text).
    quant: the option set as `--quant` takes it (`model.quantspec.parse_quant`; "none": every weight dense).
    dense_bits: every weight the option set leaves dense (16: float16 / bfloat16; 32: float32).
    scale_bytes: bytes per quantization scale (2: 16-bit scales).
    kv_bits: the KV cache element width.
    Byte counts come from `model.accounting.weight_bytes_by_component` under `spec` (the engine's own accounting).
    """

    name: str
    quant: str = "none"
    dense_bits: int = 16
    scale_bytes: int = 2
    kv_bits: int = 16

    @property
    def spec(self) -> QuantSpec:
        """The parsed option set. Raises QuantError for one `parse_quant` refuses."""
        return parse_quant(self.quant)

    def components(self, cfg: ModelConfig) -> WeightBytes:
        """`model.accounting.weight_bytes_by_component` of `cfg` in this layout."""
        return weight_bytes_by_component(cfg, self.dense_bits // 8, scale_itemsize=self.scale_bytes, quant=self.spec)


PLE4_INT8_LM_HEAD = WeightLayout(name="ple4 + int8_lm_head", quant="ple4,int8_lm_head")

_ITEM_BITS = {"float32": 32, "bfloat16": 16, "float16": 16}


def run_layout(quantization: str | None, weight_dtype: str | None, scale_dtype: str | None = None) -> WeightLayout:
    """The layout of one of our runs from its manifest's engine configuration (`bench.runs.EngineConfig`):
    `quantization` (canonical `--quant` text; None: dense, as a manifest from before `--quant` reads),
    `weight_dtype` (the dense weights' dtype name), `scale_dtype` (None: 16-bit). Raises InputError for a dtype
    name it does not know, QuantError for an option set `parse_quant` refuses."""
    for what, name in (("weight dtype", weight_dtype), ("scale dtype", scale_dtype or "bfloat16")):
        if name not in _ITEM_BITS:
            raise InputError(f"{what} {name!r}: expected one of {', '.join(_ITEM_BITS)}")
    quant = parse_quant(quantization).canonical
    return WeightLayout(name=quant, quant=quant, dense_bits=_ITEM_BITS[weight_dtype],
                        scale_bytes=_ITEM_BITS[scale_dtype or "bfloat16"] // 8)  # fmt: skip


def total_params(cfg: ModelConfig) -> int:
    """All text parameters of `cfg` (`model.accounting.param_counts(cfg).total`): 4,628,569,379 for E2B."""
    return param_counts(cfg).total


def _bits_to_bytes(count: int, bits: int) -> int:
    return count * bits // 8


def stored_weight_bytes(cfg: ModelConfig, layout: WeightLayout) -> int:
    """Bytes of every stored weight tensor (what a loader reports as weight bytes): the weight-bytes gauge of
    `model.accounting` in `layout`. 6,155,450,950 for E2B in `PLE4_INT8_LM_HEAD`: body and input embedding at 16
    bits, the PLE table packed at 4 bits + one 16-bit scale per (row, 256 values), an int8 lm_head copy + one
    scale per row."""
    return layout.components(cfg).bytes


@dataclasses.dataclass(frozen=True)
class ByteTerm:
    """One line of the byte accounting: what is read, how many bytes, and why."""

    name: str
    bytes: int
    note: str


@dataclasses.dataclass(frozen=True)
class ByteAccount:
    """Bytes one decode step reads, term by term. `total` = weights + kv."""

    layout: str
    context_tokens: int
    terms: tuple[ByteTerm, ...]

    @property
    def weight_bytes(self) -> int:
        return sum(t.bytes for t in self.terms if t.name != "kv_cache")

    @property
    def kv_bytes(self) -> int:
        return sum(t.bytes for t in self.terms if t.name == "kv_cache")

    @property
    def total(self) -> int:
        return self.weight_bytes + self.kv_bytes

    def to_dict(self) -> dict:
        return {
            "layout": self.layout, "context_tokens": self.context_tokens, "total_bytes": self.total,
            "weight_bytes": self.weight_bytes, "kv_bytes": self.kv_bytes,
            "terms": [dataclasses.asdict(t) for t in self.terms],
        }  # fmt: skip


def kv_cache_bytes(cfg: ModelConfig, layout: WeightLayout, context_tokens: int) -> int:
    """K and V bytes the attention of all layers reads at `context_tokens` cached positions, at `layout.kv_bits`.

    `model.accounting.kv_read_elements(cfg, context_tokens)`: each layer attends over its KV source's cache
    (KV-shared layers re-read their producer's), 2 (K, V) x K heads x H x positions, with positions =
    min(context, window) on sliding layers.
    """
    return _bits_to_bytes(kv_read_elements(cfg, context_tokens), layout.kv_bits)


def decode_step_bytes(cfg: ModelConfig, layout: WeightLayout, context_tokens: int = 0) -> ByteAccount:
    """Bytes one decode step (one new token, batch 1) reads, as a `ByteAccount` of `model.accounting`'s components
    in `layout` (`weight_bytes_by_component(...).decode_bytes`, term by term; the weight terms add up to
    `model.accounting.decode_weight_bytes`).

    Terms: the body (the layers, the PLE projection and norm, the final norm: all read whole, the layer projections
    at their packed size where `layout` quantizes them); one row (D) of the input embedding; one row (L x P) of the
    PLE table, at its packed width plus its scales; the output projection: the whole int8 lm_head copy plus its
    scales, or the whole dense tied table when the layout has no lm_head copy; the KV cache at `context_tokens`
    (0 leaves it out).
    """
    parts = {c.name: c for c in layout.components(cfg).components}
    spec, reads, v, d, dense = layout.spec, decode_reads(cfg), cfg.vocab_size, cfg.hidden_size, layout.dense_bits
    body = sum(parts[n].decode_bytes for n in ("layers", "PLE projection+norm", "other"))
    layers = (f": the layer projections at {spec.layer_bits} bits + scales, the rest" if spec.layer_bits else "")
    ple_table = global_shapes(cfg)["ple_embed_VX"]
    ple_scales = parts["PLE table"].scales // ple_table[0] if ple_table and spec.ple_bits else 0
    ple_width = f"{spec.ple_bits} bits + {ple_scales} scales" if spec.ple_bits else f"{dense} bits"
    terms = [
        ByteTerm("body", body, f"all {reads.body:,} non-embedding parameters{layers} at {dense} bits"),
        ByteTerm("input_embedding_row", parts["input embedding"].decode_bytes,
                 f"one row of the {v:,} x {d} input embedding at {dense} bits"),
        ByteTerm("ple_row", parts["PLE table"].decode_bytes,
                 f"one row ({reads.ple_row} values) of the PLE table at {ple_width}"),
        ByteTerm("lm_head", parts["LM head"].decode_bytes,
                 f"the whole {v:,} x {d} lm_head copy at 8 bits + one scale per row" if spec.int8_lm_head
                 else f"the whole tied {v:,} x {d} embedding at {dense} bits (output projection)"),
    ]  # fmt: skip
    if context_tokens:
        terms.append(ByteTerm(
            "kv_cache", kv_cache_bytes(cfg, layout, context_tokens),
            f"K and V of {context_tokens} cached positions, read by every layer's attention",
        ))  # fmt: skip
    return ByteAccount(layout.name, context_tokens, tuple(terms))


def roofline_share(bytes_per_step: float, tok_s: float, bandwidth_bytes_s: float) -> float:
    """Bandwidth roofline share, a fraction: bytes_per_step x tok_s / bandwidth_bytes_s (docs/method.md,
    "Rooflines"; the arithmetic is `bench.runs.ceiling.share_pct`'s, the one definition).

    bytes_per_step: bytes one decode step reads (weights at their stored size plus the KV cache read at that
        context), from the engine's own accounting.
    tok_s: decode steps per second (the gauge at batch 1).
    bandwidth_bytes_s: the denominator in bytes/s: the run's roofline ceiling (`bench.runs.ceiling.Ceiling`,
        max(fastest measured read, datasheet)); the device copy for profiles recorded before it.
    1.0 means decode reads its bytes as fast as the ceiling. Raises InputError for negative inputs or a bandwidth
    <= 0.
    """
    return share_pct(bytes_per_step, tok_s, bandwidth_bytes_s) / 100.0


def roofline_share_pct(bytes_per_step: int | float, tok_s: float, bandwidth_gib_s: float) -> float:
    """Bandwidth roofline share in %: `roofline_share` with the bandwidth given in GiB/s (2^30 B/s).
    Raises InputError for a bandwidth <= 0 or negative inputs."""
    return share_pct(bytes_per_step, tok_s, bandwidth_gib_s * GIB)
