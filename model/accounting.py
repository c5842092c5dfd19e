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
multiplies group by group. Source of the bytes a step reads: docs/method.md, "Rooflines".

Weight bytes by component under a quantization option set (`weight_bytes_by_component`): every leaf at the body
dtype's itemsize, except the leaves `model.quantspec.leaf_layout` quantizes, which count their stored values
(two int4 values per byte; a table stored in uint32 words with its rows' padding to whole words, none at Gemma 4's
shapes) plus their scales at the scale itemsize; `int8_lm_head` adds a separate int8 copy of
the tied table (the input embedding keeps its dtype for the lookup). The same per-leaf arithmetic gives the bytes
one decode step reads. `model.quant.tree_bytes` counts the quantized arrays themselves; the tests check the two
agree for every option set.

As placed on a target (`placement_layout`): the leaves take the same bytes on every platform (`NATURAL`), except
on a TPU whose w4 products go through the Pallas kernel (`TPU_LAYOUT`), where a w4 projection whose contraction
length is not a whole number of w4 groups is stored with its last group filled up with zeros (`placed_shape`:
26B-A4B's expert down projection, K = 704 -> 768, 346,030,080 bytes more over its 30 layers, and its MLP down
projection, K = 2112 -> 2176, 2,703,360 more).
`leaf_bytes` is the one place that counts it; the inspector's fit table and the sweep's fit check both take it
from there (docs/devices/tpu.md, "Which models fit one chip").
"""

from __future__ import annotations

import dataclasses
import math

from model.config import ModelConfig
from model.kernels.fit_tpu import placed_k
from model.quantspec import (
    EXPERT_PROJECTIONS,
    LAYER_PROJECTIONS,
    LM_HEAD,
    NO_QUANT,
    PLE_GROUP,
    QuantSpec,
    leaf_layout,
    packed_value_bytes,
    quantized_bytes,
)

from model.shapes import (  # noqa: F401  (re-exported: the shapes' names here as before)
    EMBEDDING_TABLES,
    Shape,
    compute_layer_shapes,
    expert_shapes,
    global_shapes,
    has_v_projection,
    layer_shapes,
)

EXPERT_LEAVES = ("experts_gate_up_EDX", "experts_down_EDF")
"""The expert block's per-expert leaves (`expert_shapes`): axis 0 is the expert, so a step that routes to n
experts reads n of the E slices (one slice: the shape with E = 1)."""


def layer_leaves(cfg: ModelConfig, i: int, *, compute: bool = True) -> dict[str, Shape | None]:
    """Every leaf of layer i, the expert block's included: `compute_layer_shapes` (or `layer_shapes` with
    compute=False) joined with `expert_shapes`, each field once (where a layout already holds the expert leaves,
    their one shape)."""
    return {**expert_shapes(cfg), **(compute_layer_shapes if compute else layer_shapes)(cfg, i)}


def expert_params(cfg: ModelConfig) -> int:
    """Scalars of every expert of every layer (the `EXPERT_LEAVES`): L x E x 3 D I; 0 without experts."""
    return cfg.num_layers * sum(_size(s) for f, s in expert_shapes(cfg).items() if f in EXPERT_LEAVES)


def check_experts_read(cfg: ModelConfig, experts: int | None) -> int:
    """Experts per layer one decode step reads: `experts`, or the router's top_k when None (the estimate at batch
    1: every token reads its top_k experts; at batch B the union of the rows' choices, between top_k and
    min(E, B x top_k), is what the measured run records). 0 without experts. Raises ValueError for a count
    outside 1..E on a model with experts, or above 0 on one without."""
    if not cfg.num_experts:
        if experts:
            raise ValueError(f"experts read {experts}: this model has no experts (expected 0 or None)")
        return 0
    n = cfg.top_k_experts if experts is None else experts
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= cfg.num_experts:
        raise ValueError(f"experts read {n!r}: expected a whole number 1..{cfg.num_experts} (the model's experts)")
    return n


def _size(shape: Shape | None) -> int:
    return 0 if shape is None else math.prod(shape)


def _count(shapes: dict[str, Shape | None]) -> int:
    return sum(_size(s) for s in shapes.values())


def layer_param_count(cfg: ModelConfig, i: int) -> int:
    """Scalars of layer i: the sum over `layer_leaves(cfg, i, compute=False)` (E2B: 36,184,065 for layer 0, which
    owns its K/V, 70,000,641 for layer 34, KV-shared with a double-wide feed-forward)."""
    return _count(layer_leaves(cfg, i, compute=False))


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

    body: every non-embedding parameter except the experts, once; input_embedding_row: one row of embed_VD (D), the
    input lookup; ple_row: one row of the PLE table (X, 0 when P = 0), a gather per token; lm_head: the whole tied
    table (V x D) once more, for the logits; experts: the experts the step reads, n per layer of the E (n x 3 D I
    x L; 0 without experts): the bytes follow the routing. Source: docs/method.md, "Rooflines" and "K = V layers
    and experts".
    """

    body: int
    input_embedding_row: int
    ple_row: int
    lm_head: int
    experts: int = 0

    @property
    def total(self) -> int:
        """All weight scalars the step reads."""
        return self.body + self.input_embedding_row + self.ple_row + self.lm_head + self.experts


