"""Bytes a Gemma 4 decode step reads in the published runs' layouts, and the bandwidth roofline share they imply.

measurement.md (Rooflines): bytes per decode step = every weight the step touches, in its stored dtype
(quantized tables at their packed size), plus the KV cache read at that context; roofline share = bytes per
step x decode tok/s / bandwidth.

Pure arithmetic, no jax: the model's facts come from `model.config` and `model.accounting`, which import no jax
(architecture.md, wall 5: one fact, one place). This module adds only what the published runs stored differently:
the quantized layouts (`WeightLayout`), applied group by group to `model.accounting`'s counts (`param_counts`:
body, tied embedding, PLE table; `decode_reads`: body, one embedding row, one PLE row, the lm_head).
Measured runs use the engine's own bytes (`model.engine.Engine.decode_bytes`: weights as loaded, plus the whole KV
buffer that every layer's decode attention reads). The KV term here (`kv_cache_bytes`) reads the same
`model.accounting.kv_read_elements` over the positions up to the context instead of the whole buffer, and only
annotates the published figures (whose context length was not published).

The published runs measured google/gemma-4-E2B-it's text decoder, `model.config.E2B` (the `e2b` preset; source:
../shared/gemma4-architecture.md §1 and §3; the model's config.json): vocab 262144, hidden 1536, 35 layers with
full attention every 5th, 8 query heads, 1 KV head, head dims 256 (sliding) / 512 (full), feed-forward 6144
(12288 on the 20 KV-shared layers 15-34), PLE width 256, sliding window 512. Its parameter count is 4,628,569,379.

Layouts (`WeightLayout`): `PLE4_INT8_LM_HEAD` is the published runs' "ple4 + int8_lm_head": every weight at
16 bits except the per-layer-embedding (PLE) table, packed at 4 bits with one 16-bit scale per (row, layer), and
a separate int8 copy of the tied embedding for the output projection with one 16-bit scale per row. The scale
layout is inferred, not published: it is the simple layout that reproduces the published weight total,
6,155,450,950 bytes, to the byte (the test checks it), and it matches the published parameter dtypes
{float16: 541, uint8: 1, int8: 1}.

Units: bytes; bandwidth in GiB/s (2^30 bytes/s); shares in %.
"""

from __future__ import annotations

import dataclasses

from model.accounting import decode_reads, kv_read_elements, param_counts
from model.config import ModelConfig

from bench.errors import InputError

GIB = 2**30



@dataclasses.dataclass(frozen=True, kw_only=True)
class WeightLayout:
    """How weights are stored. Bits per element; scales in bytes.

    dense_bits: every weight not listed below (16: float16 / bfloat16).
    ple_bits: the PLE table's packed width (None = dense), with `ple_scale_bytes` per (vocab row, layer).
    lm_head_bits: a separate quantized copy of the tied embedding used by the output projection (None = the
        projection reads the dense tied table), with `lm_head_scale_bytes` per vocab row.
    kv_bits: the KV cache element width.
    """

    name: str
    dense_bits: int = 16
    ple_bits: int | None = None
    ple_scale_bytes: int = 2
    lm_head_bits: int | None = None
    lm_head_scale_bytes: int = 2
    kv_bits: int = 16


PLE4_INT8_LM_HEAD = WeightLayout(name="ple4 + int8_lm_head", ple_bits=4, lm_head_bits=8)


def total_params(cfg: ModelConfig) -> int:
    """All text parameters of `cfg` (`model.accounting.param_counts(cfg).total`): 4,628,569,379 for E2B."""
    return param_counts(cfg).total


def _bits_to_bytes(count: int, bits: int) -> int:
    return count * bits // 8


def stored_weight_bytes(cfg: ModelConfig, layout: WeightLayout) -> int:
    """Bytes of every stored weight tensor (what a loader reports as weight bytes). 6,155,450,950 for E2B in
    `PLE4_INT8_LM_HEAD`: body and input embedding at 16 bits, PLE packed + scales, int8 lm_head copy + scales.
    Counts: `model.accounting.param_counts`."""
    counts = param_counts(cfg)
    total = _bits_to_bytes(counts.body + counts.embedding, layout.dense_bits)
    if layout.ple_bits is None:
        total += _bits_to_bytes(counts.ple_table, layout.dense_bits)
    elif counts.ple_table:
        scales = _ple_scales(cfg, cfg.ple_vocab)
        total += _bits_to_bytes(counts.ple_table, layout.ple_bits) + scales * layout.ple_scale_bytes
    if layout.lm_head_bits is not None:
        total += _bits_to_bytes(counts.embedding, layout.lm_head_bits) + cfg.vocab_size * layout.lm_head_scale_bytes
    return total


