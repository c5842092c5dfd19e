"""ASGI middleware of `bench serve`, outermost first: count every response, require the API key, limit the body.

Each refuses with OpenAI's error body before the application (and its JSON parser) sees the request:
- `ApiKeyGuard`: 401 (code "invalid_api_key", header `WWW-Authenticate: Bearer`) unless the request carries
  `Authorization: Bearer <key>`. `GET /health` and `GET /metrics` are open (`OPEN_PATHS`): probes and Prometheus
  scrapers usually carry no secret, and neither route takes input nor runs the model (vLLM draws the same line).
- `BodyLimit`: 413 (code "request_too_large") for a body of more than `max_bytes`, judged by Content-Length before
  reading anything, else while reading a chunked body (at most `max_bytes` are ever buffered).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from starlette.responses import JSONResponse

from bench.serve.metrics import Metrics
from bench.serve.schema import APIError

DEFAULT_MAX_BODY_BYTES = 1 << 20
"""1 MiB: a prompt at the largest bucket (8192 tokens) has room for 128 bytes of JSON per token, far above natural
text (about 4 characters per token; 6 bytes per character when JSON-escaped), and the JSON parse it allows on the
event loop takes milliseconds."""

OPEN_PATHS = frozenset({"/health", "/metrics"})


async def _refuse(exc: APIError, scope, receive, send, on_error: Callable[[str], None],
                  headers: dict[str, str] | None = None) -> None:  # fmt: skip
    on_error(exc.type)
    await JSONResponse(exc.body(), status_code=exc.status, headers=headers)(scope, receive, send)


class CountRequests:
    """Counts every HTTP response by route and status code (streams included). The label is the route's path
    template ("/v1/models/{model_id:path}"), or the request path when it is one of `routes`; any other path is
    counted as "unmatched", so that clients probing URLs cannot grow the label set."""

    def __init__(self, app, metrics: Metrics, routes: set[str]):
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counting_send(message):
            if message["type"] == "http.response.start":
                route, path = scope.get("route"), scope.get("path", "")
                label = getattr(route, "path", None) or (path if path in self.routes else "unmatched")
                self.metrics.count_request(label, int(message["status"]))
            await send(message)

        return await self.app(scope, receive, counting_send)


class ApiKeyGuard:
    """401 unless `Authorization: Bearer <key>` (compared in constant time); `OPEN_PATHS` need no key."""

    def __init__(self, app, key: str, on_error: Callable[[str], None]):
        self.app, self.key, self.on_error = app, key.encode(), on_error

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") in OPEN_PATHS:
            return await self.app(scope, receive, send)
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)
        scheme, _, token = (header or b"").partition(b" ")
        if header is not None and scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key):
            return await self.app(scope, receive, send)
        why = "no API key: send the header Authorization: Bearer <key>" if header is None else "invalid API key"
        exc = APIError(401, f"{why} (this server requires one)", code="invalid_api_key")
        return await _refuse(exc, scope, receive, send, self.on_error, {"WWW-Authenticate": "Bearer"})


class BodyLimit:
    """413 for a body over `max_bytes` (bytes); otherwise the body, read here in full, is replayed to the app."""

    def __init__(self, app, max_bytes: int, on_error: Callable[[str], None]):
        self.app, self.max_bytes, self.on_error = app, max_bytes, on_error

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            return await self._too_large(f"has {declared} bytes", scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending its body: nobody to answer
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self._too_large(f"has more than {self.max_bytes} bytes", scope, receive, send)
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: the client's disconnect, when it comes
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)

    async def _too_large(self, has: str, scope, receive, send) -> None:
        exc = APIError(413, f"the request body {has}; this server accepts at most {self.max_bytes} bytes: send a "
                       "shorter prompt", code="request_too_large")  # fmt: skip
        await _refuse(exc, scope, receive, send, self.on_error, {"Connection": "close"})


def _content_length(scope) -> int | None:
    value = next((v for k, v in scope.get("headers", ()) if k == b"content-length"), None)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
