"""What one HLO op moves: its text, its bytes from shapes, and whether it rewrites a parameter of the program
(docs/method.md, "Profiles"; docs/commands/profile.md, "Findings"). Pure functions of HLO text and `bench.profile.xspace`'s
parsed protos: no jax, no trace reading.

- `parse_shape` / `shape_bytes`: an HLO shape's text (`u8[262144,4480]{1,0:T(8,128)(4,1)}`, tuples
  `(bf16[8]{0}, u32[])`) -> its arrays, and the bytes they hold: elements x the dtype's bits / 8, rounded up per
  array (a layout's `E(n)` gives the element's bits where it says so). Tiling padding is not counted.
- `parse_instruction_text`: a TPU `XLA Ops` event's name, the instruction's HLO text
  (`%copy.191 = u8[...]{...} copy(u8[...]{...} %param.3)`) -> its name, shape, opcode and operands.
- `instruction_text`: the same text built from a parsed proto (the CPU and GPU traces do not print it).
- `bytes_from_hlo`: the bytes one run of an op reads and writes, from its operand and result shapes. An operand is
  read whole, except where the op reads only a part: the piece a slice, dynamic-slice or gather takes (at top
  level or inside a fusion: a fused parameter used only through them), nothing of the buffer a
  dynamic-update-slice updates in place (its written bytes are the update's). Control flow (while, call,
  conditional) has no bytes from shapes (None): its inner ops are not traced on CPU. XLA's cost analysis, where a
  trace carries it (a TPU's `bytes_accessed`), is preferred by the analysis; these are the fallback and say so.
- `parameter_rewrite`: whether an op copies, transposes, lays out anew or converts a parameter of the entry
  computation (a weight, as the engine passes its weights) every time it runs, rather than reading it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bench.profile.xspace import HloInstruction, HloModule

DTYPE_BITS = {
    "pred": 8, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "s32": 32, "u32": 32,
    "s64": 64, "u64": 64, "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128, "f4e2m1fn": 4,
    "f8e5m2": 8, "f8e4m3fn": 8, "f8e4m3b11fnuz": 8, "f8e5m2fnuz": 8, "f8e4m3fnuz": 8, "f8e4m3": 8, "f8e3m4": 8,
    "f8e8m0fnu": 8, "token": 0, "opaque": 0,
}  # fmt: skip
"""Bits per element of each HLO dtype (xla/xla_data.proto's PrimitiveType; c64 is two f32, c128 two f64)."""

_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([0-9,]*)\](\{[^{}]*\})?")
_ELEMENT_BITS = re.compile(r"E\((\d+)\)")
_MEMORY_SPACE = re.compile(r"S\(\d+\)")
_NO_BYTES = {"parameter", "constant", "bitcast", "get-tuple-element", "tuple", "copy-done", "after-all",
             "partition-id", "replica-id", "iota"}  # fmt: skip
"""Ops that move no bytes of their own: names for buffers, or (copy-done) the wait for an async copy counted at
its copy-start."""
_CONTROL_FLOW = {"while", "call", "conditional"}
_PARTIAL_READS = {"slice", "dynamic-slice", "gather"}
_VIEWS = {"bitcast", "reshape"}
_THROUGH = {"bitcast", "reshape", "get-tuple-element", "copy-start", "copy-done"}
"""Ops a value passes through unchanged on its way from a parameter (views, and an async copy's two halves)."""
_REWRITES = {"copy": "copy", "transpose": "transpose", "convert": "dtype conversion"}
_WIDEN_TARGET = "gemma4_bf16_to_f32"  # the engine's CPU widening kernel (bench.profile.classify._CPU_WIDEN_TARGET)
_MOVE_ONLY = {"parameter", "constant", "bitcast", "reshape", "broadcast", "copy", "transpose", "convert", "slice",
              "concatenate", "pad", "tuple", "get-tuple-element", "bitcast-convert"}  # fmt: skip
"""A fusion of only these ops writes out (part of) its inputs again: a rewrite, not a computation."""


