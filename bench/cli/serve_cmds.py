"""`bench serve`: the OpenAI-compatible server (bench/serve/app.py) on uvicorn, loading the model in the background."""

from __future__ import annotations

import logging
import os

import typer

from bench.cli import app
from bench.cli.common import (
    API_KEY_ENV,
    BackendOpt,
    BucketsOpt,
    CheckpointOpt,
    CompileCacheOpt,
    DtypeOpt,
    KernelOpt,
    MaxLengthOpt,
    QuantOpt,
    ScaleDtypeOpt,
    WeightDtypeOpt,
    check_backend_flag,
    check_dtype_flags,
    engine_manifest,
    open_engine,
    parse_buckets,
    parse_kernel_flag,
    parse_quant_flags,
    setup_logging,
)
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


def _check_options(checkpoint: str | None, port: int, dtype: str | None, max_length: int | None, buckets: str | None,
                   max_body_bytes: int, api_key: str | None, max_batch: int = 1, max_queue: int = 0,
                   request_deadline: float | None = None, weight_dtype: str | None = None) -> None:  # fmt: skip
    """Refuse bad `bench serve` options before the port opens. Raises InputError, the checkpoint's error, or
    EngineError for an engine switch (GEMMA4_BENCH_XLA_CPU_OPTIONS, GEMMA4_BENCH_CPU_AMX, GEMMA4_BENCH_CPU_ATTENTION)
    that is neither on nor off."""
    import math

    if not 0 < port < 65536:
        raise InputError(f"--port {port}: expected 1..65535")
    if max_batch < 1:
        raise InputError(f"--max-batch {max_batch}: expected a number of decode slots >= 1")
    if max_queue < 0:
        raise InputError(f"--max-queue {max_queue}: expected a number of waiting requests >= 0 (0: no waiting)")
    if request_deadline is not None and not (math.isfinite(request_deadline) and request_deadline > 0):
        raise InputError(f"--request-deadline {request_deadline}: expected seconds > 0, or leave it out (no deadline)")
    check_dtype_flags(dtype, weight_dtype)
    parse_buckets(buckets)  # a malformed ladder fails here, before the port opens
    if max_length is not None and max_length < 1:
        raise InputError(f"--max-length {max_length}: must be a positive number of tokens")
    if max_body_bytes < 1:
        raise InputError(f"--max-body-bytes {max_body_bytes}: must be a positive number of bytes")
    if api_key is None and os.environ.get(API_KEY_ENV) is not None:  # typer reads a set-but-empty variable as None
        api_key = os.environ[API_KEY_ENV]
    if api_key is not None and not api_key.strip():
        raise InputError(f"--api-key (or ${API_KEY_ENV}) is empty: give a key, or leave it unset for no key")
    if api_key is not None and api_key != api_key.strip():
        raise InputError(f"--api-key (or ${API_KEY_ENV}) starts or ends with white space: no client could present it "
                         "(the presented token is stripped); give the key without it")
    if checkpoint is not None and checkpoint.startswith("random:"):
        from bench.cli.common import parse_random_flag

        parse_random_flag(checkpoint)  # an unknown preset fails here, before the port opens
    elif checkpoint is not None and not checkpoint.startswith("builtin:"):
        from model.checkpoint import resolve_checkpoint

        resolve_checkpoint(checkpoint)  # a bad path or repo id fails here, before the port opens
    from model.engine import check_engine_switches

    check_engine_switches()  # a typo in an engine switch fails here, not after the port has opened


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """The one warning line for a server other machines can reach without a key (None: loopback, or a key set)."""
    if api_key or _is_loopback(host):
        return None
    return (f"--host {host} is reachable from other machines and no --api-key (or ${API_KEY_ENV}) is set: anyone who "
            "can reach it can use the model")


