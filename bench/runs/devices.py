"""The devices a configuration is planned for: memory, memory bandwidth and the link between devices, each figure
with its maker's source; whether weights + KV cache fit one device; and the decode step a mesh of them predicts.
Standard library and the jax-free model facts only, so the inspector, the sweep and the report can share it
(docs/method.md, "Where a model fits" and "Predicting a mesh").

- **memory**: the device memory a run archived here recorded on that device (`memory_bytes` of its manifest: on
  the TPU v5e jax's `bytes_limit`, 16,909,336,064 bytes, the figure a sweep's live check compares against; on the
  T4G and L4 the device memory of the published reference runs, 15,360 and 23,034 MiB), else the capacity the
  maker publishes read in decimal units (16 GB = 16e9 bytes), below what the devices recorded here have.
- **memory bandwidth**: `bench.runs.ceiling.DATASHEETS`, the roofline's datasheet figures (one fact, one place).
- **link**: the device-to-device interconnect a collective crosses (TPU ICI, NVLink, PCIe), as the maker publishes
  it, which is the bidirectional total per device; `Link.bytes_per_s` is one direction, half of it: a ring
  all-reduce sends and receives at once, each direction at that rate.

A fit (`fit_on`) is `model.accounting.BatchMemory` with the device's capacity: weights as placed + the KV cache of
`batch` rows of `context` positions <= capacity x (1 - `MEMORY_RESERVE`), the reserve left for activations, the
compiled programs and the runtime.
"""

from __future__ import annotations

import dataclasses

from model.accounting import MEMORY_RESERVE, BatchMemory

from bench.errors import InputError
from bench.runs.ceiling import Datasheet, ceiling_of, datasheet_for


@dataclasses.dataclass(frozen=True, kw_only=True)
class Link:
    """A device-to-device interconnect: name ("ICI", "NVLink 4", "PCIe Gen4 x16"); figure: the bidirectional
    bandwidth per device as published; bytes_per_s: one direction (half the figure), bytes/s; source: where."""

    name: str
    figure: str
    bytes_per_s: float
    source: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Device:
    """One device model: name (the `--device` value, e.g. "tpu-v5e"), label (for people), memory_bytes (the
    published capacity, decimal units), memory_figure (as published), memory_source, device_kind (the jax
    `device_kind` of its `bench.runs.ceiling.DATASHEETS` entry: the memory bandwidth), link (`Link`);
    recorded_bytes / recorded_in: the device memory an archived run recorded on it (`memory_bytes`), and that run
    (None where none has)."""

    name: str
    label: str
    memory_bytes: int
    memory_figure: str
    memory_source: str
    device_kind: str
    link: Link
    recorded_bytes: int | None = None
    recorded_in: str | None = None

    @property
    def capacity(self) -> int:
        """Bytes a fit is planned against: the memory a run recorded where one has, else the datasheet's."""
        return self.recorded_bytes or self.memory_bytes

    @property
    def capacity_text(self) -> str:
        """Which capacity, in words: "recorded in runs/<run>" or "datasheet 16 GB HBM2"."""
        if self.recorded_bytes:
            return f"recorded in {self.recorded_in}"
        return f"datasheet {self.memory_figure}"

    @property
    def platform(self) -> str:
        """The jax backend name of the device ("tpu" or "gpu"): which layout its weights take
        (`model.accounting.placement_layout`)."""
        return "tpu" if self.name.startswith("tpu") else "gpu"

    @property
    def datasheet(self) -> Datasheet:
        """The device's memory-bandwidth datasheet (`bench.runs.ceiling.DATASHEETS`)."""
        sheet = datasheet_for(self.device_kind)
        assert sheet is not None, self.device_kind  # every listed device has one (tests/test_devices.py)
        return sheet

    @property
    def bandwidth(self) -> float:
        """Memory bandwidth, bytes/s (the datasheet's)."""
        return self.datasheet.bytes_per_s


