#!/usr/bin/env bash
# The prepared GPU run (issue 7): bandwidth, sweep and profile into run folders under OUTDIR, within a time budget.
#   scripts/gpu-run.sh OUTDIR [--wheels DIR] [--budget-s 420] [--checkpoint DIR|builtin:NAME] [--tiny] [--pack DIR]
#     [--quant SET ...]   (repeatable: one sweep + profile per option set, e.g. --quant none --quant ple4,int8_lm_head)
#     [--batch 1,8,32,128]   (passed to every sweep; the largest batch is profiled too, into its own run)
# Uses the machine's python3 and its packages as they are: the repository goes on PYTHONPATH. $PYTHON picks another
# interpreter. --wheels DIR (made by scripts/gpu-wheels.sh; OUTDIR must then come first) installs DIR's wheels
# with `pip install --no-index --no-deps --target OUTDIR/site` and puts that folder on PYTHONPATH after the
# repository: the image's own packages are never changed. Never changes GPU settings. Plans, budget rules and
# exit codes: bench/gpurun/main.py's docstring (0 all steps ran; 3 the budget stopped or skipped a step, folders still
# valid; 1 a step failed; 2 usage/missing). The budget starts after the wheels are installed (seconds).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${PYTHON:-python3}
if ! command -v "$py" >/dev/null 2>&1; then
  echo "error: gpu-run needs python3 (>= 3.11) on PATH, or PYTHON=/path/to/python3" >&2; exit 2
fi
# 3.11: the lent TPU image's Python (with jax 0.10.2), rehearsed by scripts/tpu-rehearsal.sh; the project itself
# installs on >= 3.12 (jax >= 0.11), but the run only needs what it imports.
if ! "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
  echo "error: gpu-run needs Python >= 3.11; $("$py" -V 2>&1) at $(command -v "$py")" >&2; exit 2
fi

# --wheels DIR / --wheels=DIR is this script's; every other argument goes to bench.gpurun unchanged.
wheels="" args=()
while (( $# )); do
  case $1 in
    --wheels) [[ $# -ge 2 && -n $2 ]] || { echo "error: --wheels needs a folder (got none or \"\")" >&2; exit 2; }
      wheels=$2; shift 2 ;;
    --wheels=*) wheels=${1#--wheels=}; shift
      [[ -n $wheels ]] || { echo "error: --wheels needs a folder (got none or \"\")" >&2; exit 2; } ;;
    *) args+=("$1"); shift ;;
  esac
done

site=""
if [[ -n $wheels ]]; then
  outdir=${args[0]:-}
  if [[ -z $outdir || $outdir == -* ]]; then
    echo "error: with --wheels, OUTDIR comes first: scripts/gpu-run.sh OUTDIR --wheels DIR [...]" >&2; exit 2
  fi
  shopt -s nullglob
  whl=("$wheels"/*.whl)
  shopt -u nullglob
  if (( ${#whl[@]} == 0 )); then
    echo "error: --wheels $wheels: no .whl files there (make them with scripts/gpu-wheels.sh $wheels)" >&2; exit 2
  fi
  site=$outdir/site
  mkdir -p "$site"
  site=$(cd "$site" && pwd)
  if ! "$py" -m pip install --quiet --isolated --disable-pip-version-check --no-index --no-deps --no-compile \
        --no-cache-dir --upgrade --target "$site" "${whl[@]}"; then
    echo "error: --wheels $wheels: pip could not install them into $site (output above)" >&2; exit 2
  fi
  echo "gpu-run: installed ${#whl[@]} wheels from $wheels into $site (on PYTHONPATH after the repository)" >&2
fi

export PYTHONPATH="$repo${site:+:$site}${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "$py" -m bench.gpurun "${args[@]}"