def decode_reads(cfg: ModelConfig, experts: int | None = None) -> DecodeReads:
    """`DecodeReads` of `cfg`: the body of `param_counts` less the experts, one row of each embedding table, the
    tied table whole, and `experts` experts per layer (`check_experts_read`: default the router's top_k)."""
    glob = global_shapes(cfg)
    embed, ple = glob["embed_VD"], glob["ple_embed_VX"]
    assert embed is not None  # every config has the tied table
    vocab, width = embed
    every, n_read = expert_params(cfg), check_experts_read(cfg, experts)
    return DecodeReads(
        body=param_counts(cfg).body - every,
        input_embedding_row=width,
        ple_row=ple[1] if ple is not None else 0,
        lm_head=vocab * width,
        experts=every // cfg.num_experts * n_read if every else 0,
    )


def decode_weight_bytes(cfg: ModelConfig, weight_itemsize: int, *, scale_itemsize: int = 2,
                        quant: QuantSpec = NO_QUANT, experts: int | None = None) -> int:  # fmt: skip
    """Weight bytes one decode step reads with every dense weight stored at `weight_itemsize` bytes per scalar
    (e.g. 4 for float32, 2 for bfloat16) and the leaves `quant` quantizes at their packed size plus scales of
    `scale_itemsize` bytes; `experts` experts per layer read (`check_experts_read`: default top_k). Without
    quantization: `decode_reads(cfg, experts).total` x itemsize."""
    if quant == NO_QUANT:
        return decode_reads(cfg, experts).total * weight_itemsize
    return weight_bytes_by_component(cfg, weight_itemsize, scale_itemsize=scale_itemsize, quant=quant,
                                     experts=experts).decode_bytes  # fmt: skip


def routed_decode_weight_bytes(cfg: ModelConfig, weight_itemsize: int, *, experts: float, scale_itemsize: int = 2,
                               quant: QuantSpec = NO_QUANT) -> int:  # fmt: skip
    """`decode_weight_bytes` with the experts a step read as measured: `experts` per layer, a real number in
    1..E (the median over a cell's decode steps of the distinct experts read, summed over the layers, / layers;
    docs/method.md, "Bytes that follow the routing"). The bytes are linear in the count, one expert's slices per
    layer each (`expert_slice_bytes`): decode_weight_bytes(experts=1) + (experts - 1) x layers x one expert's
    bytes, equal to decode_weight_bytes(experts=n) for a whole n; a fraction (a median between two steps) is
    rounded to the byte. Raises ValueError for a model without experts or a count outside 1..E."""
    if not cfg.num_experts:
        raise ValueError(f"experts read {experts!r}: this model has no experts")
    if isinstance(experts, bool) or not isinstance(experts, (int, float)) or not 1 <= experts <= cfg.num_experts:
        raise ValueError(f"experts read {experts!r}: expected a number of experts per layer in 1..{cfg.num_experts}")
    one = decode_weight_bytes(cfg, weight_itemsize, scale_itemsize=scale_itemsize, quant=quant, experts=1)
    slice_bytes = expert_slice_bytes(cfg, weight_itemsize, scale_itemsize=scale_itemsize, quant=quant)
    return one + round((experts - 1) * cfg.num_layers * slice_bytes)


