"""The quantization option set (`--quant`) and the layout it gives each parameter, as pure arithmetic.

No jax and no numpy (like `model.config` and `model.accounting`), so the byte accounting, the report and the CLI
can use the same facts as the quantizer (`model.quant`): which leaf is quantized, to how many bits, with which
scale blocks, and how many bytes that takes. Issue 14 defines the options:

- `ple8`, `ple4`: the per-layer-embedding table `ple_embed_VX` in 8 or 4 bits, one scale per (row, 256 values).
- `int8_lm_head`: a separate int8 copy of the tied table `embed_VD` for the output projection, one scale per
  vocabulary row; the input embedding keeps its dtype for the lookup.
- `w8`: the layer projections (`LAYER_PROJECTIONS`, and the experts of `EXPERT_PROJECTIONS`) in int8, one scale per
  output channel.
- `w4` (or `w4:GROUP`): the same projections in int4, one scale per GROUP values along the contraction axis
  (default 128).

A layout (`QuantLayout`) is a bit width and a scale block per axis: block[i] consecutive indices along axis i share
one scale (1: every index has its own; the axis length: one scale for the whole axis). A block that does not
divide its axis leaves a short last block (ceil). Values are symmetric integers (int8 in [-127, 127], int4 in
[-7, 7]); int4 values are stored two per byte along the last axis (a last axis of odd length gets one pad nibble).

Storage of the value bytes (`value_shape`, `value_dtype`): one array of int8 (8 bits) or uint8 (4 bits) in the
array's shape, except for the tables in `WORD_TABLES`, whose value bytes are held four to a uint32 word along the
last axis (`QuantLayout.words`), so that XLA:TPU reads a 32-bit array. Each layout is decided here, once, by
`leaf_layout` for the platform the parameters are placed on; the loaders (`model.checkpoint.load_params`,
`model.quant.quantize_params`) quantize straight into it before placing the leaf on the device, so no program
lays a table out anew.
"""

from __future__ import annotations

import dataclasses
import math

from model.errors import QuantError

Shape = tuple[int, ...]

QUANT_OPTIONS = ("int8_lm_head", "ple4", "ple8", "w4", "w8")
"""Every option name `--quant` accepts, sorted (the canonical order)."""

PLE_GROUP = 256
"""Values of a PLE-table row that share one scale (issue 14: one scale per (row, 256-value group))."""

DEFAULT_W4_GROUP = 128
"""Contraction-axis values that share one scale under `w4` unless `w4:GROUP` says otherwise."""

LM_HEAD = "lm_head_VD"
"""The field name of the int8 output-projection copy (`int8_lm_head`): [V, D], beside the tied `embed_VD`."""

LAYER_PROJECTIONS = {
    "qkv_DX": (0,), "o_DX": (1,), "gate_up_DX": (0,), "down_DF": (1,), "ple_gate_PD": (1,), "ple_proj_PD": (0,),
}  # fmt: skip
"""`model.params.LayerParams` fields (the compute layout, `model.accounting.compute_layer_shapes`) quantized by
`w8` / `w4` -> their contraction axes: qkv_DX [D, X] contracts D (axis 0); o_DX [D, N H] contracts N H (axis 1, the
output-major layout). Fused leaves quantize per output channel exactly as their parts would. The global
`ple_proj_DX` is not a layer projection and stays dense, as do the norms and layer scalars."""

EXPERT_PROJECTIONS = {"experts_gate_up_EDX": (1,), "experts_down_EDF": (2,)}
"""The expert block's weights (26B-A4B; `model.accounting.expert_shapes`) quantized by `w8` / `w4` like the layer
projections -> their contraction axes: experts_gate_up_EDX [E, D, 2I] contracts D, experts_down_EDF [E, D, I]
contracts I. The expert axis E is never contracted, so every expert has its own scales (w8: one per (expert,
output channel); w4: one per (expert, GROUP contraction values, output channel)) and one expert's slice is a
quantized 2-D weight of its own (`model.moe`). Kept apart from `LAYER_PROJECTIONS`, whose 2-D leaves the W4A16
kernels tile; the router (router_DE) stays dense, as do the scales and norms."""

WORD_TABLES: dict[str, frozenset[str] | None] = {"ple_embed_VX": None, LM_HEAD: frozenset({"tpu"}),
                                                 **dict.fromkeys(EXPERT_PROJECTIONS, frozenset({"tpu"}))}
