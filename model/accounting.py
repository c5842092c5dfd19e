"""The model's facts as arithmetic: parameter shapes and counts, KV cache slots, and the bytes a decode step reads.

Pure functions of a `ModelConfig` on Python ints: no jax and no numpy, so `bench.report` and `bench.profile.roofline`
can use the model's own facts on archived runs (architecture.md, walls 2 and 5). `model.params` builds its pytrees
from `layer_shapes` / `global_shapes`, `model.cache` sizes its buffers with `slots`, and `model.engine` reports
`decode_weight_bytes` + `kv_read_bytes`: each fact has this one definition.

Key: V vocab, D model width, L layers, N query heads, K kv heads, H head dim (per layer), F feed-forward width
(per layer), P per-layer-input (PLE) width, X = L * P, S cache slots.

Counts are scalars (elements); bytes are counts x bytes per stored scalar. The counts are grouped the way a
storage layout treats them (`ParamCounts`, `DecodeReads`: the body, the tied embedding table, the PLE table), so a
layout that gives each group its own bits per scalar (e.g. the published runs' `bench.profile.roofline.WeightLayout`)
multiplies group by group. Source of the bytes a step reads: measurement.md, "Rooflines".
"""

from __future__ import annotations

import dataclasses
import math

from model.config import ModelConfig

Shape = tuple[int, ...]

EMBEDDING_TABLES = ("embed_VD", "ple_embed_VX")
"""The two gathered tables (`global_shapes` names): a decode step reads one row of each, not the table."""


# ---- parameter shapes and counts --------------------------------------------------------------------------------
def layer_shapes(cfg: ModelConfig, i: int) -> dict[str, Shape | None]:
    """Shapes of layer i's leaves by `model.params.LayerParams` field name (None for a leaf the layer lacks:
    K/V projections and k_norm on KV-shared layers, the PLE leaves when P = 0). Input-major layout."""
    d, n, k, h, f, p = cfg.hidden_size, cfg.num_heads, cfg.kv_heads(i), cfg.layer_head_dim(i), cfg.ffw_dim(i), cfg.ple_dim
    own_kv = not cfg.is_kv_shared(i)
    return {
        "attn_norm_D": (d,), "post_attn_norm_D": (d,), "pre_ffw_norm_D": (d,), "post_ffw_norm_D": (d,),
        "wq_DNH": (d, n, h), "q_norm_H": (h,),
        "wk_DKH": (d, k, h) if own_kv else None, "wv_DKH": (d, k, h) if own_kv else None,
        "k_norm_H": (h,) if own_kv else None,
        "wo_NHD": (n, h, d), "gate_DF": (d, f), "up_DF": (d, f), "down_FD": (f, d),
        "ple_gate_DP": (d, p) if p else None, "ple_proj_PD": (p, d) if p else None,
        "post_ple_norm_D": (d,) if p else None, "layer_scalar_1": (1,),
    }  # fmt: skip


def global_shapes(cfg: ModelConfig) -> dict[str, Shape | None]:
    """Shapes of the non-layer leaves by `model.params.Params` field name (None for the PLE leaves when P = 0):
    embed_VD [V, D], ple_embed_VX [V_ple, X], ple_proj_DX [D, X], ple_norm_P [P], final_norm_D [D]."""
    x = cfg.num_layers * cfg.ple_dim
    return {
        "embed_VD": (cfg.vocab_size, cfg.hidden_size),
        "ple_embed_VX": (cfg.ple_vocab, x) if cfg.ple_dim else None,
        "ple_proj_DX": (cfg.hidden_size, x) if cfg.ple_dim else None,
        "ple_norm_P": (cfg.ple_dim,) if cfg.ple_dim else None,
        "final_norm_D": (cfg.hidden_size,),
    }


def _size(shape: Shape | None) -> int:
    return 0 if shape is None else math.prod(shape)


def _count(shapes: dict[str, Shape | None]) -> int:
    return sum(_size(s) for s in shapes.values())


