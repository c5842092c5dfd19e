"""The engine's hand-written XLA:CPU kernels for bfloat16-stored weights (`cpu_bf16.cc`, XLA FFI custom calls) and
decode attention: the "cpu-kernels" backend (`model.backends`), off unless an engine configuration asks for it
(`--backend cpu-kernels`). Built on first use with the machine's C++ compiler, loaded, and called through the
backend's hooks (`model.backends.dense_matmul` from `model.quant.matmul`, `model.backends.decode_attention` from
`model.layers.attend_one`).

Key: R activation rows (batch x positions; a decode step has R = 1 per sequence), K the contraction length, N the
output length.

- `matvec(x_RK, w, axis)`: float32 [R, N] = x [R, K] (float32) times a bfloat16 weight contracted along `axis`
  (1: w is [N, K], output-major; 0: w is [K, N], input-major). The weight is read once and widened in registers;
  the sums are float32 (a bfloat16 widens to float32 exactly, so each product is the float32 product of the same
  values; only the order of the additions differs from XLA's dot).
- `to_float32(w)`: the weight widened to float32 (any shape), for products of many rows (prefill), which XLA's
  float32 matrix product then runs.
- `decode_attention(q, k, v, mask)`: decode attention over a float32 KV cache, for every weight dtype
  (`model.layers.attend_one`): each thread takes chunks of positions, reads only the visible keys and values of
  its chunk, once, and keeps its own softmax state; the chunks are merged at the end. XLA's two products read the
  whole buffer, masked positions included, each at about 15 GB/s here.

Where the CPU has AMX-BF16 and Linux grants the process the tile state (`amx_min_rows`), `matvec` multiplies 16 or
more rows of a contraction whose length is a multiple of 32 on AMX tiles: each float32 activation split into three
bfloat16 parts that sum to it exactly, so the products are still exact and the sums float32 (`cpu_bf16.cc`). Then
every row count takes `matvec` (`MAX_ROWS_WITH_AMX`) and no weight is widened. `GEMMA4_BENCH_CPU_AMX=0` (or false,
off, no; read once per process, by the library) turns the tiles off; a value that is neither on nor off is refused in
Python before the library loads (`_loaded`). The manifest names the kernels in use (`KERNEL_NAMES`, `plan`).

Why: XLA:CPU widens a bfloat16 weight before a product at about 1.4 GB/s of stored bytes (chain of 100 [4096, 256]
matrix-vector products, 2-core Xeon, jax 0.12: 148 ms against 19 ms for the same products in float32), so storing
the weights in bfloat16 cost decode 8x (the published report's "leak one", reproduced by
`runs/2026-11-30-leak-one-cpu`). The kernels read the same 200 MiB in 12-14 ms, half the float32 product's bytes.

The build: `_build` (first called by `availability`) compiles `cpu_bf16.cc` once per (source, compiler, jaxlib
headers, CPU) into `<cache root>/kernels/` (`model.folders.cache_root`) with `$CXX` (default `c++`), `-O3
-march=native`, and the XLA FFI headers that jaxlib ships (`jax.ffi.include_dir()`). Where that fails (no compiler,
no headers, not a CPU backend) `availability()` says why, and `plan` (an engine asking for the kernels) raises it
as one EngineError line before any weight loads. A value of `AMX_SWITCH` or `ATTENTION_SWITCH` other than
1/true/on/yes or 0/false/off/no is an EngineError (`model.switches.switch_on`), not a silent "on".
Docs: docs/engine.md ("Backends"), with the measurements behind the kernels.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import jax
import jax.numpy as jnp

from model.errors import EngineError
from model.folders import cache_root
from model.switches import switch_on

SOURCE = Path(__file__).with_name("cpu_bf16.cc")
TARGETS = {"matvec_nk": "gemma4_bf16_matvec_nk", "matvec_kn": "gemma4_bf16_matvec_kn", "to_f32": "gemma4_bf16_to_f32",
           "attention": "gemma4_decode_attention", "attention_rows": "gemma4_decode_attention_rows"}
MAX_ROWS = 64
"""Most activation rows for which `model.backends.cpu.forms.bf16_kernel_form` multiplies a bfloat16 weight with `matvec`
where the kernel multiplies tiles of weight rows by activation rows (built with AVX-512: `tile_rows`); with more, the
weight is widened once (`to_float32`) and XLA's float32 product runs (prefill chunks of 128 rows). Measured here
(2-core Xeon, AVX-512, the default preset's 106 output-major decode weights, 77.9 MiB, chained; medians of 9 in one
process), `matvec` against widening and XLA's dot: 32 rows 25 / 61 ms, 64 rows 43-45 / 90, 128 rows 99 / 110."""
MAX_ROWS_WITHOUT_TILES = 32
"""`MAX_ROWS` where the kernel has no tiles (no AVX-512): one weight row at a time lost to widening at 64 rows (50
[4096, 256] weights, the same Xeon with AVX-512: 142.7 ms against 129.2), and without AVX-512 it is slower still
(the 106 weights above at 64 rows, compiled with -mno-avx512f: 277 ms)."""
MAX_ROWS_WITH_AMX = 1 << 16
"""`MAX_ROWS` where the kernel multiplies many rows on AMX tiles (`amx_min_rows`): every prefill chunk and batch
takes `matvec`, and no weight is widened. Measured here (2-core Xeon with AMX-BF16; a chain of 35 x 4 bfloat16
weights of the default preset's shapes, 150 MiB; alternating in one process, medians of 7), `matvec` against
widening and XLA's float32 dot: 16 rows 46 / 142 ms, 64 rows 75 / 174, 128 rows 111 / 218, 256 rows 217 / 342."""
AMX_SWITCH = "GEMMA4_BENCH_CPU_AMX"
"""Read by the library (`cpu_bf16.cc`, once per process): 0, false, off or no keeps products off the AMX tiles.
Checked first by `_loaded` (and `check_switches`), which refuses a value neither on nor off before the library loads."""


