"""Shared test fixtures: the reference checkpoints made with transformers, and built-in tiny checkpoints."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
REFERENCE = FIXTURES / "reference"


@pytest.fixture(scope="module", autouse=True)
def _free_compiled_programs():
    """After each test module, drop jax's compiled programs (when jax was imported at all).

    Every XLA:CPU executable keeps memory mappings of its code; one process that ran several engine-heavy modules
    (parity, batch, engine, slots, serve slots, quantization accuracy, decode loop: 87 tests) grew to 64,800
    mappings and was killed by a segmentation fault inside a compile once it met the kernel's vm.max_map_count
    (65,530 here; seen 2026-12-05, mappings sampled every 10 s). Module-scoped fixtures (engines) are torn down
    before this one, so their programs are released here."""
    yield
    import sys

    if "jax" in sys.modules:
        import gc

        import jax

        jax.clear_caches()
        gc.collect()


@pytest.fixture(scope="module")
def cpu_kernels_built() -> str:
    """The engine's CPU kernels (`model.backends.cpu.kernels`, the opt-in "cpu-kernels" backend) built and loaded in
    this process: how (one line). Skips the test where they cannot be (no C++ compiler or headers)."""
    from model.backends.cpu import kernels as cpu

    ok, how = cpu.availability()
    if not ok:
        pytest.skip(f"the CPU kernels are not available here: {how}")
    return how


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A built-in 'tiny' checkpoint (float32, seed 0) with a trained tokenizer, made once per test session."""
    from model.builtin import create_checkpoint

    return create_checkpoint("tiny", tmp_path_factory.mktemp("ckpt") / "tiny", dtype="float32")


def run_cli(args: list[str], *, env: dict | None = None, cwd=None, timeout: float = 600):
    """Run `bench ARGS` in a fresh interpreter (as a user would); returns the CompletedProcess (text output)."""
    import subprocess
    import sys

    full_env = dict(os.environ, **(env or {}))
    code = "import sys; from bench.cli import main; main(sys.argv[1:])"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=full_env,
                          cwd=cwd, timeout=timeout)  # fmt: skip


def bench_in_process(args: list[str]) -> int:
    """Run `bench ARGS` in this interpreter (`bench.cli.main`); returns its exit code (0 when it returned)."""
    from bench.cli import main

    try:
        main(args)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def bench_captured(args: list[str], capsys) -> tuple[int, str, str]:
    """`bench_in_process(args)` with pytest's `capsys`: returns (exit code, stdout, stderr)."""
    code = bench_in_process(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_one_line_error(proc, *needles: str) -> None:
    """A user error: exit code 2, one `error:` line on stderr naming each needle, and no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
