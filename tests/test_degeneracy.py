"""The degeneracy check: loops of one id and of short n-grams are caught, healthy output is not."""

from __future__ import annotations

import json
import random

import pytest

from bench.measure.degeneracy import LOOP_COVERAGE, MIN_TOKENS, check_degenerate

HEALTHY_OPENING = [812, 33, 4096, 77, 1290, 5]


def varied(n: int, seed: int = 0, vocab: int = 8000) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(n)]


def test_one_token_repeated_is_degenerate() -> None:
    the = 651  # "The The The ..."
    verdict = check_degenerate([the] * 64)
    assert verdict.degenerate
    assert "token id 651" in verdict.reason and "64 of 64" in verdict.reason
    assert verdict.details["top_share"] == 1.0


def test_one_token_after_a_sensible_opening_is_degenerate() -> None:
    verdict = check_degenerate(HEALTHY_OPENING + [651] * 58)
    assert verdict.degenerate
    assert verdict.details["best_period"] == 1
    assert verdict.details["loop_start"] == len(HEALTHY_OPENING)


@pytest.mark.parametrize("gram", [[10, 20], [7, 8, 9], [4, 5, 6, 7]])
def test_short_ngram_loops_are_degenerate(gram: list[int]) -> None:
    ids = HEALTHY_OPENING + gram * (60 // len(gram))
    verdict = check_degenerate(ids)
    assert verdict.degenerate, verdict
    assert verdict.details["best_period"] == len(gram)
    assert f"{len(gram)}-token loop" in verdict.reason
    assert verdict.details["best_coverage"] >= LOOP_COVERAGE


@pytest.mark.parametrize("seed", range(5))
def test_varied_sequences_are_healthy(seed: int) -> None:
    verdict = check_degenerate(varied(64, seed))
    assert not verdict.degenerate
    assert verdict.reason is None
    assert verdict.details["best_coverage"] < 0.2


def test_text_like_output_with_common_words_and_a_short_repeat_is_healthy() -> None:
    # "the" (id 5) every few tokens and one "very, very" (2 repeats, below the 3-repeat minimum) stay healthy.
    words = varied(60, seed=7)
    for i in range(0, 60, 6):
        words[i] = 5
    words[20:24] = [900, 11, 900, 11]
    verdict = check_degenerate(words)
    assert not verdict.degenerate
    assert verdict.details["top_share"] < 0.2


def test_a_loop_that_covers_less_than_half_is_not_flagged_and_more_than_half_is() -> None:
    n = 64
    short_loop = varied(n - 24, seed=3) + [10, 20] * 12  # 24 of 64 tokens loop: 37.5%
    long_loop = varied(n - 40, seed=3) + [10, 20] * 20  # 40 of 64 tokens loop: 62.5%
    assert not check_degenerate(short_loop).degenerate
    assert check_degenerate(long_loop).degenerate


def test_short_outputs_are_not_judged() -> None:
    verdict = check_degenerate([5] * (MIN_TOKENS - 1))
    assert not verdict.degenerate
    assert verdict.details["judged"] is False
    assert check_degenerate([5] * MIN_TOKENS).degenerate


def test_verdict_is_json_ready() -> None:
    verdict = check_degenerate([1, 2, 3] * 20)
    back = json.loads(json.dumps(verdict.to_dict()))
    assert back["degenerate"] is True and back["details"]["best_period"] == 3
