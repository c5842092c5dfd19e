"""The engine's on/off environment switches (`model.kernels.cpu.ENV_SWITCH` and `AMX_SWITCH`,
`model.programs.ENV_SWITCH`): one parser, so every switch takes the same words and refuses anything else the same
way (a typo such as `=of` must not leave a feature on). Imports no jax.
"""

from __future__ import annotations

import os

from model.errors import EngineError

ON = ("1", "true", "on", "yes")
OFF = ("0", "false", "off", "no")
SPACE = " \t\n\r\f\v"
"""The whitespace stripped around a value: ASCII only, as `cpu_bf16.cc` strips `GEMMA4_BENCH_CPU_AMX`, which it
reads itself (str.strip() alone would also strip characters that the library keeps, and the two would disagree)."""


def switch_state(name: str, default: str = "on") -> bool | None:
    """The environment variable `name` as a switch: True for one of `ON`, False for one of `OFF` (either in any
    case, `SPACE` around it ignored), None when it is unset. Raises EngineError for any other value, one line naming
    the variable, the value received (repr), the words expected and the fix (`default`: what unset means, for that
    line)."""
    raw = os.environ.get(name)
    if raw is None:
        return None
    value = raw.strip(SPACE).lower()
    if value not in ON + OFF:
        raise EngineError(f"{name}={raw!r}: expected 1/true/on/yes or 0/false/off/no; unset it for the default "
                          f"({default})")  # fmt: skip
    return value in ON


def switch_on(name: str) -> bool:
    """Whether the environment variable `name` is on: unset or one of `ON`, off for one of `OFF`. Raises
    EngineError for any other value (`switch_state`)."""
    state = switch_state(name)
    return True if state is None else state


__all__ = ["OFF", "ON", "switch_on", "switch_state"]
