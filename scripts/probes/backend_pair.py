"""Paired decode of the pure-JAX engine and the cpu-kernels backend in one process (issue 42 part 3).

Loads one checkpoint once (float32 weights, the CPU policy), makes two engines over the same parameters (backend
"jax" and "cpu-kernels"), warms each at the shape, then alternates requests (ABAB..., the first of each pair
swapped every round) and prints each request's mean ms per decode step (`Generation.ms_per_step`), TTFT
(`prefill_ms`) and the median of the per-round ratios kernels / jax. Greedy tokens must be equal. A noisy, shared
host moves both engines alike within a round; the ratio is the figure to read, not the absolute times.

    PYTHONPATH=. JAX_PLATFORMS=cpu python scripts/probes/backend_pair.py [--rounds 6] [--tokens 41] [--new 64] [--loop host]

Writes nothing; the numbers are the output.
"""

from __future__ import annotations

import argparse
import statistics

from model.builtin import ensure_builtin
from model.engine import load_engine
from model.policy import decide_policy, with_backend


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=41)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--loop", choices=("host", "device"), default="host")
    ap.add_argument("--checkpoint", default="default")
    args = ap.parse_args()
    path = ensure_builtin(args.checkpoint)
    plain, _ = load_engine(path, policy=decide_policy())
    kernels, _ = load_engine(path, policy=with_backend(decide_policy(), "cpu-kernels"))
    prompt = [plain.cfg.bos_token_id] + [(17 * i + 5) % 1000 + 10 for i in range(args.tokens - 1)]
    engines = {"jax": plain, "cpu-kernels": kernels}
    for engine in engines.values():
        engine.generate(prompt, args.new, decode_loop=args.loop)  # compile at the shape
    steps, ttft, ratios, tokens = {k: [] for k in engines}, {k: [] for k in engines}, [], {}
    for r in range(args.rounds):
        order = list(engines) if r % 2 == 0 else list(engines)[::-1]
        got = {}
        for name in order:
            gen = engines[name].generate(prompt, args.new, decode_loop=args.loop)
            got[name] = gen.ms_per_step
            steps[name].append(gen.ms_per_step)
            ttft[name].append(gen.prefill_ms)
            tokens.setdefault(name, gen.token_ids)
            assert gen.token_ids == tokens[name], "a backend's greedy tokens changed between rounds"
            assert gen.compile_traces == 0, "compiled inside a timed request"
        ratios.append(got["cpu-kernels"] / got["jax"])
        print(f"round {r}: ms/step jax {got['jax']:.2f} cpu-kernels {got['cpu-kernels']:.2f} "
              f"ratio {ratios[-1]:.3f}", flush=True)
    print(f"greedy tokens equal: {tokens['jax'] == tokens['cpu-kernels']}")
    for name in engines:
        print(f"{name}: ms/step median {statistics.median(steps[name]):.2f} (min {min(steps[name]):.2f}, max "
              f"{max(steps[name]):.2f}); TTFT ms median {statistics.median(ttft[name]):.1f}; kernel text "
              f"{engines[name].cpu_kernel}; xla_options {engines[name].xla_options}")
    print(f"ms/step cpu-kernels / jax, median of {len(ratios)} paired rounds: {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}); decode speed jax / cpu-kernels = that ratio")


if __name__ == "__main__":
    main()
