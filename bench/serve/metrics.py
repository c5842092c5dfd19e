"""The server's `/metrics`: Prometheus counters, gauges and histograms (prometheus_client); `bench.sweep.remote`
scrapes them.

Names start with `gemma4_bench_`. Counters: HTTP requests by path and status code, errors by OpenAI error type,
finished generations, prompt and completion tokens (kept in the answers), generated tokens (every token the engine
produced, those cut by a stop string included), degenerate responses, cancelled requests, generations during which
something compiled, admitted requests, rejected requests by reason (`REJECT_REASONS`), requests that left the
server by outcome (`bench.serve.scheduler.OUTCOMES`), and the process's jax traces, backend compiles and
persistent-cache hits/misses (read from `model.engine.CompileCounter` at scrape time). Gauges: readiness, running
and waiting requests (`queue_depth` is the waiting count under its older name), decode slots (`max_batch`) and
their occupancy (running / max_batch, 0..1), and the decode gauge (tok/s, (generated - 1) / decode time) and TTFT
(s) of the last request and the median of the last `recent` requests. Histograms (seconds): queue time (submitted
to given a slot), TTFT (arrival at the handler to the first token on the host), inter-token latency (gaps between
consecutive tokens of one request on the host).

Consistency, at any moment: admitted = sum of finished by outcome + running + waiting; every generation request
that reached its handler was admitted or rejected (or refused as a bad request, counted in errors).
"""

from __future__ import annotations

import collections
import statistics
import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily

from bench.serve.scheduler import OUTCOMES

PREFIX = "gemma4_bench_"
RECENT_REQUESTS = 32  # the decode-gauge and TTFT medians are over this many latest requests
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
REJECT_REASONS = ("queue_full", "stopping")
"""Why a well-formed request was refused at admission: the queue was full (429), the server was stopping (503)."""
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5,
                     5.0, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
"""Histogram bucket bounds (s) for TTFT and queue time: 1 ms to 80 s."""
ITL_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
                 0.75, 1.0, 2.5)  # fmt: skip
"""Histogram bucket bounds (s) for inter-token latency: 1 ms to 2.5 s."""


class _CompileCollector:
    """Process-wide compile counts, read when /metrics is scraped."""

    def __init__(self, counts: Callable[[], dict[str, int]]):
        self._counts = counts

    def collect(self):
        c = self._counts()
        for key, name, help_ in (
            ("traces", "compile_traces", "jax traces (jit cache misses) in this process."),
            ("backend_compiles", "backend_compiles", "XLA backend compiles in this process."),
            ("cache_hits", "compile_cache_hits", "Persistent compilation cache hits."),
            ("cache_misses", "compile_cache_misses", "Persistent compilation cache misses."),
        ):
            yield CounterMetricFamily(PREFIX + name, help_, value=c.get(key, 0))


