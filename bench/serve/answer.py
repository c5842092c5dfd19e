"""One request's answer in `bench serve`: consume a scheduler job's events, build OpenAI's bodies (one JSON body, or
server-sent events), judge degeneracy, record metrics, and notice a client that left.

A client that disconnects is noticed at once: a non-streamed request watches the connection (`_watch_disconnect`),
and a streamed one is closed by the framework when the connection drops. Either way the job is cancelled: dropped
before it starts when it still waits in the queue, its slot freed at the next step boundary when it runs
(`bench.serve.scheduler`).

Streams carry one generated token per chunk (`choices[0].token_ids` holds its id; the text may be "" while an
incomplete character or a possible stop string is held back), so inter-token latency means the same in every
client. `stream_options.include_usage`: a last chunk with `"choices": []` and `usage` comes before `[DONE]`;
`stream_options.continuous_usage_stats`: every chunk carries `usage` so far as well.

Every answer carries `server_timing` (an extension; on the chunk with `finish_reason` in a stream):
`queue_ms` (submitted to given a decode slot) and `ttft_ms` (arrival at the handler to the first token on the
host), milliseconds on the server's monotonic clock; null when not reached.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from bench.measure.degeneracy import check_degenerate
from bench.measure.request import request_times
from bench.serve.metrics import Metrics
from bench.serve.schema import APIError
from bench.serve.text import TextAssembler
from bench.serve.scheduler import Job

log = logging.getLogger("bench.serve")


async def _watch_disconnect(request: Request, job: Job) -> None:
    """Wait for the client's disconnect, then cancel the job and wake its reader (event "disconnected")."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancel.set()
    job.events.put_nowait(("disconnected",))


