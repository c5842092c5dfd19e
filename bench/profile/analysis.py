"""Where device time goes in a trace of N decode steps: per-op table, categories, totals (docs/method.md, "Profiles").

Input: an xprof trace (`*.xplane.pb`) written by `bench.profile.capture.capture_steps`, read with
`jax.profiler.ProfileData` (planes, lines, events, stats) plus the HLO protos the trace carries
(`bench.profile.xspace`). Output: a frozen `ProfileAnalysis` whose `to_json()` is `profile.json` (schema version 1).

Where device time lives in a jax 0.12 trace (found by reading traces written on CPU, and xla's CUPTI collector):
- Steps: `StepTraceAnnotation("decode", step_num=i)` is an event named "decode" with an int stat `step_num`, on the
  calling thread's line of the `/host:CPU` plane. Only ops whose midpoint falls inside a step are counted.
- CPU (XLA:CPU): each executed op (a "thunk") is an event on a thread line of `/host:CPU` (lines named
  `tf_XLAExecute/<id>` and `tf_XLAEigen/<id>`; independent ops run concurrently on several threads). Its name is
  the HLO instruction name and it carries stats `hlo_op`, `hlo_module`, `program_id`, `run_id`, `device_ordinal`.
  Events without `hlo_op` (`ThunkExecutor::Execute`, `end: <op>` markers, PjRt bookkeeping) are not device work.
  Ops inside a `while`/`call`/`conditional` (e.g. the body of `lax.scan`) get no events of their own: the whole
  loop is one event, counted as "other" and reported in `totals["opaque_control_flow_ms"]` and a note.
- GPU: planes `/device:GPU:<n>`; kernels, memcpys and memsets are events on lines `Stream #<id>...`; other lines
  (derived "XLA Ops", "Steps", counters, "CUPTI overhead") are skipped so nothing is counted twice. Kernel events
  carry `hlo_op`, `hlo_module`, `program_id` (from XLA's annotations), `kernel_details`, `correlation_id`.
- HLO: `/host:metadata` holds one HLO proto per module; an op's `(hlo_module, program_id, hlo_op)` finds its
  instruction: opcode, operand dtypes, fused instructions, and `op_name` metadata such as
  `jit(step)/attention/dot_general`, where `jax.named_scope` names are the middle segments. XLA:CPU drops the
  metadata of `dot` instructions, so an op without `op_name` takes its fusion root's, else its first user's.

Categories, each device nanosecond in exactly one, decided in this order (first match wins):
0. w4a16_kernel: the fused W4A16 Pallas kernel (`model.kernels.w4a16`): a kernel named, or an op under a named
   scope, containing "w4a16_pallas" (`bench.profile.classify.is_w4a16_kernel`); its own category, so the
   kernel's share is read directly (not "other", nor a matrix product of unknown dtype).
0b. collective: data exchanged between devices (a mesh, `model.sharding`): an HLO all-reduce, all-gather,
   reduce-scatter, all-to-all or collective-permute (or its -start / -done half), or a fusion containing one
   (`bench.profile.classify.is_collective`); without HLO, a name of one (`all-reduce.3`) or an NCCL kernel. Its
   own category, so a mesh's communication is read per device beside its products (it was data movement before).
1. dtype_conversion: HLO `convert`, or a fusion doing only converts plus data movement; without HLO, a name
   containing "convert" (`wrapped_convert`, `loop_convert_fusion`).
2. tensor_core: a GPU kernel `bench.profile.classify.is_tensor_core_kernel` accepts; on a TPU, an op that is or
   fuses an HLO dot/convolution, which XLA's TPU backend runs on the matrix units, the MXU
   (`bench.profile.classify.is_mxu_op`); without HLO, a TPU op named after one (`convolution_add_fusion`).
   Absent (None) on CPU.
3. attention: an op under a named scope containing "attention", or the engine's CPU decode-attention kernel
   (custom call `gemma4_decode_attention*`); without HLO, kernel names of attention libraries (fmha, flash, sdpa).
4. matmul_fp32 / matmul_16bit: `dot`, `convolution`, a fusion containing one, or a gemm/matmul custom call, split
   by the dot's operand dtypes (any f32/f64 operand -> fp32; all of bf16/f16/8-bit/4-bit -> 16bit); without HLO,
   from the kernel name (`gemv2T_kernel_val<..., float, ...>`, `sgemm`, `__half`, `bf16`). A product whose operand
   dtype cannot be told goes to "other" (and a note says how much). Also a product XLA rewrote into multiply +
   reduce (a fusion of both whose JAX op is a `dot_general`, `bench.profile.classify.is_rewritten_product`): the
   TPU backend's one-row products, run on the vector units, split by the fusion's operand dtypes.
5. copies_transfers: data movement without arithmetic: copy, transpose, (dynamic-)slice, dynamic-update-slice
   (the KV-cache write), concatenate, pad, gather/scatter, and fusions of only these; GPU Memcpy*/Memset events.
6. other_fusions: any other fusion (elementwise, reductions, norms).
7. other: everything else (unfused elementwise ops, reductions, custom calls, control flow).

Each op row also carries its HLO text, the bytes it moves per step and where they come from
(`bench.profile.hloops`): XLA's cost analysis where the trace stores it (a TPU's `XLA Ops` event metadata stat
`bytes_accessed`, bytes per run: "trace bytes_accessed"), else the HLO proto's operand and result shapes ("bytes
from shapes"), else the shapes printed in the op's own HLO text ("bytes from op text shapes"); and whether the op
rewrites a parameter of the program (`bench.profile.hloops.parameter_rewrite`). `bench.profile.findings` turns
those into the profile's findings (profile.json `findings`).
"""