def _cpu_signature() -> str:
    """What `-march=native` compiles for: the machine, and the CPU's first model-name and feature-flag lines."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    first = {}
    for line in lines:
        key = line.split(":", 1)[0].strip()
        if key in ("model name", "flags", "Features"):
            first.setdefault(key, line)
    return platform.machine() + platform.processor() + "".join(first.values())


BUILD_TIMEOUT_S = 300
"""Seconds the C++ compiler may take (about 4 s here); past it the engine stays on XLA's product."""


def _compiler() -> list[str] | None:
    """The C++ compiler command ($CXX, which may carry arguments such as `ccache g++`; default `c++`), its program
    resolved on PATH; None when it is not found."""
    command = shlex.split(os.environ.get("CXX", "c++")) or ["c++"]
    found = shutil.which(command[0])
    return None if found is None else [found, *command[1:]]


def _build(out_dir: Path) -> tuple[Path | None, str]:
    """(path of the built library, how) or (None, why not)."""
    command = _compiler()
    if command is None:
        return None, f"no C++ compiler ({os.environ.get('CXX', 'c++')!r} not found; install g++ or set CXX)"
    cxx = " ".join(command)
    include = Path(jax.ffi.include_dir())
    if not (include / "xla" / "ffi" / "api" / "ffi.h").is_file():
        return None, f"no XLA FFI headers under {include}"
    flags = ["-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-w", f"-I{include}"]
    key = hashlib.sha256(
        "\0".join([SOURCE.read_text(), cxx, " ".join(flags), jax.__version__, _cpu_signature()]).encode()
    ).hexdigest()[:16]
    lib = out_dir / f"cpu_bf16-{key}.so"
    digest = lib.with_name(lib.name + ".sha256")  # written after the library: a damaged or partial one is rebuilt
    if lib.is_file() and digest.is_file() and digest.read_text().strip() == _sha256(lib):
        return lib, f"cached build {lib.name}"
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        part = Path(tmp) / lib.name
        try:
            run = subprocess.run([*command, *flags, str(SOURCE), "-o", str(part)], capture_output=True, text=True,
                                 timeout=BUILD_TIMEOUT_S)  # fmt: skip
        except subprocess.TimeoutExpired:
            return None, f"{Path(command[0]).name} took over {BUILD_TIMEOUT_S} s on {SOURCE.name}"
        if run.returncode != 0:
            last = (run.stderr.strip().splitlines() or ["(no output)"])[-1]
            return None, f"{Path(command[0]).name} failed on {SOURCE.name}: {last}"
        (Path(tmp) / digest.name).write_text(_sha256(part))
        os.replace(part, lib)  # atomic: a concurrent build of the same key writes the same bytes
        os.replace(Path(tmp) / digest.name, digest)
    return lib, f"built {lib.name}"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclasses.dataclass(frozen=True, kw_only=True)
