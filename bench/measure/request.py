"""One request measured, per docs/method.md ("Per request").

Times come from `time.perf_counter_ns` (monotonic) and are read only once a token id has arrived on the host,
so the device has finished the work behind it:
- TTFT: request start (text in hand, before tokenization) -> first generated id on the host (ms);
- prefill: the prefill program alone, from its dispatch to the first id on the host (ms);
- decode time: first id on the host -> last id on the host (ms);
- gauge decode tok/s = (generated - 1) / decode time;
- end-to-end tok/s = generated / whole request (tokenization, prefill, decode, detokenization);
- TPOT = (end-to-end time - TTFT) / (generated - 1) (ms).
Generation runs to exactly max_new_tokens (EOS ignored), and every response gets a degeneracy verdict.
The bucket and the compile events are the engine's own account of the request (`model.engine.Generation`), not
recomputed here.
"""

from __future__ import annotations

import dataclasses
import time

from bench.errors import InputError
from bench.measure.degeneracy import check_degenerate
from bench.measure.prompts import Prompt
from bench.runs.records import Sample


@dataclasses.dataclass(frozen=True, kw_only=True)
class Measured:
    """One measured request: its raw `Sample`, and the bucket it ran at (the padded prefill length in tokens, as
    the engine reports it; None where nothing reports it, e.g. a server other than this project's)."""

    sample: Sample
    bucket: int | None


def request_times(t_start_ns: int, t_tokens_ns: list[int], t_end_ns: int | None, n_generated: int) -> dict:
    """The per-request numbers of docs/method.md from host timestamps (perf_counter_ns): `ttft_ms` (start -> first
    token), `decode_ms` (first -> last token; None with one token), `e2e_ms` (start -> end; None without an end),
    `gauge_tok_s` = (n - 1) / decode time, `e2e_tok_s` = n / e2e time, `tpot_ms` = (e2e - TTFT) / (n - 1), and
    `step_ms` (gaps between token arrivals). `t_tokens_ns` holds one arrival per observed token (a server stream
    may group tokens: n_generated is the count the gauge and TPOT divide by). Raises ValueError without tokens."""
    if not t_tokens_ns:
        raise ValueError("request_times needs at least one token arrival")
    n = n_generated
    ttft_ms = (t_tokens_ns[0] - t_start_ns) / 1e6
    decode_ms = (t_tokens_ns[-1] - t_tokens_ns[0]) / 1e6 if len(t_tokens_ns) > 1 else None
    e2e_ms = (t_end_ns - t_start_ns) / 1e6 if t_end_ns is not None else None
    return {
        "ttft_ms": ttft_ms, "decode_ms": decode_ms, "e2e_ms": e2e_ms,
        "gauge_tok_s": (n - 1) / (decode_ms / 1e3) if decode_ms and n > 1 else None,
        "e2e_tok_s": n / (e2e_ms / 1e3) if e2e_ms else None,
        "tpot_ms": (e2e_ms - ttft_ms) / (n - 1) if e2e_ms is not None and n > 1 else None,
        "step_ms": [(b - a) / 1e6 for a, b in zip(t_tokens_ns, t_tokens_ns[1:])],
    }  # fmt: skip


