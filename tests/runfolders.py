"""Synthetic measured run folders for the run-folder, report and compare tests (no engine, no jax).

Every number is consistent with docs/method.md: gauge = (n - 1) / decode time, end-to-end = n / e2e time,
TPOT = (e2e - TTFT) / (n - 1); the timed repeats vary by a small, fixed jitter so medians sit inside min..max.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.runs import RunFolder, Sample, create_run, summarize_cell

REPO = Path(__file__).resolve().parents[1]
REFERENCE_RUNS = (REPO / "runs" / "2026-08-28-full-run-cached-g5g", REPO / "runs" / "2026-08-28-first-serve-g6")
MAX_NEW = 8


def make_sample(
    input_tokens: int, kind: str = "timed", repeat: int = 0, *, gauge: float = 20.0, ttft_ms: float = 50.0,
    token_ids: Sequence[int] | None = None, compile_events: int = 0, degenerate: bool | None = False,
    n: int = MAX_NEW,
) -> Sample:  # fmt: skip
    """One request of `n` generated tokens decoding at `gauge` tok/s after a first token at `ttft_ms`."""
    ids = list(token_ids) if token_ids is not None else [(input_tokens * 7 + 13 * i) % 1000 + 3 for i in range(n)]
    n = len(ids)
    decode_ms = (n - 1) / gauge * 1000.0
    e2e_ms = ttft_ms + decode_ms + 1.0  # + 1 ms of detokenization
    return Sample(
        input_tokens=input_tokens, kind=kind, repeat=repeat, ttft_ms=ttft_ms, prefill_ms=ttft_ms * 0.8,
        decode_ms=decode_ms, e2e_ms=e2e_ms, gauge_tok_s=(n - 1) / (decode_ms / 1000.0), e2e_tok_s=n / (e2e_ms / 1000.0),
        tpot_ms=(e2e_ms - ttft_ms) / (n - 1), generated_tokens=n, compile_events=compile_events,
        degenerate=degenerate, degenerate_reason="token id 5 is 8 of 8 tokens" if degenerate else None,
        step_ms=[1000.0 / gauge] * (n - 1), token_ids=ids,
    )  # fmt: skip


def cell_samples(input_tokens: int, *, gauge: float = 20.0, repeats: int = 3, cold: bool = False,
                 token_ids: Sequence[int] | None = None, **kwargs) -> list[Sample]:  # fmt: skip
    """Warm-up plus `repeats` timed requests (gauge jittered by -1%, 0, +1%, ...), optionally a cold one first."""
    ttft = 60.0 + input_tokens / 10.0  # at least one decode step (50 ms at 20 tok/s), as prefill is
    out = []
    if cold:  # the fresh engine's first request: slow first token, slow decode
        out.append(make_sample(input_tokens, "cold", 0, gauge=gauge / 2, ttft_ms=ttft * 30, token_ids=token_ids))
    out.append(make_sample(input_tokens, "warmup", 0, gauge=gauge, ttft_ms=ttft, token_ids=token_ids))
    jitter = [0.99, 1.0, 1.01, 0.995, 1.005]
    for r in range(repeats):
        out.append(make_sample(input_tokens, "timed", r, gauge=gauge * jitter[r % 5], ttft_ms=ttft * jitter[r % 5],
                               token_ids=token_ids, **kwargs))  # fmt: skip
    return out


def manifest(*, build_id: str = "0123456789ab", content_hash: str = "sha256:feed", weight_bytes: int = 1000,
             config: dict | None = None, jax: str = "0.12.0", device_kind: str = "cpu",
             checkpoint_id: str = "default-bfloat16-seed0-v1", dtype: str = "float32") -> dict:  # fmt: skip
    """A complete measured-run manifest with the given payload identity (`dtype`: weights, compute and KV cache)."""
    return {
        "command_line": ["bench", "sweep", "--inputs", "41,521"],
        "build_id": build_id,
        "git": {"commit": "a" * 40, "dirty": False},
        "versions": {"python": "3.12.3", "jax": jax, "jaxlib": jax},
        "device": {"platform": "cpu", "device_kind": device_kind, "count": 1, "memory_bytes": None,
                   "compute_capability": None},  # fmt: skip
        "host": {"cpu_model": "Test CPU", "logical_cpus": 2, "arch": "x86_64", "memory_bytes": 8 * 2**30},
        "dtype_policy": {"compute_dtype": dtype, "weights": dtype, "activations": dtype, "kv_cache": dtype},
        "checkpoint": {"id": checkpoint_id, "source": "builtin:default", "content_hash": content_hash,
                       "weight_bytes": weight_bytes},  # fmt: skip
        "engine_config": config if config is not None else {"buckets": [64, 512, 2048, 4096], "max_length": 4160},
        "compile_cache": {"dir": "/cache/xla", "hits": 3, "misses": 1},
    }


def make_measured_run(
    runs_dir: Path, label: str, *, inputs: Sequence[int] = (41, 521), gauge: float | Callable[[int], float] = 20.0,
    status: str = "complete", token_ids: Callable[[int], Sequence[int]] | None = None, cell_kwargs: dict | None = None,
    date: str = "2026-11-30", slug: str = "cpu", started_at: str | None = None,
    stopped: dict[int, tuple[str, int]] | None = None, **manifest_kwargs,
) -> RunFolder:  # fmt: skip
    """A measured run folder with one cell per input size (cold request in the first cell), finished as `status`.
    `date` names the folder (`slug` the device in its name); `started_at` (ISO) replaces the start time;
    `stopped` {input size: (stopped_by, repeats planned)} makes those cells partial (3 timed repeats)."""
    given = manifest(**manifest_kwargs)
    if started_at is not None:
        given["started_at"] = started_at
    run = create_run(runs_dir, label, slug, given, date=date)
    for i, n in enumerate(inputs):
        g = gauge(n) if callable(gauge) else gauge
        samples = cell_samples(n, gauge=g, cold=i == 0, token_ids=token_ids(n) if token_ids else None,
                               **(cell_kwargs or {}).get(n, {}))  # fmt: skip
        run.append_samples(samples)
        stop_by, planned = (stopped or {}).get(n, (None, None))
        run.append_cell(summarize_cell(samples, max_new_tokens=MAX_NEW, bucket=64 if n < 64 else 1024,
                                       stopped_by=stop_by, repeats_planned=planned))  # fmt: skip
    if status != "running":
        run.finish(status)
    return run


def published_figures(folder: Path) -> dict:
    """The published record of the run in `folder`, from its verbatim copy of the source file."""
    data = json.loads((folder / "published-source.json").read_text())
    return next(r for r in data["runs"] if r["name"] == folder.name)
