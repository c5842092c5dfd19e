"""Shared test fixtures: the reference checkpoints made with transformers, built-in tiny checkpoints, the suite's
one persistent compilation cache, and the helpers that run `bench` (in this process, or in a fresh one).

The compilation cache (docs/testing.md): every test process compiles into one persistent XLA cache, so a program
another module (or an earlier chunk of `make test`) compiled is loaded from disk instead of compiled again; the
in-memory programs are still dropped after every module (`_free_compiled_programs`). The folder is
$GEMMA4_BENCH_TEST_XLA_CACHE when set (`make test` makes one per invocation, shared by its chunks, removed at the
end), else a folder made for this process and removed when it exits; `GEMMA4_BENCH_TEST_XLA_CACHE=off` turns it off.
A test that needs cold compiles (it times or counts a compile) takes the `cold_compile_cache` fixture.

Quick compiles (docs/testing.md): the suite's programs are compiled with LLVM's optimization off in XLA:CPU's
backend (`--xla_backend_optimization_level=0` added to XLA_FLAGS, inherited by the commands the tests start), which
cut test_engine.py's compile time by a third; the programs (HLO) and their shapes, which the tests check, are the
same, and every test passes either way. Only under `-m "not canary"` (every make target but `make canary`: a canary
measures a speed, which needs XLA's default) or $GEMMA4_BENCH_TEST_XLA_OPT=quick; =full turns it off.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
REFERENCE = FIXTURES / "reference"
TEST_CACHE_ENV = "GEMMA4_BENCH_TEST_XLA_CACHE"


def _suite_cache_dir() -> Path | None:
    """The suite's persistent compilation cache folder (see the module docstring); None when turned off."""
    spec = os.environ.get(TEST_CACHE_ENV, "")
    if spec.lower() == "off":
        return None
    if spec:
        path = Path(spec)
        path.mkdir(parents=True, exist_ok=True)
        return path
    path = Path(tempfile.mkdtemp(prefix="gemma4-bench-test-xla-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


SUITE_XLA_CACHE = _suite_cache_dir()


def _write_cache_entries_whole() -> None:
    """Make jax's persistent cache write each entry whole: to a temporary file, then renamed into place. jax
    writes an entry in place (`jax._src.lru_cache.LRUCache.put`, `Path.write_bytes`), so another process of the
    suite (`make test-suite TEST_JOBS=2`) could read half an executable, and a process killed mid-write would leave
    one behind; a rename is atomic on one file system. Left as jax has it when its cache class is not the one this
    wraps (another jax version) or evicts entries (a size limit: jax then locks the folder itself)."""
    try:
        from jax._src import lru_cache
    except ImportError:
        return
    cls = getattr(lru_cache, "LRUCache", None)
    suffix = getattr(lru_cache, "_CACHE_SUFFIX", None)
    if cls is None or suffix is None or getattr(cls.put, "_whole_entries", False):
        return
    original = cls.put

    def put(self, key: str, value: bytes) -> None:
        if getattr(self, "eviction_enabled", True) or not key:
            return original(self, key, value)
        path = self.path / f"{key}{suffix}"
        if path.exists():
            return None
        part = self.path / f".{key}.{os.getpid()}.part"
        part.write_bytes(value)
        os.replace(part, path)
        return None

    put._whole_entries = True
    cls.put = put


def _use_compile_cache(path: Path | None) -> None:
    """Point jax's persistent compilation cache at `path` (None: off), caching every program (minimum compile
    time 0 s, minimum entry size 0 bytes), as `model.engine.enable_compile_cache` does for a command; a no-op when
    already so."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    want = (path is not None, str(path) if path is not None else jax.config.jax_compilation_cache_dir)
    if (jax.config.jax_enable_compilation_cache, jax.config.jax_compilation_cache_dir) == want:
        return
    jax.config.update("jax_enable_compilation_cache", path is not None)
    if path is not None:
        jax.config.update("jax_compilation_cache_dir", str(path))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    compilation_cache.reset_cache()  # jax opens its cache once: the next compile opens the folder now named


_cache_now: list[Path | None] = [SUITE_XLA_CACHE]  # where compiles go now: the suite's cache, or None (cold)


def _command_compile_cache(path: Path | None) -> Path | None:
    """The suite's stand-in for `model.engine.enable_compile_cache` while tests run: a command run in this process
    compiles into the suite's cache (or none, under `cold_compile_cache`) whatever its --compile-cache says, and
    gets back the folder it asked for (created, as the original does), so its manifest records what it would
    have. A command in its own process (`run_cli`) is not affected."""
    from model.engine import CompileCounter

    CompileCounter.install()
    _use_compile_cache(_cache_now[0])
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session", autouse=True)
def _suite_compile_cache():
    """Every test compiles into the suite's persistent cache (the module docstring), commands run in this process
    too (`_command_compile_cache`)."""
    import model.engine

    _write_cache_entries_whole()
    _use_compile_cache(SUITE_XLA_CACHE)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(model.engine, "enable_compile_cache", _command_compile_cache)
        yield


@pytest.fixture(autouse=True)
def _restore_suite_compile_cache():
    """After a test that ran a command in this process (which points the cache at its own `--compile-cache`
    folder, or turns it off), the next test compiles into the suite's cache again."""
    yield
    if "jax" in sys.modules:
        _use_compile_cache(_cache_now[0])


@pytest.fixture
def cold_compile_cache():
    """For a test whose point is a cold compile (it counts or times what a fresh process compiles): the persistent
    cache is off for this test, and every program it runs is compiled."""
    import jax

    _cache_now[0] = None
    _use_compile_cache(None)
    jax.clear_caches()
    yield
    jax.clear_caches()
    _cache_now[0] = SUITE_XLA_CACHE
    _use_compile_cache(SUITE_XLA_CACHE)


@pytest.fixture(scope="module", autouse=True)
def _free_compiled_programs():
    """After each test module, drop jax's compiled programs (when jax was imported at all); the persistent cache
    on disk keeps them for the next module.

    Every XLA:CPU executable keeps memory mappings of its code; one process that ran several engine-heavy modules
    (parity, batch, engine, slots, serve slots, quantization accuracy, decode loop: 87 tests) grew to 64,800
    mappings and was killed by a segmentation fault inside a compile once it met the kernel's vm.max_map_count
    (65,530 here; seen 2026-12-05, mappings sampled every 10 s). Module-scoped fixtures (engines) are torn down
    before this one, so their programs are released here."""
    yield
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


@pytest.fixture(scope="session")
def builtin_checkpoints(tmp_path_factory) -> Path:
    """The `checkpoints` folder of a cache root holding builtin:tiny (bfloat16, seed 0: what `--checkpoint
    builtin:tiny` loads), made once per session (`seeded_cache_root` links it into a test's own cache root)."""
    from model.builtin import ensure_builtin

    root = tmp_path_factory.mktemp("builtin-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GEMMA4_BENCH_CACHE", str(root))
        ensure_builtin("tiny", log=lambda _line: None)
    return root / "checkpoints"


def seeded_cache_root(path: Path, checkpoints: Path) -> Path:
    """`path`, made a cache root ($GEMMA4_BENCH_CACHE) whose built-in checkpoints are links to `checkpoints` (the
    `builtin_checkpoints` fixture), so a command given builtin:tiny loads it instead of creating it again (about
    10 s each); its compile cache and anything else it writes stay its own. Returns `path`."""
    (path / "checkpoints").mkdir(parents=True, exist_ok=True)
    for made in checkpoints.iterdir():
        if not made.name.startswith("."):
            (path / "checkpoints" / made.name).symlink_to(made, target_is_directory=True)
    return path


def run_cli(args: list[str], *, env: dict | None = None, cwd=None, timeout: float = 600):
    """Run `bench ARGS` in a fresh interpreter (as a user would); returns the CompletedProcess (text output)."""
    import subprocess
    import sys

    full_env = dict(os.environ, **(env or {}))
    code = "import sys; from bench.cli import main; main(sys.argv[1:])"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=full_env,
                          cwd=cwd, timeout=timeout)  # fmt: skip


def run_cli_here(args: list[str], *, env: dict | None = None, timeout: float = 600):
    """Run `bench ARGS` in this interpreter (`bench.cli.main`) with `env` added to os.environ for the call, its
    stdout and stderr captured: returns a CompletedProcess as `run_cli` does (exit code, text output), a second or
    more sooner than a fresh interpreter, and its programs compile into the suite's cache. For a test whose point
    is the command's answer (one error line and an exit code), not the process: signals, a real exit status,
    imports at startup and log lines (which go to pytest's log capture here, not to stderr) still need `run_cli`.
    A command still running after `timeout` s (e.g. a server that a refused option failed to stop) raises
    TimeoutError here (SIGALRM), as `run_cli`'s would."""
    import contextlib
    import io
    import signal
    import subprocess

    def expire(_signum, _frame):
        raise TimeoutError(f"bench {' '.join(args)}: still running after {timeout} s in this process")

    saved = {k: os.environ.get(k) for k in env or {}}
    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        os.environ.update(env or {})
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = bench_in_process(args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return subprocess.CompletedProcess(["bench", *args], code, out.getvalue(), err.getvalue())


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


# ---- quick compiles ------------------------------------------------------------------------------------------------
TEST_XLA_OPT_ENV = "GEMMA4_BENCH_TEST_XLA_OPT"
QUICK_COMPILE_FLAG = "--xla_backend_optimization_level=0"


def _use_quick_compiles(config) -> None:
    """Add QUICK_COMPILE_FLAG to XLA_FLAGS (the module docstring) when $GEMMA4_BENCH_TEST_XLA_OPT is "quick", or
    when it is unset and the -m expression leaves the canary tests out (`-m "not canary"`, as every make target but
    `make canary` does); "full" keeps XLA's default, as does XLA_FLAGS that sets the level itself. XLA reads
    XLA_FLAGS when jax starts its backend, which no test has done yet when pytest configures itself."""
    mode = os.environ.get(TEST_XLA_OPT_ENV, "")
    if mode not in ("", "quick", "full"):
        raise pytest.UsageError(f"${TEST_XLA_OPT_ENV}={mode!r}: expected quick or full (unset: quick under "
                                '-m "not canary")')  # fmt: skip
    flags = os.environ.get("XLA_FLAGS", "")
    quick = mode == "quick" or (not mode and "not canary" in (config.getoption("markexpr") or ""))
    if quick and "xla_backend_optimization_level" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {QUICK_COMPILE_FLAG}".strip()


def host_devices_env(devices: int) -> dict[str, str]:
    """The environment to add for a process of its own that sees `devices` forced CPU devices (XLA reads XLA_FLAGS
    when jax starts, so never this process): this process's XLA_FLAGS (the quick compiles) with
    `--xla_force_host_platform_device_count=DEVICES` added, and JAX_PLATFORMS=cpu."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
    return {"XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}


# ---- canaries: measured quantities, recorded -------------------------------------------------------------------
CANARY_OUT_ENV = "GEMMA4_BENCH_CANARY_OUT"
_CANARY_FIGURES: list[dict] = []


def pytest_configure(config):
    _use_quick_compiles(config)
    config.addinivalue_line(
        "markers",
        "canary: checks a measured quantity (a speed, a share) against a bound a busy host can break; left out of "
        "`make test`, run by `make canary`, which records every figure (the `canary_figure` fixture)",
    )


@pytest.fixture
def canary_figure(request):
    """`canary_figure(name, value, unit="", bound="")` records one measured figure of a canary test: printed in the
    terminal summary and written, with the host's load average, to $GEMMA4_BENCH_CANARY_OUT (JSON) when set."""

    def record(name: str, value: float, *, unit: str = "", bound: str = "") -> None:
        _CANARY_FIGURES.append({"test": request.node.nodeid, "name": name, "value": value, "unit": unit,
                                "bound": bound})  # fmt: skip

    return record


def pytest_terminal_summary(terminalreporter):
    if not _CANARY_FIGURES:
        return
    terminalreporter.section("canary figures")
    for f in _CANARY_FIGURES:
        bound = f"  (bound: {f['bound']})" if f["bound"] else ""
        terminalreporter.write_line(f"{f['test']}: {f['name']} = {f['value']:.6g} {f['unit']}{bound}")


def pytest_sessionfinish(session, exitstatus):
    out = os.environ.get(CANARY_OUT_ENV)
    if not out or not _CANARY_FIGURES:
        return
    import datetime
    import json
    import platform

    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "host": platform.node(), "logical_cpus": os.cpu_count(), "load_average": list(os.getloadavg()),
              "exit_status": int(exitstatus), "xla_flags": os.environ.get("XLA_FLAGS", ""),
              "figures": _CANARY_FIGURES}  # fmt: skip
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