@dataclass(frozen=True)
class ArrayShape:
    """One array of an HLO shape: dtype, dimensions, layout text (`{1,0:T(8,128)(4,1)}`, "" when not printed)."""

    dtype: str
    dims: tuple[int, ...]
    layout: str

    @property
    def elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def bits(self) -> int:
        found = _ELEMENT_BITS.search(self.layout)
        return int(found.group(1)) if found else DTYPE_BITS.get(self.dtype, 0)

    @property
    def nbytes(self) -> int:
        return (self.elements * self.bits + 7) // 8

    def text(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.dims))}]{self.layout}"


def parse_shape(text: str) -> tuple[ArrayShape, ...]:
    """The arrays of an HLO shape's text, in order (a tuple's elements flattened); () for an empty text. Raises
    ValueError for a dtype this module does not know (a newer XLA's type: add it to DTYPE_BITS)."""
    arrays = []
    for dtype, dims, layout in _ARRAY.findall(text):
        if dtype not in DTYPE_BITS:
            raise ValueError(f"unknown HLO dtype {dtype!r} in shape {text!r}")
        arrays.append(ArrayShape(dtype, tuple(int(d) for d in dims.split(",") if d), layout or ""))
    return tuple(arrays)


def shape_bytes(text: str) -> int:
    """Bytes an HLO shape holds: the sum over its arrays of elements x bits / 8 (rounded up). 0 for ""."""
    return sum(a.nbytes for a in parse_shape(text))


def without_memory_space(text: str) -> str:
    """A shape's text with the memory-space marks `S(n)` removed: the same layout in another memory."""
    return _MEMORY_SPACE.sub("", text).replace(":}", "}")


# ---- HLO text of one instruction -------------------------------------------------------------------------------
@dataclass(frozen=True)
class InstructionText:
    """One instruction parsed from its HLO text: name (no `%`), result shape text, opcode, operands as
    (shape text, name) pairs (shape "" where the text does not print it), and the attributes after the operands."""

    name: str
    shape: str
    opcode: str
    operands: tuple[tuple[str, str], ...]
    attributes: str


def _balanced(text: str, i: int) -> int:
    """The index just past the bracket group opening at text[i] (`(`, `[` or `{`), nested groups included."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = []
    while i < len(text):
        ch = text[i]
        if ch in pairs:
            stack.append(pairs[ch])
        elif stack and ch == stack[-1]:
            stack.pop()
            if not stack:
                return i + 1
        i += 1
    raise ValueError("unbalanced brackets")


def _split_top(text: str) -> list[str]:
    """`text` split at the commas outside any brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    tail = text[start:].strip()
    return parts + ([tail] if tail else [])


def parse_instruction_text(text: str) -> InstructionText | None:
    """`%name = <shape> <opcode>(<shape> %operand, ...), attributes` -> InstructionText; None when `text` is not
    in that form (e.g. a GPU kernel's name)."""
    head = re.match(r"%?([^\s=%]+) = ", text)
    if head is None:
        return None
    try:
        i = head.end()
        if text[i] == "(":  # a tuple shape
            end = _balanced(text, i)
        else:
            found = _ARRAY.match(text, i) or re.match(r"[a-z][a-z0-9]*\[\]", text[i:])
            if found is None:
                return None
            end = found.end() if found.re is _ARRAY else i + found.end()
        shape = text[i:end]
        op = re.match(r" ([a-z][a-z0-9\-]*)\(", text[end:])
        if op is None:
            return None
        args_start = end + op.end() - 1
        args_end = _balanced(text, args_start)
    except (ValueError, IndexError):
        return None
    operands = []
    for arg in _split_top(text[args_start + 1 : args_end - 1]):
        name_at = arg.rfind("%")
        operands.append((arg[:name_at].strip(), arg[name_at + 1 :].strip()) if name_at >= 0 else ("", arg))
    return InstructionText(head.group(1), shape, op.group(1), tuple(operands), text[args_end:].lstrip(", "))


def text_bytes(parsed: InstructionText) -> int:
    """Bytes of an op from its HLO text alone: every printed operand read whole plus the result written (used
    where the trace holds no HLO proto and no bytes stat; operands printed without shapes count 0)."""
    if parsed.opcode in _NO_BYTES:
        return 0
    return sum(shape_bytes(s) for s, _ in parsed.operands) + shape_bytes(parsed.shape)