from __future__ import annotations

import bisect
import re
import statistics
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.errors import TraceError
from bench.profile.capture import STEP_ANNOTATION
from bench.profile.classify import classify_hlo, classify_name
from bench.profile.findings import RULES, profile_findings
from bench.profile.hloops import (
    bytes_from_hlo,
    instruction_text,
    parameter_rewrite,
    parse_instruction_text,
    text_bytes,
)
from bench.profile.xspace import HloInstruction, HloModule, event_metadata_stats, hlo_modules
from bench.runs.schema import PROFILE_SCHEMA_VERSION  # profile.json's layout version, defined with the run folder's

CATEGORIES = (
    "w4a16_kernel", "dtype_conversion", "tensor_core", "attention", "matmul_fp32", "matmul_16bit",
    "copies_transfers", "collective", "other_fusions", "other",
)  # fmt: skip
TOP_OPS_IN_JSON = 40

TPU_CORE_PLANE = re.compile(r"/device:TPU:\d+")
"""A TPU core's plane in an XSpace (one per chip core); planes named otherwise (e.g. SparseCore's) are not read."""
TPU_OPS_LINE, TPU_MODULES_LINE = "XLA Ops", "XLA Modules"
"""The lines of a TPU core plane holding one event per HLO op run, and one per program (module) run."""
TENSOR_CORE_PLATFORMS = ("gpu", "tpu")
"""Platforms with matrix units (`tensor_core`: GPU tensor cores, the TPU's MXU); elsewhere the category is absent."""
_TPU_OP_TEXT = re.compile(r"%?([^\s=%]+) = ")
BYTES_STAT = "bytes_accessed"
"""The stat holding the bytes one run of an op reads and writes (XLA's cost analysis), on a TPU's `XLA Ops` event
metadata (jax 0.10.2, v5e; `bench.profile.xspace.event_metadata_stats`), or on an event itself where a platform
puts it there."""
BYTES_SOURCES = ("trace bytes_accessed", "bytes from shapes", "bytes from op text shapes")
"""Where an op row's bytes per step come from, best first (module doc)."""


def tpu_op_name(event_name: str) -> str:
    """The HLO instruction name of a TPU `XLA Ops` event, whose name is the instruction's whole HLO text
    (`%fusion.12 = bf16[8,1536]{...} fusion(...), kind=kOutput, calls=%fused_computation.12` -> `fusion.12`, as
    the trace's HLO proto names it); the event name itself when it is not in that form."""
    found = _TPU_OP_TEXT.match(event_name)
    return found.group(1) if found else event_name


