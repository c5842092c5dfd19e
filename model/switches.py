"""The "cpu-kernels" backend's on/off environment switches (`model.backends.cpu.kernels.AMX_SWITCH` and
`ATTENTION_SWITCH`, `model.backends.cpu.xla.ENV_SWITCH`): one parser, so every switch takes the same words and
refuses anything else the same way (a typo such as `=of` must not leave a feature on). Imports no jax.
"""

from __future__ import annotations

import os

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


__all__ = ["OFF", "ON", "switch_on"]