def measure_request(engine, prompt: Prompt, max_new_tokens: int, *, kind: str, repeat: int,
                    decode_loop: str = "host", block: int | None = None) -> Measured:  # fmt: skip
    """Run and time one request of `prompt` (its text is tokenized inside the timed region and must give
    exactly `prompt.ids`) with the engine's `decode_loop` ("host" or "device", in blocks of `block` steps; None:
    one). Returns the raw `Sample` (ms, tok/s; compile events = the engine's jit traces during the request; for a
    model with experts the distinct experts each decode step read per layer, `Generation.experts_read`) and the
    bucket the engine ran. The device loop syncs once per block, so its sample has no per-step times
    (`step_ms` empty) and its blocks' times in `block_ms`; its decode time is still first token to last on the
    host. Raises InputError if the tokenizer no longer reproduces the prompt's exact ids (the input size would be
    wrong), the engine's EngineError for a loop it cannot run."""
    tok = engine.tokenizer
    t_start = time.perf_counter_ns()
    ids = tok.chat_ids(prompt.text)
    if tuple(ids) != prompt.ids:
        raise InputError(f"prompt of {prompt.n_tokens} tokens tokenized to {len(ids)} ids inside the timed request")
    gen = engine.generate(ids, max_new_tokens, decode_loop=decode_loop, block=block)  # EOS ignored: exactly that many
    tok.decode(gen.token_ids)
    t_end = time.perf_counter_ns()

    times = request_times(t_start, gen.t_token_ns, t_end, len(gen.token_ids))
    if decode_loop != "host":  # arrivals per block, not per step
        times["step_ms"], times["block_ms"] = [], times["step_ms"]
    verdict = check_degenerate(gen.token_ids)
    sample = Sample(
        input_tokens=len(ids),
        kind=kind,
        repeat=repeat,
        prefill_ms=gen.prefill_ms,
        generated_tokens=len(gen.token_ids),
        compile_events=gen.compile_traces,
        degenerate=verdict.degenerate,
        degenerate_reason=verdict.reason,
        token_ids=gen.token_ids,
        experts_read=gen.experts_read,
        **times,
    )
    return Measured(sample=sample, bucket=gen.bucket)


def measure_batch_request(engine, prompts, max_new_tokens: int, *, kind: str, repeat: int,
                          decode_loop: str = "host", block: int | None = None) -> Measured:  # fmt: skip
    """Run and time one batch request (docs/method.md, "Batches"): the B = len(prompts) prompts (`Prompt`s of one
    exact size, e.g. `bench.measure.prompts.row_prompts`) tokenized inside the timed region, decoded together by
    `engine.generate_batch` (exactly `max_new_tokens` per row, EOS ignored), every row detokenized. The times are
    the batch's, which every row shares (its rows run in lockstep): TTFT = request start -> the first tokens of all
    rows on the host (tokenization of every row and the batch prefill), the gauge = one row's (generated - 1) /
    decode time (the per-sequence gauge; the aggregate throughput is B x it), end-to-end and TPOT one row's.

    Returns the `Sample` (`batch` B, `row_token_ids` every row's ids, `token_ids` row 0's, `degenerate` True when any
    row fails the degeneracy check, its reason naming the rows) and the bucket the engine ran (the longest row's).
    Raises InputError when a prompt no longer tokenizes to its exact ids, the engine's EngineError as
    `generate_batch` (a batch that does not fit, a loop it cannot run)."""
    tok = engine.tokenizer
    t_start = time.perf_counter_ns()
    rows = [tok.chat_ids(p.text) for p in prompts]
    for p, ids in zip(prompts, rows, strict=True):
        if tuple(ids) != p.ids:
            raise InputError(f"prompt of {p.n_tokens} tokens tokenized to {len(ids)} ids inside the timed request")
    gen = engine.generate_batch(rows, max_new_tokens, decode_loop=decode_loop, block=block)  # EOS ignored
    for ids in gen.token_ids:
        tok.decode(ids)
    t_end = time.perf_counter_ns()

    times = request_times(t_start, gen.t_token_ns, t_end, len(gen.token_ids[0]))
    if decode_loop != "host":  # arrivals per block, not per step
        times["step_ms"], times["block_ms"] = [], times["step_ms"]
    verdicts = [check_degenerate(ids) for ids in gen.token_ids]
    bad = [(b, v) for b, v in enumerate(verdicts) if v.degenerate]
    sample = Sample(
        input_tokens=len(rows[0]),
        kind=kind,
        repeat=repeat,
        prefill_ms=gen.prefill_ms,
        generated_tokens=len(gen.token_ids[0]),
        compile_events=gen.compile_traces,
        degenerate=bool(bad),
        degenerate_reason="; ".join(f"row {b}: {v.reason}" for b, v in bad) or None,
        token_ids=gen.token_ids[0],
        batch=gen.batch,
        row_token_ids=[list(ids) for ids in gen.token_ids],
        experts_read=gen.experts_read,
        **times,
    )
    return Measured(sample=sample, bucket=gen.bucket)
