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


def test_the_persistent_cache_writes_each_entry_whole_then_renames_it(tmp_path, monkeypatch):
    """Another process of the suite (`make test-suite TEST_JOBS=2`) never reads half an entry: jax's cache, as the
    suite runs it (no size limit), writes a temporary file and renames it into place."""
    import jax  # noqa: F401  (the session fixture wrapped the cache class when jax was imported)
    from jax._src import lru_cache

    renames = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (renames.append((a.name, b.name)), real(a, b))[1])
    cache = lru_cache.LRUCache(str(tmp_path), max_size=-1)
    cache.put("k1", b"entry")
    cache.put("k1", b"other")  # an entry is never written twice
    assert renames == [(f".k1.{os.getpid()}.part", "k1-cache")]
    assert cache.get("k1") == b"entry" and sorted(p.name for p in tmp_path.iterdir()) == ["k1-cache"]
