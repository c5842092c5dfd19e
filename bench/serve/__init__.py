"""`bench serve`: the engine behind an OpenAI-compatible HTTP API (FastAPI), with Prometheus metrics.

Never imports the sweep (an import contract): server and remote sweep share only the request schema and the
measurement definitions (`bench.measure`).
- `create_app`, `LoadedModel`, `parse_warmup_shapes`   (bench.serve.app: routes and error handlers)
- `DEFAULT_MAX_BODY_BYTES`, the API key, body limit     (bench.serve.guard: middleware that refuses before parsing)
- the one-request-at-a-time worker, cancellation       (bench.serve.worker)
- one request's answer, disconnects                    (bench.serve.answer)
- request schema and validation                        (bench.serve.schema)
- `Metrics`                                            (bench.serve.metrics)
- `TextAssembler`, `StopMatcher`                       (bench.serve.text: detokenization and stop strings)
"""

from bench.serve.app import LoadedModel, create_app, parse_warmup_shapes
from bench.serve.guard import DEFAULT_MAX_BODY_BYTES
from bench.serve.metrics import Metrics
from bench.serve.text import StopMatcher, TextAssembler

__all__ = ["DEFAULT_MAX_BODY_BYTES", "LoadedModel", "create_app", "parse_warmup_shapes", "Metrics", "StopMatcher",
           "TextAssembler"]  # fmt: skip