"""Quantized tables whose value bytes are stored in uint32 words (`QuantLayout.words`) -> the platforms (jax
backend names) where, None for every platform: `stores_words` applies it.

- The PLE table, on every platform: a decode step reads it by a row gather of one row per token
  (`model.quant.take_rows`), which reads a row of words and unpacks only that row. On CPU that costs about what
  the bytes did (jit of one row of a [65536, 8960] table, jax 0.12, 2 shared cores, fastest of 200 calls:
  21-26 us as words against 17-25 us as bytes, at 4 and 8 bits), against tens of ms per decode step.
- The expert weights (`EXPERT_PROJECTIONS`), on a TPU only, by the same finding (not measured for them yet:
  scripts/probes/moe_forms.py times both storages): a decode step slices one expert's [D, X] values out of the
  [E, D, X] array (`model.moe.expert_weight`) and multiplies them, and an 8-bit parameter sliced or multiplied was
  copied whole into another tiling in every call, which for 26B-A4B's experts would be gigabytes per layer.
  Their slices are multiplied plane by plane there (`model.quant.matmul`), elsewhere as the bytes they hold.
- The int8 head copy, on a TPU only: it is multiplied whole (`model.quant.matmul` multiplies a word table plane
  by plane there). XLA:CPU expands a reinterpretation of words as bytes into shifts and materializes the whole
  int8 table, and ran that and every plane form tried 20-40x slower than its multiply-and-sum over the int8
  bytes (one row times [65536, 1536], jax 0.12, 2 shared cores, fastest calls: 43-60 ms as bytes, 0.95-2.1 s
  as words), so CPU (and GPU, not measured) keep the int8 bytes, which their products read in place.

Why words (issue 43; TPU v5e, jax 0.10.2, the lead's probes): XLA:TPU tiles 8-bit arrays (32, 128) and 32-bit
ones (8, 128), and both the row gather and the product of an 8-bit parameter wanted the latter: the program
copied the whole parameter into it in every call. E2B `--quant ple4,int8_lm_head`: the uint8 PLE table [262144,
4480] (1.17 GB) was copied in each decode step, 3.57 ms of a 9.3 ms step; gathering one row took 4.26 ms per call
as uint8 and 0.57 ms (the call floor) as uint32 words. The s8 head [262144, 1536] was copied too (1.39 ms per
product); as words multiplied plane by plane, 1.185 ms with no copy (about 690 GB/s above the 0.6 ms floor)."""

WORD_BYTES = 4
"""Value bytes per word of a `QuantLayout.words` table (uint32)."""

_EXPECTED = "a comma-separated set of int8_lm_head, ple4, ple8, w4[:GROUP], w8 (or none)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantSpec:
    """A validated quantization option set: `names` (a subset of `QUANT_OPTIONS`) and the w4 group size.

    Raises QuantError (one line) for an unknown name, ple8 with ple4, w8 with w4, or a group size below 1.
    Build one from text with `parse_quant`; `canonical` is its text form for manifests and build ids.
    """

    names: frozenset[str] = frozenset()
    w4_group: int = DEFAULT_W4_GROUP

    def __post_init__(self) -> None:
        unknown = sorted(set(self.names) - set(QUANT_OPTIONS))
        if unknown:
            given = ",".join(sorted(self.names))
            raise QuantError(f"--quant {given}: unknown option {unknown[0]!r}; expected {_EXPECTED}")
        _check_combination(self.names, self.canonical)
        if not isinstance(self.w4_group, int) or isinstance(self.w4_group, bool) or self.w4_group < 1:
            raise QuantError(f"--quant w4:{self.w4_group}: the group size must be a whole number >= 1, e.g. w4:128")

    @property
    def canonical(self) -> str:
        """Sorted names joined by commas, w4 with its group (`w4:128`); "none" for the empty set."""
        parts = [f"w4:{self.w4_group}" if n == "w4" else n for n in sorted(self.names)]
        return ",".join(parts) or "none"

    @property
    def ple_bits(self) -> int | None:
        """Bits of the PLE table's values (8, 4) or None when it stays dense."""
        return 8 if "ple8" in self.names else 4 if "ple4" in self.names else None

    @property
    def layer_bits(self) -> int | None:
        """Bits of the layer projections' values (8, 4) or None when they stay dense."""
        return 8 if "w8" in self.names else 4 if "w4" in self.names else None

    @property
    def int8_lm_head(self) -> bool:
        """True when the output projection reads a separate int8 copy of the tied table."""
        return "int8_lm_head" in self.names


