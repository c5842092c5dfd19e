"""Next-token logits of a run's cells: `logits/<input_tokens>.npy` in the run folder, one float32 [V] per cell.

What a file holds: the prefill's logits at the last real position of the cell's prompt (the next-token distribution
of the prompt, softcap applied, float32, V = the checkpoint's vocabulary size), as the in-process sweep computes them
once per cell after its timed repeats (`model.engine.Engine.next_token_logits`: not timed). `bench compare` reads
them to state a quantized run's accuracy against a dense one (max and mean absolute logit error; the README's
`bench compare` section defines them). Runs made before this existed, published runs, `--target` sweeps and the
transformers peer have none: readers get an empty mapping, never an error.

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


def _npy_bytes(values: array.array) -> bytes:
    """The .npy 1.0 encoding of a float32 vector (see the module docstring)."""
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({len(values)},), }}"
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
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RunFolderError(f"{path}: cannot read ({exc.strerror or exc})") from None
    bad = RunFolderError(f"{path}: not a float32 [V] .npy file (expected descr '<f4', shape (V,), version 1.0)")
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
    if not (isinstance(shape, tuple) and len(shape) == 1 and isinstance(shape[0], int) and shape[0] > 0):
        raise bad
    body = data[end:]
    if len(body) != 4 * shape[0]:
        raise RunFolderError(f"{path}: holds {len(body)} bytes of values; its header says {shape[0]} float32 values")
    values = array.array("f")
    values.frombytes(body)
    if sys.byteorder == "big":
        values.byteswap()
    return values


def read_logits(run_path: str | Path) -> dict[int, array.array]:
    """Every cell's next-token logits of a run: {input tokens: float32 values [V]}; empty when the run has no
    `logits/` folder (an older run, a published one, a `--target` sweep). Files whose name is not
    `<whole number>.npy` are ignored. Raises RunFolderError naming a file that cannot be read."""
    folder = Path(run_path) / LOGITS_DIR
    if not folder.is_dir():
        return {}
    out = {}
    for path in sorted(folder.glob("*.npy")):
        if path.stem.isascii() and path.stem.isdigit():
            out[int(path.stem)] = read_logits_file(path)
    return out
