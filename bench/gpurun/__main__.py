"""`python -m bench.gpurun`: what `scripts/gpu-run.sh` runs (and each step's `_probe` / `_make_builtin` child)."""

import sys

from bench.gpurun.main import main

sys.exit(main())