def expert_slice_bytes(cfg: ModelConfig, weight_itemsize: int, *, scale_itemsize: int = 2,
                       quant: QuantSpec = NO_QUANT) -> int:  # fmt: skip
    """Bytes a step reads of one expert of one layer: its slice of each `EXPERT_LEAVES` leaf (gate/up [D, 2I] and
    down [D, I]), packed with its scales under `quant` (`leaf_bytes`; no scale block spans two experts); 0 without
    experts."""
    if not cfg.num_experts:
        return 0
    shapes = expert_shapes(cfg)
    return sum(leaf_bytes(f, (1, *shapes[f][1:]), weight_itemsize, scale_itemsize, quant)[0] for f in EXPERT_LEAVES)


# ---- weight bytes by component, under quantization ----------------------------------------------------------------
COMPONENTS = ("input embedding", "PLE table", "PLE projection+norm", "layers", "LM head", "other")
"""The components `weight_bytes_by_component` reports, in order (`components_of`: with "experts" after "layers"
for a model with experts)."""
EXPERTS = "experts"
"""The component of the experts' own weights (`EXPERT_LEAVES`); the router and the block's norms are "layers"."""


def components_of(cfg: ModelConfig) -> tuple[str, ...]:
    """The components of `cfg` in order: `COMPONENTS`, with `EXPERTS` after "layers" when it has experts."""
    if not cfg.num_experts:
        return COMPONENTS
    at = COMPONENTS.index("layers") + 1
    return (*COMPONENTS[:at], EXPERTS, *COMPONENTS[at:])

_COMPONENT_OF = {"embed_VD": "input embedding", "ple_embed_VX": "PLE table", "ple_proj_DX": "PLE projection+norm",
                 "ple_norm_P": "PLE projection+norm", "final_norm_D": "other", LM_HEAD: "LM head"}  # fmt: skip
