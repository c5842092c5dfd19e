"""`bench serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) for the engine, one request at a time.

Endpoints:
- `POST /v1/completions`, `POST /v1/chat/completions` (Gemma's chat turn format), non-streaming and streaming
  (server-sent events, `data: {json}` lines ending with `data: [DONE]`). Fields: `model`, `prompt` / `messages`,
  `max_tokens` (or its newer name `max_completion_tokens`), `temperature` (default 1.0, 0 = greedy), `top_p`,
  `top_k` (0 or -1 = off; above the vocabulary size, clamped to it), `seed`, `stop` (a string or a list of up to 4,
  each up to 1,000 characters), `stream`, `stream_options.include_usage`, and two vLLM-style extensions:
  `ignore_eos` (generate exactly `max_tokens`, what a benchmark needs) and `skip_special_tokens` (default true).
  `n` must be 1. Fields that would change the output but are not implemented (echo, logprobs, penalties, logit_bias,
  tools, a response_format other than text, ...) are refused unless neutral (`bench.serve.schema.UNSUPPORTED`).
  `bench.serve.schema` holds the request models (each field's meaning and unit) and the response fields.
- `GET /v1/models`, `GET /health` (503 `{"status": "loading"}` until the model is loaded and every warm-up shape
  compiled; then 200 with build id, checkpoint, device, dtype policy, quantization, compile cache state),
  `GET /metrics` (Prometheus text format; names start with `gemma4_bench_`).

Every response is judged by `bench.measure.degeneracy.check_degenerate` on its generated ids. A degenerate one is still
returned, but carries `"degenerate": {"degenerate": true, "reason": ..., "details": ...}` (the field is on every
response; in a stream, on the chunk that carries `finish_reason`), the header `X-Degenerate: true` (non-streaming
responses only: a stream's headers leave before its tokens exist), a warning log line, and a metric count.
Streamed chunks also carry the ids of their text in `choices[0].token_ids` (an extension, one id per chunk).

Concurrency: the engine is not thread-safe and serves one request at a time. Requests wait in a FIFO queue served
by one worker thread; tokens reach the event loop through `call_soon_threadsafe`, so streaming never blocks it.
A request whose client disconnects (mid-stream, or while waiting for a non-streamed answer) is cancelled: the
engine stops at its next token (`on_token` returns True) and takes the next request.

Timing definitions (../shared/measurement.md): server-side TTFT runs from the arrival of the request at its handler
(queue wait included) to the first generated id on the host; the decode gauge is (generated - 1) / (last id - first
id), in tok/s. Each distinct (bucket, max_tokens, greedy or sampling) shape compiles once; name the shapes clients
will use in `--warmup-shapes` so that no client request pays a compile.

Errors follow OpenAI's body, `{"error": {"message", "type", "param", "code"}}`, and are counted in /metrics by type:
400 for a malformed body or a bad field (code `invalid_value`, `invalid_json`, `unsupported_parameter`,
`context_length_exceeded` with `param` the field to change, ...), 404 for an unknown model or route, 405 for a
method a route does not take, 503 while loading, 500 for anything unexpected (logged; the server keeps serving).
(GET /health's 503 while loading is its status body, not an error body.) JSON types are checked strictly: a field
of the wrong type (`"max_tokens": "5"`, `"stream": "true"`) is a 400 naming the field, what was received and what
was expected (`max_tokens must be an integer, got a string: "5"`); an integer where a number is expected is
accepted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from bench.errors import InputError
from bench.measure.degeneracy import check_degenerate
from bench.measure.request import request_times
from bench.serve.metrics import CONTENT_TYPE, Metrics
from bench.serve.schema import (
    APIError,
    ChatRequest,
    CompletionRequest,
    GenerationRequest,
    chat_prompt_ids,
    check_context,
    http_error,
    max_tokens_field,
    sampling_params,
    stop_strings,
    validation_error,
)
from bench.serve.text import TextAssembler
from model.errors import ModelError

log = logging.getLogger("bench.serve")


# ---- what the loader hands the server -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class LoadedModel:
    """A loaded engine and the facts /health reports about it.

    engine: what generates (model.engine.Engine, or anything with its generate/warmup/check_request/tokenizer/
    policy/cfg/buckets/max_length). checkpoint: {"id": hub id or name, "path": folder, "content_hash": hash of the
    weight files or None, "weight_bytes": size of the weights in bytes}. build_id: environment.build_id of the
    served payload (None when unknown). compile_cache: {"dir": persistent compilation cache folder, or None when
    off}. quantization: "none" or a scheme name.
    """

    engine: Any  # model.engine.Engine (or anything with its generate/bucket_for/tokenizer/policy/cfg)
    checkpoint: dict[str, Any]
    build_id: str | None = None
    compile_cache: dict[str, Any] = dataclasses.field(default_factory=lambda: {"dir": None})
    quantization: str = "none"


def parse_warmup_shapes(text: str | None) -> tuple[tuple[int, int], ...]:
    """'41:64,521:64' -> ((41, 64), (521, 64)): (prompt tokens, max_tokens) pairs. Raises InputError."""
    shapes = []
    for part in (p.strip() for p in (text or "").split(",")):
        if not part:
            continue
        try:
            n, m = (int(x) for x in part.split(":"))
        except ValueError:
            raise InputError(f"--warmup-shapes {text}: {part!r} is not TOKENS:MAX_TOKENS (e.g. 41:64)") from None
        if n < 1 or m < 1:
            raise InputError(f"--warmup-shapes {text}: {part!r} needs positive numbers (e.g. 41:64)")
        shapes.append((n, m))
    return tuple(dict.fromkeys(shapes))


# ---- the engine worker --------------------------------------------------------------------------------------------
@dataclasses.dataclass(eq=False)
class _Job:
    """One generation for the worker. Events arrive in `events`: ("token", id, t_ns), then ("done", Generation),
    ("error", exception) or ("skipped",) when the job was cancelled before it started."""

    prompt_ids: list[int]
    max_new_tokens: int
    sampling: Any
    stop_at_eos: bool
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = dataclasses.field(default_factory=asyncio.Queue)
    cancel: threading.Event = dataclasses.field(default_factory=threading.Event)

    def post(self, *item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the event loop is closed (server shutting down): nobody is listening
            self.cancel.set()


class _Worker:
    """The single thread that owns the engine: takes jobs in FIFO order, one at a time."""

    def __init__(self, engine):
        self.engine = engine
        self.jobs: queue.Queue[_Job | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="engine-worker", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            if job.cancel.is_set():
                job.post("skipped")
                continue

            def on_token(token_id: int, job: _Job = job) -> bool:
                job.post("token", token_id, time.perf_counter_ns())
                return job.cancel.is_set()

            try:
                gen = self.engine.generate(job.prompt_ids, job.max_new_tokens, job.sampling,
                                           stop_at_eos=job.stop_at_eos, on_token=on_token)  # fmt: skip
                job.post("done", gen)
            except Exception as exc:  # noqa: BLE001  (reported to the request; the worker keeps serving)
                job.post("error", exc)

    def stop(self) -> None:
        self.jobs.put(None)
        self.thread.join(timeout=10)


# ---- the application ----------------------------------------------------------------------------------------------
class _State:
    """The server's state: "loading" -> "ok" (loaded, warm-up shapes compiled, worker started) or "failed" (with
    `error`, one line). `warmup_s`: seconds spent compiling the warm-up shapes; `created`: Unix time (s)."""

    def __init__(self, provider, model_name, warmup_shapes):
        self.provider, self.model_name, self.warmup_shapes = provider, model_name, tuple(warmup_shapes)
        self.status, self.error = "loading", None
        self.loaded: LoadedModel | None = None
        self.worker: _Worker | None = None
        self.metrics = Metrics(_compile_counts)
        self.warmup_s: float | None = None
        self.on_load_failure: Callable[[Exception], None] | None = None
        self.created = int(time.time())

    def load(self) -> None:
        """Load the model and compile every warm-up shape (runs in a background thread)."""
        try:
            loaded = self.provider()
            t0 = time.perf_counter()
            for n, m in self.warmup_shapes:
                log.info(f"warm-up: compiling the shape of {n} prompt tokens, {m} max tokens")
                loaded.engine.warmup(n, m)
            self.warmup_s = time.perf_counter() - t0
            self.loaded = loaded
            self.model_name = self.model_name or str(loaded.checkpoint.get("id") or "gemma4")
            self.worker = _Worker(loaded.engine)
            self.status = "ok"
            log.info(f"ready: serving model {self.model_name!r}")
        except Exception as exc:  # noqa: BLE001  (reported by /health, and to on_load_failure)
            self.status, self.error = "failed", f"{type(exc).__name__}: {exc}"
            log.error(f"loading failed: {self.error}")
            if self.on_load_failure is not None:
                self.on_load_failure(exc)


def _compile_counts() -> dict[str, int]:
    try:
        from model.engine import CompileCounter

        return CompileCounter.snapshot()
    except Exception:  # noqa: BLE001
        return {}


def create_app(engine_provider: Callable[[], LoadedModel], *, model_name: str | None = None,
               warmup_shapes: Sequence[tuple[int, int]] = (),
               on_load_failure: Callable[[Exception], None] | None = None) -> FastAPI:  # fmt: skip
    """The FastAPI app. `engine_provider()` is called once, in a background thread started with the server; it
    returns a `LoadedModel` (or raises: /health then answers 503 with status "failed" and the reason, and
    `on_load_failure(exc)` is called, e.g. to stop the server). `model_name`: the id clients must send (default:
    the checkpoint id). `warmup_shapes`: (prompt tokens, max_tokens) pairs compiled (greedy) before /health
    reports ready. Raises nothing itself; requests are refused with `APIError` bodies (see the module docstring)."""
    state = _State(engine_provider, model_name, warmup_shapes)
    state.on_load_failure = on_load_failure

    async def lifespan(_app: FastAPI):
        threading.Thread(target=state.load, name="model-loader", daemon=True).start()
        yield
        if state.worker is not None:
            await asyncio.to_thread(state.worker.stop)

    app = FastAPI(title="gemma4-bench", lifespan=lifespan)
    app.state.server = state
    routes: set[str] = set()  # filled once the routes exist (below)
    app.add_middleware(_CountRequests, metrics=state.metrics, routes=routes)

    def error_response(exc: APIError) -> JSONResponse:
        state.metrics.count_error(exc.type)
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(APIError)
    async def on_api_error(_req: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    schemas = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatRequest}

    @app.exception_handler(RequestValidationError)
    async def on_validation(req: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc.errors(), exc.body, schemas.get(req.url.path)))

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(req: Request, exc: StarletteHTTPException) -> JSONResponse:  # 404, 405, unreadable JSON
        allowed = (exc.headers or {}).get("Allow")
        api = http_error(exc.status_code, exc.detail, req.method, req.url.path, exc.__cause__, allowed)
        response = error_response(api)
        if allowed:
            response.headers["Allow"] = allowed
        return response

    @app.exception_handler(ModelError)
    async def on_model_error(_req: Request, exc: ModelError) -> JSONResponse:  # e.g. text that cannot be tokenized
        return error_response(APIError(400, str(exc), code="invalid_value"))

    @app.exception_handler(Exception)
    async def on_unexpected(_req: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error while serving a request")
        return error_response(APIError(500, f"internal error: {type(exc).__name__}", type="server_error"))

    @app.get("/health")
    async def health() -> JSONResponse:
        if state.status != "ok":
            body = {"status": state.status} | ({"error": state.error} if state.error else {})
            return JSONResponse(body, status_code=503)
        return JSONResponse(_health_body(state))

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        _require_ready(state)
        eng = state.loaded.engine
        return JSONResponse({"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": state.created, "owned_by": "gemma4-bench",
            "max_model_len": eng.max_length, "checkpoint": state.loaded.checkpoint, "build_id": state.loaded.build_id,
        }]})  # fmt: skip

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        depth = state.worker.jobs.qsize() if state.worker else 0
        text = state.metrics.render(ready=state.status == "ok", queue_depth=depth)
        return PlainTextResponse(text, media_type=CONTENT_TYPE)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        t_arrival = time.perf_counter_ns()
        _require_ready(state)
        tok = state.loaded.engine.tokenizer
        if isinstance(body.prompt, list) and body.prompt and all(isinstance(x, int) for x in body.prompt):
            ids = list(body.prompt)
            vocab = state.loaded.engine.cfg.vocab_size
            if any(not 0 <= i < vocab for i in ids):
                raise APIError(400, f"prompt token ids must lie in [0, {vocab})", param="prompt", code="invalid_value")
        else:
            prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
            if len(prompts) != 1:
                raise APIError(400, f"exactly one prompt per request is supported, got {len(prompts)}", param="prompt")
            ids = [tok.bos_id] + tok.encode(prompts[0])
        return await _serve(state, request, body, ids, "completion", t_arrival)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        t_arrival = time.perf_counter_ns()
        _require_ready(state)
        tok = state.loaded.engine.tokenizer
        return await _serve(state, request, body, chat_prompt_ids(tok, body.messages), "chat", t_arrival)

    routes.update(route.path for route in app.routes)
    return app


class _CountRequests:
    """ASGI middleware counting every HTTP response by path and status code (streams included). A path that is not
    one of `routes` is counted as "unmatched", so that clients probing URLs cannot grow the label set."""

    def __init__(self, app, metrics: Metrics, routes: set[str]):
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counting_send(message):
            if message["type"] == "http.response.start":
                path = scope.get("path", "")
                self.metrics.count_request(path if path in self.routes else "unmatched", int(message["status"]))
            await send(message)

        return await self.app(scope, receive, counting_send)


def _require_ready(state: _State) -> None:
    if state.status != "ok":
        raise APIError(503, f"the model is {state.status}; retry when GET /health answers 200",
                       type="service_unavailable", code="model_" + state.status)  # fmt: skip


def _health_body(state: _State) -> dict[str, Any]:
    """GET /health once ready: build id, checkpoint (weight_bytes in bytes), device, dtype policy, quantization,
    compile cache (dir, and this process's trace/compile/cache-hit counts), max_length and buckets (tokens),
    warm-up shapes ((prompt tokens, max_tokens) pairs) and warmup_s (seconds spent compiling them)."""
    loaded, eng = state.loaded, state.loaded.engine
    pol = eng.policy
    counts = _compile_counts()
    return {
        "status": "ok", "model": state.model_name, "build_id": loaded.build_id, "checkpoint": loaded.checkpoint,
        "device": {"platform": pol.platform, "device_kind": pol.device_kind,
                   "compute_capability": pol.compute_capability},
        "dtype_policy": {"compute": pol.compute_dtype, "weights": pol.weight_dtype,
                         "activations": pol.activation_dtype, "kv_cache": pol.kv_dtype, "pre_ampere": pol.pre_ampere,
                         "line": pol.line()},
        "quantization": loaded.quantization,
        "compile_cache": {"dir": loaded.compile_cache.get("dir"), "enabled": loaded.compile_cache.get("dir") is not None,
                          **counts},
        "max_length": eng.max_length, "buckets": list(eng.buckets),
        "warmup_shapes": [list(s) for s in state.warmup_shapes], "warmup_s": state.warmup_s,
    }  # fmt: skip


async def _serve(state: _State, request: Request, body: GenerationRequest, ids: list[int], kind: str, t_arrival: int):
    """Validate, queue the job, and answer (JSON, or an SSE stream)."""
    from model.errors import EngineError

    engine = state.loaded.engine
    if body.model != state.model_name:
        raise APIError(404, f"model {body.model!r} does not exist; this server serves {state.model_name!r}",
                       param="model", code="model_not_found")  # fmt: skip
    sampling, max_tokens = sampling_params(body, kind, engine)
    prompt_param = "messages" if kind == "chat" else "prompt"
    max_tokens_param = max_tokens_field(body, kind)[1]
    default = body.max_tokens is None and body.max_completion_tokens is None
    check_context(len(ids), max_tokens, engine, prompt_param=prompt_param, max_tokens_param=max_tokens_param,
                  default=default)  # fmt: skip
    try:
        engine.check_request(len(ids), max_tokens)  # the engine's own limits, should they ever be stricter
    except EngineError as exc:
        raise APIError(400, f"the request does not fit this server: {exc}", param=prompt_param,
                       code="context_length_exceeded") from exc  # fmt: skip
    job = _Job(ids, max_tokens, sampling, not body.ignore_eos, asyncio.get_running_loop())
    text = TextAssembler(engine.tokenizer, stop_strings(body), body.skip_special_tokens)
    answer = _Answer(state, job, text, kind, body.model, t_arrival)
    state.worker.jobs.put(job)
    if body.stream:
        usage = body.stream_options is not None and body.stream_options.include_usage
        return StreamingResponse(answer.sse(usage), media_type="text/event-stream",
                                 headers={"X-Request-Id": answer.id, "Cache-Control": "no-cache"})  # fmt: skip
    return await answer.whole(request)


class _Answer:
    """One request's answer: consumes the job's events, builds OpenAI bodies, records metrics. `t_arrival`: when
    the request reached its handler (perf_counter_ns); `tokens`/`times`: generated ids and their host arrival
    times (perf_counter_ns)."""

    def __init__(self, state: _State, job: _Job, text: TextAssembler, kind: str, model: str, t_arrival: int):
        self.state, self.job, self.text, self.kind, self.model, self.t_arrival = state, job, text, kind, model, t_arrival
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.tokens: list[int] = []
        self.times: list[int] = []
        self.gen = None

    async def events(self, request: Request | None = None) -> AsyncIterator[tuple[str, list[int]]]:
        """Yields (text delta, ids it came from) per generated token; the last yield is the final flush.
        Raises the engine's exception. With `request`, polls for a client disconnect and cancels the job."""
        job = self.job
        while True:
            try:
                item = await asyncio.wait_for(job.events.get(), timeout=0.5)
            except TimeoutError:
                if request is not None and await request.is_disconnected():
                    job.cancel.set()
                continue
            if item[0] == "token":
                self.tokens.append(item[1])
                self.times.append(item[2])
                delta = self.text.push(item[1])
                if self.text.stopped:
                    job.cancel.set()
                yield delta, [item[1]]
            elif item[0] == "done":
                self.gen = item[1]
                break
            elif item[0] == "skipped":
                break
            else:
                raise item[1]
        yield self.text.finish(), []

    def finalize(self) -> dict[str, Any]:
        """Degeneracy verdict, finish reason, usage; logs and records metrics (TTFT in s, decode gauge in tok/s).
        Returns {"finish_reason": "stop" or "length", "usage": token counts, "degenerate": Verdict.to_dict()}."""
        kept = self.tokens[: self.text.consumed] if self.text.stopped else self.tokens
        verdict = check_degenerate(kept)
        eos = set(getattr(self.state.loaded.engine.cfg, "eos_token_ids", ()))
        stopped = self.text.stopped or (self.job.stop_at_eos and bool(kept) and kept[-1] in eos)
        cancelled = self.job.cancel.is_set() and not self.text.stopped
        n, times = len(kept), self.times
        # the decode rate is over every generated token (a stop string may keep fewer of them in the text)
        t = request_times(self.t_arrival, times, None, len(times)) if times else {}
        ttft = t["ttft_ms"] / 1e3 if times else None
        gauge = t.get("gauge_tok_s")
        self.state.metrics.record_generation(
            prompt_tokens=len(self.job.prompt_ids), completion_tokens=n, ttft_s=ttft, gauge_tok_s=gauge,
            degenerate=verdict.degenerate, cancelled=cancelled, compile_traces=self.gen.compile_traces if self.gen else 0,
        )  # fmt: skip
        if verdict.degenerate:
            log.warning(f"degenerate response {self.id}: {verdict.reason}")
        return {
            "finish_reason": "stop" if stopped else "length",
            "usage": {"prompt_tokens": len(self.job.prompt_ids), "completion_tokens": n,
                      "total_tokens": len(self.job.prompt_ids) + n},
            "degenerate": verdict.to_dict(),
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
        parts = []
        try:
            async for delta, _ids in self.events(request):
                parts.append(delta)
        finally:
            if self.gen is None:  # cancelled or failed: make sure the engine lets go
                self.job.cancel.set()
        extra = self.finalize()
        body = self._envelope(stream=False) | {
            "choices": [self._choice("".join(parts), extra["finish_reason"], None, stream=False)],
            "usage": extra["usage"], "degenerate": extra["degenerate"],
        }  # fmt: skip
        headers = {"X-Request-Id": self.id, "X-Degenerate": "true" if extra["degenerate"]["degenerate"] else "false"}
        return JSONResponse(body, headers=headers)

    async def sse(self, include_usage: bool) -> AsyncIterator[str]:
        def data(obj: dict[str, Any]) -> str:
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
            yield data(self._envelope(stream=True) | {"choices": [last], "degenerate": extra["degenerate"]})
            if include_usage:
                yield data(self._envelope(stream=True) | {"choices": [], "usage": extra["usage"]})
            yield "data: [DONE]\n\n"
        except Exception as exc:  # noqa: BLE001  (the status line is gone: report in-band, as OpenAI does)
            log.exception("error during a streamed generation")
            self.state.metrics.count_error("server_error")
            yield data(APIError(500, f"internal error: {type(exc).__name__}", type="server_error").body())
        finally:
            if not done:  # the client went away (the stream was cancelled or closed): free the engine
                self.job.cancel.set()
                self.state.metrics.record_generation(
                    prompt_tokens=len(self.job.prompt_ids), completion_tokens=len(self.tokens), ttft_s=None,
                    gauge_tok_s=None, degenerate=False, cancelled=True, compile_traces=0)  # fmt: skip
                log.info(f"request {self.id}: client disconnected after {len(self.tokens)} tokens; cancelled")
