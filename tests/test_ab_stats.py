"""The statistics of `bench ab` and of the noise-aware `bench compare` (bench/ab/stats.py) on synthetic ratios:
deterministic for a seed, the interval's definition, the verdicts, the A/A noise. No engine, no processes."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from bench.ab.stats import (
    aa_noise_pct,
    ab_verdict,
    bootstrap_median_ci,
    median,
    pair_ratios,
    quantile,
    ratio_interval,
)

AA = [1.013, 0.987, 1.021, 0.992, 1.004, 0.979, 1.008, 0.995]
"""Eight ratios of an A/A session: scattered about 1 by +-2% (both signs), as two alike sides give."""
TEN = [1.094, 1.112, 1.087, 1.121, 1.101, 1.079, 1.105, 1.098]
"""Eight ratios of a 10% faster B with the same scatter."""


def test_quantile_is_numpys_linear_interpolation() -> None:
    values = sorted(random.Random(3).uniform(0, 10) for _ in range(37))
    for q in (0.0, 0.025, 0.3, 0.5, 0.975, 1.0):
        assert quantile(values, q) == pytest.approx(float(np.quantile(values, q)))
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([4.0, 1.0, 2.0, 3.0]) == 2.5
    with pytest.raises(ValueError, match="expected 0 <= q <= 1"):
        quantile([1.0], 1.5)


def test_the_bootstrap_is_deterministic_for_a_seed() -> None:
    first = bootstrap_median_ci(AA, resamples=2000, seed=7)
    assert bootstrap_median_ci(AA, resamples=2000, seed=7) == first
    lo, hi = first
    assert min(AA) <= lo < median(AA) < hi <= max(AA)  # resample medians lie within the ratios


def test_the_interval_is_the_percentile_of_resample_medians() -> None:
    """The definition, recomputed independently: resamples of the pairs by `random.Random(seed).randrange`,
    their medians, the 2.5% and 97.5% quantiles by numpy."""
    rng, n = random.Random(0), len(TEN)
    medians = [float(np.median([TEN[rng.randrange(n)] for _ in range(n)])) for _ in range(1000)]
    expected = np.quantile(medians, [0.025, 0.975])
    assert bootstrap_median_ci(TEN, resamples=1000, seed=0) == (pytest.approx(expected[0]), pytest.approx(expected[1]))


def test_an_aa_session_is_not_resolved_and_a_ten_percent_change_is() -> None:
    aa = ab_verdict(AA)
    assert aa.resolved is None and aa.lo < 1 < aa.hi
    assert aa.text.startswith("not resolved at this noise: B against A ")
    ten = ab_verdict(TEN)
    assert ten.resolved == "faster" and ten.lo > 1.05
    assert ten.text == f"B is {100 * (median(TEN) - 1):.1f}% faster than A ({ten.interval_text})"
    assert ten.interval_text.startswith("95% CI +")
    slow = ab_verdict([1 / r for r in TEN])
    assert slow.resolved == "slower" and slow.text.startswith("B is 9.") and " slower than A (95% CI -" in slow.text
    record = ten.to_json()
    assert record["resamples"] == 10_000 and record["seed"] == 0 and record["confidence"] == 0.95
    assert record["text"] == ten.text


def test_the_floor_keeps_a_tiny_change_from_being_claimed() -> None:
    tiny = [1.004, 1.006, 1.005, 1.003, 1.007, 1.005]  # 0.5% faster, every pair: the interval excludes no change
    assert ab_verdict(tiny, min_effect_pct=0).resolved == "faster"
    held = ab_verdict(tiny)  # the default floor, 1%
    assert held.resolved is None and "beyond +-1%" in held.text


def test_the_verdicts_false_resolutions_on_simulated_aa_sessions_are_rare() -> None:
    """Simulated A/A sessions of 8 pairs (log-normal noise of 3% per measurement, seeded): how often the default
    verdict claims a change, which a 95% interval does in about 5% of sessions and the 1% floor in fewer. A
    bound, not a measured speed: the simulation is seeded, so this either always holds or never does."""
    rng = np.random.default_rng(11)
    sessions = 200
    claimed = sum(ab_verdict(list(np.exp(rng.normal(0, 0.03, 8) - rng.normal(0, 0.03, 8))), resamples=1000).resolved
                  is not None for _ in range(sessions))  # fmt: skip
    assert claimed / sessions <= 0.08


def test_ratio_interval_of_two_sets_of_repeats() -> None:
    base, cand = [20.0, 20.2, 19.8], [18.0, 18.18, 17.82]
    lo, hi = ratio_interval(base, cand)
    assert lo == pytest.approx(17.82 / 20.2) and hi == pytest.approx(18.18 / 19.8)  # 3 repeats: the extremes
    assert ratio_interval(base, cand) == (lo, hi)  # seeded
    with pytest.raises(ValueError, match="1 baseline value"):
        ratio_interval([20.0], cand)


def test_aa_noise_is_the_95_percent_band_of_one_pair() -> None:
    ratios = [math.exp(x) for x in (0.02, -0.02, 0.02, -0.02)]  # |ln r| = 0.02 each: rms 0.02
    assert aa_noise_pct(ratios) == pytest.approx(100 * (math.exp(1.959964 * 0.02) - 1), rel=1e-6)
    with pytest.raises(ValueError, match="expected at least 2"):
        aa_noise_pct([1.0])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: pair_ratios([1.0, 2.0], [1.0]), "one of each per pair"),
        (lambda: pair_ratios([0.0], [1.0]), "not a positive rate"),
        (lambda: bootstrap_median_ci([1.1]), "expected at least 2"),
        (lambda: bootstrap_median_ci(AA, confidence=1.0), "expected 0.5 <= confidence < 1"),
        (lambda: bootstrap_median_ci(AA, resamples=10), "expected a whole number >= 100"),
        (lambda: ab_verdict(AA, min_effect_pct=-1), "expected a percentage >= 0"),
    ],
)
def test_bad_inputs_raise_value_error(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
