"""How a prepared GPU run (`bench/gpurun/main.py`) ends: its exit code, the summary it prints last, and the packing of
its output folder into the few flat files the device tool brings back.

Like `bench/gpurun/main.py`, this module's top level imports only the standard library; `bench.runs` and
`bench.profile.analysis` are imported inside `summary_lines`.
"""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.gpurun.steps import Context

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BUDGET = 0, 1, 2, 3
"""0 every planned step ran to the end; 1 a step failed; 2 a usage error or a missing package (nothing was run);
3 the budget stopped or skipped a step (the run folders are valid, possibly incomplete)."""
PACK_FILE_LIMIT = 15 * 2**20  # the device tool brings back files of at most 16 MiB, 8 files in all
PACK_MAX_FILES = 8


def summary_lines(ctx: Context, code: int) -> list[str]:
    """The summary of the run ending with exit code `code`, as lines: a blank line, a title, the device and policy
    lines, the steps with their status and seconds (and notes), the bandwidth lines, then per run folder its
    status, checkpoint, compile-cache hits, validity, sweep table (the terminal's columns,
    `bench.runs.columns.table_columns`, as plain text; a `--batch` sweep's knee per input size and the table's
    footnotes, `table_notes` with the run's roofline ceiling: a share above 100% is a finding, under it) and
    profile (with its batch when above 1). The last line is the exit line
    ("gpu-run: exit N (...)"). A run folder that cannot be read is one line saying why; never raises for one."""
    from bench.runs import open_run, validate_run
    from bench.runs.ceiling import ceiling_of
    from bench.runs.columns import plain_table, table_columns, table_notes

    out = ["", "==== gpu-run summary ====", ctx.device_line or "device: (probe did not finish)",
           ctx.policy_line or "device policy: (unknown)"]  # fmt: skip
    out.append("steps: " + " | ".join(f"{s.name} {s.status} {s.seconds:.0f}s" for s in ctx.steps))
    for s in ctx.steps:
        if s.status not in ("ok",) and s.note:
            out.append(f"  {s.name}: {s.note}")
    out += ctx.bandwidth_lines or ["bandwidth: not measured"]
    for path in ctx.runs:
        problems = validate_run(path)
        try:
            run = open_run(path)
        except Exception as exc:  # noqa: BLE001
            out.append(f"run {path.name}: unreadable ({exc})")
            continue
        ran = run.typed_manifest
        out.append(f"run {path.name}: status {run.status}; checkpoint {ran.checkpoint.id}; compile cache hits "
                   f"{ran.compile_cache.hits} misses {ran.compile_cache.misses}; "
                   f"{'valid' if not problems else 'INVALID: ' + problems[0]}")  # fmt: skip
        cells = run.cells()
        if cells:
            out += plain_table(table_columns(cells), cells, indent="  ")
            out += _knee_lines(cells)
            notes = table_notes(table_columns(cells), cells, ceiling=ceiling_of(ran.extra))
            out += [f"  {line}" for line in notes]
        else:
            out.append("  no finished sweep cells")
        try:
            prof = run.profile()
        except Exception as exc:  # noqa: BLE001
            prof, _ = None, out.append(f"  profile: unreadable ({exc})")
        if prof is not None:
            from bench.profile.analysis import format_profile_table

            rows = format_profile_table(prof)
            rows_b = (prof.get("config") or {}).get("batch") or 1
            at = f", batch {rows_b}" if rows_b > 1 else ""
            out.append(f"  profile ({prof.get('steps')} steps{at}, {prof['totals']['ms_per_step']:.3f} ms/step device): "
                       + "; ".join(f"{k} {v}" for k, v in rows))  # fmt: skip
            cats = sorted(((n, c["pct"]) for n, c in prof["categories"].items() if c.get("pct")), key=lambda x: -x[1])
            out.append("  device time: " + ", ".join(f"{n} {p:.1f}%" for n, p in cats[:6]))
        else:
            out.append("  profile: none")
    meaning = {EXIT_OK: "every step ran to the end", EXIT_BUDGET: "the budget stopped or skipped a step",
               EXIT_FAILED: "a step failed"}.get(code, "")  # fmt: skip
    out.append(f"gpu-run: exit {code} ({meaning}); {ctx.elapsed():.0f} s of a {ctx.budget:.0f} s budget; "
               f"output in {ctx.outdir}")  # fmt: skip
    return out


