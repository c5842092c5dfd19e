"""`bench sweep --target http://HOST:PORT/v1`: the sweep measured through any OpenAI-compatible server.

Same cells, warm-up and statistics as the in-process sweep (bench/sweep/local.py, docs/method.md): every
prompt built and sized first; the first request recorded as `cold` (the first request of this sweep: whether the
server was fresh is not knowable from outside); per cell one warm-up request, then the timed repeats; each cell
summarised by `bench.runs.records.summarize_cell` and written to the run folder as it ends. SIGTERM / Ctrl-C stop it as
they stop the in-process sweep (`bench.sweep.local.StopSignals`): after the request in flight, finished cells kept, the run
marked incomplete (and resumable with --resume), exit code 130.

One request = one streamed `POST {target}/chat/completions` (`stream: true`, `stream_options.include_usage`,
`temperature: 0`, `max_tokens`, and `ignore_eos: true`, the vLLM extension this project's server also honours, so
every repeat generates exactly max_tokens). Times are client-side, `time.perf_counter_ns`:
- end-to-end: from just before the request is sent (prompt text in hand) to the end of the stream;
- TTFT: to the first streamed chunk that carries content (non-empty text, or, from this project's server, token
  ids); a role-only chunk does not count;
- decode time: first to last content chunk; gauge = (completion tokens - 1) / decode time, completion tokens from
  the server's `usage` (a server that packs several tokens into one chunk shifts this by at most a chunk);
- step times: the gaps between content chunks (one token per chunk on this project's server).

Exact input sizes: the prompts are built with a local tokenizer (`--checkpoint`, or, when the target is this
project's server and its checkpoint folder exists on this machine, that folder), sent as one user message, and
every response's `usage.prompt_tokens` must equal the cell's size, or the cell fails naming both counts (the
server's chat template or tokenizer differs). Nothing is estimated.

Degeneracy: judged on the generated ids when the server streams them (this project's `token_ids`), otherwise on the
generated text re-tokenized with the local tokenizer; a server-side verdict of degenerate (this project's) counts too.
Compile events: from this project's `/metrics` (jax traces before and after the request); for another server they
are not observable and are recorded as null, which leaves such cells unproven and so invalid (the manifest says
so). The server-side decode gauge of each request (this project's `/metrics`, stat "last") is kept in
`target.json` beside the client-side one.

The run folder records the target, `/v1/models`, `/health` and whether it is this project's server (manifest key
`target`, and `target.json`). Errors: `TargetError` (one line) for an unreachable target, an unknown model, or no
tokenizer to size prompts with. The target itself (who it is, its metrics, the prompt tokenizer, a streamed chunk)
is bench/sweep/target.py's, shared with the sweep under load (bench/sweep/load.py).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from bench.errors import RunFolderError
from bench.measure.degeneracy import check_degenerate
from bench.measure.request import Measured, request_times
from bench.runs.records import CellRow, Sample
from bench.sweep.load import run_load_sweep
from bench.sweep.target import (GAUGE_LAST, TIMEOUT, TRACES, Target, TargetError, describe_target, fold_chunk,
                                load_prompt_tokenizer, parse_metrics, scrape_metrics)  # fmt: skip

if TYPE_CHECKING:
    from bench.sweep.local import StopSignals

# The target's names (bench/sweep/target.py, shared with the sweep under load) are read from here too.
__all__ = ["TargetError", "Target", "describe_target", "parse_metrics", "scrape_metrics", "fold_chunk", "Streamed",
           "stream_chat", "measure_remote", "run_remote_sweep", "served_bucket", "remote_manifest", "sweep_target"]


# ---- one request ----------------------------------------------------------------------------------------------------
class Streamed:
    """What one streamed answer delivered: request start / end and content-chunk arrival times (ns), the text, the
    streamed ids (None when the server sends none), usage, the server's degeneracy verdict (None if none)."""

    def __init__(self) -> None:
        self.t_start = self.t_end = 0
        self.t_content: list[int] = []
        self.text = ""
        self.token_ids: list[int] | None = None
        self.usage: dict[str, Any] | None = None
        self.verdict: dict[str, Any] | None = None