def _check_combination(names: frozenset[str] | set[str], shown: str) -> None:
    """QuantError (naming `shown`, the text received) when `names` holds two options for the same weights."""
    for a, b, what in (("ple8", "ple4", "the PLE table"), ("w8", "w4", "the layer projections")):
        if {a, b} <= names:
            raise QuantError(f"--quant {shown}: {a} and {b} both quantize {what}; "
                             f"expected at most one of them (drop {a} or {b})")  # fmt: skip


NO_QUANT = QuantSpec()
"""The empty option set: every parameter dense."""


def parse_quant(text: str | None) -> QuantSpec:
    """`--quant` text -> `QuantSpec`: e.g. "ple4,int8_lm_head", "w4:64", "none" (also None or ""): no options.

    Names are case-sensitive and comma-separated (spaces around them are ignored). Raises QuantError naming the
    text received, what is expected and the fix for an unknown name, an empty entry, a duplicate, a group size on
    anything but w4 or one that is not a whole number >= 1, ple8 with ple4, w8 with w4, and none with anything.
    """
    if text is None or text.strip() in ("", "none"):
        return NO_QUANT
    entries = [e.strip() for e in text.split(",")]
    if "" in entries:
        raise QuantError(f"--quant {text}: has an empty entry; expected {_EXPECTED}")
    names: list[str] = []
    group = DEFAULT_W4_GROUP
    for entry in entries:
        name, _, value = entry.partition(":")
        if name == "none":
            raise QuantError(f"--quant {text}: 'none' cannot be combined with options; expected either none or options")
        if name not in QUANT_OPTIONS:
            raise QuantError(f"--quant {text}: unknown option {name!r}; expected {_EXPECTED}")
        if value or entry.endswith(":"):
            if name != "w4":
                raise QuantError(f"--quant {text}: {entry!r} has a group size; expected one only on w4 "
                                 f"(w4:GROUP), e.g. {name}")
            if not (value.isascii() and value.isdigit()) or int(value) < 1:
                raise QuantError(f"--quant {text}: group size {value!r} of w4; expected a whole number >= 1, "
                                 "e.g. w4:128")
            group = int(value)
        if name in names:
            raise QuantError(f"--quant {text}: {name} is given twice; expected each option at most once")
        names.append(name)
    _check_combination(set(names), text)
    return QuantSpec(names=frozenset(names), w4_group=group)


# ---- layouts ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantLayout:
    """How one array is quantized: `bits` (8 or 4) and `block`, one entry per axis (see the module docstring);
    `words`: the value bytes held in uint32 words along the last axis (`WORD_TABLES`), little-endian (byte k of a
    row in bits 8 (k mod 4) .. 8 (k mod 4) + 7 of word k // 4), a row of bytes padded with zero bytes to a whole
    word (`value_shape`; the padding is stored and counted)."""

    bits: int
    block: Shape
    words: bool = False


def rows_block(shape: Shape, group: int) -> Shape:
    """Scale block of a table quantized by rows: one scale per (row, `group` values along the last axis); a
    group longer than the row is the whole row. E.g. (262144, 8960), 256 -> (1, 256)."""
    return (1,) * (len(shape) - 1) + (min(group, shape[-1]),)


def channels_block(shape: Shape, contract: tuple[int, ...], group: int | None) -> Shape:
    """Scale block of a weight quantized by output channel: `contract` are the contraction axes.

    group None (w8): one scale per output channel (the block covers every contraction axis whole).
    group g (w4): groups of g along the last contraction axis (min(g, its length)), and every index of the other
    contraction axes its own scales (a [N, H, D] weight contracting N and H: one per (head, g values of H, output)).
    """
    last = max(contract)
    block = []
    for i, n in enumerate(shape):
        if i not in contract:
            block.append(1)
        elif group is None:
            block.append(n)
        else:
            block.append(min(group, n) if i == last else 1)
    return tuple(block)


