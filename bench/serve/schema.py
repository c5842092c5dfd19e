"""What a client of `bench serve` sends and gets back: the request bodies, their checks, and the error body.

Requests are pydantic models, strict about JSON types: a field gets the JSON type it is declared with or the request
is refused (`"max_tokens": "5"`, `"stream": "true"` and `"temperature": true` are 400s), with the one conversion JSON
clients rely on, an integer where a number is expected (`"temperature": 1`). Unknown fields are accepted and
ignored, except the OpenAI/vLLM fields that would change the output and that this server does not implement
(`UNSUPPORTED`): their neutral values (0, false, null, empty, 1) pass, anything else is a 400 naming the field.
Ranges (max_tokens against the server's limit, temperature, top_p, ...) are checked after parsing, by
`sampling_params`, which needs the engine; the prompt's length against the context, by `check_context`.

Responses (built in `bench.serve`; JSON, OpenAI's shapes):
- `usage`: `prompt_tokens` (tokens in, BOS and chat turns included), `completion_tokens` (tokens generated and
  kept: a stop string drops the ones after it), `total_tokens` (their sum).
- `choices[0].finish_reason`: "stop" (EOS or a stop string) or "length" (max_tokens generated, or cancelled).
- `degenerate`: `bench.measure.degeneracy.Verdict.to_dict()` of the kept ids, `{"degenerate", "reason", "details"}`.
- streamed chunks: `choices[0].token_ids`, the ids (tokens) whose text the chunk carries.
- Timings are not in the bodies: /metrics has the decode gauge in tok/s ((generated - 1) / decode time) and TTFT in
  seconds; /health has the warm-up compile time in seconds (`warmup_s`) and lengths in tokens.

Errors are `APIError`s, answered with OpenAI's body `{"error": {"message", "type", "param", "code"}}`; pydantic's
validation errors become one (`validation_error`), and so do the framework's own (unknown route, wrong method, a
body its JSON parser refuses: `http_error`).
"""

from __future__ import annotations

import json
import random
import sys
import types
import typing
from collections.abc import Callable, Sequence
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
)

MAX_STOP_STRINGS = 4
MAX_STOP_LENGTH = 1000  # characters per stop string: bounds the per-token stop-string work and its tables
SEED_RANGE = (-(2**63), 2**64)  # accepted seeds, [low, high): any 64-bit integer, signed or not (vLLM's range)
DEFAULT_MAX_TOKENS = {"completion": 16, "chat": 256}  # tokens; OpenAI's legacy completions default is 16


# ---- OpenAI-style errors ------------------------------------------------------------------------------------------
class APIError(Exception):
    """A request the server refuses: HTTP `status` (400 bad input, 404 unknown model, 429 queue full, 503 loading,
    stopping or a deadline passed in the queue, 500 unexpected) with an OpenAI-style error body and `headers`.
    `type`: OpenAI's error type ("invalid_request_error", "rate_limit_exceeded", "service_unavailable",
    "server_error"); `param`: the offending field as a dotted path ("max_tokens", "messages.0.content") or None;
    `code`: a machine-readable reason ("invalid_value", "invalid_json", "context_length_exceeded", ...) or None."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = dict(headers or {})  # sent with the error response (e.g. Retry-After on a 429)

    def body(self) -> dict[str, Any]:
        """The JSON body: `{"error": {"message", "type", "param", "code"}}`."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# ---- request bodies -----------------------------------------------------------------------------------------------
class StreamOptions(BaseModel):
    """`stream_options`: `include_usage` (true: a last chunk, `"choices": []`, before `[DONE]`, carries `usage` in
    tokens); `continuous_usage_stats` (vLLM's extension; true: every chunk carries `usage` so far)."""

    model_config = ConfigDict(extra="allow")

    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