def load_served_model(checkpoint: str | None, dtype: str | None, max_length: int | None,
                      compile_cache: str | None, buckets: str | None = None, quant: str | None = None,
                      scale_dtype: str | None = None, kernel: str | None = None,
                      weight_dtype: str | None = None, backend: str | None = None):  # fmt: skip
    """Load the engine as `bench sweep` does and gather what /health reports from the same manifest a sweep of it
    would record (`bench.cli.common.engine_manifest`, command "serve"): checkpoint id, source, content hash
    (computed while loading), weight bytes (packed, as placed: `--quant` counts) and load time, build id (code +
    checkpoint + engine configuration, quantization and weight dtype included: a sweep's on the same payload),
    quantization and scale dtype, the kernels the manifest names (e.g. "bf16=cpu"), compile cache folder (relative
    to the cache root). No local path is published. `kernel`: the `--kernel` text (the w4 product; in the build
    id); `weight_dtype`: the `--weight-dtype` text (default: the compute dtype); `backend`: the `--backend` text
    (default: the pure-JAX engine).
    Returns a LoadedModel."""
    from bench.runs.manifest import Workload
    from bench.serve import LoadedModel

    engine, report, _ckpt, cache_dir = open_engine(checkpoint, dtype, max_length, compile_cache, buckets=buckets,
                                                   quant=quant, scale_dtype=scale_dtype, kernel=kernel,
                                                   weight_dtype=weight_dtype, backend=backend)  # fmt: skip
    manifest = engine_manifest("serve", engine, report, checkpoint, cache_dir, Workload(notes={"server": "bench serve"}))
    ck = manifest.checkpoint
    return LoadedModel(
        engine=engine,
        checkpoint={"id": ck.id, "source": ck.source, "content_hash": ck.content_hash, "weight_bytes": ck.weight_bytes,
                    "load_s": ck.load_s},  # fmt: skip
        build_id=manifest.build_id,
        compile_cache={"dir": manifest.compile_cache.dir},
        quantization=manifest.engine.quantization,
        scale_dtype=manifest.engine.scale_dtype,
        kernel=manifest.engine.kernel,
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
    weight_dtype: str | None = WeightDtypeOpt,
    max_length: int | None = MaxLengthOpt,
    compile_cache: str | None = CompileCacheOpt,
    buckets: str | None = BucketsOpt,
    quant: str | None = QuantOpt,
    scale_dtype: str | None = ScaleDtypeOpt,
    kernel: str | None = KernelOpt,
    backend: str | None = BackendOpt,
    api_key: str | None = typer.Option(
        None, "--api-key", envvar=API_KEY_ENV, show_envvar=True,
        help="Require 'Authorization: Bearer KEY' on every route but /health and /metrics (401 otherwise).",
    ),  # fmt: skip
    max_body_bytes: int | None = typer.Option(
        None, "--max-body-bytes", help="Largest request body accepted, in bytes (413 above it); default 1 MiB.",
    ),  # fmt: skip
    max_batch: int = typer.Option(
        8, "--max-batch", help="Decode slots: requests generating together (continuous batching: one batched "
        "decode step for all slots, each slot a KV cache of --max-length positions, checked against the device's "
        "memory at start-up). 1: one request at a time on the single-sequence engine.",
    ),  # fmt: skip
    max_queue: int = typer.Option(
        64, "--max-queue", help="Requests that may wait for a free slot; one more is answered 429 with Retry-After.",
    ),  # fmt: skip
    request_deadline: float | None = typer.Option(
        None, "--request-deadline", help="Seconds a request may spend in the server: still waiting then, it is a "
        "503 (deadline_exceeded); still generating, it is stopped. Default: no deadline.",
    ),  # fmt: skip
) -> None:
    """Serve the engine over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models,
    /v1/models/ID, /health, /metrics). The port opens at once; /health answers 503 until the model is loaded and
    warmed up."""
    import socket

    import uvicorn

    from bench.errors import BenchError
    from bench.serve import DEFAULT_MAX_BODY_BYTES, create_app, default_slots, parse_warmup_shapes
    from bench.serve.server import make_server
    from model.errors import ModelError

    shapes = parse_warmup_shapes(warmup_shapes)
    max_body_bytes = DEFAULT_MAX_BODY_BYTES if max_body_bytes is None else max_body_bytes
    _check_options(checkpoint, port, dtype, max_length, buckets, max_body_bytes, api_key, max_batch, max_queue,
                   request_deadline, weight_dtype)  # fmt: skip
    parse_quant_flags(quant, scale_dtype)  # a bad option set fails here, before the port opens
    parse_kernel_flag(kernel, quant)
    check_backend_flag(backend)  # asked for where it cannot run: one line before the port opens
    try:  # the address must be bindable now: uvicorn would only say so after "startup complete"
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        raise InputError(f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc})") from None
    setup_logging()
    if (warning := exposure_warning(host, api_key)) is not None:
        logging.getLogger("bench").warning(warning)
    logging.getLogger("bench").info(f"serving on http://{host}:{port}/v1 (loading the model in the background)")
    failure: list[Exception] = []

    def stop_on_failure(exc: Exception) -> None:  # a server that can never be ready ends, saying why
        failure.append(exc)
        server.should_exit = True

    application = create_app(lambda: load_served_model(checkpoint, dtype, max_length, compile_cache, buckets, quant,
                                                       scale_dtype, kernel, weight_dtype, backend),
                             model_name=model_name, warmup_shapes=shapes, on_load_failure=stop_on_failure,
                             api_key=api_key, max_body_bytes=max_body_bytes, max_batch=max_batch,
                             max_queue=max_queue, request_deadline_s=request_deadline,
                             slots_factory=default_slots)  # fmt: skip
    # the first SIGTERM / Ctrl-C shuts down gracefully, a second forces the quit (exit 130, bench/serve/server.py)
    server = make_server(uvicorn.Config(application, host=host, port=port, log_level="info", access_log=False))
    server.run()
    if failure:  # reported here once (the app leaves it to on_load_failure's owner)
        if isinstance(failure[0], (BenchError, ModelError)):
            raise failure[0]
        typer.echo(f"error: the model failed to load: {type(failure[0]).__name__}: {failure[0]}", err=True)
        raise typer.Exit(1)
