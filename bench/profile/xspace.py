"""The HLO modules stored inside an xprof trace (`.xplane.pb`), read without any protobuf package.

`jax.profiler.ProfileData` exposes a trace's planes, lines, events and stats, but not the HLO protos that the
profiler stores on the `/host:metadata` plane (one event metadata per compiled module, named `<module>(<program
id>)`, with a bytes stat named `Hlo Proto` holding a serialized `xla.HloProto`). Those protos are what say which
dtype a matrix product consumed and which `jax.named_scope` an op came from, so this module decodes the few fields
it needs straight from the protobuf wire format.

Field numbers (stable parts of public schemas, checked against traces written by jax 0.12 on CPU):
- `tsl/profiler/protobuf/xplane.proto`: XSpace.planes=1; XPlane.name=2, event_metadata=4 (map: key=1, value=2),
  stat_metadata=5 (map: key=1, value=2); XEventMetadata.name=2, stats=5; XStatMetadata.id=1, name=2;
  XStat.metadata_id=1, bytes_value=6.
- `xla/service/hlo.proto`: HloProto.hlo_module=1; HloModuleProto.name=1, entry_computation_name=2,
  computations=3, entry_computation_id=6; HloComputationProto.name=1, instructions=2, id=5, root_id=6;
  HloInstructionProto.name=1, opcode=2, shape=3, metadata=7, parameter_number=9, fusion_kind=11,
  custom_call_target=28, id=35, operand_ids=36, called_computation_ids=38.
- `xla/xla_data.proto`: ShapeProto.element_type=2, dimensions=3, tuple_shapes=4, layout=5;
  LayoutProto.minor_to_major=1, tiles=6, element_size_in_bits=7, memory_space=8; TileProto.dimensions=1;
  OpMetadata.op_type=1, op_name=2; PrimitiveType numbers in `_PRIMITIVE_TYPES` below. The parameter number, the
  dimensions and the layout were checked against traces written by jax 0.10.2 on a TPU v5e (2026-12-07), whose
  `XLA Ops` event names print the same shapes as HLO text (`u8[65536,4480]{1,0:T(8,128)(4,1)}`).

Beside the HLO, `event_metadata_stats` reads the stats a device plane stores on its event metadata (not on each
event, so `jax.profiler.ProfileData`'s event stats do not show them): on a TPU (jax 0.10.2, v5e) each `XLA Ops`
metadata carries `bytes_accessed` (bytes one run of the op reads and writes, from XLA's cost analysis),
`raw_bytes_accessed`, `shape_with_layout`, `hlo_category`, `flops`, `tf_op` and `source`. XStat value fields:
double_value=2, uint64_value=3, int64_value=4, str_value=5, bytes_value=6, ref_value=7 (the id of a stat
metadata whose name is the string); XEventMetadata.display_name=4.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

_METADATA_PLANE = "/host:metadata"
_HLO_PROTO_STAT = "Hlo Proto"

# xla.PrimitiveType -> the short dtype names HLO text uses.
_PRIMITIVE_TYPES = {
    1: "pred", 2: "s8", 3: "s16", 4: "s32", 5: "s64", 6: "u8", 7: "u16", 8: "u32", 9: "u64",
    10: "f16", 11: "f32", 12: "f64", 13: "tuple", 14: "opaque", 15: "c64", 16: "bf16", 17: "token",
    18: "c128", 19: "f8e5m2", 20: "f8e4m3fn", 21: "s4", 22: "u4", 23: "f8e4m3b11fnuz", 24: "f8e5m2fnuz",
    25: "f8e4m3fnuz", 26: "s2", 27: "u2", 28: "f8e4m3", 29: "f8e3m4", 30: "f4e2m1fn", 31: "f8e8m0fnu",
}


@dataclass(frozen=True)
class HloInstruction:
    """One HLO instruction as far as the profile analysis needs it.

    `dtype` is the element type of the result (the first tuple element for tuple results); `operand_dtypes` are the
    result dtypes of the operands, in order. `op_name` is the JAX op path from the instruction metadata, e.g.
    `jit(step)/attention/dot_general`: named scopes are its middle segments. `users` names the instructions of the
    same computation that take this one as an operand. `called` lists called computations (a fusion's fused
    computation, a while loop's body and condition). `shape` is the result shape as HLO text prints it, layout
    included (`u8[262144,4480]{1,0:T(8,128)(4,1)}`, a tuple as `(bf16[8]{0}, u32[])`; "" when unknown);
    `operands` names the operand instructions in order; `parameter_number` is set on `parameter` instructions.
    """

    name: str
    opcode: str
    dtype: str
    operand_dtypes: tuple[str, ...]
    op_name: str
    fusion_kind: str
    custom_call_target: str
    called: tuple[str, ...]
    users: tuple[str, ...]
    shape: str = ""
    operands: tuple[str, ...] = ()
    parameter_number: int | None = None


@dataclass(frozen=True)
class HloComputation:
    """A computation: its instructions in dependency order and the name of its root instruction."""

    name: str
    instructions: tuple[HloInstruction, ...]
    root: str


@dataclass(frozen=True)
class HloModule:
    """A compiled module: computations by name, and every instruction by name (names are unique per module).

    `entry` names the entry computation ("" when the proto does not say); `computation_of` maps an instruction
    to the computation holding it; `callers` maps a called computation to the first instruction calling it (a
    fused computation to its fusion)."""

    name: str
    computations: dict[str, HloComputation]
    instructions: dict[str, HloInstruction]
    entry: str = ""
    computation_of: dict[str, str] = field(default_factory=dict)
    callers: dict[str, str] = field(default_factory=dict)


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[i]
        i += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return result, i


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """Yield (field number, wire type, value) of one serialized message; values of length-delimited fields are bytes."""
    i, end = 0, len(buf)
    while i < end:
        key, i = _varint(buf, i)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, i = _varint(buf, i)
        elif wire_type == 1:
            value, i = buf[i : i + 8], i + 8
        elif wire_type == 2:
            length, i = _varint(buf, i)
            value, i = buf[i : i + length], i + length
        elif wire_type == 5:
            value, i = buf[i : i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire_type}")
        yield number, wire_type, value


def _ints(wire_type: int, value: int | bytes) -> list[int]:
    """A repeated integer field's values, packed (wire type 2) or not."""
    if wire_type == 0:
        return [value]  # type: ignore[list-item]
    out, i = [], 0
    while i < len(value):  # type: ignore[arg-type]
        v, i = _varint(value, i)  # type: ignore[arg-type]
        out.append(v)
    return out


def _text(value: int | bytes) -> str:
    return bytes(value).decode("utf-8", errors="replace")  # type: ignore[arg-type]


def _shape_dtype(buf: bytes) -> str:
    element_type, first_tuple_element = 0, None
    for number, _, value in _fields(buf):
        if number == 2:
            element_type = value  # type: ignore[assignment]
        elif number == 4 and first_tuple_element is None:
            first_tuple_element = value
    if element_type == 13 and first_tuple_element is not None:
        return _shape_dtype(first_tuple_element)  # type: ignore[arg-type]
    return _PRIMITIVE_TYPES.get(element_type, f"type{element_type}")


def _signed(value: int) -> int:
    """A varint read as int64 (negative numbers are ten-byte two's complement)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _layout_text(buf: bytes) -> str:
    """A LayoutProto as HLO text prints it: `{1,0:T(8,128)(4,1)E(4)S(1)}` (tiles, element bits, memory space)."""
    minor_to_major, tiles, bits, space = [], [], 0, 0
    for number, wire_type, value in _fields(buf):
        if number == 1:
            minor_to_major.extend(_ints(wire_type, value))
        elif number == 6:
            dims = [d for n, w, v in _fields(value) if n == 1 for d in _ints(w, v)]  # type: ignore[arg-type]
            tiles.append("(" + ",".join("*" if _signed(d) < 0 else str(d) for d in dims) + ")")
        elif number == 7:
            bits = value  # type: ignore[assignment]
        elif number == 8:
            space = value  # type: ignore[assignment]
    extra = ("T" + "".join(tiles) if tiles else "") + (f"E({bits})" if bits else "") + (f"S({space})" if space else "")
    if not minor_to_major and not extra:
        return ""  # a scalar without tiling: HLO text prints `f32[]`
    return "{" + ",".join(str(d) for d in minor_to_major) + (":" + extra if extra else "") + "}"


def _shape_text(buf: bytes) -> str:
    """A ShapeProto as HLO text prints it: `bf16[8,128]{1,0}`, `f32[]`, a tuple `(s32[], f32[4]{0})`."""
    element_type, dims, tuple_shapes, layout = 0, [], [], None
    for number, wire_type, value in _fields(buf):
        if number == 2:
            element_type = value  # type: ignore[assignment]
        elif number == 3:
            dims.extend(_ints(wire_type, value))
        elif number == 4:
            tuple_shapes.append(value)
        elif number == 5:
            layout = value
    if element_type == 13:
        return "(" + ", ".join(_shape_text(t) for t in tuple_shapes) + ")"  # type: ignore[arg-type]
    dtype = _PRIMITIVE_TYPES.get(element_type, f"type{element_type}")
    text = f"{dtype}[{','.join(str(_signed(d)) for d in dims)}]"
    return text + (_layout_text(layout) if layout is not None else "")  # type: ignore[arg-type]


def _parse_module(hlo_proto: bytes) -> HloModule | None:
    module_bytes = next((v for n, _, v in _fields(hlo_proto) if n == 1), None)
    if module_bytes is None:
        return None
    name, raw_computations, entry_name, entry_id = "", [], "", None
    for number, _, value in _fields(module_bytes):  # type: ignore[arg-type]
        if number == 1:
            name = _text(value)
        elif number == 2:
            entry_name = _text(value)
        elif number == 3:
            raw_computations.append(value)
        elif number == 6:
            entry_id = value
    # First pass: ids -> names and dtypes, so operands and called computations can be resolved by name.
    raw: list[tuple[str, int, int, list[dict]]] = []
    computation_names: dict[int, str] = {}
    dtype_by_id: dict[int, str] = {}
    name_by_global_id: dict[int, str] = {}
    for comp in raw_computations:
        comp_name, comp_id, root_id, instrs = _parse_computation(comp)
        computation_names[comp_id] = comp_name
        for ins in instrs:
            dtype_by_id[ins["id"]] = ins["dtype"]
            name_by_global_id[ins["id"]] = ins["name"]
        raw.append((comp_name, comp_id, root_id, instrs))
    computations: dict[str, HloComputation] = {}
    instructions: dict[str, HloInstruction] = {}
    computation_of: dict[str, str] = {}
    callers: dict[str, str] = {}
    for comp_name, _, root_id, instrs in raw:
        built = _built_instructions(instrs, computation_names, dtype_by_id, name_by_global_id)
        for hi in built:
            instructions[hi.name] = hi
            computation_of[hi.name] = comp_name
            for called in hi.called:
                callers.setdefault(called, hi.name)
        root = next((hi.name for hi, ins in zip(reversed(built), reversed(instrs)) if ins["id"] == root_id), "")
        computations[comp_name] = HloComputation(comp_name, tuple(built), root or (built[-1].name if built else ""))
    entry = computation_names.get(entry_id, "") if entry_id is not None else ""
    return HloModule(name, computations, instructions, entry or entry_name, computation_of, callers)


def _parse_computation(comp: bytes) -> tuple[str, int, int, list[dict]]:
    """One HloComputationProto: (its name, id, root instruction id, its instructions as `_parse_instruction`
    gives them, in order)."""
    comp_name, comp_id, root_id, instrs = "", 0, 0, []
    for number, _wire_type, value in _fields(comp):
        if number == 1:
            comp_name = _text(value)
        elif number == 5:
            comp_id = value  # type: ignore[assignment]
        elif number == 6:
            root_id = value  # type: ignore[assignment]
        elif number == 2:
            instrs.append(_parse_instruction(value))  # type: ignore[arg-type]
    return comp_name, comp_id, root_id, instrs


def _built_instructions(instrs: list[dict], computation_names: dict[int, str], dtype_by_id: dict[int, str],
                        name_by_global_id: dict[int, str]) -> list[HloInstruction]:  # fmt: skip
    """One computation's instructions as `HloInstruction`s, in order: operands, their dtypes and the called
    computations resolved by id across the module (`?` where unknown), each instruction's users within the
    computation (in order, each once per user)."""
    name_by_id = {ins["id"]: ins["name"] for ins in instrs}
    users: dict[str, list[str]] = {}
    for ins in instrs:
        for operand in dict.fromkeys(ins["operands"]):
            if operand in name_by_id:
                users.setdefault(name_by_id[operand], []).append(ins["name"])
    return [
        HloInstruction(
            name=ins["name"],
            opcode=ins["opcode"],
            dtype=ins["dtype"],
            operand_dtypes=tuple(dtype_by_id.get(i, "?") for i in ins["operands"]),
            op_name=ins["op_name"],
            fusion_kind=ins["fusion_kind"],
            custom_call_target=ins["target"],
            called=tuple(computation_names.get(c, "?") for c in ins["called"]),
            users=tuple(users.get(ins["name"], ())),
            shape=ins["shape"],
            operands=tuple(name_by_global_id.get(i, "?") for i in ins["operands"]),
            parameter_number=ins["param"] if ins["opcode"] == "parameter" else None,
        )
        for ins in instrs
    ]


def _parse_instruction(buf: bytes) -> dict:
    ins = {"name": "", "opcode": "", "dtype": "?", "op_name": "", "fusion_kind": "", "target": "",
           "id": -1, "operands": [], "called": [], "shape": "", "param": 0}
    for number, wire_type, value in _fields(buf):
        if number == 1:
            ins["name"] = _text(value)
        elif number == 2:
            ins["opcode"] = _text(value)
        elif number == 3:
            ins["dtype"] = _shape_dtype(value)  # type: ignore[arg-type]
            ins["shape"] = _shape_text(value)  # type: ignore[arg-type]
        elif number == 7:
            ins["op_name"] = next((_text(v) for n, _, v in _fields(value) if n == 2), "")  # type: ignore[arg-type]
        elif number == 9:
            ins["param"] = value
        elif number == 11:
            ins["fusion_kind"] = _text(value)
        elif number == 28:
            ins["target"] = _text(value)
        elif number == 35:
            ins["id"] = value
        elif number == 36:
            ins["operands"].extend(_ints(wire_type, value))
        elif number == 38:
            ins["called"].extend(_ints(wire_type, value))
    return ins


def _planes(xspace: bytes) -> Iterator[tuple[str, list[bytes], dict[int, str]]]:
    """Each XPlane (XSpace field 1) of a serialized XSpace: its name (field 2), its event-metadata map entries
    (field 4, undecoded) and its stat names by id (field 5). Raises ValueError when the bytes are not protobuf."""
    for number, _, plane in _fields(xspace):
        if number != 1:
            continue
        plane_name, event_metadata, stat_names = "", [], {}
        for p_number, _, value in _fields(plane):  # type: ignore[arg-type]
            if p_number == 2:
                plane_name = _text(value)
            elif p_number == 4:
                event_metadata.append(value)
            elif p_number == 5:
                entry = next((v for n, _, v in _fields(value) if n == 2), b"")  # type: ignore[arg-type]
                fields = {n: v for n, _, v in _fields(entry)}  # type: ignore[arg-type]
                stat_names[fields.get(1, 0)] = _text(fields.get(2, b""))  # type: ignore[index]
        yield plane_name, event_metadata, stat_names  # type: ignore[misc]


def _metadata_stats(entry: bytes) -> tuple[str, list[dict[int, Any]]]:
    """One event-metadata map entry of a plane: the XEventMetadata's name (field 2) and its XStats (field 5), each
    as {field number: raw value}."""
    meta = next((v for n, _, v in _fields(entry) if n == 2), b"")
    event_name, stats = "", []
    for m_number, _, m_value in _fields(meta):  # type: ignore[arg-type]
        if m_number == 2:
            event_name = _text(m_value)
        elif m_number == 5:
            stats.append({n: v for n, _, v in _fields(m_value)})  # type: ignore[arg-type]
    return event_name, stats


def hlo_modules(xspace: bytes) -> dict[str, HloModule]:
    """The HLO modules a serialized XSpace carries, keyed by its metadata event name, `<module>(<program id>)`.

    Returns an empty dict when the trace holds no HLO (e.g. captured with `enable_hlo_proto` off). Raises
    ValueError when the bytes are not a protobuf message at all.
    """
    modules: dict[str, HloModule] = {}
    for plane_name, event_metadata, stat_names in _planes(xspace):
        if plane_name != _METADATA_PLANE:
            continue
        for entry in event_metadata:
            event_name, stats = _metadata_stats(entry)
            for stat in stats:
                if stat_names.get(stat.get(1, -1)) == _HLO_PROTO_STAT and 6 in stat:  # type: ignore[arg-type]
                    module = _parse_module(bytes(stat[6]))  # type: ignore[arg-type]
                    if module is not None:
                        modules[event_name] = module
    return modules


def _stat_value(stat: dict[int, Any], stat_names: dict[int, str]) -> Any:
    """One XStat's value: a float (double, fixed64), an int (uint64 / int64), a str (str or ref value), bytes."""
    if 2 in stat:
        return struct.unpack("<d", bytes(stat[2]))[0]
    if 3 in stat:
        return stat[3]
    if 4 in stat:
        return _signed(stat[4])
    if 5 in stat:
        return _text(stat[5])
    if 6 in stat:
        return bytes(stat[6])
    if 7 in stat:
        return stat_names.get(stat[7], "")
    return None


def event_metadata_stats(xspace: bytes, plane_prefix: str = "/device:") -> dict[str, dict[str, dict[str, Any]]]:
    """{plane name: {event metadata name: {stat name: value}}} for the planes whose name starts with
    `plane_prefix`, keeping only metadata that carry stats (a TPU's `XLA Ops` metadata: `bytes_accessed`, ...;
    see the module doc). An event's name is its metadata's name, so an event finds its stats by plane and name.
    Raises ValueError when the bytes are not a protobuf message."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for plane_name, event_metadata, stat_names in _planes(xspace):
        if not plane_name.startswith(plane_prefix):
            continue
        by_name: dict[str, dict[str, Any]] = {}
        for entry in event_metadata:
            event_name, stats = _metadata_stats(entry)
            values = {stat_names.get(stat.get(1, -1), "?"): _stat_value(stat, stat_names)  # type: ignore[arg-type]
                      for stat in stats}  # fmt: skip
            if values:
                by_name[event_name] = values
        out[plane_name] = by_name
    return out
