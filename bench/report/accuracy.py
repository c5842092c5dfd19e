"""Accuracy of a run against the dense run of its session, from what the run folders store (docs/method.md,
"Quantized weights"): the greedy tokens' first divergence and the logit error, with ties told apart from errors.

What the folders hold (`bench.runs.logits`): `samples.jsonl` has the generated ids of every request (the first
timed repeat is compared, as `bench compare` does); `logits/<input tokens>.npy` one float32 vector [V] per cell, the
prefill's next-token logits (step 0); `logits/<input tokens>.steps.npy` (runs since 2026-12-07) a per-step
summary: at each decode step t the token the run chose and the best other token, with their logits, teacher-forced
on the prompt and the run's own tokens before t.

**Bounds.** `LOGIT_ERROR_BOUNDS` are the CPU tests' stated ceilings of max |Δlogit| per option and preset
(tests/test_quant_accuracy.py, float32 activations, 1.5x the largest figure measured). A set's bound e is the sum
of its options' bounds (to first order their logit errors add), each the larger of the two presets'
(`set_bound`); dense's is 0.

**Ties.** Where both runs see the same context (every step up to the first divergence d), a set whose logits are
within e of dense's picks dense's token a wherever dense's margin to the other run's token b exceeds 2e: q picks b
only if z_q[b] >= z_q[a], so z[a] - z[b] <= (z_q[b] - z[b]) - (z_q[a] - z[a]) <= 2e. The rule
(`divergence_verdict`): with g = z[a] - z[b] in dense's logits at step d, the divergence is a **tie** when
g <= 2e + one step of the compute dtype at z[a] (`dtype_step`: the spacing of representable values,
2^(floor(log2 |x|) - m), m the dtype's explicit mantissa bits, `MANTISSA_BITS`; bfloat16's 7 bits give 2^-8 =
0.0039 at 0.5), else an **error**. g comes from the step-0 vector at d = 0, else from dense's per-step summary
(which holds b only when b is dense's runner-up there; when dense's margin to its runner-up already exceeds the
threshold, g does too: an error). **Undecided**: dense's logits at d are not stored, b is not dense's runner-up
while that margin is within the threshold, or the stored logits rank b above a by more than a dtype step (not the
logits its greedy step chose from). Shares of equal tokens after a divergence count agreement by chance, so none
is shown.

**Logit error over the agreeing steps** (`Accuracy.step_error`): with both runs' per-step summaries, the max over
steps 0..d (to the last compared step without a divergence) of |z_q[v] - z[v]| over every token v that both
summaries hold at that step (the chosen tokens, and a runner-up both name): the same contexts, so a difference of
logits is the set's error.

Standard library only (no jax, no numpy).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from bench.report.compare import first_divergence, logit_error
from bench.runs.logits import StepSummary, read_logits, read_step_summaries

MANTISSA_BITS = {"bfloat16": 7, "float16": 10, "float32": 23}
"""Explicit mantissa bits per compute dtype (IEEE 754 binary16/binary32; bfloat16: Google's 16-bit brain float,
the top half of a float32). The spacing of values near x is 2^(exponent of x - bits)."""


LOGIT_ERROR_BOUNDS = {
    "tiny": {"ple8": 0.0024, "ple4": 0.027, "int8_lm_head": 0.0029, "w8": 0.038, "w4": 0.41},
    "default": {"ple8": 0.0053, "ple4": 0.087, "int8_lm_head": 0.0057, "w8": 0.030, "w4": 0.44},
}
"""max |Δlogit| ceilings per preset and quantization option (logit units), asserted by tests/test_quant_accuracy.py
(`MAX_ERROR` there is this table): 1.5x the largest figure measured on CPU in float32 (tiny: its prompts of 20, 41
and 120 tokens; default: all 40 positions of a 40-token prompt). One fact, one place: the tests read it here."""


def set_bound(quant: str | None) -> float:
    """The logit-error bound e of a quantization set's canonical text ("w4:128,ple4", "none", None): the sum over
    its options of the larger preset bound of `LOGIT_ERROR_BOUNDS` (an option's group size, ":128", ignored);
    0 for dense and for options the table lacks."""
    worst = {opt: max(b[opt] for b in LOGIT_ERROR_BOUNDS.values()) for opt in LOGIT_ERROR_BOUNDS["default"]}
    parts = [p.strip().partition(":")[0] for p in (quant or "").split(",")]
    return sum(worst.get(p, 0.0) for p in parts)


def dtype_step(x: float, dtype: str | None) -> float:
    """The spacing of representable `dtype` values at |x| (a logit's resolution in that dtype): 2^(floor(log2 |x|)
    - MANTISSA_BITS[dtype]); bfloat16 when `dtype` is unknown or None. At x = 0, the spacing at 2^-126 (the smallest
    normal float32), as any two logits this near 0 are a tie in every dtype."""
    bits = MANTISSA_BITS.get(dtype or "bfloat16", MANTISSA_BITS["bfloat16"])
    exponent = math.frexp(abs(x))[1] - 1 if x else -126
    return 2.0 ** (exponent - bits)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Accuracy:
    """One cell of a run against the same cell of the dense run.

    `compared`: tokens compared (the shorter of the two first timed repeats; 0 without samples); `divergence`: the
    index of the first differing greedy token, None when they agree; `verdict`: "identical", "tie", "error",
    "undecided" or "unknown" (no samples to compare); `max_abs_logit`: max_v |logit_v - dense logit_v| over the
    cell's next-token logits (logit units; None without logits in both); `vocab`: V; `bound`: the set's
    logit-error bound e (`set_bound`); `step_error`: the max logit error over the agreeing steps (module
    docstring; None without both runs' per-step summaries) and `step_error_steps` the steps it covers; `detail`:
    the numbers behind the verdict, one sentence."""

    input_tokens: int
    compared: int
    divergence: int | None
    verdict: str
    max_abs_logit: float | None
    vocab: int | None
    detail: str
    bound: float = 0.0
    step_error: float | None = None
    step_error_steps: int = 0

    def divergence_text(self) -> str:
        """The table's text: "none (64 of 64)", "step 0: error", "step 3: undecided", or "—"."""
        if self.verdict == "unknown":
            return "—"
        if self.divergence is None:
            return f"none ({self.compared} of {self.compared})"
        return f"step {self.divergence}: {self.verdict}"


def first_timed_ids(samples: Sequence[Any]) -> dict[int, list[int]]:
    """Per input size, the generated ids of the first timed repeat of one sequence (kind "timed", else
    "timed-device"; B = 1)."""
    out: dict[int, list[int]] = {}
    for kind in ("timed-device", "timed"):  # the host loop's replaces the device loop's where both exist
        firsts: dict[int, list[int]] = {}
        for s in sorted(samples, key=lambda s: (s.input_tokens, s.repeat)):
            if s.kind == kind and (s.batch or 1) == 1 and s.token_ids and s.input_tokens not in firsts:
                firsts[s.input_tokens] = list(s.token_ids)
        out.update(firsts)
    return out


def divergence_verdict(step: int, dense_token: int, other_token: int, dense_logits: Sequence[float] | None,
                       dtype: str | None, *, bound: float = 0.0,
                       dense_steps: StepSummary | None = None) -> tuple[str, str]:  # fmt: skip
    """(verdict, detail) of a divergence at `step` (the module docstring's rule): "tie" or "error" when dense's
    logits at that step are stored (the step-0 vector `dense_logits` [V] at step 0, else the per-step summary
    `dense_steps`) and tell, else "undecided". `bound`: the set's logit-error bound e (logit units, >= 0)."""
    name = dtype or "bfloat16"
    pair = f"({other_token} vs dense {dense_token})"
    if step == 0 and dense_logits is not None and max(dense_token, other_token) < len(dense_logits):
        top, other, source = dense_logits[dense_token], dense_logits[other_token], "dense's logits"
    elif dense_steps is not None and step < len(dense_steps) and dense_steps.chosen[step] == dense_token:
        top, source = dense_steps.chosen_logit[step], f"dense's step-{step} logits"
        other = dense_steps.logit_of(step, other_token)
        if other is None:  # b is not dense's runner-up: z[b] <= the runner-up's, so the gap is at least the margin
            threshold = 2 * bound + dtype_step(top, dtype)
            margin = dense_steps.margin(step)
            if margin > threshold:
                return "error", (f"diverges at step {step} {pair}; in {source} even the runner-up "
                                 f"{dense_steps.runner_up[step]} is {margin:.4g} below dense's token, > 2 x the bound "
                                 f"{bound:.4g} + one {name} step ({threshold:.4g}): an error, not a tie")  # fmt: skip
            return "undecided", (f"diverges at step {step} {pair}; {other_token} is not dense's runner-up there "
                                 f"({dense_steps.runner_up[step]}, {margin:.4g} below), so its gap is not "
                                 "stored")  # fmt: skip
    else:
        where = "step 0's" if step == 0 else f"step {step}'s"
        return "undecided", (f"diverges at step {step} {pair}: dense's logits at that step are not stored (no "
                             f"{where} logits in its run folder), so a tie cannot be told from an error")  # fmt: skip
    gap, step_size = top - other, dtype_step(top, dtype)
    threshold = 2 * bound + step_size
    if gap < -step_size:
        return "undecided", (f"diverges at step {step} {pair}, but {source} rank {other_token} above its own token "
                             f"by {-gap:.4g}: they are not the logits its greedy step chose from")  # fmt: skip
    verdict = "tie" if gap <= threshold else "error"
    relation = "<=" if verdict == "tie" else ">"
    limit = (f"one {name} step at {top:.4g} ({step_size:.4g})" if not bound else
             f"2 x the bound {bound:.4g} + one {name} step at {top:.4g} ({threshold:.4g})")  # fmt: skip
    return verdict, (f"diverges at step {step} {pair}; in {source} the gap between them is {gap:.4g} {relation} "
                     f"{limit}: " + ("a tie" if verdict == "tie" else "an error, not a tie"))  # fmt: skip


def step_error(dense: StepSummary, other: StepSummary, steps: int) -> tuple[float | None, int]:
    """(max |z_other[v] - z_dense[v]| over steps 0..steps-1 and every token v both summaries hold at a step, the
    steps that had one) (module docstring); (None, 0) when no step has a token in both."""
    worst, covered = None, 0
    for t in range(min(steps, len(dense), len(other))):
        errors = [abs(other.logit_of(t, v) - z) for v, z in ((dense.chosen[t], dense.chosen_logit[t]),
                                                             (dense.runner_up[t], dense.runner_up_logit[t]))
                  if other.logit_of(t, v) is not None]  # fmt: skip
        if errors:
            covered += 1
            worst = max(errors) if worst is None else max(worst, *errors)
    return worst, covered


def run_accuracy(view: Any, dense: Any, dtype: str | None, *, quant: str | None = None) -> dict[int, Accuracy]:
    """Per input size of `view`'s cells (a `bench.report.tables.RunView`), its `Accuracy` against `dense` (the
    dense run of the same session). `dtype`: the compute dtype the logits were computed in (the dense run's);
    `quant`: the set's canonical text (its bound, `set_bound`). Raises RunFolderError when a logits file cannot
    be read."""
    ids, dense_ids = first_timed_ids(view.samples), first_timed_ids(dense.samples)
    logits, dense_logits = read_logits(view.run.path), read_logits(dense.run.path)
    steps, dense_steps = read_step_summaries(view.run.path), read_step_summaries(dense.run.path)
    bound = set_bound(quant)
    out = {}
    for n in sorted(view.cells):
        a, b = dense_ids.get(n), ids.get(n)
        la, lb = dense_logits.get(n), logits.get(n)
        sa, sb = dense_steps.get(n), steps.get(n)
        worst = logit_error(la, lb)[0] if la is not None and lb is not None and len(la) == len(lb) else None
        vocab = len(la) if worst is not None else None
        if not a or not b:
            out[n] = Accuracy(input_tokens=n, compared=0, divergence=None, verdict="unknown", max_abs_logit=worst,
                              vocab=vocab, detail="no generated ids recorded in " + ("dense" if not a else "this run"),
                              bound=bound)  # fmt: skip
            continue
        div = first_divergence(a, b)
        compared = min(len(a), len(b))
        if div is None:
            verdict, detail = "identical", f"the first {compared} greedy tokens equal dense's"
        else:
            verdict, detail = divergence_verdict(div, a[div], b[div], la, dtype, bound=bound, dense_steps=sa)
        agreeing = compared if div is None else div + 1
        err, covered = step_error(sa, sb, agreeing) if sa is not None and sb is not None else (None, 0)
        out[n] = Accuracy(input_tokens=n, compared=compared, divergence=div, verdict=verdict, max_abs_logit=worst,
                          vocab=vocab, detail=detail, bound=bound, step_error=err,
                          step_error_steps=covered)  # fmt: skip
    return out