# ---- result types ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OpRow:
    """One row of the per-op (CPU) / per-kernel (GPU) table, over the captured steps.

    name: the event name (the HLO instruction on CPU, the kernel name on GPU); hlo_op / hlo_module: the op the
    event ran for ("" when the trace does not say); count: events; total_ms / mean_ms: exclusive device time
    (milliseconds); pct: share of total device time in %; category: one of CATEGORIES.
    hlo: the op's HLO text with shapes and layouts (`%copy.191 = u8[...]{1,0:T(8,128)(4,1)} copy(...)`; "" when
    the trace holds neither the text nor the HLO); bytes_per_step: bytes the op reads plus writes per traced step
    (bytes per run x runs / steps; None when unknown, e.g. control flow without a bytes stat); bytes_source: one of
    BYTES_SOURCES ("" when unknown); param_rewrite: `bench.profile.hloops.parameter_rewrite`'s facts, or None.
    """

    name: str
    hlo_op: str
    hlo_module: str
    category: str
    count: int
    total_ms: float
    mean_ms: float
    pct: float
    hlo: str = ""
    bytes_per_step: float | None = None
    bytes_source: str = ""
    param_rewrite: dict | None = None

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Roofline:
    """Bandwidth roofline of the profiled decode (docs/method.md, "Rooflines").

    bytes_per_step: bytes one decode step reads (engine accounting); tok_s: decode tok/s used, with tok_s_source
    "gauge" (the measured steady-state rate) or "profile" (1000 / profiled ms per step); bandwidth_bytes_s: measured
    copy bandwidth (read + written bytes per second), bandwidth_n_bytes the copy size; share_pct: the share in %.
    """

    bytes_per_step: int
    tok_s: float
    tok_s_source: str
    bandwidth_bytes_s: float
    bandwidth_n_bytes: int | None
    share_pct: float

    def to_json(self) -> dict:
        return {**self.__dict__, "bandwidth_gib_s": self.bandwidth_bytes_s / 2**30}


@dataclass(frozen=True)
class ProfileAnalysis:
    """The analysis of one trace. Times in milliseconds, shares in % of total device time over the steps.

    device: platform ("cpu"/"gpu"), planes read, device stats from the trace (GPU name, compute capability, ...)
        and versions from `/host:metadata`.
    steps: step annotations found (must equal the captured N).
    categories: {name: (pct, ms)} for every name of CATEGORIES; (None, None) where the device cannot have one.
    totals: device_ms, ms_per_step (device_ms / steps), typical_step_ms (the typical step's device time, below),
        tok_s (1000 / ms_per_step, batch 1), distinct_ops, events, step_wall_ms_mean,
        busy_ms (union of op intervals: device time with concurrency removed), opaque_control_flow_ms,
        hlo_matched_pct (share of device time whose HLO instruction was found).
    ops: every table row, largest first. roofline: None until `attach_roofline`. notes: caveats, one line each.
    trace_path: the trace read (not compared: a copy of a trace analyses equal).
    typical: {name: (pct, ms per step)} of the typical step: each op at the median of its event times, times its
        events per step. The same ops as `categories`, but an op descheduled in a few steps (a CPU shared with
        other processes: its event lasts as long as it waited) moves the mean-based `categories` and not these.
        On 2 busy CPU cores the attention share of one program read 11%..34% mean-based and 29%..32% typical.
    """

    device: dict[str, Any]
    steps: int
    categories: dict[str, tuple[float | None, float | None]]
    totals: dict[str, Any]
    ops: tuple[OpRow, ...]
    roofline: Roofline | None = None
    notes: tuple[str, ...] = ()
    trace_path: str = field(default="", compare=False)
    typical: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)

    def to_json(self) -> dict:
        """profile.json: `{"schema_version": 1, "device", "steps", "categories": {name: {"pct", "ms"}},
        "categories_typical_step": {name: {"pct", "ms" (per step)}}, "totals",
        "ops": [top rows], "roofline": {...} (values None until attached), "notes", "trace", "findings": [...]
        (`bench.profile.findings.profile_findings` over every row, with the roofline's bytes per step as the
        step's bytes when attached), "findings_rules": the thresholds in force}`."""
        empty_roofline = {k: None for k in ("bytes_per_step", "tok_s", "tok_s_source", "bandwidth_bytes_s",
                                            "bandwidth_n_bytes", "share_pct", "bandwidth_gib_s")}  # fmt: skip
        return {
            "schema_version": PROFILE_SCHEMA_VERSION,
            "device": self.device,
            "steps": self.steps,
            "categories": {name: {"pct": pct, "ms": ms} for name, (pct, ms) in self.categories.items()},
            "categories_typical_step": {name: {"pct": pct, "ms": ms} for name, (pct, ms) in self.typical.items()},
            "totals": self.totals,
            "ops": [row.to_json() for row in self.ops[:TOP_OPS_IN_JSON]],
            "ops_total_rows": len(self.ops),
            "roofline": self.roofline.to_json() if self.roofline else empty_roofline,
            "notes": list(self.notes),
            "trace": self.trace_path,
            "findings": self.findings(),
            "findings_rules": dict(RULES),
        }

    def findings(self) -> list[dict]:
        """`bench.profile.findings.profile_findings` over every op row (not only the top rows profile.json keeps):
        the step's bytes are the roofline's (the engine's bytes per decode step) when attached, else the ops'."""
        step_bytes = self.roofline.bytes_per_step if self.roofline is not None else None
        source = "the roofline's bytes per step" if step_bytes is not None else ""
        return profile_findings([row.to_json() for row in self.ops], steps=self.steps, step_bytes=step_bytes,
                                step_bytes_source=source)  # fmt: skip