class Answer:
    """One request's answer: consumes the job's events, builds OpenAI bodies, records `metrics`. `kind`:
    "completion" or "chat"; `model`: the id to answer with; `eos_ids`: the ids that end a generation (a "stop"
    finish when the job stops at EOS); `t_arrival`: when the request reached its handler (perf_counter_ns);
    `tokens`/`times`: generated ids and their host arrival times (perf_counter_ns)."""

    def __init__(self, job: Job, text: TextAssembler, *, kind: str, model: str, t_arrival: int, metrics: Metrics,
                 eos_ids: Sequence[int]):  # fmt: skip
        self.job, self.text, self.kind, self.model, self.t_arrival = job, text, kind, model, t_arrival
        self.metrics, self.eos_ids = metrics, frozenset(eos_ids)
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.tokens: list[int] = []
        self.times: list[int] = []
        self.gen = None
        self.t_admitted: int | None = None

    async def events(self) -> AsyncIterator[tuple[str, list[int]]]:
        """Yields (text delta, ids it came from) per generated token; the last yield is the final flush. Ends
        early when the job was skipped or its client left. Raises the engine's exception, and APIError (503,
        code "deadline_exceeded") when the request's deadline passed before it got a slot."""
        job = self.job
        while True:
            item = await job.events.get()
            if item[0] == "token":
                self.tokens.append(item[1])
                self.times.append(item[2])
                delta = self.text.push(item[1])
                if self.text.stopped:
                    job.stopped_by_text = True
                    job.cancel.set()
                yield delta, [item[1]]
            elif item[0] == "admitted":
                self.t_admitted = item[1]
            elif item[0] == "done":
                self.gen = item[1]
                break
            elif item[0] in ("skipped", "disconnected"):
                break
            elif item[0] == "expired":
                raise APIError(503, "the request's deadline passed while it waited for a decode slot; retry later "
                               "or with a later deadline", type="service_unavailable", code="deadline_exceeded",
                               headers={"Retry-After": "1"})  # fmt: skip
            else:
                raise item[1]
        yield self.text.finish(), []

    def server_timing(self) -> dict[str, float | None]:
        """{"queue_ms": submitted -> given a slot, "ttft_ms": handler arrival -> first token on the host} (ms;
        None when not reached)."""
        queued = self.job.t_queued_ns
        queue_ms = (self.t_admitted - queued) / 1e6 if self.t_admitted is not None and queued is not None else None
        ttft_ms = (self.times[0] - self.t_arrival) / 1e6 if self.times else None
        return {"queue_ms": queue_ms, "ttft_ms": ttft_ms}

    def usage_so_far(self) -> dict[str, int]:
        """OpenAI's usage of the tokens generated so far (continuous usage stats)."""
        n_prompt, n = len(self.job.prompt_ids), len(self.tokens)
        return {"prompt_tokens": n_prompt, "completion_tokens": n, "total_tokens": n_prompt + n}

    def finalize(self) -> dict[str, Any]:
        """Degeneracy verdict, finish reason, usage; logs and records metrics (TTFT in s, decode gauge in tok/s).
        Returns {"finish_reason": "stop" or "length", "usage": token counts, "degenerate": Verdict.to_dict()}."""
        kept = self.tokens[: self.text.consumed] if self.text.stopped else self.tokens
        verdict = check_degenerate(kept)
        stopped = self.text.stopped or (self.job.stop_at_eos and bool(kept) and kept[-1] in self.eos_ids)
        cancelled = self.job.cancel.is_set() and not self.text.stopped
        n, times = len(kept), self.times
        # the decode rate is over every generated token (a stop string may keep fewer of them in the text)
        t = request_times(self.t_arrival, times, None, len(times)) if times else {}
        ttft = t["ttft_ms"] / 1e3 if times else None
        gauge = t.get("gauge_tok_s")
        timing = self.server_timing()
        self.metrics.record_generation(
            prompt_tokens=len(self.job.prompt_ids), completion_tokens=n, ttft_s=ttft, gauge_tok_s=gauge,
            degenerate=verdict.degenerate, cancelled=cancelled,
            compile_traces=(self.gen.compile_traces or 0) if self.gen else 0, generated_tokens=len(times),
            queue_s=None if timing["queue_ms"] is None else timing["queue_ms"] / 1e3,
            itl_s=[ms / 1e3 for ms in t.get("step_ms", [])],
        )  # fmt: skip
        if verdict.degenerate:
            log.warning(f"degenerate response {self.id}: {verdict.reason}")
        return {
            "finish_reason": "stop" if stopped else "length",
            "usage": {"prompt_tokens": len(self.job.prompt_ids), "completion_tokens": n,
                      "total_tokens": len(self.job.prompt_ids) + n},
            "degenerate": verdict.to_dict(),
            "server_timing": timing,
        }  # fmt: skip

    def _choice(self, text: str, finish: str | None, ids: list[int] | None, *, stream: bool) -> dict[str, Any]:
        if self.kind == "chat":
            key, value = ("delta", {"content": text} if text or finish is None else {}) if stream else (
                "message", {"role": "assistant", "content": text})
            choice = {"index": 0, key: value, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        if ids is not None:
            choice["token_ids"] = ids
        return choice

    def _envelope(self, *, stream: bool) -> dict[str, Any]:
        if self.kind == "chat":
            obj = "chat.completion.chunk" if stream else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    async def whole(self, request: Request) -> JSONResponse:
        """The non-streamed answer, watching `request`'s connection meanwhile (a client that leaves cancels it)."""
        parts = []
        watcher = asyncio.create_task(_watch_disconnect(request, self.job))
        try:
            async for delta, _ids in self.events():
                parts.append(delta)
        finally:
            watcher.cancel()
            if self.gen is None:  # cancelled or failed: make sure the engine lets go
                self.job.cancel.set()
        if self.job.cancel.is_set() and not self.text.stopped and self.gen is None:
            log.info(f"request {self.id}: client disconnected after {len(self.tokens)} tokens; cancelled")
        extra = self.finalize()
        body = self._envelope(stream=False) | {
            "choices": [self._choice("".join(parts), extra["finish_reason"], None, stream=False)],
            "usage": extra["usage"], "degenerate": extra["degenerate"], "server_timing": extra["server_timing"],
        }  # fmt: skip
        headers = {"X-Request-Id": self.id, "X-Degenerate": "true" if extra["degenerate"]["degenerate"] else "false"}
        return JSONResponse(body, headers=headers)

    async def sse(self, include_usage: bool, continuous_usage: bool = False) -> AsyncIterator[str]:
        """The streamed answer as `data: {json}` lines ending with `data: [DONE]`, one generated token per content
        chunk; `include_usage`: a usage chunk (`"choices": []`) before `[DONE]`; `continuous_usage`: usage so far
        on every chunk. Closing it (the client left) cancels the job."""
        def data(obj: dict[str, Any]) -> str:
            if continuous_usage and "choices" in obj and "usage" not in obj:
                obj["usage"] = self.usage_so_far()
            return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"

        done = False
        try:
            if self.kind == "chat":  # OpenAI's first chunk announces the role and carries no content
                role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                yield data(self._envelope(stream=True) | {"choices": [role]})
            async for delta, ids in self.events():
                if delta or ids:
                    yield data(self._envelope(stream=True) | {"choices": [self._choice(delta, None, ids, stream=True)]})
            done = True
            extra = self.finalize()
            last = self._choice("", extra["finish_reason"], [], stream=True)
            yield data(self._envelope(stream=True) | {"choices": [last], "degenerate": extra["degenerate"],
                                                      "server_timing": extra["server_timing"]})  # fmt: skip
            if include_usage:
                yield data(self._envelope(stream=True) | {"choices": [], "usage": extra["usage"]})
            yield "data: [DONE]\n\n"
        except APIError as exc:  # e.g. the deadline passed in the queue: the status line is gone, report in-band
            done = True
            self.metrics.count_error(exc.type)
            yield data(exc.body())
        except Exception as exc:  # noqa: BLE001  (the status line is gone: report in-band, as OpenAI does)
            log.exception("error during a streamed generation")
            self.metrics.count_error("server_error")
            yield data(APIError(500, f"internal error: {type(exc).__name__}", type="server_error").body())
        finally:
            if not done:  # the client went away (the stream was cancelled or closed): free the engine
                self.job.cancel.set()
                self.metrics.record_generation(
                    prompt_tokens=len(self.job.prompt_ids), completion_tokens=len(self.tokens), ttft_s=None,
                    gauge_tok_s=None, degenerate=False, cancelled=True, compile_traces=0)  # fmt: skip
                log.info(f"request {self.id}: client disconnected after {len(self.tokens)} tokens; cancelled")
