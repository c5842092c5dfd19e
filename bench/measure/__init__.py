"""The measurement definitions shared by the sweep and the server (`docs/method.md`).

- `exact_prompt`, `Prompt`, `min_prompt_tokens`, `row_prompts`
                                                        (bench.measure.prompts: prompts of exactly N tokens; B
                                                        different ones for the rows of a batch)
- `check_degenerate`, `Verdict`                         (bench.measure.degeneracy: the loop check)
- `measure_request`, `measure_batch_request`, `Measured`, `request_times`
                                                        (bench.measure.request: one request, or one batch, timed)
- `aggregate_tok_s`, `arithmetic_intensity`, `knee`     (bench.measure.batches: a batch cell's arithmetic)

A package of its own, apart from `bench.sweep`, so that the server can use these without importing the sweep.
"""

from bench.measure.degeneracy import Verdict, check_degenerate
from bench.measure.batches import aggregate_tok_s, arithmetic_intensity, knee
from bench.measure.prompts import Prompt, exact_prompt, min_prompt_tokens, row_prompts
from bench.measure.request import Measured, measure_batch_request, measure_request, request_times

__all__ = ["Verdict", "check_degenerate", "Prompt", "exact_prompt", "min_prompt_tokens", "row_prompts", "Measured",
           "measure_request", "measure_batch_request", "request_times", "aggregate_tok_s", "arithmetic_intensity",
           "knee"]  # fmt: skip