class Metrics:
    """One server's metrics in their own registry (so several servers in one process do not mix)."""

    def __init__(self, compile_counts: Callable[[], dict[str, int]], recent: int = RECENT_REQUESTS):
        r = self.registry = CollectorRegistry()
        p = PREFIX
        self._lock = threading.Lock()
        self.requests = Counter(p + "requests", "HTTP requests by path and status code.", ["path", "code"], registry=r)
        self.errors = Counter(p + "errors", "Error responses by OpenAI error type.", ["type"], registry=r)
        self.generations = Counter(p + "generations", "Generations the engine finished.", registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of finished generations.", registry=r)
        self.completion_tokens = Counter(p + "completion_tokens", "Generated tokens.", registry=r)
        self.degenerate = Counter(p + "degenerate_responses", "Responses the degeneracy check flagged.", registry=r)
        self.cancelled = Counter(p + "cancelled_requests", "Generations stopped because the client left.", registry=r)
        self.compiled = Counter(p + "generations_with_compile", "Generations during which something compiled.",
                                registry=r)  # fmt: skip
        self.generated_tokens = Counter(p + "generated_tokens", "Tokens the engine generated (stop-string cuts "
                                        "included).", registry=r)  # fmt: skip
        self.admitted = Counter(p + "admitted_requests", "Requests admitted into the queue.", registry=r)
        self.rejected = Counter(p + "rejected_requests", "Well-formed requests refused at admission, by reason.",
                                ["reason"], registry=r)  # fmt: skip
        self.finished = Counter(p + "finished_requests", "Admitted requests that left the server, by outcome.",
                                ["outcome"], registry=r)  # fmt: skip
        for reason in REJECT_REASONS:
            self.rejected.labels(reason=reason)
        for outcome in OUTCOMES:
            self.finished.labels(outcome=outcome)
        self.ready = Gauge(p + "ready", "1 when the model is loaded and warmed up.", registry=r)
        self.queue_depth = Gauge(p + "queue_depth", "Requests waiting for a decode slot (= waiting_requests).",
                                 registry=r)  # fmt: skip
        self.running = Gauge(p + "running_requests", "Requests holding a decode slot.", registry=r)
        self.waiting = Gauge(p + "waiting_requests", "Requests waiting for a decode slot.", registry=r)
        self.max_batch = Gauge(p + "max_batch", "Decode slots (--max-batch).", registry=r)
        self.occupancy = Gauge(p + "slot_occupancy", "Occupied decode slots / max_batch (0..1).", registry=r)
        self.queue_time = Histogram(p + "queue_time_seconds", "Submitted to given a decode slot (s).",
                                    buckets=LATENCY_BUCKETS_S, registry=r)  # fmt: skip
        self.ttft_hist = Histogram(p + "time_to_first_token_seconds", "Arrival at the handler to the first token on "
                                   "the host (s).", buckets=LATENCY_BUCKETS_S, registry=r)  # fmt: skip
        self.itl = Histogram(p + "inter_token_latency_seconds", "Gap between consecutive tokens of one request on the "
                             "host (s).", buckets=ITL_BUCKETS_S, registry=r)  # fmt: skip
        self.gauge = Gauge(p + "decode_tokens_per_second", "Gauge decode rate, (generated - 1) / decode time: "
                           f"last request and median of the last {recent}.", ["stat"], registry=r)  # fmt: skip
        self.ttft = Gauge(p + "ttft_seconds", "Handler arrival to first token on the host: last request and median "
                          f"of the last {recent}.", ["stat"], registry=r)  # fmt: skip
        for g in (self.gauge, self.ttft):
            for stat in ("last", "median"):
                g.labels(stat=stat).set(float("nan"))
        r.register(_CompileCollector(compile_counts))
        self._gauges: collections.deque = collections.deque(maxlen=recent)
        self._ttfts: collections.deque = collections.deque(maxlen=recent)

    def count_request(self, path: str, status: int) -> None:
        self.requests.labels(path=path, code=str(status)).inc()

    def count_error(self, type_: str) -> None:
        self.errors.labels(type=type_).inc()

    def count_rejected(self, reason: str) -> None:
        """One well-formed request refused at admission (`reason`: one of `REJECT_REASONS`)."""
        self.rejected.labels(reason=reason).inc()

    def count_outcome(self, outcome: str) -> None:
        """One admitted request left the server (`outcome`: one of `bench.serve.scheduler.OUTCOMES`)."""
        self.finished.labels(outcome=outcome).inc()

    def record_generation(self, *, prompt_tokens: int, completion_tokens: int, ttft_s: float | None,
                          gauge_tok_s: float | None, degenerate: bool, cancelled: bool, compile_traces: int,
                          generated_tokens: int | None = None, queue_s: float | None = None,
                          itl_s: tuple[float, ...] | list[float] = ()) -> None:  # fmt: skip
        """Count one finished (or cancelled) generation; ttft and queue time in s, gauge in tok/s (None when not
        measured); `generated_tokens`: every token generated (default: completion_tokens); `itl_s`: its
        inter-token gaps (s), each observed in the histogram."""
        self.generations.inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.completion_tokens.inc(completion_tokens)
        self.generated_tokens.inc(completion_tokens if generated_tokens is None else generated_tokens)
        if queue_s is not None:
            self.queue_time.observe(queue_s)
        if ttft_s is not None:
            self.ttft_hist.observe(ttft_s)
        for gap in itl_s:
            self.itl.observe(gap)
        self.degenerate.inc(int(degenerate))
        self.cancelled.inc(int(cancelled))
        self.compiled.inc(int(compile_traces > 0))
        with self._lock:
            for value, window, gauge in ((gauge_tok_s, self._gauges, self.gauge), (ttft_s, self._ttfts, self.ttft)):
                gauge.labels(stat="last").set(float("nan") if value is None else value)
                if value is not None:
                    window.append(value)
                    gauge.labels(stat="median").set(statistics.median(window))

    def render(self, *, ready: bool, queue_depth: int, running: int = 0, max_batch: int | None = None) -> bytes:
        """The Prometheus text exposition of this server's metrics; `queue_depth` (waiting requests), `running`
        and `max_batch` (decode slots; None before the model is loaded) set the gauges first."""
        self.ready.set(int(ready))
        self.queue_depth.set(queue_depth)
        self.waiting.set(queue_depth)
        self.running.set(running)
        if max_batch:
            self.max_batch.set(max_batch)
            self.occupancy.set(running / max_batch)
        return generate_latest(self.registry)
