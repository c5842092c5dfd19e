"""`bench serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) for the engine, with continuous batching.

Endpoints:
- `POST /v1/completions`, `POST /v1/chat/completions` (Gemma's chat turn format), non-streaming and streaming
  (server-sent events, `data: {json}` lines ending with `data: [DONE]`). Fields: `model`, `prompt` / `messages`,
  `max_tokens` (or its newer name `max_completion_tokens`), `temperature` (default 1.0, 0 = greedy), `top_p`,
  `top_k` (0 or -1 = off; above the vocabulary size, clamped to it), `seed`, `stop` (a string or a list of up to 4,
  each up to 1,000 characters), `stream`, `stream_options.include_usage` and `.continuous_usage_stats` (vLLM's),
  and two vLLM-style extensions:
  `ignore_eos` (generate exactly `max_tokens`, what a benchmark needs) and `skip_special_tokens` (default true).
  `n` must be 1. Fields that would change the output but are not implemented (echo, logprobs, penalties, logit_bias,
  tools, a response_format other than text, ...) are refused unless neutral (`bench.serve.schema.UNSUPPORTED`).
  `bench.serve.schema` holds the request models (each field's meaning and unit) and the response fields.
- `GET /v1/models`, `GET /v1/models/{id}` (the one model this server serves, else 404; OpenAI's `id`, `object`,
  `created`, `owned_by`, and vLLM's `root` and `parent`), `GET /health`
  (503 `{"status": "loading"}` until the model is loaded and every warm-up shape
  compiled; then 200 with build id, checkpoint, device, dtype policy (the weights' dtype under `weights`),
  quantization, the engine's kernels, compile cache state, and the scheduler's settings under `serving`),
  `GET /metrics` (Prometheus text format; names start with `gemma4_bench_`).

Every response is judged by `bench.measure.degeneracy.check_degenerate` on its generated ids. A degenerate one is still
returned, but carries `"degenerate": {"degenerate": true, "reason": ..., "details": ...}` (the field is on every
response; in a stream, on the chunk that carries `finish_reason`), the header `X-Degenerate: true` (non-streaming
responses only: a stream's headers leave before its tokens exist), a warning log line, and a metric count.
Streamed chunks also carry the ids of their text in `choices[0].token_ids` (an extension, one id per chunk).

Chat messages: `role` is "system", "user" or "assistant" (else a 400 naming `messages.N.role`), and content is always
text: `<|turn>`, `<turn|>` or any other control-token string in it is encoded as ordinary characters, so a message
cannot open, close or forge a turn. A completions `prompt` text is raw input: control-token strings in it are parsed.

What a request cannot do to the server (`bench.serve.guard`, checked before the body is parsed): send a body of more
than `max_body_bytes` (413, code "request_too_large"; default `DEFAULT_MAX_BODY_BYTES`, 1 MiB), or, with an API key
set, reach any route but /health and /metrics without `Authorization: Bearer <key>` (401, "invalid_api_key").
Tokenization runs on a small thread pool, never on the event loop, after a bound that needs no tokenizing (a text of
C characters has at least C / `max_chars_per_token` tokens) has refused prompts too long to fit; the event loop only
parses the (size-limited) JSON, so /health answers at once while a large prompt is tokenized.

Concurrency (`bench.serve.scheduler`): one scheduler thread owns the engine and `max_batch` decode slots.
Requests wait in a bounded FIFO queue; between decode steps they join free slots (their prefill runs, then they
decode with the others) and leave when finished, stopped or disconnected, their slot freed at once. At most
`max_batch + max_queue` requests are in the server: one more is a 429 (code "queue_full", header `Retry-After`)
at once, never a hang. With `request_deadline_s`, a request still waiting that long is refused (503, code
"deadline_exceeded") and one still generating is stopped (finish_reason "length"). The slots are a `SlotEngine`
(`bench.serve.slots`, chosen by `slots_factory`; `bench serve`'s is `default_slots`): for `max_batch` > 1
`BatchedSlots`, the rows of one batched KV cache of `max_length` positions per slot, decoded together by one jitted
step (so a prompt + max_tokens must fit `max_length`: a 400 otherwise; one prefill joins per step); for
`max_batch` 1 `SequentialSlots`, the single-sequence engine exactly as before (each request its own cache of
bucket + max_tokens positions). Tokens reach
the event loop through `call_soon_threadsafe`, so neither streaming nor a slow client ever blocks the engine. A
request whose client disconnects is cancelled at once (`bench.serve.answer`): dropped before it starts when it is
still queued, its slot freed at the next step boundary when it runs.

Timing definitions (docs/method.md): server-side TTFT runs from the arrival of the request at its handler
(queue wait included) to the first generated id on the host; the decode gauge is (generated - 1) / (last id - first
id), in tok/s. Each distinct shape compiles once: with `SequentialSlots` (bucket, max_tokens, greedy or sampling);
with `BatchedSlots` a prefill per (bucket, greedy or sampling) at the slots' fixed cache length, whatever
max_tokens, and the slots' steps (one per row count a step decodes, `model.slots.row_counts`, and all the slots;
greedy, and with a sampled slot). Name the shapes clients will use in `--warmup-shapes` so that no client request
pays a compile: a warm-up shape compiles, through the slot engine, its greedy prefill and, for `BatchedSlots`, its
sampled prefill, the insert and every step (a compile in a running server stalls every slot).

Errors follow OpenAI's body, `{"error": {"message", "type", "param", "code"}}`, and are counted in /metrics by type:
400 for a malformed body or a bad field (code `invalid_value`, `invalid_json`, `unsupported_parameter`,
`context_length_exceeded` with `param` the field to change, ...), 401 without the API key, 404 for an unknown model
or route, 405 for a method a route does not take, 413 for a body over the limit, 429 when the queue is full, 503
while loading or stopping (or a deadline passed in the queue), 500 for anything unexpected (logged; the server
keeps serving).
(GET /health's 503 while loading is its status body, not an error body.) JSON types are checked strictly: a field
of the wrong type (`"max_tokens": "5"`, `"stream": "true"`) is a 400 naming the field, what was received and what
was expected (`max_tokens must be an integer, got a string: "5"`); an integer where a number is expected is
accepted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from bench.errors import InputError
from bench.serve.answer import Answer
from bench.serve.guard import DEFAULT_MAX_BODY_BYTES, ApiKeyGuard, BodyLimit, CountRequests
from bench.serve.metrics import CONTENT_TYPE, Metrics
from bench.serve.scheduler import Job, QueueFull, Scheduler, Stopping, describe
from bench.serve.slots import SequentialSlots, SlotEngine
from bench.serve.schema import (
    APIError,
    ChatRequest,
    CompletionRequest,
    GenerationRequest,
    chat_prompt_ids,
    check_context,
    completion_prompt_ids,
    http_error,
    max_tokens_field,
    sampling_params,
    stop_strings,
    validation_error,
)
from bench.serve.text import TextAssembler
from model.errors import ModelError

log = logging.getLogger("bench.serve")

TOKENIZE_THREADS = 2  # tokenization's thread pool: a few large prompts at once cannot take every core
DEFAULT_MAX_BATCH = 1  # create_app's decode slots: 1 is the one-request-at-a-time server (`bench serve`: 8)
DEFAULT_MAX_QUEUE = 64  # requests that may wait for a slot; one more is a 429
RETRY_AFTER_S = 1  # the Retry-After of a 429 (s): a slot frees within a request's time, usually far less


# ---- what the loader hands the server -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class LoadedModel:
    """A loaded engine and the facts /health reports about it.

    engine: what generates (model.engine.Engine, or anything with its generate/warmup/check_request/tokenizer/
    policy/cfg/buckets/max_length). checkpoint: {"id": hub id or folder name, "source": builtin:NAME, hub id or None,
    "content_hash": hash of the weight files or None, "weight_bytes": size of the weights in bytes, "load_s"}: never a
    local path. build_id: `bench.runs.payload_build_id` of the served payload, the one a sweep of the same code,
    checkpoint and engine configuration records (None when unknown). compile_cache: {"dir": persistent compilation cache folder, or None when
    off}. quantization: "none" or the `--quant` option set (canonical text); scale_dtype: the dtype of its scales
    (None when nothing is quantized). kernel: the engine's own kernels as a sweep manifest names them
    (`bench.runs.manifest.EngineConfig.kernel`: "w4a16=pallas" or "w4a16=xla" for w4 weights, "bf16=cpu" or
    "bf16=cpu-amx" for bfloat16 weights multiplied by the CPU kernels, "attention=cpu" for decode attention's CPU
    kernel, space-separated; None: XLA's products and attention throughout).
    """

    engine: Any  # model.engine.Engine (or anything with its generate/bucket_for/tokenizer/policy/cfg)
    checkpoint: dict[str, Any]
    build_id: str | None = None
    compile_cache: dict[str, Any] = dataclasses.field(default_factory=lambda: {"dir": None})
    quantization: str = "none"
    scale_dtype: str | None = None
    kernel: str | None = None


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


# ---- the server's state -------------------------------------------------------------------------------------------
class _State:
    """The server's state: "loading" -> "ok" (loaded, warm-up shapes compiled, scheduler started) or "failed" (with
    `error`, one line). `warmup_s`: seconds spent compiling the warm-up shapes; `created`: Unix time (s);
    `tokenize`: the thread pool prompts are tokenized on (never the event loop); `serving`: the scheduler's
    settings (max_batch, max_queue, request_deadline_s, slot_engine)."""

    def __init__(self, provider, model_name, warmup_shapes, serving: dict[str, Any], slots_factory):
        self.provider, self.model_name, self.warmup_shapes = provider, model_name, tuple(warmup_shapes)
        self.serving, self.slots_factory = serving, slots_factory
        self.status, self.error = "loading", None
        self.loaded: LoadedModel | None = None
        self.scheduler: Scheduler | None = None
        self.metrics = Metrics(_compile_counts)
        self.warmup_s: float | None = None
        self.on_load_failure: Callable[[Exception], None] | None = None
        self.created = int(time.time())
        self.tokenize = concurrent.futures.ThreadPoolExecutor(TOKENIZE_THREADS, thread_name_prefix="serve-tokenize")

    def load(self) -> None:
        """Load the model, make the slot engine (its memory checked before it allocates: a server whose slots
        do not fit fails here, before any warm-up) and compile every warm-up shape through it (runs in a
        background thread)."""
        try:
            loaded = self.provider()
            slots = self.slots_factory(loaded.engine, self.serving["max_batch"])
            self.serving["slot_engine"] = describe(slots)
            self.serving["slot_positions"] = getattr(slots, "max_context", None)
            t0 = time.perf_counter()
            for n, m in self.warmup_shapes:
                log.info(f"warm-up: compiling the shape of {n} prompt tokens, {m} max tokens")
                warmup = getattr(slots, "warmup", None)
                warmup(n, m) if warmup is not None else loaded.engine.warmup(n, m)
            self.warmup_s = time.perf_counter() - t0
            self.loaded = loaded
            self.model_name = self.model_name or str(loaded.checkpoint.get("id") or "gemma4")
            self.scheduler = Scheduler(slots, max_queue=self.serving["max_queue"],
                                       eos_ids=getattr(loaded.engine.cfg, "eos_token_ids", ()),
                                       on_outcome=self.metrics.count_outcome)  # fmt: skip
            self.status = "ok"
            log.info(f"ready: serving model {self.model_name!r}")
        except Exception as exc:  # noqa: BLE001  (reported by /health, and to on_load_failure)
            self.status, self.error = "failed", f"{type(exc).__name__}: {exc}"
            if self.on_load_failure is not None:
                self.on_load_failure(exc)  # its owner reports it (`bench serve`: one line on stderr, then exits)
            else:
                log.error(f"loading failed: {self.error}")

    async def off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the tokenize pool, awaited (its exception re-raised here)."""
        return await asyncio.get_running_loop().run_in_executor(self.tokenize, fn, *args)


