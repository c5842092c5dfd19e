"""The quantization option set (`--quant`) and the layout it gives each parameter, as pure arithmetic.

No jax and no numpy (like `model.config` and `model.accounting`), so the byte accounting, the report and the CLI
can use the same facts as the quantizer (`model.quant`): which leaf is quantized, to how many bits, with which
scale blocks, and how many bytes that takes. Issue 14 defines the options:

- `ple8`, `ple4`: the per-layer-embedding table `ple_embed_VX` in 8 or 4 bits, one scale per (row, 256 values).
- `int8_lm_head`: a separate int8 copy of the tied table `embed_VD` for the output projection, one scale per
  vocabulary row; the input embedding keeps its dtype for the lookup.
- `w8`: the layer projections (`LAYER_PROJECTIONS`) in int8, one scale per output channel.
- `w4` (or `w4:GROUP`): the same projections in int4, one scale per GROUP values along the contraction axis
  (default 128).

A layout (`QuantLayout`) is a bit width and a scale block per axis: block[i] consecutive indices along axis i share
one scale (1: every index has its own; the axis length: one scale for the whole axis). A block that does not
divide its axis leaves a short last block (ceil). Values are symmetric integers (int8 in [-127, 127], int4 in
[-7, 7]); int4 values are stored two per byte along the last axis (a last axis of odd length gets one pad nibble).
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
    """How one array is quantized: `bits` (8 or 4) and `block`, one entry per axis (see the module docstring)."""

    bits: int
    block: Shape


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


def leaf_layout(field: str, shape: Shape, spec: QuantSpec) -> QuantLayout | None:
    """The layout `spec` gives the parameter `field` (a `model.params` field name, or `LM_HEAD` for the int8
    head copy) of `shape`; None when it stays dense. The one place that says which leaf is quantized how."""
    if field == "ple_embed_VX" and spec.ple_bits is not None:
        return QuantLayout(bits=spec.ple_bits, block=rows_block(shape, PLE_GROUP))
    if field == LM_HEAD:
        return QuantLayout(bits=8, block=rows_block(shape, shape[-1])) if spec.int8_lm_head else None
    if field in LAYER_PROJECTIONS and spec.layer_bits is not None:
        contract = LAYER_PROJECTIONS[field]
        group = None if spec.layer_bits == 8 else spec.w4_group
        return QuantLayout(bits=spec.layer_bits, block=channels_block(shape, contract, group))
    return None


def scale_shape(shape: Shape, block: Shape) -> Shape:
    """Shape of the scales of an array of `shape` with scale `block`: ceil(shape[i] / block[i]) per axis."""
    return tuple(-(-n // b) for n, b in zip(shape, block, strict=True))


def packed_value_bytes(shape: Shape, bits: int) -> int:
    """Bytes of the integer values: 1 per value at 8 bits; at 4 bits two values per byte along the last axis,
    ceil(last / 2) bytes per row (an odd row ends with a pad nibble)."""
    if bits == 8:
        return math.prod(shape)
    assert bits == 4, bits
    return math.prod(shape[:-1]) * -(-shape[-1] // 2)


def quantized_bytes(shape: Shape, layout: QuantLayout, scale_itemsize: int) -> tuple[int, int]:
    """(bytes, scale count) of an array of `shape` stored in `layout`: packed values plus scales at
    `scale_itemsize` bytes each (2 for bfloat16 / float16 scales, 4 for float32)."""
    scales = math.prod(scale_shape(shape, layout.block))
    return packed_value_bytes(shape, layout.bits) + scales * scale_itemsize, scales
