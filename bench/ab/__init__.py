"""`bench ab`: two builds, or two engine configurations of one build, measured alternately in one session, with
the median of the per-pair ratios, its bootstrap interval and a verdict (docs/commands/ab.md; the statistics are
defined in docs/method.md, "A/B runs").

- `bench.ab.stats`: the ratios, the bootstrap intervals, the verdict, the A/A noise (standard library only; also
  what `bench compare` uses for its noise-aware verdict);
- `bench.ab.sides`: what a side is (a build and sweep flags) and where it runs (a git ref in a temporary worktree);
- `bench.ab.session`: the session itself (the plan, the mode, the pairs, the verdict, the manifest);
- `bench.ab.workers`: worker mode (the default), one long-lived worker per side alternated request by request,
  through `bench.ab.channel` (the worker seen from the session) and `bench.ab.protocol` (what they say);
- `bench.ab.worker`: the worker process itself (`bench ab-worker`): the one module here that opens the engine;
- `bench.ab.processes`: process mode, each measurement a `python -m bench sweep` process;
- `bench.ab.archive`: the run folder of kind "ab" (pairs.csv and the manifest's `ab` object), for its readers.

The session imports no jax and no engine: every measurement runs in another process.
"""
