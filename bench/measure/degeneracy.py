"""Is a generated token stream a loop? The degeneracy check run on every response (sweep and server).

A broken KV cache (e.g. padding evicting a real position from the sliding ring) does not crash and does not
produce NaNs: it returns a clean success whose text is "The The The ...". Timing numbers cannot see that; this
check on the output can. See `docs/method.md` (Degeneracy).

Two rules, both on token ids only (no tokenizer needed), both "most of the output":

1. **One id dominates**: the most frequent id is at least `DOMINANT_SHARE` (50%) of the tokens, wherever they
   are. Natural text never gives one token half of a response; the commonest English word ("the") is ~5-7% of
   running text, and subword tokenizers spread it further.
2. **A short n-gram loop covers most of it**: for a period n in 1..`MAX_PERIOD` (4), a stretch where every token
   equals the one n places earlier, repeating its n-gram at least `MIN_REPEATS` (3) times back to back, is a
   loop stretch. When loop stretches of one period cover at least `LOOP_COVERAGE` (50%) of the tokens, the
   output is degenerate. Three back-to-back repeats of the same <= 4-token phrase almost never occur in healthy
   text (two do: "very, very"), and a collapsed decoder, once it loops, stays in the loop until the end, so
   the loop fills the rest of the output; half of it still leaves room for a sensible opening before the bug
   bites (a ring-cache bug typically shows only after the ring wraps).

Outputs shorter than `MIN_TOKENS` (8) are not judged (too short to tell a loop from a short answer): the
verdict is "not degenerate" with `details["judged"] = False`.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any

DOMINANT_SHARE = 0.5
LOOP_COVERAGE = 0.5
MAX_PERIOD = 4
MIN_REPEATS = 3
MIN_TOKENS = 8


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The outcome of `check_degenerate`.

    degenerate: True when the output collapsed into a loop.
    reason: one line saying which rule fired and its numbers (None when not degenerate).
    details: the measured numbers behind the verdict (JSON-serialisable): `tokens`, `judged`, `top_id`,
        `top_share`, `best_period`, `best_coverage`, `loop_start` (index where the longest loop stretch begins).
    """

    degenerate: bool
    reason: str | None
    details: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The verdict as a JSON-ready dict (what a run folder's samples store)."""
        return {"degenerate": self.degenerate, "reason": self.reason, "details": dict(self.details)}


def _loop_coverage(ids: Sequence[int], period: int) -> tuple[int, int | None, tuple[int, ...]]:
    """Tokens covered by stretches of at least MIN_REPEATS back-to-back copies of one `period`-gram.

    A run of consecutive matches ids[i] == ids[i - period] for s <= i <= e makes ids[s - period .. e] periodic:
    (e - s + 1 + period) / period copies of the gram ids[s - period : s]. Returns (covered token count, start of
    the longest such stretch or None, that stretch's gram).
    """
    n = len(ids)
    covered = [False] * n
    best_len, best_start = 0, None
    i = period
    while i < n:
        if ids[i] != ids[i - period]:
            i += 1
            continue
        s = i
        while i < n and ids[i] == ids[i - period]:
            i += 1
        start, length = s - period, i - s + period  # the periodic stretch is ids[start : start + length]
        if length >= MIN_REPEATS * period:
            covered[start : start + length] = [True] * length
            if length > best_len:
                best_len, best_start = length, start
    gram = tuple(ids[best_start : best_start + period]) if best_start is not None else ()
    return sum(covered), best_start, gram


def check_degenerate(token_ids: Sequence[int]) -> Verdict:
    """Judge one response's generated token ids (prompt excluded). Pure; never raises on any int sequence.

    Thresholds and their reasons are in the module docstring. Returns a `Verdict`.
    """
    ids = [int(t) for t in token_ids]
    n = len(ids)
    details: dict[str, Any] = {"tokens": n, "judged": n >= MIN_TOKENS}
    if n < MIN_TOKENS:
        return Verdict(False, None, details)

    top_id, top_count = collections.Counter(ids).most_common(1)[0]
    details["top_id"] = top_id
    details["top_share"] = round(top_count / n, 4)

    best: tuple[float, int, int | None, tuple[int, ...]] = (0.0, 0, None, ())
    for period in range(1, MAX_PERIOD + 1):
        covered, start, gram = _loop_coverage(ids, period)
        share = covered / n
        if share > best[0]:
            best = (share, period, start, gram)
    details["best_period"] = best[1] or None
    details["best_coverage"] = round(best[0], 4)
    details["loop_start"] = best[2]

    if top_count / n >= DOMINANT_SHARE:
        reason = f"token id {top_id} is {top_count} of {n} tokens ({top_count / n:.0%} >= {DOMINANT_SHARE:.0%})"
        return Verdict(True, reason, details)
    if best[0] >= LOOP_COVERAGE:
        gram = " ".join(str(t) for t in best[3])
        reason = (
            f"a {best[1]}-token loop [{gram}] repeats from token {best[2]} and loops cover {best[0]:.0%} "
            f"of {n} tokens (>= {LOOP_COVERAGE:.0%})"
        )
        return Verdict(True, reason, details)
    return Verdict(False, None, details)
