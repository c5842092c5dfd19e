"""Streaming safetensors reads: each weight file is read once, front to back, in blocks of rows, and each block is
converted (and, where the quantization says, quantized) into one preallocated host array of the final dtype.

Key: V vocab, D model width, X = L x P (the PLE table's columns).

Why blocks: reading a tensor whole into a `bytes` object, converting it with `astype` and placing it with a copy
held a 4.7 GB table (E2B's PLE, bfloat16) two or three times; a dense bfloat16 load of E2B peaked at 18.6 GB for
9.26 GB of weights. Here a tensor is read `BLOCK_BYTES` (16 MiB) at a time into one reused buffer, every byte
fed to the content hash in file order, and each block converted into its rows of the result. The result is
allocated `ALIGN`-byte aligned: `jax.device_put` of an aligned numpy array on CPU aliases it (measured, jax
0.12: no copy, the RSS does not move; an array of numpy's default 16-byte alignment is copied), so on CPU the
host array IS the placed array; on an accelerator it is freed once copied.

Tensors whose engine layout is a transpose (`model.checkpoint.TensorSpec.to_engine` not the identity: the layer
projections and the global `ple_proj_DX`, all small next to the tables) take the simple path (`read_transposed`):
read whole in the stored dtype, transposed (a copy), converted (a copy unless the dtype matches): at most three
times that one tensor, transiently.
"""

from __future__ import annotations

import ctypes
import functools
import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from model.errors import CheckpointError
from model.quant import QuantArray, quantize_blocks
from model.quantspec import QuantLayout

BLOCK_BYTES = 16 * 2**20
"""Bytes of stored data read per block (at least one row). Read at call time, so a test can make it small."""

ALIGN = 64
"""Byte alignment of the result arrays: XLA:CPU's minimum, at which `jax.device_put` aliases a numpy array."""

_NUMPY_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
                 "U8": "u1", "BOOL": "?"}  # fmt: skip
"""safetensors dtype names -> numpy dtypes (little-endian, as the format stores them); BF16 is ml_dtypes'."""
_TAIL = 1 << 22  # bytes per read of what follows the last tensor


def numpy_dtype(name: str, file: Path) -> np.dtype:
    """The numpy dtype of safetensors dtype `name`; CheckpointError naming `file` for an unsupported one."""
    if name == "BF16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    if name not in _NUMPY_DTYPES:
        raise CheckpointError(f"{file.name}: safetensors dtype {name!r} is not supported")
    return np.dtype(_NUMPY_DTYPES[name])


def aligned_empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """An uninitialised C-contiguous array of `shape` and `dtype` whose data starts at an `ALIGN`-byte boundary
    (numpy's own allocations are 16-byte aligned). Costs `ALIGN` bytes more than the array."""
    dtype = np.dtype(dtype)
    raw = np.empty(math.prod(shape) * dtype.itemsize + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start : start + math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)


def read_exact(f, n: int, file: Path) -> bytes:
    """`n` bytes of the open file `f` (a small read: headers, gaps); CheckpointError when the file ends first."""
    data = f.read(n)
    if len(data) != n:
        raise _truncated(file, len(data), n)
    return data


def _truncated(file: Path, got: int, want: int) -> CheckpointError:
    return CheckpointError(f"{file}: not a readable safetensors file (truncated: {got} of {want} bytes); "
                           "re-download or re-create it")  # fmt: skip


def safetensors_header(f, file: Path) -> tuple[bytes, list[tuple[int, int, str, dict]]]:
    """(the raw 8-byte length + JSON header, [(begin, end, key, entry)] sorted by offset) of an open file.
    The format: a little-endian u64 header length, the JSON header {key: {dtype, shape, data_offsets}}, the data."""
    raw = read_exact(f, 8, file)
    size = int.from_bytes(raw, "little")
    if size > 100 * 2**20:  # the format's own limit on the header
        raise CheckpointError(f"{file}: not a readable safetensors file (header of {size} bytes); re-download it")
    text = read_exact(f, size, file)
    try:
        header = json.loads(text)
        entries = sorted((int(v["data_offsets"][0]), int(v["data_offsets"][1]), k, v)
                         for k, v in header.items() if k != "__metadata__")  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise CheckpointError(f"{file}: not a readable safetensors file (bad header: {exc}); re-download it") from None
    return raw + text, entries


