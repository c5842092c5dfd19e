"""A streaming read of a large device buffer through a Pallas TPU kernel: the read probe that reaches a TPU's HBM
streaming rate (docs/method.md, "Rooflines"; `bench.profile.bandwidth.measure_stream_read` times it).

Why a kernel: XLA's own read-only reduction over a 2 GiB buffer read 551-570 GiB/s on the TPU v5e (jax 0.10.2,
2026-12-05/07), slower than the decode step's matrix-vector fusions read their weights there (686 GiB/s), so a
share against it read above 100%. One pass of this kernel per call reads no faster (560-566 GiB/s): a call's fixed
cost, about 0.6 ms, is a sixth of a 2 GiB pass. What the kernel adds is `passes`: one call walks the buffer many
times with nothing between the passes for XLA to hoist or fuse away (a loop around XLA's reduction of an unchanged
buffer could be computed once), and 16 passes read 690-691 GiB/s (742 GB/s), 91% of the 819 GB/s datasheet
figure (`bench.profile.bandwidth.STREAM_PROBES` has the numbers; 32 passes read 697-698 GiB/s, 749 GB/s). A
call's fixed cost was measured as the difference of one pass over 2 GiB (3.5 ms) and over 4 GiB (6.4 ms).

The kernel reads the buffer block by block: the grid walks the blocks in order (`passes` times), Pallas's
pipeline copies block i + 1 from HBM into VMEM while block i is summed, and every block is added into one resident
[8, 1024] int32 accumulator (the output's only block, written back to HBM once at the end), so the kernel's HBM
traffic is the buffer's bytes read `passes` times plus 32 KiB written.

The buffer is int32 [rows, STREAM_COLUMNS] holding `arange(rows * STREAM_COLUMNS)`; the kernel's [8, 1024] output
summed over its 8 rows (a 32 KiB XLA reduction after the kernel) gives each column's wrapping sum over all rows,
which `bench.profile.bandwidth.column_sums` knows in closed form: no block can be skipped without the check failing.
A block is [block_rows, 1024] int32 (4 KiB per row), summed as [block_rows / 8, 8, 1024] over its first axis:
elementwise adds of whole (8, 128) int32 tiles, the TPU's native 32-bit tile.

jax is imported when a function runs, not at import (bench/profile/__init__.py). Runs on jax 0.10.2 (the lent TPU
machine's) and 0.12 (the project's): `pl.pallas_call` with `pltpu.CompilerParams`; on a CPU, `interpret=True`
runs the same kernel in Python for the tests, and `jax.export` with platforms ["tpu"] lowers it through Mosaic
(tests/test_stream_read.py).
"""

from __future__ import annotations

STREAM_COLUMNS = 1024
"""Columns of the streamed buffer: eight 128-lane tiles per row, 4 KiB of int32 per row."""
ROW_BYTES = 4 * STREAM_COLUMNS
SUBLANES = 8
"""Rows of the accumulator: one (8, 128) int32 tile tall, so every add is a whole-tile add."""
MiB = 2**20
BLOCK_BYTES = (2 * MiB, 4 * MiB, 8 * MiB)
"""The block sizes scripts/probes/stream_read.py tries (bytes of one block; two are in VMEM at once, the pipeline's
double buffer). Several MiB per block keeps each DMA long against its fixed cost; 8 MiB x 2 needs the scoped VMEM limit
raised above the 16 MiB default (`vmem_limit_bytes`), which the v5e's 128 MiB of VMEM allows."""


def block_rows_of(block_bytes: int) -> int:
    """Rows of a [rows, STREAM_COLUMNS] int32 block of `block_bytes` bytes, a multiple of SUBLANES. Raises
    ValueError when `block_bytes` is not a positive multiple of SUBLANES * ROW_BYTES (32 KiB)."""
    if block_bytes <= 0 or block_bytes % (SUBLANES * ROW_BYTES):
        raise ValueError(f"block of {block_bytes} bytes: expected a positive multiple of {SUBLANES * ROW_BYTES}")
    return block_bytes // ROW_BYTES


def vmem_limit_bytes(block_bytes: int) -> int:
    """The scoped VMEM the kernel asks for: its input block twice (the pipeline's double buffer), the output's
    block twice, and 4 MiB of headroom for Mosaic's own scratch; bytes."""
    return 2 * block_bytes + 2 * SUBLANES * ROW_BYTES + 4 * MiB


def stream_sum(x, block_rows: int, *, passes: int = 1, interpret: bool = False):
    """Per-sublane column sums of `x` read `passes` times over, block by block through VMEM, by a Pallas TPU kernel.

    x: int32 [rows, STREAM_COLUMNS] in HBM, rows a multiple of `block_rows`; block_rows: a multiple of SUBLANES;
    passes: how many times the grid walks the whole buffer (the grid is (passes, blocks); the pipeline prefetches
    across a pass's end as within it), so one call reads passes x the buffer's bytes and its fixed cost (dispatch,
    launch, the final write) is spread over them. Returns int32 [SUBLANES, STREAM_COLUMNS]: entry (s, c) is
    passes x the wrapping sum of x[r, c] over the rows r = s mod 8, wrapping. `interpret=True` runs the kernel in
    Python (any backend; the tests). Raises ValueError for shapes that do not tile or passes < 1. Call it under
    `jax.jit`.
    """
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    rows, columns = x.shape
    if columns != STREAM_COLUMNS or x.dtype != jnp.int32:
        raise ValueError(f"stream_sum of {x.dtype}[{rows}, {columns}]: expected int32[rows, {STREAM_COLUMNS}]")
    if block_rows <= 0 or block_rows % SUBLANES or rows % block_rows:
        raise ValueError(f"block of {block_rows} rows over {rows} rows: expected a multiple of {SUBLANES} that "
                         "divides the rows")  # fmt: skip
    if passes < 1:
        raise ValueError(f"passes {passes}: expected at least 1")

    def kernel(x_ref, acc_ref):
        @pl.when((pl.program_id(0) == 0) & (pl.program_id(1) == 0))
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.sum(x_ref[...].reshape(block_rows // SUBLANES, SUBLANES, STREAM_COLUMNS), axis=0)

    block_bytes = block_rows * ROW_BYTES
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((SUBLANES, STREAM_COLUMNS), jnp.int32),
        grid=(passes, rows // block_rows),
        in_specs=[pl.BlockSpec((block_rows, STREAM_COLUMNS), lambda p, i: (i, 0))],
        out_specs=pl.BlockSpec((SUBLANES, STREAM_COLUMNS), lambda p, i: (0, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary", "arbitrary"),
                                             vmem_limit_bytes=vmem_limit_bytes(block_bytes)),
        interpret=interpret,
    )(x)


def stream_column_sums(x, block_rows: int, *, passes: int = 1, interpret: bool = False):
    """uint32 [STREAM_COLUMNS]: passes x each column's sum over every row of `x`, wrapping (`stream_sum` then a sum
    over its 8 rows, 32 KiB). Same arguments and errors as `stream_sum`; call it under `jax.jit`."""
    import jax
    import jax.numpy as jnp

    partial = jax.lax.bitcast_convert_type(stream_sum(x, block_rows, passes=passes, interpret=interpret), jnp.uint32)
    return jnp.sum(partial, axis=0, dtype=jnp.uint32)
