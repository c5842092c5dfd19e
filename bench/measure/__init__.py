"""The measurement definitions shared by the sweep and the server (`../shared/measurement.md`).

- `exact_prompt`, `Prompt`, `min_prompt_tokens`         (bench.measure.prompts: prompts of exactly N tokens)
- `check_degenerate`, `Verdict`                         (bench.measure.degeneracy: the loop check)
- `measure_request`, `Measured`, `request_times`        (bench.measure.request: one request, timed)

A package of its own, apart from `bench.sweep`, so that the server can use these without importing the sweep.
"""

from bench.measure.degeneracy import Verdict, check_degenerate
from bench.measure.prompts import Prompt, exact_prompt, min_prompt_tokens
from bench.measure.request import Measured, measure_request, request_times

__all__ = ["Verdict", "check_degenerate", "Prompt", "exact_prompt", "min_prompt_tokens", "Measured",
           "measure_request", "request_times"]  # fmt: skip