def _compile_counts() -> dict[str, int]:
    try:
        from model.engine import CompileCounter

        return CompileCounter.snapshot()
    except Exception:  # noqa: BLE001
        return {}


def _state_of(request: Request) -> _State:
    return request.app.state.server


# ---- the application ----------------------------------------------------------------------------------------------
def create_app(engine_provider: Callable[[], LoadedModel], *, model_name: str | None = None,
               warmup_shapes: Sequence[tuple[int, int]] = (),
               on_load_failure: Callable[[Exception], None] | None = None, api_key: str | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, max_batch: int = DEFAULT_MAX_BATCH,
               max_queue: int = DEFAULT_MAX_QUEUE, request_deadline_s: float | None = None,
               slots_factory: Callable[[Any, int], SlotEngine] = SequentialSlots) -> FastAPI:  # fmt: skip
    """The FastAPI app. `engine_provider()` is called once, in a background thread started with the server; it
    returns a `LoadedModel` (or raises: /health then answers 503 with status "failed" and the reason, and
    `on_load_failure(exc)` is called, e.g. to stop the server). `model_name`: the id clients must send (default:
    the checkpoint id). `warmup_shapes`: (prompt tokens, max_tokens) pairs compiled (greedy) before /health
    reports ready. `api_key`: when set, every route but /health and /metrics needs `Authorization: Bearer
    <api_key>`. `max_body_bytes`: the largest request body accepted (bytes; larger is a 413). `max_batch`: decode
    slots (>= 1); `max_queue`: requests that may wait for a slot (>= 0); `request_deadline_s`: seconds a request
    may spend in the server, queue and generation (None: no limit); `slots_factory(engine, max_batch)`: the
    `SlotEngine` over the loaded engine (default `SequentialSlots`; `bench serve` passes `default_slots`:
    `BatchedSlots` for max_batch > 1, `SequentialSlots` for 1); it raises the engine's error when its slots do not
    fit in memory (then /health is "failed" and `on_load_failure` is called). Raises ValueError for a
    max_batch < 1, a max_queue < 0 or a deadline <= 0; requests are refused with `APIError` bodies (see the module
    docstring)."""
    if max_batch < 1 or max_queue < 0 or (request_deadline_s is not None and not request_deadline_s > 0):
        raise ValueError(f"create_app: max_batch {max_batch} (>= 1), max_queue {max_queue} (>= 0), "
                         f"request_deadline_s {request_deadline_s} (> 0 or None)")  # fmt: skip
    serving = {"max_batch": max_batch, "max_queue": max_queue, "request_deadline_s": request_deadline_s,
               "slot_engine": None, "slot_positions": None}  # fmt: skip
    state = _State(engine_provider, model_name, warmup_shapes, serving, slots_factory)
    state.on_load_failure = on_load_failure

    async def lifespan(_app: FastAPI):
        threading.Thread(target=state.load, name="model-loader", daemon=True).start()
        yield
        if state.scheduler is not None:
            await asyncio.to_thread(state.scheduler.stop)
        state.tokenize.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="gemma4-bench", lifespan=lifespan)
    app.state.server = state
    _add_error_handlers(app)
    _add_routes(app)
    routes = {route.path for route in app.routes}
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes, on_error=state.metrics.count_error)  # innermost
    if api_key:
        app.add_middleware(ApiKeyGuard, key=api_key, on_error=state.metrics.count_error)
    app.add_middleware(CountRequests, metrics=state.metrics, routes=routes)  # outermost: counts every answer
    return app


