"""The report's PNG plots (matplotlib, Agg canvas; no pyplot state, no display needed).

Inputs are plain data, so the plots know nothing of run folders: `plot_sweep` takes (label, published, cells)
per run, `plot_profile` takes (label, {category: % of device time}) per run, `plot_load` takes (label, load
levels) per line.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.runs.records import CellRow, LoadRow


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig

def _label_rate_axes(ax: Any, title: str, xlabel: str, *, log_base: int) -> None:
    """One tok/s panel: log x (base `log_base`), labels, title, a light grid."""
    ax.set_xscale("log", base=log_base)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("tok/s")
    ax.set_title(title)
    ax.grid(alpha=0.3)


def _save_rate_figure(fig: Any, axes: Any, path: Path) -> Path:
    """The gauge / end-to-end pair of panels: a legend on the first when it has lines, then a PNG at 110 dpi."""
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def plot_sweep(runs: Sequence[tuple[str, bool, Sequence[CellRow]]], path: Path) -> Path:
    """Gauge and end-to-end tok/s vs input tokens (log x), one line per run: min–max bars where raw samples
    exist, published runs dashed, invalid cells crossed out in red. Returns `path`."""
    fig = _figure(11, 4.2)
    axes = fig.subplots(1, 2)
    for ax, metric, title in zip(axes, ("gauge", "e2e"), ("decode, gauge (tok/s)", "end-to-end (tok/s)")):
        for label, published, all_cells in runs:
            cells = sorted((c for c in all_cells if getattr(c, f"{metric}_tok_s_median") is not None),
                           key=lambda c: c.input_tokens)  # fmt: skip
            if not cells:
                continue
            xs = [c.input_tokens for c in cells]
            ys = [getattr(c, f"{metric}_tok_s_median") for c in cells]
            lo = [y - (getattr(c, f"{metric}_tok_s_min") or y) for c, y in zip(cells, ys)]
            hi = [(getattr(c, f"{metric}_tok_s_max") or y) - y for c, y in zip(cells, ys)]
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=label, linestyle="--" if published else "-")
            bad = [(x, y) for c, x, y in zip(cells, xs, ys) if not c.valid]
            if bad:
                ax.scatter(*zip(*bad), marker="x", s=80, color="red", zorder=5)
        _label_rate_axes(ax, title, "input tokens", log_base=10)
    return _save_rate_figure(fig, axes, path)


def plot_profile(runs: Sequence[tuple[str, dict[str, float]]], path: Path) -> Path | None:
    """Device-time categories (% of kernel time) stacked per run, the rest up to 100% as "not broken down".
    Returns `path`, or None (and writes nothing) when `runs` is empty."""
    if not runs:
        return None
    names = list(dict.fromkeys(n for _, cats in runs for n in cats))
    fig = _figure(max(4.5, 1.8 * len(runs) + 2.5), 4.5)
    ax = fig.subplots()
    bottoms = [0.0] * len(runs)
    for name in [*names, "not broken down"]:
        if name == "not broken down":
            heights = [max(0.0, 100.0 - b) for b in bottoms]
        else:
            heights = [float(cats.get(name) or 0.0) for _, cats in runs]
        ax.bar([label for label, _ in runs], heights, bottom=bottoms, label=name.replace("_", " "),
               color="lightgrey" if name == "not broken down" else None)  # fmt: skip
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_ylabel("% of device (kernel) time")
    ax.set_ylim(0, max(100.0, *bottoms))
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def plot_axis(series: Sequence[tuple[str, Sequence[tuple[float, CellRow]]]], axis: str, path: Path) -> Path:
    """Gauge and end-to-end tok/s against `axis` ("batch", "concurrency": log2 x), one line per (label, points):
    points are (axis value, cell), min–max bars where raw samples exist. Returns `path`."""
    fig = _figure(11, 4.2)
    axes = fig.subplots(1, 2)
    for ax, metric, title in zip(axes, ("gauge", "e2e"), ("decode, gauge (tok/s)", "end-to-end (tok/s)")):
        for label, points in series:
            pts = [(x, c) for x, c in points if getattr(c, f"{metric}_tok_s_median") is not None]
            if not pts:
                continue
            ys = [getattr(c, f"{metric}_tok_s_median") for _, c in pts]
            lo = [y - (getattr(c, f"{metric}_tok_s_min") or y) for (_, c), y in zip(pts, ys)]
            hi = [(getattr(c, f"{metric}_tok_s_max") or y) - y for (_, c), y in zip(pts, ys)]
            ax.errorbar([x for x, _ in pts], ys, yerr=[lo, hi], marker="o", capsize=3, label=label)
        _label_rate_axes(ax, title, axis, log_base=2)
    return _save_rate_figure(fig, axes, path)


def plot_history(series: Sequence[tuple[str, Sequence[tuple[str, CellRow | None]]]], path: Path) -> Path:
    """Decode gauge over time: one line per (label, points), points (date or run label, cell) in time order,
    each point's min–max as a bar, invalid cells crossed out in red. Returns `path`."""
    fig = _figure(11, 4.2)
    ax = fig.subplots()
    ticks: list[str] = []
    for label, points in series:
        ticks = ticks if len(ticks) >= len(points) else [p for p, _ in points]
        pts = [(i, c) for i, (_, c) in enumerate(points) if c is not None and c.gauge_tok_s_median is not None]
        if not pts:
            continue
        ys = [c.gauge_tok_s_median for _, c in pts]
        lo = [y - (c.gauge_tok_s_min or y) for (_, c), y in zip(pts, ys)]
        hi = [(c.gauge_tok_s_max or y) - y for (_, c), y in zip(pts, ys)]
        ax.errorbar([i for i, _ in pts], ys, yerr=[lo, hi], marker="o", capsize=3, label=label)
        bad = [(i, y) for (i, c), y in zip(pts, ys) if not c.valid]
        if bad:
            ax.scatter(*zip(*bad), marker="x", s=80, color="red", zorder=5)
    ax.set_xticks(range(len(ticks)), ticks, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("decode gauge tok/s (median, min–max)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def plot_load(lines: Sequence[tuple[str, Sequence[LoadRow]]], path: Path) -> Path | None:
    """Serving under load: output throughput (tok/s) against latency, one point per concurrency level (labelled
    with it), one line per (label, levels) in concurrency order: left against the median inter-token latency,
    right against the median TTFT (ms). Invalid levels crossed out in red. Returns `path`, or None (nothing
    written) when no line has a level with figures."""
    drawn = [(label, sorted((r for r in rows if r.output_tok_s is not None and r.itl_ms_median is not None),
                            key=lambda r: r.concurrency)) for label, rows in lines]  # fmt: skip
    drawn = [(label, rows) for label, rows in drawn if rows]
    if not drawn:
        return None
    fig = _figure(11, 4.2)
    axes = fig.subplots(1, 2)
    for ax, metric, xlabel in zip(axes, ("itl_ms_median", "ttft_ms_median"),
                                  ("inter-token latency, median (ms)", "TTFT, median (ms)")):  # fmt: skip
        for label, rows in drawn:
            pts = [(getattr(r, metric), r.output_tok_s, r) for r in rows if getattr(r, metric) is not None]
            if not pts:
                continue
            ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], marker="o", label=label)
            for x, y, r in pts:
                ax.annotate(f"C={r.concurrency}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
            bad = [(x, y) for x, y, r in pts if not r.valid]
            if bad:
                ax.scatter(*zip(*bad), marker="x", s=80, color="red", zorder=5)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("output throughput (tok/s)")
        ax.set_title("throughput vs latency per concurrency level")
        ax.grid(alpha=0.3)
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path
def plot_batches(series: Sequence[tuple[str, Sequence[CellRow]]], path: Path, knees: dict[str, int | None] | None = None) -> Path:
    """Throughput and step time against batch size (log2 x), one line per (label, cells of one input size of one
    run): left the aggregate throughput (solid) and the per-sequence gauge (dotted) in tok/s, right the median
    decode step in ms with its p99 as the bar's top; a knee (`knees[label]`) is a vertical dashed line on the right
    panel; invalid cells are crossed out in red. Returns `path`."""
    fig = _figure(11, 4.2)
    left, right = fig.subplots(1, 2)
    for label, cells in series:
        cells = sorted((c for c in cells if c.batch is not None), key=lambda c: c.batch)
        agg = [(c.batch, c.aggregate_tok_s_median) for c in cells if c.aggregate_tok_s_median is not None]
        seq = [(c.batch, c.gauge_tok_s_median) for c in cells if c.gauge_tok_s_median is not None]
        if agg:
            line = left.plot(*zip(*agg), marker="o", label=f"{label} aggregate")[0]
            if seq:
                left.plot(*zip(*seq), marker=".", linestyle=":", color=line.get_color(), label=f"{label} per sequence")
        steps = [(c.batch, c.step_ms_median, c.step_ms_p99) for c in cells if c.step_ms_median is not None]
        if steps:
            xs, ys, p99 = zip(*steps)
            hi = [max(0.0, (p or y) - y) for y, p in zip(ys, p99)]
            right.errorbar(xs, ys, yerr=[[0.0] * len(ys), hi], marker="o", capsize=3, label=label)
        bad = [(c.batch, c.aggregate_tok_s_median) for c in cells if not c.valid and c.aggregate_tok_s_median is not None]
        if bad:
            left.scatter(*zip(*bad), marker="x", s=80, color="red", zorder=5)
        if knees and knees.get(label) is not None:
            right.axvline(knees[label], linestyle="--", color="grey", alpha=0.7)
    _label_rate_axes(left, "throughput against batch (tok/s)", "batch (rows)", log_base=2)
    right.set_xscale("log", base=2)
    ticks = sorted({c.batch for _, cells in series for c in cells if c.batch is not None})
    for ax in (left, right):  # the batch sizes themselves, not powers of two
        ax.set_xticks(ticks, [str(b) for b in ticks])
        ax.minorticks_off()
    right.set_xlabel("batch (rows)")
    right.set_ylabel("ms per decode step (median; bar to p99)")
    right.set_title("step time against batch (dashed: the knee)")
    right.grid(alpha=0.3)
    if right.get_legend_handles_labels()[0]:
        right.legend(fontsize=8)
    return _save_rate_figure(fig, [left, right], path)