"""Global field -> component (every layer field is "layers")."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ComponentBytes:
    """One component's parameters as placed on the device, and what one decode step (batch 1) reads of it.

    params: the model's parameters it holds (0 for the LM head: tied, its values are the input embedding's, even
    when an int8 copy is stored); scales: quantization scales stored; bytes: packed values + scales + dense leaves;
    decode_bytes: bytes one decode step reads (one row of each gathered table, everything else whole); note: how
    it is stored, in words.
    """

    name: str
    params: int
    scales: int
    bytes: int
    decode_bytes: int
    note: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class WeightBytes:
    """Weight bytes of a config by component (`COMPONENTS` order) at one body itemsize, scale itemsize and
    quantization (`quant`: `QuantSpec.canonical`), as placed in `layout` (`LAYOUTS`)."""

    components: tuple[ComponentBytes, ...]
    itemsize: int
    scale_itemsize: int
    quant: str
    layout: str = "natural"

    @property
    def params(self) -> int:
        """All text parameters (E2B: 4,628,569,379)."""
        return sum(c.params for c in self.components)

    @property
    def scales(self) -> int:
        """All scales stored."""
        return sum(c.scales for c in self.components)

    @property
    def bytes(self) -> int:
        """The weight-bytes gauge: every parameter as placed on the device, scales included."""
        return sum(c.bytes for c in self.components)

    @property
    def decode_bytes(self) -> int:
        """Weight bytes one decode step reads."""
        return sum(c.decode_bytes for c in self.components)


NATURAL = "natural"
"""`placement_layout`: the leaves as `model.quantspec.leaf_layout` stores them, the same bytes on every platform."""
TPU_LAYOUT = "tpu"
"""`placement_layout`: a TPU whose w4 products go through the Pallas kernel: the w4 projections in the TPU layout,
K padded to whole groups (`placed_shape`)."""
LAYOUTS = (NATURAL, TPU_LAYOUT)


def placement_layout(platform: str | None, quant: QuantSpec, kernel: str | None = None) -> str:
    """The layout (`LAYOUTS`) the leaves take on `platform` (a jax backend name, "cpu", "gpu", "tpu"; None: no
    platform in particular) under `quant` and the `--kernel` choice `kernel` (None, "pallas", "pallas:POLICY" or
    "xla", the text after "w4a16="): `TPU_LAYOUT` on a TPU with w4 weights and any kernel choice but xla (the
    Pallas kernel is the default there: `model.kernels.choice.decide_mode`), else `NATURAL`."""
    xla = kernel is not None and kernel.split(":")[0] == "xla"
    return TPU_LAYOUT if platform == "tpu" and quant.layer_bits == 4 and not xla else NATURAL


def placed_shape(field: str, shape: Shape, quant: QuantSpec, layout: str = NATURAL) -> Shape:
    """The logical shape leaf `field` of `shape` (a whole leaf or a part of it) takes as placed in `layout`:
    `shape`, except a w4 projection (`model.quantspec.LAYER_PROJECTIONS`, `EXPERT_PROJECTIONS`) in `TPU_LAYOUT`,
    whose contraction axis is K rounded up to whole w4 groups where the kernel tiles it (26B-A4B's MLP down
    projection, K = 2112 -> 2176; `model.kernels.fit_tpu.placed_k`; `model.kernels.tpu_layout.to_tpu` and
    `to_tpu_experts` store the padding as zero values). Its scales do not change: the short last group already had its own. Raises ValueError for an
    unknown layout."""
    if layout not in LAYOUTS:
        raise ValueError(f"placement layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    projections = {**LAYER_PROJECTIONS, **EXPERT_PROJECTIONS}
    if layout != TPU_LAYOUT or field not in projections or quant.layer_bits != 4:
        return shape
    (axis,) = projections[field]
    spec = leaf_layout(field, shape, quant)
    if spec is None or spec.block[axis] <= 1:  # not grouped along its contraction axis: not the kernel's
        return shape
    other = 3 - axis if len(shape) == 3 else 1 - axis  # the output axis: [E, K, N] / [E, N, K] or [K, N] / [N, K]
    k = placed_k(shape[axis], shape[other], spec.block[axis])
    return tuple(k if i == axis else n for i, n in enumerate(shape))


def leaf_bytes(field: str, shape: Shape, itemsize: int, scale_itemsize: int, quant: QuantSpec,
               layout: str = NATURAL) -> tuple[int, int]:  # fmt: skip
    """(bytes, scales) of one leaf `field` of `shape` (the whole leaf, or a part of it: a shard, some experts) as
    placed in `layout` (`LAYOUTS`): dense at `itemsize`, or its `leaf_layout` packed with its scales of
    `scale_itemsize` bytes, plus the value bytes of the padding `placed_shape` adds. The one place the bytes of a
    leaf as placed are counted (`weight_bytes_by_component`, `model.placement.device_share`)."""
    spec = leaf_layout(field, shape, quant)
    if spec is None:
        return math.prod(shape) * itemsize, 0
    stored, scales = quantized_bytes(shape, spec, scale_itemsize)
    placed = placed_shape(field, shape, quant, layout)
    if placed != shape:
        stored += packed_value_bytes(placed, spec.bits, spec.words) - packed_value_bytes(shape, spec.bits, spec.words)
    return stored, scales


def _note(name: str, cfg: ModelConfig, quant: QuantSpec, experts_read: int = 0, layout: str = NATURAL) -> str:
    """How component `name` is stored under `quant` in `layout` (and for the experts, how many a step reads), in
    words."""
    note = _stored_as(name, cfg, quant, experts_read)
    if name == EXPERTS and layout == TPU_LAYOUT:
        padded = [(s[EXPERT_PROJECTIONS[f][0]], p[EXPERT_PROJECTIONS[f][0]]) for f, s in expert_shapes(cfg).items()
                  if f in EXPERT_PROJECTIONS and s is not None
                  and (p := placed_shape(f, s, quant, layout)) != s]  # fmt: skip
        note += "; in the TPU kernel's layout" + "".join(f", K {k} padded to {kp}" for k, kp in padded)
    return f"{note}; no V projection on full layers (K = V)" if name == "layers" and cfg.attention_k_eq_v else note


def _stored_as(name: str, cfg: ModelConfig, quant: QuantSpec, experts_read: int) -> str:
    if name == "LM head":
        return ("int8 copy of the tied table, one scale per row" if quant.int8_lm_head
                else "tied: the input embedding's table, read whole for the logits")  # fmt: skip
    if name == "PLE table" and quant.ple_bits:
        return f"int{quant.ple_bits}, one scale per (row, {min(PLE_GROUP, cfg.num_layers * cfg.ple_dim)} values)"
    if name == EXPERTS:
        how = ("int8, one scale per output channel" if quant.layer_bits == 8 else
               f"int4, one scale per {quant.w4_group} contraction values" if quant.layer_bits == 4 else "dense")
        return (f"{cfg.num_experts} per layer, width {cfg.moe_intermediate_size}, {how}; a step reads "
                f"{experts_read} per layer (routed to)")  # fmt: skip
    if name == "layers" and quant.layer_bits == 8:
        return "projections int8, one scale per output channel; norms dense"
    if name == "layers" and quant.layer_bits == 4:
        return f"projections int4, one scale per {quant.w4_group} contraction values; norms dense"
    return "dense"


def weight_bytes_by_component(cfg: ModelConfig, itemsize: int, *, scale_itemsize: int = 2,
                              quant: QuantSpec = NO_QUANT, experts: int | None = None,
                              layout: str = NATURAL) -> WeightBytes:  # fmt: skip
    """`WeightBytes` of `cfg` with dense leaves at `itemsize` bytes per scalar, quantized leaves
    (`model.quantspec.leaf_layout`) at their packed size plus scales of `scale_itemsize` bytes.

    A decode step reads one row of the input embedding (D values at `itemsize`), one row of the PLE table (X values
    at its packed size plus that row's scales), the whole LM head (the int8 copy with its scales, or the tied table
    at `itemsize`), `experts` of the E slices of each expert leaf (`check_experts_read`: default the router's
    top_k; the scale blocks of an expert leaf never span two experts, so a slice's bytes are exact), and every
    other leaf whole. E2B at bfloat16 with 16-bit scales: 9,257,138,758 bytes dense, 6,155,450,950 with
    `ple4,int8_lm_head` (the published runs' figure). Every leaf as placed in `layout` (`leaf_bytes`,
    `placement_layout`: on a TPU with the w4 kernel, 26B-A4B `w4` takes 14,483,322,940 bytes, 348,733,440 more
    than its 14,134,589,500 elsewhere). Raises ValueError for an expert count out of range or an unknown layout.
    """
    n_read = check_experts_read(cfg, experts)
    acc = {name: [0, 0, 0, 0] for name in components_of(cfg)}  # params, scales, bytes, decode bytes

    def add(name: str, field: str, shape: Shape, *, params: bool = True, read: Shape | None = None) -> None:
        stored, scales = leaf_bytes(field, shape, itemsize, scale_itemsize, quant, layout)
        read_bytes = stored if read is None else leaf_bytes(field, read, itemsize, scale_itemsize, quant, layout)[0]
        for k, v in enumerate((math.prod(shape) if params else 0, scales, stored, read_bytes)):
            acc[name][k] += v

    for field, shape in global_shapes(cfg).items():
        if shape is not None:
            row = (1, shape[1]) if field in EMBEDDING_TABLES else None
            add(_COMPONENT_OF[field], field, shape, read=row)
    for i in range(cfg.num_layers):
        for field, shape in layer_leaves(cfg, i).items():  # the leaves as placed on the device
            if shape is not None and field in EXPERT_LEAVES:  # a step reads the experts it was routed to
                add(EXPERTS, field, shape, read=(n_read, *shape[1:]))
            elif shape is not None:
                add("layers", field, shape)
    head = (cfg.vocab_size, cfg.hidden_size)
    if quant.int8_lm_head:
        add("LM head", LM_HEAD, head, params=False)
    else:
        acc["LM head"][3] += math.prod(head) * itemsize  # the tied table, read whole
    parts = tuple(ComponentBytes(name=n, params=p, scales=s, bytes=b, decode_bytes=r,
                                 note=_note(n, cfg, quant, n_read, layout))
                  for n, (p, s, b, r) in acc.items())  # fmt: skip
    return WeightBytes(components=parts, itemsize=itemsize, scale_itemsize=scale_itemsize, quant=quant.canonical,
                       layout=layout)  # fmt: skip


def weight_bytes(cfg: ModelConfig, itemsize: int, *, scale_itemsize: int = 2, quant: QuantSpec = NO_QUANT,
                 layout: str = NATURAL) -> int:  # fmt: skip
    """The weight-bytes gauge of `cfg` as placed in `layout`: `weight_bytes_by_component(...).bytes`."""
    return weight_bytes_by_component(cfg, itemsize, scale_itemsize=scale_itemsize, quant=quant, layout=layout).bytes


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


def kv_cache_elements(cfg: ModelConfig, max_len: int) -> int:
    """K and V scalars one row's cache of `max_len` positions holds (`model.cache.init_cache`'s buffers): every
    layer that owns K/V (`cfg.cache_layers`), 2 (K, V) x slots x K heads x H. Unlike `kv_read_elements`, a
    producer's buffer counts once however many layers read it."""
    return sum(2 * slots(cfg, i, max_len) * cfg.kv_heads(i) * cfg.layer_head_dim(i) for i in cfg.cache_layers)


