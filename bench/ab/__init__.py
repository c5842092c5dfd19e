"""`bench ab`: two builds, or two engine configurations of one build, measured alternately in one session, with
the median of the per-pair ratios, its bootstrap interval and a verdict (docs/commands/ab.md; the statistics are
defined in docs/method.md, "A/B runs").

- `bench.ab.stats`: the ratios, the bootstrap intervals, the verdict, the A/A noise (standard library only; also
  what `bench compare` uses for its noise-aware verdict);
- `bench.ab.sides`: what a side is (a build and sweep flags) and where it runs (a git ref in a temporary worktree);
- `bench.ab.session`: the session itself, each measurement a `python -m bench sweep` process;
- `bench.ab.archive`: the run folder of kind "ab" (pairs.csv and the manifest's `ab` object), for its readers.

No jax and no engine here: every measurement runs in its own process.
"""
