"""`bench serve` as a library: its options checked before the port opens (`check_options`), the model loaded as a
sweep loads it (`load_served_model`), and the server run (`serve_engine`). bench/cli/serve_cmds.py parses the
flags and prints; see docs/commands/serve.md.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from bench.errors import InputError


def check_options(checkpoint: str | None, port: int, max_body_bytes: int, max_batch: int = 1, max_queue: int = 0,
                  request_deadline: float | None = None) -> None:  # fmt: skip
    """Refuse bad `bench serve` options before the port opens (the engine's are checked when its configuration is
    built: `model.engine_config.EngineConfig.from_options`; the API key's by the CLI). Raises InputError, the
    checkpoint's error, or EngineError for an engine switch (GEMMA4_BENCH_XLA_CPU_OPTIONS, GEMMA4_BENCH_CPU_AMX, GEMMA4_BENCH_CPU_ATTENTION)
    that is neither on nor off."""
    if not 0 < port < 65536:
        raise InputError(f"--port {port}: expected 1..65535")
    if max_batch < 1:
        raise InputError(f"--max-batch {max_batch}: expected a number of decode slots >= 1")
    if max_queue < 0:
        raise InputError(f"--max-queue {max_queue}: expected a number of waiting requests >= 0 (0: no waiting)")
    if request_deadline is not None and not (math.isfinite(request_deadline) and request_deadline > 0):
        raise InputError(f"--request-deadline {request_deadline}: expected seconds > 0, or leave it out (no deadline)")
    if max_body_bytes < 1:
        raise InputError(f"--max-body-bytes {max_body_bytes}: must be a positive number of bytes")
    _check_checkpoint(checkpoint)
    from model.engine import check_engine_switches

    check_engine_switches()  # a typo in an engine switch fails here, not after the port has opened


def _check_checkpoint(checkpoint: str | None) -> None:
    """The checkpoint's own error (one line) for an unknown random preset, a bad path or repo id."""
    if checkpoint is not None and checkpoint.startswith("random:"):
        from bench.engines import parse_random_flag

        parse_random_flag(checkpoint)  # an unknown preset fails here, before the port opens
    elif checkpoint is not None and not checkpoint.startswith("builtin:"):
        from model.checkpoint import resolve_checkpoint

        resolve_checkpoint(checkpoint)  # a bad path or repo id fails here, before the port opens


def check_listen(host: str, port: int) -> None:
    """InputError unless `host`:`port` can be bound now (uvicorn would only say so after "startup complete")."""
    import socket

    try:
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        raise InputError(f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc})") from None


def load_served_model(checkpoint: str | None, config, compile_cache: str | None):
    """Load the engine as `bench sweep` does (`config`: the `model.engine_config.EngineConfig`) and gather what
    /health reports from the same manifest a sweep of it would record (`bench.engines.engine_manifest`, command
    "serve"): checkpoint id, source, content hash (computed while loading), weight bytes (packed, as placed:
    `--quant` counts) and load time, build id (code + checkpoint + engine configuration: a sweep's on the same
    payload), quantization and scale dtype, the kernels the manifest names (e.g. "bf16=cpu"), compile cache folder
    (relative to the cache root). No local path is published. Returns a `bench.serve.LoadedModel`."""
    from bench.engines import engine_manifest, open_engine
    from bench.runs.manifest import Workload
    from bench.serve import LoadedModel

    engine, report, _ckpt, cache_dir = open_engine(checkpoint, config, compile_cache)
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


def serve_engine(load: Callable[[], Any], *, host: str, port: int, app_options: dict[str, Any]) -> Exception | None:
    """Run the server on `host`:`port` until it is stopped, the model loading in the background (`load` returns
    the `LoadedModel`); `app_options` are `bench.serve.create_app`'s keywords. The first SIGTERM / Ctrl-C shuts down
    gracefully, a second forces the quit (exit 130, bench/serve/server.py). Returns the exception that kept the
    model from loading (the server then ends), None otherwise."""
    import uvicorn

    from bench.serve import create_app, default_slots
    from bench.serve.server import make_server

    log = logging.getLogger("bench")
    log.info(f"serving on http://{host}:{port}/v1 (loading the model in the background)")
    failure: list[Exception] = []

    def stop_on_failure(exc: Exception) -> None:  # a server that can never be ready ends, saying why
        failure.append(exc)
        server.should_exit = True

    application = create_app(load, on_load_failure=stop_on_failure, slots_factory=default_slots, **app_options)
    server = make_server(uvicorn.Config(application, host=host, port=port, log_level="info", access_log=False))
    server.run()
    return failure[0] if failure else None