def _add_routes(app: FastAPI) -> None:
    app.add_api_route("/health", _health, methods=["GET"])
    app.add_api_route("/v1/models", _models, methods=["GET"])
    app.add_api_route("/v1/models/{model_id:path}", _model, methods=["GET"])
    app.add_api_route("/metrics", _metrics, methods=["GET"])
    app.add_api_route("/v1/completions", _completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", _chat, methods=["POST"])


# ---- errors -------------------------------------------------------------------------------------------------------
_SCHEMAS = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatRequest}


def _add_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _on_api_error)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(ModelError, _on_model_error)
    app.add_exception_handler(Exception, _on_unexpected)


def _error_response(request: Request, exc: APIError) -> JSONResponse:
    _state_of(request).metrics.count_error(exc.type)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers or None)


async def _on_api_error(request: Request, exc: APIError) -> JSONResponse:
    return _error_response(request, exc)


async def _on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    return _error_response(request, validation_error(exc.errors(), exc.body, _SCHEMAS.get(request.url.path)))


async def _on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """404, 405, and a body the framework's JSON parser refused."""
    allowed = (exc.headers or {}).get("Allow")
    api = http_error(exc.status_code, exc.detail, request.method, request.url.path, exc.__cause__, allowed)
    response = _error_response(request, api)
    if allowed:
        response.headers["Allow"] = allowed
    return response


