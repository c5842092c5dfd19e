"""Whether a sweep's configuration fits the live device, before a weight loads (docs/method.md, "Where a model
fits"): the weights as the engine will place them plus the KV cache of the sweep's largest cell, against the
device's memory less the reserve. The same arithmetic and line as `bench checkpoint inspect`'s fit table
(`bench.runs.devices.fit_line`); after loading, the engine checks every batch again (`Engine.check_batch`), then
with the weights it actually placed (and, on CPU, the transposed copy batched steps read).
"""

from __future__ import annotations

from collections.abc import Sequence

from model.accounting import NATURAL, TPU_LAYOUT, BatchMemory
from model.config import ModelConfig
from model.errors import EngineError

from bench.runs.devices import fit_line


def sweep_memory(cfg: ModelConfig, cells: Sequence[tuple[int, int]], max_new_tokens: int, *, weight_itemsize: int,
                 kv_itemsize: int, scale_itemsize: int, quant, capacity: int, where: str, max_length: int | None = None,
                 buckets: Sequence[int] | None = None, mesh=None,
                 layout: str = NATURAL) -> tuple[BatchMemory, int]:  # fmt: skip
    """(`BatchMemory`, input tokens) of the cell of `cells` ((input tokens, batch) pairs) that needs the most memory:
    `model.accounting.weight_bytes` at `weight_itemsize` / `scale_itemsize` under `quant` (a
    `model.quantspec.QuantSpec`), as placed in `layout` (`model.accounting.placement_layout`), plus batch rows of
    KV cache of (the cell's bucket + `max_new_tokens`) positions at
    `kv_itemsize` (`model.accounting.kv_cache_bytes`), against `capacity` bytes (`where`: which figure). The buckets
    are the engine's (`model.limits.prompt_limits` with `max_length` / `buckets`). Raises EngineError for a size
    no bucket holds (as the engine would). `mesh` (a `model.placement.Mesh`, None: one device): per device, the
    largest device's weights and its share of each row's cache (`model.placement.device_share`), against one
    device's `capacity`, which the mesh's devices share where it is the host's (`BatchMemory.sharing`)."""
    from model.accounting import kv_cache_bytes, weight_bytes
    from model.limits import prompt_limits

    limits = prompt_limits(cfg.max_position_embeddings, max_length=max_length, buckets=buckets)
    weights = weight_bytes(cfg, weight_itemsize, scale_itemsize=scale_itemsize, quant=quant, layout=layout)
    worst = None
    for n, b in cells:
        cache_len = limits.check_request(n, max_new_tokens) + max_new_tokens
        row = kv_cache_bytes(cfg, cache_len, kv_itemsize)
        mem = BatchMemory(batch=b, cache_len=cache_len, weight_bytes=weights, kv_bytes_per_row=row, capacity=capacity,
                          where=where)  # fmt: skip
        if mesh is not None:
            mem = _per_device(mem, cfg, mesh, weight_itemsize, kv_itemsize, scale_itemsize, quant, layout)
        if worst is None or mem.needed > worst[0].needed:
            worst = (mem, n)
    assert worst is not None, "a sweep has at least one cell"
    return worst


def _per_device(mem: BatchMemory, cfg: ModelConfig, mesh, weight_itemsize: int, kv_itemsize: int,
                scale_itemsize: int, quant, layout: str) -> BatchMemory:  # fmt: skip
    """`mem` per device of `mesh` (`model.placement.device_share` at its cache length); where the capacity is the
    host's, the mesh's devices on this host share it (`local_mesh_devices`)."""
    import dataclasses

    from model.placement import device_share

    share = device_share(cfg, mesh, itemsize=weight_itemsize, context=mem.cache_len, scale_itemsize=scale_itemsize,
                         quant=quant, kv_itemsize=kv_itemsize, layout=layout)  # fmt: skip
    sharing = local_mesh_devices(mesh.size) if "host" in mem.where else 1
    return dataclasses.replace(mem, weight_bytes=share.weight_bytes, kv_bytes_per_row=share.kv_bytes_per_row,
                               mesh=mesh.text, sharing=sharing)  # fmt: skip


