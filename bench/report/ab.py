"""The report's section on A/B sessions (`bench ab`, run folders of kind "ab": bench/ab/archive.py): one table
per session, its measurements pair by pair, and its verdict, the sides and the method under it. A session is
never set beside sweep runs: its figures are ratios of one session, not speeds to compare across runs.

Reads run folders only (no jax, no engine). The verdict shown is the one the session archived; the table's
ratios are recomputed from pairs.csv and are the ones it was computed from (docs/method.md, "A/B runs").
"""

from __future__ import annotations

from typing import Any

from bench.ab.archive import is_ab_run, read_pairs, session_mode
from bench.ab.stats import pair_ratios, pct
from bench.errors import RunFolderError
from bench.report.document import Bullets, Section
from bench.report.views import Table


def split_ab_views(views: list[Any]) -> tuple[list[Any], list[Any]]:
    """(the A/B sessions among `views` (report `RunView`s), the other runs), each in the given order."""
    ab = [v for v in views if is_ab_run(v.m)]
    return ab, [v for v in views if not is_ab_run(v.m)]


def injection_text(inj: dict[str, Any]) -> str:
    """One line on a session's test-only slowdown (`ab.test_injection`): "side B's decode steps did 2.655 ms more
    CPU work each, for 10% less gauge than A (A's cost 23.90 ms per token, the lower quartile of ...; A's 0.001
    ms)", or, for a session archived before the slowdown was a share, "side B ran with a 2 ms decode delay per
    step"."""
    if inj.get("share_pct") is None:
        return f"side {inj.get('side')} ran with a {inj.get('decode_delay_ms')} ms decode delay per step"
    return (f"side {inj.get('side')}'s decode steps did {inj.get('delay_ms'):.3f} ms more CPU work each, for "
            f"{inj.get('share_pct'):g}% less {inj.get('metric')} than A (A's cost {inj.get('a_cost_ms'):.2f} ms per "
            f"token, {inj.get('a_cost')}; A's {inj.get('a_delay_ms'):g} ms), a deliberate slowdown")  # fmt: skip


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:,.2f}"


def session_table(view: Any) -> Table:
    """The measurements of one session: per pair its order, A's and B's value (tok/s, the median of their
    repeats), the ratio B / A and its change in %; warm-ups are counted in the notes, never in a figure.
    RunFolderError when pairs.csv cannot be read."""
    rows = read_pairs(view.run.path)
    ab = view.m.get("ab") or {}
    by_pair: dict[int, dict[str, Any]] = {}
    for m in rows:
        if m.kind == "pair" and m.pair is not None:
            p = by_pair.setdefault(m.pair, {"order": ""})
            p[m.side] = m
            p["order"] += m.side
    table_rows = []
    for k, p in sorted(by_pair.items()):
        a, b = p.get("A"), p.get("B")
        ok = a is not None and b is not None and a.valid and b.valid and a.value and b.value
        ratio = pair_ratios([a.value], [b.value])[0] if ok else None
        table_rows.append([str(k + 1), p["order"], _fmt(a and a.value), _fmt(b and b.value),
                           "—" if ratio is None else f"{ratio:.4f}", "—" if ratio is None else f"{pct(ratio):+.1f}%"])  # fmt: skip
    verdict = ab.get("verdict") or {}
    stats = ab.get("statistics") or {}
    cell = ab.get("cell") or {}
    warmups = sum(1 for m in rows if m.kind == "warmup")
    mode = session_mode(view.m)
    each = ("one request in each side's long-lived worker" if mode == "workers" else
            f"a `bench sweep` process of {cell.get('repeats')} timed repeats (their median)")  # fmt: skip
    notes = [
        f"verdict: {verdict.get('text') or 'none (fewer than 2 pairs with two valid measurements)'}",
        *(f"side {s}: {(ab.get('sides') or {}).get(s, {}).get('text') or '(this checkout)'}; build id "
          f"{', '.join((ab.get('sides') or {}).get(s, {}).get('build_ids') or []) or '—'}" for s in ("A", "B")),
        f"cell: {cell.get('input_tokens')} input tokens, {cell.get('max_new_tokens')} new tokens; a measurement is "
        f"{each} ({mode} mode); {warmups} warm-up measurement(s) before the pairs, not in any figure",
        f"method: the median of the per-pair ratios B / A, {100 * (stats.get('confidence') or 0):g}% percentile "
        f"bootstrap interval ({stats.get('resamples') or 0:,} resamples of the pairs, seed {stats.get('seed')}); "
        f"a change is claimed beyond +-{stats.get('min_effect_pct', 0):g}% (docs/method.md, \"A/B runs\")",
    ]  # fmt: skip
    notes += [f"warning: {line}" for line in ab.get("warnings") or []]
    if ab.get("test_injection"):
        notes.append(f"TEST-ONLY: {injection_text(ab['test_injection'])}")
    title = f"{view.name}: {ab.get('metric', 'gauge')} tok/s, B against A, ABBA order"
    return Table(title=title, header=["pair", "order", "A tok/s", "B tok/s", "B / A", "change"], rows=table_rows,
                 notes=notes, kind="ab")  # fmt: skip


def ab_sections(views: list[Any]) -> list[Section]:
    """The report's "A/B sessions" section for the A/B runs among `views` ([] when there are none): one table per
    session (`session_table`), or a bullet naming a session whose pairs.csv cannot be read."""
    sessions = [v for v in views if is_ab_run(v.m)]
    if not sessions:
        return []
    intro = ("Paired sessions of `bench ab`: two builds or configurations measured alternately in one session "
             "(worker mode: request by request in one long-lived process per side; process mode: each measurement "
             "its own process). Their ratios belong to their session and are not set beside the sweep runs above.")  # fmt: skip
    blocks: list[Any] = [intro]
    broken = []
    for v in sessions:
        try:
            blocks.append(session_table(v))
        except RunFolderError as exc:
            broken.append(f"{v.name}: {exc}")
    if broken:
        blocks.append(Bullets(items=broken))
    return [Section(title="A/B sessions", anchor="ab", blocks=blocks)]
