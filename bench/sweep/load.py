"""`bench sweep --target URL --concurrency 1,4,16 [--request-rate R] [--num-requests N]`: any OpenAI-compatible
endpoint measured under load, the way serving benchmarks do (docs/method.md, "Serving under load").

Per input size (the sweep's own exact-size prompts, built and checked as `bench sweep --target` builds them): one
warm-up request alone (kind "warmup": compiles and caches whatever the server needs; in no level's figures), then
one **level** per concurrency C: `num_requests` streamed requests of that prompt, `max_new_tokens` each with EOS
ignored (`ignore_eos`, greedy), at most C in flight. Without a rate each request is sent as soon as fewer than C
are in flight; with `--request-rate R` (req/s) requests arrive as a Poisson process (exponential gaps of mean 1/R,
from `random.Random(seed)`: the same arrivals on every run of the same seed), each still waiting for one of the
C places. Every level's figures come from its own requests only.

Per request (`bench.runs.records.LoadSample`), client-side, `time.perf_counter_ns` read as each streamed line
arrives (asyncio + httpx, one connection per request in flight): TTFT (sent -> first chunk with content), the
inter-token latencies (gaps between content chunks: one token per chunk on this project's server, which the sample
checks as `content_chunks` == `generated_tokens`), TPOT, end-to-end latency, and queue time where the server reports
it (this project's `server_timing.queue_ms`). Per level (`bench.runs.records.LoadRow`, `summarize_level`): output
throughput (generated tokens / the level's wall time, first request sent to last response ended), request
throughput, median / p90 / p99 of each latency; raw samples in load_samples.jsonl. A level is invalid when a
request failed or returned a token count other than max_new_tokens (or, on this project's server, something
compiled during it).

The prompts of a level are identical: a server with a prefix cache (vLLM's automatic prefix caching) serves all
but the first from its cache, which shortens their TTFT; turn it off to measure prefill under load.

Stop (SIGTERM / Ctrl-C, `bench.sweep.local.StopSignals`): no new request is sent, the ones in flight finish and
are kept, the level in progress gets no row (a resume runs it again), KeyboardInterrupt. Finished levels are
kept; `--resume` runs only the levels the run does not have yet.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from bench.errors import InputError
from bench.measure.degeneracy import check_degenerate
from bench.runs.records import LoadRow, LoadSample, failed_level, summarize_level
from bench.sweep.target import OURS, TIMEOUT, TRACES, Target, fold_chunk, parse_metrics

MAX_CONCURRENCY = 1024  # requests in flight per level at most: a client-side bound (sockets, memory)


class _Stopped(Exception):
    """A stop request ended the sweep inside the event loop (KeyboardInterrupt once outside it)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoadConfig:
    """A sweep under load: `inputs` (exact input sizes, tokens), `max_new_tokens` (tokens per request, EOS ignored),
    `concurrency` (the levels: requests in flight at most), `num_requests` (timed requests per level),
    `request_rate` (Poisson arrivals, req/s; None: as fast as the cap allows), `seed` (of the arrivals).
    `repeats` is None (the one-at-a-time sweep's setting; here `num_requests`)."""

    inputs: tuple[int, ...]
    max_new_tokens: int
    concurrency: tuple[int, ...]
    num_requests: int
    request_rate: float | None = None
    seed: int = 0
    repeats: None = None

    def check(self) -> None:
        """InputError (one line naming the flag) for a value no level can use."""
        if self.max_new_tokens < 1:
            raise InputError(f"--max-new-tokens {self.max_new_tokens}: expected >= 1")
        if not self.concurrency or any(c < 1 or c > MAX_CONCURRENCY for c in self.concurrency):
            raise InputError(f"--concurrency {','.join(map(str, self.concurrency))}: expected requests in flight "
                             f"between 1 and {MAX_CONCURRENCY}, e.g. --concurrency 1,4,16")  # fmt: skip
        if self.num_requests < 1:
            raise InputError(f"--num-requests {self.num_requests}: expected >= 1 request per level")
        if self.request_rate is not None and not (math.isfinite(self.request_rate) and self.request_rate > 0):
            raise InputError(f"--request-rate {self.request_rate}: expected requests per second > 0, or leave it "
                             "out (each request sent as soon as a place is free)")  # fmt: skip

    def notes(self) -> dict[str, Any]:
        """The manifest's record of the load (workload note "load")."""
        return {"concurrency": list(self.concurrency), "num_requests": self.num_requests,
                "request_rate": self.request_rate, "seed": self.seed, "arrivals": "poisson" if self.request_rate
                else "as fast as the concurrency allows"}  # fmt: skip


