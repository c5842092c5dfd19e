"""Accelerator names of a fleet: SkyPilot's catalog names, the folder slug each gets, and where each is sold.

SkyPilot's catalog (the table of instance types, accelerators and prices per cloud) is fetched over the network at
its first use, so a plan made offline cannot ask it whether a name exists. `KNOWN` is the project's own short list
of catalog names, with the instance families each maps to (from the clouds' instance-type pages: AWS g5g = T4G,
g6 = L4, p4d = A100 40 GB, p4de = A100 80 GB, p5 = H100, p5e / p5en = H200; GCP g2 = L4, a2 = A100, a3 = H100,
a3-ultra = H200; SkyPilot matches a count of 1 exactly, so an 8-GPU-only type is not picked for `NAME:1`). A name
outside it is accepted (SkyPilot decides at launch) and `is_known` says so, so the CLI can say it. Standard library
only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bench.errors import InputError


@dataclass(frozen=True)
class Accelerator:
    """One catalog name: `name` as SkyPilot spells it (`resources.accelerators`), `families` the instance types that
    carry it (a note for people; SkyPilot picks the instance), `memory_gib` the GPU's memory (GiB, the vendors'
    data sheets; None when not listed)."""

    name: str
    families: str
    memory_gib: int | None


KNOWN: dict[str, Accelerator] = {
    a.name.lower(): a
    for a in (
        Accelerator("T4g", "AWS g5g.* (Graviton2 + NVIDIA T4G; the published study's g5g.2xlarge)", 16),
        Accelerator("T4", "AWS g4dn.*, GCP n1 + T4, Azure NCasT4_v3", 16),
        Accelerator("L4", "AWS g6.* (the published study's g6.2xlarge), GCP g2-standard-*", 24),
        Accelerator("A10G", "AWS g5.*", 24),
        Accelerator("L40S", "AWS g6e.*", 48),
        Accelerator("A100", "GCP a2-highgpu-1g; AWS only as p4d.24xlarge, 8 GPUs", 40),
        Accelerator("A100-80GB", "GCP a2-ultragpu-1g; AWS only as p4de.24xlarge, 8 GPUs", 80),
        Accelerator("H100", "GCP a3-highgpu-1g; AWS p5.48xlarge has 8", 80),
        Accelerator("H200", "8-GPU machines on AWS (p5e / p5en) and GCP (a3-ultragpu-8g)", 141),
    )
}
"""The project's catalog names (lower-cased key -> Accelerator): the GPUs the published study used and the usual
next steps up."""

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]*")


def parse_accelerators(text: str) -> tuple[str, ...]:
    """`--accelerators T4g,L4,H100` -> ("T4g", "L4", "H100"): catalog names in the order given, a known name spelled
    as SkyPilot spells it ("t4g" -> "T4g"). One GPU per task: a count ("L4:2") is refused, so is a name given twice
    (two tasks would write the same folders) or an empty list. Raises InputError (one line)."""
    names = [part.strip() for part in (text or "").split(",")]
    if not names or any(not n for n in names):
        raise InputError(f"--accelerators {text!r}: expected catalog names, comma-separated, e.g. T4g,L4,H100")
    out: list[str] = []
    for name in names:
        if ":" in name:
            raise InputError(f"--accelerators {name}: one GPU per task (the run measures one device); drop ':N'")
        if not _NAME.fullmatch(name):
            raise InputError(f"--accelerators {name!r}: expected a SkyPilot catalog name such as T4g, L4 or H100")
        canonical = KNOWN[name.lower()].name if name.lower() in KNOWN else name
        if slug(canonical) in {slug(o) for o in out}:
            raise InputError(f"--accelerators {text}: {name} is given twice; expected each accelerator once")
        out.append(canonical)
    return tuple(out)


def is_known(name: str) -> bool:
    """Whether `name` is in `KNOWN` (case-insensitive)."""
    return name.lower() in KNOWN


def slug(name: str) -> str:
    """The folder and task-name form of a catalog name: lower case, anything but letters and digits a hyphen
    ("T4g" -> "t4g", "A100-80GB" -> "a100-80gb")."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
