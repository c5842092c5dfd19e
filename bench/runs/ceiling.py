"""The bandwidth roofline's denominator, the share against it, and the finding a share above 100% becomes
(docs/method.md, "Rooflines"). One definition on every platform; standard library only, so the report can apply it
to archived runs.

- **measured read rate**: the fastest read-only stream measured on the device in the same process, by the best
  probe the platform has (`bench.profile.bandwidth`): on a TPU the faster of the Pallas streaming read (HBM ->
  VMEM, 32 passes over the buffer per call, `bench.profile.stream`) and XLA's read-only reduction; elsewhere XLA's
  read-only reduction. Bytes read / median time of one call; its probe is recorded with it.
- **datasheet figure**: the memory bandwidth the device's maker publishes for its `device_kind` (`DATASHEETS`, each
  with its source); none for CPUs, whose memory depends on the machine.
- **ceiling** (the denominator) = max(measured read rate, datasheet figure where known). A decode step only reads,
  so a copy (bytes read + written) is not its ceiling; a probe can be slowed by the host and a datasheet can be
  missing, so neither alone is: the larger of the two is the rate the step cannot honestly beat.
- **roofline share** = bytes per decode step x decode tok/s / ceiling (`share_pct`).
- A share above 100% of the ceiling is a `RooflineFinding`: printed as a line and recorded with the probe's
  numbers, never only a footnote.

Runs recorded before this definition (their manifests carry no `CEILING_KEY`) divided their shares by the device
copy (bytes read + written / time): `ceiling_of` returns that copy as a `Ceiling` whose `definition` is
`COPY_DEFINITION`, with the read rate and datasheet beside it where known, so a reader can say which definition
a share used and what the current one would give.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from bench.errors import InputError
from bench.runs.manifest import RATES_KEY

GIB = 2**30
CEILING_DEFINITION = "max(read, datasheet)"
"""The `Ceiling.definition` of the current denominator (module docstring)."""
COPY_DEFINITION = "device copy"
"""The `Ceiling.definition` of runs recorded before it: the shares divided by the device copy's read + written
bytes per second (the method's first definition)."""
CEILING_KEY = "ceiling"
"""The key, under the run manifest's rates (`bench.runs.manifest.RATES_KEY`), of the run's `Ceiling.to_json()`."""
FINDINGS_KEY = "roofline_findings"
"""The key, under the run manifest's rates, of the list of `RooflineFinding.to_json()` of the run's cells."""


@dataclasses.dataclass(frozen=True)
class Datasheet:
    """A device's published memory bandwidth. device_kinds: the names jax's `Device.device_kind` gives the device
    (the first is the one shown); bytes_per_s: the figure in bytes/s (decimal units as published: GB/s = 1e9 B/s);
    figure: as published; source: where."""

    device_kinds: tuple[str, ...]
    bytes_per_s: float
    figure: str
    source: str

    @property
    def device_kind(self) -> str:
        """The first of `device_kinds`."""
        return self.device_kinds[0]

    @property
    def line(self) -> str:
        """"TPU v5 lite: 819 GB/s (source)"."""
        return f"{self.device_kind}: {self.figure} ({self.source})"

    def to_json(self) -> dict:
        """The four fields as a JSON-ready dict (device_kinds as a list)."""
        return {"device_kinds": list(self.device_kinds), "bytes_per_s": self.bytes_per_s, "figure": self.figure,
                "source": self.source}  # fmt: skip

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Datasheet:
        """The `Datasheet` a `to_json` dict holds. Raises KeyError, TypeError or ValueError for another dict."""
        return Datasheet(tuple(data["device_kinds"]), float(data["bytes_per_s"]), str(data["figure"]),
                         str(data["source"]))  # fmt: skip


_GOOGLE_TPU = "Google Cloud TPU documentation, {page} (cloud.google.com/tpu/docs/{slug}): HBM bandwidth per chip"
_NVIDIA = "NVIDIA {name} datasheet ({url}): GPU memory bandwidth"
DATASHEETS = (
    Datasheet(("TPU v5 lite", "TPU v5e"), 819e9, "819 GB/s", _GOOGLE_TPU.format(page="TPU v5e", slug="v5e")),
    Datasheet(("TPU v5", "TPU v5p"), 2765e9, "2,765 GB/s", _GOOGLE_TPU.format(page="TPU v5p", slug="v5p")),
    Datasheet(("TPU v6 lite", "TPU v6e"), 1638e9, "1,638 GB/s", _GOOGLE_TPU.format(page="TPU v6e", slug="v6e")),
    Datasheet(("TPU v4",), 1200e9, "1,200 GB/s", _GOOGLE_TPU.format(page="TPU v4", slug="v4")),
    Datasheet(("NVIDIA L4",), 300e9, "300 GB/s", _NVIDIA.format(name="L4", url="nvidia.com/en-us/data-center/l4")),
    Datasheet(("Tesla T4", "NVIDIA T4G"), 320e9, "320 GB/s",
              _NVIDIA.format(name="T4 (AWS g5g's T4G is a T4)", url="nvidia.com/en-us/data-center/tesla-t4")),
    Datasheet(("NVIDIA H100 80GB HBM3",), 3.35e12, "3.35 TB/s",
              _NVIDIA.format(name="H100 SXM", url="nvidia.com/en-us/data-center/h100")),
    Datasheet(("NVIDIA A100-SXM4-40GB",), 1555e9, "1,555 GB/s",
              _NVIDIA.format(name="A100 40GB SXM", url="nvidia.com/en-us/data-center/a100")),
    Datasheet(("NVIDIA A100-SXM4-80GB",), 2039e9, "2,039 GB/s",
              _NVIDIA.format(name="A100 80GB SXM", url="nvidia.com/en-us/data-center/a100")),
)  # fmt: skip
"""Published memory bandwidths by jax `device_kind`. Only what a maker's own pages state: Google's Cloud TPU pages
(v5e "HBM2 capacity and bandwidth: 16 GB, 819 GBps"; v5p "95 GB, 2765 GB/s"; v6e "HBM bandwidth per chip: 1638
GBps"; v4 "32 GiB, 1200 GBps") and NVIDIA's product datasheets. The device_kind strings: "TPU v5 lite" is what jax
0.10.2 reports on the lent v5e (the archived runs' manifests); "TPU v5" (v5p) and "TPU v6 lite" (v6e) are the names
Pallas's TPU chip-version lookup matches, beside the plain generation names; on a GPU jax reports the CUDA device
name ("NVIDIA L4" and "NVIDIA T4G" as in this project's archived runs). A kind not listed has no datasheet figure,
and its ceiling is the measured read rate."""


def datasheet_for(device_kind: str | None) -> Datasheet | None:
    """The `DATASHEETS` entry naming `device_kind` (exactly, ignoring case and surrounding spaces), None for an
    unknown kind, a CPU, or None."""
    if not device_kind:
        return None
    wanted = device_kind.strip().lower()
    return next((d for d in DATASHEETS if wanted in (k.lower() for k in d.device_kinds)), None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ceiling:
    """A roofline share's denominator and the figures it was chosen from (module docstring).

    bytes_per_s: the denominator, bytes/s. chosen: which figure it is ("measured read", "datasheet", or "device
    copy" under `COPY_DEFINITION`). definition: `CEILING_DEFINITION` or `COPY_DEFINITION`. device_kind: jax's name
    of the device, None when unknown. read_bytes_s / read_probe: the fastest measured read-only stream (bytes/s)
    and how it was measured, None where the run has none. datasheet: the `Datasheet` of the device, None where
    none is known. copy_bytes_s: the device copy (bytes read + written / s), None where not measured.
    """

    bytes_per_s: float
    chosen: str
    definition: str
    device_kind: str | None = None
    read_bytes_s: float | None = None
    read_probe: str | None = None
    datasheet: Datasheet | None = None
    copy_bytes_s: float | None = None

    @property
    def line(self) -> str:
        """One line for a person: the denominator in GiB/s and GB/s, which figure it is, and the others beside it."""
        parts = [f"roofline ceiling {_rate(self.bytes_per_s)} = {self.chosen}"]
        if self.definition == CEILING_DEFINITION:
            probe = f" ({self.read_probe})" if self.read_probe else ""
            sheet = (f"{self.datasheet.figure} ({self.datasheet.source})" if self.datasheet
                     else f"(none known for {self.device_kind})")  # fmt: skip
            parts.append(f"the larger of the measured read {_rate(self.read_bytes_s)}{probe} and the datasheet {sheet}")
        else:
            parts.append(f"this run predates the read-rate ceiling: its shares are against the device copy; "
                         f"{_read(self.read_bytes_s)}, datasheet "
                         f"{self.datasheet.figure if self.datasheet else 'none known'}")  # fmt: skip
        if self.copy_bytes_s and self.chosen != "device copy":
            parts.append(f"device copy {_rate(self.copy_bytes_s)} (read + written, not the denominator)")
        return "; ".join(parts)

    @property
    def current_bytes_s(self) -> float | None:
        """The denominator the current definition gives from this ceiling's figures: max(read, datasheet), each
        where known; None when neither is (a run that measured only a copy, on a device without a datasheet)."""
        figures = [f for f in (self.read_bytes_s, self.datasheet.bytes_per_s if self.datasheet else None) if f]
        return max(figures) if figures else None

    def to_json(self) -> dict:
        """A JSON-ready dict of every field (rates in bytes/s; the datasheet as `Datasheet.to_json`, or None)."""
        out = dataclasses.asdict(self)
        out["datasheet"] = self.datasheet.to_json() if self.datasheet else None
        out["gib_s"] = self.bytes_per_s / GIB
        return out

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Ceiling | None:
        """The `Ceiling` a `to_json` dict holds; None when it is not one (missing or non-positive denominator)."""
        try:
            rate = float(data["bytes_per_s"])
            sheet = data.get("datasheet")
            return Ceiling(bytes_per_s=rate, chosen=str(data["chosen"]), definition=str(data["definition"]),
                           device_kind=data.get("device_kind"), read_bytes_s=_positive(data.get("read_bytes_s")),
                           read_probe=data.get("read_probe"),
                           datasheet=Datasheet.from_json(sheet) if sheet else None,
                           copy_bytes_s=_positive(data.get("copy_bytes_s"))) if rate > 0 else None  # fmt: skip
        except (TypeError, KeyError, ValueError, AttributeError):
            return None


def roofline_ceiling(read_bytes_s: float, read_probe: str | None, device_kind: str | None, *,
                     copy_bytes_s: float | None = None) -> Ceiling:  # fmt: skip
    """The current ceiling: max(`read_bytes_s`, the datasheet figure of `device_kind` where `DATASHEETS` has one),
    with the figures beside it. read_bytes_s: the fastest read-only stream measured (bytes/s); read_probe: how;
    copy_bytes_s: the device copy, recorded beside it (never the denominator). Raises InputError for a read rate
    that is not a positive number."""
    if not (isinstance(read_bytes_s, int | float) and read_bytes_s > 0):
        raise InputError(f"measured read rate {read_bytes_s!r} bytes/s: expected a positive number")
    sheet = datasheet_for(device_kind)
    use_sheet = sheet is not None and sheet.bytes_per_s > read_bytes_s
    return Ceiling(bytes_per_s=sheet.bytes_per_s if use_sheet else float(read_bytes_s),
                   chosen="datasheet" if use_sheet else "measured read", definition=CEILING_DEFINITION,
                   device_kind=device_kind, read_bytes_s=float(read_bytes_s), read_probe=read_probe, datasheet=sheet,
                   copy_bytes_s=copy_bytes_s)  # fmt: skip


def ceiling_of(manifest: Mapping[str, Any]) -> Ceiling | None:
    """The ceiling a run's shares were divided by, from a manifest's top-level keys (`Manifest.extra`, or the parsed
    manifest.json): `RATES_KEY` -> `CEILING_KEY` where the run recorded one; else, for a run recorded before it, its
    device copy (`RATES_KEY` -> `copy_bandwidth`) as a `COPY_DEFINITION` ceiling, with its read-only probe
    (`read_bandwidth`) and the datasheet of its device kind beside it. None when the run measured no rates (a
    `--target` sweep, a published run)."""
    rates = manifest.get(RATES_KEY)
    if not isinstance(rates, Mapping):
        return None
    if isinstance(rates.get(CEILING_KEY), Mapping):
        return Ceiling.from_json(rates[CEILING_KEY])
    copy, read = rates.get("copy_bandwidth"), rates.get("read_bandwidth")
    copy_rate = _positive((copy or {}).get("bytes_per_s") if isinstance(copy, Mapping) else None)
    if copy_rate is None:
        return None
    kind = copy.get("device_kind")
    read_rate = _positive(read.get("bytes_per_s")) if isinstance(read, Mapping) else None
    return Ceiling(bytes_per_s=copy_rate, chosen="device copy", definition=COPY_DEFINITION, device_kind=kind,
                   read_bytes_s=read_rate, read_probe=read.get("method") if read_rate else None,
                   datasheet=datasheet_for(kind), copy_bytes_s=copy_rate)  # fmt: skip


def share_pct(bytes_per_step: float, tok_s: float, denominator_bytes_s: float) -> float:
    """Bandwidth roofline share in %: bytes_per_step x tok_s / denominator_bytes_s x 100 (docs/method.md).
    bytes_per_step: bytes one decode step reads (the engine's accounting); tok_s: decode steps per second (the
    gauge at batch 1, the per-sequence gauge at batch B); denominator_bytes_s: a `Ceiling.bytes_per_s`. Raises
    InputError for a denominator <= 0 or negative inputs."""
    if not denominator_bytes_s > 0:
        raise InputError(f"bandwidth {denominator_bytes_s!r} bytes/s: expected a measured bandwidth > 0")
    if bytes_per_step < 0 or tok_s < 0:
        raise InputError(f"bytes per step {bytes_per_step!r} and tok/s {tok_s!r}: expected values >= 0")
    return 100.0 * bytes_per_step * tok_s / denominator_bytes_s


@dataclasses.dataclass(frozen=True, kw_only=True)
class RooflineFinding:
    """A roofline share above 100% of its ceiling: the cell ("41", "41x8"), the loop ("host loop", "device
    loop"), the share (%), its inputs (bytes per step, tok/s) and the ceiling with the probe's numbers. `line` says
    what it means; `to_json` records it (the manifest's rates -> `FINDINGS_KEY`)."""

    cell: str
    loop: str
    share_pct: float
    bytes_per_step: float
    tok_s: float
    ceiling: Ceiling

    @property
    def step_bytes_s(self) -> float:
        """The rate the step read at: bytes per step x tok/s, bytes/s."""
        return self.bytes_per_step * self.tok_s

    @property
    def line(self) -> str:
        """The finding for a person, one line."""
        c = self.ceiling
        head = (f"finding: roofline share {self.share_pct:.1f}% above 100 at cell {self.cell} ({self.loop}): the "
                f"step read {self.bytes_per_step / 1e9:,.3f} GB x {self.tok_s:,.2f} tok/s = "
                f"{_rate(self.step_bytes_s)}, above the {c.chosen} {_rate(c.bytes_per_s)}")  # fmt: skip
        if c.definition == COPY_DEFINITION:
            now = c.current_bytes_s
            again = (f"; against the current ceiling, {_rate(now)} (the larger of {_read(c.read_bytes_s)} and the "
                     f"datasheet {c.datasheet.figure if c.datasheet else 'none'}), "
                     f"the share is {100.0 * self.step_bytes_s / now:.1f}%" if now else
                     "; the run measured no read rate and its device has no datasheet figure")  # fmt: skip
            return (f"{head}. This run divided its shares by the device copy (read + written bytes; the definition "
                    f"before the read-rate ceiling), which a read-only step can beat{again}.")
        sheet = f"datasheet {c.datasheet.figure}" if c.datasheet else f"no datasheet figure for {c.device_kind}"
        fewer = ("the step read fewer bytes from memory than its accounting counts (a cache or on-chip memory held "
                 "part of them, or the bytes per step count bytes the compiled program does not read)")
        why = (f"{fewer[0].upper()}{fewer[1:]}: no device streams faster than its maker's figure." if c.datasheet
               else f"Either {fewer}, or the probe was slowed (other work on the machine) and no datasheet figure "
                    "bounds it.")  # fmt: skip
        return (f"{head} (measured read {_rate(c.read_bytes_s)} by {c.read_probe or 'an unnamed probe'}; {sheet}). "
                f"{why}")

    def to_json(self) -> dict:
        """A JSON-ready dict: cell, loop, share_pct, bytes_per_step, tok_s, step_bytes_s, ceiling, line."""
        return {"cell": self.cell, "loop": self.loop, "share_pct": self.share_pct,
                "bytes_per_step": self.bytes_per_step, "tok_s": self.tok_s, "step_bytes_s": self.step_bytes_s,
                "ceiling": self.ceiling.to_json(), "line": self.line}  # fmt: skip


def finding_of(cell: str, loop: str, share: float | None, bytes_per_step: float | None, tok_s: float | None,
               ceiling: Ceiling | None) -> RooflineFinding | None:  # fmt: skip
    """The `RooflineFinding` of one share (%) when it is above 100 and its inputs and ceiling are known; else
    None."""
    if share is None or share <= 100.0 or ceiling is None or not bytes_per_step or not tok_s:
        return None
    return RooflineFinding(cell=cell, loop=loop, share_pct=share, bytes_per_step=bytes_per_step, tok_s=tok_s,
                           ceiling=ceiling)  # fmt: skip


def _positive(value: Any) -> float | None:
    """`value` as a float when it is a positive number, else None."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if v > 0 else None


def _read(bytes_s: float | None) -> str:
    """"measured read 686.2 GiB/s (736.8 GB/s)", or "no measured read" for None."""
    return f"measured read {_rate(bytes_s)}" if bytes_s else "no measured read"


def _rate(bytes_s: float | None) -> str:
    """"686.2 GiB/s (736.8 GB/s)", or "none" for None."""
    return "none" if not bytes_s else f"{bytes_s / GIB:,.1f} GiB/s ({bytes_s / 1e9:,.1f} GB/s)"