def parse_concurrency(text: str) -> tuple[int, ...]:
    """'1,4,16' -> (1, 4, 16): the levels in the order given. Raises InputError (no level, a value that is not a
    whole number, a level given twice, as `--batch` does)."""
    try:
        given = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise InputError(f"--concurrency {text}: expected comma-separated whole numbers, e.g. 1,4,16") from None
    if not given:
        raise InputError(f"--concurrency {text!r}: expected at least one level, e.g. 1,4,16")
    twice = next((c for i, c in enumerate(given) if c in given[:i]), None)
    if twice is not None:
        raise InputError(f"--concurrency {text}: level {twice} is given twice; expected each level once, e.g. "
                         "--concurrency 1,4,16")  # fmt: skip
    return tuple(given)


def default_num_requests(concurrency: Sequence[int]) -> int:
    """Requests per level when --num-requests is not given: 4 waves of the largest level, at least 16."""
    return max(16, 4 * max(concurrency))


def poisson_offsets(n: int, rate: float, seed: int) -> list[float]:
    """Send times (s from the level's start) of `n` Poisson arrivals of `rate` req/s: the first at 0, then
    exponential gaps of mean 1/rate drawn from `random.Random(seed)` (so a seed gives the same arrivals)."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


# ---- one streamed request -----------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Stream:
    """What one streamed answer delivered (times: perf_counter_ns)."""

    t_start: int = 0
    t_end: int = 0
    t_content: list[int] = dataclasses.field(default_factory=list)
    text: str = ""
    token_ids: list[int] | None = None
    usage: dict[str, Any] | None = None
    verdict: dict[str, Any] | None = None
    queue_ms: float | None = None
    finished: bool = False  # [DONE] or a usage chunk arrived
    error: str | None = None


async def stream_chat(client: httpx.AsyncClient, target: Target, text: str, max_tokens: int) -> _Stream:
    """One streamed chat completion of `text` (greedy, `ignore_eos`, usage requested), timed at each line's arrival.
    Never raises for the server's failures: they are in `error`."""
    payload = {
        "model": target.model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
        "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
    }  # fmt: skip
    out = _Stream(t_start=time.perf_counter_ns())
    try:
        async with client.stream("POST", f"{target.base}/chat/completions", json=payload) as r:
            if r.status_code != 200:
                body = (await r.aread()).decode(errors="replace")
                out.error = f"HTTP {r.status_code}: {body[:200]}"
                return out
            async for line in r.aiter_lines():
                t = time.perf_counter_ns()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    out.finished = True
                    break
                obj = json.loads(data)
                if "error" in obj:
                    out.error = f"the server reported an error mid-stream: {obj['error']}"[:300]
                    return out
                _take(out, obj, t)
    except (httpx.HTTPError, ValueError) as exc:  # the connection dropped, a timeout, a line that is not JSON
        out.error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        out.t_end = time.perf_counter_ns()
    return out


def _take(out: _Stream, obj: dict[str, Any], t: int) -> None:
    """Fold one parsed chunk, which arrived at `t`, into `out` (`bench.sweep.remote.fold_chunk`); a usage chunk
    without choices ends the stream, and the server's `server_timing.queue_ms` is kept where it reports one."""
    if obj.get("usage") and not obj.get("choices"):
        out.finished = True
    fold_chunk(out, obj, t)
    timing = obj.get("server_timing")
    if isinstance(timing, dict) and isinstance(timing.get("queue_ms"), (int, float)):
        out.queue_ms = float(timing["queue_ms"])