def layer_param_count(cfg: ModelConfig, i: int) -> int:
    """Scalars of layer i: the sum over `layer_shapes(cfg, i)` (E2B: 36,184,065 for layer 0, which owns its K/V,
    70,000,641 for layer 34, KV-shared with a double-wide feed-forward)."""
    return _count(layer_shapes(cfg, i))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParamCounts:
    """Scalars of the whole text decoder by storage group.

    body: every parameter except the two embedding tables (the layers, ple_proj_DX, ple_norm_P, final_norm_D);
    embedding: the tied input/output table embed_VD (V x D); ple_table: ple_embed_VX (V_ple x X, 0 when P = 0).
    """

    body: int
    embedding: int
    ple_table: int

    @property
    def total(self) -> int:
        """All text parameters (E2B: 4,628,569,379, gemma4-architecture.md §3)."""
        return self.body + self.embedding + self.ple_table


def param_counts(cfg: ModelConfig) -> ParamCounts:
    """`ParamCounts` of `cfg` from `layer_shapes` and `global_shapes` (E2B body: 1,877,105,955)."""
    glob = global_shapes(cfg)
    tables = {name: glob.pop(name) for name in EMBEDDING_TABLES}
    layers = sum(layer_param_count(cfg, i) for i in range(cfg.num_layers))
    return ParamCounts(
        body=layers + _count(glob),
        embedding=_size(tables["embed_VD"]),
        ple_table=_size(tables["ple_embed_VX"]),
    )


# ---- the weights a decode step reads ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeReads:
    """Weight scalars one decode step (one new token, batch 1) reads, by storage group.

    body: every non-embedding parameter, once; input_embedding_row: one row of embed_VD (D), the input lookup;
    ple_row: one row of the PLE table (X, 0 when P = 0), a gather per token; lm_head: the whole tied table
    (V x D) once more, for the logits. Source: measurement.md "bytes per decode step".
    """

    body: int
    input_embedding_row: int
    ple_row: int
    lm_head: int

    @property
    def total(self) -> int:
        """All weight scalars the step reads."""
        return self.body + self.input_embedding_row + self.ple_row + self.lm_head


def decode_reads(cfg: ModelConfig) -> DecodeReads:
    """`DecodeReads` of `cfg`: the body of `param_counts`, one row of each embedding table, the tied table whole."""
    glob = global_shapes(cfg)
    embed, ple = glob["embed_VD"], glob["ple_embed_VX"]
    assert embed is not None  # every config has the tied table
    vocab, width = embed
    return DecodeReads(
        body=param_counts(cfg).body,
        input_embedding_row=width,
        ple_row=ple[1] if ple is not None else 0,
        lm_head=vocab * width,
    )


def decode_weight_bytes(cfg: ModelConfig, weight_itemsize: int) -> int:
    """Weight bytes one decode step reads with every weight stored at `weight_itemsize` bytes per scalar:
    `decode_reads(cfg).total` x itemsize (e.g. 4 for float32, 2 for bfloat16)."""
    return decode_reads(cfg).total * weight_itemsize


# ---- the KV cache ---------------------------------------------------------------------------------------------
def ring_size(cfg: ModelConfig, max_len: int) -> int:
    """Slots of a sliding layer's ring: the window, or fewer when the whole sequence fits (no wrap then)."""
    return min(cfg.sliding_window, max_len)


def slots(cfg: ModelConfig, layer: int, max_len: int) -> int:
    """Slots S of `layer`'s cache: `max_len` for full attention, the ring size for sliding attention."""
    return ring_size(cfg, max_len) if cfg.is_sliding(layer) else max_len


def kv_read_elements(cfg: ModelConfig, max_len: int) -> int:
    """K and V scalars one decode step's attention reads over a cache of `max_len` positions: every layer reads
    the whole buffer of its KV source (`ModelConfig.kv_source`: itself, or its producer for a KV-shared layer),
    2 (K, V) x slots x K heads x H, masked slots included; a producer's cache is therefore read once per layer
    that uses it (E2B: layer 14's by layers 14, 19, 24, 29 and 34)."""
    total = 0
    for i in range(cfg.num_layers):
        src = cfg.kv_source(i)
        total += 2 * slots(cfg, src, max_len) * cfg.kv_heads(src) * cfg.layer_head_dim(src)
    return total


def kv_read_bytes(cfg: ModelConfig, max_len: int, itemsize: int) -> int:
    """Bytes of `kv_read_elements` at `itemsize` bytes per cached scalar."""
    return kv_read_elements(cfg, max_len) * itemsize