class KernelLibrary:
    """The kernel library as this process loaded it (`_loaded`), or the reason it did not."""

    loaded: bool
    """Whether the library is loaded and its targets registered with XLA:CPU."""
    how: str
    """One line: how it was loaded (`_build`: "built ...", "cached build ...") or why not."""
    tile_rows: int = 0
    """Weight rows per tile in the products of many activation rows (`tile_rows`); 0 without tiles."""
    amx_min_rows: int = 0
    """The fewest activation rows multiplied on AMX tiles (`amx_min_rows`); 0 where they never are."""


_NOT_LOADED = KernelLibrary(loaded=False, how="not loaded yet (availability)")


def check_switches() -> None:
    """Raises EngineError for a value of `AMX_SWITCH` or `ATTENTION_SWITCH` that is neither on nor off (one line:
    `model.switches.switch_on`); builds and loads nothing. `model.engine.load_engine` calls it (through
    `model.backends.check_switches`) before the weights load, so a typo fails at once."""
    switch_on(AMX_SWITCH)
    switch_on(ATTENTION_SWITCH)


def availability() -> tuple[bool, str]:
    """(whether the kernels are loaded and registered with XLA:CPU, one line saying how or why not). Built and
    registered on the first call in a process (`_loaded`). A library that cannot be built or loaded is a reason,
    not an error. Raises EngineError (one line, `model.switches.switch_on`) for a value of `AMX_SWITCH` that is
    neither on nor off on a call that would load the library (checked before it loads, since the library reads
    that switch itself, once); nothing is loaded then."""
    if jax.default_backend() != "cpu":
        return False, f"not a CPU backend ({jax.default_backend()})"
    library = _loaded()
    return library.loaded, library.how


_LIBRARY: KernelLibrary | None = None
"""`_load`'s record once it has returned in this process (`_loaded`); None before."""
_LIBRARY_LOCK = threading.Lock()


def _loaded() -> KernelLibrary:
    """The library built, loaded and registered (`_load`), once per process, however many threads ask at once.
    Raises EngineError for a bad `AMX_SWITCH` (`_load`; nothing is recorded, so the next call checks again)."""
    global _LIBRARY
    with _LIBRARY_LOCK:
        if _LIBRARY is None:
            _LIBRARY = _load()
        return _LIBRARY


def _load() -> KernelLibrary:
    """Build (`_build`), load and register the library; what it says of its tiles. Raises EngineError for a bad
    `AMX_SWITCH` before anything is built."""
    switch_on(AMX_SWITCH)  # the library reads it itself (once, as on/off): a typo must not reach it as "on"
    try:
        lib_path, how = _build(cache_root() / "kernels")
        if lib_path is None:
            return KernelLibrary(loaded=False, how=how)
        lib = ctypes.cdll.LoadLibrary(str(lib_path))
        for name in TARGETS.values():
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)), platform="cpu")
        tiles, amx = int(lib.gemma4_bf16_tile_rows()), int(lib.gemma4_bf16_amx_min_rows())
    except (OSError, AttributeError, ValueError, subprocess.SubprocessError) as e:
        return KernelLibrary(loaded=False, how=f"kernel library not loaded: {e}")
    return KernelLibrary(loaded=True, how=how, tile_rows=tiles, amx_min_rows=amx)


def _library() -> KernelLibrary:
    """`_loaded()`'s record where it has run in this process, else `_NOT_LOADED` (this builds and loads nothing)."""
    return _LIBRARY or _NOT_LOADED


def tile_rows() -> int:
    """Weight rows per tile in the loaded kernel's products of many activation rows (4 where it was compiled with
    AVX-512), 0 without tiles or before the kernels are loaded (`availability`)."""
    return _library().tile_rows


def amx_min_rows() -> int:
    """The fewest activation rows the loaded kernel multiplies on AMX tiles (16 where it was built with AMX-BF16 and
    Linux granted the process the tile state; `cpu_bf16.cc`), 0 where it never does or before the kernels are
    loaded (`availability`)."""
    return _library().amx_min_rows


