"""The server's `/metrics`: Prometheus counters and gauges (prometheus_client); `bench.sweep.remote` scrapes them.

Names start with `gemma4_bench_`. Counters: HTTP requests by path and status code, errors by OpenAI error type,
finished generations, prompt and completion tokens, degenerate responses, cancelled requests, generations during
which something compiled, and the process's jax traces, backend compiles and persistent-cache hits/misses (read
from `model.engine.CompileCounter` at scrape time). Gauges: readiness, queue depth, and the decode gauge (tok/s,
(generated - 1) / decode time) and TTFT (s) of the last request and the median of the last `recent` requests.
"""

from __future__ import annotations

import collections
import statistics
import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily

PREFIX = "gemma4_bench_"
RECENT_REQUESTS = 32  # the decode-gauge and TTFT medians are over this many latest requests
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


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
        self.ready = Gauge(p + "ready", "1 when the model is loaded and warmed up.", registry=r)
        self.queue_depth = Gauge(p + "queue_depth", "Requests waiting for the engine.", registry=r)
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

    def record_generation(self, *, prompt_tokens: int, completion_tokens: int, ttft_s: float | None,
                          gauge_tok_s: float | None, degenerate: bool, cancelled: bool, compile_traces: int) -> None:  # fmt: skip
        """Count one finished (or cancelled) generation; ttft in s, gauge in tok/s (None when not measured)."""
        self.generations.inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.completion_tokens.inc(completion_tokens)
        self.degenerate.inc(int(degenerate))
        self.cancelled.inc(int(cancelled))
        self.compiled.inc(int(compile_traces > 0))
        with self._lock:
            for value, window, gauge in ((gauge_tok_s, self._gauges, self.gauge), (ttft_s, self._ttfts, self.ttft)):
                gauge.labels(stat="last").set(float("nan") if value is None else value)
                if value is not None:
                    window.append(value)
                    gauge.labels(stat="median").set(statistics.median(window))

    def render(self, *, ready: bool, queue_depth: int) -> bytes:
        """The Prometheus text exposition of this server's metrics."""
        self.ready.set(int(ready))
        self.queue_depth.set(queue_depth)
        return generate_latest(self.registry)