def attach_roofline(
    analysis: ProfileAnalysis, *, bytes_per_step: int, bandwidth_bytes_s: float,
    bandwidth_n_bytes: int | None = None, gauge_tok_s: float | None = None,
) -> ProfileAnalysis:  # fmt: skip
    """A copy of `analysis` with its roofline: bytes_per_step x tok/s / bandwidth, tok/s being the gauge when
    given, else the profile's own 1000 / ms per step (labelled as such)."""
    from bench.profile.roofline import roofline_share

    tok_s, source = (gauge_tok_s, "gauge") if gauge_tok_s is not None else (analysis.totals["tok_s"], "profile")
    share = 100.0 * roofline_share(bytes_per_step, tok_s, bandwidth_bytes_s)
    return replace(analysis, roofline=Roofline(bytes_per_step, tok_s, source, bandwidth_bytes_s, bandwidth_n_bytes,
                                               share))  # fmt: skip


# ---- reading a trace -------------------------------------------------------------------------------------------
def find_trace(path: str | Path) -> tuple[Path, tuple[str, ...]]:
    """The `.xplane.pb` that `path` names: the file itself, the newest under a folder (searched recursively), or
    the newest under a run folder's `profile/`. Returns it and notes. TraceError (one line) when there is none."""
    p = Path(path)
    if not p.exists():
        raise TraceError(f"trace path {p} does not exist: expected a .xplane.pb file, a folder holding one, "
                         f"or a run folder with a profile/ folder")  # fmt: skip
    if p.is_file():
        if not p.name.endswith(".xplane.pb"):
            raise TraceError(f"{p} is not an xprof trace: expected a *.xplane.pb file written by jax.profiler")
        return p, ()
    root = p / "profile" if (p / "profile").is_dir() else p
    found = sorted(root.rglob("*.xplane.pb"), key=lambda f: (f.stat().st_mtime, str(f)))
    if not found:
        if (p / "manifest.json").is_file() or root is not p:
            raise TraceError(f"run folder {p} has no profile (no *.xplane.pb under {root}): "
                             f"run `bench profile --run {p}` first")  # fmt: skip
        raise TraceError(f"folder {p} holds no *.xplane.pb trace: point at a trace file, its folder or a run folder")
    notes = (f"{len(found)} traces under {root}; analysed the newest, {found[-1]}",) if len(found) > 1 else ()
    return found[-1], notes


def analyze_trace(path: str | Path, *, step_name: str = STEP_ANNOTATION) -> ProfileAnalysis:
    """Analyse the trace at `path` (a trace file, a folder holding one, or a run folder with `profile/`).

    Raises TraceError for a path without a trace, a file that is not a trace, or a trace without step annotations
    named `step_name` or without device ops inside them.
    """
    trace, notes = find_trace(path)
    return analyze_xspace(trace.read_bytes(), source=str(trace), step_name=step_name, notes=notes)


def analyze_xspace(
    data: bytes, *, source: str = "<bytes>", step_name: str = STEP_ANNOTATION, notes: tuple[str, ...] = ()
) -> ProfileAnalysis:
    """Analyse a serialized XSpace (the bytes of a `.xplane.pb`); see `analyze_trace`."""
    from jax.profiler import ProfileData

    try:
        profile = ProfileData.from_serialized_xspace(data)
        planes = list(profile.planes)
        modules = hlo_modules(data)
        metadata_stats = event_metadata_stats(data)
    except Exception as exc:  # jax raises RuntimeError, the HLO reader ValueError/IndexError on garbage
        raise TraceError(f"{source} could not be read as an xprof trace ({type(exc).__name__}: {exc})") from exc
    if not planes:
        raise TraceError(f"{source} is not an xprof trace: it holds no planes")
    with warnings.catch_warnings():  # jaxlib's stat iterators warn "builtin type event_stats has no __module__"
        warnings.filterwarnings("ignore", message="builtin type", category=DeprecationWarning)
        return _analyze_planes(planes, modules, source, step_name, notes, metadata_stats)