def max_rows() -> int:
    """Most activation rows `model.backends.cpu.forms.bf16_kernel_form` sends to `matvec`: `MAX_ROWS_WITH_AMX` with
    AMX tiles (`amx_min_rows`), `MAX_ROWS` with AVX-512 tiles (`tile_rows`), else `MAX_ROWS_WITHOUT_TILES`."""
    if amx_min_rows() > 0:
        return MAX_ROWS_WITH_AMX
    return MAX_ROWS if tile_rows() > 0 else MAX_ROWS_WITHOUT_TILES


def available() -> bool:
    """Whether `matvec` and `to_float32` can run (`availability`, whose EngineError for a bad switch it raises)."""
    return availability()[0]


BF16_KERNEL = "bf16=cpu"
"""The manifest's kernel name for bfloat16 weights multiplied by these kernels (`matvec`, `to_float32`)."""
BF16_KERNEL_AMX = "bf16=cpu-amx"
"""`BF16_KERNEL` where the kernels multiply many rows (prefill, batches) on AMX tiles (`amx_min_rows`): another
product of many rows, so another build."""
ATTENTION_KERNEL = "attention=cpu"
"""The manifest's kernel name for decode attention run by `decode_attention` (float32 KV caches): it reads only the
visible positions of each cache, so `model.engine.Engine.decode_bytes` counts those."""
KERNEL_NAMES = (BF16_KERNEL, BF16_KERNEL_AMX, ATTENTION_KERNEL)
"""Every name `plan` may put in the manifest's kernel text."""


def bf16_kernel_name() -> str:
    """The manifest's name of the bfloat16 kernels as this process loads them (`availability`, which builds them on
    first use): `BF16_KERNEL_AMX` with AMX tiles, else `BF16_KERNEL`."""
    availability()
    return BF16_KERNEL_AMX if amx_min_rows() > 0 else BF16_KERNEL


@dataclasses.dataclass(frozen=True, kw_only=True)
class KernelsPlan:
    """What an engine of the "cpu-kernels" backend runs through these kernels (`plan`): `bf16` its bfloat16 weights'
    products, `attention` its decode attention; `kernel` their manifest names (None for neither); `lines` the
    (level, line) pairs its load logs."""

    bf16: bool
    attention: bool
    kernel: str | None
    lines: tuple[tuple[str, str], ...]


def plan(*, weight_dtype: str, activation_dtype: str, kv_dtype: str) -> KernelsPlan:
    """The plan of a "cpu-kernels" engine with these dtypes (names) on the CPU platform: the library built and
    loaded now (`availability`); the bfloat16 products where bfloat16 weights meet float32 activations, decode
    attention where the KV cache and activations are float32 (and `ATTENTION_SWITCH` is on). Raises EngineError
    (one line) where the library cannot be built or loaded (`model.backends.check_runs` says so first, with the
    fix), and for a bad switch value."""
    check_switches()
    ok, how = availability()
    if not ok:
        raise EngineError(f"the engine's CPU kernels cannot run here ({how})")
    bf16 = weight_dtype == "bfloat16" and activation_dtype == "float32"
    lines = []
    if bf16:
        amx = f", AMX tiles from {amx_min_rows()} rows" if amx_min_rows() > 0 else ""
        lines.append(("info", f"bfloat16 weights x float32 activations: the engine's CPU kernels ({SOURCE.name}, "
                              f"{how}{amx})"))  # fmt: skip
    attention = kv_dtype == "float32" and activation_dtype == "float32"
    if attention and not switch_on(ATTENTION_SWITCH):
        attention = False
        lines.append(("info", f"decode attention: XLA's products over the whole KV cache ({ATTENTION_SWITCH} off)"))
    elif attention:
        lines.append(("info", f"decode attention: the engine's CPU kernel ({SOURCE.name}), reading the visible "
                              "positions only"))  # fmt: skip
    if not bf16 and not attention:
        lines.append(("warning", f"warning: --backend cpu-kernels: no kernel applies to weights {weight_dtype}, "
                                 f"activations {activation_dtype}, KV cache {kv_dtype} (they take bfloat16 weights "
                                 "under float32 activations, and float32 KV caches): the engine runs pure "
                                 "JAX"))  # fmt: skip
    names = [bf16_kernel_name()] if bf16 else []
    names += [ATTENTION_KERNEL] if attention else []
    return KernelsPlan(bf16=bf16, attention=attention, kernel=" ".join(names) or None, lines=tuple(lines))


