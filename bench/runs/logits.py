"""Next-token logits of a run's cells: `logits/<input_tokens>.npy` in the run folder, one float32 [V] per cell.

What a file holds: the prefill's logits at the last real position of the cell's prompt (the next-token distribution
of the prompt, softcap applied, float32, V = the checkpoint's vocabulary size), as the in-process sweep computes them
once per cell after its timed repeats (`model.engine.Engine.next_token_logits`: not timed). `bench compare` reads
them to state a quantized run's accuracy against a dense one (max and mean absolute logit error; the README's
`bench compare` section defines them). Runs made before this existed, published runs, `--target` sweeps and the
transformers peer have none: readers get an empty mapping, never an error.

Per decode step, a summary (`logits/<input_tokens>.steps.npy`, float32 [S, 4], S the generated tokens of the
cell's first timed repeat): row t holds (c_t, z_t[c_t], r_t, z_t[r_t]), c_t the token the run chose at step t,
r_t the highest-scoring other token, z_t the logits of decision t teacher-forced on the prompt and the run's own
tokens before t (`model.engine.Engine.step_summary`: one causal forward, not timed). Token ids are stored as
float32 values, exact below 2^24 (V = 262,144 for E2B; checked when written). `bench.report.accuracy` reads them to
tell a tie from an error at a divergence after step 0. Size: 128 + 16 S bytes (1,152 at 64 tokens).

Format: NumPy's `.npy` version 1.0 (`np.load` opens it), written and read here with the standard library only, so
the report path imports neither numpy nor jax: a header `{'descr': '<f4', 'fortran_order': False, 'shape': (V,)}`
padded to 128 bytes, then V little-endian float32 values. Size: 128 + 4 V bytes per cell: 32,896 bytes at the
default preset's V = 8192 (131,584 for its four sweep cells), 1,048,704 at E2B's V = 262,144. Written atomically
(a temporary file in the same folder, then `os.replace`), before the cell's row, so a cell row never names a cell
whose logits are half written.
"""

from __future__ import annotations

import array
import ast
import dataclasses
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.errors import RunFolderError
from bench.runs.folder import _atomic_write

LOGITS_DIR = "logits"
"""The run-folder subfolder that holds one `<input_tokens>.npy` per cell."""

_MAGIC = b"\x93NUMPY\x01\x00"
_HEADER_BYTES = 128  # magic (8) + header length (2) + header text padded with spaces and ended by a newline


def logits_path(run_path: str | Path, input_tokens: int) -> Path:
    """`<run>/logits/<input_tokens>.npy`."""
    return Path(run_path) / LOGITS_DIR / f"{int(input_tokens)}.npy"


STEPS_SUFFIX = ".steps.npy"
"""The per-step summary's file name ending: `logits/<input_tokens>.steps.npy`."""

STEP_COLUMNS = 4
"""Columns of a per-step summary row: chosen id, its logit, runner-up id, its logit."""

_EXACT_IDS = 2**24  # float32 holds every integer below this exactly


def steps_path(run_path: str | Path, input_tokens: int) -> Path:
    """`<run>/logits/<input_tokens>.steps.npy`."""
    return Path(run_path) / LOGITS_DIR / f"{int(input_tokens)}{STEPS_SUFFIX}"


def _npy_bytes(values: array.array, shape: tuple[int, ...] | None = None) -> bytes:
    """The .npy 1.0 encoding of float32 `values` of `shape` (default: a vector; see the module docstring)."""
    dims = shape or (len(values),)
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({', '.join(map(str, dims))},), }}"
    text = header.ljust(_HEADER_BYTES - len(_MAGIC) - 2 - 1) + "\n"
    assert len(text) + len(_MAGIC) + 2 == _HEADER_BYTES, len(text)
    little = array.array("f", values)
    if sys.byteorder == "big":
        little.byteswap()
    return _MAGIC + len(text).to_bytes(2, "little") + text.encode("latin1") + little.tobytes()


def write_logits(run_path: str | Path, input_tokens: int, values: Sequence[float]) -> Path:
    """Write one cell's next-token logits (`values`: V floats, e.g. a float32 numpy array [V]; stored as float32)
    to `logits/<input_tokens>.npy`, atomically; returns the path. Raises ValueError for an empty or non-finite
    vector (a program error) and RunFolderError when the folder cannot be written."""
    vector = array.array("f", values)
    if not vector or not all(map(math.isfinite, vector)):
        raise ValueError(f"write_logits: {input_tokens} input tokens: expected V finite values, got {len(vector)} "
                         "values with a NaN or infinity, or none")  # fmt: skip
    path = logits_path(run_path, input_tokens)
    try:
        path.parent.mkdir(exist_ok=True)
    except OSError as exc:
        raise RunFolderError(f"{path.parent}: cannot create ({exc.strerror or exc})") from None
    _atomic_write(path, _npy_bytes(vector))
    return path


def read_logits_file(path: str | Path) -> array.array:
    """One .npy file of float32 [V] as an `array.array('f')`. Raises RunFolderError naming the file when it is
    unreadable, not .npy 1.0, or not a little-endian float32 vector."""
    return _read_npy(path, rank=1)[0]


