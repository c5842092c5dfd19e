"""The suite's own set-up (tests/conftest.py, docs/testing.md): quick compiles go only where no speed is measured,
and a process of its own with forced host devices keeps them."""

from __future__ import annotations

import os
import types

import pytest
from conftest import QUICK_COMPILE_FLAG, TEST_XLA_OPT_ENV, _use_quick_compiles, host_devices_env


def _config(markexpr: str):
    return types.SimpleNamespace(getoption=lambda name: markexpr if name == "markexpr" else None)


@pytest.mark.parametrize("markexpr, mode, flags, want", [
    ("not heavy and not canary", None, "", QUICK_COMPILE_FLAG),  # make test-suite, make test-fast
    ("not heavy and not canary", None, "--xla_force_host_platform_device_count=2",
     f"--xla_force_host_platform_device_count=2 {QUICK_COMPILE_FLAG}"),  # added to what is there
    ("canary", None, "", ""),  # make canary: speeds need XLA's default
    ("", None, "", ""),  # plain pytest may run a canary: XLA's default
    ("canary", "quick", "", QUICK_COMPILE_FLAG),
    ("not canary", "full", "", ""),
    ("not canary", None, "--xla_backend_optimization_level=2", "--xla_backend_optimization_level=2"),  # left alone
])  # fmt: skip
def test_quick_compiles_only_where_no_speed_is_measured(monkeypatch, markexpr, mode, flags, want):
    if mode is None:
        monkeypatch.delenv(TEST_XLA_OPT_ENV, raising=False)
    else:
        monkeypatch.setenv(TEST_XLA_OPT_ENV, mode)
    monkeypatch.setenv("XLA_FLAGS", flags)
    _use_quick_compiles(_config(markexpr))
    assert os.environ["XLA_FLAGS"] == want


def test_a_bad_compile_mode_is_a_usage_error(monkeypatch):
    monkeypatch.setenv(TEST_XLA_OPT_ENV, "fast")
    with pytest.raises(pytest.UsageError, match="expected quick or full"):
        _use_quick_compiles(_config("not canary"))


def test_a_process_with_forced_devices_keeps_this_processs_flags(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", QUICK_COMPILE_FLAG)
    env = host_devices_env(4)
    assert env == {"XLA_FLAGS": f"{QUICK_COMPILE_FLAG} --xla_force_host_platform_device_count=4",
                   "JAX_PLATFORMS": "cpu"}  # fmt: skip
