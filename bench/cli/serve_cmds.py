"""`bench serve`: the OpenAI-compatible server (bench/serve/app.py) on uvicorn, loading the model in the background.
The checks, the load and the server's run are bench/serve/command.py; this module parses the flags and prints."""

from __future__ import annotations

import logging
import os

import typer

from bench.cli.root import app
from bench.cli.common import API_KEY_ENV, CheckpointOpt, CompileCacheOpt, setup_logging
from bench.cli.engine_options import EngineFlags, engine_options
from bench.errors import InputError


def _is_loopback(host: str) -> bool:
    """Whether `host` (an address or "localhost") only accepts connections from this machine."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def _check_options(checkpoint: str | None, port: int, max_body_bytes: int, api_key: str | None, max_batch: int = 1,
                   max_queue: int = 0, request_deadline: float | None = None) -> None:  # fmt: skip
    """Refuse bad `bench serve` options before the port opens: the API key (the flag or `API_KEY_ENV`) here, the
    rest in `bench.serve.command.check_options`. Raises InputError, the checkpoint's error, or EngineError for an
    engine switch that is neither on nor off."""
    from bench.serve.command import check_options

    if api_key is None and os.environ.get(API_KEY_ENV) is not None:  # typer reads a set-but-empty variable as None
        api_key = os.environ[API_KEY_ENV]
    if api_key is not None and not api_key.strip():
        raise InputError(f"--api-key (or ${API_KEY_ENV}) is empty: give a key, or leave it unset for no key")
    if api_key is not None and api_key != api_key.strip():
        raise InputError(f"--api-key (or ${API_KEY_ENV}) starts or ends with white space: no client could present it "
                         "(the presented token is stripped); give the key without it")
    check_options(checkpoint, port, max_body_bytes, max_batch, max_queue, request_deadline)


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """The one warning line for a server other machines can reach without a key (None: loopback, or a key set)."""
    if api_key or _is_loopback(host):
        return None
    return (f"--host {host} is reachable from other machines and no --api-key (or ${API_KEY_ENV}) is set: anyone who "
            "can reach it can use the model")


def load_served_model(checkpoint: str | None, config, compile_cache: str | None):
    """`bench.serve.command.load_served_model` (kept here for the callers that import it from the CLI)."""
    from bench.serve.command import load_served_model as load

    return load(checkpoint, config, compile_cache)


HostOpt = typer.Option("127.0.0.1", "--host", help="Address to listen on (loopback by default).")
PortOpt = typer.Option(8000, "--port", help="TCP port.")
WarmupShapesOpt = typer.Option(
    "", "--warmup-shapes",
    help="PROMPT_TOKENS:MAX_TOKENS pairs compiled before /health says ready, e.g. 41:64,521:64 (greedy).",
)  # fmt: skip
ModelNameOpt = typer.Option(None, "--model-name", help="Model id clients send; default: checkpoint id.")
ApiKeyOpt = typer.Option(
    None, "--api-key", envvar=API_KEY_ENV, show_envvar=True,
    help="Require 'Authorization: Bearer KEY' on every route but /health and /metrics (401 otherwise).",
)  # fmt: skip
MaxBodyBytesOpt = typer.Option(
    None, "--max-body-bytes", help="Largest request body accepted, in bytes (413 above it); default 1 MiB.",
)  # fmt: skip
MaxBatchOpt = typer.Option(
    8, "--max-batch", help="Decode slots: requests generating together (continuous batching: one batched "
    "decode step for all slots, each slot a KV cache of --max-length positions, checked against the device's "
    "memory at start-up). 1: one request at a time on the single-sequence engine.",
)  # fmt: skip
MaxQueueOpt = typer.Option(
    64, "--max-queue", help="Requests that may wait for a free slot; one more is answered 429 with Retry-After.",
)  # fmt: skip
RequestDeadlineOpt = typer.Option(
    None, "--request-deadline", help="Seconds a request may spend in the server: still waiting then, it is a "
    "503 (deadline_exceeded); still generating, it is stopped. Default: no deadline.",
)  # fmt: skip


@app.command()
@engine_options()
def serve(
    checkpoint: str | None = CheckpointOpt, host: str = HostOpt, port: int = PortOpt,
    warmup_shapes: str = WarmupShapesOpt, model_name: str | None = ModelNameOpt,
    engine_flags: EngineFlags = EngineFlags(), compile_cache: str | None = CompileCacheOpt,
    api_key: str | None = ApiKeyOpt, max_body_bytes: int | None = MaxBodyBytesOpt, max_batch: int = MaxBatchOpt,
    max_queue: int = MaxQueueOpt, request_deadline: float | None = RequestDeadlineOpt,
) -> None:
    """Serve the engine over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models,
    /v1/models/ID, /health, /metrics). The port opens at once; /health answers 503 until the model is loaded and
    warmed up."""
    from bench.errors import BenchError
    from bench.serve import DEFAULT_MAX_BODY_BYTES, parse_warmup_shapes
    from bench.serve.command import check_listen, serve_engine
    from bench.engines import check_backend_runs, check_mesh_here
    from model.errors import ModelError

    shapes = parse_warmup_shapes(warmup_shapes)
    max_body_bytes = DEFAULT_MAX_BODY_BYTES if max_body_bytes is None else max_body_bytes
    _check_options(checkpoint, port, max_body_bytes, api_key, max_batch, max_queue, request_deadline)
    config = engine_flags.config()  # a bad engine option fails here, before the port opens
    check_backend_runs(config)  # asked for where it cannot run: one line before the port opens
    check_mesh_here(checkpoint, config)  # a mesh this machine or the model cannot take: the same, before the port
    check_listen(host, port)
    setup_logging()
    if (warning := exposure_warning(host, api_key)) is not None:
        logging.getLogger("bench").warning(warning)
    failure = serve_engine(lambda: load_served_model(checkpoint, config, compile_cache), host=host, port=port,
                           app_options=dict(model_name=model_name, warmup_shapes=shapes, api_key=api_key,
                                            max_body_bytes=max_body_bytes, max_batch=max_batch, max_queue=max_queue,
                                            request_deadline_s=request_deadline))  # fmt: skip
    if failure is not None:  # reported here once (the app leaves it to on_load_failure's owner)
        if isinstance(failure, (BenchError, ModelError)):
            raise failure
        typer.echo(f"error: the model failed to load: {type(failure).__name__}: {failure}", err=True)
        raise typer.Exit(1)