def _analyze_planes(planes, modules, source, step_name, notes, metadata_stats=None) -> ProfileAnalysis:
    steps = _step_windows(planes, step_name)
    if not steps:
        raise TraceError(f"{source} has no '{step_name}' step annotations: capture it with `bench profile` "
                         f"(each step inside jax.profiler.StepTraceAnnotation('{step_name}', step_num=i))")  # fmt: skip
    gpu_planes = [pl for pl in planes if pl.name.startswith("/device:GPU:")]
    tpu_planes = [pl for pl in planes if TPU_CORE_PLANE.fullmatch(pl.name)]
    if gpu_planes:
        platform, device_planes = "gpu", gpu_planes
    elif tpu_planes:
        platform, device_planes = "tpu", tpu_planes
    else:
        platform, device_planes = "cpu", [pl for pl in planes if pl.name == "/host:CPU"]
    events = _device_events(device_planes, platform, metadata_stats or {})
    events = _inside_steps(events, steps)
    if not events:
        raise TraceError(f"{source} has {len(steps)} '{step_name}' steps but no device ops inside them")
    return _summarise(events, steps, modules, platform, _device_info(planes, platform, device_planes), source, notes)


def _stats(obj) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in obj.stats:
        out.setdefault(key, value if isinstance(value, (int, float, str, bool)) else str(value))
    return out


def _step_windows(planes, step_name: str) -> list[tuple[float, float]]:
    windows = []
    for plane in planes:
        if not plane.name.startswith("/host:"):
            continue
        for line in plane.lines:
            for ev in line.events:
                if ev.name == step_name and any(k == "step_num" for k, _ in ev.stats):
                    windows.append((ev.start_ns, ev.end_ns))
    return sorted(windows)


@dataclass
class _Event:
    name: str
    hlo_op: str
    hlo_module: str
    program_id: str
    start: float
    end: float
    self_ns: float
    text: str = ""  # the event's own name where it is the op's HLO text (TPU)
    trace_bytes: float | None = None  # BYTES_STAT of one run, where the trace has it