def instruction_text(instr: HloInstruction, module: HloModule) -> str:
    """HLO text of a parsed instruction in the form a TPU trace prints: `%name = shape opcode(shape %operand,
    ...)`, with `kind=`/`calls=` for a fusion and `custom_call_target=` for a custom call."""
    args = ", ".join(f"{_shape_of(module, o)} %{o}".lstrip() for o in instr.operands)
    text = f"%{instr.name} = {instr.shape} {instr.opcode}({args})"
    if instr.opcode == "fusion":
        text += f", kind={instr.fusion_kind}" + (f", calls=%{instr.called[0]}" if instr.called else "")
    if instr.custom_call_target:
        text += f', custom_call_target="{instr.custom_call_target}"'
    return text


def _shape_of(module: HloModule, name: str) -> str:
    instr = module.instructions.get(name)
    return instr.shape if instr is not None else ""


# ---- bytes from shapes -----------------------------------------------------------------------------------------
def _fused_parameter(comp, number: int) -> HloInstruction | None:
    return next((i for i in comp.instructions if i.opcode == "parameter" and i.parameter_number == number), None)


def _bytes_read_through(instr: HloInstruction, module: HloModule, full: int) -> int:
    """Bytes a fused parameter (or a view of it) is read by its users: the pieces slices take, nothing for an
    in-place update's buffer, else all of it (capped at `full`)."""
    total = 0
    for user_name in instr.users:
        user = module.instructions.get(user_name)
        if user is None:
            return full
        first = bool(user.operands) and user.operands[0] == instr.name
        if user.opcode in _PARTIAL_READS and first:
            total += shape_bytes(user.shape)
        elif user.opcode in _VIEWS:
            total += _bytes_read_through(user, module, full)
        elif user.opcode == "dynamic-update-slice" and first:
            continue
        else:
            return full
    return min(total, full)


def _updated_in_place(instr: HloInstruction, module: HloModule) -> int | None:
    """The update's bytes when `instr` is a dynamic-update-slice of a (view of a) fused parameter, else None."""
    if instr.opcode != "dynamic-update-slice" or len(instr.operands) < 2:
        return None
    base = module.instructions.get(instr.operands[0])
    while base is not None and base.opcode in _VIEWS and base.operands:
        base = module.instructions.get(base.operands[0])
    if base is None or base.opcode != "parameter":
        return None
    return shape_bytes(_shape_of(module, instr.operands[1]))


def _fusion_written(comp, module: HloModule) -> int:
    root = module.instructions.get(comp.root)
    if root is None:
        return 0
    elements = [module.instructions.get(o) for o in root.operands] if root.opcode == "tuple" else [root]
    written = 0
    for element in elements:
        if element is None:
            continue
        in_place = _updated_in_place(element, module)
        written += shape_bytes(element.shape) if in_place is None else in_place
    return written


def bytes_from_hlo(instr: HloInstruction, module: HloModule) -> int | None:
    """Bytes one run of `instr` reads plus writes, from shapes (see the module doc for what counts as read).
    None for control flow (while, call, conditional) and for an instruction whose shapes the proto lacks."""
    if instr.opcode in _NO_BYTES:
        return 0
    if instr.opcode in _CONTROL_FLOW or not instr.shape:
        return None
    operand_bytes = [shape_bytes(_shape_of(module, o)) for o in instr.operands]
    result = shape_bytes(instr.shape)
    if instr.opcode in _PARTIAL_READS:
        return result + sum(operand_bytes[1:]) + result
    if instr.opcode == "dynamic-update-slice":
        update = operand_bytes[1] if len(operand_bytes) > 1 else 0
        return update + sum(operand_bytes[2:]) + update
    if instr.opcode == "copy-start":
        dest = parse_shape(instr.shape)
        return sum(operand_bytes) + (dest[0].nbytes if dest else 0)
    comp = module.computations.get(instr.called[0]) if instr.opcode == "fusion" and instr.called else None
    if comp is None:
        return sum(operand_bytes) + result
    read = 0
    for number, full in enumerate(operand_bytes):
        param = _fused_parameter(comp, number)
        read += full if param is None else _bytes_read_through(param, module, full)
    return read + _fusion_written(comp, module)


# ---- rewrites of a parameter ------------------------------------------------------------------------------------
def _is_top_level(module: HloModule, computation: str) -> bool:
    return computation == module.entry if module.entry else computation not in module.callers


