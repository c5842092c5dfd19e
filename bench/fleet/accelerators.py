"""Accelerator names of a fleet: SkyPilot's catalog names with a device count, the folder slug each task gets, and
how many devices and hosts each request spans.

SkyPilot's catalog (the table of instance types, accelerators and prices per cloud) is fetched over the network at
its first use, so a plan made offline cannot ask it whether a name exists. `KNOWN` is the project's own short list
of GPU catalog names, with the instance families each maps to (from the clouds' instance-type pages: AWS g5g = T4G,
g6 = L4, p4d = A100 40 GB, p4de = A100 80 GB, p5 = H100, p5e / p5en = H200; GCP g2 = L4, a2 = A100, a3 = H100,
a3-ultra = H200; SkyPilot matches a count exactly, so an 8-GPU-only type is not picked for `NAME:1`) and the most
GPUs one machine of those families carries. A GPU name outside it is accepted (SkyPilot decides at launch) and
`is_known` says so, so the CLI can say it.

One task asks for (`Request`, `parse_request`):
- `NAME` or `NAME:COUNT`: COUNT GPUs in one machine (SkyPilot's `resources.accelerators: NAME:COUNT`);
- `NAME:COUNTxNODES`: NODES such machines (SkyPilot's `num_nodes`), COUNT GPUs each: one jax process per machine,
  joined by `jax.distributed` (`bench.fleet.distributed`);
- a TPU slice by SkyPilot's name, `tpu-v5litepod-N` or `tpu-v6e-N` (N chips; `tpu-v5e-N` is read as
  `tpu-v5litepod-N`, the name SkyPilot's GCP catalog gives TPU v5e). A slice of more chips than one host holds is
  several hosts: SkyPilot provisions them as one node and runs the task's commands on every host
  (docs.skypilot.co, "Cloud TPU", multi-host TPU pods), so `num_nodes` stays 1 and the hosts are joined by
  `jax.distributed` the same way.
Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bench.errors import InputError


@dataclass(frozen=True)
class Accelerator:
    """One GPU catalog name: `name` as SkyPilot spells it (`resources.accelerators`), `families` the instance types
    that carry it (a note for people; SkyPilot picks the instance), `memory_gib` the GPU's memory (GiB, the vendors'
    data sheets; None when not listed), `max_count` the most of them one machine of those families has (the
    clouds' instance-type pages: g5g.16xlarge 2 T4G; g4dn.metal, g6.48xlarge, g5.48xlarge, g6e.48xlarge,
    p4d/p4de/p5/p5e 8; GCP a2-megagpu-16g 16 A100)."""

    name: str
    families: str
    memory_gib: int | None
    max_count: int = 8


KNOWN: dict[str, Accelerator] = {
    a.name.lower(): a
    for a in (
        Accelerator("T4g", "AWS g5g.* (Graviton2 + NVIDIA T4G; the published study's g5g.2xlarge)", 16, 2),
        Accelerator("T4", "AWS g4dn.*, GCP n1 + T4, Azure NCasT4_v3", 16),
        Accelerator("L4", "AWS g6.* (the published study's g6.2xlarge), GCP g2-standard-*", 24),
        Accelerator("A10G", "AWS g5.*", 24),
        Accelerator("L40S", "AWS g6e.*", 48),
        Accelerator("A100", "GCP a2-highgpu-*g / a2-megagpu-16g; AWS only as p4d.24xlarge, 8 GPUs", 40, 16),
        Accelerator("A100-80GB", "GCP a2-ultragpu-*g; AWS only as p4de.24xlarge, 8 GPUs", 80),
        Accelerator("H100", "GCP a3-highgpu-*g; AWS p5.48xlarge has 8", 80),
        Accelerator("H200", "8-GPU machines on AWS (p5e / p5en) and GCP (a3-ultragpu-8g)", 141),
    )
}
"""The project's GPU catalog names (lower-cased key -> Accelerator): the GPUs the published study used and the
usual next steps up."""


@dataclass(frozen=True)
class TpuGeneration:
    """One TPU generation as SkyPilot names its slices `PREFIX-N` (N chips for these generations: one TensorCore
    per chip). `alias`: the name people use (`tpu-v5e`); `sizes`: the slice sizes Google sells; `host_chips`: the
    most chips one TPU VM of a slice holds (a slice of more is several VMs of `multi_host_chips` chips each: what
    this project calls hosts, one jax process each; Google's tables count 8-chip machines as hosts and list the
    VMs apart, e.g. v6e-16: 2 hosts, 4 VMs of ct6e-standard-4t);
    `memory_gib`: HBM per chip (GB as Google publishes it); `runtime`: the TPU VM software version the task asks
    for (`resources.accelerator_args.runtime_version`: SkyPilot 0.14 defaults every tpu-v5* to v2-alpha-tpuv5, the
    v5p image; v5e's is v2-alpha-tpuv5-lite). Source: cloud.google.com/tpu/docs/v5e, /tpu/docs/v6e
    (configurations, VM types) and /tpu/docs/runtimes."""

    prefix: str
    alias: str | None
    sizes: tuple[int, ...]
    host_chips: int
    multi_host_chips: int
    memory_gib: int
    runtime: str


TPUS: tuple[TpuGeneration, ...] = (
    TpuGeneration("tpu-v5litepod", "tpu-v5e", (1, 4, 8, 16, 32, 64, 128, 256), 8, 4, 16, "v2-alpha-tpuv5-lite"),
    TpuGeneration("tpu-v6e", None, (1, 4, 8, 16, 32, 64, 128, 256), 8, 4, 32, "v2-alpha-tpuv6e"),
)
"""The TPU generations a task may ask for (their chips are jax devices one for one)."""


@dataclass(frozen=True)
class Request:
    """What one task asks for. `name`: SkyPilot's spelling ("H100", "tpu-v5litepod-16"); `count`: accelerators per
    node (`resources.accelerators: NAME:COUNT`; a TPU slice is 1); `nodes`: SkyPilot's `num_nodes` (a TPU slice: 1,
    whatever its hosts); `devices`: jax devices in all (GPUs x nodes, or the slice's chips); `hosts`: machines,
    one jax process each (nodes, or the slice's hosts); `tpu_runtime`: a TPU slice's runtime version
    (`TpuGeneration.runtime`), None for a GPU."""

    name: str
    count: int = 1
    nodes: int = 1
    devices: int = 1
    hosts: int = 1
    tpu_runtime: str | None = None

    @property
    def tpu(self) -> bool:
        """Whether this is a TPU slice."""
        return self.tpu_runtime is not None

    @property
    def text(self) -> str:
        """As `--accelerators` takes it back: "L4", "H100:8", "H100:8x2", "tpu-v5litepod-16"."""
        if self.tpu or (self.count == 1 and self.nodes == 1):
            return self.name
        return f"{self.name}:{self.count}" + (f"x{self.nodes}" if self.nodes > 1 else "")

    @property
    def accelerators(self) -> str:
        """SkyPilot's `resources.accelerators` value: NAME:COUNT."""
        return f"{self.name}:{self.count}"

    @property
    def slug(self) -> str:
        """The task's folder and name part: the name's slug ("h100"), then -xCOUNT and -nNODES when above 1
        ("h100-x8-n2"); a TPU slice's name already holds its size ("tpu-v5litepod-8")."""
        out = slug(self.name)
        if self.count > 1:
            out += f"-x{self.count}"
        return out + (f"-n{self.nodes}" if self.nodes > 1 else "")

    @property
    def multi_host(self) -> bool:
        """Whether the task spans several hosts (one jax process each, joined by `jax.distributed`)."""
        return self.hosts > 1


_SPEC = re.compile(r"(?P<name>[A-Za-z][A-Za-z0-9-]*)(?::(?P<count>[0-9]+)(?:x(?P<nodes>[0-9]+))?)?")
_TPU = re.compile(r"(?P<prefix>tpu-[a-z0-9]+)-(?P<chips>[0-9]+)")
MAX_NODES = 64
"""The most nodes one task may ask for (a bound against typing mistakes, far above any fleet this project plans)."""


def _tpu_request(text: str) -> Request:
    """A TPU slice name -> Request (chips, hosts). InputError for a generation or size not in `TPUS`, or a count."""
    m = _TPU.fullmatch(text.lower())
    gens = {g.prefix: g for g in TPUS} | {g.alias: g for g in TPUS if g.alias}
    known = ", ".join(f"{g.prefix}-N" for g in TPUS)
    if m is None or m.group("prefix") not in gens:
        raise InputError(f"--accelerators {text}: expected a TPU slice of a known generation ({known}, "
                         "tpu-v5e-N for tpu-v5litepod-N) with N its chips, e.g. tpu-v5litepod-8")  # fmt: skip
    gen, chips = gens[m.group("prefix")], int(m.group("chips"))
    if chips not in gen.sizes:
        raise InputError(f"--accelerators {text}: {gen.prefix} slices come in {', '.join(map(str, gen.sizes))} "
                         f"chips, not {chips}")  # fmt: skip
    hosts = 1 if chips <= gen.host_chips else chips // gen.multi_host_chips
    return Request(name=f"{gen.prefix}-{chips}", devices=chips, hosts=hosts, tpu_runtime=gen.runtime)


def parse_request(text: str) -> Request:
    """One `--accelerators` entry -> Request (module docstring): NAME, NAME:COUNT, NAME:COUNTxNODES or a TPU slice.
    A known GPU name is spelled as SkyPilot spells it ("h100" -> "H100"). Raises InputError (one line) for a count
    or node count below 1, a count above what one machine of a known GPU holds, nodes above `MAX_NODES`, a count
    on a TPU slice (its size is in its name) or a name that is not a catalog name."""
    text = text.strip()
    if text.lower().startswith("tpu-"):
        if ":" in text:
            raise InputError(f"--accelerators {text}: a TPU slice's size is in its name (tpu-v5litepod-8 is 8 "
                             "chips); drop ':N'")  # fmt: skip
        return _tpu_request(text)
    m = _SPEC.fullmatch(text)
    if m is None:
        raise InputError(f"--accelerators {text!r}: expected a SkyPilot catalog name with an optional count and "
                         "node count, NAME[:COUNT[xNODES]], e.g. L4, H100:8, H100:8x2 or tpu-v5litepod-8")  # fmt: skip
    name = m.group("name")
    count, nodes = int(m.group("count") or 1), int(m.group("nodes") or 1)
    known = KNOWN.get(name.lower())
    if count < 1 or nodes < 1:
        raise InputError(f"--accelerators {text}: expected a count and node count of at least 1")
    if known is not None and count > known.max_count:
        raise InputError(f"--accelerators {text}: one machine holds at most {known.max_count} {known.name} "
                         f"({known.families}); ask for more machines with {known.name}:{known.max_count}xNODES")  # fmt: skip
    if nodes > MAX_NODES:
        raise InputError(f"--accelerators {text}: {nodes} nodes; expected at most {MAX_NODES}")
    name = known.name if known is not None else name
    return Request(name=name, count=count, nodes=nodes, devices=count * nodes, hosts=nodes)


def parse_accelerators(text: str) -> tuple[str, ...]:
    """`--accelerators T4g,L4:2,H100:8x2,tpu-v5e-8` -> ("T4g", "L4:2", "H100:8x2", "tpu-v5litepod-8"): each entry
    checked (`parse_request`) and spelled as `Request.text` gives it back, in the order given. An entry given twice
    (two tasks would write the same folders) or an empty list is refused. Raises InputError (one line)."""
    parts = [part.strip() for part in (text or "").split(",")]
    if not parts or any(not p for p in parts):
        raise InputError(f"--accelerators {text!r}: expected catalog names, comma-separated, e.g. T4g,L4,H100:8")
    out: list[Request] = []
    for part in parts:
        req = parse_request(part)
        if req.slug in {o.slug for o in out}:
            raise InputError(f"--accelerators {text}: {part} is given twice; expected each accelerator once")
        out.append(req)
    return tuple(r.text for r in out)


def is_known(name: str) -> bool:
    """Whether the GPU name of `name` (a `--accelerators` entry: "H100:8" counts as H100) is in `KNOWN`, or it is a
    TPU slice of `TPUS` (case-insensitive)."""
    base = name.split(":", 1)[0].lower()
    return base in KNOWN or any(base.startswith(g.prefix + "-") for g in TPUS)


def slug(name: str) -> str:
    """The folder and task-name form of a catalog name: lower case, anything but letters and digits a hyphen
    ("T4g" -> "t4g", "A100-80GB" -> "a100-80gb")."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
