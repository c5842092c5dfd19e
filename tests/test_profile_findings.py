"""The profile finds the next leak itself: each op's HLO text and bytes per step, and the findings of
`bench.profile.findings` (an op above a share of the step's bytes; a copy, transpose, relayout or conversion of a
parameter inside the profiled program).

- Parser and rules on fixture text (no jax): CPU- and TPU-style HLO text, the TPU v5e's `copy.191`
  (`u8[262144,4480]` from tiling T(32,128) to T(8,128), issue 43).
- A TPU-shaped trace built here (the core plane's `XLA Ops` line, its metadata's `bytes_accessed` stat and an HLO
  proto on `/host:metadata`, the layout a jax 0.10.2 trace on a TPU v5e was found to have) is analysed end to end.
- On CPU, a jitted program built to transpose a parameter every step, captured and analysed by the project's own
  profile path, is named; the same program without the transpose is not.
- The report renders the findings, and "not recorded" for an archived profile from before them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench.profile.findings import (
    MAX_LISTED,
    OP_BYTES_SHARE,
    PARAM_MIN_SHARE,
    format_finding,
    profile_findings,
    stored_findings,
)
from bench.profile.hloops import (
    bytes_from_hlo,
    instruction_text,
    parameter_rewrite,
    parse_instruction_text,
    parse_shape,
    shape_bytes,
    text_bytes,
)
from bench.profile.xspace import HloComputation, HloInstruction, HloModule

REPO = Path(__file__).resolve().parents[1]
ROWS, WIDTH = 262144, 4480  # E2B's packed PLE table (ple4): one u8 row of 4480 bytes per token id
COPY_191 = ("%copy.191 = u8[262144,4480]{1,0:T(8,128)(4,1)} copy(u8[262144,4480]{1,0:T(32,128)(4,1)} "
            "%params_ple_table.3)")  # fmt: skip
STEP_BYTES = 4_163_000_000  # ple4,int8_lm_head's bytes per decode step on E2B (issue 43's table)


# ---- shapes and HLO text ---------------------------------------------------------------------------------------
def test_shape_text_gives_dims_layout_and_bytes():
    (table,) = parse_shape("u8[262144,4480]{1,0:T(8,128)(4,1)}")
    assert (table.dtype, table.dims, table.layout) == ("u8", (ROWS, WIDTH), "{1,0:T(8,128)(4,1)}")
    assert table.nbytes == ROWS * WIDTH == 1_174_405_120
    assert shape_bytes("bf16[8,128]{1,0}") == 8 * 128 * 2
    assert shape_bytes("s4[1024]{0:T(1024)E(4)}") == 512  # four bits an element
    assert shape_bytes("f32[]") == 4 and shape_bytes("") == 0
    assert shape_bytes("(bf16[2048,1024]{1,0:T(8,128)(2,1)S(1)}, u32[]{:S(2)})") == 2048 * 1024 * 2 + 4
    with pytest.raises(ValueError, match="unknown HLO dtype"):
        parse_shape("q7[4]{0}")


def test_tpu_op_text_parses_into_name_shapes_and_operands():
    parsed = parse_instruction_text(COPY_191)
    assert (parsed.name, parsed.opcode) == ("copy.191", "copy")
    assert parsed.shape == "u8[262144,4480]{1,0:T(8,128)(4,1)}"
    assert parsed.operands == (("u8[262144,4480]{1,0:T(32,128)(4,1)}", "params_ple_table.3"),)
    assert text_bytes(parsed) == 2 * ROWS * WIDTH  # read once, written once
    fusion = parse_instruction_text(
        "%fusion.2 = f32[]{:T(128)} fusion(pred[]{:T(512)} %bitcast, u8[65536,4480]{1,0:T(8,128)(4,1)} %copy, "
        "s32[]{:T(128)} %bitcast.1), kind=kLoop, calls=%fused_computation.3")  # fmt: skip
    assert [name for _, name in fusion.operands] == ["bitcast", "copy", "bitcast.1"]
    assert fusion.attributes == "kind=kLoop, calls=%fused_computation.3"
    tuple_result = parse_instruction_text(
        "%copy-start = (bf16[8]{0:S(1)}, bf16[8]{0}, u32[]{:S(2)}) copy-start(bf16[8]{0} %W.1)")  # fmt: skip
    assert tuple_result.opcode == "copy-start" and tuple_result.shape.startswith("(bf16[8]")
    assert parse_instruction_text("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTT") is None  # a GPU kernel name
    cpu = parse_instruction_text(  # the form `instruction_text` builds for a CPU op from the trace's HLO proto
        "%copy_slice_fusion = f32[512,512]{1,0} fusion(f32[512,1024]{1,0} %w.1), kind=kLoop, "
        "calls=%fused_computation.1")  # fmt: skip
    assert (cpu.name, cpu.opcode, cpu.operands) == ("copy_slice_fusion", "fusion", (("f32[512,1024]{1,0}", "w.1"),))
    assert text_bytes(cpu) == 512 * 1024 * 4 + 512 * 512 * 4
    scalar = parse_instruction_text("%add.1 = f32[] add(f32[] %a, f32[] %b)")
    assert scalar.shape == "f32[]" and text_bytes(scalar) == 12


# ---- parameter rewrites and bytes on a parsed module -------------------------------------------------------------
def _i(name, opcode, shape, operands=(), *, number=None, called=(), target=""):
    return HloInstruction(name=name, opcode=opcode, dtype=shape.split("[")[0], operand_dtypes=(), op_name="",
                          fusion_kind="kLoop" if opcode == "fusion" else "", custom_call_target=target,
                          called=tuple(called), users=(), shape=shape, operands=tuple(operands),
                          parameter_number=number)  # fmt: skip


def _module(entry, *fused):
    """A module from (computation name, instructions) pairs, the first the entry; users filled in."""
    comps, instrs, where, callers = {}, {}, {}, {}
    for name, body in (entry, *fused):
        users = {i.name: [u.name for u in body if i.name in u.operands] for i in body}
        body = [HloInstruction(**{**i.__dict__, "users": tuple(users[i.name])}) for i in body]
        comps[name] = HloComputation(name, tuple(body), body[-1].name)
        for i in body:
            instrs[i.name], where[i.name] = i, name
            for c in i.called:
                callers.setdefault(c, i.name)
    return HloModule("jit__decode_program", comps, instrs, entry[0], where, callers)


def _ple_module():
    """The shape of E2B's ple4 decode on a TPU v5e: the packed table relaid out every step, then one row gathered
    from the copy; beside it a prefetch of a weight into VMEM (`S(1)`) and a gather straight from a parameter."""
    table, tiled = "u8[262144,4480]{1,0:T(32,128)(4,1)}", "u8[262144,4480]{1,0:T(8,128)(4,1)}"
    entry = ("main", [
        _i("params_ple_table.3", "parameter", table, number=0),
        _i("token.1", "parameter", "s32[]", number=1),
        _i("norm_w.1", "parameter", "bf16[1536,2048]{1,0:T(8,128)(2,1)}", number=2),
        _i("copy.191", "copy", tiled, ["params_ple_table.3"]),
        _i("row_fusion", "fusion", "u8[1,4480]{1,0}", ["copy.191", "token.1"], called=["fused_row"]),
        _i("copy-start", "copy-start", "(bf16[1536,2048]{1,0:T(8,128)(2,1)S(1)}, bf16[1536,2048]{1,0:T(8,128)(2,1)}, "
           "u32[])", ["norm_w.1"]),
        _i("direct_row", "fusion", "u8[1,4480]{1,0}", ["params_ple_table.3", "token.1"], called=["fused_direct"]),
    ])  # fmt: skip
    fused_row = ("fused_row", [
        _i("p0", "parameter", tiled, number=0), _i("p1", "parameter", "s32[]", number=1),
        _i("ds", "dynamic-slice", "u8[1,4480]{1,0}", ["p0", "p1"]), _i("cv", "convert", "u8[1,4480]{1,0}", ["ds"]),
    ])  # fmt: skip
    fused_direct = ("fused_direct", [
        _i("q0", "parameter", table, number=0), _i("q1", "parameter", "s32[]", number=1),
        _i("ds2", "dynamic-slice", "u8[1,4480]{1,0}", ["q0", "q1"]),
    ])  # fmt: skip
    return _module(entry, fused_row, fused_direct)


def test_the_ple_relayout_is_a_layout_change_of_a_parameter():
    module = _ple_module()
    copy = module.instructions["copy.191"]
    rewrite = parameter_rewrite(copy, module)
    assert rewrite["kind"] == "layout change" and rewrite["parameter"] == "params_ple_table.3"
    assert rewrite["parameter_bytes"] == ROWS * WIDTH
    assert "T(32,128)" in rewrite["parameter_shape"] and "T(8,128)" in rewrite["result_shape"]
    assert bytes_from_hlo(copy, module) == 2 * ROWS * WIDTH
    assert instruction_text(copy, module) == COPY_191  # the text a TPU trace prints, built from the proto


def test_a_prefetch_a_gathered_row_and_a_lookup_are_no_rewrite_and_read_only_what_they_take():
    module = _ple_module()
    for name in ("copy-start", "row_fusion", "direct_row", "token.1"):
        assert parameter_rewrite(module.instructions[name], module) is None, name
    # one 4480-byte row read (of the whole table the operand names), the token read, the row written
    assert bytes_from_hlo(module.instructions["direct_row"], module) == WIDTH + 4 + WIDTH
    assert bytes_from_hlo(module.instructions["copy-start"], module) == 2 * 1536 * 2048 * 2


def test_a_fused_transpose_or_conversion_of_a_parameter_is_a_rewrite_but_a_fused_product_is_not():
    w = "f32[512,1024]{1,0}"
    entry = ("main", [
        _i("w.1", "parameter", w, number=0), _i("x.1", "parameter", "f32[1,512]{1,0}", number=1),
        _i("copy_slice_fusion", "fusion", "f32[512,512]{1,0}", ["w.1"], called=["moves"]),
        _i("convert_fusion", "fusion", "bf16[512,1024]{1,0}", ["w.1"], called=["widens"]),
        _i("dot_fusion", "fusion", "f32[1,1024]{1,0}", ["x.1", "w.1"], called=["computes"]),
    ])  # fmt: skip
    moves = ("moves", [_i("a", "parameter", w, number=0), _i("t", "transpose", "f32[1024,512]{0,1}", ["a"]),
                       _i("c", "copy", "f32[1024,512]{1,0}", ["t"]), _i("s", "slice", "f32[512,512]{1,0}", ["c"])])
    widens = ("widens", [_i("b", "parameter", w, number=0), _i("cv", "convert", "bf16[512,1024]{1,0}", ["b"])])
    computes = ("computes", [_i("x", "parameter", "f32[1,512]{1,0}", number=0), _i("y", "parameter", w, number=1),
                             _i("cv2", "convert", "bf16[512,1024]{1,0}", ["y"]),
                             _i("d", "dot", "f32[1,1024]{1,0}", ["x", "cv2"])])  # fmt: skip
    module = _module(entry, moves, widens, computes)
    assert parameter_rewrite(module.instructions["copy_slice_fusion"], module)["kind"] == "transpose"
    assert parameter_rewrite(module.instructions["convert_fusion"], module)["kind"] == "dtype conversion"
    assert parameter_rewrite(module.instructions["dot_fusion"], module) is None


# ---- the rules -------------------------------------------------------------------------------------------------
def _row(name, moved, *, rewrite=None, pct=10.0, total_ms=2.0):
    return {"name": name, "hlo_op": name, "hlo_module": "jit__decode_program", "category": "copies_transfers",
            "total_ms": total_ms, "pct": pct, "hlo": f"%{name} = ...", "bytes_per_step": moved,
            "bytes_source": "trace bytes_accessed", "param_rewrite": rewrite}  # fmt: skip


def test_rules_name_the_relayout_and_leave_the_lm_head_and_small_copies_alone():
    relayout = {"kind": "layout change", "ops": ["copy"], "parameter": "params_ple_table.3", "parameter_number": 0,
                "parameter_shape": "u8[262144,4480]{1,0:T(32,128)(4,1)}",
                "result_shape": "u8[262144,4480]{1,0:T(8,128)(4,1)}", "parameter_bytes": ROWS * WIDTH}  # fmt: skip
    small = {**relayout, "kind": "copy", "parameter": "pos.1", "parameter_bytes": int(PARAM_MIN_SHARE * STEP_BYTES) - 1}
    ops = [_row("copy.191", 2 * ROWS * WIDTH, rewrite=relayout, pct=38.4, total_ms=71.4),
           _row("lm_head_fusion", 0.176 * STEP_BYTES),  # the largest weight read once: under the share
           _row("copy.7", 2 * small["parameter_bytes"], rewrite=small), _row("while.3", None)]  # fmt: skip
    found = profile_findings(ops, steps=20, step_bytes=STEP_BYTES, step_bytes_source="engine")
    assert [f["op"] for f in found] == ["copy.191"]
    (f,) = found
    assert f["rules"] == ["bytes share", "parameter rewrite"]
    assert f["share_of_step_bytes"] == pytest.approx(2 * ROWS * WIDTH / STEP_BYTES) and f["ms_per_step"] == 71.4 / 20
    line = format_finding(f)
    for part in ("copy.191", "layout change of parameter params_ple_table.3", "T(32,128)(4,1)} -> u8[262144,4480]{1,0:T(8,128)",
                 "2.349 GB per step (trace bytes_accessed)", "56.4% of the step's 4.163 GB (engine)",
                 f"above the {100 * OP_BYTES_SHARE:.0f}% rule", "3.570 ms per step = 38.4% of device time", "HLO: %copy.191"):
        assert part in line, part
    # without the engine's bytes the step's bytes are the ops' own sum, and the finding says so
    alone = profile_findings(ops[:2], steps=20)
    assert alone[0]["step_bytes_source"] == "the sum of the traced ops' bytes per step"
    assert alone[0]["step_bytes"] == pytest.approx(2 * ROWS * WIDTH + 0.176 * STEP_BYTES)
    with pytest.raises(ValueError):
        profile_findings(ops, steps=0)


def test_leak_one_in_a_big_model_is_listed_up_to_a_limit_then_summed():
    widen = {"kind": "dtype conversion", "ops": ["convert"], "parameter": "w", "parameter_number": 3,
             "parameter_shape": "bf16[1536,6144]{1,0}", "result_shape": "f32[1536,6144]{1,0}",
             "parameter_bytes": 1536 * 6144 * 2}  # fmt: skip
    ops = [_row(f"wrapped_convert.{i}", 3 * 1536 * 6144 * 2, rewrite=widen) for i in range(MAX_LISTED + 5)]
    found = profile_findings(ops, steps=1, step_bytes=4.565e9, step_bytes_source="engine")
    assert len(found) == MAX_LISTED + 5 and all(f["rules"] == ["parameter rewrite"] for f in found)
    lines = stored_findings({"findings": found})
    assert len(lines) == MAX_LISTED + 1
    assert lines[-1] == ("and 5 more (dtype conversion; 0.283 GB per step in all): profile.json's `findings` lists "
                         "every one")  # fmt: skip
    assert stored_findings({}) is None and stored_findings({"findings": []}) == []


# ---- a TPU-shaped trace: XLA Ops metadata stats and an HLO proto -------------------------------------------------
def _varint(n: int) -> bytes:
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


def _f(number: int, value) -> bytes:
    """One protobuf field: an int as a varint, bytes/str length-delimited, a list of ints packed."""
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    if isinstance(value, list):
        value = b"".join(_varint(v) for v in value)
    value = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _shape(element_type: int, dims: list[int], tiles: list[list[int]]) -> bytes:
    layout = _f(1, list(range(len(dims)))[::-1]) + b"".join(_f(6, _f(1, t)) for t in tiles)
    return _f(2, element_type) + _f(3, dims) + _f(5, layout)


def _hlo_proto() -> bytes:
    """HloProto of `main`: parameter 0 (the packed table, tiling T(32,128)(4,1)) and copy.191 (T(8,128)(4,1))."""
    param = _f(1, "params_ple_table.3") + _f(2, "parameter") + _f(3, _shape(6, [ROWS, WIDTH], [[32, 128], [4, 1]])) \
        + _f(35, 1)  # parameter_number 0 is the proto default: not written
    copy = _f(1, "copy.191") + _f(2, "copy") + _f(3, _shape(6, [ROWS, WIDTH], [[8, 128], [4, 1]])) + _f(35, 2) \
        + _f(36, [1])  # fmt: skip
    comp = _f(1, "main") + _f(2, param) + _f(2, copy) + _f(5, 7) + _f(6, 2)
    return _f(1, _f(1, "jit__decode_program") + _f(2, "main") + _f(3, comp) + _f(6, 7))


def _metadata_plane() -> bytes:
    stat = _f(1, 1) + _f(6, _hlo_proto())
    meta = _f(1, 1) + _f(2, "jit__decode_program(42)") + _f(5, stat)
    return _f(1, _f(1, 9) + _f(2, "/host:metadata") + _f(4, _f(1, 1) + _f(2, meta))
              + _f(5, _f(1, 1) + _f(2, _f(1, 1) + _f(2, "Hlo Proto"))))  # fmt: skip


def _tpu_trace(steps: int = 3) -> bytes:
    from jax.profiler import ProfileData

    ms_copy, bytes_copy = 3.57, 2 * ROWS * WIDTH  # per step, as issue 43's profile
    events, step_events, modules, t = [], [], [], 0
    for step in range(steps):
        step_events.append(f"events {{ metadata_id: 1 offset_ps: {t * 10**9} duration_ps: 9300000000 "
                           f"stats {{ metadata_id: 1 int64_value: {step} }} }}")  # fmt: skip
        modules.append(f"events {{ metadata_id: 2 offset_ps: {(t + 0.1) * 10**9:.0f} duration_ps: 9000000000 }}")
        events.append(f"events {{ metadata_id: 3 offset_ps: {(t + 0.2) * 10**9:.0f} duration_ps: {ms_copy * 10**9:.0f} }}")
        events.append(f"events {{ metadata_id: 4 offset_ps: {(t + 4) * 10**9:.0f} duration_ps: 5000000000 }}")
        t += 10
    text = (
        'planes { id: 1 name: "/host:CPU" lines { id: 1 name: "python3" timestamp_ns: 1000000 '
        + " ".join(step_events) + ' } event_metadata { key: 1 value { id: 1 name: "decode" } } '
        'stat_metadata { key: 1 value { id: 1 name: "step_num" } } }\n'
        'planes { id: 2 name: "/device:TPU:0" lines { id: 1 name: "XLA Modules" timestamp_ns: 1000000 '
        + " ".join(modules) + ' } lines { id: 2 name: "XLA Ops" timestamp_ns: 1000000 ' + " ".join(events) + " }\n"
        'event_metadata { key: 2 value { id: 2 name: "jit__decode_program(42)" } }\n'
        f'event_metadata {{ key: 3 value {{ id: 3 name: "{COPY_191}" display_name: "copy.191" '
        f'stats {{ metadata_id: 9 int64_value: {bytes_copy} }} stats {{ metadata_id: 10 str_value: "data formatting" }} }} }}\n'
        'event_metadata { key: 4 value { id: 4 name: "%multiply_reduce_fusion = bf16[1536]{0} fusion(bf16[1536,262144]'
        '{1,0:T(8,128)(2,1)} %params_lm_head.1, bf16[262144]{0} %x), kind=kLoop, calls=%fused_computation" } }\n'
        'stat_metadata { key: 9 value { id: 9 name: "bytes_accessed" } }\n'
        'stat_metadata { key: 10 value { id: 10 name: "hlo_category" } } }\n'
    )  # fmt: skip
    return ProfileData.text_proto_to_serialized_xspace(text) + _metadata_plane()


def test_a_tpu_trace_gives_bytes_from_its_stat_and_names_the_relayout():
    from jax.profiler import ProfileData

    from bench.profile.analysis import analyze_xspace, attach_roofline

    if not hasattr(ProfileData, "text_proto_to_serialized_xspace"):
        pytest.skip("this jaxlib cannot build an XSpace from text")
    analysis = analyze_xspace(_tpu_trace())
    rows = {r.name: r for r in analysis.ops}
    copy, head = rows["copy.191"], rows["multiply_reduce_fusion"]
    assert copy.bytes_source == "trace bytes_accessed" and copy.bytes_per_step == 2 * ROWS * WIDTH
    assert copy.hlo == COPY_191 and copy.param_rewrite["kind"] == "layout change"
    # no stat and no HLO for the other op: the shapes its own text prints
    assert head.bytes_source == "bytes from op text shapes"
    assert head.bytes_per_step == 1536 * 262144 * 2 + 262144 * 2 + 1536 * 2
    data = attach_roofline(analysis, bytes_per_step=STEP_BYTES, bandwidth_bytes_s=819e9).to_json()
    assert [f["op"] for f in data["findings"]] == ["copy.191"]
    assert data["findings"][0]["rules"] == ["bytes share", "parameter rewrite"]
    assert data["findings"][0]["step_bytes_source"] == "the roofline's bytes per step"
    assert data["findings_rules"] == {"op_bytes_share": OP_BYTES_SHARE, "param_min_share": PARAM_MIN_SHARE}
    json.dumps(data)  # profile.json stays JSON


# ---- on CPU: a program built to transpose a parameter every step, through the project's own profile path -------
D, LAYERS = 512, 8


def _programs():
    import jax
    import jax.numpy as jnp

    def clean(x_BD, ws):
        for w_DD in ws:
            x_BD = jnp.tanh(x_BD @ w_DD)
        return x_BD

    def transposed(x_BD, ws, w_big_DE):  # a slice of the transposed parameter: XLA must lay it out anew
        return clean(jnp.tanh(x_BD @ jnp.transpose(w_big_DE)[:D, :D]), ws)

    return jax.jit(clean), jax.jit(transposed)


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    import jax.numpy as jnp
    import numpy as np

    from bench.profile.analysis import analyze_trace, attach_roofline
    from bench.profile.capture import capture_steps

    rng = np.random.default_rng(0)
    ws = [jnp.asarray(rng.standard_normal((D, D), np.float32) / np.sqrt(D)) for _ in range(LAYERS)]
    w_big = jnp.asarray(rng.standard_normal((D, 2 * D), np.float32) / np.sqrt(D))
    clean, transposed = _programs()
    x = jnp.ones((1, D), jnp.float32)
    out = {}
    for name, step, args, weight_bytes in (("clean", clean, (ws,), LAYERS * D * D * 4),
                                           ("transposed", transposed, (ws, w_big), (LAYERS + 2) * D * D * 4)):
        capture = capture_steps(lambda s, f=step, a=args: f(s, *a), x, 3, tmp_path_factory.mktemp(name), warmup=1)
        analysis = attach_roofline(analyze_trace(capture.xplane_path), bytes_per_step=weight_bytes,
                                   bandwidth_bytes_s=1e10)  # fmt: skip
        out[name] = (step.lower(x, *args).compile().as_text(), analysis.to_json())
    return out


def test_the_built_program_keeps_its_transpose_and_the_clean_one_has_none(captured):
    hlo, _ = captured["transposed"]
    assert "transpose(" in hlo  # XLA kept a transpose of the parameter: the leak the test needs
    clean_hlo, _ = captured["clean"]
    assert "transpose(" not in clean_hlo and " copy(" not in clean_hlo


def test_the_transposed_parameter_is_named_and_the_clean_program_has_no_finding(captured):
    _, data = captured["transposed"]
    named = [f for f in data["findings"] if "parameter rewrite" in f["rules"]]
    assert len(named) == 1
    (f,) = named
    assert f["rewrite"]["kind"] == "transpose" and f["rewrite"]["parameter_shape"].startswith(f"f32[{D},{2 * D}]")
    assert f["bytes_source"] == "bytes from shapes" and f["bytes_per_step"] > 0
    assert "transpose of parameter" in format_finding(f)
    _, clean = captured["clean"]
    assert clean["findings"] == []


def test_every_op_row_carries_its_hlo_text_and_bytes(captured):
    _, data = captured["clean"]
    for row in data["ops"]:
        assert row["hlo"].startswith(f"%{row['hlo_op']} = ")
        assert row["bytes_source"] == "bytes from shapes" and row["bytes_per_step"] >= 0
    dots = [r for r in data["ops"] if r["hlo_op"].startswith("dot")]
    assert len(dots) == LAYERS
    for dot in dots:  # each product reads its weight (D x D float32) and the activations, once per step
        assert dot["bytes_per_step"] == pytest.approx(D * D * 4 + D * 4 + D * 4)
    assert data["totals"]["op_bytes_per_step"] == pytest.approx(sum(r["bytes_per_step"] for r in data["ops"]))


# ---- printing and the report -----------------------------------------------------------------------------------
def test_the_profile_prints_findings_or_says_they_were_not_recorded():
    from rich.console import Console

    from bench.cli.profile_cmds import print_findings

    old = json.loads((REPO / "runs" / "2026-12-05-gpurun-e2b-120939-tpuv5e" / "profile.json").read_text())
    console = Console(record=True, width=200)
    print_findings(old, console)
    assert "findings: not recorded" in console.export_text()
    ops = [_row("copy.191", 2 * ROWS * WIDTH)]
    new = {**old, "findings": profile_findings(ops, steps=20, step_bytes=STEP_BYTES, step_bytes_source="engine"),
           "findings_rules": {"op_bytes_share": OP_BYTES_SHARE, "param_min_share": PARAM_MIN_SHARE}}  # fmt: skip
    console = Console(record=True, width=200)
    print_findings(new, console)
    out = console.export_text()
    assert "findings: 1 (rules: an op moving more than 25% of the step's bytes" in out
    assert "finding: copy.191 (jit__decode_program); moves 2.349 GB per step" in out
    console = Console(record=True, width=200)
    print_findings({**old, "findings": []}, console)
    assert "findings: none" in console.export_text()


def test_the_report_renders_findings_and_not_recorded_for_an_archived_profile(tmp_path):
    from bench.report import build_report

    old = tmp_path / "2026-12-05-gpurun-e2b-120939-tpuv5e"
    shutil.copytree(REPO / "runs" / old.name, old)
    new = tmp_path / "2026-12-07-tpu-findings-tpuv5e"
    shutil.copytree(REPO / "runs" / old.name, new)
    prof = json.loads((new / "profile.json").read_text())
    prof["findings"] = profile_findings([_row("copy.191", 2 * ROWS * WIDTH)], steps=20, step_bytes=STEP_BYTES,
                                        step_bytes_source="engine")  # fmt: skip
    (new / "profile.json").write_text(json.dumps(prof))
    manifest = json.loads((new / "manifest.json").read_text())
    manifest["created"] = "2026-12-07T12:00:00Z"
    (new / "manifest.json").write_text(json.dumps(manifest))
    report = build_report([old, new], tmp_path / "out", selection=None)
    md = report.markdown.read_text()
    assert "In the profiles (bench/profile/findings.py: an op moving more than 25% of the step's bytes" in md
    assert ": not recorded (a profile from before findings)" in md
    assert "copy.191 (jit__decode_program); moves 2.349 GB per step" in md
    assert any("copy.191" in f for f in report.findings)
    rows = {r[0]: r[1:] for r in _profile_csv(tmp_path / "out" / "profile.csv")}
    assert rows["profile_findings"] == ["", "1"]  # the archived run recorded none: empty, not 0
    assert "| findings (bench/profile/findings.py) | not recorded | 1 (listed in the group's findings) |" in md


def _profile_csv(path: Path) -> list[list[str]]:
    import csv

    with path.open() as f:
        return list(csv.reader(f))
