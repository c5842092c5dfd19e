"""The statistics of a paired A/B session and of a noise-aware comparison (docs/method.md, "A/B runs" and
"Comparisons"). Standard library only: `bench compare` and the report use it on archived runs.

- `pair_ratios`: one ratio per pair, B / A of a rate (tok/s: above 1, B is faster).
- `bootstrap_median_ci`: the percentile bootstrap interval of the median of the ratios, resampling whole pairs
  (`RESAMPLES` resamples from `random.Random(SEED)`, unless given): the interval `bench ab` quotes.
- `ab_verdict`: "B is x% faster (95% CI a..b)", "... slower ...", or "not resolved at this noise".
- `ratio_interval`: the interval of median(candidate) / median(baseline) of two independent sets of repeats
  (each resampled on its own), what `bench compare` puts around each cell's change.
- `aa_noise_pct`: the half-width (percent) of the 95% band of one pair's ratio when nothing changed, from the
  ratios of an A/A session: 1.96 x the root mean square of ln(ratio) (the centre of an A/A ratio is known to be 1).

Every interval is of a ratio (unitless); percentages are (ratio - 1) x 100. Raises ValueError for inputs out of
range (named in each function).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence

RESAMPLES = 10_000
"""Bootstrap resamples by default (a stated choice: the percentile bounds then move by well under 0.1% between
seeds on 8-pair sessions)."""
SEED = 0
"""The bootstrap's default seed (`random.Random(SEED)`): the same ratios always give the same interval."""
CONFIDENCE = 0.95
"""The interval's default coverage."""
MIN_EFFECT_PCT = 1.0
"""The smallest change `bench ab` claims by default (percent): a change is resolved only when its whole interval
lies beyond +-MIN_EFFECT_PCT (a stated choice, not a measured constant: one session on a shared host does not
support a claim of under 1%, and the floor keeps an A/A session whose interval only just misses 1 from reading as a
change: in simulated 8-pair A/A sessions with 3% noise per measurement it claims a change in 2% of them, against
11% without it; docs/method.md, "A/B runs"). `--min-effect 0` claims any interval that excludes no change."""
Z95 = 1.959963984540054
"""The two-sided 95% point of the standard normal distribution (`statistics.NormalDist().inv_cdf(0.975)`)."""


