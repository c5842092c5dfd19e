"""The cpu-kernels backend's on/off environment switches (model/switches.py): the words each takes, and one line for
any other value. Their users: tests/test_cpu_kernels.py (decode attention, the AMX tiles), tests/test_programs.py
(XLA options)."""

from __future__ import annotations

import pytest

from model.errors import EngineError
from model.switches import switch_on

NAME = "GEMMA4_BENCH_TEST_SWITCH"


def test_unset_and_the_on_words_are_on_the_off_words_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NAME, raising=False)
    assert switch_on(NAME)
    for word in ("1", "true", "On", "YES", " yes\t", "\non\n"):
        monkeypatch.setenv(NAME, word)
        assert switch_on(NAME), word
    for word in ("0", "false", "OFF", "No", " off ", "0\r\n"):
        monkeypatch.setenv(NAME, word)
        assert not switch_on(NAME), word


@pytest.mark.parametrize("bad", ["of", "", "  ", "2", "enable", "o n", "\x1coff"])
def test_any_other_value_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    """A typo never passes for "on"; the message names the variable, the value as received, the words and the fix.
    `\\x1c` is whitespace to str.strip() but not to the C++ library that reads GEMMA4_BENCH_CPU_AMX: refused."""
    monkeypatch.setenv(NAME, bad)
    with pytest.raises(EngineError) as raised:
        switch_on(NAME)
    message = str(raised.value)
    assert message == f"{NAME}={bad!r}: expected 1/true/on/yes or 0/false/off/no; unset it for the default (on)"
    assert "\n" not in message