async def _on_model_error(request: Request, exc: ModelError) -> JSONResponse:
    """The model's own refusals (e.g. text that cannot be tokenized): a 400."""
    return _error_response(request, APIError(400, str(exc), code="invalid_value"))


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error while serving a request")
    return _error_response(request, APIError(500, f"internal error: {type(exc).__name__}", type="server_error"))


# ---- the read-only routes -----------------------------------------------------------------------------------------
async def _health(request: Request) -> JSONResponse:
    state = _state_of(request)
    if state.status != "ok":
        body = {"status": state.status} | ({"error": state.error} if state.error else {})
        return JSONResponse(body, status_code=503)
    return JSONResponse(_health_body(state))


def _model_card(state: _State) -> dict[str, Any]:
    """The served model as OpenAI's model object (`id`, `object`, `created` in Unix s, `owned_by`), with vLLM's
    `root` (the checkpoint's id: what the served name stands for) and `parent` (null: no adapter), and
    max_model_len (tokens), checkpoint and build id."""
    root = str(state.loaded.checkpoint.get("id") or state.model_name)
    return {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "gemma4-bench",
            "root": root, "parent": None, "max_model_len": state.loaded.engine.max_length,
            "checkpoint": state.loaded.checkpoint, "build_id": state.loaded.build_id}  # fmt: skip