def _knee_lines(cells) -> list[str]:
    """Under a `--batch` sweep's table: the knee per input size (`bench.measure.batches.knees`); [] otherwise."""
    from bench.measure.batches import KNEE_FRACTION, knees

    return [f"  knee (step > {1 + KNEE_FRACTION:g} x B = 1's): {k.line}" for k in knees(cells)]


def exit_code(ctx: Context) -> int:
    """The run's exit code from its steps: EXIT_FAILED when one failed, else EXIT_BUDGET when one was interrupted,
    killed, skipped or stopped, else EXIT_OK."""
    statuses = {s.status for s in ctx.steps}
    if "failed" in statuses:
        return EXIT_FAILED
    if statuses & {"interrupted", "killed", "skipped", "stopped"}:
        return EXIT_BUDGET
    return EXIT_OK


def pack(ctx: Context, dest: Path) -> list[str]:
    """Archive OUTDIR's results into `dest` as at most 8 flat files of at most 15 MiB (the device tool's limits):
    summary.txt and gpu-run.log first, then results.tar.gz (run folders without traces, logs), traces.tar.gz,
    xla-cache.tar.gz; an archive over 15 MiB is split into .partNN files. What does not fit is named.

    Returns the notes for the log (an archive split, or left out in OUTDIR). Raises OSError when a file cannot be
    read or written (the caller logs it)."""
    dest.mkdir(parents=True, exist_ok=True)
    notes, files = [], 0
    for name in ("summary.txt", "gpu-run.log"):
        shutil.copy2(ctx.outdir / name, dest / name)
        files += 1
    runs = ctx.outdir / "runs"
    groups = [
        ("results.tar.gz", [(p, p.relative_to(ctx.outdir)) for p in [runs, ctx.outdir / "logs"] if p.exists()],
         _trace_filter),
        ("traces.tar.gz", [(p / "profile", p.relative_to(ctx.outdir) / "profile") for p in ctx.runs
                           if (p / "profile").exists()], None),
        ("xla-cache.tar.gz", [(ctx.outdir / "xla-cache", Path("xla-cache"))] if (ctx.outdir / "xla-cache").exists()
         else [], None),
    ]  # fmt: skip
    for name, members, filt in groups:
        if not members:
            continue
        tmp = ctx.outdir / f".{name}"
        with tarfile.open(tmp, "w:gz") as tar:
            for src, arc in members:
                tar.add(src, arcname=str(arc), filter=filt)
        size = tmp.stat().st_size
        parts = max(1, -(-size // PACK_FILE_LIMIT))
        if files + parts > PACK_MAX_FILES:
            notes.append(f"pack: {name} ({size / 2**20:.1f} MiB, {parts} part(s)) left out: the 8-file limit; "
                         f"it stays in {tmp}")  # fmt: skip
            continue
        if parts == 1:
            shutil.move(tmp, dest / name)
        else:
            with open(tmp, "rb") as fh:
                for i in range(parts):
                    (dest / f"{name}.part{i:02d}").write_bytes(fh.read(PACK_FILE_LIMIT))
            tmp.unlink()
            notes.append(f"pack: {name} split into {parts} parts; join with `cat {name}.part* > {name}`")
        files += parts
    return notes


def _trace_filter(info):
    """results.tar.gz leaves out the xprof traces (<run>/profile/...): they travel in traces.tar.gz."""
    parts = info.name.split("/")
    return None if len(parts) >= 4 and parts[0] == "runs" and parts[2] == "profile" else info
