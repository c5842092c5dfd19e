"""Accuracy of a run against the dense run of its session, from what the run folders store (docs/method.md,
"Quantized weights"): the greedy tokens' first divergence and the next-token logit error, with ties told apart
from errors.

What the folders hold: `samples.jsonl` has the generated ids of every request (the first timed repeat is compared,
as `bench compare` does); `logits/<input tokens>.npy` (`bench.runs.logits`) has one float32 vector [V] per cell, the
prefill's next-token logits at the prompt's last position: the logits of the first generated token (step 0) only.
No run stores the logits of later decode steps.

**Ties.** Random weights give flat logits (E2B's are within ±0.56 on the TPU), so two tokens can be nearer than the
compute dtype can tell apart, and a different summation order picks the other: a tie, not an error. The rule
(`divergence_verdict`): at a divergence at step 0, let d be dense's token and q the other run's; the divergence is a
**tie** when dense's own logits put them at most one step of the compute dtype apart, logit[d] - logit[q] <=
`dtype_step(logit[d], dtype)` (the spacing of representable values at logit[d]: 2^(floor(log2 |x|) - m), m the
dtype's explicit mantissa bits, `MANTISSA_BITS`; bfloat16's 7 bits give 2^-8 = 0.0039 at 0.5), else an **error**
(and undecided where dense's stored logits rank q above d by more than a step: not the logits it chose from).
A divergence at step k > 0 is **undecided**: dense's logits at that step are not stored. Shares of equal tokens after
a divergence count agreement by chance, so none is shown.

Standard library only (no jax, no numpy).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from bench.report.compare import first_divergence, logit_error
from bench.runs.logits import read_logits

MANTISSA_BITS = {"bfloat16": 7, "float16": 10, "float32": 23}
"""Explicit mantissa bits per compute dtype (IEEE 754 binary16/binary32; bfloat16: Google's 16-bit brain float,
the top half of a float32). The spacing of values near x is 2^(exponent of x - bits)."""


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
    "undecided" (a divergence after step 0) or "unknown" (no samples to compare); `max_abs_logit`: max_v
    |logit_v - dense logit_v| over the cell's next-token logits (logit units; None without logits in both); `vocab`:
    V; `detail`: the numbers behind the verdict, one sentence."""

    input_tokens: int
    compared: int
    divergence: int | None
    verdict: str
    max_abs_logit: float | None
    vocab: int | None
    detail: str

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
                       dtype: str | None) -> tuple[str, str]:  # fmt: skip
    """(verdict, detail) of a divergence at `step` (the module docstring's rule): "tie" or "error" at step 0 when
    dense's logits are stored (and hold both tokens), else "undecided"."""
    if step > 0:
        return "undecided", (f"diverges at step {step} ({other_token} vs dense {dense_token}): dense's logits at that "
                             "step are not stored (only step 0's), so a tie cannot be told from an error")  # fmt: skip
    if dense_logits is None or max(dense_token, other_token) >= len(dense_logits):
        return "undecided", "diverges at step 0; dense's logits are not stored"
    top, other = dense_logits[dense_token], dense_logits[other_token]
    gap, step_size = top - other, dtype_step(top, dtype)
    name = dtype or "bfloat16"
    if gap < -step_size:
        return "undecided", (f"diverges at step 0 ({other_token} vs dense {dense_token}), but dense's stored logits "
                             f"rank {other_token} above its own token by {-gap:.4g}: they are not the logits its "
                             "greedy step chose from")  # fmt: skip
    verdict = "tie" if gap <= step_size else "error"
    relation = "<=" if verdict == "tie" else ">"
    return verdict, (f"diverges at step 0 ({other_token} vs dense {dense_token}); in dense's logits the gap between "
                     f"them is {gap:.4g} {relation} one {name} step at {top:.4g} ({step_size:.4g}): "
                     + ("a tie" if verdict == "tie" else "an error, not a tie"))  # fmt: skip


def run_accuracy(view: Any, dense: Any, dtype: str | None) -> dict[int, Accuracy]:
    """Per input size of `view`'s cells (a `bench.report.tables.RunView`), its `Accuracy` against `dense` (the
    dense run of the same session). `dtype`: the compute dtype the logits were computed in (the dense run's).
    Raises RunFolderError when a logits file cannot be read."""
    ids, dense_ids = first_timed_ids(view.samples), first_timed_ids(dense.samples)
    logits, dense_logits = read_logits(view.run.path), read_logits(dense.run.path)
    out = {}
    for n in sorted(view.cells):
        a, b = dense_ids.get(n), ids.get(n)
        la, lb = dense_logits.get(n), logits.get(n)
        worst = logit_error(la, lb)[0] if la is not None and lb is not None and len(la) == len(lb) else None
        vocab = len(la) if worst is not None else None
        if not a or not b:
            out[n] = Accuracy(input_tokens=n, compared=0, divergence=None, verdict="unknown", max_abs_logit=worst,
                              vocab=vocab, detail="no generated ids recorded in " + ("dense" if not a else "this run"))
            continue
        div = first_divergence(a, b)
        compared = min(len(a), len(b))
        if div is None:
            verdict, detail = "identical", f"the first {compared} greedy tokens equal dense's"
        else:
            verdict, detail = divergence_verdict(div, a[div], b[div], la, dtype)
        out[n] = Accuracy(input_tokens=n, compared=compared, divergence=div, verdict=verdict, max_abs_logit=worst,
                          vocab=vocab, detail=detail)  # fmt: skip
    return out