async def _models(request: Request) -> JSONResponse:
    state = _state_of(request)
    _require_ready(state)
    return JSONResponse({"object": "list", "data": [_model_card(state)]})


async def _model(model_id: str, request: Request) -> JSONResponse:
    """GET /v1/models/{id}: the model card, or 404 (code "model_not_found") for any other id."""
    state = _state_of(request)
    _require_ready(state)
    if model_id != state.model_name:
        raise APIError(404, f"model {model_id!r} does not exist; this server serves {state.model_name!r}",
                       param="model", code="model_not_found")  # fmt: skip
    return JSONResponse(_model_card(state))


async def _metrics(request: Request) -> PlainTextResponse:
    state = _state_of(request)
    sched = state.scheduler
    text = state.metrics.render(ready=state.status == "ok", queue_depth=sched.waiting if sched else 0,
                                running=sched.running if sched else 0, max_batch=sched.max_batch if sched else None)  # fmt: skip
    return PlainTextResponse(text, media_type=CONTENT_TYPE)


def _require_ready(state: _State) -> None:
    if state.status != "ok":
        raise APIError(503, f"the model is {state.status}; retry when GET /health answers 200",
                       type="service_unavailable", code="model_" + state.status)  # fmt: skip


def _health_body(state: _State) -> dict[str, Any]:
    """GET /health once ready: build id, checkpoint (weight_bytes in bytes), device, dtype policy (`weights`: the
    stored weights' dtype), quantization (and its scale dtype) with `weight_bytes` beside it (the gauge: packed
    values + scales as placed), `kernel` (`LoadedModel.kernel`, the manifest's text, e.g. "bf16=cpu"),
    `xla_options` (the engine's decode programs' XLA options, `model.backends.BackendPlan.xla_options`; null: XLA's
    defaults), `backend` (which engine runs, `model.backends`: "jax" or "cpu-kernels"), compile cache (dir, and this
    process's trace/compile/cache-hit counts), max_length and buckets (tokens),
    warm-up shapes ((prompt tokens, max_tokens) pairs) and warmup_s (seconds spent compiling them), and `serving`:
    max_batch (decode slots), max_queue (requests that may wait), request_deadline_s (s or null), slot_engine (how
    the slots are stepped, in words), slot_positions (tokens a prompt + max_tokens may total in a slot, the
    batched slots' cache length; null: the model's context)."""
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
        "quantization": loaded.quantization, "scale_dtype": loaded.scale_dtype, "kernel": loaded.kernel,
        "xla_options": getattr(eng, "xla_options", None), "backend": getattr(eng, "backend", None),
        "weight_bytes": loaded.checkpoint.get("weight_bytes"),
        "compile_cache": {"dir": loaded.compile_cache.get("dir"), "enabled": loaded.compile_cache.get("dir") is not None,
                          **counts},
        "max_length": eng.max_length, "buckets": list(eng.buckets),
        "warmup_shapes": [list(s) for s in state.warmup_shapes], "warmup_s": state.warmup_s,
        "serving": dict(state.serving),
    }  # fmt: skip


# ---- the generation routes ----------------------------------------------------------------------------------------
async def _completions(body: CompletionRequest, request: Request):
    return await _generate(request, body, "completion", completion_prompt_ids, body.prompt)