def matvec(x_RK: jax.Array, w: jax.Array, axis: int) -> jax.Array:
    """float32 [R, N]: x [R, K] (float32) times the bfloat16 weight `w` contracted along `axis` (1: w [N, K],
    0: w [K, N]). Call only when `available()`. Under `jax.vmap`, one call per mapped element (the engine never
    maps it; it folds rows into R). No derivative rule: `jax.grad` through it raises."""
    n = w.shape[1 - axis]
    target = TARGETS["matvec_nk" if axis == 1 else "matvec_kn"]
    result = jax.ShapeDtypeStruct((x_RK.shape[0], n), jnp.float32)
    return jax.ffi.ffi_call(target, result, vmap_method="sequential")(x_RK.astype(jnp.float32), w)


def to_float32(w: jax.Array) -> jax.Array:
    """The bfloat16 array `w` widened to float32 (same shape; exact). Call only when `available()`. Under
    `jax.vmap`, one call per mapped element."""
    result = jax.ShapeDtypeStruct(w.shape, jnp.float32)
    return jax.ffi.ffi_call(TARGETS["to_f32"], result, vmap_method="sequential")(w)


ATTENTION_GROUPS = (1, 2, 4, 8)
"""Query heads per KV head (G) that `decode_attention` is compiled for."""
ATTENTION_SWITCH = "GEMMA4_BENCH_CPU_ATTENTION"
"""Read at every trace (`attention_available`): 0, false, off or no keeps decode attention on XLA's two products
(to measure them); on or unset: the kernel, under the "cpu-kernels" backend. Any other value is refused
(EngineError, `model.switches.switch_on`)."""


def attention_available() -> bool:
    """Whether decode attention runs `decode_attention`: `ATTENTION_SWITCH` on and the kernels loaded
    (`availability`, which this builds and loads on first use). Raises EngineError for a bad value of either switch."""
    return switch_on(ATTENTION_SWITCH) and available()


def decode_attention(q_BKGH: jax.Array, k_CKSH: jax.Array, v_CKSH: jax.Array, mask_BS: jax.Array,
                     rows_B: jax.Array | None = None) -> jax.Array:
    """float32 [B, K, G, H]: one query position per row against a float32 KV cache, softmax over the visible
    positions (mask [B, S] bool, True = visible), scale 1.0; q [B, K, G, H], k and v [C, K, S, H] float32, G in
    `ATTENTION_GROUPS`. Query row b reads cache row b (C = B), or with `rows_B` (int32 [B], each in 0..C-1) cache
    row rows_B[b], in place (no gathered copy of those rows). Only the visible positions' keys and values are read
    (`cpu_bf16.cc`); a row with none visible gets zeros. Call only when `available()`. No derivative rule. A row
    index out of range fails the call (XLA raises the kernel's InvalidArgument)."""
    result = jax.ShapeDtypeStruct(q_BKGH.shape, jnp.float32)
    if rows_B is None:
        return jax.ffi.ffi_call(TARGETS["attention"], result, vmap_method="sequential")(q_BKGH, k_CKSH, v_CKSH, mask_BS)
    call = jax.ffi.ffi_call(TARGETS["attention_rows"], result, vmap_method="sequential")
    return call(q_BKGH, k_CKSH, v_CKSH, mask_BS, rows_B.astype(jnp.int32))


__all__ = ["AMX_SWITCH", "ATTENTION_GROUPS", "ATTENTION_KERNEL", "ATTENTION_SWITCH", "BF16_KERNEL", "BF16_KERNEL_AMX",
           "KERNEL_NAMES", "MAX_ROWS", "MAX_ROWS_WITHOUT_TILES", "MAX_ROWS_WITH_AMX", "KernelsPlan", "amx_min_rows",
           "attention_available", "availability", "available", "bf16_kernel_name", "check_switches",
           "decode_attention", "matvec", "max_rows", "plan", "tile_rows", "to_float32"]
