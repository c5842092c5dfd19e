"""The view "quantization on <device>": the quantization sets of one session (bench/report/sessions.py) side by side.

Per session holding two or more quantization sets (a set: a quantization, with the w4 kernel option where the run
recorded one; each set's latest run with sweep cells in the session), one table, one row per (set, input size): bytes per decode step; the gauge tok/s, median (min–max); x dense (the
median gauge over the dense run's at that size: "—" without a dense run in the session); the roofline share
against the run's roofline ceiling (`bench.runs.ceiling`: max(measured read rate, datasheet figure), named under
the table); the greedy tokens' first divergence from dense, with ties told apart from errors, and the max
|Δlogit| of the next-token logits and over the steps where both runs saw the same context, against the set's
bound (bench/report/accuracy.py). Under it: the session, the ceiling, the accuracy's
numbers per divergence, each set's profile findings where the session holds a profile of that set
(`bench.profile.findings`), and each share above 100% of a denominator as a finding.

No jax, no engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.profile.findings import share_findings, stored_findings
from bench.report.accuracy import Accuracy, run_accuracy
from bench.report.document import Bullets
from bench.report.sessions import Session, sessions_of
from bench.report.tables import rate_text
from bench.report.views import Table
from bench.runs.ceiling import ceiling_of, datasheet_for
from bench.runs.columns import BYTES_PER_STEP, ROOFLINE_SHARE, fmt_num, roofline_findings
from bench.runs.manifest import w4_kernel_of

DENSE = "none"


def set_label(quantization: str, kernel: str | None, kernels_of_quantization: set[str | None]) -> str:
    """A set's name in the view: its quantization, with the w4 product's kernel option when the session holds runs of
    that quantization under two or more of them ("w4:128 (w4a16=pallas:fewest)": the option enters the build id
    too, so a tiling policy A/B gives two rows instead of the later run hiding the earlier)."""
    w4 = w4_kernel_of(kernel)
    return f"{quantization} ({w4 or 'no kernel option'})" if len(kernels_of_quantization) > 1 else quantization


def quantization_of(label: str) -> str:
    """`set_label`'s inverse for the quantization: "w4:128 (w4a16=pallas:fewest)" -> "w4:128"."""
    return label.split(" (", 1)[0]


def session_sets(session: Session, keys: dict[str, Any]) -> dict[str, tuple[Any, Any | None]]:
    """{set (`set_label`): (its latest run with sweep cells, its latest run with a profile or None)} of `session`,
    dense ("none") first, then by name; a set with a profile-only run and no sweep is left out."""
    kernels: dict[str, set[str | None]] = {}
    for v in session.views:
        if v.cells:
            kernels.setdefault(keys[v.name].quantization, set()).add(w4_kernel_of(v.run.typed_manifest.engine.kernel))
    sweeps: dict[str, Any] = {}
    profiles: dict[str, Any] = {}
    for v in session.views:  # by start time: the later replaces the earlier
        quantization, kernel = keys[v.name].quantization, v.run.typed_manifest.engine.kernel
        q = set_label(quantization, kernel, kernels.get(quantization, set()))
        if v.cells:
            sweeps[q] = v
        if v.profile is not None:
            profiles[q] = v
    order = sorted(sweeps, key=lambda q: (q != DENSE, q))
    return {q: (sweeps[q], profiles.get(q)) for q in order}


def _ratio(cell: Any, dense: Any) -> str:
    a = getattr(cell, "gauge_tok_s_median", None)
    b = getattr(dense, "gauge_tok_s_median", None)
    return "—" if not a or not b else f"{a / b:.2f}x"


def _logit_text(acc: Accuracy | None, dense_row: bool) -> str:
    if dense_row:
        return "0 (reference)"
    return "—" if acc is None or acc.max_abs_logit is None else f"{acc.max_abs_logit:.4g}"


def _step_error_text(acc: Accuracy | None, dense_row: bool) -> str:
    """The max logit error over the agreeing steps with the steps it covers and the set's bound, e.g.
    "0.21 over 41 steps (≤ 0.44)"; "—" without both runs' per-step summaries."""
    if dense_row:
        return "0 (reference)"
    if acc is None or acc.step_error is None:
        return "—"
    over = " OVER" if acc.step_error > acc.bound else ""
    return f"{acc.step_error:.4g} over {acc.step_error_steps} steps (bound {acc.bound:.4g}{over})"


def quant_session_blocks(groups: Sequence[Any]) -> list[tuple[str, list[Any]]]:
    """[(title, blocks)] per session of `groups` (`sessions_of`) with two or more quantization sets: its table and
    the bullets under it. [] when no session has two."""
    out = []
    keys = {n: k for g in groups for n, k in g.keys.items()}
    for session in sessions_of(groups):
        sets = session_sets(session, keys)
        if len(sets) < 2:
            continue
        out.append((f"Quantization on {device_names(session.device)}", _session_blocks(session, sets, keys)))
    return out


def device_names(device: str) -> str:
    """The device's chip name with the other names its datasheet entry knows it by (`bench.runs.ceiling.DATASHEETS`:
    "TPU v5 lite (TPU v5e)"), else the chip name alone."""
    sheet = datasheet_for(device)
    others = [k for k in (sheet.device_kinds if sheet else ()) if k.lower() != device.lower()]
    return f"{device} ({', '.join(others)})" if others else device


