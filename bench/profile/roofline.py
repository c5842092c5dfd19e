"""Bytes a Gemma 4 decode step reads, and the bandwidth roofline share they imply. Pure arithmetic, no jax.

measurement.md (Rooflines): bytes per decode step = every weight the step touches, in its stored dtype
(quantized tables at their packed size), plus the KV cache read at that context; roofline share = bytes per
step x decode tok/s / bandwidth.

This module derives the bytes of the PUBLISHED runs (quantized layouts, shapes as plain numbers); measured runs
use the engine's own accounting (`model.engine.Engine.decode_bytes`: weights as loaded, plus the whole KV buffer
that every layer's decode attention reads). The KV term here (`kv_cache_bytes`) counts positions up to the context
instead, and only annotates the published figures (whose context length was not published).

`E2B_SHAPE` holds google/gemma-4-E2B-it's published numbers (source: ../shared/gemma4-architecture.md §1 and §3;
the model's config.json): vocab 262144, hidden 1536, 35 layers with
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
from collections.abc import Sequence

from bench.errors import InputError

GIB = 2**30


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerShape:
    """One decoder layer: head dim H, feed-forward width F, whether it computes its own K/V, attention type, and
    the layer whose KV cache it attends over (itself, or its producer when KV-shared)."""

    head_dim: int
    ffw_dim: int
    owns_kv: bool
    sliding: bool
    kv_source: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecoderShape:
    """A Gemma 4 text decoder's sizes: V vocab, D hidden, N query heads, K KV heads, P PLE width, window W."""

    vocab_size: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ple_dim: int
    sliding_window: int
    layers: tuple[LayerShape, ...]

    @property
    def ple_width(self) -> int:
        """Columns of the PLE table: L x P (8960 for E2B)."""
        return len(self.layers) * self.ple_dim


def decoder_shape(
    *, vocab_size: int, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, global_head_dim: int,
    sliding: Sequence[bool], ffw_dims: Sequence[int], num_kv_shared_layers: int, ple_dim: int, sliding_window: int,
) -> DecoderShape:  # fmt: skip
    """Build a `DecoderShape` from config numbers: `sliding[i]` and `ffw_dims[i]` per layer.

    The last `num_kv_shared_layers` layers own no K/V and read the cache of the last non-shared layer of the
    same attention type (Gemma 4's KV-share map).
    """
    n = len(sliding)
    first_shared = n - num_kv_shared_layers
    layers = []
    for i in range(n):
        owns = i < first_shared
        source = i if owns else max(j for j in range(first_shared) if sliding[j] == sliding[i])
        layers.append(
            LayerShape(
                head_dim=head_dim if sliding[i] else global_head_dim, ffw_dim=ffw_dims[i], owns_kv=owns,
                sliding=sliding[i], kv_source=source,
            )  # fmt: skip
        )
    return DecoderShape(
        vocab_size=vocab_size, hidden_size=hidden_size, num_heads=num_heads, num_kv_heads=num_kv_heads,
        ple_dim=ple_dim, sliding_window=sliding_window, layers=tuple(layers),
    )  # fmt: skip


E2B_SHAPE = decoder_shape(
    vocab_size=262_144, hidden_size=1536, num_heads=8, num_kv_heads=1, head_dim=256, global_head_dim=512,
    sliding=[(i + 1) % 5 != 0 for i in range(35)], ffw_dims=[6144] * 15 + [12288] * 20, num_kv_shared_layers=20,
    ple_dim=256, sliding_window=512,
)  # fmt: skip
"""google/gemma-4-E2B-it's text decoder (published config; see the module docstring)."""


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


def layer_params(shape: DecoderShape, i: int) -> int:
    """Parameters of layer i (PyTorch layout): q/o projections, K/V projections and k_norm when it owns K/V,
    q_norm, five RMSNorm weights of D, gate/up/down (3 x D x F), PLE gate and projection (2 x D x P), layer_scalar."""
    layer, d = shape.layers[i], shape.hidden_size
    n = 2 * d * shape.num_heads * layer.head_dim + layer.head_dim + 5 * d + 3 * d * layer.ffw_dim
    n += 2 * d * shape.ple_dim + 1
    if layer.owns_kv:
        n += 2 * d * shape.num_kv_heads * layer.head_dim + layer.head_dim
    return n


def body_params(shape: DecoderShape) -> int:
    """Every parameter except the two embedding tables: the layers, per_layer_model_projection (L*P x D), the
    PLE projection norm (P) and the final norm (D). 1,877,105,955 for E2B."""
    return sum(layer_params(shape, i) for i in range(len(shape.layers))) + (
        shape.ple_width * shape.hidden_size + shape.ple_dim + shape.hidden_size
    )