def _source(name: str, module: HloModule, through: set[str]) -> HloInstruction | None:
    """The `parameter` instruction `name` is (a view or pass-through of), following operand 0 through `through`."""
    instr = module.instructions.get(name)
    while instr is not None and instr.opcode in through and instr.operands:
        instr = module.instructions.get(instr.operands[0])
    return instr if instr is not None and instr.opcode == "parameter" else None


def _entry_parameter(name: str, module: HloModule) -> HloInstruction | None:
    """The entry computation's parameter `name` is, through views and async copies; None otherwise."""
    param = _source(name, module, _THROUGH)
    if param is None or not _is_top_level(module, module.computation_of.get(param.name, "")):
        return None
    return param


def _rewrite(kind_ops: list[str], param: HloInstruction, result_shape: str) -> dict | None:
    """The finding's facts, or None when the op only moves the parameter to another memory space unchanged."""
    if kind_ops == ["copy"]:
        if parse_shape(param.shape) and parse_shape(result_shape):
            before, after = parse_shape(param.shape)[0], parse_shape(result_shape)[0]
            if without_memory_space(before.layout) != without_memory_space(after.layout):
                kind = "layout change"
            elif before.layout != after.layout:
                return None  # the same layout in another memory: a prefetch (e.g. a TPU's VMEM), not a rewrite
            else:
                kind = "copy"
        else:
            kind = "copy"
    else:
        kind = next(_REWRITES[op] for op in ("transpose", "copy", "convert") if op in kind_ops)
    return {"kind": kind, "ops": kind_ops, "parameter": param.name, "parameter_number": param.parameter_number,
            "parameter_shape": param.shape, "result_shape": result_shape,
            "parameter_bytes": shape_bytes(param.shape)}  # fmt: skip


def parameter_rewrite(instr: HloInstruction, module: HloModule) -> dict | None:
    """Whether `instr` rewrites a parameter of the entry computation each time it runs, and how.

    Counted: a top-level `copy` (its first async half `copy-start` included), `transpose` or `convert` (or the
    engine's CPU widening kernel) whose operand is an entry parameter, through views (bitcast, reshape,
    get-tuple-element) and async copies; and a fusion made only of data movement and conversions (`_MOVE_ONLY`)
    inside which a copy, transpose or convert reads a fused parameter, through views, static slices and other such
    rewrites, whose fusion operand is an entry parameter. Not counted: a copy that leaves the parameter's layout
    as it was in another memory space (a prefetch, e.g. into a TPU's VMEM), a conversion inside a fusion that
    computes (a product converting its weight in registers reads it once), and a conversion of what a
    dynamic-slice or gather took (an embedding row).

    Returns None, or {"kind": "layout change" | "copy" | "transpose" | "dtype conversion", "ops": the opcodes that
    rewrite, "parameter": its name, "parameter_number", "parameter_shape", "result_shape", "parameter_bytes"}.
    Limits: parameters of a while loop's body (a decode loop on the device) are not traced back to the entry.
    """
    if instr.opcode in ("copy", "copy-start", "transpose", "convert") or (
        instr.opcode == "custom-call" and instr.custom_call_target == _WIDEN_TARGET
    ):
        param = _entry_parameter(instr.operands[0], module) if instr.operands else None
        if param is None:
            return None
        op = {"copy-start": "copy", "custom-call": "convert"}.get(instr.opcode, instr.opcode)
        shape = parse_shape(instr.shape)[0].text() if instr.opcode == "copy-start" and parse_shape(instr.shape) else instr.shape
        return _rewrite([op], param, shape)
    if instr.opcode != "fusion" or not instr.called or instr.called[0] not in module.computations:
        return None
    comp = module.computations[instr.called[0]]
    if any(i.opcode not in _MOVE_ONLY for i in comp.instructions):
        return None
    path_ops = _VIEWS | {"copy", "transpose", "convert", "slice"}
    for inner in comp.instructions:
        if inner.opcode not in _REWRITES or not inner.operands:
            continue
        fused = _source(inner.operands[0], module, path_ops)
        if fused is None or fused.parameter_number is None or fused.parameter_number >= len(instr.operands):
            continue
        param = _entry_parameter(instr.operands[fused.parameter_number], module)
        if param is not None:
            ops = [i.opcode for i in comp.instructions if i.opcode in _REWRITES]
            return _rewrite(ops, param, instr.shape)
    return None