def _device_events(planes, platform: str, metadata_stats: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> list[_Event]:
    """Device-work events with their exclusive time (nested op events on the same line are subtracted).

    GPU: the `Stream #N` lines (kernels, stats hlo_op/hlo_module/program_id). CPU: events of `/host:CPU` that carry
    an hlo_op stat. TPU: the `XLA Ops` line of each core plane (`TPU_OPS_LINE`); an op event's name is its HLO
    instruction's text, whose name (`tpu_op_name`) becomes the event's name and hlo_op; where its stats do not
    name the module, the `XLA Modules` event around it does ("jit_f(12)": module jit_f, program id 12), the line
    layout xprof's TPU op profile reads. An event's bytes per run: its own `BYTES_STAT`, else its metadata's
    (`metadata_stats`: {plane: {event name: stats}}, `bench.profile.xspace.event_metadata_stats`)."""
    out: list[_Event] = []
    for plane in planes:
        modules = _tpu_module_windows(plane) if platform == "tpu" else []
        plane_stats = metadata_stats.get(plane.name, {})
        for line in plane.lines:
            if platform == "gpu" and not line.name.startswith("Stream #"):
                continue
            if platform == "tpu" and line.name != TPU_OPS_LINE:
                continue
            line_events = []
            for ev in line.events:
                st = _stats(ev)
                if platform == "cpu" and "hlo_op" not in st:
                    continue
                name = ev.name
                if platform == "tpu":
                    name = tpu_op_name(ev.name)
                    st.setdefault("hlo_op", name)
                    if "hlo_module" not in st:
                        st.update(_module_at(modules, (ev.start_ns + ev.end_ns) / 2))
                ids = (str(st.get(k, "")) for k in ("hlo_op", "hlo_module", "program_id"))
                moved = st.get(BYTES_STAT, (plane_stats.get(ev.name) or {}).get(BYTES_STAT))
                line_events.append(_Event(name, *ids, ev.start_ns, ev.end_ns, ev.duration_ns,
                                          text=ev.name if name != ev.name else "",
                                          trace_bytes=float(moved) if isinstance(moved, (int, float)) else None))  # fmt: skip
            line_events.sort(key=lambda e: (e.start, -e.end))
            open_events: list[_Event] = []
            for ev in line_events:
                while open_events and open_events[-1].end <= ev.start:
                    open_events.pop()
                if open_events:
                    open_events[-1].self_ns -= ev.end - ev.start
                open_events.append(ev)
            out.extend(line_events)
    return out


def _tpu_module_windows(plane) -> list[tuple[float, float, dict[str, str]]]:
    """(start ns, end ns, {"hlo_module", "program_id"}) of each event on a TPU plane's `XLA Modules` line, sorted."""
    windows = []
    for line in plane.lines:
        if line.name != TPU_MODULES_LINE:
            continue
        for ev in line.events:
            st = _stats(ev)
            named = re.fullmatch(r"(.+)\((\d+)\)", ev.name)
            ids = {"hlo_module": named.group(1) if named else ev.name,
                   "program_id": named.group(2) if named else str(st.get("program_id", ""))}  # fmt: skip
            windows.append((ev.start_ns, ev.end_ns, ids))
    return sorted(windows, key=lambda w: w[0])


def _module_at(windows: list[tuple[float, float, dict[str, str]]], t_ns: float) -> dict[str, str]:
    """The module ids of the `XLA Modules` window holding time `t_ns`, or {} when none does."""
    i = bisect.bisect_left(windows, (t_ns, float("inf"))) - 1  # the last window starting at or before t_ns
    return dict(windows[i][2]) if i >= 0 and t_ns <= windows[i][1] else {}


def _inside_steps(events: list[_Event], steps: list[tuple[float, float]]) -> list[_Event]:
    starts = [s for s, _ in steps]
    kept = []
    for ev in events:
        mid = (ev.start + ev.end) / 2
        i = bisect.bisect_right(starts, mid) - 1
        if i >= 0 and mid <= steps[i][1]:
            kept.append(ev)
    return kept



def _device_info(planes, platform: str, device_planes) -> dict[str, Any]:
    versions = next((_stats(pl) for pl in planes if pl.name == "/host:metadata"), {})
    versions.pop("process_id", None)
    if platform in ("gpu", "tpu"):
        return {"platform": platform, "planes": [pl.name for pl in device_planes], "stats": _stats(device_planes[0]),
                "versions": versions}  # fmt: skip
    return {"platform": "cpu", "planes": ["/host:CPU"], "stats": {}, "versions": versions}


def _candidates(modules: Mapping[str, HloModule], ev: _Event) -> list[tuple[HloInstruction, HloModule]]:
    """The HLO instructions `ev` may have run for: its module by `<name>(<program_id>)` when the trace has that
    key, else every module of the same name that holds an instruction named `ev.hlo_op`. On XLA:CPU (jax 0.12) the
    events' `program_id` is not the metadata's module id, so a process that compiled one jitted function at two
    shapes (two modules of one name) leaves several candidates; the caller accepts them when they agree."""
    exact = modules.get(f"{ev.hlo_module}({ev.program_id})")
    same = [exact] if exact is not None else [m for key, m in modules.items() if key.rsplit("(", 1)[0] == ev.hlo_module]
    return [(m.instructions[ev.hlo_op], m) for m in same if ev.hlo_op in m.instructions]


def _classify_event(modules: Mapping[str, HloModule], ev: _Event, platform: str) -> tuple[str, str, bool]:
    """(category, detail, HLO matched) of one event: from its HLO instruction when every candidate module
    classifies it alike, else from its name alone (not matched)."""
    found = {classify_hlo(instr, module, ev.name, platform) for instr, module in _candidates(modules, ev)}
    if len(found) == 1:
        return (*found.pop(), True)
    return (*classify_name(ev.name, platform), False)


# ---- summary ---------------------------------------------------------------------------------------------------
def _busy_ns(events: list[_Event]) -> float:
    total, cur_start, cur_end = 0.0, None, None
    for ev in sorted(events, key=lambda e: e.start):
        if cur_end is None or ev.start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = ev.start, ev.end
        else:
            cur_end = max(cur_end, ev.end)
    return total + (cur_end - cur_start if cur_end is not None else 0.0)


def _typical_step(rows, n_steps: int, platform: str) -> tuple[dict[str, tuple[float | None, float | None]], float]:
    """({category: (pct, ms)}, ms) of one step with every op at the median of its event times (ns), times its
    events per step; rows are [category, count, total ns, event ns list]."""
    typical_ns = dict.fromkeys(CATEGORIES, 0.0)
    for category, count, _, durations in rows:
        typical_ns[category] += statistics.median(durations) * count / n_steps
    total_ns = sum(typical_ns.values()) or 1.0
    out: dict[str, tuple[float | None, float | None]] = {
        name: (100.0 * ns / total_ns, ns * 1e-6) for name, ns in typical_ns.items()
    }
    if platform not in TENSOR_CORE_PLATFORMS:
        out["tensor_core"] = (None, None)
    return out, sum(typical_ns.values()) * 1e-6


def _summarise(events, steps, modules, platform, device, source, notes) -> ProfileAnalysis:
    rows, cat_ns, flagged, matched_ns = _tally(events, modules, platform)
    total_ns = sum(cat_ns.values())
    if total_ns <= 0:
        raise TraceError(f"{source}: the device ops inside the steps add up to no time")
    ms = 1e-6
    categories: dict[str, tuple[float | None, float | None]] = {
        name: (100.0 * ns / total_ns, ns * ms) for name, ns in cat_ns.items()
    }
    if platform not in TENSOR_CORE_PLATFORMS:
        categories["tensor_core"] = (None, None)
    ops = tuple(sorted(
        (OpRow(name, op, mod, cat, count, ns * ms, ns * ms / count, 100.0 * ns / total_ns,
               *_op_facts(modules, first, count, trace_bytes, with_bytes, len(steps)))
         for (name, op, mod), (cat, count, ns, _, first, trace_bytes, with_bytes) in rows.items()),
        key=lambda r: (-r.total_ms, r.name, r.hlo_op),
    ))  # fmt: skip
    ms_per_step = total_ns * ms / len(steps)
    typical, typical_ms = _typical_step([r[:4] for r in rows.values()], len(steps), platform)
    known = [r for r in ops if r.bytes_per_step is not None]
    totals = {
        "device_ms": total_ns * ms,
        "steps": len(steps),
        "ms_per_step": ms_per_step,
        "typical_step_ms": typical_ms,
        "tok_s": 1000.0 / ms_per_step,
        "distinct_ops": len({(r.name, r.hlo_module) for r in ops}),
        "events": len(events),
        "step_wall_ms_mean": sum(e - s for s, e in steps) * ms / len(steps),
        "busy_ms": _busy_ns(events) * ms,
        "opaque_control_flow_ms": flagged["control_flow"] * ms,
        "hlo_matched_pct": 100.0 * matched_ns / total_ns,
        "op_bytes_per_step": sum(r.bytes_per_step for r in known),  # type: ignore[misc]
        "op_bytes_unknown_pct": sum(r.pct for r in ops if r.bytes_per_step is None),
        "op_bytes_sources": {src: sum(1 for r in known if r.bytes_source == src) for src in BYTES_SOURCES},
    }
    notes = _flag_notes(notes, flagged, total_ns, modules)
    return ProfileAnalysis(device, len(steps), categories, totals, ops, None, notes, source, typical)


def _tally(events, modules, platform) -> tuple[dict, dict[str, float], dict[str, float], float]:
    """`_summarise`'s one pass over the device ops inside the steps, each classified once per (name, op, module,
    program) (`_classify_event`). Returns (per (name, op, module): [category, count, self ns, each event's self
    ns, its first event, trace bytes, events with bytes]; self ns per category; self ns flagged "control_flow" /
    "unknown_dtype"; self ns of the events matched to an HLO instruction)."""
    cache: dict[tuple[str, str, str, str], tuple[str, str, bool]] = {}
    rows: dict[tuple[str, str, str], list] = {}
    cat_ns = dict.fromkeys(CATEGORIES, 0.0)
    flagged = {"control_flow": 0.0, "unknown_dtype": 0.0}
    matched_ns = 0.0
    for ev in events:
        key = (ev.name, ev.hlo_op, ev.hlo_module, ev.program_id)
        if key not in cache:
            cache[key] = _classify_event(modules, ev, platform)
        category, detail, matched = cache[key]
        cat_ns[category] += ev.self_ns
        if detail:
            flagged[detail] += ev.self_ns
        if matched:
            matched_ns += ev.self_ns
        row = rows.setdefault((ev.name, ev.hlo_op, ev.hlo_module), [category, 0, 0.0, [], ev, 0.0, 0])
        row[1] += 1
        row[2] += ev.self_ns
        row[3].append(ev.self_ns)
        if ev.trace_bytes is not None:
            row[5] += ev.trace_bytes
            row[6] += 1
    return rows, cat_ns, flagged, matched_ns


def _flag_notes(notes, flagged: dict[str, float], total_ns: float, modules) -> tuple[str, ...]:
    """`notes` and the analysis' own: the time XLA:CPU ran inside control flow it does not trace op by op, the
    products of an operand dtype the trace does not tell, and a trace without HLO protos."""
    ms = 1e-6
    notes = list(notes)
    if flagged["control_flow"] > 0:
        notes.append(f"{flagged['control_flow'] * ms:.3f} ms ({100 * flagged['control_flow'] / total_ns:.1f}%) ran "
                     f"inside while/call/conditional ops whose inner ops XLA:CPU does not trace one by one; "
                     f"counted as other (unroll the layer loop to see them)")  # fmt: skip
    if flagged["unknown_dtype"] > 0:
        notes.append(f"{flagged['unknown_dtype'] * ms:.3f} ms of matrix products with an operand dtype the trace "
                     f"does not tell; counted as other")  # fmt: skip
    if not modules:
        notes.append("the trace holds no HLO protos: categories come from op and kernel names only")
    return tuple(notes)


def _op_facts(modules: Mapping[str, HloModule], ev: _Event, count: int, trace_bytes: float, with_bytes: int,
              steps: int) -> tuple[str, float | None, str, dict | None]:  # fmt: skip
    """(HLO text, bytes per step, their source, parameter rewrite) of one op row, from its first event: bytes from
    the trace's stat when every event of the row has it, else from the HLO proto's shapes, else from the shapes of
    the op's own text (see the module doc)."""
    found = _candidates(modules, ev)
    instr, module = found[0] if found else (None, None)
    parsed = parse_instruction_text(ev.text) if ev.text else None
    hlo = ev.text if parsed is not None else instruction_text(instr, module) if instr is not None else ""
    rewrite = parameter_rewrite(instr, module) if instr is not None else None
    if count and with_bytes == count:
        return hlo, trace_bytes / steps, BYTES_SOURCES[0], rewrite
    per_run = bytes_from_hlo(instr, module) if instr is not None else None
    if per_run is not None:
        return hlo, per_run * count / steps, BYTES_SOURCES[1], rewrite
    if parsed is not None and parsed.opcode not in ("while", "call", "conditional"):
        return hlo, text_bytes(parsed) * count / steps, BYTES_SOURCES[2], rewrite
    return hlo, None, "", rewrite


# ---- the published table's shape -------------------------------------------------------------------------------
def format_profile_table(analysis: ProfileAnalysis | Mapping[str, Any]) -> list[tuple[str, str]]:
    """Rows (label, value) in the shape of the published profile table, from an analysis or its `to_json()` dict:
    dtype conversion %, fp32 gemv %, tensor core %, total kernel time, distinct kernels, the decode rates, bandwidth,
    roofline share. "fp32 gemv" is the matmul_fp32 category (at batch 1 a decode step's products are matrix-vector
    products). The decode rates are named for what they are (docs/method.md, "Profiles"): "device-time rate" is
    1000 / the profiled device ms per step, which leaves out the host's time between steps and is no gauge; where a
    sweep's cell was joined (the roofline's tok/s source "gauge"), "decode gauge (sweep)" stands beside it.
    On a TPU the tensor core row is labelled "tensor core (MXU)" (its matrix units). A category the device cannot
    have reads "absent"; a roofline not attached reads "not measured". Every share
    here is over all traced steps (the total device time of each category / the total: the mean step), never the
    typical step's; the labels say so.
    """
    data = analysis.to_json() if isinstance(analysis, ProfileAnalysis) else analysis
    cats, totals, roof = data["categories"], data["totals"], data.get("roofline") or {}

    def pct(name: str) -> str:
        value = cats.get(name, {}).get("pct")
        return "absent" if value is None else f"{value:.1f}%"

    joined = roof.get("tok_s") is not None and roof.get("tok_s_source") == "gauge"
    rates = [("decode gauge (sweep)", f"{roof['tok_s']:.1f} tok/s")] if joined else []
    rates.append(("device-time rate", f"{totals['tok_s']:.1f} tok/s (1000 / device ms per step)"))
    bandwidth = roof.get("bandwidth_bytes_s")
    share = roof.get("share_pct")
    tpu = (data.get("device") or {}).get("platform") == "tpu"
    return [
        ("dtype conversion", pct("dtype_conversion")),
        ("fp32 gemv", pct("matmul_fp32")),
        ("tensor core (MXU)" if tpu else "tensor core", pct("tensor_core")),
        ("total kernel time", f"{totals['device_ms']:,.1f} ms over {totals['steps']} steps"),
        ("distinct kernels", f"{totals['distinct_ops']}"),
        *rates,
        ("bandwidth", "not measured" if bandwidth is None else f"{bandwidth / 2**30:,.3f} GiB/s"),
        ("roofline share", "not measured" if share is None else f"{share:.0f}%"),
    ]