def _session_blocks(session: Session, sets: dict[str, tuple[Any, Any]], keys: dict[str, Any]) -> list[Any]:
    """The session's table (one row per set and input size, the module docstring's columns), the accuracy's numbers
    of each divergence, and each set's findings."""
    dense = sets.get(DENSE, (None, None))[0]
    dtype = keys[dense.name].compute_dtype if dense is not None else None
    rows, details = [], []
    for q, (v, _) in sets.items():
        acc = run_accuracy(v, dense, dtype, quant=quantization_of(q)) if dense is not None and v is not dense else {}
        for n in sorted(v.cells):
            c, a = v.cells[n], acc.get(n)
            rows.append([q, fmt_num(n, 0), BYTES_PER_STEP.text(c), rate_text(c, "gauge"),
                         _ratio(c, dense.cells.get(n)) if dense is not None else "—", ROOFLINE_SHARE.text(c),
                         "reference" if v is dense else a.divergence_text() if a else "—",
                         _logit_text(a, v is dense), _step_error_text(a, v is dense)])  # fmt: skip
            if a is not None and a.verdict not in ("identical",):
                details.append(f"{q}, {n:,} input tokens: {a.detail}" + (
                    f"; max |Δlogit| {a.max_abs_logit:.4g} over {a.vocab:,} logits" if a.max_abs_logit is not None
                    else ""))  # fmt: skip
    header = ["quant", "input tokens", "bytes/step", "gauge tok/s", "x dense", "roofline %", "first divergence",
              "max |Δlogit|", "steps' |Δlogit| (bound)"]  # fmt: skip
    table = Table(title=f"quantization on {session.device}: {session.describe()}", header=header, rows=rows,
                  notes=_notes(session, sets, dense, keys), kind="quant-session",
                  sources=tuple(v.name for v, _ in sets.values()))  # fmt: skip
    return [table, *(["Accuracy against dense:", Bullets(items=details)] if details else []),
            "Findings of each set (profiles of this session; shares above 100% of a denominator):",
            Bullets(items=_findings(sets))]  # fmt: skip


def _ceiling_text(sets: dict[str, tuple[Any, Any]]) -> str:
    """The roofline's denominator of each set, named: the first set's ceiling in full (`Ceiling.line`), then each
    other set's figure and which one it is."""
    ceilings = [(q, ceiling_of(v.m)) for q, (v, _) in sets.items()]
    text = ("roofline % = bytes/step x gauge tok/s / the run's roofline ceiling (bench/runs/ceiling.py: "
            "max(measured read rate, datasheet figure), or the device copy for a run recorded before it); ")
    first_q, first = ceilings[0]
    text += f"{first_q}: {'none recorded' if first is None else first.line}"
    for q, c in ceilings[1:]:
        text += f"; {q}: " + ("none recorded" if c is None else f"{c.bytes_per_s / 2**30:,.1f} GiB/s = {c.chosen}")
    return text + "."


def _notes(session: Session, sets: dict[str, tuple[Any, Any]], dense: Any, keys: dict[str, Any]) -> list[str]:
    runs = "; ".join(f"{q}: {v.name}" for q, (v, _) in sets.items())
    backends = ", ".join(dict.fromkeys(str(keys[v.name].backend) for v, _ in sets.values()))
    return [
        f"One session (docs/method.md, \"Comparisons\"): {session.describe()}; engine backend {backends}. "
        f"Runs: {runs}.",
        "gauge tok/s, median (min–max) over the timed repeats; x dense = median gauge / the dense run's median gauge "
        "at the same input size" + ("" if dense is not None else " (no dense run in this session: —)") + ".",
        _ceiling_text(sets),
        "first divergence: the first greedy token (of the first timed repeat) that differs from dense's; it is a "
        "tie when dense's logits at that step (step 0's vector, else the run's per-step summary) put the two tokens "
        "at most 2 x the set's logit-error bound (the CPU tests' ceilings, summed over its options) plus one step "
        "of the compute dtype apart, else an error; undecided where dense's logits at that step are not stored. "
        "max |Δlogit|: over the vocabulary, the next-token logits of the prompt (step 0) against dense's. steps' "
        "|Δlogit|: over the steps where both runs saw the same context, the largest difference of a token's logit "
        "that both runs' per-step summaries hold, against the set's bound (docs/method.md, \"Quantized weights\").",
    ]  # fmt: skip


def _findings(sets: dict[str, tuple[Any, Any]]) -> list[str]:
    out = []
    for q, (v, prof) in sets.items():
        for f in roofline_findings([v.cells[n] for n in sorted(v.cells)], ceiling_of(v.m)):
            out.append(f"{q} ({v.name}): {f.line}")
        if prof is None:
            out.append(f"{q}: no profile in this session")
            continue
        lines = stored_findings(prof.profile or {})
        shares = share_findings(prof.profile or {})
        if lines is None:
            out.append(f"{q} ({prof.name}): profile findings not recorded (a profile from before findings)")
        else:
            out += [f"{q} ({prof.name}): {line}" for line in lines] or [f"{q} ({prof.name}): profile findings: none"]
        out += [f"{q} ({prof.name}): {line}" for line in shares]
    return out