def local_mesh_devices(size: int) -> int:
    """How many of a mesh's `size` devices (the first `size` of `jax.devices()`, as `model.sharding.make_layout`
    takes them) are this process's: `size` in one process; under jax.distributed those of this host (at least 1),
    whose memory they share."""
    import jax

    if jax.process_count() == 1:
        return size
    return max(1, sum(d.process_index == jax.process_index() for d in jax.devices()[:size]))


def check_sweep_fits(cfg: ModelConfig | None, cells: Sequence[tuple[int, int]], max_new_tokens: int, *,
                     dtype: str | None = None, weight_dtype: str | None = None, quant: str | None = None,
                     scale_dtype: str | None = None, max_length: int | None = None,
                     buckets: Sequence[int] | None = None,
                     capacity: tuple[int, str] | None = None, mesh=None, kernel: str | None = None,
                     platform: str | None = None) -> BatchMemory | None:  # fmt: skip
    """`sweep_memory` of a sweep's flags on the live device, before anything loads: the dtype policy the engine
    will take (`model.policy.decide_policy` with `--dtype` / `--weight-dtype`), `--quant` / `--scale-dtype` (texts,
    already checked), the device's memory (`model.engine.memory_capacity`: `bytes_limit`, else the host's available
    memory; `capacity` = (bytes, where) replaces it), per device under `mesh` (`sweep_memory`), the weights as
    placed on the live device's `platform` (default: jax's first local device's; `model.accounting.
    placement_layout` with the `--kernel` choice `kernel`: on a TPU with w4, the experts in the kernel's layout).
    Returns None when the config cannot be read before loading
    (`cfg` None: a repo id; the engine checks after the load). Raises EngineError, one line with the arithmetic
    and the fixes, when the largest cell does not fit."""
    if cfg is None:
        return None
    import numpy as np

    from model.accounting import placement_layout
    from model.policy import DTYPES, decide_policy
    from model.quantspec import parse_quant

    policy = decide_policy(dtype, weight_dtype=weight_dtype)
    if capacity is None:
        from model.engine import memory_capacity

        capacity = memory_capacity(0)  # nothing is loaded yet: on a host, its available memory alone
        if "MemAvailable" in capacity[1]:
            capacity = (capacity[0], "of host memory (MemAvailable; nothing loaded yet)")
    size = {name: np.dtype(DTYPES[name]).itemsize for name in (policy.weight_dtype, policy.kv_dtype,
                                                               scale_dtype or "bfloat16")}  # fmt: skip
    spec = parse_quant(quant)
    if platform is None:
        import jax

        platform = jax.local_devices()[0].platform
    layout = placement_layout(platform, spec, kernel)
    mem, n = sweep_memory(cfg, cells, max_new_tokens, weight_itemsize=size[policy.weight_dtype],
                          kv_itemsize=size[policy.kv_dtype], scale_itemsize=size[scale_dtype or "bfloat16"],
                          quant=spec, capacity=capacity[0], where=capacity[1], max_length=max_length,
                          buckets=buckets, mesh=mesh, layout=layout)  # fmt: skip
    if not mem.fits:
        placed = ", w4 projections in the TPU kernel's layout" if layout == TPU_LAYOUT else ""
        rows = (f"at most {mem.largest_batch} rows fit at this length: lower --batch, --inputs or --max-new-tokens"
                if mem.largest_batch else "not even one row fits at this length: lower --inputs or --max-new-tokens, "
                "pick a lighter --quant (w8, w4, int8_lm_head) or a device with more memory")  # fmt: skip
        raise EngineError(f"this sweep does not fit the device: its largest cell ({n} input tokens, batch "
                          f"{mem.batch}; weights {policy.weight_dtype}, quant {spec.canonical}{placed}) needs "
                          f"{fit_line(mem)}; "
                          f"{rows} (bench checkpoint inspect --quant SET lists the devices it fits)")  # fmt: skip
    return mem