def stream_chat(client: httpx.Client, target: Target, text: str, max_tokens: int) -> Streamed:
    """One streamed chat completion of `text`, timed. Raises TargetError for an error status or an error event."""
    payload = {
        "model": target.model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
        "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
    }  # fmt: skip
    out = Streamed()
    out.t_start = time.perf_counter_ns()
    with client.stream("POST", f"{target.base}/chat/completions", json=payload) as r:
        if r.status_code != 200:
            raise TargetError(f"{target.base}/chat/completions answered {r.status_code}: {r.read().decode()[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            t = time.perf_counter_ns()
            obj = json.loads(data)
            if "error" in obj:
                raise TargetError(f"the server reported an error mid-stream: {obj['error']}"[:300])
            fold_chunk(out, obj, t)
    out.t_end = time.perf_counter_ns()
    return out


def measure_remote(client: httpx.Client, target: Target, tokenizer, prompt, max_new_tokens: int, *, kind: str,
                   repeat: int) -> tuple[Sample, float | None]:  # fmt: skip
    """Measure one request of `prompt` (a bench.measure.prompts.Prompt). Returns (Sample, server-side gauge tok/s or None).
    Raises TargetError when the server's prompt count differs from the prompt's exact size, or no usage/content."""
    before = scrape_metrics(client, target.root) if target.ours else {}
    s = stream_chat(client, target, prompt.text, max_new_tokens)
    after = scrape_metrics(client, target.root) if target.ours else {}
    if not s.usage or "prompt_tokens" not in s.usage or "completion_tokens" not in s.usage:
        raise TargetError("the server sent no usage (prompt_tokens, completion_tokens): cannot check the input size")
    if s.usage["prompt_tokens"] != prompt.n_tokens:
        raise TargetError(f"the server counted {s.usage['prompt_tokens']} prompt tokens for a prompt of exactly "
                          f"{prompt.n_tokens}: its tokenizer or chat template differs; pass the served model's "
                          "tokenizer with --checkpoint")  # fmt: skip
    if not s.t_content:
        raise TargetError("no streamed chunk carried content")
    n = int(s.usage["completion_tokens"])
    ids = s.token_ids if s.token_ids is not None else tokenizer.encode(s.text)
    verdict = check_degenerate(ids)
    degenerate, reason = verdict.degenerate, verdict.reason
    if s.verdict and s.verdict.get("degenerate"):
        degenerate, reason = True, reason or f"server: {s.verdict.get('reason')}"
    traces = int(after.get(TRACES, 0) - before.get(TRACES, 0)) if target.ours else None  # None: not observable
    sample = Sample(
        input_tokens=int(s.usage["prompt_tokens"]), kind=kind, repeat=repeat, prefill_ms=None, generated_tokens=n,
        compile_events=traces, degenerate=degenerate, degenerate_reason=reason, token_ids=list(ids),
        **request_times(s.t_start, s.t_content, s.t_end, n),
    )  # fmt: skip
    return sample, after.get(GAUGE_LAST)


# ---- the sweep --------------------------------------------------------------------------------------------------------
def run_remote_sweep(client: httpx.Client, target: Target, tokenizer, config, run, prompts: dict, *,
                     progress: Callable[[str], None] = lambda _: None, skip: Sequence[int] = (),
                     should_stop: Callable[[], bool] = lambda: False,
                     server_gauges: dict[str, Any] | None = None) -> list[CellRow]:  # fmt: skip
    """`bench.sweep.local.sweep_cells` through the target (same cold / warm-up / timed order, failure handling and stop:
    `should_stop` polled before every request, KeyboardInterrupt when it turns true, finished cells kept).
    `server_gauges` collects this project's server-side gauges per cell (timed repeats)."""
    from bench.sweep.local import sweep_cells

    gauges: dict[int, list] = {}

    def measure(prompt, kind: str, repeat: int) -> Measured:
        sample, gauge = measure_remote(client, target, tokenizer, prompt, config.max_new_tokens, kind=kind,
                                       repeat=repeat)  # fmt: skip
        if kind == "timed":
            gauges.setdefault(prompt.n_tokens, []).append(gauge)
        return Measured(sample=sample, bucket=served_bucket(target, prompt.n_tokens))

    def after_cell(n: int, _row: CellRow) -> str:
        if server_gauges is None or not target.ours:
            return ""
        timed = gauges.get(n, [])
        known = [g for g in timed if g is not None]
        server_gauges[str(n)] = {"timed": timed, "median": statistics.median(known) if known else None}
        return f", server gauge {server_gauges[str(n)]['median']} tok/s"

    return sweep_cells(config, run, prompts, measure=measure, progress=lambda line: progress(f"{line} via {target.base}"),
                       skip=skip, should_stop=should_stop, after_cell=after_cell)  # fmt: skip


def served_bucket(target: Target, n_tokens: int) -> int | None:
    """The bucket this project's server pads a prompt of `n_tokens` to: the smallest rung of the ladder its /health
    publishes that holds it (its engine's rule; a response does not report the bucket it ran). None for another
    server, or a size above the ladder."""
    buckets = (((target.health or {}).get("body") or {}).get("buckets") or []) if target.ours else []
    return next((b for b in buckets if b >= n_tokens), None)


def remote_manifest(target: Target, config, tokenizer_source: str, load: dict[str, Any] | None = None):
    """The run's manifest (`bench.runs.manifest.build_manifest`, command "sweep --target"): this client's host and
    versions; the server's build id, device, dtype policy, checkpoint and engine configuration where it reports
    them (this project's /health), else nulls; the target under key `target` (its /v1/models and /health answers).
    `load`: a sweep under load's settings (`bench.sweep.load.LoadConfig.notes()`), recorded as workload note
    "load" (and the server's `serving` settings, where its /health reports them, as note "serving"). Returns a
    `bench.runs.Manifest`."""
    from bench.runs.environment import device_slug
    from bench.runs.manifest import (
        CheckpointFacts,
        CompileCacheFacts,
        EngineConfig,
        TargetFacts,
        Workload,
        build_manifest,
    )

    h = ((target.health or {}).get("body") or {}) if target.ours else {}
    dev, pol, ck, cc = h.get("device") or {}, h.get("dtype_policy"), h.get("checkpoint") or {}, h.get("compile_cache") or {}
    slug = ("cpu" if dev.get("platform") == "cpu" else device_slug(dev.get("device_kind"))) if dev else "remote"
    engine = EngineConfig(buckets=tuple(h["buckets"]) if h.get("buckets") else None, max_length=h.get("max_length"),
                          batch=1, quantization=h.get("quantization"), scale_dtype=h.get("scale_dtype"),
                          weight_dtype=(pol or {}).get("weights"), activation_dtype=(pol or {}).get("activations"),
                          kv_cache_dtype=(pol or {}).get("kv_cache"), compute_dtype=(pol or {}).get("compute"),
                          kernel=h.get("kernel") if isinstance(h.get("kernel"), str) else None,
                          xla_options=h.get("xla_options") if isinstance(h.get("xla_options"), str) else None,
                          backend=h.get("backend") if isinstance(h.get("backend"), str) else None)  # fmt: skip
    observed = "from the server's /metrics" if target.ours else "not observable: recorded as null (cells invalid)"
    notes = {"target": target.base, "model": target.model, "server": target.kind, "prompt_tokenizer": tokenizer_source,
             "timing": "client-side, streamed; TTFT to the first content chunk", "compile_events": observed}  # fmt: skip
    if load is not None:
        notes["load"] = load
        notes["timing"] = ("client-side, streamed, concurrent (asyncio); TTFT to the first content chunk, ITL between "
                           "content chunks, at each chunk's arrival")  # fmt: skip
        if isinstance(h.get("serving"), dict):
            notes["serving"] = h["serving"]
    workload = Workload(inputs=tuple(config.inputs), max_new_tokens=config.max_new_tokens, repeats=config.repeats,
                        sampling="greedy (temperature 0)", eos="ignored while benchmarking (ignore_eos sent)",
                        notes=notes)  # fmt: skip
    return build_manifest(
        "sweep --target", engine=engine, workload=workload,
        checkpoint=CheckpointFacts(id=ck.get("id") or target.model, source=ck.get("source"),
                                   content_hash=ck.get("content_hash"), weight_bytes=ck.get("weight_bytes")),
        device=dict(dev, slug=slug, where="the target server" if dev else "unknown (not reported by the target)"),
        dtype_policy=({"compute_dtype": pol.get("compute"), "weights": pol.get("weights"),
                       "activations": pol.get("activations"), "kv_cache": pol.get("kv_cache"),
                       "pre_ampere": pol.get("pre_ampere"), "line": pol.get("line")} if pol else None),
        compile_cache=CompileCacheFacts(dir=cc.get("dir")),
        target=TargetFacts(build_id=h.get("build_id"), description=target.describe()),
    )  # fmt: skip


def _stored_gauges(run) -> dict[str, Any]:
    """The server-side gauges a resumed run's target.json holds (RunFolderError naming the file when corrupt)."""
    stored = run.read_json("target.json")  # RunFolderError for a file that is not JSON
    gauges = stored.get("server_gauge_tok_s") if isinstance(stored, dict) else None
    if not isinstance(stored, dict) or not isinstance(gauges or {}, dict):
        raise RunFolderError(f"{run.path / 'target.json'}: expected a JSON object with a server_gauge_tok_s object; "
                             "restore the file, or start a new run with --name")  # fmt: skip
    return gauges or {}


def sweep_target(url: str, model: str | None, config, *, checkpoint: str | None, runs_dir: Path, name: str | None,
                 resume: Path | None = None, progress: Callable[[str], None] = lambda _: None,
                 stop: StopSignals | None = None, api_key: str | None = None, load: bool = False):  # fmt: skip
    """The whole `bench sweep --target` job: describe the target, size every prompt, create (or resume) the run
    folder (label `name`; None: "sweep", suffixed -2, -3, ... when taken), measure, mark it complete or
    incomplete, and say so through `progress` ("sweep STATUS in S s; run folder PATH"). Returns the RunFolder.
    Raises TargetError / InputError / RunFolderError before anything is measured for a bad target, model,
    tokenizer, size or folder.

    `stop` (a `bench.sweep.local.StopSignals`) is entered just before the run folder is created or resumed, as the
    in-process sweep does: SIGTERM / Ctrl-C then finish the request in flight and stop before the next one (a
    second signal abandons it, closing its stream); the finished cells stay, the run is marked incomplete and
    KeyboardInterrupt propagates. Whatever ends the sweep once the run exists (a signal, an error), the run ends
    (`bench.runs.writing_run`): complete, incomplete (a signal) or failed (an error), its lock released.
    With `resume`, target.json is read before the run is touched: a corrupt one is refused, the run left as it was.
    `api_key`, when given, goes with every request as `Authorization: Bearer KEY` and is recorded nowhere.
    `load`: `config` is a `bench.sweep.load.LoadConfig` and the sweep runs its load levels (`run_load_sweep`)
    instead of the one-at-a-time cells; resuming one needs the run's own load settings (num_requests,
    request_rate, seed, max_new_tokens), else RunFolderError.
    """
    from bench.runs import writing_run

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(timeout=TIMEOUT, headers=headers) as client:
        target = describe_target(client, url, model)
        tokenizer, source = load_prompt_tokenizer(checkpoint, target)
        prompts = _sized_prompts(target, tokenizer, config)
        manifest = remote_manifest(target, config, source, load=config.notes() if load else None)
        resumed, gauges = _opened_for_resume(resume, config if load else None)
        metrics0: dict[str, float] = {}
        t0 = time.perf_counter()

        def start():
            return _start_run(resumed, runs_dir, name, manifest)

        def before_end(run, _status: str) -> None:
            _record_target(client, target, run, manifest, metrics0, gauges)

        def after_end(run, status: str) -> None:
            progress(f"sweep {status} in {time.perf_counter() - t0:.1f} s; run folder {run.path}")

        # The stop signals are in force from before the run exists to after it ended: a signal anywhere in between
        # (the /metrics scrape below, a corrupt file, the requests) ends the run incomplete, never left "running".
        with (
            stop if stop is not None else contextlib.nullcontext(),
            writing_run(start, before_end=before_end, after_end=after_end) as run,
        ):
            progress(f"run folder: {run.path}; target {target.base} ({target.kind}), model {target.model}")
            if target.ours:
                metrics0.update(scrape_metrics(client, target.root))
            should_stop = stop if stop is not None else (lambda: False)
            if load:
                run_load_sweep(target, tokenizer, config, run, prompts, headers=headers, progress=progress,
                               should_stop=should_stop)  # fmt: skip
            else:
                run_remote_sweep(client, target, tokenizer, config, run, prompts, progress=progress,
                                 skip=run.finished_inputs(), should_stop=should_stop, server_gauges=gauges)  # fmt: skip
    return run


def _sized_prompts(target: Target, tokenizer, config) -> dict:
    """{input size: prompt} of exactly each of `config.inputs` tokens, built as the in-process sweep builds them
    (`bench.sweep.local.sized_prompt`). Raises TargetError for a size above this project's server's largest
    bucket (its /health), before anything is built."""
    from bench.sweep.local import sized_prompt

    limit = (((target.health or {}).get("body") or {}).get("buckets") or [None])[-1] if target.ours else None
    if limit is not None and max(config.inputs) > limit:
        raise TargetError(f"--inputs {max(config.inputs)}: above the server's maximum prompt length {limit}")
    return {n: sized_prompt(tokenizer, n) for n in config.inputs}  # as the in-process sweep's


def _opened_for_resume(resume: Path | None, load_config) -> tuple[Any, dict[str, Any]]:
    """(the run folder at `resume`, opened and checked before it is touched, or None without `resume`; the
    server-side gauges its target.json holds, {} for none). Raises RunFolderError for a complete run, another
    kind of sweep or other load settings (`_check_resumed_load`; `load_config` None: the one-at-a-time sweep),
    and a corrupt target.json."""
    from bench.runs import open_run

    gauges: dict[str, Any] = {}
    if resume is None:
        return None, gauges
    resumed = open_run(resume)
    if resumed.status == "complete":
        raise RunFolderError(f"run {resume} is already complete; start a new one with --name")
    _check_resumed_load(resumed, load_config)
    if (resumed.path / "target.json").is_file():  # read (and so checked) before the run is touched
        gauges.update(_stored_gauges(resumed))
    return resumed, gauges


def _start_run(resumed, runs_dir: Path, name: str | None, manifest):
    """The run the sweep writes: `resumed`, marked running again, or a new one in `runs_dir` labelled `name`
    (None: "sweep", suffixed -2, -3, ... when taken)."""
    from bench.runs import create_run, free_label

    if resumed is None:
        slug = manifest.slug
        return create_run(runs_dir, name or free_label(runs_dir, "sweep", slug), slug, manifest)
    resumed.resume()
    return resumed


def _record_target(client: httpx.Client, target: Target, run, manifest, metrics0: dict[str, float],
                   gauges: dict[str, Any]) -> None:  # fmt: skip
    """Before the run ends, whatever ended it: this project's server's compile-cache hits and misses during the
    sweep (its /metrics against `metrics0`) into the manifest, and target.json (the target and its server-side
    `gauges`), written even when the scrape fails or a second signal arrives during it."""
    try:  # a second signal here (e.g. a slow /metrics) must not lose target.json; the run ends regardless
        if target.ours:
            m = scrape_metrics(client, target.root)
            delta = {k: int(m.get(f"gemma4_bench_compile_cache_{k}_total", 0)
                            - metrics0.get(f"gemma4_bench_compile_cache_{k}_total", 0))
                     for k in ("hits", "misses")}  # fmt: skip
            run.update_manifest(compile_cache={"dir": manifest.compile_cache.dir, **delta})
    finally:
        run.write_json("target.json", target.describe() | {"server_gauge_tok_s": gauges})


def _check_resumed_load(run, config) -> None:
    """RunFolderError unless the resumed `run` is the same kind of sweep as this one (`config`: a LoadConfig, or
    None for the one-at-a-time sweep) with the same load settings (all but the concurrency levels, which may grow)."""
    stored = (run.typed_manifest.workload.notes or {}).get("load")
    if config is None and stored is None:
        return
    if config is None or stored is None:
        was, now = ("a sweep under load" if stored else "a one-at-a-time sweep"), ("--concurrency" if config else
                                                                                 "no --concurrency")  # fmt: skip
        raise RunFolderError(f"run {run.path} is {was}; resuming it with {now} would mix two kinds of sweep; "
                             "give the flags it was started with, or start a new run")  # fmt: skip
    given = config.notes()
    for key, flag in (("num_requests", "--num-requests"), ("request_rate", "--request-rate"), ("seed", "--seed")):
        if stored.get(key) != given[key]:
            raise RunFolderError(f"{flag} {given[key]} differs from the resumed run's {stored.get(key)}; give "
                                 f"{flag} {stored.get(key)} to continue {run.path}")  # fmt: skip
    if run.typed_manifest.workload.max_new_tokens not in (None, config.max_new_tokens):
        raise RunFolderError(f"--max-new-tokens {config.max_new_tokens} differs from the resumed run's "
                             f"{run.typed_manifest.workload.max_new_tokens}; give it to continue {run.path}")  # fmt: skip
