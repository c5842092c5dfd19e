"""`bench serve`: the OpenAI-compatible server (bench/serve/app.py) on uvicorn, loading the model in the background."""

from __future__ import annotations

import logging

import typer

from bench.cli import app
from bench.cli.common import (
    BucketsOpt,
    CheckpointOpt,
    CompileCacheOpt,
    DtypeOpt,
    MaxLengthOpt,
    engine_manifest,
    open_engine,
    parse_buckets,
    setup_logging,
)
from bench.errors import InputError


def load_served_model(checkpoint: str | None, dtype: str | None, max_length: int | None,
                      compile_cache: str | None, buckets: str | None = None):  # fmt: skip
    """Load the engine as `bench sweep` does and gather what /health reports from the same manifest a sweep of it
    would record (`bench.cli.common.engine_manifest`, command "serve"): checkpoint id, source, content hash
    (computed while loading), weight bytes and load time, build id (code + checkpoint + engine configuration: a
    sweep's on the same payload), compile cache folder (relative to the cache root). No local path is published.
    Returns a LoadedModel."""
    from bench.runs.manifest import Workload
    from bench.serve import LoadedModel

    engine, report, _ckpt, cache_dir = open_engine(checkpoint, dtype, max_length, compile_cache, buckets=buckets)
    manifest = engine_manifest("serve", engine, report, checkpoint, cache_dir, Workload(notes={"server": "bench serve"}))
    ck = manifest.checkpoint
    return LoadedModel(
        engine=engine,
        checkpoint={"id": ck.id, "source": ck.source, "content_hash": ck.content_hash, "weight_bytes": ck.weight_bytes,
                    "load_s": ck.load_s},  # fmt: skip
        build_id=manifest.build_id,
        compile_cache={"dir": manifest.compile_cache.dir},
        quantization=manifest.engine.quantization,
    )


@app.command()
def serve(
    checkpoint: str | None = CheckpointOpt,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (loopback by default)."),
    port: int = typer.Option(8000, "--port", help="TCP port."),
    warmup_shapes: str = typer.Option(
        "", "--warmup-shapes",
        help="PROMPT_TOKENS:MAX_TOKENS pairs compiled before /health says ready, e.g. 41:64,521:64 (greedy).",
    ),  # fmt: skip
    model_name: str | None = typer.Option(None, "--model-name", help="Model id clients send; default: checkpoint id."),
    dtype: str | None = DtypeOpt,
    max_length: int | None = MaxLengthOpt,
    compile_cache: str | None = CompileCacheOpt,
    buckets: str | None = BucketsOpt,
) -> None:
    """Serve the engine over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models,
    /health, /metrics). The port opens at once; /health answers 503 until the model is loaded and warmed up."""
    import socket

    import uvicorn

    from bench.errors import BenchError
    from bench.serve import create_app, parse_warmup_shapes
    from model.errors import ModelError
    from model.policy import DTYPES

    shapes = parse_warmup_shapes(warmup_shapes)
    if not 0 < port < 65536:
        raise InputError(f"--port {port}: expected 1..65535")
    if dtype is not None and dtype not in DTYPES:
        raise InputError(f"--dtype {dtype}: unknown dtype; expected one of {', '.join(DTYPES)}")
    parse_buckets(buckets)  # a malformed ladder fails here, before the port opens
    if max_length is not None and max_length < 1:
        raise InputError(f"--max-length {max_length}: must be a positive number of tokens")
    if checkpoint is not None and not checkpoint.startswith("builtin:"):
        from model.checkpoint import resolve_checkpoint

        resolve_checkpoint(checkpoint)  # a bad path or repo id fails here, before the port opens
    try:  # the address must be bindable now: uvicorn would only say so after "startup complete"
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        raise InputError(f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc})") from None
    setup_logging()
    logging.getLogger("bench").info(f"serving on http://{host}:{port}/v1 (loading the model in the background)")
    failure: list[Exception] = []

    def stop_on_failure(exc: Exception) -> None:  # a server that can never be ready ends, saying why
        failure.append(exc)
        server.should_exit = True

    application = create_app(lambda: load_served_model(checkpoint, dtype, max_length, compile_cache, buckets),
                             model_name=model_name, warmup_shapes=shapes, on_load_failure=stop_on_failure)  # fmt: skip
    server = uvicorn.Server(uvicorn.Config(application, host=host, port=port, log_level="info", access_log=False))
    server.run()
    if failure:
        if isinstance(failure[0], (BenchError, ModelError)):
            raise failure[0]
        raise typer.Exit(1)
