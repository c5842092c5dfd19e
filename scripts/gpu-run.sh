#!/usr/bin/env bash
# The prepared GPU run (issue 7): bandwidth, sweep and profile into run folders under OUTDIR, within a time budget.
#   scripts/gpu-run.sh OUTDIR [--budget-s 420] [--checkpoint DIR|builtin:NAME] [--tiny] [--pack DIR]
# Uses the machine's python3 as it is (no install): the repository goes on PYTHONPATH. $PYTHON picks another
# interpreter. Never changes GPU settings. Plans, budget rules and exit codes: bench/gpurun/main.py's docstring
# (0 all steps ran; 3 the budget stopped or skipped a step, folders still valid; 1 a step failed; 2 usage/missing).
set -u
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${PYTHON:-python3}
if ! command -v "$py" >/dev/null 2>&1; then
  echo "error: gpu-run needs python3 (>= 3.12) on PATH, or PYTHON=/path/to/python3" >&2; exit 2
fi
if ! "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
  echo "error: gpu-run needs Python >= 3.12; $("$py" -V 2>&1) at $(command -v "$py")" >&2; exit 2
fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "$py" -m bench.gpurun "$@"