_TPU = "Google Cloud TPU documentation, {page} (cloud.google.com/tpu/docs/{slug}): {what}"
_NV = "NVIDIA {name} datasheet (nvidia.com/en-us/data-center/{slug}): {what}"
_ICI = "bidirectional inter-chip interconnect (ICI) bandwidth per chip"
DEVICES = (
    Device(name="t4", label="NVIDIA T4 (16 GB)", memory_bytes=16 * 10**9, memory_figure="16 GB GDDR6",
           memory_source=_NV.format(name="T4", slug="tesla-t4", what="GPU memory"), device_kind="Tesla T4",
           recorded_bytes=16_106_127_360, recorded_in="runs/2026-08-28-full-run-cached-g5g (T4G, 15,360 MiB)",
           link=Link(name="PCIe Gen3 x16", figure="32 GB/s", bytes_per_s=16e9,
                     source=_NV.format(name="T4", slug="tesla-t4", what="interconnect bandwidth"))),
    Device(name="l4", label="NVIDIA L4 (24 GB)", memory_bytes=24 * 10**9, memory_figure="24 GB GDDR6",
           memory_source=_NV.format(name="L4", slug="l4", what="GPU memory"), device_kind="NVIDIA L4",
           recorded_bytes=24_152_899_584, recorded_in="runs/2026-08-28-first-serve-g6 (23,034 MiB)",
           link=Link(name="PCIe Gen4 x16", figure="64 GB/s", bytes_per_s=32e9,
                     source=_NV.format(name="L4", slug="l4", what="interconnect"))),
    Device(name="a100-40gb", label="NVIDIA A100 SXM (40 GB)", memory_bytes=40 * 10**9, memory_figure="40 GB HBM2",
           memory_source=_NV.format(name="A100", slug="a100", what="GPU memory"),
           device_kind="NVIDIA A100-SXM4-40GB",
           link=Link(name="NVLink 3", figure="600 GB/s", bytes_per_s=300e9,
                     source=_NV.format(name="A100", slug="a100", what="interconnect (SXM): NVLink"))),
    Device(name="a100-80gb", label="NVIDIA A100 SXM (80 GB)", memory_bytes=80 * 10**9,
           memory_figure="80 GB HBM2e", memory_source=_NV.format(name="A100", slug="a100", what="GPU memory"),
           device_kind="NVIDIA A100-SXM4-80GB",
           link=Link(name="NVLink 3", figure="600 GB/s", bytes_per_s=300e9,
                     source=_NV.format(name="A100", slug="a100", what="interconnect (SXM): NVLink"))),
    Device(name="h100", label="NVIDIA H100 SXM (80 GB)", memory_bytes=80 * 10**9, memory_figure="80 GB HBM3",
           memory_source=_NV.format(name="H100", slug="h100", what="GPU memory (SXM)"),
           device_kind="NVIDIA H100 80GB HBM3",
           link=Link(name="NVLink 4", figure="900 GB/s", bytes_per_s=450e9,
                     source=_NV.format(name="H100", slug="h100", what="interconnect (SXM): NVLink"))),
    Device(name="tpu-v5e", label="TPU v5e (16 GB)", memory_bytes=16 * 10**9, memory_figure="16 GB HBM2",
           memory_source=_TPU.format(page="TPU v5e", slug="v5e", what="HBM2 capacity per chip"),
           device_kind="TPU v5 lite", recorded_bytes=16_909_336_064,
           recorded_in="runs/2026-12-07-tpu-e2b-w4-tpuv5e (jax 0.10.2 bytes_limit)",
           link=Link(name="ICI", figure="400 GB/s", bytes_per_s=200e9,
                     source=_TPU.format(page="TPU v5e", slug="v5e", what=_ICI))),
    Device(name="tpu-v6e", label="TPU v6e (32 GB)", memory_bytes=32 * 10**9, memory_figure="32 GB HBM",
           memory_source=_TPU.format(page="TPU v6e", slug="v6e", what="HBM capacity per chip"),
           device_kind="TPU v6 lite",
           link=Link(name="ICI", figure="800 GB/s", bytes_per_s=400e9,
                     source=_TPU.format(page="TPU v6e", slug="v6e", what=_ICI))),
    Device(name="tpu-v5p", label="TPU v5p (95 GB)", memory_bytes=95 * 10**9, memory_figure="95 GB HBM2e",
           memory_source=_TPU.format(page="TPU v5p", slug="v5p", what="HBM2e capacity per chip"),
           device_kind="TPU v5",
           link=Link(name="ICI", figure="1,200 GB/s", bytes_per_s=600e9,
                     source=_TPU.format(page="TPU v5p", slug="v5p", what=_ICI))),
)  # fmt: skip
"""The devices `bench checkpoint inspect` plans for, in this order. Figures as the makers publish them (the pages in
each source, read 2026-12): NVIDIA's T4, L4, A100 and H100 datasheets (memory; NVLink or PCIe bandwidth, the
bidirectional total; A100 and H100 as SXM modules) and Google's Cloud TPU pages (HBM per chip; ICI bandwidth per
chip, bidirectional, over its 4 ports on v5e and v6e); the recorded memory from archived runs' manifests
(`memory_bytes`)."""


def device_named(name: str) -> Device | None:
    """The `DEVICES` entry called `name` (case-insensitive), None when there is none."""
    return next((d for d in DEVICES if d.name == name.strip().lower()), None)


def device_names() -> str:
    """The `--device` values, comma-separated (for messages)."""
    return ", ".join(d.name for d in DEVICES)