def kv_cache_bytes(cfg: ModelConfig, max_len: int, itemsize: int, batch: int = 1) -> int:
    """Bytes of the KV cache buffers of `batch` rows of `max_len` positions (bucket + max_new_tokens) at
    `itemsize` bytes per cached scalar: batch x `kv_cache_elements` x itemsize."""
    return batch * kv_cache_elements(cfg, max_len) * itemsize


MEMORY_RESERVE = 0.10
"""Share of the memory capacity a batch may not plan to use: left for activations (a prefill chunk's [B, C, 2F]
feed-forward, the [B, V] logits), the compiled programs and the runtime. A stated margin, not a measurement."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchMemory:
    """Whether a batch's KV cache fits beside the weights: the arithmetic `Engine.generate_batch` checks before it
    allocates anything, and the refusal it raises otherwise (`refusal`).

    batch: rows; cache_len: positions per row (bucket + max_new_tokens); weight_bytes: the parameters as placed
    on the device (`weight_bytes`); kv_bytes_per_row: one row's cache (`kv_cache_bytes`); capacity: bytes the
    device (or host) holds for this process, `where` says which figure; reserve: `MEMORY_RESERVE`;
    spare_rows: rows of cache allocated beside the batch's (the slot decoder's one-row prefill cache: 1; a batch
    of `generate_batch`: 0); copy_bytes: the part of weight_bytes that is the transposed copy batched steps read
    on CPU (`Engine.batch_copy_bytes`; 0 where there is none), named in the refusals.
    Under a device mesh (`mesh`, its text, e.g. "tp=2"; None: one device) weight_bytes, kv_bytes_per_row and
    copy_bytes are one device's (the largest device's share), capacity one device's memory, and `sharing` the
    devices whose shares come out of that capacity: 1 where each device has its own memory, the mesh's size where
    they share one (forced host devices on CPU: the host's memory).
    """

    batch: int
    cache_len: int
    weight_bytes: int
    kv_bytes_per_row: int
    capacity: int
    where: str
    reserve: float = MEMORY_RESERVE
    spare_rows: int = 0
    copy_bytes: int = 0
    mesh: str | None = None
    sharing: int = 1

    @property
    def kv_bytes(self) -> int:
        """The whole batch's KV cache (one device's share under a mesh): (batch + spare_rows) x kv_bytes_per_row."""
        return (self.batch + self.spare_rows) * self.kv_bytes_per_row

    @property
    def needed(self) -> int:
        """Weights + the batch's KV cache, times `sharing` (the devices that share the capacity: 1 but on a mesh of
        host devices)."""
        return self.sharing * (self.weight_bytes + self.kv_bytes)

    @property
    def usable(self) -> int:
        """The capacity less the reserve: floor(capacity x (1 - reserve))."""
        return math.floor(self.capacity * (1 - self.reserve))

    @property
    def fits(self) -> bool:
        """needed <= usable."""
        return self.needed <= self.usable

    @property
    def largest_batch(self) -> int:
        """The most rows whose cache fits beside the weights (and the spare rows): floor((usable - weights) /
        kv_bytes_per_row) - spare_rows, >= 0 (usable / sharing for usable under a mesh of devices that share it)."""
        usable = self.usable // self.sharing
        return max(0, (usable - self.weight_bytes) // max(1, self.kv_bytes_per_row) - self.spare_rows)

    def _weights_text(self) -> str:
        gb = 1e9
        copy = (f" (of which {self.copy_bytes / gb:.3f} GB is the transposed copy batched steps read on CPU)"
                if self.copy_bytes else "")  # fmt: skip
        return f"{self.weight_bytes / gb:.3f} GB of weights{self._per}{copy}"

    @property
    def _per(self) -> str:
        return "" if self.mesh is None else " per device"

    def _sum_text(self) -> str:
        """"= N GB" of the refusals; under a mesh whose devices share the capacity, the per-device sum times them."""
        gb = 1e9
        if self.sharing == 1:
            return f"= {self.needed / gb:.3f} GB{self._per}"
        each = self.weight_bytes + self.kv_bytes
        return f"= {each / gb:.3f} GB per device, x {self.sharing} devices sharing it = {self.needed / gb:.3f} GB"

    def _on(self) -> str:
        return "" if self.mesh is None else f" on each device of {self.mesh}"

    def refusal(self) -> str:
        """One line: what was asked, the arithmetic, what fits and how to fix it."""
        gb = 1e9
        fit = (f"at most {self.largest_batch} rows fit at this length: lower --batch, --max-new-tokens or the input "
               "tokens" if self.largest_batch else
               "not even one row fits at this length: lower --max-new-tokens or the input tokens")  # fmt: skip
        return (f"batch {self.batch} does not fit{self._on()}: {self.batch} rows x {self.kv_bytes_per_row / gb:.3f} GB "
                f"of KV cache{self._per} ({self.cache_len} positions per row) + {self._weights_text()} "
                f"{self._sum_text()}, above the {self.usable / gb:.3f} GB usable ({self.capacity / gb:.3f} GB "
                f"{self.where}, less {self.reserve:.0%} reserved for activations); {fit}")

    def slots_refusal(self) -> str:
        """`refusal` for the decode slots of `bench serve` (`batch` slots of `cache_len` positions each, the
        server's --max-length, plus the spare prefill row): one line naming --max-batch and --max-length."""
        gb = 1e9
        fit = (f"at most {self.largest_batch} slots fit at this length: lower --max-batch or --max-length"
               if self.largest_batch else
               "not even one slot fits at this length: lower --max-length")  # fmt: skip
        return (f"--max-batch {self.batch} does not fit{self._on()}: ({self.batch} slots + {self.spare_rows} "
                f"prefill row) x {self.kv_bytes_per_row / gb:.3f} GB of KV cache{self._per} ({self.cache_len} "
                f"positions per slot, --max-length) + {self._weights_text()} {self._sum_text()}, above the "
                f"{self.usable / gb:.3f} GB usable ({self.capacity / gb:.3f} GB {self.where}, less {self.reserve:.0%} "
                f"reserved for activations); {fit}")
