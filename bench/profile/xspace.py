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
- `xla/service/hlo.proto`: HloProto.hlo_module=1; HloModuleProto.name=1, computations=3;
  HloComputationProto.name=1, instructions=2, id=5, root_id=6; HloInstructionProto.name=1, opcode=2, shape=3,
  metadata=7, fusion_kind=11, custom_call_target=28, id=35, operand_ids=36, called_computation_ids=38.
- `xla/xla_data.proto`: ShapeProto.element_type=2, tuple_shapes=4; OpMetadata.op_type=1, op_name=2;
  PrimitiveType numbers in `_PRIMITIVE_TYPES` below.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

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
    computation, a while loop's body and condition).
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


@dataclass(frozen=True)
class HloComputation:
    """A computation: its instructions in dependency order and the name of its root instruction."""

    name: str
    instructions: tuple[HloInstruction, ...]
    root: str


@dataclass(frozen=True)
class HloModule:
    """A compiled module: computations by name, and every instruction by name (names are unique per module)."""

    name: str
    computations: dict[str, HloComputation]
    instructions: dict[str, HloInstruction]


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


def _parse_module(hlo_proto: bytes) -> HloModule | None:
    module_bytes = next((v for n, _, v in _fields(hlo_proto) if n == 1), None)
    if module_bytes is None:
        return None
    name, raw_computations = "", []
    for number, _, value in _fields(module_bytes):  # type: ignore[arg-type]
        if number == 1:
            name = _text(value)
        elif number == 3:
            raw_computations.append(value)
    # First pass: ids -> names and dtypes, so operands and called computations can be resolved by name.
    raw: list[tuple[str, int, int, list[dict]]] = []
    computation_names: dict[int, str] = {}
    dtype_by_id: dict[int, str] = {}
    for comp in raw_computations:
        comp_name, comp_id, root_id, instrs = "", 0, 0, []
        for number, wire_type, value in _fields(comp):  # type: ignore[arg-type]
            if number == 1:
                comp_name = _text(value)
            elif number == 5:
                comp_id = value  # type: ignore[assignment]
            elif number == 6:
                root_id = value  # type: ignore[assignment]
            elif number == 2:
                instrs.append(_parse_instruction(value))  # type: ignore[arg-type]
        computation_names[comp_id] = comp_name
        for ins in instrs:
            dtype_by_id[ins["id"]] = ins["dtype"]
        raw.append((comp_name, comp_id, root_id, instrs))
    computations: dict[str, HloComputation] = {}
    instructions: dict[str, HloInstruction] = {}
    for comp_name, _, root_id, instrs in raw:
        built, root = [], ""
        name_by_id = {ins["id"]: ins["name"] for ins in instrs}
        users: dict[str, list[str]] = {}
        for ins in instrs:
            for operand in dict.fromkeys(ins["operands"]):
                if operand in name_by_id:
                    users.setdefault(name_by_id[operand], []).append(ins["name"])
        for ins in instrs:
            hi = HloInstruction(
                name=ins["name"],
                opcode=ins["opcode"],
                dtype=ins["dtype"],
                operand_dtypes=tuple(dtype_by_id.get(i, "?") for i in ins["operands"]),
                op_name=ins["op_name"],
                fusion_kind=ins["fusion_kind"],
                custom_call_target=ins["target"],
                called=tuple(computation_names.get(c, "?") for c in ins["called"]),
                users=tuple(users.get(ins["name"], ())),
            )
            built.append(hi)
            instructions[hi.name] = hi
            if ins["id"] == root_id:
                root = hi.name
        computations[comp_name] = HloComputation(comp_name, tuple(built), root or (built[-1].name if built else ""))
    return HloModule(name, computations, instructions)


def _parse_instruction(buf: bytes) -> dict:
    ins = {"name": "", "opcode": "", "dtype": "?", "op_name": "", "fusion_kind": "", "target": "",
           "id": -1, "operands": [], "called": []}
    for number, wire_type, value in _fields(buf):
        if number == 1:
            ins["name"] = _text(value)
        elif number == 2:
            ins["opcode"] = _text(value)
        elif number == 3:
            ins["dtype"] = _shape_dtype(value)  # type: ignore[arg-type]
        elif number == 7:
            ins["op_name"] = next((_text(v) for n, _, v in _fields(value) if n == 2), "")  # type: ignore[arg-type]
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


def hlo_modules(xspace: bytes) -> dict[str, HloModule]:
    """The HLO modules a serialized XSpace carries, keyed by its metadata event name, `<module>(<program id>)`.

    Returns an empty dict when the trace holds no HLO (e.g. captured with `enable_hlo_proto` off). Raises
    ValueError when the bytes are not a protobuf message at all.
    """
    modules: dict[str, HloModule] = {}
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
                sid, sname = 0, ""
                for s_number, _, s_value in _fields(entry):  # type: ignore[arg-type]
                    if s_number == 1:
                        sid = s_value  # type: ignore[assignment]
                    elif s_number == 2:
                        sname = _text(s_value)
                stat_names[sid] = sname
        if plane_name != _METADATA_PLANE:
            continue
        for entry in event_metadata:
            meta = next((v for n, _, v in _fields(entry) if n == 2), b"")  # type: ignore[arg-type]
            event_name, protos = "", []
            for m_number, _, m_value in _fields(meta):  # type: ignore[arg-type]
                if m_number == 2:
                    event_name = _text(m_value)
                elif m_number == 5:
                    stat = dict((n, v) for n, _, v in _fields(m_value))  # type: ignore[arg-type]
                    if stat_names.get(stat.get(1, -1)) == _HLO_PROTO_STAT and 6 in stat:  # type: ignore[arg-type]
                        protos.append(stat[6])
            for proto in protos:
                module = _parse_module(bytes(proto))  # type: ignore[arg-type]
                if module is not None:
                    modules[event_name] = module
    return modules