def fit_on(device: Device, *, weight_bytes: int, kv_bytes_per_row: int, batch: int, context: int,
           count: int = 1) -> BatchMemory:  # fmt: skip
    """Whether `weight_bytes` of weights and `batch` rows of KV cache (`kv_bytes_per_row` each, `context`
    positions) fit `device`'s published memory less `MEMORY_RESERVE` (`model.accounting.BatchMemory`: needed,
    usable, fits, largest_batch) against `Device.capacity`. `count` only names a device of a mesh in `where` (the
    bytes are that device's)."""
    where = f"of {device.label} memory ({device.capacity_text}){' per device' if count > 1 else ''}"
    return BatchMemory(batch=batch, cache_len=context, weight_bytes=weight_bytes, kv_bytes_per_row=kv_bytes_per_row,
                       capacity=device.capacity, where=where, reserve=MEMORY_RESERVE)  # fmt: skip


def _size(n: int) -> str:
    """Bytes for a person: GB with 3 decimals, or exact bytes below a MB (a tiny row would read 0.000 GB)."""
    return f"{n / 1e9:.3f} GB" if n >= 10**6 else f"{n:,} bytes"


def fit_line(mem: BatchMemory) -> str:
    """The arithmetic of a fit in one line: weights + batch x KV = needed against usable (capacity less the
    reserve), and the verdict; under a mesh (`BatchMemory.mesh`) per device, times the devices that share the
    capacity where they do."""
    verdict = "fits" if mem.fits else "does not fit"
    per = f" per device of {mem.mesh}" if mem.mesh else ""
    shared = f", x {mem.sharing} devices sharing it" if mem.sharing > 1 else ""
    return (f"{_size(mem.weight_bytes)} weights + {mem.batch} x {_size(mem.kv_bytes_per_row)} KV "
            f"({mem.cache_len} positions){per}{shared} = {_size(mem.needed)} vs {_size(mem.usable)} usable "
            f"({_size(mem.capacity)} {mem.where}, less {mem.reserve:.0%} reserved): {verdict}")


# ---- the prediction of a mesh's decode step -----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class Prediction:
    """The decode step a mesh of `device`s predicts (docs/method.md, "Predicting a mesh"): the slowest device's bytes
    (`share.step_read_bytes`) over `read_rate` (bytes/s: the datasheet's memory bandwidth, or a measured read rate,
    `read_source` says which) plus the bytes each device sends in the step's collectives over one direction of the
    link (`Link.bytes_per_s`). No overlap of the two, no collective latency, no compute: a bound on the step from
    bytes alone."""

    device: Device
    share: object  # model.placement.DeviceShare
    read_rate: float
    read_source: str

    @property
    def memory_s(self) -> float:
        """Seconds the slowest device spends reading its bytes."""
        return self.share.step_read_bytes / self.read_rate

    @property
    def link_s(self) -> float:
        """Seconds the collectives' bytes take over the link (0 on one device)."""
        return self.share.collective_bytes / self.device.link.bytes_per_s

    @property
    def step_s(self) -> float:
        """memory_s + link_s."""
        return self.memory_s + self.link_s

    @property
    def tok_s(self) -> float:
        """Predicted decode tokens/s of one sequence: 1 / step_s."""
        return 1 / self.step_s

    @property
    def aggregate_tok_s(self) -> float:
        """Of all `share.batch` rows: batch / step_s."""
        return self.share.batch / self.step_s


def predict(device: Device, share, read_rate: float | None = None, read_source: str = "given") -> Prediction:
    """`Prediction` of `share` (a `model.placement.DeviceShare`) on `device`s; `read_rate` (bytes/s) replaces the
    datasheet's memory bandwidth (e.g. a run's measured read rate, `run_read_rate`), `read_source` says where it
    comes from. Raises ValueError for a rate <= 0."""
    if read_rate is not None and not read_rate > 0:
        raise ValueError(f"read rate {read_rate!r}: expected bytes/s > 0")
    source = (f"measured, {read_source}" if read_rate is not None else f"datasheet {device.datasheet.figure}")
    return Prediction(device=device, share=share, read_rate=read_rate or device.bandwidth, read_source=source)


def run_read_rate(run, device: Device) -> tuple[float, str]:
    """(bytes/s, where) of the fastest read-only stream a run measured (`bench.runs.ceiling.ceiling_of`: its
    `read_bytes_s`), for predicting on `device`. `run`: a `bench.runs.RunFolder`. Raises InputError (one line)
    when the run measured no read rate, or measured it on another kind of device than `device`."""
    ceiling = ceiling_of(run.manifest)
    if ceiling is None or not ceiling.read_bytes_s:
        raise InputError(f"--read-rate {run.path}: this run measured no read rate (a --target or published run, or "
                         "one from before the read probe); pass GB/s or another run")  # fmt: skip
    if datasheet_for(ceiling.device_kind) != device.datasheet:
        raise InputError(f"--read-rate {run.path}: measured on {ceiling.device_kind}, not a {device.label}; pass a "
                         f"run of that device, or GB/s")  # fmt: skip
    return ceiling.read_bytes_s, f"{run.path.name}: {ceiling.read_bytes_s / 1e9:,.0f} GB/s read"
