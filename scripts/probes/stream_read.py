"""Which read probe reaches the device's streaming rate: the Pallas streaming read at each block size, XLA's
read-only reduction, and a donated device copy, on one buffer size, each the median of `--repeats` timed passes
after one untimed warm-up pass (it compiles). Writes $OUT/stream_read.json (or --out DIR) and prints one line per
probe. Needs only jax, numpy and this repository on PYTHONPATH (Python 3.11 + jax 0.10.2 on the lent TPU machine).

On the TPU (about 30 s, 2 GiB):
    PYTHONPATH=. python scripts/probes/stream_read.py
On a CPU (the kernel in interpret mode; its time says nothing about memory):
    PYTHONPATH=. JAX_PLATFORMS=cpu python scripts/probes/stream_read.py --mib 4 --blocks-kib 256 --repeats 3 \
        --interpret --out /tmp/stream

The datasheet figure for the device kind (bench.runs.ceiling) is written beside the probes, and the ceiling the
roofline shares are divided by (docs/method.md, "Rooflines"): the larger of the fastest read and the datasheet.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, when PYTHONPATH is not set

from bench.profile.bandwidth import MiB, measure_bandwidth, measure_read_bandwidth, measure_stream_read  # noqa: E402
from bench.runs.ceiling import datasheet_for, roofline_ceiling  # noqa: E402
from bench.profile.stream import BLOCK_BYTES  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Run the probes; 0 when all ran, 2 for bad arguments (one line)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=2048, help="buffer size in MiB (default 2048)")
    parser.add_argument("--blocks-kib", type=int, nargs="+", default=[b // 1024 for b in BLOCK_BYTES],
                        help="Pallas block sizes in KiB, multiples of 32 (default 2048 4096 8192)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per probe (default 10)")
    parser.add_argument("--passes", type=int, nargs="+", default=[1, 32],
                        help="buffer passes per Pallas call, each tried at every block size (default 1 32)")
    parser.add_argument("--interpret", action="store_true", help="run the kernel in interpret mode (CPU tests)")
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for stream_read.json ($OUT)")
    args = parser.parse_args(argv)
    if args.mib < 1 or args.repeats < 1 or min(args.passes) < 1 or any(b < 32 or b % 32 for b in args.blocks_kib):
        print(f"error: --mib {args.mib}, --repeats {args.repeats}, --blocks-kib {args.blocks_kib}: expected "
              "--mib >= 1, --repeats >= 1, --passes >= 1 and blocks that are multiples of 32 KiB",
              file=sys.stderr)  # fmt: skip
        return 2
    if any(b * 1024 > args.mib * MiB for b in args.blocks_kib):
        print(f"error: --blocks-kib {args.blocks_kib}: a block exceeds the {args.mib} MiB buffer; choose smaller "
              "blocks or a larger --mib", file=sys.stderr)  # fmt: skip
        return 2

    import jax

    n_bytes, t0 = args.mib * MiB, time.perf_counter()
    device = jax.devices()[0]
    print(f"jax {jax.__version__}, {device.platform} {device.device_kind}: {args.mib} MiB, {args.repeats} passes each")
    probes = []
    for passes in args.passes:
        for kib in args.blocks_kib:
            probes.append(("pallas_stream", measure_stream_read(n_bytes, args.repeats, block_bytes=kib * 1024,
                                                                passes=passes, interpret=args.interpret)))  # fmt: skip
    probes.append(("xla_read", measure_read_bandwidth(n_bytes, args.repeats)))
    probes.append(("copy", measure_bandwidth(n_bytes, args.repeats)))
    for name, r in probes:
        print(f"{name:14s} {r.gib_s:9.2f} GiB/s {r.gb_s:9.2f} GB/s  median {r.median_s * 1e3:9.3f} ms  "
              f"min {min(r.times_s) * 1e3:9.3f} ms  ({r.method})")
    reads = [r for name, r in probes if name == "xla_read" or (name == "pallas_stream" and not args.interpret)]
    fastest = max(reads, key=lambda r: r.bytes_per_s)
    sheet = datasheet_for(device.device_kind)
    ceiling = roofline_ceiling(fastest.bytes_per_s, fastest.method, device.device_kind)
    print(f"datasheet: {'none for this device kind' if sheet is None else sheet.line}")
    print(f"ceiling: {ceiling.line}")
    out = {
        "jax": jax.__version__, "platform": device.platform, "device_kind": device.device_kind,
        "n_bytes": n_bytes, "repeats": args.repeats, "interpret": args.interpret,
        "probes": [{"probe": name, **r.to_json()} for name, r in probes],
        "fastest_read": fastest.to_json(),
        "datasheet": None if sheet is None else sheet.to_json(),
        "ceiling": ceiling.to_json(),
        "wall_s": time.perf_counter() - t0,
    }  # fmt: skip
    path = Path(args.out) / "stream_read.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path} ({out['wall_s']:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
