"""The gates that decide whether a figure is quotable, at their exact boundaries (no engine, no jax).

Each test here was written against a hand-made mutation that the rest of the suite let through (issue 42, part 4):
the cell's token-count gate written `<` instead of `!=` (a repeat that generated more tokens than asked passed), the
degeneracy check's repeat count 3 lowered to 2, and its coverage bound `>=` written `>`. Every one of those
mutations makes at least one test below fail.
"""

from __future__ import annotations

import dataclasses

import pytest
from runfolders import MAX_NEW, cell_samples

from bench.measure.degeneracy import LOOP_COVERAGE, MIN_REPEATS, check_degenerate
from bench.runs import summarize_cell
from bench.runs.records import LoadSample, summarize_level


# ---- a cell's timed repeats generate exactly the tokens asked ------------------------------------------------------
def _with_tokens(samples, repeat: int, n: int, kind: str = "timed"):
    """`samples` with timed repeat `repeat` (of `kind`) claiming `n` generated tokens."""
    return [dataclasses.replace(s, generated_tokens=n) if (s.kind, s.repeat) == (kind, repeat) else s for s in samples]


@pytest.mark.parametrize("extra", [1, 5])
def test_a_repeat_with_more_tokens_than_asked_makes_the_cell_invalid(extra):
    row = summarize_cell(_with_tokens(cell_samples(41), 1, MAX_NEW + extra), max_new_tokens=MAX_NEW)
    assert not row.valid
    assert f"repeat 1 generated {MAX_NEW + extra} tokens, expected {MAX_NEW}" in row.invalid_reason


def test_a_repeat_with_fewer_tokens_than_asked_makes_the_cell_invalid_and_exact_counts_pass():
    assert summarize_cell(cell_samples(41), max_new_tokens=MAX_NEW).valid
    row = summarize_cell(_with_tokens(cell_samples(41), 0, MAX_NEW - 1), max_new_tokens=MAX_NEW)
    assert not row.valid and f"generated {MAX_NEW - 1} tokens" in row.invalid_reason


def test_a_device_loop_repeat_with_more_tokens_than_asked_makes_the_cell_invalid():
    device = [dataclasses.replace(s, kind="timed-device") for s in cell_samples(41) if s.kind == "timed"]
    good = summarize_cell([*cell_samples(41), *device], max_new_tokens=MAX_NEW)
    assert good.valid and good.device_repeats == 3
    row = summarize_cell([*cell_samples(41), *_with_tokens(device, 2, MAX_NEW + 1, "timed-device")],
                         max_new_tokens=MAX_NEW)  # fmt: skip
    assert not row.valid and "device-loop repeat 2 generated" in row.invalid_reason


@pytest.mark.parametrize("row_len", [MAX_NEW + 1, MAX_NEW - 1])
def test_a_batch_row_with_another_token_count_makes_the_cell_invalid(row_len):
    def batched(samples, bad_len=None):
        out = []
        for s in samples:
            rows = [list(s.token_ids), list(s.token_ids)]
            if bad_len is not None and (s.kind, s.repeat) == ("timed", 1):
                rows[1] = (rows[1] * 2)[:bad_len]
            out.append(dataclasses.replace(s, batch=2, row_token_ids=rows))
        return out

    assert summarize_cell(batched(cell_samples(41)), max_new_tokens=MAX_NEW, batch=2).valid
    row = summarize_cell(batched(cell_samples(41), row_len), max_new_tokens=MAX_NEW, batch=2)
    assert not row.valid and "row(s) [1] did not generate exactly" in row.invalid_reason


def _load_sample(index: int, n: int) -> LoadSample:
    return LoadSample(input_tokens=20, concurrency=1, request_rate=None, kind="timed", index=index, ok=True,
                      error=None, t_sent_ms=float(index), ttft_ms=5.0, itl_ms=[1.0] * (n - 1),
                      tpot_ms=1.0, e2e_ms=5.0 + n - 1, generated_tokens=n, content_chunks=n, queue_ms=None,
                      degenerate=False, degenerate_reason=None, token_ids=list(range(n)))  # fmt: skip


@pytest.mark.parametrize(("n", "valid"), [(4, True), (5, False), (3, False)])
def test_a_load_level_is_valid_only_when_each_request_generated_exactly_the_tokens_asked(n, valid):
    samples = [_load_sample(0, 4), _load_sample(1, n)]
    row = summarize_level(samples, input_tokens=20, concurrency=1, request_rate=None, seed=0, max_new_tokens=4,
                          num_requests=2, duration_s=1.0, compile_events=0)  # fmt: skip
    assert row.valid is valid
    assert valid or "other than 4 (first: #1: " + str(n) in row.invalid_reason


# ---- degeneracy: the repeat count and the coverage bound -----------------------------------------------------------
def test_the_constants_are_the_documented_ones():
    assert (MIN_REPEATS, LOOP_COVERAGE) == (3, 0.5)  # bench/measure/degeneracy.py's docstring gives the reasons


@pytest.mark.parametrize("period", [1, 2, 3, 4])
def test_two_back_to_back_copies_of_a_gram_are_not_a_loop(period):
    """Two copies ("very, very") of grams covering all of the output, with no id dominant: healthy."""
    grams = [list(range(10 * g, 10 * g + period)) for g in range(8)]
    ids = [t for gram in grams for t in gram * 2]
    if period == 1:  # two copies of one id: 2 of 16 tokens each, and no period-1 stretch of three
        assert max(ids.count(t) for t in ids) / len(ids) < 0.5
    verdict = check_degenerate(ids)
    assert verdict.details["judged"] and not verdict.degenerate, verdict


@pytest.mark.parametrize("period", [2, 3, 4])  # period 1: three copies of one id at half the output dominate it
def test_three_copies_covering_exactly_half_of_the_output_are_a_loop(period):
    """Three copies of a gram filling exactly LOOP_COVERAGE of the tokens, the rest varied: degenerate (the bound
    is inclusive), and the same loop one token short of half is not."""
    loop = list(range(100, 100 + period)) * 3
    rest = list(range(200, 200 + len(loop)))
    ids = rest + loop
    verdict = check_degenerate(ids)
    assert verdict.details["best_coverage"] == 0.5 and verdict.details["best_period"] == period
    assert verdict.degenerate and "loop" in verdict.reason, verdict
    less = check_degenerate([*rest, 999, *loop])  # one more varied token: coverage just under half
    assert less.details["best_coverage"] < 0.5 and not less.degenerate, less
