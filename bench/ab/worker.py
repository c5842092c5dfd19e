"""A worker of `bench ab`'s worker mode (docs/commands/ab.md, "Worker mode"): one long-lived process per side,
started once in the side's checkout, that loads its engine, then measures one request of the session's cell each
time the session asks, over pipes (`bench.ab.protocol`). The session alternates its two workers request by
request, so the two sides of a pair are measured seconds apart, each in its own warm process.

This is the one module of `bench.ab` that opens the engine (the session itself imports no jax): it is run by the
hidden command `bench ab-worker`, never imported by the session.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import IO, Any

from bench.ab.protocol import MEASURED_KEYS, PROTOCOL, decode, encode
from bench.errors import InputError


def _reply_channel() -> IO[bytes]:
    """The protocol's output: this process's original stdout (a duplicate of fd 1), after which fd 1 and
    `sys.stdout` point at stderr, so that nothing else (a library's print, XLA's own lines) can reach the pipe."""
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    sys.stdout.flush()
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def request_facts(sample: Any, max_new_tokens: int, seconds: float, cpu_s: float, started_at: str,
                  delay_ms: float | None) -> dict[str, Any]:  # fmt: skip
    """A "measured" reply (`MEASURED_KEYS`) of one request's `bench.runs.records.Sample`: the gauge and end-to-end
    rate (tok/s), the CPU rate (generated tokens / `cpu_s`, the CPU seconds of this process during the request,
    every thread: `time.process_time`), the median decode step (ms, None without steps), valid when it compiled
    nothing, generated exactly `max_new_tokens` tokens and passed the degeneracy check (docs/method.md, "Per
    cell"), else the reason; `seconds` its wall time."""
    reasons = []
    if sample.compile_events:
        reasons.append(f"compiled {sample.compile_events} program(s)")
    if sample.generated_tokens != max_new_tokens:
        reasons.append(f"generated {sample.generated_tokens} of {max_new_tokens} tokens")
    if sample.degenerate is not False:
        reasons.append(f"degenerate ({sample.degenerate_reason or 'no verdict'})")
    facts = {"gauge_tok_s": sample.gauge_tok_s, "e2e_tok_s": sample.e2e_tok_s,
             "cpu_tok_s": sample.generated_tokens / cpu_s if cpu_s > 0 else None, "cpu_s": cpu_s,
             "step_ms": statistics.median(sample.step_ms) if sample.step_ms else None, "valid": not reasons,
             "invalid_reason": "; ".join(reasons) or None, "compile_events": sample.compile_events,
             "generated_tokens": sample.generated_tokens, "seconds": seconds, "started_at": started_at,
             "delay_ms": delay_ms, "step_times_ms": list(sample.step_ms)}  # fmt: skip
    return {k: facts[k] for k in MEASURED_KEYS}


def serve(engine: Any, prompt: Any, manifest: dict[str, Any], *, max_new_tokens: int, allow_delay: bool,
          requests: IO[bytes], replies: IO[bytes], load_s: float) -> int:  # fmt: skip
    """Say "ready" on `replies`, then answer each request line of `requests` (`bench.ab.protocol`) until "quit" or
    the end of `requests`; returns the exit code (0). A request it cannot serve gets an "error" reply and the
    worker goes on; an error of the engine inside a request ends the worker with it (its stderr says why)."""
    from bench.measure.request import measure_request
    from bench.runs import now_iso

    def send(message: dict[str, Any]) -> None:
        replies.write(encode(message))
        replies.flush()

    send({"event": "ready", "protocol": PROTOCOL, "manifest": manifest, "load_s": load_s})
    for line in requests:
        try:
            msg = decode(line)
        except ValueError as exc:
            send({"event": "error", "message": str(exc)})
            continue
        op = msg.get("op")
        if op == "quit":
            return 0
        if op != "measure" or msg.get("kind") not in ("warmup", "timed"):
            send({"event": "error", "message": f"unknown request {msg!r}: expected op measure (kind warmup or "
                                               "timed) or quit"})  # fmt: skip
            continue
        delay_ms = msg.get("delay_ms")
        if delay_ms is not None and (not allow_delay or not 0 < float(delay_ms) <= 1000):
            send({"event": "error", "message": f"delay_ms {delay_ms!r}: a test-only wait needs a worker started "
                                               "with --allow-test-delay and 0 < ms <= 1000"})  # fmt: skip
            continue
        # test only: the engine's own switch for the wait per decode step (`model.switches.TEST_DELAY_ENV`), set
        # per request here; None: no wait, and no waiting program in the step's path
        engine.test_decode_delay_s = float(delay_ms) / 1e3 if delay_ms is not None else None
        started, t0, c0 = now_iso(), time.perf_counter(), time.process_time()
        m = measure_request(engine, prompt, max_new_tokens, kind=msg["kind"], repeat=int(msg.get("index") or 0),
                            decode_loop="host")  # fmt: skip
        send({"event": "measured", **request_facts(m.sample, max_new_tokens, time.perf_counter() - t0,
                                                   time.process_time() - c0, started, delay_ms)})  # fmt: skip
    return 0


def run_worker(checkpoint: str | None, config: Any, compile_cache: str | None, *, input_tokens: int,
               max_new_tokens: int, allow_delay: bool) -> int:  # fmt: skip
    """The body of `bench ab-worker`: take the protocol's stdout away from everything else, check the cell
    against the model's limits (config.json alone), load the engine under `config` (a
    `model.engine_config.EngineConfig`), build the cell's exact prompt, then `serve` stdin. Returns the exit
    code. InputError (one line, before "ready") for a cell the model cannot take or a checkpoint without a
    tokenizer; the engine's errors as `bench sweep` raises them."""
    from bench.engines import check_prompt_sizes, engine_manifest, open_engine
    from bench.runs.manifest import Workload
    from bench.sweep.local import sized_prompt

    replies = _reply_channel()
    check_prompt_sizes(checkpoint, (input_tokens,), max_new_tokens, config)
    t0 = time.perf_counter()
    engine, report, _path, cache_dir = open_engine(checkpoint, config, compile_cache)
    if engine.tokenizer is None:
        raise InputError("the checkpoint has no tokenizer.json: benchmark prompts are natural text sized with it; "
                         "pass a --checkpoint that has one")  # fmt: skip
    engine.check_request(input_tokens, max_new_tokens)
    prompt = sized_prompt(engine.tokenizer, input_tokens)
    workload = Workload(inputs=(input_tokens,), max_new_tokens=max_new_tokens, repeats=None, sampling="greedy",
                        eos="ignored while benchmarking", notes={"decode_loop": "host", "ab_worker": True})  # fmt: skip
    manifest = engine_manifest("sweep", engine, report, checkpoint, cache_dir, workload).to_dict()
    return serve(engine, prompt, manifest, max_new_tokens=max_new_tokens, allow_delay=allow_delay,
                 requests=sys.stdin.buffer, replies=replies, load_s=time.perf_counter() - t0)  # fmt: skip