async def _chat(body: ChatRequest, request: Request):
    return await _generate(request, body, "chat", chat_prompt_ids, body.messages)


async def _generate(request: Request, body: GenerationRequest, kind: str, prompt_ids: Callable, prompt: Any):
    """One generation route: admit (no tokenizing), build the prompt ids off the event loop with
    `prompt_ids(tokenizer, prompt, engine)`, then serve. The arrival time is taken first (ns, monotonic)."""
    t_arrival = time.perf_counter_ns()
    state = _state_of(request)
    sampling, max_tokens = _admit(state, body, kind)
    engine = state.loaded.engine
    ids = await state.off_loop(prompt_ids, engine.tokenizer, prompt, engine)
    return await _serve(state, request, body, ids, sampling, max_tokens, kind, t_arrival)


def _admit(state: _State, body: GenerationRequest, kind: str) -> tuple[Any, int]:
    """The checks that need no tokenizing: ready, the model id, the generation fields. Returns (Sampling,
    max_tokens in tokens); raises APIError."""
    _require_ready(state)
    if body.model != state.model_name:
        raise APIError(404, f"model {body.model!r} does not exist; this server serves {state.model_name!r}",
                       param="model", code="model_not_found")  # fmt: skip
    return sampling_params(body, kind, state.loaded.engine)


async def _serve(state: _State, request: Request, body: GenerationRequest, ids: list[int], sampling: Any,
                 max_tokens: int, kind: str, t_arrival: int):  # fmt: skip
    """Check the prompt's length, queue the job (or refuse it: 429 when the queue is full, 503 when stopping), and
    answer (JSON, or an SSE stream)."""
    from model.errors import EngineError

    engine = state.loaded.engine
    prompt_param = "messages" if kind == "chat" else "prompt"
    max_tokens_param = max_tokens_field(body, kind)[1]
    default = body.max_tokens is None and body.max_completion_tokens is None
    check_context(len(ids), max_tokens, engine, prompt_param=prompt_param, max_tokens_param=max_tokens_param,
                  default=default, slot_positions=state.serving.get("slot_positions"))  # fmt: skip
    try:
        engine.check_request(len(ids), max_tokens)  # the engine's own limits, should they ever be stricter
    except EngineError as exc:
        raise APIError(400, f"the request does not fit this server: {exc}", param=prompt_param,
                       code="context_length_exceeded") from exc  # fmt: skip
    deadline_s = state.serving["request_deadline_s"]
    deadline_ns = t_arrival + int(deadline_s * 1e9) if deadline_s is not None else None
    job = Job(ids, max_tokens, sampling, not body.ignore_eos, asyncio.get_running_loop(), deadline_ns=deadline_ns)
    text = TextAssembler(engine.tokenizer, stop_strings(body), body.skip_special_tokens)
    answer = Answer(job, text, kind=kind, model=body.model, t_arrival=t_arrival, metrics=state.metrics,
                    eos_ids=getattr(engine.cfg, "eos_token_ids", ()))  # fmt: skip
    _submit(state, job)
    if body.stream:
        options = body.stream_options
        usage = options is not None and options.include_usage
        continuous = options is not None and options.continuous_usage_stats
        return StreamingResponse(answer.sse(usage, continuous), media_type="text/event-stream",
                                 headers={"X-Request-Id": answer.id, "Cache-Control": "no-cache"})  # fmt: skip
    return await answer.whole(request)


def _submit(state: _State, job: Job) -> None:
    """Queue `job`, counting it admitted; a full queue is a 429 with Retry-After (code "queue_full"), a stopping
    server a 503 (code "server_stopping"), each counted as rejected. Raises APIError."""
    try:
        state.scheduler.submit(job)
    except QueueFull as exc:
        state.metrics.count_rejected("queue_full")
        raise APIError(429, f"the server is at capacity ({exc.running} requests running, {exc.waiting} waiting, at "
                       f"most {exc.capacity}); retry after {RETRY_AFTER_S} s", type="rate_limit_exceeded",
                       code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)}) from None  # fmt: skip
    except Stopping:
        state.metrics.count_rejected("stopping")
        raise APIError(503, "the server is stopping; retry on another server", type="service_unavailable",
                       code="server_stopping") from None  # fmt: skip
    state.metrics.admitted.inc()
