"""User errors across commands: one `error:` line, exit code 2, no traceback (run in this process: the point is
the answer; tests/test_sweep.py and others keep real processes where the process is the point)."""

from __future__ import annotations

import pytest
from conftest import assert_one_line_error, run_cli_here, seeded_cache_root


@pytest.fixture(scope="module")
def env(tmp_path_factory, builtin_checkpoints):
    cache = seeded_cache_root(tmp_path_factory.mktemp("cache"), builtin_checkpoints)
    return {"GEMMA4_BENCH_CACHE": str(cache), "JAX_PLATFORMS": "cpu"}


@pytest.mark.parametrize(
    "args,needles",
    [
        (["generate", "-p", "hi", "-c", "builtin:tiny", "--temperature", "nan"], ["temperature"]),
        (["generate", "-p", "hi", "-c", "builtin:tiny", "--temperature", "1", "--seed", "-1"], ["seed"]),
        (["generate", "-p", "hi", "-c", "builtin:tiny", "-n", "1000000000"], ["positions", "--max-new-tokens"]),
        (["sweep", "-c", "builtin:tiny", "--inputs", "20", "--max-new-tokens", "100000"], ["--max-new-tokens"]),
        (["sweep", "-c", "builtin:tiny", "--inputs", "41,,521"], ["empty entry"]),
        (["sweep", "-c", "builtin:tiny", "--inputs", "20", "--model", "m"], ["--target"]),
        (["sweep", "-c", "builtin:tiny", "--inputs", "20", "--weight-dtype", "int3"],
         ["--weight-dtype int3", "bfloat16"]),
        (["sweep", "--target", "http://127.0.0.1:9/v1", "--weight-dtype", "bfloat16"], ["--weight-dtype", "server"]),
        (["checkpoint", "create", "/tmp/never-made-ckpt", "--preset", "tiny", "--seed", "-1"], ["seed -1"]),
        (["runs", "validate", "/tmp/no-such-run-folder"], ["no-such-run-folder"]),
        # Parsing errors (raised by typer's own copy of click in typer >= 0.22, by click before): one line too.
        (["profile", "--input-tokens", "abc"], ["--input-tokens", "bench profile --help"]),
        (["sweep", "--max-new-tokens", "1e3"], ["--max-new-tokens"]),
        (["profile", "--bogus"], ["--bogus"]),
        (["runs", "validate"], ["run"]),
        (["nosuchcmd"], ["nosuchcmd"]),
    ],
)
def test_bad_values_are_one_clear_line(args, needles, env, tmp_path):
    proc = run_cli_here([*args, *(["--runs-dir", str(tmp_path)] if args[0] == "sweep" else [])], env=env)
    assert_one_line_error(proc, *needles)


def test_compile_cache_that_is_a_file(env, tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    proc = run_cli_here(["generate", "-p", "hi", "-c", "builtin:tiny", "--compile-cache", str(f)], env=env)
    assert_one_line_error(proc, "--compile-cache", "is a file")
