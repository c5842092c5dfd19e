"""The report at scale: the archive plus forty-odd synthetic run folders (several devices, checkpoints,
quantizations, batch sizes, concurrency levels, dates) give a readable default view: every group and view present,
every table within a screen (at most `MAX_COLUMNS` columns and `MAX_ROWS` rows), the published figures reproduced,
and a self-contained HTML page holding every table and plot (parsed with the standard library, no browser)."""

from __future__ import annotations

import html.parser
import itertools
import re
import shutil
from pathlib import Path

import pytest
from runfolders import REFERENCE_RUNS, make_measured_run

from bench.report import build_report
from bench.report.groups import Selection
from bench.report.views import MAX_COLUMNS, MAX_ROWS

DEVICES = (("cpu", "cpu", "float32"), ("l4", "NVIDIA L4", "bfloat16"), ("h200", "NVIDIA H200", "bfloat16"),
           ("a100", "NVIDIA A100-SXM4-40GB", "bfloat16"))  # fmt: skip
CHECKPOINTS = (("default-bfloat16-seed0-v1", "sha256:feed"), ("e4b-seed0", "sha256:e4b0"))


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("scale") / "runs"
    for ref in REFERENCE_RUNS:
        shutil.copytree(ref, root / ref.name)
    n = 0
    for (slug, kind, dtype), (ckpt, chash), quant, day in itertools.product(DEVICES, CHECKPOINTS, ("none", "int8"),
                                                                             (3, 17, 28)):  # fmt: skip
        if quant == "int8" and day == 3:
            continue
        config = {"buckets": [64, 1024], "max_length": 4160, "batch": 1, "quantization": quant}
        make_measured_run(root, f"{ckpt[:3]}-{quant}-d{day}", inputs=(41, 521, 2057), gauge=40.0 + day + n % 5,
                          device_kind=kind, slug=slug, dtype=dtype, content_hash=chash, checkpoint_id=ckpt,
                          config=config, build_id=f"{day:012d}", date=f"2026-11-{day:02d}",
                          started_at=f"2026-11-{day:02d}T10:00:00+00:00")  # fmt: skip
        n += 1
    for slug, kind, dtype in DEVICES[1:3]:  # the axes: batch on the GPUs, concurrency through a server
        for b in (1, 4, 16):
            make_measured_run(root, f"batch{b}", inputs=(41, 521), gauge=50.0 / (1 + b / 32), device_kind=kind,
                              slug=slug, dtype=dtype, config={"buckets": [64, 1024], "batch": b}, date="2026-11-29",
                              started_at="2026-11-29T10:00:00+00:00")  # fmt: skip
            n += 1
        for c in (2, 8):
            make_measured_run(root, f"conc{c}", inputs=(41,), gauge=45.0 - c, device_kind=kind, slug=slug, dtype=dtype,
                              config={"buckets": [64], "concurrency": c}, date="2026-11-29",
                              started_at="2026-11-29T11:00:00+00:00")  # fmt: skip
            n += 1
    assert n >= 40
    return root


@pytest.fixture(scope="module")
def report(archive: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("scale-report")
    return build_report([], out, runs_dir=archive, selection=Selection(latest_per=("device",))), out


def _tables(md: str) -> list[list[str]]:
    tables, current = [], []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables


def test_every_default_table_fits_a_screen(report) -> None:
    rep, _ = report
    tables = _tables(rep.markdown.read_text())
    assert len(tables) > 20
    for table in tables:
        columns = len(re.split(r"(?<!\\)\|", table[0])) - 2
        assert columns <= MAX_COLUMNS, table[0]
        assert len(table) - 2 <= MAX_ROWS, table[0]


def test_every_group_and_view_is_present(report, archive: Path) -> None:
    rep, out = report
    md = rep.markdown.read_text()
    groups = re.findall(r"^## (G\d+): ", md, flags=re.M)
    # published; CPU float32 x 2 checkpoints x 2 quantizations; GPU bfloat16 x the same four
    assert len(groups) == 9 and groups[0] == "G1" and md.count(" is split from ") == 8
    assert "## G1: published: google/gemma-4-E2B-it" in md
    for view in ("device by device", "runs**", "history: CPU, batch 1, concurrency 1", "H200: against batch",
                 "L4: against concurrency", "findings", "environment", "profile"):  # fmt: skip
        assert view in md, view
    assert "against batch" not in md.split("## G1: ")[1].split("## G2: ")[0]  # only where the axis exists
    gpu = next(s for s in md.split("\n## ")[1:] if "against batch" in s)
    device_table = next(t for t in _tables(gpu) if t[0].startswith("| input tokens"))
    assert all(d in device_table[0] for d in ("L4", "H200", "A100"))  # device by device, one configuration
    for name in ("sweep_tok_s_G1.png", "batch_G2.png", "history_G2.png"):
        assert (out / name).exists() or any(out.glob(name.split("_G")[0] + "_G*.png")), name
    assert len(rep.runs) < 50 and len(rep.rows) == sum(1 for _ in (out / "rows.jsonl").open())


def test_the_published_figures_are_reproduced_at_scale(report) -> None:
    rep, _ = report
    g1 = rep.markdown.read_text().split("## G1: ")[1].split("## G2: ")[0]
    assert ("| input tokens | T4G (published) gauge tok/s | T4G (published) end-to-end tok/s | L4 (published) gauge "
            "tok/s | L4 (published) end-to-end tok/s |") in g1  # fmt: skip
    for line in ("| 41 | 12.9 | 12.43 | 48.5 | 46.23 |", "| 521 | 13.0 | 11.28 | 48.4 | 42.87 |",
                 "| 2,057 | 12.9 | 8.22 | 48.3 | 34.57 |", "| 3,593 | — | — | 48.3 | 27.55 |",
                 "| dtype conversion | 54.1% | 0.0% |", "| bandwidth roofline share, as reported | 26% | ~100% |"):  # fmt: skip
        assert line in g1
    assert "decode gauge 3.76x at 41, 3.72x at 521, 3.74x at 2,057 (median 3.74x)" in g1


class _Page(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tables, self.images, self.links, self.ids = 0, [], [], set()

    def handle_starttag(self, tag, attrs) -> None:
        a = dict(attrs)
        self.ids |= {a["id"]} if "id" in a else set()
        if tag == "table":
            self.tables += 1
        elif tag == "img":
            self.images.append(a.get("src", ""))
        elif tag in ("link", "script") or (tag == "a" and not a.get("href", "").startswith("#")):
            self.links.append((tag, a))


def test_the_html_page_holds_every_table_and_plot_and_needs_no_network(report) -> None:
    rep, out = report
    page = _Page()
    page.feed((out / "report.html").read_text(encoding="utf-8"))
    md = rep.markdown.read_text()
    assert page.tables == len(_tables(md))
    plots = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert len(page.images) == len(plots) > 10
    assert all(src.startswith("data:image/png;base64,iVBOR") for src in page.images)  # embedded PNGs
    assert page.links == [] and "http://" not in (out / "report.html").read_text().replace("http://www.w3.org", "")
    assert {"groups", "G1", "G1-findings"} <= page.ids