def load_sample(s: _Stream, *, prompt, tokenizer, concurrency: int, request_rate: float | None, kind: str,
                index: int, t_level_ns: int) -> LoadSample:  # fmt: skip
    """The `LoadSample` of one streamed answer of `prompt` (a bench.measure.prompts.Prompt) in a level that
    started at `t_level_ns`: not ok (with the reason) for an error, no usage, a prompt count other than the
    prompt's exact size, or no content."""
    error = s.error
    usage = s.usage or {}
    if error is None and ("prompt_tokens" not in usage or "completion_tokens" not in usage):
        error = "the server sent no usage (prompt_tokens, completion_tokens)"
    elif error is None and usage["prompt_tokens"] != prompt.n_tokens:
        error = (f"the server counted {usage['prompt_tokens']} prompt tokens for a prompt of exactly "
                 f"{prompt.n_tokens}: its tokenizer or chat template differs; pass the served model's tokenizer "
                 "with --checkpoint")  # fmt: skip
    elif error is None and not s.t_content:
        error = "no streamed chunk carried content"
    n = int(usage["completion_tokens"]) if "completion_tokens" in usage else None
    ids = s.token_ids if s.token_ids is not None else (tokenizer.encode(s.text) if s.text else [])
    verdict = check_degenerate(ids) if ids else None
    degenerate = verdict.degenerate if verdict else None
    reason = verdict.reason if verdict else None
    if s.verdict and s.verdict.get("degenerate"):
        degenerate, reason = True, reason or f"server: {s.verdict.get('reason')}"
    ttft = (s.t_content[0] - s.t_start) / 1e6 if s.t_content else None
    e2e = (s.t_end - s.t_start) / 1e6 if s.t_end else None
    tpot = (e2e - ttft) / (n - 1) if error is None and n and n > 1 and ttft is not None and e2e is not None else None
    return LoadSample(
        input_tokens=prompt.n_tokens, concurrency=concurrency, request_rate=request_rate, kind=kind, index=index,
        ok=error is None, error=error, t_sent_ms=(s.t_start - t_level_ns) / 1e6, ttft_ms=ttft,
        itl_ms=[(b - a) / 1e6 for a, b in zip(s.t_content, s.t_content[1:])], tpot_ms=tpot, e2e_ms=e2e,
        generated_tokens=n, content_chunks=len(s.t_content), queue_ms=s.queue_ms, degenerate=degenerate,
        degenerate_reason=reason, token_ids=list(ids),
    )  # fmt: skip


# ---- one level ----------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LevelResult:
    """A level's requests (`samples`, by index), its wall time (s: first sent -> last ended) and whether a stop
    request cut it short (`stopped`)."""

    samples: list[LoadSample]
    duration_s: float
    stopped: bool


async def run_level(client: httpx.AsyncClient, target: Target, prompt, tokenizer, *, concurrency: int,
                    num_requests: int, max_new_tokens: int, request_rate: float | None = None, seed: int = 0,
                    record: Callable[[LoadSample], None] = lambda _s: None,
                    should_stop: Callable[[], bool] = lambda: False, kind: str = "timed") -> LevelResult:  # fmt: skip
    """`num_requests` requests of `prompt`, at most `concurrency` in flight, sent as soon as a place is free or at
    Poisson arrival times (`request_rate`, `seed`); `record(sample)` as each ends; `should_stop` polled before each
    send (true: nothing more is sent, the ones in flight finish)."""
    places = asyncio.Semaphore(concurrency)
    offsets = poisson_offsets(num_requests, request_rate, seed) if request_rate else None
    t0 = time.perf_counter_ns()
    samples: list[LoadSample] = []

    async def one(index: int) -> None:
        try:
            s = await stream_chat(client, target, prompt.text, max_new_tokens)
            sample = load_sample(s, prompt=prompt, tokenizer=tokenizer, concurrency=concurrency,
                                 request_rate=request_rate, kind=kind, index=index, t_level_ns=t0)  # fmt: skip
            samples.append(sample)
            record(sample)
        finally:
            places.release()

    tasks, stopped = [], False
    for index in range(num_requests):
        if offsets is not None:
            wait_s = offsets[index] - (time.perf_counter_ns() - t0) / 1e9
            if wait_s > 0:
                await asyncio.sleep(wait_s)
        await places.acquire()
        if should_stop():
            places.release()
            stopped = True
            break
        tasks.append(asyncio.create_task(one(index)))
    await asyncio.gather(*tasks)
    samples.sort(key=lambda s: s.index)
    if samples:
        first = min(s.t_sent_ms for s in samples)
        last = max(s.t_sent_ms + (s.e2e_ms or 0.0) for s in samples)
        duration = max(last - first, 1e-6) / 1e3
    else:
        duration = 0.0
    return LevelResult(samples=samples, duration_s=duration, stopped=stopped)


