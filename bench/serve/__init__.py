"""`bench serve`: the engine behind an OpenAI-compatible HTTP API (FastAPI), with Prometheus metrics.

Never imports the sweep (an import contract): server and remote sweep share only the request schema and the
measurement definitions (`bench.measure`).
- `create_app`, `LoadedModel`, `parse_warmup_shapes`   (bench.serve.app: routes and error handlers)
- `DEFAULT_MAX_BODY_BYTES`, the API key, body limit     (bench.serve.guard: middleware that refuses before parsing)
- the scheduler: bounded queue, decode slots, cancel  (bench.serve.scheduler)
- `SlotEngine`, `BatchedSlots`, `SequentialSlots`: the engine's slots (bench.serve.slots)
- one request's answer, disconnects                    (bench.serve.answer)
- request schema and validation                        (bench.serve.schema)
- `Metrics`                                            (bench.serve.metrics)
- `TextAssembler`, `StopMatcher`                       (bench.serve.text: detokenization and stop strings)
"""

from bench.serve.app import DEFAULT_MAX_BATCH, DEFAULT_MAX_QUEUE, LoadedModel, create_app, parse_warmup_shapes
from bench.serve.guard import DEFAULT_MAX_BODY_BYTES
from bench.serve.metrics import Metrics
from bench.serve.slots import BatchedSlots, SequentialSlots, SlotEngine, SlotResult, Token, default_slots
from bench.serve.text import StopMatcher, TextAssembler

__all__ = ["DEFAULT_MAX_BATCH", "DEFAULT_MAX_BODY_BYTES", "DEFAULT_MAX_QUEUE", "LoadedModel", "create_app",
           "parse_warmup_shapes", "Metrics", "BatchedSlots", "SequentialSlots", "default_slots", "SlotEngine",
           "SlotResult", "StopMatcher", "TextAssembler", "Token"]  # fmt: skip
