"""The "cpu-kernels" backend's on/off environment switches (`model.backends.cpu.kernels.AMX_SWITCH` and
`ATTENTION_SWITCH`, `model.backends.cpu.xla.ENV_SWITCH`): one parser, so every switch takes the same words and
refuses anything else the same way (a typo such as `=of` must not leave a feature on). Imports no jax.
"""

from __future__ import annotations

import os
import re

from model.errors import EngineError

ON = ("1", "true", "on", "yes")
OFF = ("0", "false", "off", "no")
SPACE = " \t\n\r\f\v"
"""The whitespace stripped around a value: ASCII only, as `cpu_bf16.cc` strips `GEMMA4_BENCH_CPU_AMX`, which it
reads itself (str.strip() alone would also strip characters that the library keeps, and the two would disagree)."""


def switch_on(name: str) -> bool:
    """Whether the environment variable `name` is on: unset or one of `ON`, off for one of `OFF` (either in any
    case, `SPACE` around it ignored). Raises EngineError for any other value, one line naming the variable, the value
    received (repr), the words expected and the fix."""
    raw = os.environ.get(name)
    if raw is None:
        return True
    value = raw.strip(SPACE).lower()
    if value not in ON + OFF:
        raise EngineError(f"{name}={raw!r}: expected 1/true/on/yes or 0/false/off/no; unset it for the default (on)")
    return value in ON


TEST_DELAY_ENV = "GEMMA4_BENCH_TEST_DECODE_DELAY"
"""Test only: a delay added to every host-loop decode step (`injected_decode_delay_s`), how `bench ab`'s tests make
a known slowdown (docs/commands/ab.md). Its value must read `test-only:<ms>ms` (e.g. `test-only:2ms`), so no
ordinary value (1, on, 2) turns it on; the run's manifest records it (`test_injection`) and the engine logs a
warning when it is set."""


def injected_decode_delay_s() -> float | None:
    """The test-only decode delay of `TEST_DELAY_ENV` in seconds, None when the variable is unset or empty.
    Raises EngineError (one line) for any other value than `test-only:<ms>ms` with 0 < ms <= 1000."""
    raw = os.environ.get(TEST_DELAY_ENV)
    if raw is None or not raw.strip(SPACE):
        return None
    m = re.fullmatch(r"test-only:(\d+(?:\.\d+)?)ms", raw.strip(SPACE))
    if m is None or not 0 < float(m.group(1)) <= 1000:
        raise EngineError(f"{TEST_DELAY_ENV}={raw!r}: a test-only decode delay, expected test-only:<ms>ms with "
                          "0 < ms <= 1000 (e.g. test-only:2ms); unset it for normal runs")  # fmt: skip
    return float(m.group(1)) / 1000.0


__all__ = ["OFF", "ON", "TEST_DELAY_ENV", "injected_decode_delay_s", "switch_on"]