def _ple_scales(cfg: ModelConfig, rows: int) -> int:
    """Scales of `rows` rows of a quantized PLE table: one per (row, layer)."""
    return rows * cfg.num_layers


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
    """Bytes one decode step (one new token, batch 1) reads, as a `ByteAccount`.

    Terms (counts: `model.accounting.decode_reads`): the body (every non-embedding weight: all are touched once
    per step) at dense bits; one row (D) of the input embedding; one row (L x P) of the PLE table, at its packed
    width plus its L scales; the output projection: the whole int8 lm_head copy plus its scales, or the whole
    dense tied table when the layout has no lm_head copy; the KV cache at `context_tokens` (0 leaves it out).
    """
    reads, v, d, dense = decode_reads(cfg), cfg.vocab_size, cfg.hidden_size, layout.dense_bits
    terms = [
        ByteTerm("body", _bits_to_bytes(reads.body, dense),
                 f"all {reads.body:,} non-embedding parameters at {dense} bits"),
        ByteTerm("input_embedding_row", _bits_to_bytes(reads.input_embedding_row, dense),
                 f"one row of the {v:,} x {d} input embedding at {dense} bits"),
    ]  # fmt: skip
    if layout.ple_bits is None:
        terms.append(ByteTerm(
            "ple_row", _bits_to_bytes(reads.ple_row, dense),
            f"one row ({reads.ple_row} values) of the PLE table at {dense} bits",
        ))  # fmt: skip
    else:
        scales = _ple_scales(cfg, 1) if reads.ple_row else 0
        terms.append(ByteTerm(
            "ple_row", _bits_to_bytes(reads.ple_row, layout.ple_bits) + scales * layout.ple_scale_bytes,
            f"one row ({reads.ple_row} values) of the PLE table at {layout.ple_bits} bits + {scales} scales",
        ))  # fmt: skip
    if layout.lm_head_bits is None:
        terms.append(ByteTerm(
            "lm_head", _bits_to_bytes(reads.lm_head, dense),
            f"the whole tied {v:,} x {d} embedding at {dense} bits (output projection)",
        ))  # fmt: skip
    else:
        terms.append(ByteTerm(
            "lm_head", _bits_to_bytes(reads.lm_head, layout.lm_head_bits) + v * layout.lm_head_scale_bytes,
            f"the whole {v:,} x {d} lm_head copy at {layout.lm_head_bits} bits + one scale per row",
        ))  # fmt: skip
    if context_tokens:
        terms.append(ByteTerm(
            "kv_cache", kv_cache_bytes(cfg, layout, context_tokens),
            f"K and V of {context_tokens} cached positions, read by every layer's attention",
        ))  # fmt: skip
    return ByteAccount(layout.name, context_tokens, tuple(terms))


def roofline_share(bytes_per_step: float, tok_s: float, bandwidth_bytes_s: float) -> float:
    """Bandwidth roofline share, a fraction: bytes_per_step x tok_s / bandwidth_bytes_s (measurement.md).

    bytes_per_step: bytes one decode step reads (weights at their stored size plus the KV cache read at that
        context), from the engine's own accounting.
    tok_s: the gauge decode rate in tokens/s at batch 1 (one step per token).
    bandwidth_bytes_s: measured bandwidth in bytes/s (bytes read + written by the copy per second).
    1.0 means decode moves bytes as fast as the copy did. Raises InputError for negative inputs or a bandwidth <= 0.
    """
    if bandwidth_bytes_s <= 0:
        raise InputError(f"bandwidth {bandwidth_bytes_s!r} bytes/s: expected a measured bandwidth > 0")
    if bytes_per_step < 0 or tok_s < 0:
        raise InputError(f"bytes per step {bytes_per_step!r} and tok/s {tok_s!r}: expected values >= 0")
    return bytes_per_step * tok_s / bandwidth_bytes_s


def roofline_share_pct(bytes_per_step: int | float, tok_s: float, bandwidth_gib_s: float) -> float:
    """Bandwidth roofline share in %: `roofline_share` with the bandwidth given in GiB/s (2^30 B/s).
    Raises InputError for a bandwidth <= 0 or negative inputs."""
    return 100.0 * roofline_share(bytes_per_step, tok_s, bandwidth_gib_s * GIB)