def median(values: Sequence[float]) -> float:
    """The median (the mean of the two middle values for an even count). ValueError when empty."""
    if not values:
        raise ValueError("median of no values")
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) of already sorted values by linear interpolation between order statistics
    (numpy's default, "linear"). ValueError when empty or q is outside [0, 1]."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q!r}: expected 0 <= q <= 1")
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _check(confidence: float, resamples: int) -> None:
    if not 0.5 <= confidence < 1.0:
        raise ValueError(f"confidence {confidence!r}: expected 0.5 <= confidence < 1 (e.g. 0.95)")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 100:
        raise ValueError(f"resamples {resamples!r}: expected a whole number >= 100")


def pair_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """b[i] / a[i] for each pair (rates such as tok/s: above 1, B is faster). ValueError for lists of different
    lengths or a value that is not a positive number."""
    if len(a) != len(b):
        raise ValueError(f"pair_ratios: {len(a)} A values and {len(b)} B values; expected one of each per pair")
    for v in (*a, *b):
        if not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
            raise ValueError(f"pair_ratios: {v!r} is not a positive rate")
    return [y / x for x, y in zip(a, b)]


def bootstrap_median_ci(ratios: Sequence[float], *, resamples: int = RESAMPLES, seed: int = SEED,
                        confidence: float = CONFIDENCE) -> tuple[float, float]:  # fmt: skip
    """(lo, hi): the percentile bootstrap interval of the median of `ratios`.

    Each of `resamples` resamples draws len(ratios) ratios with replacement (whole pairs: a pair's A and B stay
    together), indices from `random.Random(seed).randrange`; lo and hi are the (1 - confidence) / 2 and
    (1 + confidence) / 2 quantiles (`quantile`) of the resamples' medians. ValueError for fewer than 2 ratios, a
    confidence outside [0.5, 1) or fewer than 100 resamples."""
    _check(confidence, resamples)
    if len(ratios) < 2:
        raise ValueError(f"bootstrap of {len(ratios)} ratio(s): expected at least 2")
    rng = random.Random(seed)
    n = len(ratios)
    medians = sorted(median([ratios[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    tail = (1.0 - confidence) / 2
    return quantile(medians, tail), quantile(medians, 1.0 - tail)


def ratio_interval(baseline: Sequence[float], candidate: Sequence[float], *, resamples: int = 2_000,
                   seed: int = SEED, confidence: float = CONFIDENCE) -> tuple[float, float]:  # fmt: skip
    """(lo, hi): the percentile bootstrap interval of median(candidate) / median(baseline), two independent sets
    of repeats (rates), each resampled with replacement on its own (`random.Random(seed)`, candidate first, then
    baseline, per resample). ValueError when a side has fewer than 2 values or a value is not positive."""
    _check(confidence, resamples)
    for name, values in (("baseline", baseline), ("candidate", candidate)):
        if len(values) < 2:
            raise ValueError(f"ratio_interval: {len(values)} {name} value(s); expected at least 2")
        if not all(isinstance(v, (int, float)) and v > 0 and math.isfinite(v) for v in values):
            raise ValueError(f"ratio_interval: a {name} value is not a positive rate")
    rng = random.Random(seed)
    nb, nc = len(baseline), len(candidate)
    ratios = []
    for _ in range(resamples):
        c = median([candidate[rng.randrange(nc)] for _ in range(nc)])
        b = median([baseline[rng.randrange(nb)] for _ in range(nb)])
        ratios.append(c / b)
    ratios.sort()
    tail = (1.0 - confidence) / 2
    return quantile(ratios, tail), quantile(ratios, 1.0 - tail)


def aa_noise_pct(ratios: Sequence[float]) -> float:
    """The half-width, in percent, of the 95% band of a single pair's ratio when nothing changed, from the ratios
    of an A/A session: (exp(Z95 x sqrt(mean(ln(r)^2))) - 1) x 100. The root mean square is taken about 0, the
    known centre of an A/A ratio's log, not about the sample's mean. ValueError for fewer than 2 ratios or a ratio
    that is not positive."""
    if len(ratios) < 2:
        raise ValueError(f"aa_noise_pct of {len(ratios)} ratio(s): expected at least 2")
    if not all(r > 0 for r in ratios):
        raise ValueError("aa_noise_pct: ratios must be positive")
    rms = math.sqrt(sum(math.log(r) ** 2 for r in ratios) / len(ratios))
    return 100.0 * (math.exp(Z95 * rms) - 1.0)


def pct(ratio: float) -> float:
    """(ratio - 1) x 100: a ratio as a change in percent."""
    return 100.0 * (ratio - 1.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AbVerdict:
    """The outcome of a paired session: `pairs` ratios B / A, their `median`, the interval (`lo`, `hi`) at
    `confidence`, and `resolved`: "faster", "slower" or None (not resolved: the interval reaches within
    `min_effect_pct` of no change). `resamples` and `seed` are the bootstrap's."""

    pairs: int
    median: float
    lo: float
    hi: float
    confidence: float
    min_effect_pct: float
    resamples: int
    seed: int
    resolved: str | None

    @property
    def interval_text(self) -> str:
        """"95% CI +6.1%..+13.0%": the interval as changes of B's rate against A's."""
        return f"{100 * self.confidence:g}% CI {pct(self.lo):+.1f}%..{pct(self.hi):+.1f}%"

    @property
    def text(self) -> str:
        """The verdict line: "B is 9.8% faster than A (95% CI +6.1%..+13.0%)", "B is 9.1% slower than A (...)"
        or "not resolved at this noise: B against A +0.4% (95% CI -2.1%..+3.0%)" (with the floor when one is
        set)."""
        if self.resolved == "faster":
            return f"B is {pct(self.median):.1f}% faster than A ({self.interval_text})"
        if self.resolved == "slower":
            return f"B is {-pct(self.median):.1f}% slower than A ({self.interval_text})"
        floor = f"; a change is claimed when the whole interval lies beyond +-{self.min_effect_pct:g}%"
        return (f"not resolved at this noise: B against A {pct(self.median):+.1f}% ({self.interval_text})"
                + (floor if self.min_effect_pct > 0 else ""))  # fmt: skip

    def to_json(self) -> dict:
        """The verdict as the ab run's manifest records it (`ab.verdict`)."""
        return {**dataclasses.asdict(self), "text": self.text}


def ab_verdict(ratios: Sequence[float], *, confidence: float = CONFIDENCE, min_effect_pct: float = MIN_EFFECT_PCT,
               resamples: int = RESAMPLES, seed: int = SEED) -> AbVerdict:  # fmt: skip
    """The verdict of per-pair ratios B / A (docs/method.md, "A/B runs"): the median ratio and its
    `bootstrap_median_ci`; "faster" when lo > 1 + min_effect_pct / 100, "slower" when hi < 1 / (1 + min_effect_pct
    / 100), else not resolved. ValueError as `bootstrap_median_ci`, and for a negative `min_effect_pct`."""
    if not min_effect_pct >= 0:
        raise ValueError(f"min_effect_pct {min_effect_pct!r}: expected a percentage >= 0")
    lo, hi = bootstrap_median_ci(ratios, resamples=resamples, seed=seed, confidence=confidence)
    floor = 1.0 + min_effect_pct / 100.0
    resolved = "faster" if lo > floor else "slower" if hi < 1.0 / floor else None
    return AbVerdict(pairs=len(ratios), median=median(ratios), lo=lo, hi=hi, confidence=confidence,
                     min_effect_pct=min_effect_pct, resamples=resamples, seed=seed, resolved=resolved)  # fmt: skip