# ---- the sweep ----------------------------------------------------------------------------------------------------
async def _traces(client: httpx.AsyncClient, target: Target) -> float | None:
    """This project's server's jit trace count (its /metrics), or None for another server or a failed scrape."""
    if not target.ours:
        return None
    try:
        r = await client.get(f"{target.root}/metrics")
        metrics = parse_metrics(r.text) if r.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return None
    return metrics.get(TRACES) if OURS in metrics else None


def level_line(row: LoadRow) -> str:
    """One progress line for a finished level."""
    rate = f", {row.request_rate:g} req/s arrivals" if row.request_rate else ""
    head = f"load {row.input_tokens} tokens, concurrency {row.concurrency}{rate}"
    if row.status == "failed":
        return f"{head}: failed: {row.error}"

    def ms(x: float | None) -> str:
        return "—" if x is None else f"{x:.1f}"

    line = (f"{head}: {row.completed}/{row.num_requests} requests in {row.duration_s:.2f} s: output "
            f"{row.output_tok_s:.1f} tok/s, {row.request_s:.2f} req/s; TTFT p50 {ms(row.ttft_ms_median)} ms, ITL "
            f"p50 {ms(row.itl_ms_median)} / p99 {ms(row.itl_ms_p99)} ms")  # fmt: skip
    return line + ("" if row.valid else f" (invalid: {row.invalid_reason})")


def run_load_sweep(target: Target, tokenizer, config: LoadConfig, run, prompts: dict, *, headers: dict[str, str],
                   progress: Callable[[str], None] = lambda _: None, should_stop: Callable[[], bool] = lambda: False,
                   ) -> list[LoadRow]:  # fmt: skip
    """Every level of `config` the run does not have yet (`run.load_rows()`), in order: per input size a warm-up
    request, then its levels; each level's samples appended as they end, its row written when it ends. A failed
    warm-up (e.g. the server's prompt count differs) fails that size's levels (`failed_level`). Raises
    KeyboardInterrupt when `should_stop` turns true (the level in progress gets no row)."""
    done = {r.key for r in run.load_rows()}
    rows: list[LoadRow] = []
    limits = httpx.Limits(max_connections=max(config.concurrency) + 4, max_keepalive_connections=max(config.concurrency))

    async def main() -> None:
        async with httpx.AsyncClient(timeout=TIMEOUT, headers=headers, limits=limits) as client:
            for n in config.inputs:
                todo = [c for c in config.concurrency if (n, c, config.request_rate) not in done]
                if not todo:
                    continue
                if should_stop():
                    raise _Stopped
                warm = await run_level(client, target, prompts[n], tokenizer, concurrency=1, num_requests=1,
                                       max_new_tokens=config.max_new_tokens, kind="warmup",
                                       record=lambda s: run.append_load_samples([s]))  # fmt: skip
                if not warm.samples or not warm.samples[0].ok:
                    error = warm.samples[0].error if warm.samples else "the warm-up request was not sent"
                    for c in todo:
                        row = failed_level(n, c, config.request_rate, f"warm-up: {error}", seed=config.seed,
                                           max_new_tokens=config.max_new_tokens, num_requests=config.num_requests)  # fmt: skip
                        run.append_load(row)
                        rows.append(row)
                        progress(level_line(row))
                    continue
                for c in todo:
                    before = await _traces(client, target)
                    result = await run_level(client, target, prompts[n], tokenizer, concurrency=c,
                                             num_requests=config.num_requests, max_new_tokens=config.max_new_tokens,
                                             request_rate=config.request_rate, seed=config.seed,
                                             record=lambda s: run.append_load_samples([s]), should_stop=should_stop)  # fmt: skip
                    if result.stopped:
                        raise _Stopped
                    after = await _traces(client, target)
                    compiles = int(after - before) if before is not None and after is not None else None
                    row = summarize_level(result.samples, input_tokens=n, concurrency=c,
                                          request_rate=config.request_rate, seed=config.seed,
                                          max_new_tokens=config.max_new_tokens, num_requests=config.num_requests,
                                          duration_s=result.duration_s or 1e-6, compile_events=compiles)  # fmt: skip
                    run.append_load(row)
                    rows.append(row)
                    progress(level_line(row))

    try:
        asyncio.run(main())
    except _Stopped:
        raise KeyboardInterrupt from None
    return rows