def stores_words(field: str, shape: Shape, bits: int, platform: str | None) -> bool:
    """Whether the quantized `field` of `shape` at `bits` is stored in uint32 words on `platform` (a jax backend
    name: "cpu", "gpu", "tpu"; None: no platform in particular, as the byte accounting asks): `WORD_TABLES`.
    A table stored in words on some platforms only is stored so there only when its rows are whole words, so
    the padding of a row (stored and counted) is the same on every platform and `model.accounting` is exact on
    all of them without knowing the platform (Gemma 4 heads: 1536 or 2560 bytes a row, no padding)."""
    if field not in WORD_TABLES:
        return False
    where = WORD_TABLES[field]
    return where is None or (platform in where and row_bytes(shape[-1], bits) % WORD_BYTES == 0)


def leaf_layout(field: str, shape: Shape, spec: QuantSpec, platform: str | None = None) -> QuantLayout | None:
    """The layout `spec` gives the parameter `field` (a `model.params` field name, or `LM_HEAD` for the int8
    head copy) of `shape` placed on `platform` (a jax backend name; None: any, for the byte accounting, which is
    the same on every platform); None when it stays dense. The one place that says which leaf is quantized how
    and stored how (`stores_words`)."""
    if field == "ple_embed_VX" and spec.ple_bits is not None:
        return QuantLayout(bits=spec.ple_bits, block=rows_block(shape, PLE_GROUP),
                           words=stores_words(field, shape, spec.ple_bits, platform))  # fmt: skip
    if field == LM_HEAD:
        if not spec.int8_lm_head:
            return None
        return QuantLayout(bits=8, block=rows_block(shape, shape[-1]), words=stores_words(field, shape, 8, platform))
    if (field in LAYER_PROJECTIONS or field in EXPERT_PROJECTIONS) and spec.layer_bits is not None:
        contract = LAYER_PROJECTIONS.get(field) or EXPERT_PROJECTIONS[field]
        group = None if spec.layer_bits == 8 else spec.w4_group
        return QuantLayout(bits=spec.layer_bits, block=channels_block(shape, contract, group),
                           words=stores_words(field, shape, spec.layer_bits, platform))  # fmt: skip
    return None


def scale_shape(shape: Shape, block: Shape) -> Shape:
    """Shape of the scales of an array of `shape` with scale `block`: ceil(shape[i] / block[i]) per axis."""
    return tuple(-(-n // b) for n, b in zip(shape, block, strict=True))


def row_bytes(n: int, bits: int) -> int:
    """Bytes of a row of `n` values packed at `bits`: n at 8 bits; ceil(n / 2) at 4 (an odd row ends with a pad
    nibble)."""
    assert bits in (8, 4), bits
    return n if bits == 8 else -(-n // 2)


def value_shape(shape: Shape, bits: int, words: bool = False) -> Shape:
    """Shape of the stored values of an array of logical `shape`: the packed bytes [*shape[:-1], row_bytes]; with
    `words`, the uint32 words holding them [*shape[:-1], ceil(row_bytes / WORD_BYTES)]."""
    n = row_bytes(shape[-1], bits)
    return (*shape[:-1], -(-n // WORD_BYTES) if words else n)


def value_dtype(bits: int, words: bool = False) -> str:
    """Name of the stored values' dtype: "uint32" with `words`, else "int8" (8 bits) or "uint8" (4 bits)."""
    return "uint32" if words else "int8" if bits == 8 else "uint8"


def packed_value_bytes(shape: Shape, bits: int, words: bool = False) -> int:
    """Bytes of the stored integer values (`value_shape`): 1 per value at 8 bits; at 4 bits two values per byte
    along the last axis; with `words`, each row rounded up to whole uint32 words (the padding counts: it is
    stored and a row gather reads it)."""
    stored = value_shape(shape, bits, words)
    return math.prod(stored) * (WORD_BYTES if words else 1)


def quantized_bytes(shape: Shape, layout: QuantLayout, scale_itemsize: int) -> tuple[int, int]:
    """(bytes, scale count) of an array of `shape` stored in `layout`: stored values (`packed_value_bytes`) plus
    scales at `scale_itemsize` bytes each (2 for bfloat16 / float16 scales, 4 for float32)."""
    scales = math.prod(scale_shape(shape, layout.block))
    return packed_value_bytes(shape, layout.bits, layout.words) + scales * scale_itemsize, scales