def _read_npy(path: str | Path, *, rank: int) -> tuple[array.array, tuple[int, ...]]:
    """(values, shape) of a float32 .npy 1.0 file of `rank` dimensions. Raises RunFolderError as
    `read_logits_file`."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RunFolderError(f"{path}: cannot read ({exc.strerror or exc})") from None
    form = "[V] .npy file (expected descr '<f4', shape (V,)" if rank == 1 else \
        f"[S, {STEP_COLUMNS}] .npy file (expected descr '<f4', shape (S, {STEP_COLUMNS})"
    bad = RunFolderError(f"{path}: not a float32 {form}, version 1.0)")
    if not data.startswith(_MAGIC) or len(data) < 10:
        raise bad
    end = 10 + int.from_bytes(data[8:10], "little")
    try:
        header = ast.literal_eval(data[10:end].decode("latin1"))
    except (ValueError, SyntaxError, UnicodeDecodeError):
        raise bad from None
    if not isinstance(header, dict) or header.get("descr") != "<f4" or header.get("fortran_order") is not False:
        raise bad
    shape = header.get("shape")
    if not (isinstance(shape, tuple) and len(shape) == rank and all(isinstance(d, int) and d > 0 for d in shape)):
        raise bad
    if rank == 2 and shape[1] != STEP_COLUMNS:
        raise bad
    count = math.prod(shape)
    body = data[end:]
    if len(body) != 4 * count:
        raise RunFolderError(f"{path}: holds {len(body)} bytes of values; its header says {count} float32 values")
    values = array.array("f")
    values.frombytes(body)
    if sys.byteorder == "big":
        values.byteswap()
    return values, shape


@dataclasses.dataclass(frozen=True)
class StepSummary:
    """One cell's per-decode-step summary (module docstring): per step t, `chosen[t]` (the run's token) and
    `chosen_logit[t]`, `runner_up[t]` (the best other token) and `runner_up_logit[t]`; logits in logit units."""

    chosen: tuple[int, ...]
    chosen_logit: tuple[float, ...]
    runner_up: tuple[int, ...]
    runner_up_logit: tuple[float, ...]

    def __len__(self) -> int:
        return len(self.chosen)

    def logit_of(self, step: int, token: int) -> float | None:
        """The stored logit of `token` at `step` (it is the chosen token or the runner-up), else None."""
        if self.chosen[step] == token:
            return self.chosen_logit[step]
        if self.runner_up[step] == token:
            return self.runner_up_logit[step]
        return None

    def margin(self, step: int) -> float:
        """z[chosen] - z[runner-up] at `step` (negative when the teacher-forced logits rank another token first)."""
        return self.chosen_logit[step] - self.runner_up_logit[step]


def write_step_summary(run_path: str | Path, input_tokens: int, ids: Sequence[Sequence[int]],
                       values: Sequence[Sequence[float]]) -> Path:  # fmt: skip
    """Write one cell's per-step summary: `ids` [S, 2] (chosen, runner-up) and `values` [S, 2] (their logits), e.g.
    numpy arrays, as float32 [S, 4] to `logits/<input_tokens>.steps.npy`, atomically; returns the path. Raises
    ValueError for no steps, rows not of 2, ids outside 0..2^24 or non-finite values (a program error), and
    RunFolderError when the folder cannot be written."""
    flat = array.array("f")
    rows = list(zip(ids, values, strict=True))
    for pair, vals in rows:
        pair, vals = [int(i) for i in pair], [float(v) for v in vals]
        exact = all(0 <= i < _EXACT_IDS for i in pair) and all(map(math.isfinite, vals))
        if len(pair) != 2 or len(vals) != 2 or not exact:
            raise ValueError(f"write_step_summary: {input_tokens} input tokens: expected rows of 2 ids in 0..2^24 and "
                             f"2 finite logits, got {pair} and {vals}")  # fmt: skip
        flat.extend((pair[0], vals[0], pair[1], vals[1]))
    if not rows:
        raise ValueError(f"write_step_summary: {input_tokens} input tokens: no steps")
    path = steps_path(run_path, input_tokens)
    try:
        path.parent.mkdir(exist_ok=True)
    except OSError as exc:
        raise RunFolderError(f"{path.parent}: cannot create ({exc.strerror or exc})") from None
    _atomic_write(path, _npy_bytes(flat, (len(rows), STEP_COLUMNS)))
    return path


def read_step_summaries(run_path: str | Path) -> dict[int, StepSummary]:
    """Every cell's per-step summary of a run: {input tokens: `StepSummary`}; empty when the run has none (a run
    from before they were stored, a published one, a `--target` sweep). Raises RunFolderError naming a file that
    cannot be read."""
    folder = Path(run_path) / LOGITS_DIR
    if not folder.is_dir():
        return {}
    out = {}
    for path in sorted(folder.glob("*" + STEPS_SUFFIX)):
        stem = path.name[: -len(STEPS_SUFFIX)]
        if stem.isascii() and stem.isdigit():
            values, (steps, _) = _read_npy(path, rank=2)
            rows = [values[i * STEP_COLUMNS:(i + 1) * STEP_COLUMNS] for i in range(steps)]
            out[int(stem)] = StepSummary(chosen=tuple(int(r[0]) for r in rows), chosen_logit=tuple(r[1] for r in rows),
                                         runner_up=tuple(int(r[2]) for r in rows),
                                         runner_up_logit=tuple(r[3] for r in rows))  # fmt: skip
    return out


def read_logits(run_path: str | Path) -> dict[int, array.array]:
    """Every cell's next-token logits of a run: {input tokens: float32 values [V]}; empty when the run has no
    `logits/` folder (an older run, a published one, a `--target` sweep). Files whose name is not
    `<whole number>.npy` are ignored. Raises RunFolderError naming a file that cannot be read."""
    folder = Path(run_path) / LOGITS_DIR
    if not folder.is_dir():
        return {}
    out = {}
    for path in sorted(folder.glob("*.npy")):
        if path.stem.isascii() and path.stem.isdigit():  # "41.steps.npy" has stem "41.steps": not a vector
            out[int(path.stem)] = read_logits_file(path)
    return out
