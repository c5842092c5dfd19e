"""The arithmetic of a batch cell (bench.measure.batches): aggregate throughput, arithmetic intensity, the knee."""

from __future__ import annotations

import pytest

from bench.measure.batches import KNEE_FRACTION, aggregate_tok_s, arithmetic_intensity, knee


def test_the_knee_is_the_first_batch_whose_step_grew_past_the_fraction():
    steps = {1: 10.0, 4: 10.4, 16: 12.4, 64: 30.0}
    assert knee(steps) == 64 and KNEE_FRACTION == 0.25  # 12.4 <= 12.5 < 30
    assert knee(steps, 0.2) == 16
    assert knee({1: 10.0, 4: 10.1}) is None  # still on the roofline
    assert knee({64: 30.0, 1: 10.0, 16: 13.0}) == 16  # unordered input


@pytest.mark.parametrize("steps,fraction,needle", [({4: 1.0}, 0.25, "B = 1"), ({1: 1.0}, 0.0, "fraction"),
                                                   ({1: 1.0, 4: float("nan")}, 0.25, "finite")])  # fmt: skip
def test_a_knee_without_its_inputs_is_a_value_error(steps, fraction, needle):
    with pytest.raises(ValueError, match=needle):
        knee(steps, fraction)


def test_aggregate_throughput_and_arithmetic_intensity():
    assert aggregate_tok_s(25.0, 16) == 400.0
    assert arithmetic_intensity(698_368, 349_184) == 2.0
    with pytest.raises(ValueError):
        aggregate_tok_s(25.0, 0)
    with pytest.raises(ValueError):
        arithmetic_intensity(1, 0)