class StoredTensor:
    """One tensor of a weight file being read: key, shape, stored dtype name (e.g. "BF16"), file, and its bytes
    still unread at the file's cursor. Read it once, with `blocks` or `read`; what is left unread (an ignored
    tensor, an error) is read and hashed by `iter_tensors` before the next tensor. Not thread-safe: a cursor."""

    def __init__(self, f, h, key: str, shape: tuple[int, ...], dtype: str, file: Path, nbytes: int) -> None:
        self.key, self.shape, self.dtype, self.file, self.nbytes = key, shape, dtype, file, nbytes
        self._f, self._h, self._left = f, h, nbytes

    def _readinto(self, view: memoryview) -> None:
        """Fill `view` (bytes) from the file, hashing what is read; CheckpointError when the file ends first."""
        done = 0
        while done < len(view):
            n = self._f.readinto(view[done:])
            if not n:
                raise _truncated(self.file, self.nbytes - self._left + done, self.nbytes)
            done += n
        if self._h is not None:
            self._h.update(view)
        self._left -= len(view)

    def rows_per_block(self, multiple: int = 1) -> int:
        """Rows (indices of axis 0) per block: as many as `BLOCK_BYTES` holds, a multiple of `multiple`, >= it."""
        row = math.prod(self.shape[1:]) * numpy_dtype(self.dtype, self.file).itemsize
        rows = BLOCK_BYTES // max(row, 1) // multiple * multiple
        return max(rows, multiple)

    def blocks(self, multiple: int = 1) -> Iterator[tuple[int, np.ndarray]]:
        """(first row, block [r, *shape[1:]] in the stored dtype) in file order, r = `rows_per_block(multiple)`
        (the last block shorter). Each block is a view of one reused buffer: valid until the next is drawn.
        A 0-d tensor is one block of shape (). Raises CheckpointError for a truncated file."""
        dtype = numpy_dtype(self.dtype, self.file)
        if not self.shape:
            yield 0, self.read()
            return
        rows, rest = self.rows_per_block(multiple), self.shape[1:]
        row_bytes = math.prod(rest) * dtype.itemsize
        buf = aligned_empty((min(rows, self.shape[0]) * row_bytes,), np.uint8)
        for r0 in range(0, self.shape[0], rows):
            r = min(rows, self.shape[0] - r0)
            self._readinto(memoryview(buf[: r * row_bytes]))
            yield r0, buf[: r * row_bytes].view(dtype).reshape((r, *rest))

    def read(self) -> np.ndarray:
        """The whole tensor in its stored dtype, as one aligned array (CheckpointError for a truncated file)."""
        out = aligned_empty(self.shape, numpy_dtype(self.dtype, self.file))
        flat = memoryview(out.reshape(-1).view(np.uint8))
        for start in range(0, len(flat), BLOCK_BYTES):
            self._readinto(flat[start : start + BLOCK_BYTES])
        return out

    def _drain(self) -> None:
        """Read (and hash) whatever of this tensor is still unread."""
        buf = bytearray(min(self._left, BLOCK_BYTES))
        while self._left:
            self._readinto(memoryview(buf)[: min(self._left, len(buf))])