class GenerationRequest(BaseModel):
    """The fields completions and chat share.

    model: the id the server serves (GET /v1/models), else 404. max_tokens: tokens to generate at most, >= 1
    (default `DEFAULT_MAX_TOKENS[kind]`; at most the server's max length, and the prompt plus max_tokens must fit
    the model's context). max_completion_tokens: OpenAI's newer name for max_tokens, the same thing (send one, or
    both equal). temperature: softmax temperature in [0, 2], 0 = greedy. top_p: nucleus probability mass in (0, 1].
    top_k: tokens kept, 0 or -1 = off (vLLM's spelling); a top_k above the vocabulary size keeps every token, so it
    is clamped to the vocabulary size (= off). seed: sampling seed, an integer in `SEED_RANGE` (any 64-bit value;
    taken modulo 2**32; random when null): a seed gives the same tokens on the same build. stop: a string or up to
    `MAX_STOP_STRINGS` strings of up to `MAX_STOP_LENGTH` characters each; the text ends before the first one found
    (which is not returned). n: must be 1. stream: server-sent events instead of one JSON body. ignore_eos (vLLM
    extension): generate exactly max_tokens, what a benchmark needs. skip_special_tokens (vLLM extension): leave
    special tokens out of the text. The fields of `UNSUPPORTED` (echo, logprobs, penalties, tools, ...) are
    accepted only with their neutral values.
    """

    model_config = ConfigDict(extra="allow")  # unknown fields are accepted and ignored (see UNSUPPORTED)

    model: StrictStr
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    temperature: StrictFloat = 1.0
    top_p: StrictFloat = 1.0
    top_k: StrictInt = 0
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    # not implemented: only their neutral values are accepted (UNSUPPORTED)
    logprobs: StrictBool | StrictInt | None = None
    top_logprobs: StrictInt | None = None
    echo: StrictBool | None = None
    best_of: StrictInt | None = None
    suffix: StrictStr | None = None
    logit_bias: dict[str, Any] | None = None
    frequency_penalty: StrictFloat | None = None
    presence_penalty: StrictFloat | None = None
    repetition_penalty: StrictFloat | None = None
    min_p: StrictFloat | None = None
    min_tokens: StrictInt | None = None
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    functions: list[Any] | None = None
    function_call: StrictStr | dict[str, Any] | None = None


UNSUPPORTED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "logprobs": (lambda v: v in (None, False, 0), "null, false or 0"),
    "top_logprobs": (lambda v: v in (None, 0), "null or 0"),
    "echo": (lambda v: v in (None, False), "false"),
    "best_of": (lambda v: v in (None, 1), "1"),
    "suffix": (lambda v: not v, 'null or ""'),
    "logit_bias": (lambda v: not v, "null or {}"),
    "frequency_penalty": (lambda v: v in (None, 0), "0"),
    "presence_penalty": (lambda v: v in (None, 0), "0"),
    "repetition_penalty": (lambda v: v in (None, 1), "1"),
    "min_p": (lambda v: v in (None, 0), "0"),
    "min_tokens": (lambda v: v in (None, 0), "0"),
    "response_format": (lambda v: v in (None, {"type": "text"}), '{"type": "text"}'),
    "tools": (lambda v: not v, "null or []"),
    "tool_choice": (lambda v: v in (None, "none", "auto"), 'null, "none" or "auto"'),
    "functions": (lambda v: not v, "null or []"),
    "function_call": (lambda v: v in (None, "none", "auto"), 'null, "none" or "auto"'),
}
"""Request fields that would change the output and that this server does not implement: field -> (is the value
neutral, the neutral values in words). A neutral value is accepted (clients send them by default); any other is a
400 naming the field, never silently ignored."""


class CompletionRequest(GenerationRequest):
    """`POST /v1/completions`. prompt: one text (BOS is prepended, no chat template), a list holding exactly one
    text, or the prompt's token ids (used as given, BOS included if wanted; each in [0, vocab size))."""

    prompt: StrictStr | list[StrictStr] | list[StrictInt]


class ChatMessage(BaseModel):
    """One chat turn. role: one of `ROLES` ("system", "user", "assistant"; "assistant" is spelled "model" in
    Gemma's turns), else a 400 naming the field; content: a text, or a list of `{"type": "text", "text": ...}`
    parts (joined; no other part types). Content is always text: a control-token string in it (`<turn|>`) is
    encoded as ordinary characters, so no content can open or close a turn."""

    model_config = ConfigDict(extra="allow")

    role: StrictStr
    content: StrictStr | list[dict[str, Any]]


