"""One request measured, per ../shared/measurement.md ("Per request").

Times come from `time.perf_counter_ns` (monotonic) and are read only once a token id has arrived on the host,
so the device has finished the work behind it:
- TTFT: request start (text in hand, before tokenization) -> first generated id on the host (ms);
- prefill: the prefill program alone, from its dispatch to the first id on the host (ms);
- decode time: first id on the host -> last id on the host (ms);
- gauge decode tok/s = (generated - 1) / decode time;
- end-to-end tok/s = generated / whole request (tokenization, prefill, decode, detokenization);
- TPOT = (end-to-end time - TTFT) / (generated - 1) (ms).
Generation runs to exactly max_new_tokens (EOS ignored), and every response gets a degeneracy verdict.
"""

from __future__ import annotations

import time

from bench.degeneracy import check_degenerate
from bench.errors import InputError
from bench.prompts import Prompt
from bench.records import Sample


def measure_request(engine, prompt: Prompt, max_new_tokens: int, *, kind: str, repeat: int) -> Sample:
    """Run and time one request of `prompt` (its text is tokenized inside the timed region and must give
    exactly `prompt.ids`). Returns the raw `Sample` (ms, tok/s). Raises InputError if the tokenizer no longer
    reproduces the prompt's exact ids (the input size would be wrong)."""
    from model.engine import CompileCounter

    tok = engine.tokenizer
    traces0 = CompileCounter.traces
    t_start = time.perf_counter_ns()
    ids = tok.chat_ids(prompt.text)
    if tuple(ids) != prompt.ids:
        raise InputError(f"prompt of {prompt.n_tokens} tokens tokenized to {len(ids)} ids inside the timed request")
    gen = engine.generate(ids, max_new_tokens)  # EOS ignored: exactly max_new_tokens
    tok.decode(gen.token_ids)
    t_end = time.perf_counter_ns()
    compile_events = CompileCounter.traces - traces0

    n = len(gen.token_ids)
    ttft_ms = (gen.t_token_ns[0] - t_start) / 1e6
    e2e_ms = (t_end - t_start) / 1e6
    decode_ms = (gen.t_token_ns[-1] - gen.t_token_ns[0]) / 1e6 if n > 1 else None
    verdict = check_degenerate(gen.token_ids)
    return Sample(
        input_tokens=len(ids),
        kind=kind,
        repeat=repeat,
        ttft_ms=ttft_ms,
        prefill_ms=gen.prefill_ms,
        decode_ms=decode_ms,
        e2e_ms=e2e_ms,
        gauge_tok_s=(n - 1) / (decode_ms / 1e3) if decode_ms else None,
        e2e_tok_s=n / (e2e_ms / 1e3),
        tpot_ms=(e2e_ms - ttft_ms) / (n - 1) if n > 1 else None,
        generated_tokens=n,
        compile_events=compile_events,
        degenerate=verdict.degenerate,
        degenerate_reason=verdict.reason,
        step_ms=gen.step_ms,
        token_ids=gen.token_ids,
    )