def iter_tensors(files: list[Path], h=None) -> Iterator[StoredTensor]:
    """Every tensor of the weight files as a `StoredTensor`, in file order, one at a time.

    Each file is read once, front to back; with `h` (a hashlib sha256) every byte read is also fed to it, as
    `name NUL bytes` per file, so that the hash equals the one `model.checkpoint.content_hash` computes by
    reading the files again. A tensor the caller did not read (or read only in part) is read and hashed before
    the next is yielded. CheckpointError for a truncated file or a header that is not safetensors."""
    for path in files:
        with open(path, "rb") as f:
            if h is not None:
                h.update(path.name.encode() + b"\0")
            head, entries = safetensors_header(f, path)
            if h is not None:
                h.update(head)
            pos = 0
            for begin, end, key, entry in entries:
                if begin < pos or end < begin:
                    raise CheckpointError(f"{path}: not a readable safetensors file (tensor {key!r} overlaps another)")
                gap = read_exact(f, begin - pos, path)
                if h is not None:
                    h.update(gap)
                shape = tuple(int(d) for d in entry.get("shape", ()))
                tensor = StoredTensor(f, h, key, shape, str(entry.get("dtype")), path, end - begin)
                yield tensor
                tensor._drain()
                pos = end
            for block in iter(lambda: f.read(_TAIL), b""):  # bytes after the last tensor (padding), hashed too
                if h is not None:
                    h.update(block)


@functools.cache
def _malloc_trim():
    """glibc's `malloc_trim`, or None where the C library has none (not glibc)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def release_free_heap() -> None:
    """Return the C heap's free pages to the system (glibc `malloc_trim(0)`; nothing elsewhere). Why: XLA's
    per-block temporaries (a block's float32 work, a few MiB to 32 MiB) are freed after each block, but glibc
    raises its mmap threshold once such a chunk is freed, so later ones come from the heap and stay resident as
    free fragments: quantizing the default preset's PLE table in 936-row blocks grew the RSS by 316 MiB for
    35 MiB of values, and by 136 MiB with a trim after each block (a fixed threshold, MALLOC_MMAP_THRESHOLD_,
    does as well). Configures nothing: it only hands back memory that is already free."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


# ---- one tensor into its result ----------------------------------------------------------------------------------
def read_dense(t: StoredTensor, dtype) -> np.ndarray:
    """Tensor `t` converted to `dtype` block by block into one aligned array of its shape (identity layout): no
    whole-tensor copy in the stored dtype. Host memory: the result plus one stored block."""
    out = aligned_empty(t.shape, dtype)
    for r0, block in t.blocks():
        if not t.shape:
            out[...] = block
        else:
            out[r0 : r0 + len(block)] = block
    return out


def read_transposed(t: StoredTensor, to_engine, dtype) -> np.ndarray:
    """Tensor `t` in the engine layout `to_engine(stored array)` (a transpose, a copy), converted to `dtype`:
    the simple path for the small transposed tensors. Transient host memory: up to three times the tensor."""
    return to_engine(t.read()).astype(dtype, copy=False)


def read_quantized(t: StoredTensor, dtype, layout: QuantLayout, scale_dtype, *, keep_dense: bool
                   ) -> tuple[np.ndarray | None, QuantArray]:  # fmt: skip
    """Tensor `t` (identity layout) quantized as `layout` while it streams: each block of rows is converted to
    `dtype` (the weight dtype, so the result equals `model.quant.quantize` of the dense load, bit for bit) and
    quantized into preallocated values and scales (`model.quant.quantize_blocks`); blocks are a whole number of
    the layout's scale rows (`layout.block[0]`).

    Returns (the dense array in `dtype` when `keep_dense` (the tied embed_VD, which the input lookup reads
    beside its int8 head copy), else None; the `QuantArray` with numpy values and scales). The full-precision
    table is never held whole unless `keep_dense`. Host memory: the results plus about five blocks (the stored
    block, its conversion, the quantizer's float32 work)."""
    dense = aligned_empty(t.shape, dtype) if keep_dense else None

    def converted() -> Iterator[tuple[int, np.ndarray]]:
        tmp = None
        for r0, block in t.blocks(layout.block[0]):
            if dense is not None:
                dense[r0 : r0 + len(block)] = block
                yield r0, dense[r0 : r0 + len(block)]
                release_free_heap()
                continue
            if tmp is None:
                tmp = aligned_empty(block.shape, dtype)
            tmp[: len(block)] = block
            yield r0, tmp[: len(block)]
            release_free_heap()  # the previous block's XLA temporaries are free by now

    q = quantize_blocks(converted(), t.shape, layout.bits, layout.block, scale_dtype=scale_dtype, empty=aligned_empty,
                        words=layout.words)  # fmt: skip
    return dense, q
