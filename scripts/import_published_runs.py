"""Turn the published T4G and L4 figures into two run folders (provenance: published) that `bench report` reads.

Usage: python scripts/import_published_runs.py PATH/published-2026-08.json [--runs-dir runs] [--force]

Input: the figures file of the report "Gemma 4 in Pure JAX: What Changes Between Turing and Ada" (in this
project: ../shared/reference-runs/published-2026-08.json). Output, for each of its runs, `runs/<name>/`:
- manifest.json: provenance {"kind": "published", "source": ...}, status complete, everything the report gives
  (chip, compute capability, memory, host, compute dtype, jax version, build id, checkpoint id, weight bytes,
  layout) and null for everything it does not (times, command line, git, checkpoint hash, buckets, ...);
- cells.jsonl / cells.csv: one row per published input size (median gauge and end-to-end tok/s as published,
  null where the report gives none; no min/max, no TTFT, no samples: the report published none);
- profile.json: the published profile figures, plus a `roofline.derived` block (labelled derived) recomputed
  from the bytes a decode step actually reads (bench/profile/roofline.py) at the report's nominal peak bandwidth;
- published-source.json: a verbatim copy of the input file, so the folder is self-describing;
- run.log: what made the folder.
No samples.jsonl is written. The output is deterministic (no timestamps), so re-running gives identical files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.errors import BenchError, InputError, RunFolderError  # noqa: E402
from bench.profile.roofline import (  # noqa: E402
    PLE4_INT8_LM_HEAD,
    decode_step_bytes,
    kv_cache_bytes,
    roofline_share_pct,
)
from bench.runs import LOG, RunFolder, create_run, open_run  # noqa: E402
from bench.runs.records import CellRow  # noqa: E402
from model.config import E2B  # noqa: E402

SOURCE_TITLE = "Gemma 4 in Pure JAX: What Changes Between Turing and Ada, and What Doesn't"
SOURCE_COPY = "published-source.json"
MIB = 2**20


def _cells(run: dict[str, Any], common: dict[str, Any]) -> list[CellRow]:
    sweep = common.get("sweep", {})
    rows = []
    for cell in run["sweep"]:
        gauge, e2e = cell.get("gauge_tok_s"), cell.get("e2e_tok_s")
        published = gauge is not None or e2e is not None
        rows.append(CellRow(
            input_tokens=cell["input_tokens"], bucket=None, max_new_tokens=sweep.get("output_tokens"),
            repeats=sweep.get("repeats_per_cell"), valid=published,
            invalid_reason=None if published else "no figure published for this cell",
            status="ok", error=None,
            gauge_tok_s_median=gauge, gauge_tok_s_min=None, gauge_tok_s_max=None,
            e2e_tok_s_median=e2e, e2e_tok_s_min=None, e2e_tok_s_max=None,
            ttft_ms_median=None, ttft_ms_min=None, ttft_ms_max=None, prefill_ms_median=None, tpot_ms_median=None,
            step_ms_median=None, step_ms_p99=None, cold_request_s=None, cold_ttft_ms=None,
            cold_warm_request_ratio=None, cold_warm_ttft_ratio=None, compile_events_timed=None, degenerate=None,
            generated_tokens_per_repeat=[],
        ))  # fmt: skip
    return rows


def _profile(run: dict[str, Any], common: dict[str, Any], source: str) -> dict[str, Any]:
    prof = run["profile"]
    fp32 = prof.get("fp32_gemv_pct")
    fp32_absent = fp32 is None and prof.get("fp32_gemv_note") == "absent"
    approx = "bandwidth_roofline_share_pct_approx" in prof
    share = prof.get("bandwidth_roofline_share_pct_approx" if approx else "bandwidth_roofline_share_pct")
    gauge, bandwidth = prof.get("decode_gauge_tok_s"), prof.get("peak_hbm_bandwidth_gib_s")
    account = decode_step_bytes(E2B, PLE4_INT8_LM_HEAD)
    if account.layout != common.get("config"):
        raise InputError(f"layout {common.get('config')!r} has no byte accounting here (expected {account.layout!r})")
    derived = None
    if gauge is not None and bandwidth:
        derived = {
            "label": "derived (not published)",
            "share_pct": roofline_share_pct(account.total, gauge, bandwidth),
            "bytes_per_step": account.total,
            "tok_s": gauge,
            "bandwidth_gib_s": bandwidth,
            "method": (
                "bytes one decode step reads for google/gemma-4-E2B-it in the 'ple4 + int8_lm_head' layout "
                "(bench/profile/roofline.py: body at 16 bits, one input-embedding row, one 4-bit PLE row + scales, the "
                "int8 lm_head + scales) x published decode gauge / published nominal peak bandwidth; the KV cache "
                "is left out because the report does not give the profiled context length"
            ),
            "kv_bytes_at_4096_tokens": kv_cache_bytes(E2B, PLE4_INT8_LM_HEAD, 4096),
            "account": account.to_dict(),
        }
    return {
        "schema_version": 1,
        "provenance": {"kind": "published", "source": source},
        "tool": common.get("profile", {}).get("tool"),
        "steps": common.get("profile", {}).get("decode_steps"),
        "device_kind": run.get("chip"),
        "categories": {
            "dtype_conversion": {"pct": prof.get("dtype_conversion_pct"), "ms": None},
            "matmul_fp32": {"pct": fp32, "ms": None, **({"absent": True} if fp32_absent else {})},
            "tensor_core": {"pct": prof.get("tensor_core_pct"), "ms": None},
        },
        "totals": {
            "device_ms": prof.get("total_kernel_time_ms"),
            "distinct_kernels": prof.get("distinct_kernels"),
            "decode_tok_s": gauge,
            "steps": common.get("profile", {}).get("decode_steps"),
            "reproduced_device_ms": prof.get("reproduced_total_kernel_time_ms"),
        },
        "roofline": {
            "bytes_per_step": common.get("weight_bytes"),
            "bytes_basis": "all weight bytes, as the report counted them",
            "bandwidth_gib_s": bandwidth,
            "bandwidth_kind": "nominal peak (datasheet), not measured",
            "share_pct": share,
            "share_approx": approx,
            "derived": derived,
        },
    }


def _manifest(run: dict[str, Any], common: dict[str, Any], source: str) -> dict[str, Any]:
    memory = run.get("device_memory_mib")
    return {
        "schema_version": 1,  # the archived published folders are schema 1 (checkpoint.path null), recreated as such
        "provenance": {"kind": "published", "source": source},
        "started_at": None,
        "command_line": None,
        "build_id": common.get("build_id"),
        "git": {"commit": None, "dirty": None},
        "versions": {"python": run.get("python"), "jax": common.get("jax_version")},
        "device": {
            "platform": "gpu", "device_kind": run.get("chip"), "count": None,
            "memory_bytes": memory * MIB if memory is not None else None, "memory_mib": memory,
            "compute_capability": run.get("compute_capability"), "architecture": run.get("architecture"),
            "driver_version": None, "cuda": run.get("cuda"),
        },  # fmt: skip
        "host": {"description": run.get("host"), "arch": run.get("host_arch"), "cpu_model": None,
                 "logical_cpus": None, "memory_bytes": None},  # fmt: skip
        "dtype_policy": {"compute_dtype": run.get("compute_dtype"), "weights": None, "activations": None,
                         "kv_cache": None},  # fmt: skip
        "checkpoint": {"id": common.get("checkpoint"), "path": None, "content_hash": None,
                       "weight_bytes": common.get("weight_bytes")},  # fmt: skip
        "engine_config": {"layout": common.get("config"), "max_model_len": run.get("max_model_len")},
        "compile_cache": {"dir": None, "hits": None, "misses": None},
        "sweep": {
            **common.get("sweep", {}),
            "gauge_definition": common.get("gauge_definition"),
            "end_to_end_definition": common.get("end_to_end_definition"),
        },
        "validity_note": "cells are valid as published: the report quotes them as results; compile events, token "
        "counts and degeneracy were not published and cannot be checked here",
    }


def import_published(source_path: str | Path, runs_dir: str | Path = "runs", *, force: bool = False) -> list[RunFolder]:
    """Write one published run folder per entry of the figures file. Returns the folders.

    Raises InputError for a file that is missing or not the expected JSON, RunFolderError when a folder exists
    (unless `force`, which replaces existing published folders only, never a measured one).
    """
    src = Path(source_path)
    try:
        raw = src.read_bytes()
        data = json.loads(raw)
        common, runs = data["common"], data["runs"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise InputError(f"{src}: not a published figures file ({exc})") from None
    source = f"{SOURCE_TITLE} (measurement report, figures as copied in {SOURCE_COPY})"
    sha = hashlib.sha256(raw).hexdigest()
    out = []
    for run in runs:
        date, rest = run["name"][:10], run["name"][11:]
        label, slug = rest.rsplit("-", 1)
        path = Path(runs_dir) / run["name"]
        if path.exists() and force:
            if open_run(path).provenance != "published":
                raise RunFolderError(f"{path}: exists and is a measured run; --force replaces published runs only")
            shutil.rmtree(path)
        folder = create_run(runs_dir, label, slug, _manifest(run, common, source), date=date)
        for row in _cells(run, common):
            folder.append_cell(row)
        folder.write_json("profile.json", _profile(run, common, source))
        (folder.path / SOURCE_COPY).write_bytes(raw)
        folder.finish("complete")
        (folder.path / LOG).write_text(
            f"imported by scripts/import_published_runs.py from a figures file with sha256 {sha}, copied verbatim "
            f"to {SOURCE_COPY}\nprovenance: published ({source}); no raw samples exist for this run\n"
        )
        out.append(folder)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="the figures JSON, e.g. ../shared/reference-runs/published-2026-08.json")
    parser.add_argument("--runs-dir", default="runs", help="where to write the run folders (default: runs)")
    parser.add_argument("--force", action="store_true", help="replace existing published folders of the same names")
    args = parser.parse_args(argv)
    try:
        folders = import_published(args.source, args.runs_dir, force=args.force)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for folder in folders:
        print(f"wrote {folder.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