ROLES = {"system": "system", "user": "user", "assistant": "model"}
"""The roles a message may have -> how Gemma's turn format spells them."""


class ChatRequest(GenerationRequest):
    """`POST /v1/chat/completions`. messages: the conversation, at least one message, rendered by
    `chat_prompt_ids`; the answer is the model's next turn."""

    messages: list[ChatMessage]


# ---- validation errors, in words ----------------------------------------------------------------------------------
_NOUNS = {bool: ("a boolean (true or false)", "booleans"), int: ("an integer", "integers"), float: ("a number", "numbers"),
          str: ("a string", "strings"), dict: ("an object", "objects")}  # fmt: skip


def validation_error(errors: Sequence[dict[str, Any]], body: Any, schema: type[BaseModel] | None) -> APIError:
    """One 400 `APIError` for pydantic's `errors` (as `RequestValidationError.errors()` gives them) on the request
    `body` (the parsed JSON) validated against `schema`: it names the first wrong field (param, a dotted path such as
    "max_tokens" or "messages.0.content"), the JSON type and value received, and the type expected."""
    first = errors[0] if errors else {}
    loc = list(first.get("loc", ()))[1:]  # the first item says where: "body"
    if first.get("type") == "json_invalid":
        return APIError(400, "malformed JSON body", code="invalid_json")
    path, annotation = _resolve(schema, loc) if schema is not None else (loc, None)
    param = ".".join(str(x) for x in path) or None
    found, value = _lookup(body, path)
    if param is None:
        got = f"got {_received(value)}" if found and value is not None else "got no body"
        return APIError(400, f"the request body must be a JSON object, {got}", code="invalid_value")
    if first.get("type") == "missing" and len(path) == len(loc):
        expected = f": expected {_describe(annotation)}" if annotation is not None else ""
        return APIError(400, f"{param} is required{expected}", param=param, code="invalid_value")
    is_type_error = len(path) < len(loc) or str(first.get("type", "")).endswith("_type")
    if annotation is not None and is_type_error:
        message = f"{param} must be {_describe(annotation)}, got {_received(value)}"
    else:
        message = f"{param}: {first.get('msg', 'invalid')}, got {_received(value)}"
    return APIError(400, message, param=param, code="invalid_value")


def _resolve(schema: type[BaseModel], loc: Sequence[Any]) -> tuple[list[Any], Any]:
    """The longest prefix of `loc` that names fields and list items of `schema` (a union member's tag, such as
    "list[int]", ends it), and the annotation there."""
    annotation: Any = schema
    path: list[Any] = []
    for key in loc:
        nxt = None
        for option in _options(annotation):
            if isinstance(key, str) and isinstance(option, type) and issubclass(option, BaseModel):
                field = option.model_fields.get(key)
                nxt = field.annotation if field is not None else None
            elif isinstance(key, int) and typing.get_origin(option) is list:
                nxt = typing.get_args(option)[0]
            if nxt is not None:
                break
        if nxt is None:
            break
        annotation, path = nxt, path + [key]
    return path, annotation


def _options(annotation: Any) -> list[Any]:
    """The types a (possibly Annotated, possibly union) annotation allows, None left out."""
    if typing.get_origin(annotation) is Annotated:
        return _options(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(annotation) for t in _options(arg)]
    return [] if annotation is type(None) else [annotation]


def _describe(annotation: Any, *, plural: bool = False) -> str:
    """The JSON type(s) of an annotation in words: "an integer", "a string or an array of strings"."""
    words = []
    for option in _options(annotation):
        origin = typing.get_origin(option) or option
        if origin is list:
            args = typing.get_args(option)
            of = f" of {_describe(args[0], plural=True)}" if args else ""
            words.append(("arrays" if plural else "an array") + of)
        elif isinstance(origin, type) and issubclass(origin, BaseModel):
            words.append(_NOUNS[dict][plural])
        elif origin in _NOUNS:
            words.append(_NOUNS[origin][plural])
        else:
            words.append("values" if plural else "any value")
    words = list(dict.fromkeys(words))
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _lookup(body: Any, path: Sequence[Any]) -> tuple[bool, Any]:
    """(found, value) at `path` in the parsed JSON body."""
    for key in path:
        if isinstance(body, dict) and key in body:
            body = body[key]
        elif isinstance(body, list) and isinstance(key, int) and 0 <= key < len(body):
            body = body[key]
        else:
            return False, None
    return True, body


