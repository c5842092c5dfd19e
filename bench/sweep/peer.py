"""The peer in the archive: another engine (Hugging Face transformers) measured on the sweep's own workload.

Two stages, so that the run folder is written by this harness and the peer needs only its own packages:
1. `build_plan` / `write_plan` (`bench peer plan`): the workload as JSON: the checkpoint folder and its content
   hash, `max_new_tokens`, `repeats`, and per input size the sweep's own exact-length prompt
   (`bench.sweep.local.sized_prompt`: the same text and ids `bench sweep` times).
2. `scripts/transformers_peer.py` (run in its own Python 3.11 venv with torch and transformers, not in CI) reads
   the plan, measures, and writes one JSON line per request of raw host timestamps (`RAW_FORMAT`).
3. `read_requests` / `import_peer` (`bench peer import`): the raw requests become a run folder of provenance
   "measured": each request a `Sample` by the sweep's definitions (`bench.measure.request.request_times`,
   `bench.measure.degeneracy.check_degenerate`), each input size a `CellRow` by `bench.runs.summarize_cell`, the
   manifest by `bench.runs.build_manifest` with a `bench.runs.PeerEngine` (its build id is never one of ours).

The raw file, one JSON object per line (times from the peer's `time.perf_counter_ns`, a monotonic clock):
- first `{"record": "header", "format": RAW_FORMAT, "format_version": 1, "plan": <the plan>, "engine": {"name",
  "version", "framework", "settings"}, "versions": {...}, "command_line": [...], "device": "cpu",
  "weight_bytes": int, "load_s": float, "started_at": ISO 8601}`;
- per request `{"record": "request", "input_tokens", "kind" (cold|warmup|timed), "repeat", "prompt_ids",
  "token_ids", "t_start_ns" (text in hand, before tokenization), "t_prefill_ns" (the prefill forward's start),
  "t_token_ns" (each generated id on the host), "t_end_ns" (after detokenization), "compile_events"}`;
- per input size that could not be measured `{"record": "failed", "input_tokens", "error"}`;
- last `{"record": "end", "ended_at": ISO 8601}` (without it the peer did not finish: nothing is imported).
Order, as the sweep's (`bench.sweep.local.sweep_cells`): the first request of the process is `cold` (in the first
cell), then per cell one `warmup` and the timed repeats 0..repeats-1.

Standard library and the harness only (no jax, no torch). Errors: `PeerError` (one line naming the file, and the
line where it applies) for a plan or raw file that is missing, malformed, of another workload or incomplete.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bench.errors import BenchError
from bench.measure.degeneracy import check_degenerate
from bench.measure.request import request_times
from bench.runs.manifest import CheckpointFacts, CompileCacheFacts, EngineConfig, PeerEngine, Workload, build_manifest
from bench.runs.records import CellRow, Sample, failed_cell, summarize_cell

PLAN_FORMAT, RAW_FORMAT, FORMAT_VERSION = "gemma4-bench peer plan", "gemma4-bench peer requests", 1
PEER_KINDS = ("cold", "warmup", "timed")
COMPILE_NOTE = ("eager PyTorch (no torch.compile): per request, the graphs torch._dynamo compiled in the peer "
                "process (its counters), read before and after")  # fmt: skip


class PeerError(BenchError):
    """A peer plan or raw-requests file that cannot be used (missing, malformed, another workload, unfinished)."""


# ---- stage 1: the plan ---------------------------------------------------------------------------------------------
def build_plan(tokenizer, checkpoint_dir: Path, checkpoint: CheckpointFacts, config, *,
               max_positions: int | None = None) -> dict[str, Any]:  # fmt: skip
    """The peer's workload (the module docstring's plan) for a `bench.sweep.SweepConfig` on the checkpoint in
    `checkpoint_dir` (a `model.tokenizer.GemmaTokenizer` of it; `checkpoint` its facts, content hash included).
    Every prompt is the sweep's own (`sized_prompt`). Raises InputError for a size below the smallest prompt, or
    whose prompt plus max_new_tokens exceeds `max_positions` (the model's positions)."""
    from bench.errors import InputError
    from bench.sweep.local import sized_prompt

    config.check()
    prompts = []
    for n in config.inputs:
        if max_positions is not None and n + config.max_new_tokens > max_positions:
            raise InputError(f"--inputs {n}: {n} + --max-new-tokens {config.max_new_tokens} exceeds the model's "
                             f"{max_positions} positions; pass smaller sizes")  # fmt: skip
        p = sized_prompt(tokenizer, n)
        prompts.append({"input_tokens": n, "text": p.text, "ids": list(p.ids)})
    return {
        "format": PLAN_FORMAT, "format_version": FORMAT_VERSION,
        "checkpoint": {"path": str(Path(checkpoint_dir).resolve()), "id": checkpoint.id, "source": checkpoint.source,
                       "content_hash": checkpoint.content_hash},
        "max_new_tokens": config.max_new_tokens, "repeats": config.repeats, "prompts": prompts,
    }  # fmt: skip


def write_plan(plan: Mapping[str, Any], out: Path) -> Path:
    """Write `plan` to `out` (JSON; its folder created; atomic replace). Returns `out`. PeerError when unwritable."""
    out = Path(out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(plan, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise PeerError(f"--out {out}: cannot write the plan ({exc.strerror or exc}); pass another path") from None
    return out


# ---- stage 3: reading the raw requests -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class PeerRequests:
    """A raw-requests file, read and checked: its `header` (dict), the plan it measured (`plan`), every request's
    `Sample` by input size (`samples`, in file order) and the sizes that failed (`failed`: {size: error})."""

    path: Path
    header: Mapping[str, Any]
    plan: Mapping[str, Any]
    samples: Mapping[int, list[Sample]]
    failed: Mapping[int, str]
    ended_at: str | None

    @property
    def sizes(self) -> list[int]:
        return [p["input_tokens"] for p in self.plan["prompts"]]


_HEADER_FIELDS = {"format": str, "format_version": int, "plan": dict, "engine": dict, "versions": dict,
                  "command_line": list, "device": str, "weight_bytes": int, "load_s": (int, float), "started_at": str}
_REQUEST_FIELDS = {"input_tokens": int, "kind": str, "repeat": int, "prompt_ids": list, "token_ids": list,
                   "t_start_ns": int, "t_prefill_ns": int, "t_token_ns": list, "t_end_ns": int,
                   "compile_events": (int, type(None))}  # fmt: skip
_PLAN_FIELDS = {"format": str, "format_version": int, "checkpoint": dict, "max_new_tokens": int, "repeats": int,
                "prompts": list}  # fmt: skip


def _check_fields(obj: Mapping[str, Any], fields: Mapping[str, Any], where: str) -> None:
    for key, tp in fields.items():
        if key not in obj:
            raise PeerError(f"{where}: missing field {key!r}")
        if isinstance(obj[key], bool) or not isinstance(obj[key], tp):
            raise PeerError(f"{where}: field {key!r} has the wrong type ({type(obj[key]).__name__})")


def check_plan(plan: Any, where: str) -> None:
    """PeerError (naming `where`) unless `plan` is a plan of this format with sizes and prompts that agree."""
    if not isinstance(plan, dict):
        raise PeerError(f"{where}: expected a JSON object (a plan written by `bench peer plan`)")
    _check_fields(plan, _PLAN_FIELDS, where)
    if plan["format"] != PLAN_FORMAT or plan["format_version"] != FORMAT_VERSION:
        raise PeerError(f"{where}: not a peer plan of version {FORMAT_VERSION}; write one with `bench peer plan`")
    for p in plan["prompts"]:
        ok = isinstance(p, dict) and isinstance(p.get("input_tokens"), int) and isinstance(p.get("ids"), list)
        if not ok or not isinstance(p.get("text"), str) or len(p["ids"]) != p["input_tokens"]:
            raise PeerError(f"{where}: a prompt without text, or whose ids do not number its input_tokens; write "
                            "the plan with `bench peer plan`")  # fmt: skip
    if not plan["prompts"] or plan["max_new_tokens"] < 2 or plan["repeats"] < 1:
        raise PeerError(f"{where}: expected prompts, max_new_tokens >= 2 and repeats >= 1")


def _parse_lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(where, record) per non-empty line; PeerError for a missing file or a line that is not a JSON record."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise PeerError(f"{path}: cannot read the peer's requests ({exc.strerror or exc}); run the peer first "
                        "(scripts/transformers_peer.py, or make peer)") from None  # fmt: skip
    except UnicodeDecodeError:
        raise PeerError(f"{path}: not UTF-8 text; expected the JSON lines of scripts/transformers_peer.py") from None
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PeerError(f"{where}: not JSON ({exc.msg}); expected one JSON object per line") from None
        if not isinstance(record, dict) or record.get("record") not in ("header", "request", "failed", "end"):
            raise PeerError(f"{where}: expected an object with record header, request, failed or end")
        out.append((where, record))
    if not out or out[0][1]["record"] != "header":
        raise PeerError(f"{path}: the first line is not the peer's header; expected the JSON lines of "
                        "scripts/transformers_peer.py")  # fmt: skip
    if out[-1][1]["record"] != "end":
        raise PeerError(f"{path}: no end record: the peer did not finish (stopped or failed); run it again")
    return out


def peer_sample(req: Mapping[str, Any], where: str) -> Sample:
    """The `Sample` of one raw request, by the sweep's definitions (`request_times`, docs/method.md "Per
    request"; prefill = the prefill forward's start to the first id on the host; degeneracy judged here).
    PeerError when its times are not in order or its ids are not token ids."""
    _check_fields(req, _REQUEST_FIELDS, where)
    ids, t = req["token_ids"], req["t_token_ns"]
    if not ids or len(t) != len(ids) or not all(isinstance(x, int) and not isinstance(x, bool) for x in ids + t):
        raise PeerError(f"{where}: expected one integer t_token_ns per generated token id (at least one)")
    order = [req["t_start_ns"], req["t_prefill_ns"], *t, req["t_end_ns"]]
    if any(b < a for a, b in zip(order, order[1:])):
        raise PeerError(f"{where}: timestamps out of order (start <= prefill <= tokens <= end expected)")
    if req["kind"] not in PEER_KINDS:
        raise PeerError(f"{where}: kind {req['kind']!r}, expected one of {PEER_KINDS}")
    verdict = check_degenerate(ids)
    return Sample(
        input_tokens=req["input_tokens"], kind=req["kind"], repeat=req["repeat"],
        prefill_ms=(t[0] - req["t_prefill_ns"]) / 1e6, generated_tokens=len(ids),
        compile_events=req["compile_events"], degenerate=verdict.degenerate, degenerate_reason=verdict.reason,
        token_ids=list(ids), **request_times(req["t_start_ns"], list(t), req["t_end_ns"], len(ids)),
    )  # fmt: skip


def read_requests(path: str | Path) -> PeerRequests:
    """Read and check a raw-requests file (module docstring). PeerError, one line naming the file (and line),
    for a missing or malformed file, an unfinished peer, a request whose prompt ids are not the plan's, or an
    order of requests other than the sweep's (one cold request first, then per size one warm-up and the timed
    repeats 0..repeats-1), or a size of the plan with neither requests nor a failure record."""
    path = Path(path)
    records = _parse_lines(path)
    where, header = records[0]
    _check_fields(header, _HEADER_FIELDS, where)
    if header["format"] != RAW_FORMAT or header["format_version"] != FORMAT_VERSION:
        raise PeerError(f"{where}: format {header['format']!r} version {header['format_version']}, expected "
                        f"{RAW_FORMAT!r} version {FORMAT_VERSION}")  # fmt: skip
    check_plan(header["plan"], f"{where} (its plan)")
    engine_fields = {"name": str, "version": str, "framework": str, "settings": dict}
    _check_fields(header["engine"], engine_fields, f"{where} (its engine)")
    plan = header["plan"]
    prompts = {p["input_tokens"]: p["ids"] for p in plan["prompts"]}
    samples: dict[int, list[Sample]] = {}
    failed: dict[int, str] = {}
    for where, rec in records[1:-1]:
        n = rec.get("input_tokens")
        if n not in prompts:
            raise PeerError(f"{where}: input_tokens {n!r} is not a size of the plan ({', '.join(map(str, prompts))})")
        if rec["record"] == "failed":
            failed[n] = str(rec.get("error") or "failed")[:500]
            continue
        if rec["record"] != "request":
            raise PeerError(f"{where}: a {rec['record']} record inside the file; expected requests")
        if rec.get("prompt_ids") != prompts[n]:
            raise PeerError(f"{where}: the prompt ids differ from the plan's {n}-token prompt; the peer measured "
                            "another prompt")  # fmt: skip
        samples.setdefault(n, []).append(peer_sample(rec, where))
    _check_order(path, plan, samples, failed)
    return PeerRequests(path=path, header=header, plan=plan, samples=samples, failed=failed,
                        ended_at=records[-1][1].get("ended_at"))  # fmt: skip


def _check_order(path: Path, plan: Mapping[str, Any], samples: Mapping[int, list[Sample]],
                 failed: Mapping[int, str]) -> None:  # fmt: skip
    """PeerError unless the requests follow the sweep's order (see `read_requests`)."""
    cold_at = [n for n, ss in samples.items() for s in ss if s.kind == "cold"]
    if len(cold_at) > 1 or (cold_at and samples[cold_at[0]][0].kind != "cold"):
        raise PeerError(f"{path}: expected one cold request, the first of its cell; got {len(cold_at)}")
    for n in (p["input_tokens"] for p in plan["prompts"]):
        if n in failed:
            continue
        kinds = [(s.kind, s.repeat) for s in samples.get(n, []) if s.kind != "cold"]
        expected = [("warmup", 0)] + [("timed", r) for r in range(plan["repeats"])]
        if kinds != expected:
            raise PeerError(f"{path}: the {n}-token cell has requests {kinds or 'none'}, expected one warm-up and "
                            f"timed repeats 0..{plan['repeats'] - 1}; run the peer again")  # fmt: skip


# ---- stage 3: the run folder ----------------------------------------------------------------------------------------
def peer_engine(raw: PeerRequests) -> PeerEngine:
    """The `PeerEngine` the raw file's header names (engine, settings, the peer process's versions and command)."""
    e = raw.header["engine"]
    return PeerEngine(name=e["name"], version=e["version"], framework=e["framework"], settings=dict(e["settings"]),
                      versions=dict(raw.header["versions"]), command_line=tuple(map(str, raw.header["command_line"])))


def peer_manifest(raw: PeerRequests):
    """The run's `bench.runs.Manifest` (command "peer"): the peer's engine, versions and settings; the plan's
    checkpoint (id, source, content hash; the peer's own weight bytes and load time; no path); the workload of
    the plan; the peer's device (CPU); float32 throughout; no bucket ladder (the peer prefills the exact
    prompt). started_at is when the peer started."""
    settings = raw.header["engine"]["settings"]
    dtype = str(settings.get("dtype") or "float32")
    ck = raw.plan["checkpoint"]
    peer = peer_engine(raw)
    engine = EngineConfig(buckets=None, max_length=None, batch=1, quantization="none", weight_dtype=dtype,
                          activation_dtype=dtype, kv_cache_dtype=dtype, compute_dtype=dtype)  # fmt: skip
    workload = Workload(inputs=tuple(raw.sizes), max_new_tokens=raw.plan["max_new_tokens"], repeats=raw.plan["repeats"],
                        sampling="greedy", eos="ignored while benchmarking",
                        notes={"peer": peer.label, "compile_events": COMPILE_NOTE})  # fmt: skip
    device = {"platform": raw.header["device"], "device_kind": raw.header["device"], "count": 1, "memory_bytes": None,
              "compute_capability": None, "architecture": None, "driver_version": None, "cuda_plugin": None,
              "slug": raw.header["device"], "where": f"the {peer.label} peer process"}  # fmt: skip
    line = (f"peer policy: {peer.label} on {peer.framework}, {raw.header['device']}, dtype {dtype}, attention "
            f"{settings.get('attn_implementation')}, {settings.get('threads')} threads")  # fmt: skip
    manifest = build_manifest(
        "peer", peer=peer, engine=engine, workload=workload, device=device,
        checkpoint=CheckpointFacts(id=ck.get("id"), source=ck.get("source"), content_hash=ck.get("content_hash"),
                                   weight_bytes=raw.header["weight_bytes"], load_s=float(raw.header["load_s"])),
        dtype_policy={"line": line, "compute_dtype": dtype, "weights": dtype, "activations": dtype, "kv_cache": dtype},
        compile_cache=CompileCacheFacts(dir=None),
        extra={"peer_measured": {"started_at": raw.header["started_at"], "ended_at": raw.ended_at}},
    )  # fmt: skip
    return dataclasses.replace(manifest, started_at=raw.header["started_at"])


def peer_cells(raw: PeerRequests) -> list[tuple[list[Sample], CellRow]]:
    """Per input size of the plan, in its order: (its samples, its row): `summarize_cell` of the samples, or a
    `failed_cell` for a size the peer could not measure. Bucket None: the peer prefills the exact prompt."""
    mnt, repeats = raw.plan["max_new_tokens"], raw.plan["repeats"]
    out = []
    for n in raw.sizes:
        ss = raw.samples.get(n, [])
        if n in raw.failed:
            out.append((ss, failed_cell(n, raw.failed[n], max_new_tokens=mnt, repeats=repeats)))
        else:
            out.append((ss, summarize_cell(ss, max_new_tokens=mnt, bucket=None, input_tokens=n)))
    return out


def import_peer(path: str | Path, runs_dir: Path, name: str | None, *,
                progress: Callable[[str], None] = lambda _: None):  # fmt: skip
    """Read the raw requests at `path` (`read_requests`) and archive them as a complete run folder in `runs_dir`,
    label `name` (None: "<engine name>", suffixed -2, -3, ... when taken). Returns the `bench.runs.RunFolder`.
    Raises PeerError for a bad file (before any folder is made), RunFolderError / InputError for the folder."""
    from bench.runs import create_run, free_label, writing_run

    raw = read_requests(path)
    manifest = peer_manifest(raw)
    slug, date = manifest.slug or "unknown", (manifest.started_at or "")[:10] or None
    label = name or free_label(runs_dir, manifest.peer.name, slug, date)
    with writing_run(lambda: create_run(runs_dir, label, slug, manifest, date=date)) as run:
        run.log(f"{manifest.dtype_policy['line']}")
        run.log(f"imported from {Path(path).name}: the peer measured from {raw.header['started_at']} to {raw.ended_at}")
        for samples, row in peer_cells(raw):
            run.append_samples(samples)
            run.append_cell(row)
            state = "valid" if row.valid else f"INVALID: {row.invalid_reason}"
            run.log(f"{row.input_tokens} input tokens: {state}; gauge {row.gauge_tok_s_median} tok/s, "
                    f"e2e {row.e2e_tok_s_median} tok/s")  # fmt: skip
            progress(f"{row.input_tokens} input tokens: {state}")
    return run
