"""Findings: the ops of a profile that a reader should look at first, named by rule (docs/profile.md, "Findings").

Pure functions of profile.json's per-op rows (`bench.profile.analysis.OpRow.to_json()`): no jax, no trace reading,
so `bench profile` and the report (`make report`) apply the same rules to the same numbers. Two rules over ops:

1. **bytes share**: an op that moves (reads + writes) more than `OP_BYTES_SHARE` of the step's bytes per step.
   The step's bytes are the engine's bytes per decode step (the roofline's, docs/method.md, "Rooflines") when the
   profile has a roofline, else the sum of the traced ops' bytes per step; the finding says which.
2. **parameter rewrite**: an op inside the profiled program that copies, transposes, lays out anew or converts a
   parameter of the program (a weight, as the engine passes its weights) of at least `PARAM_MIN_SHARE` of the
   step's bytes, every step it runs (`bench.profile.hloops.parameter_rewrite` says which ops count and which do not).

The published report found its dtype-conversion tax by reading the profile by hand; the TPU v5e's PLE relayout
(`copy.191`, `u8[262144,4480]` from tiling T(32,128) to T(8,128): 3.57 ms of a 9.3 ms step) was found the same way.
Both are what these rules name.

And one over the profile's shares (`share_findings`): a roofline share above 100% of its denominator is a finding
with the probe's numbers (docs/method.md, "Rooflines"), whether the profile recorded it (`roofline_findings`, since
the read-rate ceiling) or is older and only holds the share (a profile that divided by the device copy).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

OP_BYTES_SHARE = 0.25
"""Rule 1's share of the step's bytes. The largest single weight of the configurations this harness measures is
E2B's tied 262144 x 1536 bfloat16 embedding, read as the LM head: 0.805 GB, 17.6% of dense decode's 4.565 GB per
step (issue 43's table); every other weight, and each layer's KV cache, is smaller. An op moving more than a quarter
of the step moves more than any one weight read once, so it rewrites or re-reads data: the PLE relayout `copy.191`
moved 2 x 1.17 GB, 56% of its step's 4.163 GB."""

PARAM_MIN_SHARE = 0.001
"""Rule 2 leaves out parameters under 0.1% of the step's bytes (a norm's scale, a position, a token): rewriting one
costs at most 0.2% of the step's traffic (read + written), noise beside the step's weights. Relative, so that it
keeps every weight matrix in at every model size: E2B's 4.565 GB step puts the line at 4.6 MB (its matrices are
larger, a norm's 1536 bfloat16 scales far smaller), the `tiny` preset's weights of 8-32 KiB each lie above it."""

MAX_LISTED = 10
"""Findings printed one by one (by `bench profile` and in the report) before the rest are summed up in one line;
profile.json keeps them all."""

RULES = {"op_bytes_share": OP_BYTES_SHARE, "param_min_share": PARAM_MIN_SHARE}
"""The thresholds in force, stored beside the findings in profile.json (`findings_rules`)."""


def profile_findings(ops: Sequence[Mapping[str, Any]], *, steps: int, step_bytes: float | None = None,
                     step_bytes_source: str = "") -> list[dict[str, Any]]:  # fmt: skip
    """The findings over `ops` (every per-op row of a profile, as dicts with `name`, `hlo_module`, `category`,
    `total_ms`, `pct` (% of device time), `hlo`, `bytes_per_step`, `bytes_source`, `param_rewrite`), largest bytes
    per step first; one finding per op, listing each rule it meets.

    steps: traced steps (ms per step = total_ms / steps). step_bytes: the step's bytes for rule 1, with
    `step_bytes_source` saying what they are; when None, the sum of the rows' known bytes per step ("the traced
    ops"). Rows without bytes_per_step (no bytes stat and no shapes: control flow) meet rule 1 never.
    Each finding: {"rules": ["bytes share" | "parameter rewrite", ...], "op", "module", "category", "hlo",
    "bytes_per_step", "bytes_source", "step_bytes", "step_bytes_source", "share_of_step_bytes" (a fraction),
    "ms_per_step", "pct_time", "rewrite" (the row's `param_rewrite` or None)}. Raises ValueError for steps < 1.
    """
    if steps < 1:
        raise ValueError(f"steps {steps}: expected >= 1")
    if step_bytes is None:
        step_bytes = sum(row.get("bytes_per_step") or 0 for row in ops)
        step_bytes_source = "the sum of the traced ops' bytes per step"
    found = []
    for row in ops:
        moved = row.get("bytes_per_step")
        share = moved / step_bytes if moved is not None and step_bytes else None
        rules = []
        if share is not None and share > OP_BYTES_SHARE:
            rules.append("bytes share")
        rewrite = row.get("param_rewrite")
        if rewrite and step_bytes and (rewrite.get("parameter_bytes") or 0) >= PARAM_MIN_SHARE * step_bytes:
            rules.append("parameter rewrite")
        if not rules:
            continue
        found.append({
            "rules": rules, "op": row.get("hlo_op") or row.get("name"), "module": row.get("hlo_module", ""),
            "category": row.get("category", ""), "hlo": row.get("hlo", ""), "bytes_per_step": moved,
            "bytes_source": row.get("bytes_source", ""), "step_bytes": step_bytes or None,
            "step_bytes_source": step_bytes_source, "share_of_step_bytes": share,
            "ms_per_step": row["total_ms"] / steps, "pct_time": row.get("pct"), "rewrite": rewrite or None,
        })  # fmt: skip
    return sorted(found, key=lambda f: (-(f["bytes_per_step"] or 0), f["op"]))


def _gb(n: float) -> str:
    return f"{n / 1e9:.3f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n:,.0f} B"


def format_finding(finding: Mapping[str, Any]) -> str:
    """One finding as one line for people: what the op does, its bytes per step (and their source), its share of
    the step's bytes and of device time, and its HLO text."""
    parts = [f"{finding['op']}" + (f" ({finding['module']})" if finding.get("module") else "")]
    rewrite = finding.get("rewrite")
    if "parameter rewrite" in finding["rules"] and rewrite:
        before, after = rewrite.get("parameter_shape", ""), rewrite.get("result_shape", "")
        parts.append(f"{rewrite['kind']} of parameter {rewrite['parameter']} ({_gb(rewrite['parameter_bytes'])}, "
                     f"{before} -> {after}) inside the profiled program, every step")  # fmt: skip
    moved = finding.get("bytes_per_step")
    if moved is not None:
        text = f"moves {_gb(moved)} per step ({finding.get('bytes_source') or 'source not recorded'})"
        if finding.get("share_of_step_bytes") is not None:
            text += (f" = {100 * finding['share_of_step_bytes']:.1f}% of the step's {_gb(finding['step_bytes'])} "
                     f"({finding['step_bytes_source']})")  # fmt: skip
            if "bytes share" in finding["rules"]:
                text += f", above the {100 * OP_BYTES_SHARE:.0f}% rule"
        parts.append(text)
    pct = finding.get("pct_time")
    parts.append(f"{finding['ms_per_step']:.3f} ms per step" + (f" = {pct:.1f}% of device time" if pct is not None else ""))
    if finding.get("hlo"):
        parts.append(f"HLO: {finding['hlo']}")
    return "; ".join(parts)


def stored_findings(profile: Mapping[str, Any]) -> list[str] | None:
    """The findings a profile.json holds, each as `format_finding`'s line, the first `MAX_LISTED` one by one and
    the rest in one line (how many, by rule, and the bytes they move per step); None for a profile written before
    findings existed (no `findings` key: "not recorded", never "none")."""
    found = profile.get("findings")
    if found is None:
        return None
    lines = [format_finding(f) for f in found[:MAX_LISTED]]
    rest = found[MAX_LISTED:]
    if rest:
        kinds = sorted({(f.get("rewrite") or {}).get("kind") or "bytes share" for f in rest})
        moved = sum(f.get("bytes_per_step") or 0 for f in rest)
        lines.append(f"and {len(rest)} more ({', '.join(kinds)}; {_gb(moved)} per step in all): profile.json's "
                     "`findings` lists every one")  # fmt: skip
    return lines


def rules_text(rules: Mapping[str, Any] | None = None) -> str:
    """The rules in words, with the thresholds `rules` gives (profile.json's `findings_rules`; default: `RULES`)."""
    rules = RULES if rules is None else rules
    share, least = rules.get("op_bytes_share"), rules.get("param_min_share")
    parts = []
    if share is not None:
        parts.append(f"an op moving more than {100 * share:.0f}% of the step's bytes per step")
    if least is not None:
        parts.append(f"a copy, transpose, layout change or dtype conversion of a parameter of at least "
                     f"{100 * least:.1f}% of the step's bytes, inside the profiled program")  # fmt: skip
    return "; ".join(parts)


def share_findings(profile: Mapping[str, Any]) -> list[str]:
    """Each share above 100% of its denominator in a profile.json, one line with the numbers behind it: the lines
    of its recorded `roofline_findings` (`bench.runs.ceiling.RooflineFinding.line`) where it has them; else, for a
    `roofline.share_pct` above 100, the step's read rate (bytes per step x the tok/s used, and that rate's source)
    against the denominator (`roofline.bandwidth_bytes_s`, else `bandwidth_gib_s`, with `bandwidth_kind`) and the
    fastest read-only probe where recorded; and a derived share (`roofline.derived.share_pct`) above 100 with its
    bytes per step. [] when no share is above 100 (or none is recorded)."""
    recorded = [f.get("line") for f in profile.get("roofline_findings") or [] if isinstance(f, Mapping)]
    if any(recorded):
        return [line for line in recorded if line]
    roof = profile.get("roofline") or {}
    out = []
    share, moved, tok_s = roof.get("share_pct"), roof.get("bytes_per_step"), roof.get("tok_s")
    denominator = roof.get("bandwidth_bytes_s") or (roof.get("bandwidth_gib_s") or 0) * 2**30 or None
    if isinstance(share, (int, float)) and share > 100:
        kind = roof.get("bandwidth_kind") or "measured (device copy)"
        text = f"finding: profile roofline share {share:.1f}% above 100% of its denominator"
        if moved and tok_s:
            source = _RATE_NAMES.get(roof.get("tok_s_source"), "a rate of unrecorded source")
            text += (f": the step read {_gb(moved)} x {tok_s:,.2f} tok/s ({source}) = "
                     f"{_gbs(moved * tok_s)}")  # fmt: skip
        if denominator:
            text += f", above the denominator {_gbs(denominator)} ({kind})"
        read = profile.get("read_bandwidth")
        if isinstance(read, Mapping) and read.get("bytes_per_s"):
            text += f"; fastest read-only probe {_gbs(read['bytes_per_s'])}"
        out.append(text + ". The denominator is slower than the step's own reads: a device copy (read + written) "
                   "or a slowed probe is no ceiling, or the step read fewer bytes than its accounting counts.")
    derived = (roof.get("derived") or {}).get("share_pct")
    if isinstance(derived, (int, float)) and derived > 100:
        b = (roof.get("derived") or {}).get("bytes_per_step")
        out.append(f"finding: derived roofline share {derived:.1f}% above 100% of its denominator"
                   + (f" (counting {_gb(b)} per step)" if b else "") + ": the step read fewer bytes than counted, "
                   "or the denominator is below the device's streaming rate.")  # fmt: skip
    return out


_RATE_NAMES = {"gauge": "the joined sweep's gauge", "profile": "the device-time rate, 1000 / device ms per step"}
"""profile.json's `roofline.tok_s_source` in words: which decode rate the share used (docs/method.md, "Profiles")."""


def _gbs(bytes_s: float) -> str:
    """"686.2 GiB/s (736.8 GB/s)"."""
    return f"{bytes_s / 2**30:,.1f} GiB/s ({bytes_s / 1e9:,.1f} GB/s)"