def _received(value: Any, limit: int = 40) -> str:
    """A JSON value in words, with an excerpt: 'a string: "5"', 'an array: [1, 2]', 'null'."""
    if value is None:
        return "null"
    if isinstance(value, bytes | bytearray):
        return "content that is not JSON (send Content-Type: application/json)"
    kinds = [(bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"), (list, "an array"),
             (dict, "an object")]  # fmt: skip
    kind = next((word for t, word in kinds if isinstance(value, t)), type(value).__name__)
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (RecursionError, ValueError):  # nested too deeply, or an integer too long to print
        return kind
    return f"{kind}: {text if len(text) <= limit else text[: limit - 3] + '...'}"


# ---- from a parsed request to the engine's inputs -----------------------------------------------------------------
def chat_turns(messages: Sequence[ChatMessage]) -> list[tuple[str, str]]:
    """The conversation as (Gemma role, text) pairs, for `GemmaTokenizer.chat_turn_ids`. Raises APIError (400,
    `param` naming the field) for no messages, a role outside `ROLES`, or non-text content parts."""
    if not messages:
        raise APIError(400, "messages must hold at least one message", param="messages")
    turns = []
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise APIError(400, f"messages.{i}.role must be one of {', '.join(ROLES)}, got {_received(m.role)}",
                           param=f"messages.{i}.role", code="invalid_value")  # fmt: skip
        content = m.content
        if not isinstance(content, str):
            if any(part.get("type") != "text" or not isinstance(part.get("text"), str) for part in content):
                raise APIError(400, "only text content parts are supported", param=f"messages.{i}.content")
            content = "".join(part["text"] for part in content)
        turns.append((ROLES[m.role], content))
    return turns


def chat_prompt_ids(tokenizer, messages: Sequence[ChatMessage], engine=None) -> list[int]:
    """Gemma's turn format: BOS + `<|turn>{role}\\n{content}<turn|>\\n` per message + `<|turn>model\\n`
    ("assistant" is spelled "model"), content encoded as text (`tokenizer.chat_turn_ids`). One user message
    gives exactly `tokenizer.chat_ids(content)`. With `engine`, a conversation whose characters alone prove it too
    long for the largest bucket is refused before tokenizing (`check_prompt_chars`). Raises APIError as
    `chat_turns` and `check_prompt_chars`; TokenizerError when the tokenizer has no turn markers."""
    turns = chat_turns(messages)
    if engine is not None:
        check_prompt_chars(sum(len(text) for _, text in turns), tokenizer, engine, param="messages")
    return tokenizer.chat_turn_ids(turns)


def completion_prompt_ids(tokenizer, prompt: str | list, engine) -> list[int]:
    """The model input of a completions `prompt`: token ids as given (each in [0, vocab size)), or BOS + the one
    text, encoded raw (control-token strings in it are parsed as those tokens, as a raw prompt is meant to be)
    after `check_prompt_chars`. Raises APIError (400, param "prompt")."""
    if isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
        vocab = engine.cfg.vocab_size
        if any(not 0 <= i < vocab for i in prompt):
            raise APIError(400, f"prompt token ids must lie in [0, {vocab})", param="prompt", code="invalid_value")
        return list(prompt)
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if len(prompts) != 1:
        raise APIError(400, f"exactly one prompt per request is supported, got {len(prompts)}", param="prompt")
    check_prompt_chars(len(prompts[0]), tokenizer, engine, param="prompt")
    return [tokenizer.bos_id] + tokenizer.encode(prompts[0])


def check_prompt_chars(n_chars: int, tokenizer, engine, *, param: str) -> None:
    """Refuse, without tokenizing, a prompt of `n_chars` characters that cannot fit the largest bucket
    (`engine.buckets[-1]` tokens): one token stands for at most `tokenizer.max_chars_per_token` characters, so such
    a text has at least ceil(n_chars / that) tokens. No check when the tokenizer gives no such bound (None or
    absent). Raises APIError (400, code "context_length_exceeded")."""
    per_token = getattr(tokenizer, "max_chars_per_token", None)
    limit = engine.buckets[-1]
    if per_token and n_chars > per_token * limit:
        at_least = -(-n_chars // per_token)
        raise APIError(400, f"the prompt has {n_chars} characters, so at least {at_least} tokens (one token holds "
                       f"at most {per_token} characters); this server's maximum prompt length is {limit} tokens: "
                       "shorten the prompt", param=param, code="context_length_exceeded")  # fmt: skip


def stop_strings(body: GenerationRequest) -> list[str]:
    """`stop` as a list (a single string, a list, or none)."""
    return [body.stop] if isinstance(body.stop, str) else list(body.stop or [])


def sampling_params(body: GenerationRequest, kind: str, engine) -> tuple[Any, int]:
    """Check the generation fields' ranges and refuse unsupported ones; returns (model.engine.Sampling, max_tokens
    in tokens). `kind` is "completion" or "chat" (their max_tokens defaults differ); `engine` gives `max_length`
    (tokens) and `cfg.vocab_size`. top_k -1 becomes 0 (off) and a top_k above the vocabulary size becomes the
    vocabulary size (every token kept, = off); the seed is taken modulo 2**32. Every value handed on fits the
    engine's int32/uint32 arguments. Raises APIError (400, `param` naming the field)."""
    from model.engine import Sampling

    for field, (neutral, words) in UNSUPPORTED.items():
        value = getattr(body, field)
        if not neutral(value):
            raise APIError(400, f"this server does not support {field}: got {_received(value)}; send {words} or "
                           "leave it out", param=field, code="unsupported_parameter")  # fmt: skip
    max_tokens, param = max_tokens_field(body, kind)
    if max_tokens < 1:
        raise APIError(400, f"{param} must be at least 1, got {max_tokens}", param=param, code="invalid_value")
    if max_tokens > engine.max_length:
        raise APIError(400, f"{param} {max_tokens} exceeds this server's limit {engine.max_length}",
                       param=param, code="invalid_value")  # fmt: skip
    low, high = SEED_RANGE
    seed_ok = body.seed is None or low <= body.seed < high
    checks = [("n", body.n == 1, f"only n=1 is supported, got {body.n}"),
              ("temperature", 0.0 <= body.temperature <= 2.0, f"temperature must lie in [0, 2], got {body.temperature}"),
              ("top_p", 0.0 < body.top_p <= 1.0, f"top_p must lie in (0, 1], got {body.top_p}"),
              ("top_k", body.top_k >= -1, f"top_k must be -1 or 0 (off) or a number of tokens, got {body.top_k}"),
              ("seed", seed_ok, f"seed must lie in [-2^63, 2^64) (64 bits), got {_received(body.seed)}")]  # fmt: skip
    for param, ok, message in checks:
        if not ok:
            raise APIError(400, message, param=param, code="invalid_value")
    stops = stop_strings(body)
    if len(stops) > MAX_STOP_STRINGS:
        raise APIError(400, f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}", param="stop",
                       code="invalid_value")  # fmt: skip
    for i, stop in enumerate(stops):
        if len(stop) > MAX_STOP_LENGTH:
            raise APIError(400, f"stop strings may have at most {MAX_STOP_LENGTH} characters, stop string {i} has "
                           f"{len(stop)}", param="stop", code="invalid_value")  # fmt: skip
    top_k = min(max(body.top_k, 0), engine.cfg.vocab_size)
    seed = body.seed if body.seed is not None else random.getrandbits(31)
    return Sampling(temperature=body.temperature, top_k=top_k, top_p=body.top_p, seed=seed % 2**32), max_tokens


def max_tokens_field(body: GenerationRequest, kind: str) -> tuple[int, str]:
    """(max_tokens in tokens, the field that set it: "max_tokens" or "max_completion_tokens"; "max_tokens" for the
    default). Raises APIError (400) when both are given and differ."""
    a, b = body.max_tokens, body.max_completion_tokens
    if a is not None and b is not None and a != b:
        raise APIError(400, f"max_tokens ({a}) and max_completion_tokens ({b}) are the same setting and differ: "
                       "send one of them", param="max_completion_tokens", code="invalid_value")  # fmt: skip
    if a is None and b is not None:
        return b, "max_completion_tokens"
    return (DEFAULT_MAX_TOKENS[kind] if a is None else a), "max_tokens"


def check_context(n_prompt: int, max_tokens: int, engine, *, prompt_param: str, max_tokens_param: str,
                  default: bool = False, slot_positions: int | None = None) -> None:  # fmt: skip
    """Check that a prompt of `n_prompt` tokens and `max_tokens` new ones fit: the prompt in the largest bucket
    (`engine.buckets[-1]` tokens), both in the model's context (`engine.cfg.max_position_embeddings` tokens), or,
    with `slot_positions` (the batched decode slots' cache length, the server's --max-length), in a slot.
    Raises APIError (400, code "context_length_exceeded") whose `param` is the field to change: `max_tokens_param`
    when a smaller max_tokens would fit, else `prompt_param` ("prompt" or "messages"). `default`: max_tokens was
    not sent (the message says it is the default)."""
    limit = engine.buckets[-1]
    if slot_positions is None:
        context, what = engine.cfg.max_position_embeddings, "the model's context"
    else:
        context, what = slot_positions, "this server's context (--max-length)"
    if n_prompt > limit:
        raise APIError(400, f"the prompt has {n_prompt} tokens; this server's maximum prompt length is {limit} "
                       "tokens: shorten the prompt", param=prompt_param, code="context_length_exceeded")  # fmt: skip
    if n_prompt + max_tokens <= context:
        return
    if n_prompt >= context:
        raise APIError(400, f"the prompt has {n_prompt} tokens, which leaves no room for a completion in "
                       f"{what} of {context} tokens: shorten the prompt", param=prompt_param,
                       code="context_length_exceeded")  # fmt: skip
    sent = f"{max_tokens_param} {max_tokens}" + (" (the default)" if default else "")
    raise APIError(400, f"{n_prompt} prompt tokens + {sent} exceed {what} of {context} tokens: set "
                   f"{max_tokens_param} to at most {context - n_prompt}, or shorten the prompt",
                   param=max_tokens_param, code="context_length_exceeded")  # fmt: skip


def http_error(status: int, detail: Any, method: str, path: str, cause: BaseException | None,
               allowed: str | None = None) -> APIError:  # fmt: skip
    """The `APIError` for an error the framework raised before a handler ran (Starlette's HTTPException): 404 an
    unknown route, 405 a method the route does not take (`allowed`: the Allow header), 400 a body its JSON parser
    refused (`cause`: the parser's exception: too deeply nested, an integer with more digits than Python converts,
    not UTF-8), any other status with the framework's `detail`."""
    if status == 404:
        return APIError(404, f"no route {method} {path}: this server answers POST /v1/completions, POST "
                        "/v1/chat/completions, GET /v1/models, GET /health and GET /metrics",
                        code="unknown_url")  # fmt: skip
    if status == 405:
        use = f"; use {allowed}" if allowed else ""
        return APIError(405, f"{path} does not take {method}{use}", code="method_not_allowed")
    if status == 400 and cause is not None:
        if isinstance(cause, RecursionError):
            why = "it is nested too deeply"
        elif isinstance(cause, UnicodeDecodeError):
            why = "it is not UTF-8"
        elif isinstance(cause, ValueError) and "digits" in str(cause):
            why = f"it holds an integer with more than {sys.get_int_max_str_digits()} digits"
        else:
            why = f"{type(cause).__name__}"
        return APIError(400, f"the body is not JSON this server can read: {why}", code="invalid_json")
    error_type = "server_error" if status >= 500 else "invalid_request_error"
    return APIError(status, str(detail), type=error_type)