def total_params(shape: DecoderShape) -> int:
    """All text parameters: body + input embedding (V x D) + PLE table (V x L*P). 4,628,569,379 for E2B."""
    return body_params(shape) + shape.vocab_size * (shape.hidden_size + shape.ple_width)


def _bits_to_bytes(count: int, bits: int) -> int:
    return count * bits // 8


def stored_weight_bytes(shape: DecoderShape, layout: WeightLayout) -> int:
    """Bytes of every stored weight tensor (what a loader reports as weight bytes). 6,155,450,950 for E2B in
    `PLE4_INT8_LM_HEAD`: body and input embedding at 16 bits, PLE packed + scales, int8 lm_head copy + scales."""
    v = shape.vocab_size
    total = _bits_to_bytes(body_params(shape) + v * shape.hidden_size, layout.dense_bits)
    if layout.ple_bits is None:
        total += _bits_to_bytes(v * shape.ple_width, layout.dense_bits)
    else:
        total += _bits_to_bytes(v * shape.ple_width, layout.ple_bits) + v * len(shape.layers) * layout.ple_scale_bytes
    if layout.lm_head_bits is not None:
        total += _bits_to_bytes(v * shape.hidden_size, layout.lm_head_bits) + v * layout.lm_head_scale_bytes
    return total


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


def kv_cache_bytes(shape: DecoderShape, layout: WeightLayout, context_tokens: int) -> int:
    """K and V bytes the attention of all layers reads at `context_tokens` cached positions.

    Each layer attends over its source layer's cache (KV-shared layers re-read their producer's): 2 (K, V) x
    K heads x H x positions x kv_bits/8, with positions = min(context, window) on sliding layers.
    """
    total = 0
    for layer in shape.layers:
        positions = min(context_tokens, shape.sliding_window) if layer.sliding else context_tokens
        total += _bits_to_bytes(2 * shape.num_kv_heads * layer.head_dim * positions, layout.kv_bits)
    return total


def decode_step_bytes(shape: DecoderShape, layout: WeightLayout, context_tokens: int = 0) -> ByteAccount:
    """Bytes one decode step (one new token, batch 1) reads, as a `ByteAccount`.

    Terms: the body (every non-embedding weight: all are touched once per step) at dense bits; one row (D) of the
    input embedding; one row (L x P) of the PLE table, at its packed width plus its L scales; the output
    projection: the whole int8 lm_head copy plus its scales, or the whole dense tied table when the layout has
    no lm_head copy; the KV cache at `context_tokens` (0 leaves it out).
    """
    v, d = shape.vocab_size, shape.hidden_size
    n_layers = len(shape.layers)
    terms = [
        ByteTerm("body", _bits_to_bytes(body_params(shape), layout.dense_bits),
                 f"all {body_params(shape):,} non-embedding parameters at {layout.dense_bits} bits"),
        ByteTerm("input_embedding_row", _bits_to_bytes(d, layout.dense_bits),
                 f"one row of the {v:,} x {d} input embedding at {layout.dense_bits} bits"),
    ]  # fmt: skip
    if layout.ple_bits is None:
        terms.append(ByteTerm(
            "ple_row", _bits_to_bytes(shape.ple_width, layout.dense_bits),
            f"one row ({shape.ple_width} values) of the PLE table at {layout.dense_bits} bits",
        ))  # fmt: skip
    else:
        terms.append(ByteTerm(
            "ple_row", _bits_to_bytes(shape.ple_width, layout.ple_bits) + n_layers * layout.ple_scale_bytes,
            f"one row ({shape.ple_width} values) of the PLE table at {layout.ple_bits} bits + {n_layers} scales",
        ))  # fmt: skip
    if layout.lm_head_bits is None:
        terms.append(ByteTerm(
            "lm_head", _bits_to_bytes(v * d, layout.dense_bits),
            f"the whole tied {v:,} x {d} embedding at {layout.dense_bits} bits (output projection)",
        ))  # fmt: skip
    else:
        terms.append(ByteTerm(
            "lm_head", _bits_to_bytes(v * d, layout.lm_head_bits) + v * layout.lm_head_scale_bytes,
            f"the whole {v:,} x {d} lm_head copy at {layout.lm_head_bits} bits + one scale per row",
        ))  # fmt: skip
    if context_tokens:
        terms.append(ByteTerm(
            "kv_cache", kv_cache_bytes(shape, layout, context_tokens),
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
